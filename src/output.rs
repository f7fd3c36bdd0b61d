//! Every path a command reads or writes is checked here, so that none destroys what is already
//! on disk:
//! - [`check`] runs before any work (a compile, a conversion, a pass over a corpus), in every
//!   command that writes (`train`, `train-compile`, `tokenize`, `convert`, `submit`): no output
//!   may be an input of the command or another output (same path or same inode, so hard links
//!   and symlinks count), and a directory written whole may not lie inside an input or hold one;
//!   an output file may not be a FIFO, device or directory, and what may already be there is
//!   its [`Kind`]'s rule (`files::check_output`); the closest existing directory must take new
//!   files; no input may be a FIFO, device or (unless it may be) a directory. A refused path
//!   names its key, flag or argument, its value quoted, and what would be valid.
//! - [`check_paths`] is that check for the config keys of `train` and `train-compile`:
//!   [`PATH_KEYS`] lists every config key that names a file and whether each command reads or
//!   writes it; a new output (checkpoints, event files) adds a row there and writes through
//!   `crate::files` (`write_atomic`, `LockedAppend`) or `crate::storage`.

use std::path::PathBuf;

use anyhow::{bail, Result};

use crate::config::Config;
use crate::files::{self, absolute, describe_special, same_file, shown, Kind, Location, NEW_DIR};
use crate::pjrt::provision::PluginSpec;
use crate::storage;

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
    files::check_output(&shown(name, location), path, kind)
}
