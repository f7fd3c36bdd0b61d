//! Batches of token ids for each train step: `dataset_type=synthetic` and `dataset_type=tokens`.
//!
//! # The batch
//! A [`Batch`] holds MaxText's arrays, all `s32[B, S]` (`B` = this host's rows, `S` =
//! `max_target_length`): `inputs`, `inputs_position` (0..S per row), `inputs_segmentation`,
//! `targets` (the inputs shifted left by one), `targets_segmentation`. A segmentation is 1 on a
//! real token and 0 on padding; the loss is the cross-entropy averaged over the tokens where
//! `targets_segmentation != 0`, which is also MaxText's `total_weights`. maxrs does not pack
//! several documents into a row, so both segmentations are all ones today; they are part of the
//! batch so padding and packing need no new train-step signature.
//!
//! # `dataset_type=tokens`: the token file format
//! A flat file of little-endian `int32` token ids, no header. It is a sequence of rows of
//! exactly `max_target_length + 1` ids; the file size must be a multiple of
//! `4 * (max_target_length + 1)` bytes. For a row `ids`, `inputs = ids[..S]` and
//! `targets = ids[1..]`. Every id must lie in `[0, vocab_size)`. Rows are read in file order:
//! step `k` uses file rows `k * global_batch .. (k + 1) * global_batch`, wrapping around to the
//! first row at the end of the file (logged once). [`write_tokens_file`] writes one; with numpy,
//! `np.asarray(rows, dtype="<i4").tofile(path)` does too.
//!
//! # `dataset_type=synthetic`
//! A learnable sequence, so the loss falls: each row is an arithmetic progression modulo the
//! vocabulary, `x[t] = (a + d * t) mod vocab`, with a start `a` uniform in `[0, vocab)` and a
//! stride `d` uniform in `[1, min(vocab - 1, 8)]`. From the third token on, the next token is
//! determined by the previous two (`x[t+1] = 2 x[t] - x[t-1] mod vocab`). `a` and `d` come from
//! a SplitMix64 stream keyed by (seed, step, global row): reproducible across runs, machines and
//! host counts (each host computes only its own rows, and they equal the single-host rows).
//!
//! # Several hosts
//! [`host_rows`] gives the contiguous block of global-batch rows one process feeds; both sources
//! produce a row from its global index alone, so hosts need not coordinate.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::pjrt::HostTensor;

/// Largest stride of the synthetic progressions: small strides make the next token easy to
/// guess from one token (a few candidates) and exact from two, so even tiny models learn fast.
const SYNTHETIC_MAX_STRIDE: u64 = 8;

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("dataset_type={0}: expected `synthetic` or `tokens`")]
    UnknownDatasetType(String),
    #[error("dataset_type=tokens needs dataset_path=FILE (a flat file of little-endian int32 token ids)")]
    MissingPath,
    #[error("dataset_path={}: {source}", path.display())]
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
        "dataset_path={}: row {row}, position {position}: token id {value} is outside [0, {vocab}) (vocab_size={vocab})",
        path.display()
    )]
    TokenOutOfRange { path: PathBuf, row: u64, position: usize, value: i32, vocab: u32 },
    #[error("vocab_size={0}: the synthetic dataset needs at least 2 tokens")]
    VocabTooSmall(u32),
    #[error("max_target_length=0: a row needs at least one token")]
    ZeroLength,
    #[error("global batch of {global_batch} rows cannot be split evenly over {process_count} processes")]
    UnevenHosts { global_batch: usize, process_count: usize },
    #[error("process_index={process_index} is not below process_count={process_count}")]
    BadProcessIndex { process_index: usize, process_count: usize },
}

/// One step's arrays for one host (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub inputs: HostTensor,
    pub inputs_position: HostTensor,
    pub inputs_segmentation: HostTensor,
    pub targets: HostTensor,
    pub targets_segmentation: HostTensor,
}

impl Batch {
    /// Builds the arrays from rows of `S + 1` ids each.
    fn from_rows(rows: &[Vec<i32>], seq_len: usize) -> Batch {
        let dims = [rows.len() as i64, seq_len as i64];
        let inputs: Vec<i32> = rows.iter().flat_map(|r| r[..seq_len].iter().copied()).collect();
        let targets: Vec<i32> = rows.iter().flat_map(|r| r[1..].iter().copied()).collect();
        let positions: Vec<i32> = rows.iter().flat_map(|_| 0..seq_len as i32).collect();
        let ones = vec![1i32; rows.len() * seq_len];
        Batch {
            inputs: HostTensor::from_i32(&dims, &inputs),
            inputs_position: HostTensor::from_i32(&dims, &positions),
            inputs_segmentation: HostTensor::from_i32(&dims, &ones),
            targets: HostTensor::from_i32(&dims, &targets),
            targets_segmentation: HostTensor::from_i32(&dims, &ones),
        }
    }

    /// The arrays under MaxText's names, in a fixed order.
    pub fn named(&self) -> [(&'static str, &HostTensor); 5] {
        [
            ("inputs", &self.inputs),
            ("inputs_position", &self.inputs_position),
            ("inputs_segmentation", &self.inputs_segmentation),
            ("targets", &self.targets),
            ("targets_segmentation", &self.targets_segmentation),
        ]
    }

    /// Target tokens the loss counts on this host (MaxText's `total_weights`).
    pub fn total_weights(&self) -> u64 {
        self.targets_segmentation.to_i64().iter().filter(|&&v| v != 0).count() as u64
    }
}

/// The rows `process_index` feeds out of a global batch of `global_batch` rows: the
/// `process_index`-th of `process_count` equal contiguous blocks.
pub fn host_rows(global_batch: usize, process_index: usize, process_count: usize) -> Result<Range<usize>, DataError> {
    if process_index >= process_count {
        return Err(DataError::BadProcessIndex { process_index, process_count });
    }
    if !global_batch.is_multiple_of(process_count) {
        return Err(DataError::UnevenHosts { global_batch, process_count });
    }
    let per_host = global_batch / process_count;
    Ok(process_index * per_host..(process_index + 1) * per_host)
}

/// The learnable synthetic sequence (see the module docs).
#[derive(Debug, Clone)]
pub struct Synthetic {
    seed: u64,
    vocab: u32,
    seq_len: usize,
}

impl Synthetic {
    pub fn new(seed: u64, vocab: u32, max_target_length: usize) -> Result<Synthetic, DataError> {
        if vocab < 2 {
            return Err(DataError::VocabTooSmall(vocab));
        }
        if max_target_length == 0 {
            return Err(DataError::ZeroLength);
        }
        Ok(Synthetic { seed, vocab, seq_len: max_target_length })
    }

    /// Row `global_row` of step `step`: `max_target_length + 1` ids.
    pub fn row(&self, step: u64, global_row: u64) -> Vec<i32> {
        let vocab = self.vocab as u64;
        let mut state = mix(mix(self.seed ^ mix(step)) ^ global_row);
        let start = uniform(&mut state, vocab);
        let stride = 1 + uniform(&mut state, SYNTHETIC_MAX_STRIDE.min(vocab - 1));
        (0..=self.seq_len as u64).map(|t| ((start + stride * (t % vocab)) % vocab) as i32).collect()
    }
}

/// SplitMix64's finaliser: a bijective scrambling of 64 bits.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The next SplitMix64 draw, scaled to `[0, n)` (multiply-shift; the bias is below 2^-50 for
/// any vocabulary, irrelevant here).
fn uniform(state: &mut u64, n: u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    ((mix(*state) as u128 * n as u128) >> 64) as u64
}

/// A token file opened for reading rows (format in the module docs).
#[derive(Debug)]
pub struct TokensFile {
    path: PathBuf,
    file: File,
    seq_len: usize,
    vocab: u32,
    num_rows: u64,
}

impl TokensFile {
    /// Opens `path` and checks its size against `max_target_length`; ids are checked as rows
    /// are read, so opening a large file is instant.
    pub fn open(path: &Path, max_target_length: usize, vocab: u32) -> Result<TokensFile, DataError> {
        if max_target_length == 0 {
            return Err(DataError::ZeroLength);
        }
        let io = |source| DataError::Io { path: path.to_owned(), source };
        let file = File::open(path).map_err(io)?;
        let size = file.metadata().map_err(io)?.len();
        // Saturating: an absurd length gives a row no file matches (an error below), not an overflow.
        let row_bytes = 4u64.saturating_mul((max_target_length as u64).saturating_add(1));
        if size % row_bytes != 0 {
            return Err(DataError::RaggedFile { path: path.to_owned(), size, row_bytes, max_target_length });
        }
        if size == 0 {
            return Err(DataError::EmptyFile { path: path.to_owned(), row_len: max_target_length + 1 });
        }
        Ok(TokensFile { path: path.to_owned(), file, seq_len: max_target_length, vocab, num_rows: size / row_bytes })
    }

    pub fn num_rows(&self) -> u64 {
        self.num_rows
    }

    /// File row `index` (`< num_rows`), with every id checked against the vocabulary.
    pub fn row(&mut self, index: u64) -> Result<Vec<i32>, DataError> {
        let row_len = self.seq_len + 1;
        let mut bytes = vec![0u8; 4 * row_len];
        let io = |source| DataError::Io { path: self.path.clone(), source };
        self.file.seek(SeekFrom::Start(index * bytes.len() as u64)).map_err(io)?;
        self.file.read_exact(&mut bytes).map_err(io)?;
        let ids: Vec<i32> = bytes.chunks_exact(4).map(|b| i32::from_le_bytes(b.try_into().unwrap())).collect();
        if let Some((position, &value)) = ids.iter().enumerate().find(|(_, &v)| v < 0 || v as u32 >= self.vocab) {
            return Err(DataError::TokenOutOfRange {
                path: self.path.clone(),
                row: index,
                position,
                value,
                vocab: self.vocab,
            });
        }
        Ok(ids)
    }
}

/// Where a run's tokens come from.
#[derive(Debug)]
pub enum DataSource {
    Synthetic(Synthetic),
    Tokens(TokensFile),
}

impl DataSource {
    /// The source named by `dataset_type` (`synthetic` | `tokens`); `dataset_path` is read only
    /// for `tokens`, `seed` (maxrs uses `data_shuffle_seed`) only for `synthetic`.
    pub fn open(
        dataset_type: &str,
        dataset_path: Option<&Path>,
        seed: u64,
        max_target_length: usize,
        vocab: u32,
    ) -> Result<DataSource, DataError> {
        match dataset_type {
            "synthetic" => Ok(DataSource::Synthetic(Synthetic::new(seed, vocab, max_target_length)?)),
            "tokens" => {
                let path = dataset_path.filter(|p| !p.as_os_str().is_empty()).ok_or(DataError::MissingPath)?;
                Ok(DataSource::Tokens(TokensFile::open(path, max_target_length, vocab)?))
            }
            other => Err(DataError::UnknownDatasetType(other.to_owned())),
        }
    }

    fn seq_len(&self) -> usize {
        match self {
            DataSource::Synthetic(s) => s.seq_len,
            DataSource::Tokens(t) => t.seq_len,
        }
    }
}

/// Produces this host's [`Batch`] for each step.
#[derive(Debug)]
pub struct BatchLoader {
    source: DataSource,
    global_batch: usize,
    rows: Range<usize>,
    wrap_logged: bool,
}

impl BatchLoader {
    /// `global_batch` rows per step over all hosts, of which this process feeds
    /// [`host_rows`]`(global_batch, process_index, process_count)`.
    pub fn new(
        source: DataSource,
        global_batch: usize,
        process_index: usize,
        process_count: usize,
    ) -> Result<BatchLoader, DataError> {
        let rows = host_rows(global_batch, process_index, process_count)?;
        Ok(BatchLoader { source, global_batch, rows, wrap_logged: false })
    }

    /// This host's rows of the global batch.
    pub fn rows(&self) -> Range<usize> {
        self.rows.clone()
    }

    /// The batch of step `step` (0-based); depends only on `step`, so a resumed run sees the
    /// same data as an uninterrupted one.
    pub fn batch(&mut self, step: u64) -> Result<Batch, DataError> {
        let mut rows = Vec::with_capacity(self.rows.len());
        for global_row in self.rows.clone() {
            let index = step * self.global_batch as u64 + global_row as u64;
            rows.push(match &mut self.source {
                DataSource::Synthetic(s) => s.row(step, global_row as u64),
                DataSource::Tokens(t) => {
                    if index >= t.num_rows && !self.wrap_logged {
                        self.wrap_logged = true;
                        tracing::info!(
                            "dataset_path={}: all {} rows used by step {step}; starting again from the first row",
                            t.path.display(),
                            t.num_rows
                        );
                    }
                    t.row(index % t.num_rows)?
                }
            });
        }
        Ok(Batch::from_rows(&rows, self.source.seq_len()))
    }
}

/// Writes rows of token ids in the token file format (all rows must have the same length,
/// `max_target_length + 1`). Replaces an existing file.
pub fn write_tokens_file(path: &Path, rows: &[Vec<i32>]) -> std::io::Result<()> {
    if let Some(first) = rows.first() {
        if let Some((i, row)) = rows.iter().enumerate().find(|(_, r)| r.len() != first.len()) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "{}: row {i} has {} ids, row 0 has {}; all rows need the same length",
                    path.display(),
                    row.len(),
                    first.len()
                ),
            ));
        }
    }
    let mut bytes = Vec::with_capacity(rows.iter().map(|r| 4 * r.len()).sum());
    for id in rows.iter().flatten() {
        bytes.extend_from_slice(&id.to_le_bytes());
    }
    let mut file = File::create(path)?;
    file.write_all(&bytes)
}
