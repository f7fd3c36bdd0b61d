//! The input pipeline's errors: each names the file, key or value at fault and what would be valid.

use std::path::PathBuf;

use super::documents::Format;
use crate::input::{InputError, Problem};

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("dataset_type=tokens needs dataset_path=FILE (a flat file of little-endian int32 token ids)")]
    MissingPath,
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error(
        "dataset_path={}: size {size} bytes is not a multiple of the row size {row_bytes} bytes \
         ((max_target_length {max_target_length} + 1) int32 ids of 4 bytes)",
        path.display()
    )]
    RaggedFile { path: PathBuf, size: u64, row_bytes: u64, max_target_length: usize },
    #[error("dataset_path={}: the file is empty; it needs at least one row of {row_len} int32 ids", path.display())]
    EmptyFile { path: PathBuf, row_len: usize },
    #[error(
        "{}: row {row}, position {position}: token id {value} is outside [0, {vocab}) (vocab_size={vocab})",
        path.display()
    )]
    TokenOutOfRange { path: PathBuf, row: u64, position: usize, value: i64, vocab: u32 },
    #[error("vocab_size={0}: the synthetic dataset needs at least 2 tokens")]
    VocabTooSmall(u32),
    #[error("max_target_length=0: a row needs at least one token")]
    ZeroLength,
    #[error("global batch of {global_batch} rows cannot be split evenly over {process_count} processes")]
    UnevenHosts { global_batch: usize, process_count: usize },
    #[error("process_index={process_index} is not below process_count={process_count}")]
    BadProcessIndex { process_index: usize, process_count: usize },

    #[error("{key} is empty: dataset_type=hf needs a file or glob of Parquet, JSON Lines or text files")]
    NoFilesKey { key: &'static str },
    #[error("{key}={pattern}: {message}")]
    BadGlob { key: &'static str, pattern: String, message: String },
    #[error("{key}={value:?}: {message}")]
    BadMixture { key: &'static str, value: String, message: String },
    #[error("{key}={pattern} matches no file")]
    EmptyGlob { key: &'static str, pattern: String },
    #[error("{key}={} is a directory: give FILES or a glob like {}/*.jsonl", quoted(path), path.display())]
    Directory { key: &'static str, path: PathBuf },
    #[error(
        "{key}={pattern:?} matches only directories ({}): give FILES or a glob like {}/*.jsonl",
        quoted(first), first.display()
    )]
    OnlyDirectories { key: &'static str, pattern: String, first: PathBuf },
    #[error("{key}={pattern:?} matches {}, which {problem}", quoted(path))]
    GlobMatch { key: &'static str, pattern: String, path: PathBuf, problem: Problem },
    /// A file that cannot be opened as a regular file (a FIFO, a device, a symlink loop, ...).
    #[error(transparent)]
    Input(#[from] InputError),
    #[error(
        "{} holds a JSON array, not JSON Lines: dataset_type=hf reads one JSON object per line \
         (convert it with `jq -c '.[]'`, or read it with hf_path=json)",
        quoted(path)
    )]
    JsonArray { path: PathBuf },
    #[error("{}", no_text(path, *format, column, *rows, first_problem, *other_files))]
    NoText { path: PathBuf, format: Format, column: String, rows: u64, first_problem: String, other_files: usize },
    #[error(
        "{}: unknown file type; expected .parquet, .jsonl / .json (JSON Lines, optionally .gz) or .txt / .md (text)",
        path.display()
    )]
    UnknownFormat { path: PathBuf },
    #[error("{}: no column `{column}` (train_data_columns); the columns there are: {}", path.display(), available.join(", "))]
    NoColumn { path: PathBuf, column: String, available: Vec<String> },
    #[error("{}: column `{column}` holds {found}, not text; pick a string column with train_data_columns", path.display())]
    NotText { path: PathBuf, column: String, found: String },
    #[error("{}: not a readable Parquet file: {message}", path.display())]
    CorruptParquet { path: PathBuf, message: String },
    #[error(
        "{what} gs://{rest}: gs:// paths are not supported yet by the input pipeline; copy the files to a local disk"
    )]
    RemoteNotSupported { what: String, rest: String },

    #[error("{key}: {message}")]
    Remote { key: &'static str, message: String },

    #[error("tokenizer_path is empty: dataset_type={dataset_type} tokenizes text and needs a tokenizer (a SentencePiece .model, or a tokenizer.json / its folder with tokenizer_type=huggingface)")]
    NoTokenizer { dataset_type: String },
    #[error("tokenizer_path={}: {message}", path.display())]
    Tokenizer { path: PathBuf, message: String },
    #[error(
        "tokenizer_path={}: the tokenizer has {tokenizer} tokens but the model's vocab_size is {vocab}; \
         use a model with vocab_size >= {tokenizer} (e.g. vocab_size={tokenizer}) or a smaller tokenizer",
        path.display()
    )]
    VocabMismatch { path: PathBuf, tokenizer: usize, vocab: usize },

    #[error(
        "input {}{}: {documents} documents ({undecodable} more undecodable) hold {tokens} tokens, fewer than one \
         row of {row_len} ids (max_target_length + 1): nothing was written",
        quoted(first),
        match files { 1 => String::new(), n => format!(" and {} more files", n - 1) }
    )]
    NoRows { first: PathBuf, files: usize, documents: u64, undecodable: u64, tokens: u64, row_len: usize },
    #[error(
        "epoch {epoch} gave this process (index {process_index} of {process_count}) {rows} rows and none of them \
         a document with tokens ({undecodable} could not be decoded, the others tokenized to nothing)"
    )]
    NoDocuments { epoch: u64, process_index: usize, process_count: usize, rows: u64, undecodable: u64 },

    #[error("data iterator state: {0}")]
    BadState(String),
    /// A setting or file the message itself names (`train_data_columns=...: ...`).
    #[error("{0}")]
    Invalid(String),
    /// A chat template that cannot be loaded or cannot render a conversation; `origin` names
    /// where it came from (`chat_template_path="t.jinja"`).
    #[error("chat template {origin}: {message}")]
    Template { origin: String, message: String },
    #[error("the input pipeline's background worker stopped: {0}")]
    Worker(String),
    #[error(
        "cannot start the input pipeline's {what} thread ({source}): the machine's limit on threads is reached \
         (ulimit -u, the container's pids.max)"
    )]
    Spawn { what: String, source: std::io::Error },
    #[error(
        "no target token of the first {batches} batches ({rows} rows of max_target_length={seq}) carries loss, so \
         training would learn nothing: {cause}"
    )]
    NoLossTokens { batches: usize, rows: usize, seq: usize, cause: String },
}

/// A path in an error, quoted with its control characters escaped.
fn quoted(path: &std::path::Path) -> String {
    format!("{path:?}")
}

/// "no valid JSON line with a `text` field in FILE: line 1: ..." for files without a usable row.
fn no_text(path: &std::path::Path, format: Format, column: &str, rows: u64, first: &str, others: usize) -> String {
    let file = quoted(path);
    let nor = match others {
        0 => String::new(),
        1 => " (nor has the other file)".to_string(),
        n => format!(" (nor have the other {n} files)"),
    };
    let (unit, what) = match format {
        Format::JsonLines | Format::Json => {
            ("JSON lines", format!("no valid JSON line with a `{column}` field in {file}"))
        }
        Format::Parquet => ("rows", format!("no row with text in column `{column}` of {file}")),
        Format::Text => ("paragraphs", format!("no paragraph of UTF-8 text in {file}")),
        Format::Lines => ("lines", format!("no line of UTF-8 text in {file}")),
        Format::Csv { .. } | Format::Arrow => ("rows", format!("no row with text in column `{column}` of {file}")),
    };
    if rows == 0 {
        return format!("{file} is empty: it has no {unit}{nor}");
    }
    format!("{what}{nor}: {first}")
}

impl DataError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> DataError {
        DataError::Io { path: path.into(), source }
    }
}
