//! `maxrs tokenize INPUT... --output FILE [key=value ...]`: text, JSON Lines or Parquet files (or
//! globs) to a `dataset_type=tokens` file, with the data keys of a training run
//! (`tokenizer_path`, `tokenizer_type`, `add_bos`, `add_eos`, `max_target_length`,
//! `train_data_columns`, `vocab_size`, `model_name`).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use maxrs::{config, data};

#[derive(clap::Args)]
pub struct TokenizeArgs {
    /// The token file to write (replaced when complete).
    #[arg(long, short)]
    output: PathBuf,
    /// Tokenizer threads (default: one per core, at most 8).
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
    let c = config::load(None, &settings)?;
    let column = match c.train_data_columns.as_slice() {
        [one] => one.clone(),
        other => bail!("train_data_columns={other:?}: give exactly one text column"),
    };
    let files = data::prepare::input_files(&inputs)?;
    let tokenizer = data::load_tokenizer(&c)?;
    let workers = args.workers.unwrap_or_else(data::default_workers).max(1);
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
    )
    .with_context(|| format!("writing {}", args.output.display()))?;
    println!("{summary}");
    println!(
        "train on it with: maxrs train dataset_type=tokens dataset_path={} max_target_length={} vocab_size={}",
        args.output.display(),
        c.max_target_length,
        c.vocab_size
    );
    Ok(())
}
