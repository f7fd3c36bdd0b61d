//! Pipeline stages on several processes (`dcn_pipeline_parallelism`, issue 51) on the CPU
//! plugin: `maxrs launch` runs 2 processes of 2 CPU devices on loopback, each process its group
//! of stages, activations and gradients crossing between the processes through the coordination
//! service's key-value store (the CPU path, `train::pipeline::relay`). Every step's loss equals
//! the unpipelined step's on 4 devices of one process (same model, initializer and global
//! batch) within 1e-5 (f32): 2 stages with gpipe, and 4 stages (2 a process, a local link
//! between them and one across) with 1f1b; the job checkpoint resumes on the two processes and
//! in an unpipelined run; a process killed mid-run stops the other with an error naming it. On
//! GPUs the arrays go device to device through PJRT's cross-host transfers: the CUDA plugins have
//! the extension with the checked layouts, the CPU plugin none (the two-GPU run is
//! tools/gpu-check.d/51-xhost-pipeline.sh's). The refusals of what the path cannot do yet are config errors
//! (tests/pipeline.rs has the config tests).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use maxrs::config;
use maxrs::pjrt::{cpu_client, cross_host, load_plugin};
use maxrs::train::run::train;

const MAXRS: &str = env!("CARGO_BIN_EXE_maxrs");

/// The tests' pipeline model with 4 layers (one a stage with 4 stages) and `extra`, which may
/// replace its `steps`.
fn args(extra: &[&str]) -> Vec<String> {
    let replaced = |a: &&str| extra.iter().any(|e| e.split('=').next() == a.split('=').next());
    let mut all: Vec<String> = crate::common::PIPELINE_TINY
        .iter()
        .filter(|a| !a.starts_with("cpu_device_count=") && !replaced(a))
        .chain(["base_num_decoder_layers=4", "per_device_batch_size=2"].iter())
        .map(|s| s.to_string())
        .collect();
    all.extend(extra.iter().map(|s| s.to_string()));
    all
}

/// Each step's loss (f64, from the metrics file) of `maxrs launch --num-processes 2 -- train
/// args` with 2 CPU devices a process.
fn launched(extra: &[&str]) -> Vec<f64> {
    launched_in(tempfile::tempdir().unwrap().path(), "metrics.jsonl", extra)
}

/// [`launched`] with its outputs in `dir` and its metrics in `dir/metrics`.
fn launched_in(dir: &std::path::Path, metrics: &str, extra: &[&str]) -> Vec<f64> {
    let mut a = args(extra);
    a.extend([
        "cpu_device_count=2".to_string(),
        "dcn_pipeline_parallelism=2".to_string(),
        "num_pipeline_microbatches=4".to_string(),
        format!("base_output_directory={}", dir.display()),
    ]);
    let (lines, stdout) = crate::common::cli::launch_train(2, &a, &dir.join(metrics));
    assert!(stdout.contains("pipeline: "), "a pipelined run:\n{stdout}");
    lines.iter().map(|l| l["learning/loss"].as_f64().unwrap()).collect()
}

/// The unpipelined run of the same model and batches on 4 devices of this process.
fn unpipelined(extra: &[&str]) -> Vec<f64> {
    let mut a = args(extra);
    a.push("cpu_device_count=4".to_string());
    let c = config::load(None, &a).expect("config loads");
    train(&c, &cpu_client(4).unwrap()).unwrap().losses
}

fn assert_close(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: {got:?} vs {want:?}");
    for (step, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "{what}, step {step}: {g} vs {w} ({got:?} vs {want:?})");
    }
}

#[test]
fn two_processes_run_their_stages_equal_to_the_unpipelined_step() {
    let want = unpipelined(&[]);
    let two_stages = launched(&["pipeline_schedule=gpipe"]);
    assert_close("2 stages on 2 processes, gpipe", &two_stages, &want);
    let four_stages = launched(&["pipeline_schedule=1f1b", "ici_pipeline_parallelism=2"]);
    assert_close("4 stages on 2 processes, 1f1b", &four_stages, &want);
    println!("losses {want:?}: equal across processes (gpipe, 2 stages; 1f1b, 4 stages)");
}

/// Each process saves its stages' blocks of the state in the unpipelined layout (one job
/// checkpoint, at steps 0, 2, 4 and the last, 5, as MaxText's period gives them): the two
/// processes resume from the step-2 checkpoint with the uninterrupted run's later losses (steps
/// 3 to 5), bit for bit, and so does the unpipelined step on 4 devices of one process (to the
/// 1e-5 between the two steps).
#[test]
fn the_processes_checkpoint_their_stages_and_resume_pipelined_or_not() {
    let dir = tempfile::tempdir().unwrap();
    let keys =
        ["run_name=job", "steps=6", "enable_checkpointing=true", "checkpoint_period=2", "pipeline_schedule=1f1b"];
    let checkpoints = dir.path().join("job/checkpoints");
    let after_step_2 = || {
        for step in ["4", "5"] {
            std::fs::remove_dir_all(checkpoints.join(step)).expect("the run saved steps 4 and 5");
        }
    };
    let whole = launched_in(dir.path(), "whole.jsonl", &keys);
    assert_eq!(whole.len(), 6);
    after_step_2();
    let resumed = launched_in(dir.path(), "resumed.jsonl", &keys);
    assert_eq!(resumed, whole[3..], "resumed from step 2 on the two processes");
    after_step_2();
    let out = format!("base_output_directory={}", dir.path().display());
    let plain = unpipelined(&[&keys[..4], &[out.as_str()]].concat());
    assert_close("the unpipelined step resumed from step 2", &plain, &whole[3..]);
}

/// Rank 1 is killed once both ranks train: rank 0, waiting for its activations or gradients,
/// stops within the cluster's deadline with an error that names the dead process.
#[test]
fn a_killed_stage_process_stops_the_other_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let port = maxrs::cluster::launch::free_port().unwrap();
    let mut a = args(&["steps=100000", "heartbeat_timeout_seconds=5", "cpu_device_count=2"]);
    a.push("dcn_pipeline_parallelism=2".to_string());
    a.push(format!("base_output_directory={}", dir.path().display()));
    let out = |rank: usize| dir.path().join(format!("rank{rank}.out"));
    let mut ranks: Vec<_> = (0..2)
        .map(|rank| {
            let file = std::fs::File::create(out(rank)).unwrap();
            Command::new(MAXRS)
                .arg("train")
                .args(&a)
                .env("JAX_COORDINATOR_ADDRESS", format!("127.0.0.1:{port}"))
                .env("NNODES", "2")
                .env("NODE_RANK", rank.to_string())
                .env("RUST_LOG", "warn")
                .stdin(Stdio::null())
                .stdout(file.try_clone().unwrap())
                .stderr(file)
                .spawn()
                .unwrap()
        })
        .collect();
    let read = |rank: usize| std::fs::read_to_string(out(rank)).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !read(0).contains("completed step: 2") {
        assert!(Instant::now() < deadline, "rank 0 trained no steps:\n{}\n{}", read(0), read(1));
        std::thread::sleep(Duration::from_millis(20));
    }
    ranks[1].kill().unwrap();
    let killed = Instant::now();
    let status = loop {
        if let Some(status) = ranks[0].try_wait().unwrap() {
            break status;
        }
        if killed.elapsed() > Duration::from_secs(30) {
            let _ = ranks[0].kill();
            panic!("rank 0 still runs 30 s after rank 1 was killed:\n{}", read(0));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = ranks[1].wait();
    let text = read(0);
    assert!(!status.success(), "{text}");
    assert!(text.contains("process 1 (host"), "{text}");
    let error = text.lines().find(|l| l.starts_with("error")).unwrap_or_default();
    println!("rank 0 stopped {:.1} s after rank 1 was killed: {error}", killed.elapsed().as_secs_f64());
}

#[test]
fn the_cuda_plugins_have_the_cross_host_transfers_the_cpu_plugin_lacks() {
    for name in ["cuda12", "cuda13"] {
        let (_, plugin) = match load_plugin(Some(name)) {
            Ok(p) => p,
            Err(e) => return crate::common::provision::skip_offline(&format!("loading the {name} plugin: {e:#}")),
        };
        cross_host::describe(&plugin).unwrap_or_else(|why| panic!("{name}: {why}"));
    }
    let cpu = cpu_client(1).unwrap();
    let why = cross_host::describe(cpu.plugin()).unwrap_err();
    assert!(why.contains("has no cross-host transfers extension"), "{why}");
}
