//! Writing local files so that none is left half-written or written by two runs at once:
//! [`write_atomic`] and [`LockedAppend`].

use std::fs::{File, OpenOptions};
use std::io::{Seek, Write};
use std::path::Path;

use anyhow::{anyhow, Context, Result};

use super::{check_output, shown, Kind, Location};

/// Writes `path` whole: `fill` writes the content into a temporary file in the same directory,
/// which is flushed to disk and renamed over `path`. On any error `path` is untouched and the
/// temporary file removed. Missing parent directories are created.
pub fn write_atomic(path: &Path, fill: impl FnOnce(&mut File) -> std::io::Result<()>) -> Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .tempfile_in(dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    // Errors name the file the user asked for, not the temporary one.
    fill(tmp.as_file_mut()).with_context(|| format!("writing {}", path.display()))?;
    // Data must be on disk before the rename makes it visible under the real name.
    tmp.as_file().sync_all().with_context(|| format!("flushing {}", path.display()))?;
    tmp.persist(path).map_err(|e| anyhow!("renaming into {}: {}", path.display(), e.error))?;
    Ok(())
}

/// A file appended to under an exclusive lock held for the writer's lifetime.
pub struct LockedAppend {
    file: File,
    /// `key="path"`, for errors.
    shown: String,
    /// Truncate before the first write (a run starting afresh), not at open: a run that fails
    /// before writing leaves the old content.
    truncate_pending: bool,
}

impl LockedAppend {
    /// Opens (creating it and its directories) and locks `path`, the value of config key `key`.
    /// With `fresh`, the old content is dropped at the first write. Another process holding
    /// the lock is an error naming the key.
    pub fn open(key: &str, path: &Path, fresh: bool) -> Result<LockedAppend> {
        let shown = shown(key, &Location::Local(path.to_owned()));
        if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| anyhow!("{shown}: cannot create {}: {e}", dir.display()))?;
        }
        check_output(&shown, path, Kind::RunFile)?;
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| anyhow!("{shown}: cannot open it for writing: {e}"))?;
        file.try_lock().map_err(|e| match e {
            std::fs::TryLockError::WouldBlock => {
                anyhow!(
                    "{shown} is being written by another run (it holds the file's lock); give this run another path"
                )
            }
            std::fs::TryLockError::Error(e) => anyhow!("{shown}: cannot lock it: {e}"),
        })?;
        Ok(LockedAppend { file, shown, truncate_pending: fresh })
    }

    /// Appends `bytes` in one write call.
    pub fn append(&mut self, bytes: &[u8]) -> Result<()> {
        let fail = |e: std::io::Error| anyhow!("{}: {e}", self.shown);
        if self.truncate_pending {
            self.file.set_len(0).map_err(fail)?;
            self.file.rewind().map_err(fail)?;
            self.truncate_pending = false;
        }
        self.file.write_all(bytes).map_err(fail)
    }

    /// Makes everything appended so far durable.
    pub fn sync(&mut self) -> Result<()> {
        self.file.sync_data().map_err(|e| anyhow!("{}: {e}", self.shown))
    }
}
