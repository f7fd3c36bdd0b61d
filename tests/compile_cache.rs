//! The persistent compilation cache (`jax_cache_dir`) and MaxText's `M_<KEY>` environment
//! overrides, through the `maxrs` binary.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::SystemTime;

use crate::common::cli::{command, maxrs, refused, refused_by};

/// The entries of a cache directory and when each was last written.
fn entries(dir: &Path) -> BTreeMap<String, SystemTime> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| (e.file_name().to_string_lossy().into_owned(), e.metadata().unwrap().modified().unwrap()))
                .collect()
        })
        .unwrap_or_default()
}

/// A 2-step run of the tests' tiniest decoder with its cache in `dir` (the default model took
/// twice the CPU to compile and its steps a second each, nothing this test needs); returns its
/// loss lines and stderr.
fn run(dir: &Path) -> (Vec<String>, String) {
    run_with(dir, &[])
}

/// `run` with `extra` keys (replacing the tiny decoder's own).
fn run_with(dir: &Path, extra: &[&str]) -> (Vec<String>, String) {
    let env = [
        ("M_JAX_CACHE_DIR", dir.to_str().unwrap()),
        ("RUST_LOG", "info,maxrs::pjrt::compile_cache=debug"),
        // Every program is kept, however fast this machine compiles it.
        ("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0"),
    ];
    let args = ["train", "steps=2", "max_target_length=32", "per_device_batch_size=2"];
    let key = |arg: &&str| arg.split('=').next().unwrap().to_string();
    let overridden: Vec<String> = extra.iter().map(key).collect();
    let tiny: Vec<&str> =
        crate::common::TINY_DECODER.iter().copied().filter(|a| !overridden.contains(&key(a))).collect();
    let out = maxrs(&[&args[..], &tiny, extra].concat(), &env);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let losses =
        stdout.lines().filter_map(|l| l.starts_with("completed step").then(|| l.split("loss").nth(1)).flatten());
    (losses.map(str::to_string).collect(), stderr.into_owned())
}

#[test]
fn a_second_run_loads_what_the_first_compiled_and_a_broken_entry_is_compiled_again() {
    let dir = tempfile::tempdir().unwrap();
    let (first, stderr) = run(dir.path());
    let written = entries(dir.path());
    assert!(written.len() >= 2, "the init and train programs are kept:\n{stderr}");
    assert!(!stderr.contains("compilation cache: loaded"), "{stderr}");

    let (second, stderr) = run(dir.path());
    assert_eq!(second, first, "a loaded step trains as the compiled one");
    assert!(stderr.contains("compilation cache: loaded"), "{stderr}");
    assert_eq!(entries(dir.path()), written, "nothing is compiled, so nothing is written");

    for name in written.keys() {
        std::fs::write(dir.path().join(name), b"not an executable").unwrap();
    }
    let (third, stderr) = run(dir.path());
    assert_eq!(third, first);
    assert!(stderr.contains("compilation cache: cannot use"), "a broken entry is a warning:\n{stderr}");
    let (fourth, stderr) = run(dir.path());
    assert_eq!(fourth, first);
    assert!(stderr.contains("compilation cache: loaded") && !stderr.contains("cannot use"), "rewritten:\n{stderr}");
}

/// A pipelined run's stage programs (compiled once, their bytes loaded onto every stage) go
/// through the cache too: a second run compiles nothing.
#[test]
fn a_pipelined_run_loads_its_stage_programs_from_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let pipelined = [
        "cpu_device_count=2",
        "ici_pipeline_parallelism=2",
        "base_num_decoder_layers=2",
        "num_pipeline_microbatches=2",
    ];
    let (first, stderr) = run_with(dir.path(), &pipelined);
    let written = entries(dir.path());
    assert!(written.len() >= 4, "the stages' programs are kept (an unpipelined run has two):\n{stderr}");
    let (second, stderr) = run_with(dir.path(), &pipelined);
    assert_eq!(second, first, "loaded stage programs train as the compiled ones");
    assert!(stderr.contains("compilation cache: loaded"), "{stderr}");
    assert_eq!(entries(dir.path()), written, "nothing is compiled, so nothing is written");
}

#[test]
fn m_environment_variables_set_keys_as_in_maxtext() {
    let out = maxrs(&["train", "--print-config"], &[("M_STEPS", "7")]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().find(|l| l.starts_with("steps ")).unwrap_or_default();
    assert!(line.contains("= 7") && line.contains("(M_STEPS)"), "{stdout}");

    let e = refused(&["train", "steps=3"], &[("M_STEPS", "7")]);
    assert!(e.contains("steps: given both on the command line and in environment variable M_STEPS"), "{e}");
    let e = refused(&["train", "model_name=llama2-7b"], &[("M_BASE_EMB_DIM", "64")]);
    assert!(e.contains("M_BASE_EMB_DIM") && e.contains("override_model_config=true"), "{e}");
    let e = refused(&["train"], &[("M_LOGICAL_AXIS_RULES", "[]")]);
    assert!(e.contains("only keys with a bool, number or string value"), "{e}");
    let e = refused(&["train"], &[("M_STEPS", "abc")]);
    assert!(e.contains("`steps` in environment variable M_STEPS expects an integer, got `abc`"), "{e}");
    let mut cmd = command(&["train", "jax_cache_dir=gs://b/c"], &[]);
    cmd.env_remove("M_JAX_CACHE_DIR");
    let e = refused_by(cmd);
    assert!(e.contains("jax_cache_dir=\"gs://b/c\": a remote compilation cache is not supported yet"), "{e}");
}
