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
//! - [`check_paths`] is that check for the config keys of `train` and `train-compile`: the
//!   key registry's path keys (`config::registry`, role `Path`) say whether each command reads
//!   or writes the file a key names; a new output (checkpoints, event files) is declared so there
//!   and writes through `crate::files` (`write_atomic`, `LockedAppend`) or `crate::storage`.

use std::path::PathBuf;

use anyhow::{bail, Result};

use crate::config::registry::{self, Access, Role};
use crate::config::{Config, Resolved};
use crate::data;
use crate::data::storage::Storage;
use crate::files::{self, absolute, describe_special, same_file, shown, Kind, Location, NEW_DIR};
use crate::pjrt::provision::PluginSpec;
use crate::storage;

/// The commands that read and write files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Train,
    TrainCompile,
}

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

/// The value of path key `key` in the config's `values`, if set (empty means unset).
fn path_value(values: &serde_json::Value, key: &str) -> Option<PathBuf> {
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
    let (mut inputs, outputs) = key_paths(c, command);
    if command == Command::Train {
        inputs.extend(data_files(c));
    }
    check(&inputs, &outputs)
}

/// The outputs of `command` checked against the setting files the config was read from
/// ([`Resolved::files_read`]), which no config key names: what the commands run first, so that
/// `compiled_trainstep_file=CONFIG.yml` cannot replace the config file with the compiled step.
/// The files the keys name are [`check_paths`]'s, which the command runs before compiling.
pub fn check_resolved_paths(resolved: &Resolved, command: Command) -> Result<()> {
    let (_, outputs) = key_paths(&resolved.config, command);
    let settings: Vec<Input> = resolved
        .files_read
        .iter()
        .map(|(name, path)| Input { name, location: Location::Local(path.clone()), directory: false })
        .collect();
    check(&settings, &outputs)
}

/// The files `command` reads and writes by path key.
fn key_paths(c: &Config, command: Command) -> (Vec<Input<'static>>, Vec<Output<'static>>) {
    let (mut inputs, mut outputs) = (Vec::new(), Vec::new());
    let Ok(values) = serde_json::to_value(c) else { return (inputs, outputs) };
    for key in registry::keys_with(Role::Path) {
        let (Some(path), Some(used)) = (path_value(&values, key.name), key.path) else { continue };
        let location = Location::Local(path);
        let access = match command {
            Command::Train => used.train,
            Command::TrainCompile => used.train_compile,
        };
        match access {
            Access::Reads => inputs.push(Input { name: key.name, location, directory: used.directory }),
            Access::Writes => {
                let kind = if used.directory { Kind::Dir } else { Kind::RunFile };
                outputs.push(Output { name: key.name, location, kind });
            }
            Access::Ignores => {}
        }
    }
    (inputs, outputs)
}

/// The local files the training and eval data keys' globs and mixtures match (a glob or file the
/// readers will refuse is left to them, whose errors say what it should hold).
fn data_files(c: &Config) -> Vec<Input<'static>> {
    let mut patterns: Vec<(&'static str, String)> = Vec::new();
    // A mixture file in a bucket is read by the data pipeline, not fetched for this check.
    let mixture =
        if c.grain_train_mixture_config_path.contains("://") { Ok(None) } else { data::mixture::Mixture::of(c) };
    match mixture {
        Ok(Some(mixture)) => patterns.extend(mixture.components.into_iter().map(|m| (mixture.key, m.pattern))),
        Ok(None) => patterns.push(("hf_train_files", c.hf_train_files.clone())),
        Err(_) => {}
    }
    patterns.push(("hf_eval_files", c.hf_eval_files.clone()));
    let local = |(_, pattern): &(&str, String)| !pattern.is_empty() && !pattern.contains("://");
    patterns
        .into_iter()
        .filter(local)
        .flat_map(|(key, pattern)| {
            data::storage::LocalFiles.glob(key, &pattern).unwrap_or_default().into_iter().map(move |p| (key, p))
        })
        .map(|(name, path)| Input { name, location: Location::Local(path), directory: false })
        .collect()
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
            // As `crate::input` words it, which refuses the same file when it is opened.
            bail!(
                "{} is {kind}, not a regular file: maxrs reads a regular file there",
                shown(input.name, &input.location)
            );
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
