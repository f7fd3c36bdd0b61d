//! Every file a command writes goes through here, so that none destroys what is already on disk:
//! - [`check`] runs before any work (a compile, a conversion, a pass over a corpus), in every
//!   command that writes (`train`, `train-compile`, `tokenize`, `convert`, `submit`): no output
//!   may be an input of the command or another output (same path or same inode, so hard links
//!   and symlinks count), and a directory written whole may not lie inside an input or hold one;
//!   an output file may not be a FIFO, device or directory, and what may already be there is
//!   its [`Kind`]'s rule; the closest existing directory must take new files; no input may be a
//!   FIFO, device or (unless it may be) a directory. A refused path names its key, flag or
//!   argument, its value quoted, and what would be valid.
//! - [`check_paths`] is that check for the config keys of `train` and `train-compile`:
//!   [`PATH_KEYS`] lists every config key that names a file and whether each command reads or
//!   writes it; a new output (checkpoints, event files) adds a row there and uses these writers.
//! - Whole files are written by [`crate::files::write_atomic`], under a temporary name in the
//!   same directory renamed into place, so an interrupted write leaves the old file intact.
//! - [`LockedAppend`] appends to a file under an exclusive OS lock (`flock`), so two runs cannot
//!   interleave lines; a second run is refused instead of waiting.

use std::fs::{File, OpenOptions};
use std::io::{Seek, Write};
use std::path::{Component, Path, PathBuf};

use anyhow::{anyhow, bail, Result};

use crate::config::Config;
use crate::pjrt::provision::PluginSpec;
use crate::storage::{self, Location};

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
    /// A directory is a valid value: a checkpoint to read, the run's output directory.
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
/// `base_output_directory` holds the run's directory (`run_name/`: checkpoints, metrics,
/// TensorBoard events and profiles, `config.yml`).
pub const PATH_KEYS: &[PathKey] = &[
    PathKey { key: "base_output_directory", train: Role::Writes, train_compile: Role::Ignores, directory: true },
    PathKey { key: "metrics_file", train: Role::Writes, train_compile: Role::Ignores, directory: false },
    PathKey { key: "compiled_trainstep_file", train: Role::Reads, train_compile: Role::Writes, directory: false },
    PathKey { key: "dataset_path", train: Role::Reads, train_compile: Role::Ignores, directory: false },
    PathKey { key: "load_parameters_path", train: Role::Reads, train_compile: Role::Ignores, directory: true },
    PathKey { key: "load_full_state_path", train: Role::Reads, train_compile: Role::Ignores, directory: true },
    PathKey { key: "xla_flags_file", train: Role::Reads, train_compile: Role::Reads, directory: false },
    PathKey { key: "plugin", train: Role::Reads, train_compile: Role::Reads, directory: false },
];

/// A file or directory a command reads.
#[derive(Clone, Debug)]
pub struct Input<'a> {
    /// What names it: a config key, a flag or an argument (`dataset_path`, `INPUT`, `SRC`).
    pub name: &'a str,
    pub location: Location,
    /// A directory is a valid value (a checkpoint).
    pub directory: bool,
}

/// A file or directory a command writes.
#[derive(Clone, Debug)]
pub struct Output<'a> {
    /// What names it: a config key, a flag or an argument (`metrics_file`, `--output`, `DST`).
    pub name: &'a str,
    pub location: Location,
    pub kind: Kind,
}

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
fn shown(name: &str, location: &Location) -> String {
    format!("{name}={:?}", location.to_string())
}

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

/// [`check`] for the files `command` reads and writes by config key. Run it before compiling,
/// so a bad path costs nothing.
pub fn check_paths(c: &Config, command: Command) -> Result<()> {
    let (mut inputs, mut outputs) = (Vec::new(), Vec::new());
    for k in PATH_KEYS {
        let Some(path) = path_value(c, k.key) else { continue };
        let location = Location::Local(path);
        match k.role(command) {
            Role::Reads => inputs.push(Input { name: k.key, location, directory: k.directory }),
            Role::Writes => {
                let kind = if k.directory { Kind::Dir } else { Kind::RunFile };
                outputs.push(Output { name: k.key, location, kind });
            }
            Role::Ignores => {}
        }
    }
    check(&inputs, &outputs)
}

/// Checks what a command reads and writes before it starts (see the module docs).
pub fn check(inputs: &[Input], outputs: &[Output]) -> Result<()> {
    // An input that is a FIFO or a device would block or never end; missing inputs are left to
    // their readers, whose errors say what the file should hold.
    for input in inputs {
        let Location::Local(path) = &input.location else { continue };
        let allowed_dir = input.directory && path.is_dir();
        if let Some(kind) =
            std::fs::metadata(path).ok().filter(|_| !allowed_dir).and_then(|m| describe_special(&m.file_type()))
        {
            bail!("{} is {kind}; maxrs reads a regular file there", shown(input.name, &input.location));
        }
    }
    for (i, output) in outputs.iter().enumerate() {
        // What writing it would destroy comes first: `--force` does not make that right.
        let others =
            inputs.iter().map(|x| (x.name, &x.location)).chain(outputs[..i].iter().map(|o| (o.name, &o.location)));
        for (name, location) in others {
            if let Some(relation) = overlap(output, location) {
                bail!(
                    "{} {relation} {}; writing it would destroy what the command reads or writes there: give {} a \
                     path of its own",
                    shown(output.name, &output.location),
                    shown(name, location),
                    output.name
                );
            }
        }
        check_output(output.name, &output.location, output.kind)?;
    }
    Ok(())
}

/// How `output` would clobber the file or directory at `other`, if it would.
fn overlap(output: &Output, other: &Location) -> Option<&'static str> {
    // A directory the command adds to destroys nothing of what is in it or around it.
    if output.kind == Kind::Dir {
        return None;
    }
    let whole_dir = output.kind == Kind::NewDir;
    match (&output.location, other) {
        (Location::Local(a), Location::Local(b)) => {
            if same_file(a, b) {
                return Some("is the same file as");
            }
            let (a, b) = (absolute(a)?, absolute(b)?);
            (whole_dir && a.starts_with(&b))
                .then_some("lies inside")
                .or_else(|| (whole_dir && b.starts_with(&a)).then_some("holds"))
        }
        (Location::Gcs { bucket: a_bucket, key: a }, Location::Gcs { bucket: b_bucket, key: b })
            if a_bucket == b_bucket =>
        {
            let inside = |inner: &str, outer: &str| {
                outer.is_empty() || inner == outer || inner.starts_with(&format!("{outer}/"))
            };
            if a == b {
                Some("is the same file as")
            } else if whole_dir && inside(a, b) {
                Some("lies inside")
            } else if whole_dir && inside(b, a) {
                Some("holds")
            } else {
                None
            }
        }
        _ => None,
    }
}

/// One output on its own: what is at its path already, and whether its directory takes files.
fn check_output(name: &str, location: &Location, kind: Kind) -> Result<()> {
    let path = match location {
        Location::Local(path) => path,
        Location::Gcs { .. } if kind == Kind::NewDir => {
            if !storage::list_dir(location)?.is_empty() || storage::is_file(location)? {
                bail!("{} already exists; {NEW_DIR}", shown(name, location));
            }
            return Ok(());
        }
        // Other gs:// outputs are checked by the storage layer when written.
        Location::Gcs { .. } => return Ok(()),
    };
    let shown = shown(name, location);
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
    let start = if kind == Kind::NewDir { path.as_path() } else { parent };
    // Missing directories are created when writing: the closest existing one must take new files.
    let existing = start.ancestors().find(|dir| dir.exists()).unwrap_or(Path::new("."));
    if !existing.is_dir() {
        bail!("{shown}: {} is not a directory", existing.display());
    }
    tempfile::tempfile_in(existing)
        .map_err(|e| anyhow!("{shown}: cannot create files in {}: {e}", existing.display()))?;
    Ok(())
}

/// What a [`Kind::NewDir`] that exists is told.
const NEW_DIR: &str = "maxrs writes a new directory there, whole: give a path that does not exist yet (or delete it)";

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
fn absolute(path: &Path) -> Option<PathBuf> {
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
        let location = Location::Local(path.to_owned());
        let shown = shown(key, &location);
        if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| anyhow!("{shown}: cannot create {}: {e}", dir.display()))?;
        }
        check_output(key, &location, Kind::RunFile)?;
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
