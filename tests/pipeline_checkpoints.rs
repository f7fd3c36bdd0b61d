//! Checkpoints of pipelined runs (`ici_pipeline_parallelism=2` on 8 CPU devices): the state is
//! saved in the unpipelined step's layout and names, so
//! - a pipelined run stopped after step 2 and resumed gives the uninterrupted run's losses, bit
//!   for bit;
//! - a pipelined checkpoint resumes an unpipelined run, and an unpipelined one a pipelined run,
//!   with the uninterrupted pipelined losses (within the 1e-5 that tests/pipeline.rs allows
//!   between the two steps, in f32).

use std::path::Path;

use maxrs::config;
use maxrs::pjrt::cpu_client;
use maxrs::train::run::{train, RunReport};

/// The tiny f32 decoder of tests/pipeline.rs (its `steps` overridden), 4 layers; `pipelined` picks 2 stages of 2 layers
/// (data 2 x fsdp 2 inside each) or one SPMD step over fsdp 8; `extra` keys last.
fn run(dir: &Path, run_name: &str, steps: u64, pipelined: bool, extra: &[&str]) -> RunReport {
    let mut args: Vec<String> = crate::common::PIPELINE_TINY
        .iter()
        .chain(&[
            // The schedule of the 6-step run in every run, stopped early or not.
            "learning_rate_schedule_steps=6",
            "base_num_decoder_layers=4",
            "per_device_batch_size=2",
            "enable_checkpointing=true",
            "enable_tensorboard=false",
            "gcs_metrics=false",
            "save_config_to_gcs=false",
        ])
        .map(|s| s.to_string())
        .collect();
    args.extend([
        format!("base_output_directory={}", dir.display()),
        format!("run_name={run_name}"),
        format!("steps={steps}"),
    ]);
    if pipelined {
        args.extend(
            [
                "ici_pipeline_parallelism=2",
                "ici_data_parallelism=2",
                "ici_fsdp_parallelism=2",
                "num_layers_per_pipeline_stage=2",
                "num_pipeline_microbatches=4",
                "pipeline_schedule=1f1b",
            ]
            .map(String::from),
        );
    } else {
        args.push("ici_fsdp_parallelism=8".into());
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let c = config::load(None, &args).expect("config loads");
    train(&c, &cpu_client(8).unwrap()).expect("the run trains")
}

/// Copies run `from`'s checkpoints to run `to`'s, so that `to` resumes from them.
fn copy_checkpoints(dir: &Path, from: &str, to: &str) {
    let (src, dst) = (dir.join(from).join("checkpoints"), dir.join(to).join("checkpoints"));
    for entry in walk(&src) {
        let target = dst.join(entry.strip_prefix(&src).unwrap());
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::copy(&entry, &target).unwrap();
    }
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .flat_map(|e| {
            let path = e.unwrap().path();
            if path.is_dir() {
                walk(&path)
            } else {
                vec![path]
            }
        })
        .collect()
}

fn assert_close(what: &str, got: &[f64], want: &[f64], tolerance: f64) {
    assert_eq!(got.len(), want.len(), "{what}: {got:?} vs {want:?}");
    for (step, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tolerance, "{what}: loss {step} is {g}, the uninterrupted run's {w}");
    }
}

#[test]
fn pipelined_checkpoints_resume_pipelined_and_unpipelined_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let whole = run(dir, "whole", 6, true, &[]);
    assert_eq!(whole.losses.len(), 6);

    let first = run(dir, "cut", 3, true, &[]);
    assert_eq!(first.losses, whole.losses[..3], "the same run up to the cut");
    assert_eq!(first.checkpoints.last().and_then(|s| s.step), Some(2), "saved on completion");
    copy_checkpoints(dir, "cut", "to_flat");
    let resumed = run(dir, "cut", 6, true, &[]);
    assert_eq!(resumed.first_step, 3);
    assert_eq!(resumed.losses, whole.losses[3..], "a resumed pipelined run gives the uninterrupted losses");

    let flat = run(dir, "to_flat", 6, false, &[]);
    assert_eq!(flat.first_step, 3);
    assert_close("an unpipelined run resumed from a pipelined checkpoint", &flat.losses, &whole.losses[3..], 1e-5);

    run(dir, "from_flat", 3, false, &[]);
    copy_checkpoints(dir, "from_flat", "to_pipelined");
    let back = run(dir, "to_pipelined", 6, true, &[]);
    assert_eq!(back.first_step, 3);
    assert_close("a pipelined run resumed from an unpipelined checkpoint", &back.losses, &whole.losses[3..], 1e-5);
}

/// With `quantization=fp8` the fp8 scaling state is part of the checkpoint in the same layout:
/// a pipelined run resumed from its own checkpoint gives the uninterrupted losses bit for bit
/// (the scales and histories came back), and an unpipelined run resumes from it.
#[test]
fn pipelined_fp8_checkpoints_carry_the_scaling_state() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let fp8 = ["quantization=fp8"];
    let whole = run(dir, "whole", 4, true, &fp8);
    let first = run(dir, "cut", 2, true, &fp8);
    assert_eq!(first.losses, whole.losses[..2], "the same run up to the cut");
    copy_checkpoints(dir, "cut", "to_flat");
    let resumed = run(dir, "cut", 4, true, &fp8);
    assert_eq!(resumed.first_step, 2);
    assert_eq!(resumed.losses, whole.losses[2..], "a resumed pipelined fp8 run gives the uninterrupted losses");
    let flat = run(dir, "to_flat", 4, false, &fp8);
    assert_close("an unpipelined fp8 run resumed from a pipelined checkpoint", &flat.losses, &whole.losses[2..], 1e-5);
}
