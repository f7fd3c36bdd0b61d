//! Checkpoints through whole training runs on the CPU plugin: a resumed run continues the
//! uninterrupted run's losses exactly (f32, same mesh) and within f32 rounding on another mesh
//! or device count; a corrupt, truncated or incomplete newest checkpoint is refused with the
//! reason and the run falls back to the previous one; a checkpoint of another model is refused
//! naming the key; retention keeps the newest N; `load_parameters_path` and
//! `load_full_state_path` accept checkpoint directories.

use std::path::Path;

use maxrs::checkpoint::{dir, manifest};
use maxrs::config;
use maxrs::files::Location;
use maxrs::pjrt::cpu_client;
use maxrs::train::run::{train, RunReport};

/// The small float32 model, whose schedule spans 8 steps however many it runs, then `extra`.
pub fn small(extra: &[&str]) -> Vec<String> {
    crate::common::small_model(&[&["learning_rate_schedule_steps=8", "log_period=4"], extra].concat())
}

fn run(devices: usize, overrides: &[String]) -> anyhow::Result<RunReport> {
    let mut args = small(&[]);
    args.extend(overrides.iter().cloned());
    let c = config::load(None, &args)?;
    train(&c, &cpu_client(devices)?)
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn ckpt_args(base: &Path, run_name: &str, extra: &[&str]) -> Vec<String> {
    let mut a = args(&["enable_checkpointing=true", &format!("run_name={run_name}")]);
    a.push(format!("base_output_directory={}", base.display()));
    a.extend(args(extra));
    a
}

fn steps_on_disk(base: &Path, run_name: &str) -> Vec<u64> {
    let mut steps: Vec<u64> = std::fs::read_dir(base.join(run_name).join("checkpoints"))
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().to_str().and_then(|n| n.parse().ok()))
        .collect();
    steps.sort_unstable();
    steps
}

/// Also retention and `load_parameters_path` (formerly their own test, which trained the same
/// model on its own): the uninterrupted run keeps its newest 2 checkpoints, and the parameters of
/// its last one load into a bf16 run.
#[test]
fn resume_is_exact_and_bad_checkpoints_fall_back() {
    let base = tempfile::tempdir().unwrap();
    let a = ["per_device_batch_size=8", "checkpoint_period=2"];
    // The uninterrupted run checkpoints too (which changes no loss): every step, keeping 2.
    let keep = ["per_device_batch_size=8", "checkpoint_period=1", "max_num_checkpoints_to_keep=2", "steps=8"];
    let whole = run(1, &ckpt_args(base.path(), "keep", &keep)).unwrap();
    assert_eq!(steps_on_disk(base.path(), "keep"), [6, 7]);
    // The parameters of step 7's checkpoint (the optimizer state starts fresh), converted to
    // bfloat16 weights: the first loss is that of the trained model.
    let dir = base.path().join("keep/checkpoints/7");
    let from_dir = run(
        1,
        &args(&[
            "per_device_batch_size=8",
            "steps=1",
            "weight_dtype=bfloat16",
            &format!("load_parameters_path={}", dir.display()),
        ]),
    )
    .unwrap();
    assert!(
        from_dir.losses[0] < whole.losses[0] - 0.05,
        "trained parameters: {} vs {}",
        from_dir.losses[0],
        whole.losses[0]
    );
    // The "interrupted" run: 5 of the 8 steps (checkpoints after steps 0, 2, 4), written by the
    // background writer.
    let first = run(1, &ckpt_args(base.path(), "r", &[&a[..], &["steps=5"]].concat())).unwrap();
    assert_eq!(steps_on_disk(base.path(), "r"), [0, 2, 4]);
    assert_eq!(first.checkpoints.len(), 3);
    // The same command with the full step count resumes after step 4.
    let second = run(1, &ckpt_args(base.path(), "r", &[&a[..], &["steps=8"]].concat())).unwrap();
    assert_eq!(second.first_step, 5);
    let joined: Vec<f64> = first.losses.iter().chain(&second.losses).copied().collect();
    assert_eq!(joined, whole.losses, "the resumed run's losses equal the uninterrupted run's");
    let lrs: Vec<f64> = first.learning_rates.iter().chain(&second.learning_rates).copied().collect();
    assert_eq!(lrs, whole.learning_rates, "the schedule continues");
    assert_eq!(steps_on_disk(base.path(), "r"), [0, 2, 4, 6, 7], "step 7 is saved on completion");

    // 7: one flipped byte in the optimizer state; 6: params truncated; 4: a file missing.
    let ckpts = base.path().join("r/checkpoints");
    let flip = ckpts.join("7/opt_state.safetensors");
    let mut bytes = std::fs::read(&flip).unwrap();
    let at = bytes.len() - 100;
    bytes[at] ^= 0x40;
    std::fs::write(&flip, bytes).unwrap();
    let cut = ckpts.join("6/params.safetensors");
    let bytes = std::fs::read(&cut).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    std::fs::remove_file(ckpts.join("4/opt_state.safetensors")).unwrap();
    // And an interrupted save's staging directory, which is never taken as a checkpoint.
    std::fs::create_dir_all(ckpts.join("8.maxrs-tmp")).unwrap();
    std::fs::write(ckpts.join("8.maxrs-tmp/params.safetensors"), b"partial").unwrap();

    let c = config::load(None, &small(&["per_device_batch_size=8"])).unwrap();
    let reason = |c: &config::Config, step: &str| {
        dir::load(
            &Location::Local(ckpts.join(step)),
            &state_expected(c),
            &manifest::model_keys(c, &maxrs::model::Model::from_config(c).unwrap()),
            false,
        )
        .err()
        .map(|e| format!("{e:#}"))
    };
    let r = reason(&c, "7").unwrap();
    assert!(r.contains("7/opt_state.safetensors") && r.contains("corrupt"), "{r}");
    let r = reason(&c, "6").unwrap();
    assert!(r.contains("6/params.safetensors") && r.contains("truncated"), "{r}");
    let r = reason(&c, "4").unwrap();
    assert!(r.contains("opt_state.safetensors") && r.contains("missing"), "{r}");
    assert!(reason(&c, "2").is_none());
    // Another model is refused naming the key and both values.
    let mut other = c.clone();
    other.base_mlp_dim = 96;
    let r = reason(&other, "2").unwrap();
    assert!(r.contains("base_mlp_dim: checkpoint 128, this run 96") && r.contains("wrong shape"), "{r}");

    // The rerun falls back to step 2, continues the uninterrupted losses, and its saves replace
    // the refused checkpoints.
    let resumed =
        run(1, &ckpt_args(base.path(), "r", &[&a[..], &["steps=8", "async_checkpointing=false"]].concat())).unwrap();
    assert_eq!(resumed.first_step, 3);
    assert_eq!(resumed.losses, whole.losses[3..]);
    assert!(!ckpts.join("8.maxrs-tmp").exists(), "the staging directory is cleaned up");
    assert!(reason(&c, "7").is_none() && reason(&c, "4").is_none());
}

#[test]
fn restore_onto_another_mesh_and_device_count() {
    let base = tempfile::tempdir().unwrap();
    let fsdp8 = ["per_device_batch_size=1", "ici_fsdp_parallelism=8"];
    let whole = run(8, &args(&[&fsdp8[..], &["steps=6"]].concat())).unwrap();
    let first =
        run(8, &ckpt_args(base.path(), "mesh", &[&fsdp8[..], &["steps=3", "checkpoint_period=2"]].concat())).unwrap();
    assert_eq!(steps_on_disk(base.path(), "mesh"), [0, 2]);
    let close = |what: &str, got: &[f64], want: &[f64]| {
        println!("{what}: max relative loss difference {:e}", crate::common::max_rel_diff(got, want));
        assert!(crate::common::max_rel_diff(got, want) < 1e-5, "{what}: {got:?} vs {want:?}");
    };
    // fsdp=8 -> data 2 x fsdp 2 x tensor 2, resumed from the run's own newest checkpoint.
    let mixed =
        ["per_device_batch_size=1", "ici_data_parallelism=2", "ici_fsdp_parallelism=2", "ici_tensor_parallelism=2"];
    let second =
        run(8, &ckpt_args(base.path(), "mesh", &[&mixed[..], &["steps=6", "checkpoint_period=2"]].concat())).unwrap();
    assert_eq!(second.first_step, 3);
    close("fsdp=8 -> data 2 x fsdp 2 x tensor 2", &second.losses, &whole.losses[3..]);
    // 8 devices -> 1, through load_full_state_path (the step and optimizer state come along).
    let ckpt = base.path().join("mesh/checkpoints/2");
    let one =
        run(1, &args(&["per_device_batch_size=8", "steps=6", &format!("load_full_state_path={}", ckpt.display())]))
            .unwrap();
    assert_eq!(one.first_step, 3);
    close("8 devices -> 1", &one.losses, &whole.losses[3..]);
    assert_eq!(&first.losses[..], &whole.losses[..3]);
}

pub(crate) fn state_expected(c: &config::Config) -> Vec<dir::Expected> {
    let derived = config::validate(c, 1, 1).unwrap();
    let step = maxrs::train::step::TrainStep::new(c, &derived, None).unwrap();
    dir::Expected::of_state(&step.state())
}
