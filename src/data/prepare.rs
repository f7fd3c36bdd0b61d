//! `maxrs tokenize`: text, JSON Lines and Parquet files to the `tokens` format, once, for corpora
//! trained on many times. The documents are read in file order and tokenized by the same
//! background workers and tokenizer rules as `dataset_type=hf` (BOS/EOS per `add_bos` /
//! `add_eos`, no truncation), then concatenated and cut into rows of `max_target_length + 1`
//! ids: the token format has no segment ids, so a row may span documents (their BOS/EOS mark
//! the boundaries). The incomplete last row is dropped and reported; inputs too short for one
//! row are an error. The output appears under its name only when complete
//! (`files::write_atomic`).

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};

use super::error::DataError;
use super::storage::{LocalFiles, Storage};
use super::text::{TextSpec, TextState, TokenizedDocs};
use super::tokenizer::TextTokenizer;

/// What a conversion did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenizeSummary {
    pub files: usize,
    pub documents: u64,
    pub undecodable: u64,
    pub tokens: u64,
    pub rows: u64,
    /// Tokens of the incomplete last row, not written.
    pub dropped_tokens: u64,
    pub seconds: f64,
}

impl std::fmt::Display for TokenizeSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} files, {} documents ({} undecodable, skipped), {} tokens in {:.2} s ({:.0} tokens/s): {} rows written, \
             {} tokens of the incomplete last row dropped",
            self.files,
            self.documents,
            self.undecodable,
            self.tokens,
            self.seconds,
            self.tokens as f64 / self.seconds.max(1e-9),
            self.rows,
            self.dropped_tokens
        )
    }
}

/// The files matching each input (a file or a glob), sorted and without repeats.
pub fn input_files(inputs: &[String]) -> Result<Vec<PathBuf>, DataError> {
    let mut files = Vec::new();
    for input in inputs {
        // `maxrs tokenize` reads local files (training reads gs:// datasets directly).
        if let Some(rest) = input.strip_prefix("gs://") {
            return Err(DataError::RemoteNotSupported { what: "INPUT".into(), rest: rest.into() });
        }
        files.extend(LocalFiles.glob("INPUT", input)?);
    }
    files.sort();
    files.dedup();
    for file in &files {
        super::documents::Format::of(file)?;
    }
    Ok(files)
}

/// Converts `files` (column `column`) to a token file at `output` with rows of `seq_len + 1` ids.
/// `output` is replaced only when complete; the caller has checked it (`output::check`).
pub fn tokenize_files(
    files: Vec<PathBuf>,
    column: &str,
    tokenizer: Arc<TextTokenizer>,
    seq_len: usize,
    output: &Path,
    workers: usize,
    show_progress: bool,
) -> anyhow::Result<TokenizeSummary> {
    let started = Instant::now();
    let storage: Arc<dyn Storage> = Arc::new(LocalFiles);
    super::documents::check_files(storage.as_ref(), &files, column)?;
    let mut summary = TokenizeSummary { files: files.len(), ..TokenizeSummary::default() };
    let spec = TextSpec {
        files,
        column: column.to_string(),
        sft: None,
        pairs: None,
        storage,
        tokenizer,
        max_doc_len: usize::MAX,
        shuffle_seed: None,
        process_index: 0,
        process_count: 1,
        repeat: false,
        workers,
    };
    let bar = if show_progress { ProgressBar::new_spinner() } else { ProgressBar::hidden() };
    bar.set_style(ProgressStyle::with_template("{spinner} {msg} [{elapsed}]").expect("a valid template"));
    let row_len = seq_len + 1;
    let mut pending: Vec<i32> = Vec::with_capacity(2 * row_len);
    crate::files::write_atomic(output, |file| {
        let mut writer = BufWriter::with_capacity(1 << 20, &*file);
        let mut docs = TokenizedDocs::start(&spec, TextState::default()).map_err(std::io::Error::other)?;
        while let Some((_, ids)) = docs.next_doc().map_err(std::io::Error::other)? {
            let Some(super::packing::Encoded { ids, .. }) = ids else {
                summary.undecodable += 1;
                continue;
            };
            summary.documents += 1;
            summary.tokens += ids.len() as u64;
            pending.extend_from_slice(&ids);
            let full = pending.len() / row_len * row_len;
            if full > 0 {
                let bytes: Vec<u8> = pending[..full].iter().flat_map(|id| id.to_le_bytes()).collect();
                writer.write_all(&bytes)?;
                summary.rows += (full / row_len) as u64;
                pending.drain(..full);
            }
            if summary.documents.is_multiple_of(1024) {
                let rate = summary.tokens as f64 / started.elapsed().as_secs_f64().max(1e-9);
                bar.set_message(format!(
                    "{} documents, {} tokens, {rate:.0} tokens/s",
                    summary.documents, summary.tokens
                ));
            }
        }
        bar.finish_and_clear();
        if summary.rows == 0 {
            // An empty token file trains nothing and `dataset_type=tokens` refuses it: say why here.
            return Err(std::io::Error::other(DataError::NoRows {
                first: spec.files[0].clone(),
                files: spec.files.len(),
                documents: summary.documents,
                undecodable: summary.undecodable,
                tokens: summary.tokens,
                row_len,
            }));
        }
        writer.flush()?;
        drop(writer);
        // A temporary file is private (0600); the token file is an ordinary one.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            file.set_permissions(std::fs::Permissions::from_mode(0o644))?;
        }
        Ok(())
    })?;
    summary.dropped_tokens = pending.len() as u64;
    summary.seconds = started.elapsed().as_secs_f64();
    Ok(summary)
}
