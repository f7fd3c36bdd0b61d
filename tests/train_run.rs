//! Whole training runs (`maxrs::train::run::train`) on the CPU plugin: sharded runs on 8 devices
//! give the losses of the 1-device run, gradient accumulation gives the losses of the full batch,
//! and a run from files (`load_parameters_path`, `dataset_type=tokens`) starts at the loss the
//! f64 reference computes for the same parameters and rows.

use crate::common::llama_ref::{self, B, T};
use maxrs::config;
use maxrs::data::write_tokens_file;
use maxrs::host::params_io::{save_safetensors, Params};
use maxrs::pjrt::cpu_client;
use maxrs::train::run::{train, RunReport};

fn run(devices: usize, overrides: &[&str]) -> RunReport {
    let mut args: Vec<String> =
        ["dtype=float32", "steps=5", "learning_rate=3e-3"].iter().map(|s| s.to_string()).collect();
    args.extend(overrides.iter().map(|s| s.to_string()));
    let c = config::load(None, &args).expect("config loads");
    train(&c, &cpu_client(devices).expect("CPU plugin")).expect("the run trains")
}

fn assert_same_losses(what: &str, got: &RunReport, want: &RunReport, tol: f64) {
    assert_eq!(got.losses.len(), want.losses.len());
    println!("{what}: max relative loss difference {:e}", crate::common::max_rel_diff(&got.losses, &want.losses));
    for (step, (a, b)) in got.losses.iter().zip(&want.losses).enumerate() {
        let rel = (a - b).abs() / b.abs();
        assert!(rel <= tol, "{what}: step {step} loss {a} vs {b} (relative difference {rel:e})");
    }
}

/// The default model narrowed to width 64 (every size still divides over 8 devices and 2-way
/// tensor parallelism): the comparisons need no more, and a 1-device run of the default width
/// took 1.7 times the CPU. Learning rate 1e-2 so that the loss falls as far in 5 steps.
const NARROW: [&str; 4] = ["base_emb_dim=64", "base_mlp_dim=128", "head_dim=16", "learning_rate=1e-2"];

/// `run` of the [`NARROW`] model.
fn run_narrow(devices: usize, overrides: &[&str]) -> RunReport {
    run(devices, &[&NARROW[..], overrides].concat())
}

/// 8-device runs give the 1-device run's losses, and gradient accumulation the full batch's:
/// the FSDP run accumulates two micro-batches of 8 rows (one a device) against the 1-device
/// batch of 16, one run for what were two comparisons with the same reference (the former test
/// `gradient_accumulation_matches_the_full_batch`: 2 micro-batches of 4 against a batch of 8 on
/// one device), as sharding and accumulation are orthogonal (each micro-batch is sharded as a
/// whole batch is).
#[test]
fn sharded_and_accumulated_runs_match_one_device() {
    let one = run_narrow(1, &["per_device_batch_size=16"]);
    println!("1 device: losses {:?}", one.losses);
    // 5 steps (10 until CI time mattered): 6.76 -> 6.04, deterministic on the CPU plugin.
    assert!(one.losses[4] < one.losses[0] - 0.5, "the loss falls: {:?}", one.losses);
    let fsdp = run_narrow(8, &["per_device_batch_size=1", "gradient_accumulation_steps=2", "ici_fsdp_parallelism=8"]);
    assert_same_losses("fsdp=8, 2 micro-batches of 8", &fsdp, &one, 1e-5);
    let mixed = run_narrow(
        8,
        &["per_device_batch_size=2", "ici_data_parallelism=2", "ici_fsdp_parallelism=2", "ici_tensor_parallelism=2"],
    );
    assert_same_losses("data=2 x fsdp=2 x tensor=2", &mixed, &one, 1e-5);
}

/// Parameters and tokens from files: the first step's loss (taken before any update) is the
/// reference model's loss on those parameters and the file's first rows.
#[test]
fn run_from_parameter_and_token_files_starts_at_the_reference_loss() {
    let dir = tempfile::tempdir().unwrap();
    let c = llama_ref::config(true, &[]);
    let p = llama_ref::random_params(&c, 21);
    let params: Params = llama_ref::host_params(&c, &p)
        .into_iter()
        .map(|(n, t)| (n.strip_prefix("params.").unwrap().to_string(), t))
        .collect();
    let params_path = dir.path().join("params.safetensors");
    save_safetensors(&params_path, &params).unwrap();
    let mut rng = crate::common::rng(22);
    let rows: Vec<Vec<i32>> = (0..3 * B)
        .map(|_| {
            crate::common::uniform(&mut rng, T + 1, 0.0, c.config.vocab as f64).into_iter().map(|x| x as i32).collect()
        })
        .collect();
    let tokens_path = dir.path().join("tokens.bin");
    write_tokens_file(&tokens_path, &rows).unwrap();

    let report = run(
        1,
        &[
            &format!("per_device_batch_size={B}"),
            &format!("max_target_length={T}"),
            "steps=2",
            "dataset_type=tokens",
            "enable_data_shuffling=false",
            &format!("dataset_path={}", tokens_path.display()),
            &format!("load_parameters_path={}", params_path.display()),
        ],
    );
    let inputs: Vec<i32> = rows[..B].iter().flat_map(|r| r[..T].to_vec()).collect();
    let targets: Vec<i32> = rows[..B].iter().flat_map(|r| r[1..].to_vec()).collect();
    let want = llama_ref::reference(&c, &p, &inputs, &targets, &[1; B * T], 0.0).loss;
    let rel = (report.losses[0] - want).abs() / want;
    assert!(rel < 1e-5, "first loss {} vs reference {want} (relative {rel:e})", report.losses[0]);
}

/// A shrunken model of every family trains on the synthetic data: the loss falls. Llama 3.1's
/// RoPE rides on the Mistral run (both are Llama 2's layer; each was a run of its own): these
/// runs train every family's parameter tree; the features' gradients are checked against
/// references in `model_families`. Two tests of three or four families each, which the test
/// threads run side by side (one test of six was the suite's last to finish, alone on its thread).
#[test]
fn every_family_trains_with_a_falling_loss() {
    trains_with_a_falling_loss(&[
        ("mistral-7b", &["sliding_window_size=8", "rope_type=llama3.1"][..]),
        ("gemma-2b", &["base_num_kv_heads=1"]),
        ("gemma2-2b", &["sliding_window_size=8"]),
        // One scanned block of a chunked dense layer and a NoPE MoE layer (4 experts, one a token,
        // and the shared one): Llama 4's two layer kinds in a block of 2 instead of its files' 4
        // (each layer's program costs compile time; tests/model_families.rs checks the block of 4).
        (
            "llama4-17b-128e",
            &[
                "base_num_decoder_layers=2",
                "inhomogeneous_layer_cycle_interval=2",
                "nope_layer_interval=2",
                "interleave_moe_layer_step=2",
                "chunk_attn_window_size=8",
                "num_experts=4",
                "base_moe_mlp_dim=128",
            ],
        ),
        // Gemma 4 small's first 2 layers unscanned (local; the second reusing the first's keys and
        // values with a double-wide MLP), per-layer inputs. Its global layer is the fifth: its
        // 6-layer pattern is checked against the reference in tests/gemma4.rs, not trained here.
        (
            "gemma4-e2b",
            &[
                "scan_layers=false",
                "base_num_decoder_layers=2",
                "num_kv_shared_layers=1",
                "sliding_window_size=8",
                "hidden_size_per_layer_input=16",
                "vocab_size_per_layer_input=128",
            ],
        ),
    ]);
}

/// [`every_family_trains_with_a_falling_loss`]'s other half.
#[test]
fn every_family_trains_with_a_falling_loss_continued() {
    trains_with_a_falling_loss(&[
        ("gpt3-52k", &["base_num_kv_heads=4"][..]),
        // One scanned block of OLMo 3's 3 sliding + 1 global layers.
        ("olmo3-7b", &["base_num_decoder_layers=4", "sliding_window_size=8"]),
        // One scanned block of gpt-oss's sliding and global layers, 4 biased experts of which 2.
        ("gpt-oss-20b", &["sliding_window_size=8", "num_experts=4", "num_experts_per_tok=2", "base_moe_mlp_dim=128"]),
        // Gemma 4's first 2 layers unscanned (local, 4 experts of which 2 beside the shared MLP).
        // MaxText scans it in blocks of 6 (5 local layers and a global one): that block is
        // checked against the reference in tests/gemma4.rs; here it was a fifth of the suite's
        // family compiles.
        (
            "gemma4-26b",
            &[
                "scan_layers=false",
                "sliding_window_size=8",
                "num_experts=4",
                "num_experts_per_tok=2",
                "base_moe_mlp_dim=64",
            ],
        ),
    ]);
}

/// Trains each `(model_name, extra keys)` shrunken for 6 steps; the loss falls by more than 0.5.
fn trains_with_a_falling_loss(models: &[(&str, &[&str])]) {
    for (model, extra) in models {
        let mut args = vec![
            format!("model_name={model}"),
            "override_model_config=true".into(),
            "base_num_decoder_layers=2".into(),
            "base_emb_dim=64".into(),
            "base_num_query_heads=4".into(),
            "base_num_kv_heads=2".into(),
            "head_dim=16".into(),
            "base_mlp_dim=128".into(),
            "vocab_size=128".into(),
            "per_device_batch_size=8".into(),
            "max_target_length=32".into(),
            // 6 steps (20 until CI time mattered): each family's loss falls by more than 1.0.
            "steps=6".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let report = run(1, &args.iter().map(String::as_str).collect::<Vec<_>>());
        let (first, last) = (report.losses[0], report.losses[report.losses.len() - 1]);
        println!("{model}: loss {first:.3} -> {last:.3}");
        assert!(last < first - 0.5, "{model}: the loss does not fall: {:?}", report.losses);
    }
}
