//! Checkpoints of pipelined runs (`ici_pipeline_parallelism=2` on 8 CPU devices, `quantization=fp8`):
//! the state, fp8 scaling state included, is saved in the unpipelined step's layout and names, so
//! - a pipelined run resumed from the step-2 checkpoint of a pipelined run gives that run's
//!   later losses, bit for bit;
//! - a pipelined checkpoint resumes an unpipelined run, and an unpipelined one a pipelined run,
//!   with the uninterrupted pipelined losses (within the 1e-5 that tests/pipeline.rs allows
//!   between the two steps, in f32);
//! - the pipeline `maxrs train-compile` saves for `cpu-8` (every stage's executables and the
//!   schedule in one file) trains the resumed pipelined runs without a compile, like a fresh
//!   compile, and a run with another schedule is refused.

use std::path::Path;

use maxrs::config;
use maxrs::pjrt::cpu_client;
use maxrs::train::run::{train, RunReport};

/// The tiny f32 decoder of tests/pipeline.rs with `quantization=fp8` (its `steps` overridden), 4
/// layers; `pipelined` picks 2 stages of 2 layers (data 2 x fsdp 2 inside each) or one SPMD step
/// over fsdp 8; `extra` keys last.
fn config(dir: &Path, run_name: &str, steps: u64, pipelined: bool, extra: &[&str]) -> config::Config {
    let mut args: Vec<String> = crate::common::PIPELINE_TINY
        .iter()
        .chain(&[
            // The schedule of the 8-step run in every run, stopped early or not.
            "learning_rate_schedule_steps=8",
            "quantization=fp8",
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
    config::load(None, &args).expect("config loads")
}

fn run(dir: &Path, run_name: &str, steps: u64, pipelined: bool, extra: &[&str]) -> RunReport {
    train(&config(dir, run_name, steps, pipelined, extra), &cpu_client(8).unwrap()).expect("the run trains")
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

/// Four runs where three resumes need them, and the pipeline compiled ahead of time
/// (`maxrs train-compile` for `cpu-8`) that the resumed pipelined runs load instead of compiling
/// (each pipelined compile of the stages is most of a run's time): the uninterrupted pipelined
/// run (a fresh compile) saves step 2 on the way (period 2); a pipelined run resumed from it with
/// the saved executables gives the later losses bit for bit, so the parameters, optimizer state
/// and fp8 scales and histories came back and the saved pipeline trains like a fresh compile; an
/// unpipelined run resumes from that checkpoint; and a pipelined run resumes from the unpipelined
/// one's checkpoint saved on completion. A run with another schedule than the saved one's is
/// refused.
///
/// One test for what were three: this one without fp8, `pipelined_fp8_checkpoints_carry_the_scaling_state`
/// (the fp8 state is saved and restored beside the parameters by the same code, so the fp8 runs
/// check both) and tests/pipeline.rs's `a_saved_pipeline_trains_and_a_different_schedule_is_refused`
/// (its file, memory report and refusal are checked here, its fresh-compile comparison is the
/// resumed run's).
#[test]
fn pipelined_fp8_checkpoints_resume_pipelined_and_unpipelined_runs_from_a_saved_pipeline() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let file = dir.join("pipeline.aot");
    let saved = format!("compiled_trainstep_file={}", file.display());
    let compile = ["compile_topology=cpu-8", "compile_topology_num_slices=1", &saved];
    let summary = maxrs::aot::train_compile::train_compile(&config(dir, "compile", 8, true, &compile))
        .expect("compiles for cpu-8");
    match &summary.memory {
        maxrs::aot::train_compile::CompiledMemory::Pipeline(memory) => {
            assert_eq!(memory.stages.len(), 2);
            // 1f1b keeps at most 2 microbatches in flight on stage 0, 1 on stage 1.
            assert_eq!(memory.stages.iter().map(|s| s.in_flight).collect::<Vec<_>>(), [2, 1]);
            assert!(memory.stages.iter().all(|s| s.state_bytes > 0 && s.residual_bytes > 0), "{memory}");
        }
        other => panic!("expected a pipeline's memory, got {other:?}"),
    }
    let header = maxrs::runtime::artifact::read_header(&file).expect("the file's header");
    let section = header.pipeline.expect("the header has the pipeline");
    assert!(section.schedule.starts_with("1f1b"), "{}", section.schedule);
    assert_eq!(section.tasks.len(), 2, "each stage's tasks");
    assert_eq!(section.tasks[0].first().map(String::as_str), Some("F0.0"), "{:?}", section.tasks);

    let whole = run(dir, "whole", 8, true, &["checkpoint_period=2"]);
    assert_eq!(whole.losses.len(), 8);
    assert!(whole.pipeline.as_ref().is_some_and(|p| p.bubbles.len() == 8), "a pipelined run reports its bubbles");
    assert!(whole.checkpoints.iter().any(|s| s.step == Some(2)), "saved after step 2: {:?}", whole.checkpoints);

    copy_checkpoint(dir, "whole", 2, "resumed");
    let resumed = run(dir, "resumed", 8, true, &[&saved]);
    assert_eq!(resumed.first_step, 3);
    assert_eq!(
        resumed.losses,
        whole.losses[3..],
        "a pipelined fp8 run resumed with the saved executables gives the uninterrupted losses"
    );

    copy_checkpoint(dir, "whole", 2, "flat");
    let flat = run(dir, "flat", 6, false, &[]);
    assert_eq!(flat.first_step, 3);
    assert_close("an unpipelined fp8 run resumed from a pipelined checkpoint", &flat.losses, &whole.losses[3..6], 1e-5);
    assert_eq!(flat.checkpoints.last().and_then(|s| s.step), Some(5), "saved on completion");

    copy_checkpoint(dir, "flat", 5, "back");
    let back = run(dir, "back", 8, true, &[&saved]);
    assert_eq!(back.first_step, 6);
    assert_close("a pipelined fp8 run resumed from an unpipelined checkpoint", &back.losses, &whole.losses[6..], 1e-5);

    let other = config(dir, "other", 8, true, &[&saved, "pipeline_schedule=gpipe"]);
    let err = train(&other, &cpu_client(8).unwrap()).expect_err("another schedule").to_string();
    assert!(err.contains("pipeline schedule: compiled with 1f1b") && err.contains("this run has gpipe"), "{err}");
}
