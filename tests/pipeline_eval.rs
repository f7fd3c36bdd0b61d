//! Eval and the profiler in pipelined runs (`ici_pipeline_parallelism=2`, one stage per CPU
//! device): the tiny f32 decoder trains 2 steps on packed text and evaluates after each on a
//! held-out file, pipelined and unpipelined (fsdp over the same 2 devices).
//! - the eval losses and token counts equal the unpipelined run's (f32 rounding), and so do the
//!   train losses: the eval's forward leaves the train state (the gradient accumulators) alone;
//! - and so do those of the two stages on two processes (`dcn_pipeline_parallelism=2`, `maxrs
//!   launch`, one CPU device each): the eval's forward tasks cross between the processes as the
//!   train step's do, and the last stage's sums reach the logging process;
//! - the profiler brackets the pipelined steps as the unpipelined loop does (`profiler=nsys`
//!   runs, without libcudart to no effect); `profiler=xplane` needs a plugin with a profiler, which
//!   the CPU plugin is not, so it fails before the compile as unpipelined runs do.

use std::path::Path;

use maxrs::config;
use maxrs::pjrt::cpu_client;
use maxrs::train::run::{train, RunReport};

const WORDS: &[&str] =
    &["the", "stage", "sends", "a", "batch", "of", "tokens", "to", "next", "loss", "falls", "slowly"];

/// A JSON Lines file of `n` short documents, drawn from `WORDS` by a fixed rule (`salt` varies it).
fn write_docs(path: &Path, n: usize, salt: usize) {
    let lines: Vec<String> = (0..n)
        .map(|d| {
            let words: Vec<&str> =
                (0..5 + (d * 7 + salt) % 9).map(|w| WORDS[(d * 5 + w * 3 + salt) % WORDS.len()]).collect();
            serde_json::json!({ "text": words.join(" ") }).to_string()
        })
        .collect();
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

fn args(dir: &Path, extra: &[&str]) -> config::Config {
    config::load(None, &arg_list(dir, extra)).expect("config loads")
}

fn arg_list(dir: &Path, extra: &[&str]) -> Vec<String> {
    let tokenizer = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/shakespeare-bpe512.model");
    let mut args: Vec<String> = [
        "base_emb_dim=32",
        "base_num_query_heads=4",
        "base_num_kv_heads=2",
        "head_dim=8",
        "base_mlp_dim=64",
        "base_num_decoder_layers=2",
        "vocab_size=512",
        "max_target_length=16",
        "dtype=float32",
        "weight_dtype=float32",
        "learning_rate=1e-2",
        // As tests/common's PIPELINE_TINY: rounding-noise gradients stay still, so the two steps compare.
        "adam_eps=1e-4",
        "per_device_batch_size=2",
        "steps=2",
        "dataset_type=hf",
        "packing=true",
        "enable_data_shuffling=false",
        "eval_interval=1",
        "eval_steps=2",
        "cpu_device_count=2",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend([
        format!("hf_train_files={}", dir.join("train.jsonl").display()),
        format!("hf_eval_files={}", dir.join("eval.jsonl").display()),
        format!("tokenizer_path={}", tokenizer.display()),
    ]);
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

const PIPELINED: &[&str] = &[
    "ici_pipeline_parallelism=2",
    "ici_fsdp_parallelism=1",
    "num_layers_per_pipeline_stage=1",
    "num_pipeline_microbatches=2",
];

fn run(dir: &Path, extra: &[&str]) -> RunReport {
    train(&args(dir, extra), &cpu_client(2).unwrap()).expect("the run trains")
}

/// The metrics file's lines (train and eval, in order) of the pipeline's stages on two
/// processes of one CPU device each (`maxrs launch`).
fn launched(dir: &Path) -> Vec<serde_json::Value> {
    let across = ["cpu_device_count=1", "dcn_pipeline_parallelism=2"];
    let stages: Vec<&str> = PIPELINED.iter().filter(|a| !a.starts_with("ici_pipeline")).copied().collect();
    let mut a = arg_list(dir, &[&stages[..], &across].concat());
    a.retain(|arg| arg != "cpu_device_count=2");
    a.push(format!("base_output_directory={}", dir.join("launched").display()));
    crate::common::cli::launch_train(2, &a, &dir.join("launched.jsonl")).0
}

#[test]
fn pipelined_eval_equals_the_unpipelined_one_and_the_profiler_brackets_its_steps() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_docs(&dir.join("train.jsonl"), 60, 0);
    write_docs(&dir.join("eval.jsonl"), 30, 5);

    let flat = run(dir, &["ici_fsdp_parallelism=2"]);
    let profiled = ["profiler=nsys", "skip_first_n_steps_for_profiler=1", "profiler_steps=1"];
    let piped = run(dir, &[PIPELINED, &profiled].concat());
    assert!(piped.pipeline.is_some(), "the run is pipelined");
    assert_eq!(piped.losses.len(), 2);
    for (step, (p, f)) in piped.losses.iter().zip(&flat.losses).enumerate() {
        assert!((p - f).abs() < 1e-5, "train loss {step}: pipelined {p}, unpipelined {f}");
    }
    assert_eq!(piped.evals.len(), 2, "an eval after each step");
    for (p, f) in piped.evals.iter().zip(&flat.evals) {
        assert_eq!((p.step, p.eval_steps), (f.step, f.eval_steps));
        assert_eq!(p.total_weights, f.total_weights, "after step {}", p.step);
        assert!(p.total_weights > 0.0 && p.eval_steps == 2);
        let (pl, fl) = (p.avg_loss(), f.avg_loss());
        assert!((pl - fl).abs() < 1e-5, "eval after step {}: pipelined {pl}, unpipelined {fl}", p.step);
        assert!((p.avg_z_loss() - f.avg_z_loss()).abs() < 1e-6);
    }
    assert!(piped.evals[1].avg_loss() < piped.evals[0].avg_loss(), "{:?}", piped.evals);

    let lines = launched(dir);
    let value = |prefix: &str, key: &str| -> Vec<f64> {
        lines.iter().filter(|l| l.get(prefix).is_some()).map(|l| l[key].as_f64().unwrap()).collect()
    };
    let (train_losses, evals) = (value("learning/loss", "learning/loss"), value("eval/avg_loss", "eval/avg_loss"));
    assert_eq!((train_losses.len(), evals.len()), (2, 2), "{lines:?}");
    for (step, (l, p)) in train_losses.iter().zip(&piped.losses).enumerate() {
        assert!((l - p).abs() < 1e-5, "train loss {step}: on two processes {l}, in one {p}");
    }
    for (l, p) in evals.iter().zip(&piped.evals) {
        assert!(
            (l - p.avg_loss()).abs() < 1e-5,
            "eval after step {}: on two processes {l}, in one {}",
            p.step,
            p.avg_loss()
        );
    }

    let out = format!("base_output_directory={}", dir.join("out").display());
    let xplane = [PIPELINED, &["profiler=xplane", &out]].concat();
    let err = format!("{:#}", train(&args(dir, &xplane), &cpu_client(2).unwrap()).unwrap_err());
    assert!(err.contains("profiler=xplane") && err.contains("has no profiler"), "{err}");
}

#[test]
fn pipelined_evals_that_cannot_run_are_refused_naming_the_keys() {
    let dir = Path::new("/nonexistent");
    let invalid =
        |extra: &[&str]| config::validate(&args(dir, &[PIPELINED, extra].concat()), 2, 1).unwrap_err().to_string();
    let e = invalid(&["eval_per_device_batch_size=1"]);
    assert!(
        e.starts_with("eval_per_device_batch_size, num_pipeline_microbatches:") && e.contains("multiple of 4"),
        "{e}"
    );
    let e = invalid(&["dataset_type=synthetic"]);
    assert!(e.starts_with("packing, dataset_type, eval_interval:") && e.contains("packing=false"), "{e}");
    config::validate(&args(dir, &[PIPELINED, &["dataset_type=synthetic", "packing=false"]].concat()), 2, 1)
        .expect("unpacked eval batches of an unpacked run");
}
