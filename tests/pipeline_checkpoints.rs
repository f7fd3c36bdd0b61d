//! Checkpoints of pipelined runs (`ici_pipeline_parallelism=2` on 8 CPU devices): the state is
//! saved in the unpipelined step's layout and names, so
//! - a pipelined run resumed from the step-2 checkpoint of a pipelined run gives that run's
//!   later losses, bit for bit;
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
            // The schedule of the 8-step run in every run, stopped early or not.
            "learning_rate_schedule_steps=8",
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

/// Copies run `from`'s checkpoint of step `step` to run `to`, so that `to` resumes from it.
fn copy_checkpoint(dir: &Path, from: &str, step: u64, to: &str) {
    let (src, dst) = (dir.join(from).join("checkpoints"), dir.join(to).join("checkpoints"));
    let src = src.join(step.to_string());
    let dst = dst.join(step.to_string());
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

/// Four runs where three resumes need them (each pipelined run compiles its stages, the most
/// of this test's time): the uninterrupted pipelined run saves step 2 on the way (period 2), a
/// pipelined and an unpipelined run resume from that checkpoint, and a pipelined run resumes
/// from the unpipelined one's checkpoint saved on completion.
#[test]
fn pipelined_checkpoints_resume_pipelined_and_unpipelined_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let whole = run(dir, "whole", 8, true, &["checkpoint_period=2"]);
    assert_eq!(whole.losses.len(), 8);
    assert!(whole.checkpoints.iter().any(|s| s.step == Some(2)), "saved after step 2: {:?}", whole.checkpoints);

    copy_checkpoint(dir, "whole", 2, "resumed");
    let resumed = run(dir, "resumed", 8, true, &[]);
    assert_eq!(resumed.first_step, 3);
    assert_eq!(resumed.losses, whole.losses[3..], "a resumed pipelined run gives the uninterrupted losses");

    copy_checkpoint(dir, "whole", 2, "flat");
    let flat = run(dir, "flat", 6, false, &[]);
    assert_eq!(flat.first_step, 3);
    assert_close("an unpipelined run resumed from a pipelined checkpoint", &flat.losses, &whole.losses[3..6], 1e-5);
    assert_eq!(flat.checkpoints.last().and_then(|s| s.step), Some(5), "saved on completion");

    copy_checkpoint(dir, "flat", 5, "back");
    let back = run(dir, "back", 8, true, &[]);
    assert_eq!(back.first_step, 6);
    assert_close("a pipelined run resumed from an unpipelined checkpoint", &back.losses, &whole.losses[6..], 1e-5);
}

/// With `quantization=fp8` the fp8 scaling state is part of the checkpoint in the same layout:
/// a pipelined run resumed from the step-1 checkpoint of an uninterrupted one gives its later
/// losses bit for bit (the scales and histories came back), and an unpipelined run resumes from
/// it (three runs, not four: the pipelined ones' stage compiles are this test's time).
#[test]
fn pipelined_fp8_checkpoints_carry_the_scaling_state() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let fp8 = ["quantization=fp8"];
    // Saves after every step: the resumes start from its step 1.
    let whole = run(dir, "whole", 4, true, &["quantization=fp8", "checkpoint_period=1"]);
    assert!(whole.checkpoints.iter().any(|s| s.step == Some(1)), "saved after step 1: {:?}", whole.checkpoints);
    copy_checkpoint(dir, "whole", 1, "resumed");
    copy_checkpoint(dir, "whole", 1, "to_flat");
    let resumed = run(dir, "resumed", 4, true, &fp8);
    assert_eq!(resumed.first_step, 2);
    assert_eq!(resumed.losses, whole.losses[2..], "a resumed pipelined fp8 run gives the uninterrupted losses");
    let flat = run(dir, "to_flat", 4, false, &fp8);
    assert_close("an unpipelined fp8 run resumed from a pipelined checkpoint", &flat.losses, &whole.losses[2..], 1e-5);
}
