//! Which runs get cuDNN's fused attention, what the start-up line says when one does not, and
//! the train step that uses it: traced for 4 devices and for 1 (no GPU needed to trace), the step holds
//! the forward call once per layer body and the backward call once; under a remat policy that
//! saves `context` (`minimal_flash`) the backward pass never recomputes the forward call, under
//! `full` it does once.

use maxrs::config::{self, Config};
use maxrs::lower::to_stablehlo;
use maxrs::model::kernel::{describe, AttentionImpl};
use maxrs::model::ModelConfig;
use maxrs::train::step::TrainStep;

const GPU: &[&str] = &["hardware=gpu", "plugin=cuda13", "attention=cudnn_flash_jax", "dtype=bfloat16"];

fn load(extra: &[&str]) -> Config {
    let small = crate::common::small_model(&[]);
    let args: Vec<String> =
        small.iter().filter(|a| !a.starts_with("dtype=")).cloned().chain(extra.iter().map(|s| s.to_string())).collect();
    // Not `config::check`ed: `dataset_type=hf` would want its files; resolution reads the keys.
    config::load(None, &args).expect("loads")
}

/// The start-up line of `extra` (on top of `GPU`).
fn line(extra: &[&str]) -> String {
    let c = load(&[GPU, extra].concat());
    describe(&c, ModelConfig::from_config(&c).attention)
}

#[test]
fn cuda_runs_get_cudnn_and_the_rest_say_why_not() {
    let c = load(GPU);
    assert!(matches!(ModelConfig::from_config(&c).attention, AttentionImpl::Cudnn { block: 32 }));
    let yes = line(&[]);
    assert!(yes.contains("-> XLA's cuDNN fused attention (`__cudnn$fmhaSoftmax`"), "{yes}");
    let te = line(&["attention=cudnn_flash_te"]);
    assert!(te.contains("cuDNN fused attention") && te.contains("no Transformer Engine"), "{te}");
    let packed = line(&["dataset_type=hf", "packing=true", "max_segments_per_seq=32"]);
    assert!(packed.contains("-> XLA's cuDNN fused attention"), "{packed}");
    for (extra, why) in [
        (
            &["hardware=cpu", "plugin=cpu"][..],
            "runs on a CUDA GPU (hardware=gpu with plugin=cuda12 or cuda13), not hardware=cpu plugin=\"cpu\"",
        ),
        (
            &["compile_topology=a3-8", "compile_topology_num_slices=1"],
            "a deviceless compile (compile_topology=\"a3-8\") cannot hold cuDNN's compiled graphs",
        ),
        (&["dtype=float32"], "takes bf16 or f16, not f32"),
        (&["head_dim=12"], "a multiple of 8, at most 256, not 12"),
        // Multi-head latent attention's queries and keys are qk_nope_head_dim + qk_rope_head_dim wide.
        (
            &[
                "decoder_block=deepseek",
                "attention_type=mla",
                "qk_nope_head_dim=8",
                "qk_rope_head_dim=4",
                "head_dim=16",
            ],
            "a multiple of 8, at most 256, not 12",
        ),
        (&["attn_logits_soft_cap=30.0"], "no soft cap (attn_logits_soft_cap=30)"),
        (&["dataset_type=hf", "packing=true"], "packed documents (dataset_type=hf, packing=true) go into cuDNN's packed layout only with a fixed number of documents a row: set max_segments_per_seq"),
        (&["ici_context_parallelism=2"], "the sequence is sharded (context parallelism)"),
    ] {
        let got = line(extra);
        assert!(
            got.contains("-> blockwise attention") && got.contains("; not cuDNN: ") && got.contains(why),
            "{extra:?}: {got}"
        );
    }
    // MaxText's autoselected picks its Pallas Triton kernel on GPU, not cuDNN.
    let auto = line(&["attention=autoselected", "max_target_length=256"]);
    assert!(auto.contains("autoselected -> blockwise attention") && !auto.contains("cuDNN"), "{auto}");
}

/// MaxText's rule (`src/maxtext/configs/types.py` at e591f30): Transformer Engine's attention on
/// packed documents needs `max_segments_per_seq`.
#[test]
fn cudnn_flash_te_on_packed_documents_needs_max_segments_per_seq() {
    let files = concat!("hf_train_files=", env!("CARGO_MANIFEST_DIR"), "/tests/data/tokenizer_corpus.jsonl");
    let tokenizer = concat!("tokenizer_path=", env!("CARGO_MANIFEST_DIR"), "/tests/data/shakespeare-bpe512.model");
    let packed = ["dataset_type=hf", files, tokenizer, "packing=true", "attention=cudnn_flash_te"];
    let err = config::check(&load(&[GPU, &packed].concat())).unwrap_err().to_string();
    assert!(err.contains("max_segments_per_seq") && err.contains("MaxText's GPU configs use 32"), "{err}");
    config::check(&load(&[GPU, &packed, &["max_segments_per_seq=32"]].concat())).expect("checks");
    config::check(&load(&[GPU, &["attention=cudnn_flash_te"]].concat())).expect("synthetic rows are not packed");
}

/// The train step of `extra` on `devices` devices as StableHLO; `packed`: on packed batches (the
/// program `dataset_type=hf` with `packing=true` traces, without needing its files).
fn step_mlir(devices: usize, extra: &[&str], packed: bool) -> String {
    let c = load(&[GPU, extra].concat());
    config::check(&c).expect("checks");
    let derived = config::validate(&c, devices, 1).expect("valid");
    let mesh = derived.mesh.step_mesh(&[(0..devices as i64).collect()]).expect("mesh");
    let mut step = TrainStep::new(&c, &derived, mesh).expect("step");
    step.packed = packed;
    to_stablehlo(&step.train_step().expect("traces"))
}

/// With `max_segments_per_seq`, packed batches' attention is cuDNN's packed layout: both calls
/// take the documents' lengths and offsets and say how many documents a row holds.
#[test]
fn packed_batches_use_cudnns_packed_layout() {
    for devices in [1, 4] {
        let mlir = step_mlir(devices, &["max_segments_per_seq=4", "remat_policy=minimal_flash"], true);
        assert_eq!(mlir.matches("max_seg_per_batch\\22: 4,").count(), 2, "{devices} devices");
        assert_eq!(mlir.matches("PADDING_CAUSAL").count(), 2, "{devices} devices");
    }
}

/// The custom calls in the train step of `extra` on `devices` devices: (forward calls, backward
/// calls). On several devices they run in manual computations; on one, bare.
fn calls_in_step(devices: usize, extra: &[&str]) -> (usize, usize) {
    let mlir = step_mlir(devices, extra, false);
    assert_eq!(mlir.contains("sdy.manual_computation("), devices > 1, "manual computations on {devices} devices");
    (
        mlir.matches("custom_call @__cudnn$fmhaSoftmax(").count(),
        mlir.matches("custom_call @__cudnn$fmhaSoftmaxBackward(").count(),
    )
}

#[test]
fn saving_context_keeps_the_backward_pass_from_recomputing_attention() {
    assert_eq!(calls_in_step(4, &["remat_policy=minimal_flash"]), (1, 1));
    assert_eq!(calls_in_step(4, &["remat_policy=full"]), (2, 1));
    assert_eq!(calls_in_step(1, &["remat_policy=minimal_flash"]), (1, 1));
}

/// `train-compile` of a cuDNN-attention run for an H100 (deviceless): the saved step has
/// blockwise attention (its executable could not hold cuDNN's graphs, which XLA builds only on a
/// GPU), and the memory verdict is for the step a run on the GPU compiles, whose optimized
/// module still calls cuDNN's fused attention, forward and backward. Two unscanned layers on
/// packed documents (synthetic, `max_segments_per_seq=4`), as MaxText's 2-node Llama2-7B recipe
/// has them.
#[test]
fn a_deviceless_compile_judges_the_cudnn_step_and_saves_the_blockwise_one() {
    use maxrs::aot::topology::lookup;
    if !crate::common::provision::provisioned(&lookup("h100-1", 1).unwrap()) {
        return;
    }
    let dump = tempfile::tempdir().unwrap();
    // The test binary's cheapest-compile flags (tests/main.rs; no Triton or cuBLASLt GEMM fusions
    // and `ptxas -O0` too: measured 20.5 -> 8.4 CPU-s), which leave cuDNN's attention calls as they
    // are, and the dump of the optimized modules.
    let cheapest = std::env::var("XLA_FLAGS").unwrap_or_default();
    let flags = format!("{cheapest} --xla_dump_to={} --xla_dump_hlo_as_text", dump.path().display());
    let args = [
        "train-compile",
        "--topology=h100-1",
        "base_emb_dim=64",
        "base_num_query_heads=2",
        "base_num_kv_heads=2",
        "head_dim=32",
        "base_mlp_dim=128",
        "base_num_decoder_layers=2",
        "scan_layers=false",
        "vocab_size=256",
        "per_device_batch_size=1",
        "max_target_length=128",
        "dtype=bfloat16",
        "attention=cudnn_flash_te",
        "use_iota_embed=true",
        "max_segments_per_seq=4",
        "synthetic_progression=false",
        "remat_policy=minimal_flash",
    ];
    let out = crate::common::cli::finish(crate::common::cli::command(&args, &[("XLA_FLAGS", &flags)]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        stdout.contains("-> blockwise attention") && stdout.contains("cannot hold cuDNN's compiled graphs"),
        "{stdout}"
    );
    let saved = stdout.find("memory of the saved step (blockwise attention):").expect("the saved step's table");
    let judged = stdout.find("memory of the step a run on the GPU compiles (cuDNN's attention").expect("the verdict's");
    assert!(saved < judged, "the verdict's table comes last: {stdout}");
    // Two modules were compiled: one calls cuDNN's attention, the other does not.
    let optimized: Vec<String> = std::fs::read_dir(dump.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with("gpu_after_optimizations.txt"))
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    let calling =
        |target: &str| optimized.iter().filter(|m| m.contains(&format!("custom_call_target=\"{target}\""))).count();
    assert_eq!(optimized.len(), 2, "the saved and the judged step");
    assert_eq!(calling(maxrs::model::cudnn::FORWARD), 1, "the judged step calls cuDNN's forward attention");
    assert_eq!(calling(maxrs::model::cudnn::BACKWARD), 1, "and its backward");
    // `use_iota_embed`: the one-hot of the tokens (`[batch x seq, vocab]`) is made twice, once for
    // the embeddings and again in the backward pass, after the attention's backward, where the
    // table's gradient reads it: it is not kept through the step (issue 46).
    let judged = optimized.iter().find(|m| m.contains(maxrs::model::cudnn::BACKWARD)).unwrap();
    let entry = &judged[judged.find("\nENTRY").expect("an entry computation")..];
    let one_hots: Vec<usize> = entry
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains("= bf16[128,256]{1,0} fusion(%batch_inputs"))
        .map(|(i, _)| i)
        .collect();
    let backward = entry.lines().position(|l| l.contains(maxrs::model::cudnn::BACKWARD)).unwrap();
    assert!(one_hots.len() == 2 && one_hots[0] < backward && backward < one_hots[1], "{one_hots:?}, {backward}");
    // Packed documents: each layer's forward call is cuDNN's packed one, with statistics for
    // `batch x max` document slots (`f32[4,2,128]`), which the step keeps one entry per token
    // (`model::cudnn::pack_stats`; `cudnn_golden::packed_statistics_are_kept_one_entry_per_token`).
    let forward = format!("custom_call_target=\"{}\"", maxrs::model::cudnn::FORWARD);
    let packed = entry.lines().filter(|l| l.contains(&forward) && l.contains("f32[4,2,128]")).count();
    assert_eq!(packed, 2, "a packed forward call per layer");
}

/// Llama 4 under cuDNN's attention: XLA's fused attention takes no chunk mask, so a block of a
/// chunked layer and a NoPE one calls cuDNN once (the NoPE layer's global attention, forward and
/// backward) and computes the chunked layer blockwise, as the start-up line says.
#[test]
fn llama4_chunked_layers_are_blockwise_under_cudnn() {
    let llama4 = [
        "decoder_block=llama4",
        "inhomogeneous_layer_cycle_interval=2",
        "base_num_decoder_layers=2",
        "nope_layer_interval=2",
        "interleave_moe_layer_step=2",
        "chunk_attn_window_size=8",
        "num_experts=2",
        "base_moe_mlp_dim=64",
    ];
    let got = line(&llama4);
    assert!(got.contains("-> XLA's cuDNN fused attention") && got.contains("in the chunked-attention layers"), "{got}");
    assert_eq!(calls_in_step(1, &[&llama4[..], &["remat_policy=minimal_flash"]].concat()), (1, 1));
}

/// Gemma 4's global layers (heads of `global_head_dim`, 512 in its model files, past cuDNN's 256)
/// are blockwise under cuDNN while its local layers (256) call cuDNN, as the start-up line says.
#[test]
fn gemma4_global_layers_are_blockwise_under_cudnn() {
    let got = line(&["decoder_block=gemma4", "head_dim=256", "global_head_dim=512", "scan_layers=false"]);
    assert!(got.contains("-> XLA's cuDNN fused attention") && got.contains("blockwise"), "{got}");
    assert!(
        got.contains("in the global layers: cuDNN's fused attention needs a head_dim") && got.contains("512"),
        "{got}"
    );
}
