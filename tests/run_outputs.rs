//! A run's outputs under `base_output_directory/run_name/`: the resolved `config.yml`, the
//! metrics files every `log_period` steps, and TensorBoard event files that TensorBoard's own
//! reader parses (its `EventAccumulator`, in a cached virtualenv) with MaxText's scalar names;
//! and the same run against a real GCS emulator (`gs://`), which writes checkpoints and outputs
//! there and resumes from them.

use std::collections::BTreeMap;

use maxrs::config;
use maxrs::files::Location;
use maxrs::input::RUN_LOG;
use maxrs::pjrt::cpu_client;
use maxrs::storage;
use maxrs::train::run::{train, RunReport};
use maxrs::train::tensorboard::{masked_crc32c, Event, EventKind, ValueKind};
use prost::Message;

fn run(extra: &[String]) -> RunReport {
    let mut args = crate::common::small_model(&["per_device_batch_size=8", "log_period=2"]);
    args.extend(extra.iter().cloned());
    let c = config::load(None, &args).unwrap();
    train(&c, &cpu_client(1).unwrap()).unwrap()
}

/// Decodes a TFRecord file of `Event`s, checking both masked CRCs of every record.
fn events(bytes: &[u8]) -> Vec<Event> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let len_bytes = &bytes[at..at + 8];
        let len = u64::from_le_bytes(len_bytes.try_into().unwrap()) as usize;
        assert_eq!(u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()), masked_crc32c(len_bytes));
        let data = &bytes[at + 12..at + 12 + len];
        assert_eq!(u32::from_le_bytes(bytes[at + 12 + len..at + 16 + len].try_into().unwrap()), masked_crc32c(data));
        out.push(Event::decode(data).unwrap());
        at += 16 + len;
    }
    out
}

/// `learning/loss` per step from decoded events.
fn losses(events: &[Event]) -> BTreeMap<i64, f32> {
    let mut out = BTreeMap::new();
    for e in events {
        if let Some(EventKind::Summary(s)) = &e.what {
            for v in &s.value {
                if let (true, Some(ValueKind::SimpleValue(x))) = (v.tag == "learning/loss", &v.value) {
                    out.insert(e.step, *x);
                }
            }
        }
    }
    out
}

fn names(location: &Location) -> Vec<String> {
    storage::list_dir(location).unwrap().into_iter().map(|e| e.name).collect()
}

#[test]
fn config_metrics_and_tensorboard_events_in_the_run_directory() {
    let d = tempfile::tempdir().unwrap();
    let report = run(&[format!("base_output_directory={}", d.path().display()), "run_name=o".into(), "steps=5".into()]);
    let dir = d.path().join("o");

    // The resolved config: every key with the run's value.
    let back: config::Config = serde_yaml::from_str(&std::fs::read_to_string(dir.join("config.yml")).unwrap()).unwrap();
    assert_eq!((back.run_name.as_str(), back.base_emb_dim, back.steps), ("o", 64, 5));

    // Metrics: one file per log_period steps, and the last partial one.
    let files = names(&Location::Local(dir.join("metrics")));
    assert_eq!(
        files,
        [
            "metrics_step_000000_to_step_000001.txt",
            "metrics_step_000002_to_step_000003.txt",
            "metrics_step_000004_to_step_000004.txt"
        ]
    );
    let line = std::fs::read_to_string(dir.join("metrics").join(&files[1])).unwrap();
    let first: serde_json::Value = serde_json::from_str(line.lines().next().unwrap()).unwrap();
    assert_eq!(first["step"], 2.0);
    assert_eq!(first["learning/loss"].as_f64(), Some(report.losses[2]));

    // TensorBoard events: our decoding, then TensorBoard's reader.
    let tb = dir.join("tensorboard/o");
    let event_files = names(&Location::Local(tb.clone()));
    assert_eq!(event_files.len(), 1);
    assert!(event_files[0].starts_with("events.out.tfevents."), "{event_files:?}");
    let decoded = events(&std::fs::read(tb.join(&event_files[0])).unwrap());
    assert_eq!(decoded[0].what, Some(EventKind::FileVersion("brain.Event:2".into())));
    let want: BTreeMap<i64, f32> = report.losses.iter().enumerate().map(|(i, l)| (i as i64, *l as f32)).collect();
    assert_eq!(losses(&decoded), want);

    let Some(read) = crate::common::tensorboard_reader::scalars(&tb) else { return };
    for tag in [
        "learning/loss",
        "learning/current_learning_rate",
        "learning/grad_norm",
        "learning/total_weights",
        "perf/step_time_seconds",
        "perf/per_device_tflops_per_sec",
        "perf/per_device_tokens_per_sec",
    ] {
        assert_eq!(read[tag].as_array().map(|a| a.len()), Some(5), "TensorBoard reads 5 steps of {tag}: {read}");
    }
    let read_losses: BTreeMap<i64, f32> = read["learning/loss"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_i64().unwrap(), p[1].as_f64().unwrap() as f32))
        .collect();
    assert_eq!(read_losses, want, "TensorBoard's reader sees the losses");
    let lr = read["learning/current_learning_rate"].as_array().unwrap();
    assert_eq!(lr[3][1].as_f64().unwrap() as f32, report.learning_rates[3] as f32);
}

#[test]
fn a_gs_run_writes_its_outputs_and_resumes_from_the_emulator() {
    let Some(_emulator) = crate::common::gcs_emulator::start(&["maxrs-runs"]) else { return };
    let base = "gs://maxrs-runs/experiments";
    let args = |steps: &str| {
        vec![
            format!("base_output_directory={base}"),
            "run_name=g".into(),
            "enable_checkpointing=true".into(),
            "checkpoint_period=2".into(),
            "learning_rate_schedule_steps=5".into(),
            format!("metrics_file={base}/g-metrics.jsonl"),
            steps.into(),
        ]
    };
    let first = run(&args("steps=3"));
    assert_eq!(first.checkpoints.len(), 2, "steps 0 and 2");
    let dir = Location::parse(&format!("{base}/g")).unwrap();
    assert_eq!(names(&dir), ["checkpoints", "config.yml", "metrics", "tensorboard"]);
    assert_eq!(names(&dir.join("checkpoints")), ["0", "2"]);
    assert_eq!(names(&dir.join("checkpoints/2")), ["manifest.json", "opt_state.safetensors", "params.safetensors"]);

    let second = run(&args("steps=5"));
    assert_eq!(second.first_step, 3, "resumed from gs://.../checkpoints/2");
    assert_eq!(second.losses.len(), 2);
    assert_eq!(names(&dir.join("checkpoints")), ["0", "2", "4"]);

    // The metrics file on GCS has every step; the event files hold each run's steps.
    let metrics = storage::read(&Location::parse(&format!("{base}/g-metrics.jsonl")).unwrap(), RUN_LOG).unwrap();
    let steps: Vec<f64> = String::from_utf8(metrics)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["step"].as_f64().unwrap())
        .collect();
    assert_eq!(steps, [0.0, 1.0, 2.0, 3.0, 4.0]);
    let tb = dir.join("tensorboard/g");
    let mut seen = BTreeMap::new();
    for file in names(&tb) {
        seen.extend(losses(&events(&storage::read(&tb.join(&file), RUN_LOG).unwrap())));
    }
    assert_eq!(seen.keys().copied().collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
}
