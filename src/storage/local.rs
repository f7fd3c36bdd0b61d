//! Local files: every write through [`crate::files::AtomicFile`] (temporary sibling + fsync +
//! rename + directory fsync), and directory fsyncs so that a committed directory's rename
//! survives a power loss.

use std::fs;
use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::{anyhow, Result};

use super::Entry;
use crate::files::{sync_dir, AtomicFile};

pub(super) fn create_dir_all(path: &Path) -> Result<()> {
    fs::create_dir_all(path).map_err(|e| anyhow!("cannot create directory {}: {e}", path.display()))
}

/// A file written whole ([`AtomicFile`]), buffered.
pub(super) struct FileWriter {
    file: BufWriter<AtomicFile>,
    written: u64,
}

impl FileWriter {
    pub(super) fn create(target: &Path) -> Result<FileWriter> {
        Ok(FileWriter { file: BufWriter::with_capacity(1 << 20, AtomicFile::create(target)?), written: 0 })
    }

    pub(super) fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    pub(super) fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }

    pub(super) fn finish(self) -> Result<u64> {
        let target = self.file.get_ref().path().display().to_string();
        let file = self.file.into_inner().map_err(|e| anyhow!("writing {target}: {}", e.error()))?;
        file.commit()?;
        Ok(self.written)
    }
}

pub(super) fn list_dir(path: &Path) -> Result<Vec<Entry>> {
    let entries = match fs::read_dir(path) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(anyhow!("cannot list {}: {e}", path.display())),
    };
    entries
        .map(|entry| {
            let entry = entry.map_err(|e| anyhow!("cannot list {}: {e}", path.display()))?;
            let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
            Ok(Entry { name: entry.file_name().to_string_lossy().into_owned(), is_dir })
        })
        .collect()
}

pub(super) fn remove_all(path: &Path) -> Result<()> {
    let result = match fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => Err(e),
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
    };
    result.map_err(|e| anyhow!("cannot delete {}: {e}", path.display()))
}

/// Renames the finished staging directory over nothing at `target`, with the syncs that make
/// the rename durable.
pub(super) fn commit_dir(staging: &Path, target: &Path) -> Result<()> {
    sync_dir(staging)?;
    fs::rename(staging, target)
        .map_err(|e| anyhow!("cannot rename {} to {}: {e}", staging.display(), target.display()))?;
    if let Some(parent) = target.parent().filter(|p| !p.as_os_str().is_empty()) {
        sync_dir(parent)?;
    }
    Ok(())
}
