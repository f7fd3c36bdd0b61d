//! The log line's format, the metrics file's keys and truncate/append rule, the median helper.

use maxrs::train::metrics::{median_step_time, EvalMetrics, MetricsWriter, PerDeviceWork, StepMetrics};

fn metrics(step: u64, peak: Option<f64>) -> StepMetrics {
    StepMetrics {
        step,
        loss: 5.12345,
        grad_norm: 1.25,
        learning_rate: 3e-4,
        total_weights: 8192,
        moe_lb_loss: None,
        preference: [None; 7],
        step_time_seconds: 0.5,
        work: PerDeviceWork { tflops: 6.15, tokens: 2000.0, peak_tflops: peak },
    }
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("maxrs-train-metrics-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn log_line_is_maxtexts() {
    assert_eq!(
        metrics(3, None).log_line(),
        "completed step: 3, seconds: 0.500, TFLOP/s/device: 12.300, Tokens/s/device: 4000.000, total_weights: 8192, loss: 5.123"
    );
    assert_eq!(
        metrics(3, Some(24.6)).log_line(),
        "completed step: 3, seconds: 0.500, TFLOP/s/device: 12.300, Tokens/s/device: 4000.000, total_weights: 8192, loss: 5.123, MFU: 50.00%"
    );
    let moe = StepMetrics { moe_lb_loss: Some(0.0123456), ..metrics(3, Some(24.6)) };
    assert_eq!(
        moe.log_line(),
        "completed step: 3, seconds: 0.500, TFLOP/s/device: 12.300, Tokens/s/device: 4000.000, total_weights: 8192, loss: 5.123, moe_lb_loss: 0.012346, MFU: 50.00%"
    );
    assert_eq!(moe.to_json("r")["learning/moe_lb_loss"], 0.0123456);
    assert!(metrics(3, None).to_json("r").get("learning/moe_lb_loss").is_none());
    let nan = StepMetrics { loss: f64::NAN, ..metrics(0, None) };
    assert!(nan.log_line().ends_with("loss: nan"), "{}", nan.log_line());
}

/// MaxText's `record_eval_metrics`: the load-balancing loss summed over eval steps and averaged
/// per step, beside (not inside) `eval/avg_loss`.
#[test]
fn eval_reports_the_load_balancing_loss_for_models_with_experts() {
    let dense = EvalMetrics { step: 9, total_loss: 40.0, total_weights: 10.0, eval_steps: 2, ..Default::default() };
    let moe = EvalMetrics { moe_lb_loss_sum: Some(0.03), ..dense.clone() };
    assert!(dense.to_json("r").get("eval/avg_moe_lb_loss").is_none());
    assert!(!dense.log_line().contains("moe_lb_loss"), "{}", dense.log_line());
    let json = moe.to_json("r");
    assert_eq!((json["eval/moe_lb_loss"].as_f64(), json["eval/avg_moe_lb_loss"].as_f64()), (Some(0.03), Some(0.015)));
    assert_eq!(json["eval/avg_loss"].as_f64(), dense.to_json("r")["eval/avg_loss"].as_f64());
    assert!(moe.log_line().ends_with(", avg_z_loss=0.000, avg_moe_lb_loss=0.015000"), "{}", moe.log_line());
}

#[test]
fn metrics_file_lines_parse_with_maxtexts_keys() {
    let dir = temp_dir("keys");
    let path = dir.join("nested/metrics.txt");
    let mut writer = MetricsWriter::open(&path.as_path().into(), 0, "run1").unwrap();
    writer.write(&metrics(0, Some(24.6))).unwrap();
    writer.write(&StepMetrics { loss: f64::NAN, ..metrics(1, None) }).unwrap();

    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2);
    let first = &lines[0];
    for key in [
        "step",
        "learning/loss",
        "learning/grad_norm",
        "learning/current_learning_rate",
        "learning/total_weights",
        "perf/step_time_seconds",
        "perf/per_device_tflops",
        "perf/per_device_tflops_per_sec",
        "perf/per_device_tokens",
        "perf/per_device_tokens_per_sec",
        "perf/mfu",
        "run_name",
    ] {
        assert!(first.get(key).is_some(), "missing {key} in {first}");
    }
    assert_eq!(first["step"].as_f64(), Some(0.0));
    assert_eq!(first["learning/loss"].as_f64(), Some(5.12345));
    assert_eq!(first["learning/grad_norm"].as_f64(), Some(1.25));
    assert_eq!(first["learning/current_learning_rate"].as_f64(), Some(3e-4));
    assert_eq!(first["perf/per_device_tflops_per_sec"].as_f64(), Some(12.3));
    assert_eq!(first["perf/per_device_tokens_per_sec"].as_f64(), Some(4000.0));
    assert_eq!(first["perf/mfu"].as_f64(), Some(0.5));
    assert_eq!(first["run_name"], "run1");
    assert!(lines[1]["learning/loss"].is_null(), "NaN is written as null: {}", lines[1]);
    assert!(lines[1].get("perf/mfu").is_none(), "no MFU without a peak");

    // While a writer holds the file, another run is refused.
    let busy = MetricsWriter::open(&path.as_path().into(), 0, "run2").err().expect("the file is locked");
    assert!(busy.to_string().contains("another run") && busy.to_string().contains("metrics_file"), "{busy}");
    drop(writer);
    // A new run from step 0 overwrites; a resumed run appends.
    MetricsWriter::open(&path.as_path().into(), 0, "run2").unwrap().write(&metrics(0, None)).unwrap();
    MetricsWriter::open(&path.as_path().into(), 1, "run2").unwrap().write(&metrics(1, None)).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let steps: Vec<f64> =
        text.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["step"].as_f64().unwrap()).collect();
    assert_eq!(steps, [0.0, 1.0]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn open_error_names_the_file() {
    let dir = temp_dir("err");
    std::fs::create_dir_all(&dir).unwrap();
    let blocker = dir.join("file");
    std::fs::write(&blocker, b"x").unwrap();
    let err = MetricsWriter::open(&blocker.join("metrics.txt").as_path().into(), 0, "r").err().unwrap();
    assert!(err.to_string().contains("metrics_file"), "{err}");
    assert!(err.to_string().contains(&blocker.display().to_string()), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn median_skips_the_first_step() {
    assert_eq!(median_step_time(&[]), None);
    assert_eq!(median_step_time(&[30.0]), None);
    assert_eq!(median_step_time(&[30.0, 1.0]), Some(1.0));
    assert_eq!(median_step_time(&[30.0, 3.0, 1.0, 2.0]), Some(2.0));
    assert_eq!(median_step_time(&[30.0, 4.0, 1.0, 2.0, 3.0]), Some(2.5));
}
