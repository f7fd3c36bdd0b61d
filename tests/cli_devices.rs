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

/// A plugin that pip installed is found on the `sys.path` of the interpreter `MAXRS_PYTHON`
/// names (here a script that prints a made-up site-packages holding the CPU plugin under its
/// wheel's member name, with a `.dist-info` giving its version), before the cache; with
/// `MAXRS_PYTHON` empty no interpreter is asked and the cached plugin serves.
#[test]
fn an_installed_plugin_is_found_through_maxrs_python_and_an_empty_one_asks_none() {
    let run = |python: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_maxrs"))
            .args(["devices"])
            .env_remove("MAXRS_PJRT_PLUGIN")
            .env("MAXRS_PYTHON", python)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        stdout
    };
    let cached = run("");
    assert!(cached.contains("from the maxrs cache"), "{cached}");
    let plugin = cached.lines().next().unwrap().split_whitespace().nth(1).unwrap().to_string();

    let dir = tempfile::tempdir().unwrap();
    let site = dir.path().join("site-packages");
    std::fs::create_dir_all(site.join("lammps_jax_pjrt_cpu")).unwrap();
    std::fs::create_dir_all(site.join("lammps_jax_pjrt_cpu-9.8.7.dist-info")).unwrap();
    std::os::unix::fs::symlink(&plugin, site.join("lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so")).unwrap();
    let python = dir.path().join("python");
    let asked = dir.path().join("asked");
    let script = format!("#!/bin/sh\ntouch '{}'\necho '[\"{}\"]'\n", asked.display(), site.display());
    std::fs::write(&python, script).unwrap();
    std::fs::set_permissions(&python, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();

    let installed = run(python.to_str().unwrap());
    let first = installed.lines().next().unwrap();
    assert!(first.contains(&site.join("lammps_jax_pjrt_cpu").display().to_string()), "{installed}");
    assert!(first.contains("lammps-jax-pjrt-cpu 9.8.7, from an installed Python package"), "{installed}");
    assert!(asked.exists());
    std::fs::remove_file(&asked).unwrap();
    run("");
    assert!(!asked.exists(), "MAXRS_PYTHON empty started no interpreter");
}
