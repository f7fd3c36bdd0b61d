//! Where the pipeline's files live. [`Storage`] is the small seam between the readers and a
//! file system: expand a glob into a sorted file list, and open one file. [`storage_for`] picks
//! the implementation by the path's scheme: local paths are served by [`LocalFiles`]; `gs://`
//! paths by [`GcsFiles`], through the one storage seam ([`crate::storage`]): a glob lists the
//! bucket under the pattern's literal prefix, and a file is read in ranges while the pipeline
//! consumes it (JSON Lines and text in [`storage::RANGE_CHUNK`] chunks, Parquet its footer and
//! then each row group's column chunks), each range retried on its own when a connection breaks,
//! never downloaded whole first. Every local file is checked to be a regular file before it is
//! read ([`crate::input`]): a FIFO, device or symlink loop is named for what it is. A Hub
//! dataset (`hf_path=org/name`) is [`super::hub::HubFiles`]; [`Typed`] reads every file of
//! another storage in the one format `hf_path` names.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use super::documents::Format;
use super::error::DataError;
use super::hub::HubFile;
use crate::files::Location;
use crate::input;
use crate::storage;

/// A file opened for reading.
pub enum DataFile {
    Local(File),
    /// A remote file: read in ranges on demand.
    Remote(RemoteFile),
    /// A file of a Hub dataset: streamed, or read in ranges (Parquet).
    Hub(HubFile),
}

impl DataFile {
    /// A sequential reader from its start.
    pub fn reader(self) -> Box<dyn Read + Send> {
        match self {
            DataFile::Local(file) => Box::new(file),
            DataFile::Remote(remote) => Box::new(storage::RangeReader::new(remote.location, 0)),
            DataFile::Hub(hub) => hub.reader(),
        }
    }
}

/// A remote file and its size, for ranged reads (Parquet's [`parquet::file::reader::ChunkReader`]).
#[derive(Clone, Debug)]
pub struct RemoteFile {
    pub location: Location,
    pub size: u64,
}

impl parquet::file::reader::Length for RemoteFile {
    fn len(&self) -> u64 {
        self.size
    }
}

impl parquet::file::reader::ChunkReader for RemoteFile {
    type T = storage::RangeReader;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        Ok(storage::RangeReader::new(self.location.clone(), start))
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<bytes::Bytes> {
        let bytes = storage::read_range(&self.location, start, length as u64)
            .map_err(|e| parquet::errors::ParquetError::External(e.into()))?;
        if bytes.len() != length {
            return Err(parquet::errors::ParquetError::EOF(format!(
                "{}: {} bytes at {start}, the file ends after {}",
                self.location,
                length,
                bytes.len()
            )));
        }
        Ok(bytes.into())
    }
}

/// A file system the readers can list and open.
pub trait Storage: Send + Sync {
    /// The files matching `pattern` (a path or a glob: `*`, `?`, `[...]`, `**`), sorted, so every
    /// process sees the same list. `key` names the config key for errors.
    fn glob(&self, key: &'static str, pattern: &str) -> Result<Vec<PathBuf>, DataError>;
    /// Opens one file for reading.
    fn open(&self, path: &Path) -> Result<DataFile, DataError>;
    /// The format `path` is read in: by default the one its name says.
    fn format(&self, path: &Path) -> Result<Format, DataError> {
        Format::of(path)
    }
}

/// Another storage's files, all read in one format whatever their names (`hf_path=json`, ...).
pub struct Typed {
    pub inner: Box<dyn Storage>,
    pub format: Format,
}

impl Storage for Typed {
    fn glob(&self, key: &'static str, pattern: &str) -> Result<Vec<PathBuf>, DataError> {
        self.inner.glob(key, pattern)
    }

    fn open(&self, path: &Path) -> Result<DataFile, DataError> {
        self.inner.open(path)
    }

    fn format(&self, _: &Path) -> Result<Format, DataError> {
        Ok(self.format)
    }
}

/// The local file system.
#[derive(Clone, Copy, Debug, Default)]
pub struct LocalFiles;

impl Storage for LocalFiles {
    fn glob(&self, key: &'static str, pattern: &str) -> Result<Vec<PathBuf>, DataError> {
        let expanded = expand_home(pattern);
        if !expanded.contains(['*', '?', '[']) {
            // One path: say what it is when it is not a file, rather than "matches no file".
            let path = PathBuf::from(expanded);
            return match input::check(key, &path) {
                Ok(_) => Ok(vec![path]),
                Err(e) if e.is_directory() => Err(DataError::Directory { key, path }),
                Err(e) => Err(e.into()),
            };
        }
        let bad = |message: String| DataError::BadGlob { key, pattern: pattern.to_string(), message };
        let (mut files, mut dirs) = (Vec::new(), Vec::new());
        for entry in glob::glob(&expanded).map_err(|e| bad(e.to_string()))? {
            let path = entry.map_err(|e| bad(e.to_string()))?;
            match input::check(key, &path) {
                Ok(_) => files.push(path),
                // `data/**` matches the folders beside the files.
                Err(e) if e.is_directory() => dirs.push(path),
                Err(e) => {
                    let problem = e.into_problem();
                    return Err(DataError::GlobMatch { key, pattern: pattern.to_string(), path, problem });
                }
            }
        }
        files.sort();
        if files.is_empty() {
            return Err(match dirs.into_iter().min() {
                Some(first) => DataError::OnlyDirectories { key, pattern: pattern.to_string(), first },
                None => DataError::EmptyGlob { key, pattern: pattern.to_string() },
            });
        }
        Ok(files)
    }

    fn open(&self, path: &Path) -> Result<DataFile, DataError> {
        Ok(DataFile::Local(input::open("data file", path)?))
    }
}

/// `~/` at the start of a pattern means the home directory, as in a shell (quotes around a glob
/// on the command line keep the shell from expanding it).
fn expand_home(pattern: &str) -> String {
    match (pattern.strip_prefix("~/"), dirs::home_dir()) {
        (Some(rest), Some(home)) => home.join(rest).display().to_string(),
        _ => pattern.to_string(),
    }
}

/// Every file under the folder `dir` (the value of `key`), as relative `/`-separated paths.
pub fn local_listing(key: &'static str, dir: &Path) -> Result<Vec<String>, DataError> {
    let dir = PathBuf::from(expand_home(&dir.to_string_lossy()));
    if !dir.is_dir() {
        return Err(DataError::Invalid(format!("{key}={}: not a folder", dir.display())));
    }
    let mut out = Vec::new();
    let mut pending = vec![dir.clone()];
    while let Some(folder) = pending.pop() {
        for entry in std::fs::read_dir(&folder).map_err(|e| DataError::io(&folder, e))? {
            let path = entry.map_err(|e| DataError::io(&folder, e))?.path();
            if path.is_dir() {
                pending.push(path);
            } else if let Ok(relative) = path.strip_prefix(&dir) {
                out.push(relative.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// `gs://` buckets (their files are named by `gs://bucket/key` paths).
#[derive(Clone, Copy, Debug, Default)]
pub struct GcsFiles;

fn location(key: &str, text: &str) -> Result<Location, DataError> {
    Location::parse(text).map_err(|e| DataError::Invalid(format!("{key}={text:?}: {e:#}")))
}

/// The whole file `path` (the value of `key`), local or `gs://`, refused past `limit` bytes: the
/// small files the pipeline reads whole (a chat template, a mixture file).
pub fn read_whole(key: &'static str, path: &str, limit: input::Limit) -> Result<Vec<u8>, DataError> {
    match location(key, path)? {
        Location::Local(local) => Ok(input::read(key, &local, limit)?),
        remote => storage::read(&remote, limit).map_err(|e| DataError::Remote { key, message: format!("{e:#}") }),
    }
}

impl Storage for GcsFiles {
    fn glob(&self, key: &'static str, pattern: &str) -> Result<Vec<PathBuf>, DataError> {
        let remote = |e: anyhow::Error| DataError::Remote { key, message: format!("{e:#}") };
        if !pattern.contains(['*', '?', '[']) {
            let at = location(key, pattern)?;
            storage::file_size(&at).map_err(remote)?;
            return Ok(vec![PathBuf::from(pattern)]);
        }
        let bad = |message: String| DataError::BadGlob { key, pattern: pattern.to_string(), message };
        let matcher = glob::Pattern::new(pattern).map_err(|e| bad(e.to_string()))?;
        // List under the literal part before the first wildcard's folder.
        let literal = &pattern[..pattern.find(['*', '?', '[']).unwrap_or(pattern.len())];
        let folder = &literal[..literal.rfind('/').map_or(literal.len(), |i| i + 1)];
        let options = glob::MatchOptions { require_literal_separator: true, ..Default::default() };
        let files: Vec<PathBuf> = storage::list_files(&location(key, folder.trim_end_matches('/'))?)
            .map_err(remote)?
            .into_iter()
            .map(|l| l.to_string())
            .filter(|name| matcher.matches_with(name, options))
            .map(PathBuf::from)
            .collect();
        if files.is_empty() {
            return Err(DataError::EmptyGlob { key, pattern: pattern.to_string() });
        }
        Ok(files)
    }

    fn open(&self, path: &Path) -> Result<DataFile, DataError> {
        let text = path.to_string_lossy();
        let at = location("data file", &text)?;
        let size =
            storage::file_size(&at).map_err(|e| DataError::Remote { key: "data file", message: format!("{e:#}") })?;
        Ok(DataFile::Remote(RemoteFile { location: at, size }))
    }
}

/// The storage that serves `path`: `gs://` or local.
pub fn storage_for(path: &str) -> Box<dyn Storage> {
    if path.starts_with("gs://") {
        Box::new(GcsFiles)
    } else {
        Box::new(LocalFiles)
    }
}
