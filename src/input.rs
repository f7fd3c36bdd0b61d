//! Every local file maxrs reads is opened here, so that no input can hang a run or exhaust its
//! memory (the reading side of [`crate::files`] and [`crate::output`]):
//! - [`open`] hands out a file only when it is a regular file. A FIFO would block the open and
//!   every read, a device such as `/dev/zero` never ends, a directory or a symlink loop cannot
//!   be read: each is refused with a line naming the key (or argument) and saying what the path
//!   is. The file is opened with `O_NONBLOCK`, so even a path swapped for a FIFO after the
//!   check cannot block the open, and checked again through the open handle.
//! - [`read`] / [`read_to_string`] read a whole file up to a [`Limit`]: a config, flags, index
//!   or tokenizer file has a sane maximum, and a file past it is refused, not loaded. Large data
//!   files (token files, Parquet, JSON Lines, safetensors) are mapped or streamed through
//!   [`open`] and need no bound.
//! - [`check`] says what a path is without opening it (for glob matches and folders).

use std::fs::{File, Metadata};
use std::io::Read;
use std::path::Path;

/// The most bytes maxrs reads whole from one kind of file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    pub bytes: u64,
    /// The kind of file, for the error: "a config file".
    pub of: &'static str,
}

/// Config YAML, model files, XLA flags files, `submit:` settings, Hugging Face `config.json`
/// and `tokenizer_config.json`, safetensors indexes and checkpoint manifests: text written by
/// people or listing a model's tensors, kilobytes to a few megabytes in practice.
pub const SETTINGS: Limit = Limit { bytes: 64 << 20, of: "a config, flags, index or manifest file" };
/// A SentencePiece `.model` or a `tokenizer.json`: the largest on the Hugging Face Hub are tens
/// of megabytes.
pub const TOKENIZER: Limit = Limit { bytes: 1 << 30, of: "a tokenizer file" };
/// A metrics or TensorBoard event file on GCS, kept in memory to be rewritten whole on each
/// flush when a run appends to it.
pub const RUN_LOG: Limit = Limit { bytes: 4 << 30, of: "a metrics or event file appended to on GCS" };
/// A compiled train step (`compiled_trainstep_file`): one serialized executable.
pub const COMPILED: Limit = Limit { bytes: 16 << 30, of: "a compiled train step" };

/// A file that cannot be read, naming it and why.
#[derive(Debug, thiserror::Error)]
#[error("{label} {problem}")]
pub struct InputError {
    /// `key="path"` for a config key or argument, `what "path"` otherwise.
    label: String,
    problem: Problem,
}

/// Why a path is not a readable file.
#[derive(Debug, thiserror::Error)]
pub enum Problem {
    #[error("does not exist")]
    Missing,
    #[error("is a symlink to {0:?}, which does not exist")]
    DanglingLink(std::path::PathBuf),
    #[error("is a symlink loop (following its links comes back to it); point it at a file")]
    SymlinkLoop,
    #[error("is a directory, not a regular file: maxrs reads a regular file there")]
    Directory,
    #[error("is {0}, not a regular file: maxrs reads a regular file there")]
    NotRegular(&'static str),
    #[error("is {size} bytes, more than the {limit} maxrs reads for {}", limit.of)]
    TooLarge { size: u64, limit: Limit },
    #[error("is not UTF-8 text (invalid byte at offset {0})")]
    NotUtf8(usize),
    #[error("cannot be read: {0}")]
    Io(std::io::Error),
}

impl InputError {
    pub fn new(what: &str, path: &Path, problem: Problem) -> InputError {
        InputError { label: label(what, path), problem }
    }

    pub fn problem(&self) -> &Problem {
        &self.problem
    }

    pub fn into_problem(self) -> Problem {
        self.problem
    }

    /// Nothing at the path (not even a dangling link): optional files are skipped then.
    pub fn is_missing(&self) -> bool {
        matches!(self.problem, Problem::Missing)
    }

    pub fn is_directory(&self) -> bool {
        matches!(self.problem, Problem::Directory)
    }
}

/// `key="path"` when `what` is a key or argument name, `what "path"` for a description such as
/// "config file", `"path"` alone when `what` is empty (the caller names the role). The path is
/// quoted with its control characters escaped.
fn label(what: &str, path: &Path) -> String {
    if what.is_empty() {
        format!("{path:?}")
    } else if what.contains(' ') {
        format!("{what} {path:?}")
    } else {
        format!("{what}={path:?}")
    }
}

/// The size: `64 MiB`.
impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.bytes {
            b if b >= 1 << 30 && b % (1 << 30) == 0 => write!(f, "{} GiB", b >> 30),
            b if b >= 1 << 20 && b % (1 << 20) == 0 => write!(f, "{} MiB", b >> 20),
            b => write!(f, "{b} bytes"),
        }
    }
}

/// What an error opening or inspecting `path` means for the user.
fn io_problem(path: &Path, e: std::io::Error) -> Problem {
    #[cfg(unix)]
    if e.raw_os_error() == Some(libc::ELOOP) {
        return Problem::SymlinkLoop;
    }
    if e.kind() == std::io::ErrorKind::NotFound {
        return match std::fs::read_link(path) {
            Ok(target) => Problem::DanglingLink(target),
            Err(_) => Problem::Missing,
        };
    }
    Problem::Io(e)
}

/// The metadata of `path` (the value of `what`) when it is a regular file; otherwise an error
/// saying what it is. Links are followed.
pub fn check(what: &str, path: &Path) -> Result<Metadata, InputError> {
    let fail = |problem| InputError::new(what, path, problem);
    let meta = std::fs::metadata(path).map_err(|e| fail(io_problem(path, e)))?;
    regular(&meta).map_err(fail)?;
    Ok(meta)
}

/// Refuses what is not a regular file.
fn regular(meta: &Metadata) -> Result<(), Problem> {
    if meta.is_dir() {
        return Err(Problem::Directory);
    }
    match crate::files::describe_special(&meta.file_type()) {
        Some(kind) => Err(Problem::NotRegular(kind)),
        None => Ok(()),
    }
}

/// Opens `path` (the value of `what`) for reading when it is a regular file (see the module
/// docs).
pub fn open(what: &str, path: &Path) -> Result<File, InputError> {
    let fail = |problem| InputError::new(what, path, problem);
    check(what, path)?;
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    // Opening a FIFO for reading waits for a writer; with O_NONBLOCK it returns at once, and
    // the check below refuses it. A regular file's reads ignore the flag (POSIX applies it to
    // FIFOs, sockets and devices only), so the handle is used as it is.
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NONBLOCK);
    let file = options.open(path).map_err(|e| fail(io_problem(path, e)))?;
    let meta = file.metadata().map_err(|e| fail(Problem::Io(e)))?;
    regular(&meta).map_err(fail)?;
    Ok(file)
}

/// The whole regular file at `path` (the value of `what`), refused past `limit` bytes.
pub fn read(what: &str, path: &Path, limit: Limit) -> Result<Vec<u8>, InputError> {
    let fail = |problem| InputError::new(what, path, problem);
    let file = open(what, path)?;
    let size = file.metadata().map_err(|e| fail(Problem::Io(e)))?.len();
    if size > limit.bytes {
        return Err(fail(Problem::TooLarge { size, limit }));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    // The size can change while reading; never read past the limit whatever it grows to.
    file.take(limit.bytes + 1).read_to_end(&mut bytes).map_err(|e| fail(Problem::Io(e)))?;
    if bytes.len() as u64 > limit.bytes {
        return Err(fail(Problem::TooLarge { size: bytes.len() as u64, limit }));
    }
    Ok(bytes)
}

/// [`read`] for a text file, which must be UTF-8.
pub fn read_to_string(what: &str, path: &Path, limit: Limit) -> Result<String, InputError> {
    let bytes = read(what, path, limit)?;
    String::from_utf8(bytes).map_err(|e| InputError::new(what, path, Problem::NotUtf8(e.utf8_error().valid_up_to())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_files_are_named_for_what_they_are() {
        let dir = tempfile::tempdir().unwrap();
        let e = read("config file", &dir.path().join("none.yml"), SETTINGS).unwrap_err();
        assert!(e.is_missing() && e.to_string().ends_with("none.yml\" does not exist"), "{e}");
        let e = read("tokenizer_path", dir.path(), TOKENIZER).unwrap_err();
        assert!(e.is_directory() && e.to_string().starts_with("tokenizer_path=\""), "{e}");
        let e = read("config file", Path::new("/dev/zero"), SETTINGS).unwrap_err();
        assert_eq!(
            e.to_string(),
            "config file \"/dev/zero\" is a device, not a regular file: maxrs reads a regular file there"
        );

        let looped = dir.path().join("loop");
        std::os::unix::fs::symlink(&looped, &looped).unwrap();
        assert!(matches!(read("x", &looped, SETTINGS).unwrap_err().problem(), Problem::SymlinkLoop));
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink("gone.json", &dangling).unwrap();
        let e = read("x", &dangling, SETTINGS).unwrap_err();
        assert!(e.to_string().ends_with("is a symlink to \"gone.json\", which does not exist"), "{e}");

        let fifo = dir.path().join("fifo");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let e = read("tokenizer_path", &fifo, TOKENIZER).unwrap_err();
        assert!(
            e.to_string()
                .ends_with("fifo\" is a FIFO (named pipe), not a regular file: maxrs reads a regular file there"),
            "{e}"
        );

        let odd = dir.path().join("a\nb");
        std::fs::write(&odd, [0xffu8, 0xfe]).unwrap();
        let e = read_to_string("config file", &odd, SETTINGS).unwrap_err();
        assert!(e.to_string().contains("a\\nb\" is not UTF-8 text (invalid byte at offset 0)"), "{e}");
    }

    #[test]
    fn a_file_past_its_limit_is_refused_unread() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.yml");
        std::fs::write(&path, vec![b'#'; 11]).unwrap();
        let small = Limit { bytes: 10, of: "a test file" };
        let e = read("config file", &path, small).unwrap_err();
        assert!(e.to_string().ends_with("is 11 bytes, more than the 10 bytes maxrs reads for a test file"), "{e}");
        assert_eq!(read("config file", &path, Limit { bytes: 11, ..small }).unwrap().len(), 11);
        assert_eq!((SETTINGS.to_string(), TOKENIZER.to_string()), ("64 MiB".into(), "1 GiB".into()));
    }
}
