//! Issue 25's configuration, checkpoint and decode cases: a key given twice on the command line,
//! user values with control characters in errors, a checkpoint whose manifest disagrees with its
//! folder, a bare `maxrs decode`, `train-compile` for a GPU target, and counts without an upper
//! bound (each was a silent choice, a raw terminal escape, a dead run or a panic).

use std::path::Path;
use std::process::Output;

use maxrs::aot::train_compile::apply_target;
use maxrs::checkpoint::Checkpoints;
use maxrs::config::{self, Hardware, Source};
use maxrs::files::Location;
use maxrs::pjrt::cpu_client;
use maxrs::train::run::train;

use crate::checkpoint_resume::{small, state_expected};

/// `maxrs args`, with the caller's plugin settings removed.
fn maxrs(args: &[&str]) -> Output {
    crate::common::cli::maxrs(args, &[])
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs a command that must fail before compiling; returns its one error line.
fn refused(args: &[&str]) -> String {
    crate::common::cli::refused(args, &[])
}

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// The message of loading `args` as a command line and validating them for one device, which
/// must fail.
fn load_error(args: &[&str]) -> String {
    match config::load_args(&strings(args)).and_then(|c| config::validate(&c, 1, 1)) {
        Ok(_) => panic!("{args:?} must be refused"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_key_given_twice_on_the_command_line_is_refused_naming_both_values() {
    let e = refused(&["train", "steps=3", "steps=4"]);
    assert!(e.contains("`steps` is given twice on the command line, as `3` and as `4`"), "{e}");
    assert!(load_error(&["steps=3", "steps=4"]).contains("as `3` and as `4`"));
    // Restating a value loses nothing, and a command-line value still overrides the config file.
    assert_eq!(config::load_args(&strings(&["steps=3", "steps=3"])).unwrap().steps, 3);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("run.yml");
    std::fs::write(&file, "steps: 3\n").unwrap();
    let args = [file.display().to_string(), "steps=4".to_string()];
    assert_eq!(config::load_args(&args).unwrap().steps, 4);
    // train-compile's --topology and the same compile_topology= are one setting.
    let out = maxrs(&["train-compile", "--topology=cpu-8", "compile_topology=cpu-8", "--print-config"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// `maxrs convert` layers the user's arguments over the model keys it reads from the source: a
/// user's value that differs from the source's wins (it is given once), while a key the user
/// gives twice is still refused.
#[test]
fn convert_takes_a_users_key_over_the_sources_and_refuses_it_twice() {
    let d = tempfile::tempdir().unwrap();
    let hf = d.path().join("hf");
    crate::convert_hf::write_hf(&hf, &crate::convert_hf::random_checkpoint(7), true);
    let (src, out) = (hf.to_str().unwrap(), d.path().join("out"));
    // The bf16 source makes weight_dtype=bfloat16; the user asks for float32.
    let done = maxrs(&["convert", "from-hf", src, out.to_str().unwrap(), "weight_dtype=float32"]);
    assert!(done.status.success(), "{}", text(&done.stderr));
    let e = refused(&["convert", "from-hf", src, d.path().join("o2").to_str().unwrap(), "steps=3", "steps=4"]);
    assert!(e.contains("`steps` is given twice on the command line"), "{e}");
}

#[test]
fn control_characters_in_values_are_shown_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("run.yml");
    std::fs::write(&file, "dtype: \"float\\0\"\n").unwrap();
    let from_file = config::load(Some(&file), &[]).unwrap_err().to_string();
    let cases = [
        (load_error(&["steps=3\u{1b}[2J"]), r#""3\u{1b}[2J""#),
        (load_error(&["ste\rps=3"]), r#""ste\rps""#),
        (load_error(&["steps=3\r", "steps=4"]), r#""3\r""#),
        (load_error(&["plugin=cu\u{7}da"]), r#""cu\u{7}da""#),
        (load_error(&["model_name=llama\u{1b}"]), r#""llama\u{1b}""#),
        (load_error(&["mesh_axes=[data, fsdp\u{202e}]"]), r#""fsdp\u{202e}""#),
        // Lists are shown as JSON, which escapes them its way.
        (load_error(&["logical_axis_rules=[[embed\u{1b}, fsdp]]"]), r#"embed\u001b"#),
        (from_file, r#""float\0""#),
        (refused(&["train", "steps=3\u{1b}[2J"]), r#""3\u{1b}[2J""#),
        (refused(&["decode", "prompt=1 \u{1b}[2J 2"]), r#""\u{1b}[2J""#),
        (refused(&["train-compile", "--topology=h100-1", "compile_topology=h\u{1b}"]), "h\\u{1b}"),
        (refused(&["train-compile", "--topology=h100\u{1}"]), r#""h100\u{1}""#),
    ];
    for (line, shown) in cases {
        assert!(line.contains(shown), "{shown} not in: {line}");
        assert!(!line.chars().any(char::is_control), "a raw control character in: {line:?}");
    }
}

/// A run with checkpoints after steps 0, 2 and 4 in `base/r/checkpoints`.
fn checkpointed_run(base: &Path) -> config::Config {
    let mut args = small(&["per_device_batch_size=8", "checkpoint_period=2", "steps=5", "enable_checkpointing=true"]);
    args.extend([format!("base_output_directory={}", base.display()), "run_name=r".to_string()]);
    let c = config::load(None, &args).unwrap();
    train(&c, &cpu_client(1).unwrap()).unwrap();
    c
}

/// Rewrites `dir`'s manifest through `change`; returns the original text.
fn edit_manifest(dir: &Path, change: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
    let path = dir.join("manifest.json");
    let original = std::fs::read(&path).unwrap();
    let mut manifest: serde_json::Value = serde_json::from_slice(&original).unwrap();
    change(&mut manifest);
    std::fs::write(&path, serde_json::to_vec_pretty(&manifest).unwrap()).unwrap();
    original
}

/// Every file of a checkpoint directory and its bytes.
fn contents(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
        .collect();
    files.sort();
    files
}

#[test]
fn a_checkpoint_whose_manifest_disagrees_with_its_folder_falls_back() {
    let base = tempfile::tempdir().unwrap();
    let c = checkpointed_run(base.path());
    let ckpts = base.path().join("r/checkpoints");
    let checkpoints = Checkpoints::new(Location::Local(ckpts.clone()));
    let model = maxrs::checkpoint::manifest::model_keys(&c, &maxrs::model::Model::from_config(&c).unwrap());
    let expected = state_expected(&c);
    let restored_step = || checkpoints.restore_latest(&expected, &model).map(|l| l.unwrap().manifest.step);
    assert_eq!(restored_step().unwrap(), Some(4));

    // The data position of another step: refused, the previous one restores.
    let original = edit_manifest(&ckpts.join("4"), |m| m["data"]["next_step"] = 9.into());
    assert_eq!(restored_step().unwrap(), Some(2));
    std::fs::write(ckpts.join("4/manifest.json"), &original).unwrap();

    // No usable checkpoint at all: one line naming each step and why.
    let originals: Vec<Vec<u8>> =
        ["0", "2", "4"].iter().map(|s| edit_manifest(&ckpts.join(s), |m| m["step"] = 7.into())).collect();
    let e = format!("{:#}", restored_step().unwrap_err());
    assert!(!e.contains('\n'), "one line: {e}");
    for step in [0, 2, 4] {
        assert!(
            e.contains(&format!("step {step}: its manifest.json says step 7, but the folder is step {step}")),
            "{e}"
        );
    }
    for (step, original) in ["0", "2", "4"].iter().zip(&originals) {
        std::fs::write(ckpts.join(step).join("manifest.json"), original).unwrap();
    }

    // The issue's case, as a user meets it: step 4's manifest edited to step 3. The run warns once,
    // naming the folder and why, resumes after step 2, and leaves the bad checkpoint as it was.
    edit_manifest(&ckpts.join("4"), |m| m["step"] = 3.into());
    let before = contents(&ckpts.join("4"));
    let mut args = small(&[
        "per_device_batch_size=8",
        "steps=5",
        "enable_checkpointing=true",
        "save_checkpoint_on_completion=false",
        "run_name=r",
    ]);
    args.push(format!("base_output_directory={}", base.path().display()));
    let out = maxrs(&[&["train"], &args.iter().map(String::as_str).collect::<Vec<_>>()[..]].concat());
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains("WARN")).collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    let folder = ckpts.join("4").display().to_string();
    assert!(
        warnings[0].contains(&format!(
            "skipping the invalid checkpoint {folder}: its manifest.json says step 3, but the folder is step 4"
        )),
        "{}",
        warnings[0]
    );
    assert!(stdout.contains("falling back to the checkpoint of step 2"), "{stdout}");
    assert!(stdout.contains("resuming from the checkpoint of step 2"), "{stdout}");
    assert!(stdout.contains("completed step: 4"), "{stdout}");
    assert_eq!(contents(&ckpts.join("4")), before, "the refused checkpoint is left as it was");
}

#[test]
fn bare_decode_decodes_the_default_prompt_as_bytes_and_says_so() {
    let out = maxrs(&["decode"]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(
            "prompt: no tokenizer_path, so the default prompt `I love to` goes in as its UTF-8 bytes \
             (token ids 73 32 108 111 118 101 32 116 111) and the output is token ids"
        ),
        "{stdout}"
    );
    let output = stdout.lines().find_map(|l| l.strip_prefix("Input `I love to` -> `")).expect("an output line");
    let ids: Vec<i64> = output.trim_end_matches('`').split(' ').map(|id| id.parse().unwrap()).collect();
    // The default model's cache of 128 positions after a prefill padded to 64.
    assert_eq!(ids.len(), 65, "{output}");
    assert!(ids.iter().all(|id| (0..512).contains(id)), "{output}");
    // A prompt the user writes is still token ids without a tokenizer, and bytes need a
    // vocabulary of 256.
    let e = refused(&["decode", "prompt=I love to"]);
    assert!(e.contains("`I` is not a token id in 0..512") && e.contains("tokenizer_path"), "{e}");
    let e = refused(&["decode", "vocab_size=200"]);
    assert!(e.contains("`I` is not a token id in 0..200"), "{e}");
}

fn resolved(args: &[&str], file: Option<&Path>) -> config::Resolved {
    config::resolve(file, &strings(args)).unwrap()
}

#[test]
fn a_gpu_or_tpu_topology_sets_the_hardware_of_train_compile() {
    // The issue's command line: `plugin=cuda13` with the default `hardware=cpu` was refused.
    let mut r = resolved(&["compile_topology=h100-1", "compile_topology_num_slices=1", "plugin=cuda13"], None);
    let e = config::check(&r.config).unwrap_err().to_string();
    assert!(e.contains("hardware=cpu does not run on plugin=cuda13"), "{e}");
    apply_target(&mut r).unwrap();
    assert_eq!(r.config.hardware, Hardware::Gpu);
    assert_eq!(r.source("hardware"), &Source::Setting("compile_topology=h100-1".into()));
    assert_eq!((r.config.plugin.as_str(), r.source("plugin")), ("cuda13", &Source::CommandLine));
    config::check(&r.config).unwrap();

    // A config file's hardware is a run setting and gives way; a command-line one contradicting
    // the target is an error naming both.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tpu.yml");
    std::fs::write(&file, "hardware: tpu\n").unwrap();
    let mut r = resolved(&["compile_topology=a3mega-2", "compile_topology_num_slices=1"], Some(&file));
    apply_target(&mut r).unwrap();
    assert_eq!((r.config.hardware, r.config.plugin.as_str()), (Hardware::Gpu, "cuda12"));
    let mut r = resolved(&["compile_topology=h100-1", "hardware=gpu_multiprocess"], None);
    apply_target(&mut r).unwrap();
    assert_eq!(r.config.hardware, Hardware::GpuMultiprocess, "a GPU hardware value fits a GPU target");
    let e = refused(&["train-compile", "--topology=h100-1", "hardware=tpu"]);
    assert!(e.contains("hardware=tpu and compile_topology=h100-1 disagree") && e.contains("set hardware=gpu"), "{e}");

    // --print-config shows what the target decided.
    for (topology, hardware, plugin) in [("h100-1", "gpu", "cuda12"), ("v5e-8", "tpu", "tpu"), ("cpu-8", "cpu", "cpu")]
    {
        let out = maxrs(&["train-compile", &format!("--topology={topology}"), "--print-config"]);
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let row = |key: &str| -> Vec<String> {
            let line = stdout.lines().find(|l| l.split_whitespace().next() == Some(key)).expect("a row");
            line.split_whitespace().map(String::from).collect()
        };
        let from_target = format!("(compile_topology={topology})");
        if topology == "cpu-8" {
            assert_eq!(row("hardware")[2..], [hardware, "(configs/base.yml", "default)"]);
        } else {
            assert_eq!(row("hardware")[2..], [hardware.to_string(), from_target.clone()]);
            assert_eq!(row("plugin")[2..], [plugin.to_string(), from_target]);
        }
    }
}

#[test]
fn counts_have_an_upper_bound() {
    let acts = format!("mlp_activations=[{}]", ["silu"; 9].join(", "));
    let e = load_error(&[&acts]);
    assert!(e.contains("mlp_activations: 9 activations") && e.contains("at most 8"), "{e}");
    let e = load_error(&["max_num_checkpoints_to_keep=2199023255552"]);
    assert!(
        e.contains("max_num_checkpoints_to_keep=2199023255552; it must be an integer in [1, 1099511627776], or None"),
        "{e}"
    );
    for ok in ["None", "1", "1099511627776"] {
        let c = config::load(None, &strings(&[&format!("max_num_checkpoints_to_keep={ok}")])).unwrap();
        config::check(&c).unwrap();
    }
    // These panicked counting the parameters (u64 overflow) after the checks passed them.
    let big = ["base_emb_dim=1048576", "base_mlp_dim=4194304", "base_num_decoder_layers=4096", "steps=1"];
    let acts = format!("mlp_activations=[{}]", vec!["silu"; 2048].join(","));
    let e = refused(&[&["train", acts.as_str()][..], &big].concat());
    assert!(e.contains("mlp_activations: 2048 activations"), "{e}");
    let experts = ["decoder_block=mixtral", "num_experts=4096", "num_experts_per_tok=1"];
    let e = refused(&[&["train"][..], &experts, &big].concat());
    assert!(e.contains("num_experts") && e.contains("MLP weights of one kernel") && e.contains("2^60"), "{e}");
}
