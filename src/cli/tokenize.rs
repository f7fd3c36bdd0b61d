//! `maxrs tokenize INPUT... --output FILE [key=value ...]`: text, JSON Lines or Parquet files (or
//! globs) to a `dataset_type=tokens` file, with the data keys of a training run
//! (`tokenizer_path`, `tokenizer_type`, `add_bos`, `add_eos`, `max_target_length`,
//! `train_data_columns`, `vocab_size`, `model_name`). The output goes through `output::check`
//! before any input is tokenized: never an input or the tokenizer, a device or a FIFO, and an
//! existing file only with `--force`.

use std::path::PathBuf;

use anyhow::{bail, Result};
use maxrs::files::Kind;
use maxrs::files::Location;
use maxrs::output::{self, Input, Output};
use maxrs::{config, data};

/// At most this many tokenizer threads per core: more only adds memory and switching, since
/// tokenizing is bound by the CPU.
const WORKERS_PER_CORE: usize = 4;

#[derive(clap::Args)]
pub struct TokenizeArgs {
    /// The token file to write (it appears when complete).
    #[arg(long, short)]
    output: PathBuf,
    /// Replace the output file if it exists.
    #[arg(long)]
    force: bool,
    /// Tokenizer threads (default: one per core, at most 8; at most 4 per core).
    #[arg(long)]
    workers: Option<usize>,
    /// Input files or globs (quote globs), and key=value settings.
    #[arg(value_name = "INPUT | key=value", required = true)]
    args: Vec<String>,
}

pub fn run(args: TokenizeArgs) -> Result<()> {
    let (settings, inputs): (Vec<String>, Vec<String>) = args.args.into_iter().partition(|a| a.contains('='));
    if inputs.is_empty() {
        bail!("no input files: give text, .jsonl or .parquet files or globs before the key=value settings");
    }
    let c = config::load_over(None, &[], &settings)?;
    let column = match c.train_data_columns.as_slice() {
        [one] => one.clone(),
        other => bail!("train_data_columns={other:?}: give exactly one text column"),
    };
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let workers = args.workers.unwrap_or_else(data::default_workers);
    if !(1..=WORKERS_PER_CORE * cores).contains(&workers) {
        bail!(
            "--workers {workers}: give 1 to {} tokenizer threads ({WORKERS_PER_CORE} per core, {cores} cores here)",
            WORKERS_PER_CORE * cores
        );
    }
    let files = data::prepare::input_files(&inputs)?;
    let mut reads: Vec<Input> =
        files.iter().map(|f| Input { name: "INPUT", location: Location::Local(f.clone()), directory: false }).collect();
    if !c.tokenizer_path.is_empty() && !c.tokenizer_path.contains("://") {
        let location = Location::Local(c.tokenizer_path.clone().into());
        reads.push(Input { name: "tokenizer_path", location, directory: true });
    }
    let write = Output {
        name: "--output",
        location: Location::Local(args.output.clone()),
        kind: Kind::File { force: args.force },
    };
    output::check(&reads, &[write])?;
    let tokenizer = data::load_tokenizer(&c)?;
    println!(
        "tokenizing {} files with {} ({} tokens, BOS {}, EOS {}) on {workers} threads into rows of {} ids",
        files.len(),
        tokenizer.path().display(),
        tokenizer.vocab_size(),
        if c.add_bos { "on" } else { "off" },
        if c.add_eos { "on" } else { "off" },
        c.max_target_length + 1
    );
    let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let summary = data::prepare::tokenize_files(
        files,
        &column,
        tokenizer,
        c.max_target_length as usize,
        &args.output,
        workers,
        progress,
    )?;
    println!("{summary}");
    println!(
        "train on it with: maxrs train dataset_type=tokens dataset_path={} max_target_length={} vocab_size={}",
        args.output.display(),
        c.max_target_length,
        c.vocab_size
    );
    Ok(())
}
