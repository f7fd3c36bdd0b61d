//! `dataset_type=tokens`: a flat file of little-endian `int32` token ids, no header, read through
//! a memory map (a corpus may be larger than memory; the OS pages in what is read). A `gs://`
//! file is read row by row with ranged requests through the storage seam (each retried on its
//! own), never copied whole first.
//!
//! The file is a sequence of rows of exactly `max_target_length + 1` ids (its size must be a
//! multiple of `4 * (max_target_length + 1)` bytes); for a row `ids`, `inputs = ids[..S]` and
//! `targets = ids[1..]`. Every id must lie in `[0, vocab_size)`, checked as rows are read.
//! `maxrs tokenize` writes such files; so does `np.asarray(rows, dtype="<i4").tofile(path)`.
//!
//! Order: the global stream of rows is epoch after epoch of the file's `N` rows. With
//! `enable_data_shuffling` (the default) epoch `e` visits them in the order of a seeded
//! permutation keyed by (`data_shuffle_seed`, `e`), a new order each epoch; without it, in file
//! order. Step `k` takes the stream's rows `k * G .. (k + 1) * G` (`G` = global batch), and
//! each process the contiguous block of them it feeds, so every row is read exactly once per
//! epoch whatever the process count. The iterator's state is the stream position.

use std::fs::File;
use std::io::Write;
use std::ops::Range;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::files::Location;
use crate::storage;

use super::batch::Batch;
use super::error::DataError;
use super::shuffle::{key, Permutation};
use super::DataState;

/// A token file opened for reading rows (format in the module docs).
#[derive(Debug)]
pub struct TokensFile {
    path: PathBuf,
    bytes: Bytes,
    seq_len: usize,
    vocab: u32,
    num_rows: u64,
}

/// Where the rows' bytes are.
#[derive(Debug)]
enum Bytes {
    Map(Mmap),
    Remote(Location),
}

impl TokensFile {
    /// [`TokensFile::open`] for a local path or a `gs://` location (`dataset_path`).
    pub fn open_at(dataset_path: &str, max_target_length: usize, vocab: u32) -> Result<TokensFile, DataError> {
        if !dataset_path.starts_with("gs://") {
            return TokensFile::open(Path::new(dataset_path), max_target_length, vocab);
        }
        let remote = |e: anyhow::Error| DataError::Remote { key: "dataset_path", message: format!("{e:#}") };
        let at = Location::parse(dataset_path).map_err(remote)?;
        let size = storage::file_size(&at).map_err(remote)?;
        let (row_bytes, num_rows) = check_size(Path::new(dataset_path), size, max_target_length)?;
        debug_assert!(row_bytes > 0);
        let path = PathBuf::from(dataset_path);
        Ok(TokensFile { path, bytes: Bytes::Remote(at), seq_len: max_target_length, vocab, num_rows })
    }

    /// Maps `path` and checks its size against `max_target_length`; ids are checked as rows
    /// are read, so opening a large file is instant.
    pub fn open(path: &Path, max_target_length: usize, vocab: u32) -> Result<TokensFile, DataError> {
        if max_target_length == 0 {
            return Err(DataError::ZeroLength);
        }
        let file = crate::input::open("dataset_path", path)?;
        let size = file.metadata().map_err(|e| DataError::io(path, e))?.len();
        let (_, num_rows) = check_size(path, size, max_target_length)?;
        // SAFETY: the map is read-only and lives as long as `self`. Another process truncating
        // the file while it is mapped would make reads fault (SIGBUS); token files are written
        // once (atomically by `maxrs tokenize`) and only read afterwards, which is the contract
        // the module docs state.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| DataError::io(path, e))?;
        Ok(TokensFile { path: path.to_owned(), bytes: Bytes::Map(map), seq_len: max_target_length, vocab, num_rows })
    }

    pub fn num_rows(&self) -> u64 {
        self.num_rows
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// File row `index` (`< num_rows`), with every id checked against the vocabulary.
    pub fn row(&self, index: u64) -> Result<Vec<i32>, DataError> {
        let row_len = self.seq_len + 1;
        let start = index as usize * 4 * row_len;
        let fetched;
        let bytes = match &self.bytes {
            Bytes::Map(map) => &map[start..start + 4 * row_len],
            Bytes::Remote(at) => {
                fetched = storage::read_range(at, start as u64, 4 * row_len as u64)
                    .map_err(|e| DataError::Remote { key: "dataset_path", message: format!("{e:#}") })?;
                if fetched.len() != 4 * row_len {
                    let message = format!("{at}: row {index} is cut short (the file changed while read?)");
                    return Err(DataError::Remote { key: "dataset_path", message });
                }
                &fetched[..]
            }
        };
        let ids: Vec<i32> = bytes.chunks_exact(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        if let Some((position, &value)) = ids.iter().enumerate().find(|(_, &v)| v < 0 || v as u32 >= self.vocab) {
            return Err(DataError::TokenOutOfRange {
                path: self.path.clone(),
                row: index,
                position,
                value: value as i64,
                vocab: self.vocab,
            });
        }
        Ok(ids)
    }
}

/// Checks a token file's size against the row length: `(row bytes, rows)`.
fn check_size(path: &Path, size: u64, max_target_length: usize) -> Result<(u64, u64), DataError> {
    // Saturating: an absurd length gives a row no file matches (an error below), not an overflow.
    let row_bytes = 4u64.saturating_mul((max_target_length as u64).saturating_add(1));
    if !size.is_multiple_of(row_bytes) {
        return Err(DataError::RaggedFile { path: path.to_owned(), size, row_bytes, max_target_length });
    }
    if size == 0 {
        return Err(DataError::EmptyFile { path: path.to_owned(), row_len: max_target_length.saturating_add(1) });
    }
    Ok((row_bytes, size / row_bytes))
}

/// This host's batches from a token file (order and sharding in the module docs).
#[derive(Debug)]
pub struct TokensBatches {
    file: TokensFile,
    global_batch: usize,
    rows: Range<usize>,
    shuffle_seed: Option<u64>,
    /// Rows of the global stream consumed by all processes so far.
    position: u64,
    wrap_logged: bool,
}

impl TokensBatches {
    /// `shuffle_seed` is `Some(data_shuffle_seed)` with shuffling on; `position` resumes a stream.
    pub fn new(
        file: TokensFile,
        global_batch: usize,
        rows: Range<usize>,
        shuffle_seed: Option<u64>,
        position: u64,
    ) -> TokensBatches {
        TokensBatches { file, global_batch, rows, shuffle_seed, position, wrap_logged: false }
    }

    /// File row of stream position `q`.
    pub fn file_row(&self, q: u64) -> u64 {
        let n = self.file.num_rows;
        let (epoch, i) = (q / n, q % n);
        match self.shuffle_seed {
            Some(seed) => Permutation::new(n, key(&[seed, epoch])).apply(i),
            None => i,
        }
    }

    pub fn next_batch(&mut self) -> Result<Batch, DataError> {
        let mut rows = Vec::with_capacity(self.rows.len());
        for r in self.rows.clone() {
            let q = self.position + r as u64;
            if q >= self.file.num_rows && !self.wrap_logged {
                self.wrap_logged = true;
                tracing::info!(
                    "dataset_path={}: all {} rows used; starting epoch {} in a new order",
                    self.file.path.display(),
                    self.file.num_rows,
                    q / self.file.num_rows
                );
            }
            rows.push(self.file.row(self.file_row(q))?);
        }
        self.position += self.global_batch as u64;
        Ok(Batch::from_sequences(&rows, self.file.seq_len))
    }

    pub fn state(&self) -> DataState {
        DataState::Tokens { position: self.position }
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
