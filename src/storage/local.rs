//! Local files: temporary sibling + fsync + rename for every write, and directory fsyncs so a
//! rename survives a power loss.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{anyhow, Result};

use super::Entry;

/// Distinguishes temporary files of concurrent writers in one process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

pub(super) fn create_dir_all(path: &Path) -> Result<()> {
    fs::create_dir_all(path).map_err(|e| anyhow!("cannot create directory {}: {e}", path.display()))
}

/// Flushes a directory's entries (a rename or a new file in it) to disk.
fn sync_dir(path: &Path) -> Result<()> {
    File::open(path).and_then(|d| d.sync_all()).map_err(|e| anyhow!("cannot sync directory {}: {e}", path.display()))
}

/// A file written under a temporary name in its final directory.
pub(super) struct FileWriter {
    temp: PathBuf,
    target: PathBuf,
    file: Option<BufWriter<File>>,
    written: u64,
}

impl FileWriter {
    pub(super) fn create(target: &Path) -> Result<FileWriter> {
        let dir = target.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        create_dir_all(dir)?;
        let name = target.file_name().ok_or_else(|| anyhow!("{}: names no file", target.display()))?;
        let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let temp = dir.join(format!(".{}.tmp-{}-{n}", name.to_string_lossy(), std::process::id()));
        let file = File::create(&temp).map_err(|e| anyhow!("cannot create {}: {e}", temp.display()))?;
        Ok(FileWriter {
            temp,
            target: target.to_path_buf(),
            file: Some(BufWriter::with_capacity(1 << 20, file)),
            written: 0,
        })
    }

    pub(super) fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.file.as_mut().expect("open until finished").write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    pub(super) fn flush(&mut self) -> std::io::Result<()> {
        self.file.as_mut().expect("open until finished").flush()
    }

    pub(super) fn finish(mut self) -> Result<u64> {
        let writer = self.file.take().expect("finished once");
        let fail = |e: std::io::Error, what: &str| anyhow!("{what} {}: {e}", self.target.display());
        let file = writer.into_inner().map_err(|e| fail(e.into_error(), "writing"))?;
        // Data on disk before the rename makes it visible, or a crash could expose a short file.
        file.sync_all().map_err(|e| fail(e, "flushing"))?;
        drop(file);
        fs::rename(&self.temp, &self.target).map_err(|e| fail(e, "renaming the finished file to"))?;
        if let Some(dir) = self.target.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(dir)?;
        }
        Ok(self.written)
    }
}

impl Drop for FileWriter {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            // Unfinished (an error or an abandoned save): leave nothing behind.
            let _ = fs::remove_file(&self.temp);
        }
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
