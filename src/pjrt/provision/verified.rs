//! Cached files (plugins, CUDA tools) checked before use. A truncated or damaged plugin would be
//! `dlopen`ed and crash the process (SIGBUS, SIGSEGV), so each unpacked file gets a record next
//! to it, `<file>.sha256`: its size, modification time and sha256 at unpacking. A later run
//! compares size and time (cheap); only when they changed does it hash the file again, and a
//! file whose hash no longer matches, or that has no record, is fetched again.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use anyhow::Result;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    size: u64,
    /// Modification time in nanoseconds since the Unix epoch.
    mtime_ns: u128,
    sha256: String,
}

fn record_path(file: &Path) -> PathBuf {
    let mut name = file.file_name().unwrap_or_default().to_os_string();
    name.push(".sha256");
    file.with_file_name(name)
}

/// A file's size and modification time (ns since the epoch): what says it has not changed.
pub(crate) fn size_and_mtime(file: &Path) -> io::Result<(u64, u128)> {
    let meta = std::fs::metadata(file)?;
    let mtime = meta.modified()?.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    Ok((meta.len(), mtime))
}

/// A digest in lowercase hexadecimal.
pub(crate) fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

pub(super) fn hash_file(file: &Path) -> io::Result<String> {
    let mut hasher = HashingWriter::new(io::sink());
    io::copy(&mut File::open(file)?, &mut hasher)?;
    Ok(hasher.finish())
}

/// Records `file` (just written, whose content hashes to `sha256`) as intact.
pub(super) fn record(file: &Path, sha256: &str) -> Result<()> {
    let (size, mtime_ns) = size_and_mtime(file)?;
    let json = serde_json::to_vec(&Record { size, mtime_ns, sha256: sha256.to_string() })?;
    crate::files::write_atomic(&record_path(file), |f| f.write_all(&json))
}

/// Whether `file` exists and is as it was unpacked: same size, and the same modification time
/// or (when the time changed) the same sha256. A file with no record is not intact.
pub(super) fn is_intact(file: &Path) -> bool {
    let Ok((size, mtime_ns)) = size_and_mtime(file) else { return false };
    let Some(saved) = std::fs::read(record_path(file)).ok().and_then(|b| serde_json::from_slice::<Record>(&b).ok())
    else {
        return false;
    };
    if saved.size != size {
        return false;
    }
    if saved.mtime_ns == mtime_ns {
        return true;
    }
    tracing::info!("{} changed since it was unpacked; checking its sha256", file.display());
    let intact = hash_file(file).is_ok_and(|h| h == saved.sha256);
    if intact {
        // Same content under a new time (a copy, a touch): remember it, so the next run is cheap.
        let _ = record(file, &saved.sha256);
    }
    intact
}

/// A writer that hashes what passes through it.
pub(super) struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
}

impl<W: Write> HashingWriter<W> {
    pub(super) fn new(inner: W) -> Self {
        HashingWriter { inner, hasher: Sha256::new() }
    }

    /// The sha256 of everything written, in hex.
    pub(super) fn finish(self) -> String {
        hex(&self.hasher.finalize())
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unpacked(dir: &Path, content: &[u8]) -> PathBuf {
        let file = dir.join("plugin.so");
        std::fs::write(&file, content).unwrap();
        record(&file, &hex(&Sha256::digest(content))).unwrap();
        file
    }

    #[test]
    fn truncated_changed_and_unrecorded_files_are_not_intact() {
        let dir = tempfile::tempdir().unwrap();
        let file = unpacked(dir.path(), b"\x7fELF plugin bytes");
        assert!(is_intact(&file));

        // Truncated: the size differs, no hashing needed.
        std::fs::write(&file, b"\x7fELF").unwrap();
        assert!(!is_intact(&file));

        // Same size, one byte flipped: the time changed, so it is hashed, and differs.
        let file = unpacked(dir.path(), b"\x7fELF plugin bytes");
        std::thread::sleep(std::time::Duration::from_millis(10));
        std::fs::write(&file, b"\x7fELF plugin bytez").unwrap();
        assert!(!is_intact(&file));

        // Rewritten with the same bytes: intact, and the record takes the new time.
        std::fs::write(&file, b"\x7fELF plugin bytes").unwrap();
        assert!(is_intact(&file));
        let saved: Record = serde_json::from_slice(&std::fs::read(record_path(&file)).unwrap()).unwrap();
        assert_eq!(saved.mtime_ns, size_and_mtime(&file).unwrap().1);

        std::fs::remove_file(record_path(&file)).unwrap();
        assert!(!is_intact(&file), "a file without a record is fetched again");
        assert!(!is_intact(&dir.path().join("missing.so")));
    }
}
