//! Where the pipeline's files live. [`Storage`] is the small seam between the readers and a
//! file system: expand a glob into a sorted file list, and open one file. [`storage_for`] picks
//! the implementation by the path's scheme: local paths are served by [`LocalFiles`]; `gs://`
//! is refused as "not supported yet" until the object-store seam (planned for checkpoints) can
//! serve it here too. Every file is checked to be a regular file before it is read
//! ([`crate::input`]): a FIFO, device or symlink loop is named for what it is.

use std::fs::File;
use std::path::{Path, PathBuf};

use super::error::DataError;
use crate::input;

/// A file system the readers can list and open.
pub trait Storage: Send + Sync {
    /// The files matching `pattern` (a path or a glob: `*`, `?`, `[...]`, `**`), sorted, so every
    /// process sees the same list. `key` names the config key for errors.
    fn glob(&self, key: &'static str, pattern: &str) -> Result<Vec<PathBuf>, DataError>;
    /// Opens one file for reading.
    fn open(&self, path: &Path) -> Result<File, DataError>;
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

    fn open(&self, path: &Path) -> Result<File, DataError> {
        Ok(input::open("data file", path)?)
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

/// The storage that serves `path`; `what` names the key for errors.
pub fn storage_for(what: &str, path: &str) -> Result<Box<dyn Storage>, DataError> {
    match path.strip_prefix("gs://") {
        Some(rest) => Err(DataError::RemoteNotSupported { what: what.to_string(), rest: rest.to_string() }),
        None => Ok(Box::new(LocalFiles)),
    }
}
