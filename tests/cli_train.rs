//! `maxrs train` as a user runs it: the default run trains with a falling loss and writes the
//! metrics file MaxText's tooling reads; bad input stops before training with an error that
//! names the culprit.

use std::process::{Command, Output};

fn maxrs(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_maxrs")).args(args).output().expect("run maxrs")
}

fn text(out: &Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn default_run_trains_and_writes_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = dir.path().join("metrics.jsonl");
    let out = maxrs(&["train", "steps=15", &format!("metrics_file={}", metrics.display())]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("global batch 8"), "the derived values are printed: {stdout}");
    let losses = crate::common::cli::losses(&stdout);
    assert_eq!(losses.len(), 15, "{stdout}");
    // 15 steps (30 until CI time mattered): 6.76 -> 5.43, deterministic on the CPU plugin.
    assert!(losses[14] < losses[0] - 1.0, "the loss falls: {losses:?}");

    let lines: Vec<serde_json::Value> =
        std::fs::read_to_string(&metrics).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 15);
    for key in [
        "step",
        "learning/loss",
        "learning/grad_norm",
        "learning/current_learning_rate",
        "perf/step_time_seconds",
        "perf/per_device_tflops",
        "perf/per_device_tflops_per_sec",
        "perf/per_device_tokens_per_sec",
    ] {
        assert!(lines[5][key].is_f64(), "metrics line lacks {key}: {}", lines[5]);
    }
    let file_loss = lines[14]["learning/loss"].as_f64().unwrap();
    assert!(
        (file_loss - losses[14]).abs() <= 5e-4,
        "file {file_loss} and log {} agree to the log's 3 decimals",
        losses[14]
    );
}

#[test]
fn bad_input_names_the_culprit() {
    let cases: &[(&[&str], &str)] = &[
        (&["train", "per_device_batch_sise=4"], "per_device_batch_size"),
        (&["train", "cpu_device_count=8", "ici_fsdp_parallelism=3"], "ici_fsdp_parallelism"),
        (
            &["train", "xla_flags_file=a3megaa"],
            "valid: a3mega, a3mega-1, a3mega-2, a3mega-4, a3mega-8, a3mega-16, h100, cpu",
        ),
        (&["train", "load_parameters_path=/nonexistent/params.safetensors"], "/nonexistent/params.safetensors"),
        (&["train", "dataset_type=tokens"], "dataset_path"),
        (&["train", "configs/nope.yml"], "configs/nope.yml"),
    ];
    for (args, culprit) in cases {
        let out = maxrs(args);
        let (stdout, stderr) = text(&out);
        assert!(!out.status.success(), "{args:?} must fail:\n{stdout}");
        assert!(stderr.contains(culprit), "{args:?}: the error must name {culprit}:\n{stderr}");
        assert!(!stdout.contains("completed step"), "{args:?} must fail before training");
    }
}
