//! Every file a run writes goes through here, so that none destroys what is already on disk:
//! - [`check_paths`] runs before any compile: each output path must not be an input of the run
//!   (same path or same inode), not a FIFO, device or directory, and its directory must be
//!   writable; no input may be a FIFO, device or directory; a refused path names its key and why.
//! - [`write_atomic`] writes a whole file under a temporary name in the same directory and
//!   renames it into place, so an interrupted write leaves the old file intact.
//! - [`LockedAppend`] appends to a file under an exclusive OS lock (`flock`), so two runs cannot
//!   interleave lines; a second run is refused instead of waiting.
//!
//! [`PATH_KEYS`] lists every config key that names a file and whether each command reads or
//! writes it: a new output (checkpoints, event files) adds a row there and uses these writers.

use std::fs::{File, OpenOptions};
use std::io::{Seek, Write};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};

use crate::config::Config;
use crate::pjrt::provision::PluginSpec;

/// The commands that read and write files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Train,
    TrainCompile,
}

/// What a command does with the file a key names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Reads,
    Writes,
    Ignores,
}

/// A config key that names a file, and what `maxrs train` and `maxrs train-compile` do with it.
#[derive(Clone, Copy, Debug)]
pub struct PathKey {
    pub key: &'static str,
    pub train: Role,
    pub train_compile: Role,
    /// A directory is a valid value too (a checkpoint).
    pub directory: bool,
}

impl PathKey {
    pub fn role(&self, command: Command) -> Role {
        match command {
            Command::Train => self.train,
            Command::TrainCompile => self.train_compile,
        }
    }
}

/// Every key that names a file. `plugin` is a file only when it is a path (not a plugin name).
pub const PATH_KEYS: &[PathKey] = &[
    PathKey { key: "metrics_file", train: Role::Writes, train_compile: Role::Ignores, directory: false },
    PathKey { key: "compiled_trainstep_file", train: Role::Reads, train_compile: Role::Writes, directory: false },
    PathKey { key: "dataset_path", train: Role::Reads, train_compile: Role::Ignores, directory: false },
    PathKey { key: "load_parameters_path", train: Role::Reads, train_compile: Role::Ignores, directory: true },
    PathKey { key: "load_full_state_path", train: Role::Reads, train_compile: Role::Ignores, directory: true },
    PathKey { key: "xla_flags_file", train: Role::Reads, train_compile: Role::Reads, directory: false },
    PathKey { key: "plugin", train: Role::Reads, train_compile: Role::Reads, directory: false },
];

/// The value of path key `key` in `c`, if set (empty means unset).
fn path_value(c: &Config, key: &str) -> Option<PathBuf> {
    let values = serde_json::to_value(c).ok()?;
    let text = values.get(key)?.as_str()?;
    if key == "plugin" {
        return match text.parse() {
            Ok(PluginSpec::Path(path)) => Some(path),
            _ => None,
        };
    }
    // Remote (gs://) paths are checked by the storage layer when used.
    (!text.is_empty() && !text.contains("://")).then(|| PathBuf::from(text))
}

/// Checks every file `command` will write (see the module docs). Run it before compiling, so a
/// bad path costs nothing.
pub fn check_paths(c: &Config, command: Command) -> Result<()> {
    let with_role = |role: Role| -> Vec<(PathKey, PathBuf)> {
        PATH_KEYS
            .iter()
            .filter(|k| k.role(command) == role)
            .filter_map(|k| path_value(c, k.key).map(|p| (*k, p)))
            .collect()
    };
    let (inputs, outputs) = (with_role(Role::Reads), with_role(Role::Writes));
    // An input that is a FIFO or a device would block or never end; missing inputs are left to
    // their readers, whose errors say what the file should hold.
    for (k, path) in &inputs {
        let allowed_dir = k.directory && path.is_dir();
        if let Some(kind) =
            std::fs::metadata(path).ok().filter(|_| !allowed_dir).and_then(|m| describe_special(&m.file_type()))
        {
            bail!("{}={} is {kind}; maxrs reads a regular file there", k.key, path.display());
        }
    }
    for (i, (k, path)) in outputs.iter().enumerate() {
        check_output(k.key, path)?;
        let earlier_outputs = outputs[..i].iter();
        for (other, other_path) in inputs.iter().chain(earlier_outputs) {
            if same_file(path, other_path) {
                bail!(
                    "{key}={} is the same file as {}={}; writing it would destroy what the run reads or writes \
                     there: give {key} a path of its own",
                    path.display(),
                    other.key,
                    other_path.display(),
                    key = k.key,
                );
            }
        }
    }
    Ok(())
}

/// One output path on its own: a regular file or nothing yet, in a writable directory.
pub fn check_output(key: &str, path: &Path) -> Result<()> {
    let shown = path.display();
    match std::fs::metadata(path) {
        Ok(meta) => {
            let kind = describe_special(&meta.file_type());
            if let Some(kind) = kind {
                bail!("{key}={shown} is {kind}; maxrs writes a regular file there: give a file path");
            }
            // Opening for append changes nothing, and tells a read-only file early.
            OpenOptions::new().append(true).open(path).map_err(|e| anyhow!("{key}={shown} cannot be written: {e}"))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => bail!("{key}={shown}: {e}"),
    }
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    // Missing directories are created when writing: the closest existing one must take new files.
    let existing = parent.ancestors().find(|dir| dir.exists()).unwrap_or(Path::new("."));
    if !existing.is_dir() {
        bail!("{key}={shown}: {} is not a directory", existing.display());
    }
    tempfile::tempfile_in(existing)
        .map_err(|e| anyhow!("{key}={shown}: cannot create files in {}: {e}", existing.display()))?;
    Ok(())
}

/// "a FIFO" etc. for a file type maxrs must not write to; `None` for a regular file.
fn describe_special(file_type: &std::fs::FileType) -> Option<&'static str> {
    if file_type.is_dir() {
        return Some("a directory");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if file_type.is_fifo() {
            return Some("a FIFO (named pipe)");
        }
        if file_type.is_char_device() || file_type.is_block_device() {
            return Some("a device");
        }
        if file_type.is_socket() {
            return Some("a socket");
        }
    }
    (!file_type.is_file()).then_some("not a regular file")
}

/// Whether two paths name the same file: the same inode (hard links, symlinks) or, for files
/// that do not exist yet, the same place once resolved.
pub fn same_file(a: &Path, b: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let (Ok(ma), Ok(mb)) = (std::fs::metadata(a), std::fs::metadata(b)) {
            return ma.dev() == mb.dev() && ma.ino() == mb.ino();
        }
    }
    let resolved = |p: &Path| -> Option<PathBuf> {
        let parent = p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        Some(std::fs::canonicalize(parent).ok()?.join(p.file_name()?))
    };
    match (resolved(a), resolved(b)) {
        (Some(ra), Some(rb)) => ra == rb,
        _ => a == b,
    }
}

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
    fill(tmp.as_file_mut()).with_context(|| format!("writing {}", tmp.path().display()))?;
    // Data must be on disk before the rename makes it visible under the real name.
    tmp.as_file().sync_all().with_context(|| format!("flushing {}", tmp.path().display()))?;
    tmp.persist(path).map_err(|e| anyhow!("renaming into {}: {}", path.display(), e.error))?;
    Ok(())
}

/// A file appended to under an exclusive lock held for the writer's lifetime.
pub struct LockedAppend {
    file: File,
    path: PathBuf,
    key: String,
    /// Truncate before the first write (a run starting afresh), not at open: a run that fails
    /// before writing leaves the old content.
    truncate_pending: bool,
}

impl LockedAppend {
    /// Opens (creating it and its directories) and locks `path`, the value of config key `key`.
    /// With `fresh`, the old content is dropped at the first write. Another process holding
    /// the lock is an error naming the key.
    pub fn open(key: &str, path: &Path, fresh: bool) -> Result<LockedAppend> {
        let shown = path.display();
        if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| anyhow!("{key}={shown}: cannot create {}: {e}", dir.display()))?;
        }
        check_output(key, path)?;
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| anyhow!("{key}={shown}: cannot open it for writing: {e}"))?;
        file.try_lock().map_err(|e| match e {
            std::fs::TryLockError::WouldBlock => {
                anyhow!("{key}={shown} is being written by another run (it holds the file's lock); give this run another path")
            }
            std::fs::TryLockError::Error(e) => anyhow!("{key}={shown}: cannot lock it: {e}"),
        })?;
        Ok(LockedAppend { file, path: path.to_owned(), key: key.to_owned(), truncate_pending: fresh })
    }

    /// Appends `bytes` in one write call.
    pub fn append(&mut self, bytes: &[u8]) -> Result<()> {
        let fail = |e: std::io::Error| anyhow!("{}={}: {e}", self.key, self.path.display());
        if self.truncate_pending {
            self.file.set_len(0).map_err(fail)?;
            self.file.rewind().map_err(fail)?;
            self.truncate_pending = false;
        }
        self.file.write_all(bytes).map_err(fail)
    }

    /// Makes everything appended so far durable.
    pub fn sync(&mut self) -> Result<()> {
        self.file.sync_data().map_err(|e| anyhow!("{}={}: {e}", self.key, self.path.display()))
    }
}
