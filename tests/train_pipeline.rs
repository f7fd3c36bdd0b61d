//! The training loop keeps the devices fed (metrics read one step late, the next batch sent while
//! a step runs) without changing what is logged, and profiles MaxText's step range:
//! - the metrics file has every step once, in order, with that step's own loss, and the run
//!   summary has a device-idle share;
//! - `profiler=xplane` on the CPU plugin, which has no profiler, fails before training;
//! - the CUDA plugin's profiler (no GPU needed to trace the host) writes an XSpace where
//!   TensorBoard's profile plugin looks (`<tensorboard>/plugins/profile/<time>/<host>.xplane.pb`);
//! - `profiler=nsys` without `libcudart` runs and says it has no effect.

use maxrs::config;
use maxrs::pjrt::{cpu_client, load_plugin, profiler::XSpace};
use maxrs::train::profiler::{tensorboard_dir, StepProfiler};
use maxrs::train::run::train;
use prost::Message;

use crate::common::provision::skip_offline;

/// A 5-step run of the tests' tiniest decoder: what these tests check (metrics lines, the
/// profiler's steps) does not depend on the model, and the default one took twice the CPU.
fn config(extra: &[&str]) -> config::Config {
    let run = ["dtype=float32", "steps=5", "max_target_length=32"];
    let args: Vec<String> = run.iter().chain(crate::common::TINY_DECODER).chain(extra).map(|s| s.to_string()).collect();
    config::load(None, &args).expect("config loads")
}

/// The run also profiles with `profiler=nsys` (step 1), which without `libcudart` runs and has
/// no effect: every step's metrics line is there all the same. One run for what were two tests
/// (this one and `nsys_without_cuda_runtime_has_no_effect`).
#[test]
fn metrics_come_one_step_late_but_each_line_is_its_own_step_and_nsys_without_cuda_runtime_has_no_effect() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = dir.path().join("metrics.jsonl");
    let file = format!("metrics_file={}", metrics.display());
    let c = config(&[&file, "profiler=nsys", "skip_first_n_steps_for_profiler=1", "profiler_steps=1"]);
    let report = train(&c, &cpu_client(1).unwrap()).unwrap();
    assert_eq!(report.losses.len(), 5);
    let lines: Vec<serde_json::Value> =
        std::fs::read_to_string(&metrics).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 5);
    for (step, (line, loss)) in lines.iter().zip(&report.losses).enumerate() {
        assert_eq!(line["step"].as_f64(), Some(step as f64));
        assert_eq!(line["learning/loss"].as_f64(), Some(*loss));
        assert!(line["perf/step_time_seconds"].as_f64().unwrap() > 0.0, "{line}");
    }
    let idle = report.device_idle_fraction.expect("the CPU plugin reports when outputs are ready");
    assert!((0.0..1.0).contains(&idle), "{idle}");
}

#[test]
fn xplane_on_a_plugin_without_profiler_fails_before_training() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(&["profiler=xplane", &format!("base_output_directory={}", dir.path().display())]);
    let err = format!("{:#}", train(&c, &cpu_client(1).unwrap()).unwrap_err());
    assert!(err.contains("profiler=xplane") && err.contains("has no profiler"), "{err}");
}

#[test]
fn xplane_trace_lands_where_tensorboard_reads_it() {
    let (_, plugin) = match load_plugin(Some("cuda12")) {
        Ok(p) => p,
        Err(e) => return skip_offline(&format!("loading the cuda12 plugin: {e:#}")),
    };
    let dir = tempfile::tempdir().unwrap();
    let c = config(&[
        "profiler=xplane",
        "run_name=traced",
        "skip_first_n_steps_for_profiler=2",
        "profiler_steps=2",
        &format!("base_output_directory={}", dir.path().display()),
    ]);
    let mut profiler = StepProfiler::new(&c, &plugin, 5).unwrap().expect("profiling was asked for");
    assert!(!profiler.starts_at(1) && profiler.starts_at(2) && profiler.stops_after(3) && !profiler.stops_after(2));
    profiler.start().unwrap();
    let trace = profiler.stop().unwrap().expect("an xplane trace");
    let path = trace.local_path().expect("a local directory").to_path_buf();
    let run = path.parent().unwrap();
    assert_eq!(run.parent().unwrap(), dir.path().join("traced/tensorboard/plugins/profile"));
    let tensorboard = tensorboard_dir(&c).unwrap().expect("base_output_directory is set");
    assert_eq!(tensorboard.local_path(), Some(dir.path().join("traced/tensorboard").as_path()));
    assert!(path.file_name().unwrap().to_str().unwrap().ends_with(".xplane.pb"));
    let space = XSpace::decode(std::fs::read(&path).unwrap().as_slice()).unwrap();
    assert!(space.planes.iter().any(|p| p.name.starts_with("/host")), "{space:?}");
}

#[test]
fn profiler_and_attention_keys_are_checked() {
    let err = |args: &[&str]| {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let c = config::load(None, &args).map_err(|e| e.to_string());
        c.and_then(|c| config::validate(&c, 1, 1).map(drop).map_err(|e| e.to_string())).unwrap_err()
    };
    assert!(err(&["profiler=xprof"]).contains("xplane, nsys"), "{}", err(&["profiler=xprof"]));
    assert!(err(&["attention=paged"]).contains("cudnn_flash_te"), "{}", err(&["attention=paged"]));
    let late = err(&["profiler=nsys", "steps=3", "skip_first_n_steps_for_profiler=3"]);
    assert!(late.contains("skip_first_n_steps_for_profiler") && late.contains("3 steps"), "{late}");
    assert!(err(&["profiler=xplane"]).contains("base_output_directory"));
    assert!(err(&["profiler_steps=0"]).contains("profiler_steps"));
}
