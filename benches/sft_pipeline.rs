//! Supervised fine-tuning's input pipeline and a small SFT run. Prints three tables:
//! - the SFT pipeline (read, render the chat template, tokenize, pack) in tokens/s, for the
//!   Llama 3 and Qwen3 templates of tests/data/chat, 1 tokenizer worker and one per core;
//! - the same pass reading its JSON Lines from the GCS emulator (fake-gcs-server, started as the
//!   tests start it: tests/common/gcs_emulator.rs) against reading them from local disk;
//! - a small SFT run: the default model on 200 conversations with completion-only loss: the
//!   first and last losses, the loss-carrying (completion) tokens against all tokens per step,
//!   and the step time.
//!
//! Conversations: a user asking to repeat 3 to 60 words and the assistant repeating them
//! (generated, deterministic). `cargo bench --bench sft_pipeline` (`-- --quick`: fewer repeats).

use std::path::{Path, PathBuf};
use std::time::Instant;

use maxrs::cluster::client_for;
use maxrs::config::{self, Config};
use maxrs::data::{self, Packing, ProcessShare, Split, TextBatches, TextState};
use maxrs::files::Location;
use maxrs::train::run::train;

// The tests' emulator fixture (it names `super::provision`).
#[path = "../tests/common/gcs_emulator.rs"]
mod gcs_emulator;
#[path = "../tests/common/provision.rs"]
#[allow(dead_code)]
mod provision;

const WORDS: &[&str] =
    &["love", "king", "night", "sweet", "lord", "fair", "heart", "death", "sir", "good", "time", "eyes"];
const SEQ: usize = 1024;
const ROWS: usize = 8;

fn conversations(n: usize, max_words: usize) -> String {
    let mut state = 12345u64;
    let mut next = || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 33) as usize
    };
    let mut out = String::new();
    for _ in 0..n {
        let count = 3 + next() % (max_words - 2);
        let words: Vec<&str> = (0..count).map(|_| WORDS[next() % WORDS.len()]).collect();
        let answer = words.join(" ");
        let line = serde_json::json!({"messages": [
            {"role": "system", "content": "You repeat what you are told."},
            {"role": "user", "content": format!("Repeat: {answer}")},
            {"role": "assistant", "content": answer}]});
        out.push_str(&format!("{line}\n"));
    }
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn chat_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/chat").join(name)
}

fn cfg(files: &str, template: &str, seq: usize, extra: &[&str]) -> Config {
    let mut args: Vec<String> = vec![
        "dataset_type=hf".into(),
        "use_sft=true".into(),
        "sft_train_on_completion_only=true".into(),
        "train_data_columns=[messages]".into(),
        "eval_data_columns=[messages]".into(),
        "tokenizer_type=huggingface".into(),
        "vocab_size=1024".into(),
        format!("tokenizer_path={}", chat_dir(template).display()),
        format!("hf_train_files={files}"),
        format!("max_target_length={seq}"),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    config::load(None, &args).unwrap()
}

/// One pass over `hf_eval_files`: (seconds, tokens packed).
fn pass(c: &Config, workers: usize) -> (f64, u64) {
    let tokenizer = data::load_tokenizer(c).unwrap();
    // Eval's stream: one pass in file order (training repeats epochs).
    let mut spec = data::text_spec(c, Split::Eval, tokenizer, ProcessShare::SINGLE).unwrap();
    spec.workers = workers;
    let t = Instant::now();
    let mut batches = TextBatches::start(spec, TextState::default(), ROWS, SEQ, Packing::of(c)).unwrap();
    while batches.next_batch().unwrap().is_some() {}
    (t.elapsed().as_secs_f64(), batches.stats().2)
}

fn tokens_per_s(c: &Config, workers: usize, repeats: usize) -> (f64, u64) {
    let runs: Vec<(f64, u64)> = (0..repeats).map(|_| pass(c, workers)).collect();
    let tokens = runs[0].1;
    (tokens as f64 / median(runs.iter().map(|r| r.0).collect()), tokens)
}

fn main() {
    // The emulator's address, set while this process has one thread (see gcs_emulator.rs).
    std::env::set_var("STORAGE_EMULATOR_HOST", gcs_emulator::reserve_address());
    let quick = std::env::args().any(|a| a == "--quick");
    let repeats = if quick { 1 } else { 3 };
    let cores = data::default_workers();
    let work = tempfile::tempdir().unwrap();
    let lines = conversations(if quick { 5_000 } else { 20_000 }, 60);
    let local = work.path().join("chat.jsonl");
    std::fs::write(&local, &lines).unwrap();
    let local = local.display().to_string();

    println!(
        "\nSFT pipeline (render the chat template + tokenize + pack), {} MB of JSON Lines, rows of {SEQ}",
        lines.len() >> 20
    );
    println!("| template | workers | tokens | tokens/s |\n|---|---|---|---|");
    for template in ["llama3", "qwen3"] {
        for workers in [1, cores] {
            // Eval's split reads hf_eval_files: point it at the same file.
            let c = cfg(&local, template, SEQ, &[&format!("hf_eval_files={local}"), "eval_interval=1"]);
            let (rate, tokens) = tokens_per_s(&c, workers, repeats);
            println!("| {template} | {workers} | {tokens} | {rate:.0} |");
        }
    }

    println!("\nReading from the GCS emulator vs local disk (llama3 template, {cores} workers)");
    println!("| source | tokens/s |\n|---|---|");
    let c = cfg(&local, "llama3", SEQ, &[&format!("hf_eval_files={local}"), "eval_interval=1"]);
    println!("| local disk | {:.0} |", tokens_per_s(&c, cores, repeats).0);
    match gcs_emulator::start(&["maxrs-bench"]) {
        Some(_) => {
            let remote = "gs://maxrs-bench/chat.jsonl";
            maxrs::storage::write(&Location::parse(remote).unwrap(), lines.as_bytes()).unwrap();
            let c = cfg(remote, "llama3", SEQ, &[&format!("hf_eval_files={remote}"), "eval_interval=1"]);
            println!("| GCS emulator (ranged reads) | {:.0} |", tokens_per_s(&c, cores, repeats).0);
        }
        None => println!("| GCS emulator | (not available) |"),
    }

    println!("\nSFT run: the default model, 200 conversations, completion-only loss, 100 steps");
    let file = work.path().join("train.jsonl");
    std::fs::write(&file, conversations(200, 12)).unwrap();
    let c = cfg(&file.display().to_string(), "llama3", 128, &["steps=100"]);
    let client = client_for(&c).unwrap();
    let t = Instant::now();
    let report = train(&c, &client).unwrap();
    let wall = t.elapsed().as_secs_f64();
    let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len() as f64;
    println!("| first 5 steps' loss | last 5 steps' loss | median step (s) | wall (s) |\n|---|---|---|---|");
    let n = report.losses.len();
    println!(
        "| {:.3} | {:.3} | {:.4} | {wall:.1} |",
        mean(&report.losses[..5]),
        mean(&report.losses[n - 5..]),
        median(report.step_times.clone())
    );
}
