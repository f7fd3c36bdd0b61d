//! The bad inputs of issue 11 as a user gives them to the `maxrs` binary: each gets one line
//! naming the culprit before any compile, and no existing file loses a byte.

use std::path::Path;
use std::process::Command;

use crate::common::cli::{maxrs, refused};
use maxrs::data::write_tokens_file;

fn tokens_file(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("tokens.bin");
    let rows: Vec<Vec<i32>> = (0..16).map(|r| (0..129).map(|t| (r * 7 + t) % 512).collect()).collect();
    write_tokens_file(&path, &rows).unwrap();
    path
}

#[test]
fn outputs_that_would_destroy_inputs_or_hang_are_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = tokens_file(dir.path());
    let before = std::fs::read(&tokens).unwrap();
    let t = tokens.to_str().unwrap();

    let e = refused(&["train", "dataset_type=tokens", &format!("dataset_path={t}"), &format!("metrics_file={t}")], &[]);
    assert!(e.contains("metrics_file=") && e.contains("dataset_path="), "{e}");
    // The same file under another name (a hard link) is the same file.
    let link = dir.path().join("link.jsonl");
    std::fs::hard_link(&tokens, &link).unwrap();
    let e = refused(
        &["train", "dataset_type=tokens", &format!("dataset_path={t}"), &format!("metrics_file={}", link.display())],
        &[],
    );
    assert!(e.contains("same file"), "{e}");
    let e = refused(&["train", &format!("load_parameters_path={t}"), &format!("metrics_file={t}")], &[]);
    assert!(e.contains("load_parameters_path="), "{e}");
    assert_eq!(std::fs::read(&tokens).unwrap(), before, "not a byte of the input may change");

    let fifo = dir.path().join("fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let e = refused(&["train", &format!("metrics_file={}", fifo.display())], &[]);
    assert!(e.contains("metrics_file=") && e.contains("FIFO"), "{e}");
    let e = refused(&["train", "dataset_type=tokens", &format!("dataset_path={}", fifo.display())], &[]);
    assert!(e.contains("dataset_path=") && e.contains("FIFO"), "{e}");
    let e = refused(&["train", &format!("metrics_file={}", dir.path().display())], &[]);
    assert!(e.contains("a directory"), "{e}");
}

#[test]
fn sizes_that_crashed_get_one_line_naming_the_key() {
    for (arg, key) in [
        ("per_device_batch_size=1e12", "per_device_batch_size"),
        ("per_device_batch_size=1e30", "per_device_batch_size"),
        ("cpu_device_count=100000", "cpu_device_count"),
        ("head_dim=3", "head_dim"),
        ("vocab_size=200000000", "vocab_size"),
        ("adam_eps=inf", "adam_eps"),
    ] {
        let e = refused(&["train", arg], &[]);
        assert!(e.contains(key), "{arg}: {e}");
    }
    let dir = tempfile::tempdir().unwrap();
    let yml = dir.path().join("inf.yml");
    std::fs::write(&yml, "adam_eps: .inf\n").unwrap();
    let e = refused(&["train", yml.to_str().unwrap()], &[]);
    assert!(e.contains("`adam_eps`") && e.contains("finite"), "{e}");
    // A model width that the fsdp axis cannot split names the array and what would divide it.
    let e = refused(
        &["train", "cpu_device_count=8", "ici_fsdp_parallelism=8", "per_device_batch_size=1", "base_emb_dim=100"],
        &[],
    );
    assert!(
        e.contains("\"params.token_embedder.embedding\": dimension 1 of size 100 is not divisible into 8 shards")
            && e.contains("must be a multiple of 8"),
        "{e}"
    );
}

#[test]
fn the_plugin_rule_is_the_same_for_train_and_devices() {
    let missing = "/nonexistent/dir/plugin.so";
    for args in [&["train", "steps=1"][..], &["devices"], &["train-compile", "--topology=cpu-2"]] {
        let e = refused(args, &[("MAXRS_PJRT_PLUGIN", missing)]);
        assert!(e.contains(missing) && e.contains("MAXRS_PJRT_PLUGIN"), "{args:?}: {e}");
        let mut with_flag = args.to_vec();
        with_flag.extend(["--plugin", missing]);
        let e = refused(&with_flag, &[]);
        assert!(e.contains(missing) && e.contains("--plugin"), "{args:?}: {e}");
    }
    let e = refused(&["train", "--plugin", "cpu", "plugin=tpu"], &[]);
    assert!(e.contains("disagree"), "{e}");
}

#[test]
fn a_bad_xla_flag_value_is_one_line_naming_the_flag() {
    let e = refused(&["devices"], &[("XLA_FLAGS", "--xla_cpu_enable_fast_math=maybe")]);
    assert!(e.contains("--xla_cpu_enable_fast_math=maybe is not a valid bool"), "{e}");
}

#[test]
fn errors_are_printed_once_without_colour() {
    let out = maxrs(&["train", "dataset_type=tokens", "dataset_path=/nonexistent/tokens.bin"], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.matches("does not exist").count(), 1, "{stderr}");
    assert!(!stderr.contains('\x1b'), "no terminal escapes when stderr is a pipe: {stderr:?}");
}

#[test]
fn a_config_file_is_used_and_print_config_tells_where_each_value_came_from() {
    let dir = tempfile::tempdir().unwrap();
    let yml = dir.path().join("my.yml");
    std::fs::write(&yml, "steps: 3\nper_device_batch_size: 2\nmax_target_length: 64\n").unwrap();
    let out = maxrs(&["train", yml.to_str().unwrap(), "--print-config", "learning_rate=0.01"], &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let line = |key: &str| stdout.lines().find(|l| l.starts_with(&format!("{key} "))).unwrap().to_string();
    assert!(line("steps").contains("= 3") && line("steps").contains("my.yml"), "{}", line("steps"));
    assert!(line("learning_rate").ends_with("(command line)"), "{}", line("learning_rate"));
    assert!(line("head_dim").ends_with("(built-in models/default.yml)"), "{}", line("head_dim"));

    // And the run uses them: 3 steps of 2 sequences of 64 tokens, on a CPU plugin given by path
    // with cpu_device_count applied.
    let plugin = maxrs::pjrt::provision::resolve_plugin(Some("cpu")).unwrap().path;
    let out = maxrs(
        &[
            "train",
            yml.to_str().unwrap(),
            &format!("plugin={}", plugin.display()),
            "cpu_device_count=2",
            "per_device_batch_size=1",
        ],
        &[],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("devices: 2 in 1 slice"), "{stdout}");
    assert!(stdout.contains("tokens per step: 2 x 64 = 128"), "{stdout}");
    assert_eq!(stdout.lines().filter(|l| l.starts_with("completed step")).count(), 3, "{stdout}");
}
