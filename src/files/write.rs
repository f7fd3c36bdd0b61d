//! Writing local files so that none is left half-written or written by two runs at once:
//! [`AtomicFile`] (streamed) and [`write_atomic`] (filled by a closure) write under a temporary
//! name in the target's directory, flush to disk, rename over the target and sync the directory,
//! so an interrupted or failed write leaves the old file (or none) and no temporary file;
//! [`LockedAppend`] appends under an exclusive lock.

use std::fs::{File, OpenOptions};
use std::io::{Seek, Write};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use tempfile::NamedTempFile;

use super::{check_output, shown, Kind, Location};

/// A file being written whole: [`AtomicFile::commit`] makes it appear under its name; dropped
/// before that, it leaves nothing behind.
pub struct AtomicFile {
    path: PathBuf,
    tmp: NamedTempFile,
}

impl AtomicFile {
    /// Starts writing `path`, creating missing parent directories.
    pub fn create(path: &Path) -> Result<AtomicFile> {
        let name = path.file_name().ok_or_else(|| anyhow!("{}: names no file", path.display()))?;
        let dir = parent(path);
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let prefix = format!(".{}.", name.to_string_lossy());
        let mut builder = tempfile::Builder::new();
        builder.prefix(&prefix).suffix(".tmp");
        // What `File::create` gives (0666 less the umask), not a temporary file's owner-only
        // 0600: these are ordinary files (a writer of secrets narrows them itself).
        #[cfg(unix)]
        builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
        let tmp =
            builder.tempfile_in(dir).with_context(|| format!("creating a temporary file in {}", dir.display()))?;
        Ok(AtomicFile { path: path.to_owned(), tmp })
    }

    /// The file the content goes to (under its temporary name).
    pub fn file(&mut self) -> &mut File {
        self.tmp.as_file_mut()
    }

    /// The file this becomes.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Flushes the content to disk, renames it over the target, and syncs the directory so
    /// that the rename survives a power loss.
    pub fn commit(self) -> Result<()> {
        let AtomicFile { path, tmp } = self;
        // Data must be on disk before the rename makes it visible under the real name.
        tmp.as_file().sync_all().with_context(|| format!("flushing {}", path.display()))?;
        tmp.persist(&path).map_err(|e| anyhow!("renaming into {}: {}", path.display(), e.error))?;
        sync_dir(parent(&path))
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.tmp.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.tmp.flush()
    }
}

/// Writes `path` whole: `fill` writes the content into an [`AtomicFile`], committed when `fill`
/// succeeds. On any error `path` is untouched and the temporary file removed.
pub fn write_atomic(path: &Path, fill: impl FnOnce(&mut File) -> std::io::Result<()>) -> Result<()> {
    let mut file = AtomicFile::create(path)?;
    // Errors name the file the user asked for, not the temporary one.
    fill(file.file()).with_context(|| format!("writing {}", path.display()))?;
    file.commit()
}

/// Places a copy of the finished file `source` at `dest` as an executable (mode 0755): a `cp`
/// process writes the copy under a temporary name in `dest`'s folder, which is then renamed
/// over `dest` (replacing a symlink there, never writing through it).
///
/// Why a child process: the kernel refuses to run a file that any process holds open for
/// writing (`ETXTBSY`, "Text file busy"), and a child that another thread of this process
/// forks while this process writes a file inherits that descriptor until the child execs. So a
/// file this process wrote could not be run at once while other threads start processes (seen
/// in CI: the test binary unpacked mdBook while other tests started `maxrs`). No process of
/// ours ever opens the copy `cp` writes for writing, so no descriptor of it can linger.
pub fn place_executable(source: &Path, dest: &Path) -> Result<()> {
    let dir = parent(dest);
    // A name only: a file this process created would be one it had opened for writing.
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let name = dest.file_name().unwrap_or_default().to_string_lossy();
    let copy = dir.join(format!(".{name}.{}.{nanos}.exec", std::process::id()));
    let placed = (|| {
        let copied = std::process::Command::new("cp")
            .arg("--")
            .arg(source)
            .arg(&copy)
            .stdin(std::process::Stdio::null())
            .output()
            .context("running cp")?;
        if !copied.status.success() {
            bail!("cp {} {}: {}", source.display(), copy.display(), String::from_utf8_lossy(&copied.stderr).trim());
        }
        #[cfg(unix)]
        std::fs::set_permissions(&copy, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
        // Read-only: syncing needs no descriptor open for writing.
        File::open(&copy).and_then(|f| f.sync_all())?;
        std::fs::rename(&copy, dest)?;
        sync_dir(dir)
    })();
    if placed.is_err() {
        let _ = std::fs::remove_file(&copy);
    }
    placed.with_context(|| format!("placing executable {}", dest.display()))
}

/// Flushes a directory's entries (a rename or a new file in it) to disk.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| anyhow!("cannot sync directory {}: {e}", dir.display()))
}

/// The directory `path` is in (`.` for a bare name).
fn parent(path: &Path) -> &Path {
    path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_appears_whole_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/out.bin");
        write_atomic(&path, |f| f.write_all(b"first")).unwrap();
        let failed = write_atomic(&path, |f| {
            f.write_all(b"half")?;
            Err(std::io::Error::other("disk full"))
        });
        assert_eq!(failed.unwrap_err().to_string(), format!("writing {}", path.display()));
        assert_eq!(std::fs::read(&path).unwrap(), b"first");

        let mut streamed = AtomicFile::create(&path).unwrap();
        streamed.write_all(b"second").unwrap();
        drop(streamed);
        assert_eq!(std::fs::read(&path).unwrap(), b"first", "an abandoned write changes nothing");
        let names: Vec<_> =
            std::fs::read_dir(path.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["out.bin"], "no temporary file is left");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let plain = dir.path().join("plain");
            std::fs::write(&plain, b"").unwrap();
            let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode(&path), mode(&plain), "an ordinary file, as File::create makes it");
        }
    }
}
