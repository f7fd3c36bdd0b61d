//! Checkpoints against real process deaths and failing disks, with the `maxrs` binary:
//! - SIGKILL in the middle of an asynchronous checkpoint write, then the same command again:
//!   the half-written checkpoint is ignored and removed, the run resumes from the previous one,
//!   and the loss of every step equals the uninterrupted run's;
//! - SIGTERM with `enable_autocheckpoint`: a checkpoint of the current step, exit 0; SIGINT: a
//!   clean stop with exit code 130;
//! - a full disk and a read-only one during saves (a tmpfs in a private mount namespace):
//!   the save fails loudly, earlier checkpoints stay intact, training stops or continues as
//!   `on_checkpoint_error` says.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use maxrs::checkpoint::dir::{self, SLOW_WRITE_ENV};
use maxrs::files::Location;

const MAXRS: &str = env!("CARGO_BIN_EXE_maxrs");

/// The small float32 model, with no outputs but the metrics file.
fn small(extra: &[String]) -> Vec<String> {
    let mut a = crate::common::small_model(&[
        "per_device_batch_size=8",
        "enable_tensorboard=false",
        "gcs_metrics=false",
        "save_config_to_gcs=false",
    ]);
    a.extend(extra.iter().cloned());
    a
}

fn maxrs(args: &[String]) -> Command {
    let mut command = Command::new(MAXRS);
    command.arg("train").args(args).env("RUST_LOG", "warn");
    command
}

fn spawn(args: &[String], dir: &Path, name: &str, env: &[(&str, &str)]) -> Child {
    let out = std::fs::File::create(dir.join(format!("{name}.out"))).unwrap();
    let err = std::fs::File::create(dir.join(format!("{name}.err"))).unwrap();
    let mut command = maxrs(args);
    command.envs(env.iter().copied()).stdout(out).stderr(err).stdin(Stdio::null());
    command.spawn().expect("maxrs starts")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The loss of each step in a metrics file, the last line of a step winning (a resumed run
/// appends the steps after its checkpoint again).
fn losses(metrics: &Path) -> BTreeMap<u64, f64> {
    read(metrics)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (v["step"].as_f64().unwrap() as u64, v["learning/loss"].as_f64().unwrap())
        })
        .collect()
}

fn wait_for(what: &str, child: &mut Child, timeout: Duration, done: impl Fn() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("maxrs exited ({status}) before {what}");
        }
        assert!(Instant::now() < deadline, "{what} did not happen within {timeout:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(child: &Child, name: &str) {
    let status = Command::new("kill").args([&format!("-{name}"), &child.id().to_string()]).status().unwrap();
    assert!(status.success());
}

#[test]
fn sigkill_during_an_async_write_then_rerun_gives_the_uninterrupted_losses() {
    let d = tempfile::tempdir().unwrap();
    let steps = ["steps=12".to_string()];
    let whole =
        maxrs(&small(&[&steps[..], &[format!("metrics_file={}", d.path().join("whole.jsonl").display())]].concat()))
            .output()
            .unwrap();
    assert!(whole.status.success(), "{}", String::from_utf8_lossy(&whole.stderr));

    let args = small(
        &[
            &steps[..],
            &[
                format!("base_output_directory={}", d.path().join("out").display()),
                "run_name=r".into(),
                "enable_checkpointing=true".into(),
                "checkpoint_period=4".into(),
                format!("metrics_file={}", d.path().join("run.jsonl").display()),
            ],
        ]
        .concat(),
    );
    let ckpts = d.path().join("out/r/checkpoints");
    // Each checkpoint file takes 1.5 s more to write, so the kill lands inside the write of
    // step 4 (after its first file), while the checkpoint of step 0 is complete.
    let mut child = spawn(&args, d.path(), "killed", &[(SLOW_WRITE_ENV, "1500")]);
    let staging = ckpts.join("4.maxrs-tmp/opt_state.safetensors");
    wait_for("the write of step 4's checkpoint", &mut child, Duration::from_secs(300), || staging.exists());
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(ckpts.join("0/manifest.json").exists() && !ckpts.join("4").exists());

    let rerun = maxrs(&args).output().unwrap();
    let stdout = String::from_utf8_lossy(&rerun.stdout);
    assert!(rerun.status.success(), "{stdout}{}", String::from_utf8_lossy(&rerun.stderr));
    assert!(stdout.contains("removing the incomplete checkpoint"), "{stdout}");
    assert!(stdout.contains("resuming from the checkpoint of step 0"), "{stdout}");
    assert!(!ckpts.join("4.maxrs-tmp").exists());
    let want = losses(&d.path().join("whole.jsonl"));
    assert_eq!(want.len(), 12);
    assert_eq!(losses(&d.path().join("run.jsonl")), want, "the killed-and-resumed run's losses");
}

#[test]
fn sigterm_saves_the_current_step_and_sigint_stops_cleanly() {
    let d = tempfile::tempdir().unwrap();
    for (signal_name, autocheckpoint) in [("TERM", true), ("INT", false)] {
        let metrics = d.path().join(format!("{signal_name}.jsonl"));
        let args = small(&[
            "steps=100000".into(),
            format!("base_output_directory={}", d.path().join("out").display()),
            format!("run_name={signal_name}"),
            "enable_checkpointing=true".into(),
            "checkpoint_period=100000".into(),
            format!("enable_autocheckpoint={autocheckpoint}"),
            format!("metrics_file={}", metrics.display()),
        ]);
        let mut child = spawn(&args, d.path(), signal_name, &[]);
        wait_for("three steps", &mut child, Duration::from_secs(300), || read(&metrics).lines().count() >= 3);
        signal(&child, signal_name);
        let status = child.wait().unwrap();
        let stdout = read(&d.path().join(format!("{signal_name}.out")));
        let last = *losses(&metrics).keys().last().unwrap();
        assert!(stdout.contains(&format!("SIG{signal_name}: stopping after step {last}")), "{stdout}");
        let ckpts = d.path().join("out").join(signal_name).join("checkpoints");
        if autocheckpoint {
            assert!(status.success(), "{status}");
            assert!(ckpts.join(last.to_string()).join("manifest.json").exists(), "a checkpoint of step {last}");
        } else {
            assert_eq!(status.code(), Some(130));
            assert!(!ckpts.join(last.to_string()).exists() || last == 0);
        }
    }
}

/// The variable that lets the disk-fault tests pass on a machine without user namespaces (as
/// `MAXRS_TESTS_OFFLINE` does for the tests that need the network): unset, such a machine fails
/// them, so a test that could not run is never counted as passed.
const NO_NAMESPACES_ENV: &str = "MAXRS_TESTS_NO_NAMESPACES";

/// Runs `script` (sh) as root of a private user and mount namespace, where it can mount a
/// tmpfs. `None` (the test returns) when this machine does not allow such namespaces and
/// `MAXRS_TESTS_NO_NAMESPACES` is set; without it the test fails.
fn in_private_mounts(script: &str, args: &[&str]) -> Option<Output> {
    let probe = Command::new("unshare").args(["-rm", "true"]).output();
    if !probe.map(|o| o.status.success()).unwrap_or(false) {
        let missing = "`unshare -rm` (user and mount namespaces, to mount a full and a read-only tmpfs) is not \
                       available here";
        let opted_out = std::env::var(NO_NAMESPACES_ENV).is_ok_and(|v| !v.trim().is_empty() && v.trim() != "0");
        assert!(opted_out, "{missing}; set {NO_NAMESPACES_ENV}=1 to skip the tests that need it");
        println!("skipped ({NO_NAMESPACES_ENV}): {missing}");
        return None;
    }
    Some(Command::new("unshare").args(["-rm", "sh", "-c", script, "sh"]).args(args).output().unwrap())
}

#[test]
fn full_and_read_only_disks_fail_the_save_and_keep_earlier_checkpoints() {
    let d = tempfile::tempdir().unwrap();
    let (mnt, out): (PathBuf, PathBuf) = (d.path().join("mnt"), d.path().join("out"));
    std::fs::create_dir_all(&mnt).unwrap();
    std::fs::create_dir_all(&out).unwrap();
    let common = small(&[
        "steps=3".into(),
        format!("base_output_directory={}", mnt.display()),
        "run_name=r".into(),
        "enable_checkpointing=true".into(),
        "checkpoint_period=1".into(),
        "async_checkpointing=true".into(),
    ])
    .join(" ");
    // One checkpoint of this model is about 1.1 MB: the 1600 KiB disk holds one, not two.
    // Then the disk is made read-only and a run that continues on errors resumes from it.
    let script = format!(
        "set -u; mount -t tmpfs -o size=1600k tmpfs \"$1\" || exit 90
         {MAXRS} train {common} on_checkpoint_error=stop > \"$2/full.out\" 2> \"$2/full.err\"; echo $? > \"$2/full.status\"
         mount -o remount,ro \"$1\" || exit 91
         {MAXRS} train {common} on_checkpoint_error=continue > \"$2/ro.out\" 2> \"$2/ro.err\"; echo $? > \"$2/ro.status\"
         cp -r \"$1/r\" \"$2/r\""
    );
    let Some(result) = in_private_mounts(&script, &[mnt.to_str().unwrap(), out.to_str().unwrap()]) else { return };
    assert!(result.status.success(), "{}", String::from_utf8_lossy(&result.stderr));

    let full_err = read(&out.join("full.err"));
    assert_ne!(read(&out.join("full.status")).trim(), "0", "the full disk stops the run");
    assert!(
        full_err.contains("saving the checkpoint of step 1") && full_err.contains("No space left on device"),
        "{full_err}"
    );
    assert!(full_err.contains("on_checkpoint_error=stop"), "{full_err}");

    assert_eq!(read(&out.join("ro.status")).trim(), "0", "{}", read(&out.join("ro.err")));
    let ro = read(&out.join("ro.out")) + &read(&out.join("ro.err"));
    assert!(ro.contains("resuming from the checkpoint of step 0"), "{ro}");
    assert!(ro.contains("Read-only file system") && ro.contains("training continues"), "{ro}");

    // Only the checkpoint of step 0 is there, complete and restorable.
    let ckpts: Vec<String> = std::fs::read_dir(out.join("r/checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(ckpts, ["0"]);
    let manifest = dir::read_manifest(&Location::Local(out.join("r/checkpoints/0"))).unwrap();
    assert_eq!(manifest.step, Some(0));
    for file in &manifest.files {
        let bytes = std::fs::read(out.join("r/checkpoints/0").join(&file.name)).unwrap();
        assert_eq!(bytes.len() as u64, file.bytes);
        assert_eq!(format!("{:08x}", crc32c::crc32c(&bytes)), file.crc32c);
    }
}
