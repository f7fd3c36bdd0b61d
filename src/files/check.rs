//! The checks on a path before maxrs writes or reads there: what an output is ([`Kind`]) and
//! what may already be at a local output's path ([`check_output`]), which file types maxrs
//! refuses ([`describe_special`]), and whether two paths are one file ([`same_file`]).

use std::fs::OpenOptions;
use std::path::{Component, Path, PathBuf};

use anyhow::{anyhow, bail, Result};

use super::Location;

/// What an output is, which decides what may already be at its path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A file every run rewrites, as in MaxText (`metrics_file`, `compiled_trainstep_file`): an
    /// existing regular file is the previous run's and is replaced.
    RunFile,
    /// A file named on the command line (`--output`): an existing file is replaced only when the
    /// user said so with `--force` (`force`), as gzip, xz and zstd do, since it may be anything
    /// of the user's.
    File { force: bool },
    /// A directory the command creates or adds to (`base_output_directory`).
    Dir,
    /// A directory the command writes whole (`convert`'s DST): nothing may be there yet, and it
    /// may not lie inside an input or hold one.
    NewDir,
}

/// `name="value"`: how a refused path is shown (quoted, control characters escaped).
pub(crate) fn shown(name: &str, location: &Location) -> String {
    format!("{name}={:?}", location.to_string())
}

/// What a [`Kind::NewDir`] that exists is told.
pub(crate) const NEW_DIR: &str =
    "maxrs writes a new directory there, whole: give a path that does not exist yet (or delete it)";

/// One local output on its own (`shown` names it in errors): what is at `path` already, and
/// whether its directory takes files.
pub(crate) fn check_output(shown: &str, path: &Path, kind: Kind) -> Result<()> {
    // A dangling symlink is something there too, for a directory written whole.
    let existing = if kind == Kind::NewDir { std::fs::symlink_metadata(path) } else { std::fs::metadata(path) };
    match existing {
        Ok(_) if kind == Kind::NewDir => bail!("{shown} already exists; {NEW_DIR}"),
        Ok(meta) if kind == Kind::Dir => {
            if !meta.is_dir() {
                let kind = describe_special(&meta.file_type()).unwrap_or("a file");
                bail!("{shown} is {kind}; maxrs writes a directory there: give a directory path");
            }
        }
        Ok(meta) => {
            if let Some(kind) = describe_special(&meta.file_type()) {
                bail!("{shown} is {kind}; maxrs writes a regular file there: give a file path");
            }
            if kind == (Kind::File { force: false }) {
                bail!("{shown} already exists; add --force to replace it, or give a new path");
            }
            // Opening for append changes nothing, and tells a read-only file early.
            OpenOptions::new().append(true).open(path).map_err(|e| anyhow!("{shown} cannot be written: {e}"))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => bail!("{shown}: {e}"),
    }
    // A run directory is not probed for writing: its writers (checkpoints, event files) fail
    // when they write, and `on_checkpoint_error=continue` keeps training on a read-only disk
    // (a run resumed from a checkpoint there is a valid use).
    if kind == Kind::Dir {
        return Ok(());
    }
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let start = if kind == Kind::NewDir { path } else { parent };
    // Missing directories are created when writing: the closest existing one must take new files.
    let existing = start.ancestors().find(|dir| dir.exists()).unwrap_or(Path::new("."));
    if !existing.is_dir() {
        bail!("{shown}: {} is not a directory", existing.display());
    }
    tempfile::tempfile_in(existing)
        .map_err(|e| anyhow!("{shown}: cannot create files in {}: {e}", existing.display()))?;
    Ok(())
}

/// "a FIFO" etc. for a file type maxrs must not write to or read from; `None` for a regular
/// file.
pub(crate) fn describe_special(file_type: &std::fs::FileType) -> Option<&'static str> {
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
    match (absolute(a), absolute(b)) {
        (Some(ra), Some(rb)) => ra == rb,
        _ => a == b,
    }
}

/// `path` made absolute with its existing part resolved (symlinks, `..`) and the rest, which
/// cannot hold symlinks, taken as written: where it is or would be created.
pub(crate) fn absolute(path: &Path) -> Option<PathBuf> {
    let path = std::path::absolute(path).ok()?;
    let existing = path.ancestors().find(|a| a.exists())?;
    let mut resolved = std::fs::canonicalize(existing).ok()?;
    for part in path.strip_prefix(existing).ok()?.components() {
        match part {
            Component::ParentDir => {
                resolved.pop();
            }
            Component::Normal(name) => resolved.push(name),
            _ => {}
        }
    }
    Some(resolved)
}
