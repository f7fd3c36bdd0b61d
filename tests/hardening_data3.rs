//! Issue 42's data cases (hardening, round 3): SFT and chat templates, mixtures.
//! - A run in which no token carries loss: refused at its start when its first batches have
//!   none (SFT's completion-only loss on user-only conversations, or on prompts that fill the
//!   row), and a warning for each later step whose batch has none;
//!   `sft_train_on_completion_only` without `use_sft` is refused (MaxText ignores it).
//! - Conversations SFT cannot train on (ShareGPT's `human`/`gpt` roles, no message at all): the
//!   error names the file, the row and the roles that are valid; among good rows they are
//!   skipped and counted.
//! - Chat templates: `chat_template_path=gs://...` is read from the bucket; a template's errors
//!   name the template; a runaway template fails within seconds (minijinja's fuel).
//! - Mixtures: 10,000 datasets run on the threads of one (a shared pool); weights whose sum
//!   overflows, or that differ by more than grain's integer proportions can hold, are refused
//!   naming the weight; the mixture file and its number of datasets are bounded.

use std::path::{Path, PathBuf};
use std::process::Command;

use maxrs::config;
use maxrs::data::{self, ProcessShare};

use crate::common::cli::{maxrs, refused};
use crate::data_sft::{chat_dir, repeat_conversations};

/// A conversation row with these (role, content) messages.
fn row(messages: &[(&str, &str)]) -> String {
    let messages: Vec<_> =
        messages.iter().map(|(role, content)| serde_json::json!({ "role": role, "content": content })).collect();
    serde_json::json!({ "messages": messages }).to_string()
}

fn write_rows(path: &Path, rows: &[String]) -> PathBuf {
    std::fs::write(path, rows.join("\n") + "\n").unwrap();
    path.to_path_buf()
}

/// SFT on `train` with Llama 3's tokenizer and template, unpacked and in file order, `extra` keys after.
fn sft_args(train: &Path, extra: &[&str]) -> Vec<String> {
    let base = [
        "dataset_type=hf".to_string(),
        "use_sft=true".into(),
        "train_data_columns=[messages]".into(),
        format!("hf_train_files={}", train.display()),
        format!("tokenizer_path={}", chat_dir("llama3").display()),
        "tokenizer_type=huggingface".into(),
        "vocab_size=1024".into(),
        "packing=false".into(),
        "enable_data_shuffling=false".into(),
    ];
    base.into_iter().chain(extra.iter().map(|s| s.to_string())).collect()
}

fn train_refused(args: &[String]) -> String {
    let all: Vec<&str> = ["train"].into_iter().chain(args.iter().map(String::as_str)).collect();
    refused(&all, &[])
}

#[test]
fn a_run_whose_first_batches_carry_no_loss_is_refused_at_its_start() {
    let dir = tempfile::tempdir().unwrap();
    let user_only = write_rows(&dir.path().join("user-only.jsonl"), &[row(&[("user", "Repeat: love king night")])]);
    let e = train_refused(&sft_args(&user_only, &["sft_train_on_completion_only=true", "max_target_length=64"]));
    assert!(
        e.starts_with("error: no target token of the first 4 batches (32 rows of max_target_length=64) carries loss")
            && e.contains("with sft_train_on_completion_only=true only the assistant replies carry loss")
            && e.contains("set sft_train_on_completion_only=false"),
        "{e}"
    );
    // A prompt that fills the row leaves its reply out of it.
    let long_prompt = "Repeat: ".to_string() + &"love king night ".repeat(40);
    let cut = write_rows(&dir.path().join("long.jsonl"), &[row(&[("user", &long_prompt), ("assistant", "love")])]);
    let e = train_refused(&sft_args(&cut, &["sft_train_on_completion_only=true", "max_target_length=16"]));
    assert!(e.contains("carries loss") && e.contains("raise max_target_length"), "{e}");
}

#[test]
fn sft_train_on_completion_only_without_use_sft_is_refused() {
    // MaxText reads it only under `if use_sft:` (hf_data_processing.py, e591f30).
    assert_eq!(
        refused(&["train", "sft_train_on_completion_only=true"], &[]),
        "error: sft_train_on_completion_only: true, but use_sft=false: only SFT conversations have completions to \
         train on (MaxText ignores it without SFT); set use_sft=true or drop it"
    );
}

/// Steps 0 and 2 train on conversations with replies, step 1 on user-only ones: the run starts
/// (its first batch has loss) and warns about step 1 alone.
#[test]
fn a_step_without_loss_tokens_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let (with_replies, _) = repeat_conversations(16, 1);
    let with_replies: Vec<&str> = with_replies.lines().collect();
    let user_only: Vec<String> = (0..8).map(|i| row(&[("user", &format!("Repeat: love {i}"))])).collect();
    let rows: Vec<String> = with_replies[..8]
        .iter()
        .map(|s| s.to_string())
        .chain(user_only)
        .chain(with_replies[8..].iter().map(|s| s.to_string()))
        .collect();
    let train = write_rows(&dir.path().join("train.jsonl"), &rows);
    let output = format!("base_output_directory={}", dir.path().join("out").display());
    let run = ["sft_train_on_completion_only=true", "max_target_length=64", "per_device_batch_size=8", "steps=3"];
    let tiny: Vec<&str> = crate::common::TINY_DECODER
        .iter()
        .copied()
        .chain(run)
        .chain(["enable_checkpointing=false", output.as_str()])
        .collect();
    let args: Vec<String> = ["train".to_string()].into_iter().chain(sft_args(&train, &tiny)).collect();
    let out = maxrs(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("completed step: 1, ") && stdout.contains("total_weights: 0, loss: 0.000"), "{stdout}");
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains("carries loss")).collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(
        warnings[0]
            .contains("step 1: no target token of its batch carries loss (total_weights: 0), so it trained nothing")
            && warnings[0].contains("sft_train_on_completion_only=true"),
        "{}",
        warnings[0]
    );
}

#[test]
fn conversations_sft_cannot_train_on_name_the_file_the_row_and_the_valid_roles() {
    let dir = tempfile::tempdir().unwrap();
    let sharegpt = write_rows(&dir.path().join("sharegpt.jsonl"), &[row(&[("human", "hi"), ("gpt", "hello")])]);
    let e = train_refused(&sft_args(&sharegpt, &[]));
    assert_eq!(
        e,
        format!(
            "error: no valid JSON line with a `messages` field in {sharegpt:?}: line 1: `messages` has no user or \
             assistant message (its roles: [\"human\", \"gpt\"]); SFT trains on the roles user and assistant (with an \
             optional first system message), as MaxText does; rename ShareGPT's human/gpt to user/assistant"
        )
    );
    let empty = write_rows(&dir.path().join("empty.jsonl"), &[r#"{"messages": []}"#.to_string()]);
    let e = train_refused(&sft_args(&empty, &[]));
    assert!(e.contains(&format!("{empty:?}: line 1: `messages` holds no message")), "{e}");

    // Among good rows they are skipped and counted (one pass over an eval file: every row read).
    let good = row(&[("user", "Repeat: love"), ("assistant", "love")]);
    let bad = [row(&[("human", "hi"), ("gpt", "hello")]), r#"{"messages": []}"#.to_string()];
    let eval = write_rows(&dir.path().join("eval.jsonl"), &[good.clone(), bad[0].clone(), good, bad[1].clone()]);
    let mut args = sft_args(&eval, &["eval_interval=1", "eval_data_columns=[messages]"]);
    args.push(format!("hf_eval_files={}", eval.display()));
    let c = config::load(None, &args).unwrap();
    let eval = data::EvalData::open(&c, 8, ProcessShare::SINGLE).unwrap().unwrap();
    let mut batches = eval.batches().unwrap();
    while batches.next_batch().unwrap().is_some() {}
    let (documents, skipped, _) = batches.text_stats().unwrap();
    assert_eq!((documents, skipped), (2, 2));
}

#[test]
fn template_errors_read_as_template_errors_naming_the_template() {
    let dir = tempfile::tempdir().unwrap();
    let train = write_rows(&dir.path().join("train.jsonl"), &[row(&[("user", "hi"), ("assistant", "hello")])]);
    let template = |name: &str, source: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, source).unwrap();
        format!("chat_template_path={}", path.display())
    };
    let refusing = "{% for m in messages %}{{ m.content }}{% endfor %}{{ raise_exception('no tools') }}";
    let e = train_refused(&sft_args(&train, &[&template("refusing.jinja", refusing)]));
    assert_eq!(
        e,
        format!(
            "error: chat template chat_template_path={:?}: cannot render the first conversation of {train:?}: the \
             chat template refused it: no tools",
            dir.path().join("refusing.jinja")
        )
    );
    let invalid = template("invalid.jinja", "{% for m in messages %}{{ m.content }}");
    let e = train_refused(&sft_args(&train, &[&invalid]));
    let path = dir.path().join("invalid.jinja");
    assert!(e.starts_with(&format!("error: chat template chat_template_path={path:?}: not valid Jinja (")), "{e}");
}

/// Nested `range(100000)` loops would render for hours: minijinja's fuel stops the rendering.
#[test]
fn a_runaway_template_fails_within_seconds_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let train = write_rows(&dir.path().join("train.jsonl"), &[row(&[("user", "hi"), ("assistant", "hello")])]);
    let path = dir.path().join("runaway.jinja");
    std::fs::write(&path, "{% for i in range(100000) %}{% for j in range(100000) %}.{% endfor %}{% endfor %}").unwrap();
    let started = std::time::Instant::now();
    let e = train_refused(&sft_args(&train, &[&format!("chat_template_path={}", path.display())]));
    assert_eq!(
        e,
        format!(
            "error: chat template chat_template_path={path:?}: cannot render the first conversation of {train:?}: the \
             chat template ran more than {} instructions without finishing (a runaway loop?); chat templates spend \
             under a hundred a message",
            data::chat::TEMPLATE_FUEL
        )
    );
    // The refusal's deadline is minutes; the fuel runs out in seconds even in a debug build.
    assert!(started.elapsed() < std::time::Duration::from_secs(60), "{:?}", started.elapsed());
}

#[test]
fn a_chat_template_in_a_bucket_is_read_from_the_bucket() {
    const BUCKET: &str = "maxrs-templates";
    let Some(_emulator) = crate::common::gcs_emulator::start(&[BUCKET]) else { return };
    let at = format!("gs://{BUCKET}/chat.jinja");
    let source = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}";
    maxrs::storage::write(&maxrs::files::Location::parse(&at).unwrap(), source.as_bytes()).unwrap();
    let tokenizer = chat_dir("llama3");
    let template = data::chat::ChatTemplate::load("", &at, tokenizer.to_str().unwrap()).unwrap();
    let hi = data::chat::Message { role: "user".into(), content: "hi".into() };
    assert_eq!(template.render(&[hi], false).unwrap(), "<user>hi");
    let missing = format!("gs://{BUCKET}/missing.jinja");
    let e = data::chat::ChatTemplate::load("", &missing, tokenizer.to_str().unwrap()).unwrap_err().to_string();
    assert_eq!(e, format!("chat_template_path: reading {missing}: no such object"));
}

/// The mixture file of `datasets` datasets, each the file `data` with weight 1.
fn mixture_of(dir: &Path, datasets: usize, data: &Path) -> PathBuf {
    let entries: serde_json::Map<String, serde_json::Value> =
        (0..datasets).map(|i| (format!("d{i:05}"), serde_json::json!({ "path": data, "weight": 1 }))).collect();
    let path = dir.join("mixture.json");
    std::fs::write(&path, serde_json::Value::Object(entries).to_string()).unwrap();
    path
}

const MIXTURE_ENV: &str = "MAXRS_TEST_MIXTURE_FILE";

/// Runs the child below in a process of its own, so that no other test's threads are counted:
/// 10,000 datasets used to start 3 threads each (a reader and a tokenizer per core) and panic
/// when the machine's limit stopped them; now they share one pool.
#[test]
fn a_mixture_of_ten_thousand_datasets_runs_on_the_threads_of_one() {
    let dir = tempfile::tempdir().unwrap();
    let texts: Vec<String> = (0..4).map(|i| serde_json::json!({ "text": format!("doc {i}") }).to_string()).collect();
    let data = write_rows(&dir.path().join("data.jsonl"), &texts);
    let mixture = mixture_of(dir.path(), 10_000, &data);
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "hardening_data3::mixture_child", "--ignored", "--nocapture", "--test-threads=1"])
        .env(MIXTURE_ENV, &mixture)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let threads: usize =
        stdout.lines().find_map(|l| l.split_once("threads: ")).expect(&stdout).1.trim().parse().unwrap();
    // The pool's tokenizers and reader, the packer, the harness's main and test threads.
    assert!(threads <= data::default_workers() + 4, "{threads} threads");
}

/// The child of the test above (it sets the mixture file): opens the mixture, reads two batches
/// and prints the process's threads.
#[test]
#[ignore = "run in a process of its own by a_mixture_of_ten_thousand_datasets_runs_on_the_threads_of_one"]
fn mixture_child() {
    let Ok(mixture) = std::env::var(MIXTURE_ENV) else { return };
    let tokenizer = format!("tokenizer_path={}/tests/data/shakespeare-bpe512.model", env!("CARGO_MANIFEST_DIR"));
    let args = ["dataset_type=hf".into(), format!("grain_train_mixture_config_path={mixture}"), tokenizer];
    let c = config::load(None, &args).unwrap();
    let mut batches = data::open_train(&c, 8, ProcessShare::SINGLE, None).unwrap();
    for _ in 0..2 {
        assert!(batches.next_batch().unwrap().is_some());
    }
    println!("threads: {}", std::fs::read_dir("/proc/self/task").unwrap().count());
}

#[test]
fn mixture_weights_grain_cannot_hold_are_refused_naming_the_weight() {
    let dir = tempfile::tempdir().unwrap();
    let data = write_rows(&dir.path().join("a.jsonl"), &[serde_json::json!({ "text": "doc" }).to_string()]);
    let tokenizer = format!("tokenizer_path={}/tests/data/shakespeare-bpe512.model", env!("CARGO_MANIFEST_DIR"));
    let file = |weights: &[f64]| {
        let entries: serde_json::Map<String, serde_json::Value> = weights
            .iter()
            .enumerate()
            .map(|(i, w)| (["a", "b"][i].to_string(), serde_json::json!({ "path": data, "weight": w })))
            .collect();
        let path = dir.path().join("weights.json");
        std::fs::write(&path, serde_json::Value::Object(entries).to_string()).unwrap();
        refused(
            &["train", "dataset_type=hf", &format!("grain_train_mixture_config_path={}", path.display()), &tokenizer],
            &[],
        )
    };
    let mixture =
        format!("grain_train_mixture_config_path={:?}", dir.path().join("weights.json").display().to_string());
    // 1e308 + 1e308 overflowed and divided by zero (a panic).
    assert_eq!(
        file(&[1e308, 1e308]),
        format!(
            "error: {mixture}: the weights add up to inf, past the largest number; scale them down (only their \
             ratios matter)"
        )
    );
    // A subnormal weight made grain's scale infinite: it got half the documents.
    assert_eq!(
        file(&[1.0, 1e-310]),
        format!(
            "error: {mixture}: the weight 1e-310 of dataset \"b\" is less than 1/1e12 of the weight 1.0 of dataset \
             \"a\"; weights may differ by at most 1e12 times (grain scales them to integers, the smallest to 100): \
             raise it or drop that dataset"
        )
    );
    let d = data.display();
    let e = refused(&["train", "dataset_type=hf", &format!("hf_train_files={d},1e308;{d},1e308"), &tokenizer], &[]);
    assert!(e.contains("the weights add up to inf"), "{e}");
}

#[test]
fn a_mixture_file_and_its_datasets_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let tokenizer = format!("tokenizer_path={}/tests/data/shakespeare-bpe512.model", env!("CARGO_MANIFEST_DIR"));
    let train = |path: &Path| {
        refused(
            &["train", "dataset_type=hf", &format!("grain_train_mixture_config_path={}", path.display()), &tokenizer],
            &[],
        )
    };
    let data = write_rows(&dir.path().join("a.jsonl"), &[serde_json::json!({ "text": "doc" }).to_string()]);
    let e = train(&mixture_of(dir.path(), data::mixture::MAX_COMPONENTS + 1, &data));
    assert!(
        e.ends_with("100001 datasets, more than the 100000 a mixture may have; merge some of them into one glob"),
        "{e}"
    );
    // Read whole, so bounded as a config file is (a sparse file: nothing written).
    let big = dir.path().join("big.json");
    std::fs::File::create(&big).unwrap().set_len((64 << 20) + 1).unwrap();
    assert_eq!(
        train(&big),
        format!(
            "error: grain_train_mixture_config_path={big:?} is 67108865 bytes, more than the 64 MiB maxrs reads for a \
             config, flags, index or manifest file"
        )
    );
}
