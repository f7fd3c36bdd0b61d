//! `maxrs devices` as a user runs it.

use std::process::Command;

fn maxrs(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_maxrs")).args(args).output().expect("run maxrs")
}

#[test]
fn lists_eight_cpu_devices() {
    let out = maxrs(&["devices", "cpu_device_count=8"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("platform  cpu"), "{stdout}");
    assert!(stdout.contains("devices   8"), "{stdout}");
    let device_rows = stdout.lines().filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit())).count();
    assert_eq!(device_rows, 8, "{stdout}");
}

#[test]
fn bad_options_name_the_culprit() {
    let out = maxrs(&["devices", "cpu_device_count=zero"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cpu_device_count=zero; it must be an integer in [1, 1024]"), "{stderr}");
    let out = maxrs(&["devices", "--plugin", "rocm"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("valid names are cpu, cuda12, cuda13, tpu"));
}

#[test]
fn unknown_xla_flag_is_refused_before_the_plugin_loads() {
    let out = Command::new(env!("CARGO_BIN_EXE_maxrs"))
        .args(["devices"])
        .env("XLA_FLAGS", "--xla_cpu_enable_fast_math=false --xla_made_up_flag=1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("--xla_made_up_flag") && stderr.starts_with("error:"), "{stderr}");
}
