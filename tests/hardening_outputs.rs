//! Issue 25's outputs: every command that writes (`tokenize`, `convert`, `submit`, `train`,
//! `train-compile`) goes through `output::check` before any work, so none writes over its own
//! input, into a device or a FIFO, or over a user's file it was not told to replace. Each case
//! runs the binary as a user would, with a deadline, and checks the bytes already on disk.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::cli::{command, maxrs, refused, refused_by};

fn tokenizer() -> String {
    format!("{}/tests/data/shakespeare-bpe512.model", env!("CARGO_MANIFEST_DIR"))
}

/// A JSON Lines corpus in `dir`.
fn corpus(dir: &Path) -> PathBuf {
    let path = dir.join("corpus.jsonl");
    std::fs::copy(format!("{}/tests/data/tokenizer_corpus.jsonl", env!("CARGO_MANIFEST_DIR")), &path).unwrap();
    path
}

/// `maxrs tokenize INPUT --output OUTPUT extra...` with a small tokenizer and rows of 17 ids.
fn tokenize_args<'a>(input: &'a str, output: &'a str, tokenizer: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["tokenize", input, "--output", output, tokenizer, "max_target_length=16"];
    args.extend_from_slice(extra);
    args
}

fn mkfifo(path: &Path) {
    assert!(Command::new("mkfifo").arg(path).status().unwrap().success());
}

#[test]
fn tokenize_never_writes_over_its_input_or_its_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    let input = corpus(dir.path());
    let before = std::fs::read(&input).unwrap();
    let (hard, soft) = (dir.path().join("hard.jsonl"), dir.path().join("soft.jsonl"));
    std::fs::hard_link(&input, &hard).unwrap();
    std::os::unix::fs::symlink(&input, &soft).unwrap();
    let glob = dir.path().join("*.jsonl");
    let tok = format!("tokenizer_path={}", tokenizer());
    // The input itself, under its own name, a hard link, a symlink, and matched by a glob; with
    // --force too, which replaces a file but never an input.
    for (input_arg, output) in [(&input, &input), (&input, &hard), (&input, &soft), (&glob, &input)] {
        for force in [&[][..], &["--force"][..]] {
            let e = refused(&tokenize_args(input_arg.to_str().unwrap(), output.to_str().unwrap(), &tok, force), &[]);
            assert!(e.contains(&format!("--output={:?}", output.display().to_string())), "{e}");
            assert!(e.contains("is the same file as INPUT=") && e.contains("give --output a path of its own"), "{e}");
        }
    }
    let tokenizer_before = std::fs::read(tokenizer()).unwrap();
    let e = refused(&tokenize_args(input.to_str().unwrap(), &tokenizer(), &tok, &["--force"]), &[]);
    assert!(e.contains("is the same file as tokenizer_path="), "{e}");
    assert_eq!(std::fs::read(&input).unwrap(), before, "not a byte of the corpus may change");
    assert_eq!(std::fs::read(tokenizer()).unwrap(), tokenizer_before, "nor of the tokenizer");
    assert!(std::fs::symlink_metadata(&soft).unwrap().file_type().is_symlink());
}

#[test]
fn tokenize_refuses_devices_fifos_and_directories_without_opening_them() {
    let dir = tempfile::tempdir().unwrap();
    let input = corpus(dir.path());
    let tok = format!("tokenizer_path={}", tokenizer());
    // A FIFO opened for writing blocks until a reader comes: the deadline fails a regression.
    let fifo = dir.path().join("fifo");
    mkfifo(&fifo);
    // /dev/null through a symlink: were it written, the link would be replaced, never /dev/null.
    let null_link = dir.path().join("null");
    std::os::unix::fs::symlink("/dev/null", &null_link).unwrap();
    // A device node of its own where this user may make one (root in most test containers).
    let node = dir.path().join("node");
    let own_node = Command::new("mknod").arg(&node).args(["c", "1", "3"]).status().is_ok_and(|s| s.success());
    let mut cases = vec![(&fifo, "is a FIFO (named pipe)"), (&null_link, "is a device")];
    if own_node {
        cases.push((&node, "is a device"));
    }
    let here = dir.path().to_path_buf();
    cases.push((&here, "is a directory"));
    for (output, what) in cases {
        for force in [&[][..], &["--force"][..]] {
            let e = refused(&tokenize_args(input.to_str().unwrap(), output.to_str().unwrap(), &tok, force), &[]);
            assert!(e.contains(&format!("--output={:?} {what}", output.display().to_string())), "{e}");
            assert!(e.contains("maxrs writes a regular file there"), "{e}");
        }
    }
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo(), "the FIFO is still a FIFO");
    assert!(std::fs::symlink_metadata(&null_link).unwrap().file_type().is_symlink(), "the link is still a link");
    if own_node {
        assert!(std::fs::metadata(&node).unwrap().file_type().is_char_device(), "the node is still a device");
    }
}

#[test]
fn tokenize_replaces_an_existing_file_only_with_force() {
    let dir = tempfile::tempdir().unwrap();
    let input = corpus(dir.path());
    let output = dir.path().join("corpus.tokens");
    std::fs::write(&output, b"the user's file").unwrap();
    let tok = format!("tokenizer_path={}", tokenizer());
    let e = refused(&tokenize_args(input.to_str().unwrap(), output.to_str().unwrap(), &tok, &[]), &[]);
    assert_eq!(
        e,
        format!(
            "error: --output={:?} already exists; add --force to replace it, or give a new path",
            output.display().to_string()
        )
    );
    assert_eq!(std::fs::read(&output).unwrap(), b"the user's file");
    let out = maxrs(&tokenize_args(input.to_str().unwrap(), output.to_str().unwrap(), &tok, &["--force"]), &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let meta = std::fs::metadata(&output).unwrap();
    assert!(meta.len() > 0 && meta.len().is_multiple_of(4 * 17), "rows of 17 int32 ids: {}", meta.len());
    assert_eq!(meta.permissions().mode() & 0o777, 0o644, "an ordinary file, not the temporary file's 0600");
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(leftovers.len(), 2, "no temporary file is left: {leftovers:?}");
}

#[test]
fn tokenize_workers_must_be_between_one_and_four_per_core() {
    let dir = tempfile::tempdir().unwrap();
    let input = corpus(dir.path());
    let output = dir.path().join("out.tokens");
    let tok = format!("tokenizer_path={}", tokenizer());
    let cores = std::thread::available_parallelism().unwrap().get();
    let too_many = (4 * cores + 1).to_string();
    for workers in ["0", too_many.as_str()] {
        let e = refused(
            &tokenize_args(input.to_str().unwrap(), output.to_str().unwrap(), &tok, &["--workers", workers]),
            &[],
        );
        assert_eq!(
            e,
            format!(
                "error: --workers {workers}: give 1 to {} tokenizer threads (4 per core, {cores} cores here)",
                4 * cores
            )
        );
    }
    assert!(!output.exists(), "nothing is written");
    let most = (4 * cores).to_string();
    let out =
        maxrs(&tokenize_args(input.to_str().unwrap(), output.to_str().unwrap(), &tok, &["--workers", &most]), &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Every file under `dir` with its bytes, to show a refused command changed nothing.
fn tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(tree(&path));
        } else {
            files.push((path.clone(), std::fs::read(&path).unwrap()));
        }
    }
    files.sort();
    files
}

fn convert_ok(args: &[&str]) {
    let out = maxrs(&[&["convert"], args].concat(), &[]);
    assert!(out.status.success(), "convert {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn convert_writes_a_new_directory_never_over_or_around_its_source() {
    let d = tempfile::tempdir().unwrap();
    let hf = d.path().join("hf");
    crate::convert_hf::write_hf(&hf, &crate::convert_hf::random_checkpoint(25), false);
    let ours = d.path().join("ours");
    convert_ok(&["from-hf", hf.to_str().unwrap(), ours.to_str().unwrap()]);
    // A folder of the user's with a config.json of its own.
    let theirs = d.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::fs::write(theirs.join("config.json"), b"{\"mine\": true}").unwrap();
    let before = tree(d.path());

    let shown = |p: &Path| format!("{:?}", p.display().to_string());
    let (hf_s, ours_s, theirs_s) = (hf.to_str().unwrap(), ours.to_str().unwrap(), theirs.to_str().unwrap());
    let (ours_in, hf_in) = (ours.join("hf"), hf.join("maxrs"));
    let parent = d.path().to_str().unwrap();
    // Both directions refuse an existing DST with the same words.
    for (args, src, dst) in [(["to-hf", ours_s, theirs_s], &ours, &theirs), (["from-hf", hf_s, theirs_s], &hf, &theirs)]
    {
        let e = refused(&[&["convert"], &args[..]].concat(), &[]);
        assert_eq!(
            e,
            format!(
                "error: DST={} already exists; maxrs writes a new directory there, whole: give a path that does not \
                 exist yet (or delete it)",
                shown(dst)
            ),
            "{src:?}"
        );
    }
    // DST is SRC, lies inside it, or holds it.
    for (args, relation) in [
        (vec!["to-hf", ours_s, ours_s], format!("DST={} is the same file as SRC={}", shown(&ours), shown(&ours))),
        (vec!["from-hf", hf_s, hf_s], format!("DST={} is the same file as SRC={}", shown(&hf), shown(&hf))),
        (
            vec!["to-hf", ours_s, ours_in.to_str().unwrap()],
            format!("DST={} lies inside SRC={}", shown(&ours_in), shown(&ours)),
        ),
        (
            vec!["from-hf", hf_s, hf_in.to_str().unwrap()],
            format!("DST={} lies inside SRC={}", shown(&hf_in), shown(&hf)),
        ),
        (vec!["to-hf", ours_s, parent], format!("DST={} holds SRC={}", shown(d.path()), shown(&ours))),
    ] {
        let e = refused(&[&["convert"], &args[..]].concat(), &[]);
        assert!(e.starts_with(&format!("error: {relation}; ")) && e.ends_with("give DST a path of its own"), "{e}");
    }
    assert_eq!(tree(d.path()), before, "no file changed, none was added");

    // A new directory is written whole: no staging directory is left beside it.
    let back = d.path().join("back");
    convert_ok(&["to-hf", ours_s, back.to_str().unwrap(), "--max-shard-size", "100KB"]);
    assert!(back.join("config.json").is_file() && back.join("model.safetensors.index.json").is_file());
    let names: Vec<String> =
        std::fs::read_dir(d.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(names.iter().all(|n| !n.ends_with(".maxrs-tmp")), "{names:?}");
}

#[test]
fn convert_max_shard_size_must_be_a_size_of_at_least_one_byte() {
    let d = tempfile::tempdir().unwrap();
    let dst = d.path().join("dst");
    for size in ["0", "0GB", "0.1B", "-5GB", "5XB", "GB", "lots", "1e9", "inf"] {
        let flag = format!("--max-shard-size={size}");
        let e = refused(
            &["convert", "to-hf", "params.safetensors", dst.to_str().unwrap(), &flag, "model_name=llama2-7b"],
            &[],
        );
        assert_eq!(
            e,
            format!(
                "error: --max-shard-size {size:?}: give a size of at least 1 byte, as bytes or with a unit: 5GB, \
                 500MB, 100KiB (KB, MB, GB are powers of 1000; KiB, MiB, GiB of 1024)"
            )
        );
    }
    assert!(!dst.exists());
}

/// `maxrs submit TARGET --nodes 2 --image IMG --dry-run extra -- train ...` from the repository
/// root (the config the command names), with a home and settings of its own.
fn submit(target: &str, home: &Path, extra: &[&str]) -> Command {
    let mut args = vec!["submit", target, "--nodes", "2", "--image", "img", "--dry-run"];
    args.extend_from_slice(extra);
    args.extend(["--", "train", "configs/base.yml", "model_name=llama2-7b", "ici_fsdp_parallelism=8"]);
    args.push("dcn_data_parallelism=2");
    let mut cmd = command(&args, &[("HOME", home.to_str().unwrap())]);
    cmd.current_dir(env!("CARGO_MANIFEST_DIR")).env_remove("MAXRS_SUBMIT_CONFIG");
    cmd
}

#[test]
fn submit_output_replaces_a_file_only_with_force_and_never_its_settings() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("job.out");
    let settings = d.path().join("settings.yml");
    std::fs::write(&settings, b"submit:\n  machine_type: a3-megagpu-8g\n").unwrap();
    let fifo = d.path().join("fifo");
    mkfifo(&fifo);
    for target in ["slurm", "gke"] {
        std::fs::write(&out, b"the user's file").unwrap();
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = refused_by(submit(target, d.path(), &["--output", out.to_str().unwrap()]));
        assert_eq!(
            e,
            format!(
                "error: --output={:?} already exists; add --force to replace it, or give a new path",
                out.display().to_string()
            )
        );
        assert_eq!(std::fs::read(&out).unwrap(), b"the user's file", "{target}");

        let e = refused_by(submit(target, d.path(), &["--output", fifo.to_str().unwrap(), "--force"]));
        assert!(e.contains("is a FIFO (named pipe)"), "{e}");
        let args = ["--output", settings.to_str().unwrap(), "--force", "--submit-config", settings.to_str().unwrap()];
        let e = refused_by(submit(target, d.path(), &args));
        assert!(e.contains("is the same file as --submit-config="), "{e}");

        let run = crate::common::cli::finish(submit(target, d.path(), &["--output", out.to_str().unwrap(), "--force"]));
        assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
        let text = std::fs::read_to_string(&out).unwrap();
        assert!(text.contains("maxrs submit") && text.contains("llama2-7b"), "{text}");
        let mode = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{target}: the file may hold secret values: its owner's only");
    }
    assert_eq!(std::fs::read(&settings).unwrap(), b"submit:\n  machine_type: a3-megagpu-8g\n");
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
}

#[test]
fn train_outputs_by_config_key_are_checked_the_same_way() {
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join("file");
    std::fs::write(&file, b"keep").unwrap();
    let fifo = d.path().join("fifo");
    mkfifo(&fifo);
    for (path, what) in [(&file, "a file"), (&fifo, "a FIFO (named pipe)")] {
        let e = refused(&["train", &format!("base_output_directory={}", path.display())], &[]);
        assert_eq!(
            e,
            format!(
                "error: base_output_directory={:?} is {what}; maxrs writes a directory there: give a directory path",
                path.display().to_string()
            )
        );
    }
    assert_eq!(std::fs::read(&file).unwrap(), b"keep");
    let run_dir = d.path().join("runs");
    let e = refused(
        &[
            "train",
            &format!("base_output_directory={}", run_dir.display()),
            &format!("metrics_file={}", run_dir.display()),
        ],
        &[],
    );
    assert!(e.contains("metrics_file=") && e.contains("is the same file as base_output_directory="), "{e}");
    assert!(!run_dir.exists());
    let null_link = d.path().join("null");
    std::os::unix::fs::symlink("/dev/null", &null_link).unwrap();
    let e = refused(
        &[
            "train-compile",
            "compile_topology=h100-1",
            "compile_topology_num_slices=1",
            &format!("compiled_trainstep_file={}", null_link.display()),
        ],
        &[],
    );
    assert!(e.contains("compiled_trainstep_file=") && e.contains("is a device"), "{e}");
    assert!(std::fs::symlink_metadata(&null_link).unwrap().file_type().is_symlink());
}
