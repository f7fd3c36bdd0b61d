//! The XLA flag names a plugin knows, read from the plugin file itself: XLA registers each flag
//! by a string literal (`tsl::Flag("xla_...", ...)`), so every name is a NUL-terminated string
//! in the library's data. A flag XLA removed leaves at most its reserved proto field name, which
//! is not NUL-terminated, so it is not taken. Scanning reads the whole file (200-500 MB; about
//! 1 s in a debug build), so results are kept per file version (path, size, modification time):
//! in memory for the process and as a list in `<cache>/xla-flag-names/`.

use std::collections::{BTreeSet, HashMap};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

use anyhow::{anyhow, Result};
use memchr::memmem;
use sha2::{Digest, Sha256};

use crate::pjrt::provision::cache_dir;

/// Every name starts with this; other flag families (e.g. TF's) are not parsed from XLA_FLAGS.
const PREFIX: &[u8] = b"xla_";
/// Longer strings are not flag names; bounds how much of a chunk is carried to the next.
const MAX_NAME: usize = 256;
const CHUNK: usize = 8 << 20;

/// The flag-like names in `plugin`: each `xla_[a-z0-9_]+` followed by a NUL byte. A superset of
/// the flags (a few other identifiers match too), which is harmless for validation.
pub(crate) fn known_names(plugin: &Path) -> Result<Arc<BTreeSet<String>>> {
    type Key = (PathBuf, u64, Option<SystemTime>);
    static MEMO: OnceLock<Mutex<HashMap<Key, Arc<BTreeSet<String>>>>> = OnceLock::new();
    let meta = std::fs::metadata(plugin).map_err(|e| anyhow!("cannot read plugin file {}: {e}", plugin.display()))?;
    let key = (plugin.to_path_buf(), meta.len(), meta.modified().ok());
    let memo = MEMO.get_or_init(Default::default);
    if let Some(names) = memo.lock().expect("flag-name memo poisoned").get(&key) {
        return Ok(names.clone());
    }
    let stored = disk_cache_path(&key);
    let names = match crate::input::read_to_string("XLA flag-name cache", &stored, crate::input::SETTINGS) {
        Ok(text) => text.lines().map(str::to_string).collect(),
        Err(_) => {
            let names = scan(plugin)?;
            store(&stored, &names);
            names
        }
    };
    let names = Arc::new(names);
    memo.lock().expect("flag-name memo poisoned").insert(key, names.clone());
    Ok(names)
}

/// `<cache>/xla-flag-names/<hash of the file version>.txt`.
fn disk_cache_path((path, size, modified): &(PathBuf, u64, Option<SystemTime>)) -> PathBuf {
    let mut hasher = Sha256::new();
    hasher.update(path.as_os_str().as_encoded_bytes());
    hasher.update(size.to_le_bytes());
    let nanos = modified.and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok()).map_or(0, |d| d.as_nanos());
    hasher.update(nanos.to_le_bytes());
    let hex = crate::pjrt::provision::hex(&hasher.finalize()[..12]);
    cache_dir().join("xla-flag-names").join(format!("{hex}.txt"))
}

/// Saves the list atomically; a cache that cannot be written only costs a rescan next time.
fn store(dest: &Path, names: &BTreeSet<String>) {
    let write = || -> std::io::Result<()> {
        let dir = dest.parent().expect("cache paths have a parent");
        std::fs::create_dir_all(dir)?;
        let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
        for name in names {
            writeln!(tmp, "{name}")?;
        }
        tmp.persist(dest)?;
        Ok(())
    };
    if let Err(e) = write() {
        tracing::debug!(path = %dest.display(), "cannot store XLA flag names: {e}");
    }
}

/// Reads the file in chunks (plugins are 200-500 MB) and collects the names.
fn scan(plugin: &Path) -> Result<BTreeSet<String>> {
    let mut file = crate::input::open("plugin", plugin)?;
    let finder = memmem::Finder::new(PREFIX);
    let mut names = BTreeSet::new();
    let mut buf = vec![0u8; CHUNK + MAX_NAME];
    let mut carried = 0;
    loop {
        let n =
            file.read(&mut buf[carried..]).map_err(|e| anyhow!("cannot read plugin file {}: {e}", plugin.display()))?;
        let filled = carried + n;
        if n == 0 {
            // A name needs its NUL, so an unterminated tail holds none.
            break;
        }
        // Only text up to the last NUL is complete; the rest may continue in the next chunk.
        let complete = memchr::memrchr(0, &buf[..filled]).map_or(0, |i| i + 1);
        collect(&finder, &buf[..complete], &mut names);
        let tail_start = complete.max(filled.saturating_sub(MAX_NAME));
        buf.copy_within(tail_start..filled, 0);
        carried = filled - tail_start;
    }
    Ok(names)
}

/// Adds each `xla_[a-z0-9_]+\0` in `bytes`. A match inside a longer string (`foo_xla_bar\0`) is
/// kept too: linkers merge string tails, so a real name may be stored as such a suffix.
fn collect(finder: &memmem::Finder, bytes: &[u8], names: &mut BTreeSet<String>) {
    for start in finder.find_iter(bytes) {
        let rest = &bytes[start..];
        let len = rest
            .iter()
            .take(MAX_NAME)
            .position(|b| !(b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'_'))
            .unwrap_or(MAX_NAME);
        let name = &rest[..len];
        // Names stored back to back without NULs (a table of string views) run together; each
        // one is found on its own at its own `xla_`, so the run itself is not a name.
        let run_together = finder.find(&name[PREFIX.len()..]).is_some();
        if len > PREFIX.len() && rest.get(len) == Some(&0) && !run_together {
            // Only ASCII bytes were accepted above.
            names.insert(String::from_utf8_lossy(name).into_owned());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_nul_terminated_names_across_chunk_edges() {
        // The first name straddles the end of the first read (CHUNK + MAX_NAME bytes).
        let mut bytes = vec![b'x'; CHUNK + MAX_NAME - 6];
        bytes.extend_from_slice(b"\0xla_cpu_enable_fast_math\0");
        bytes.extend_from_slice(b"junk_xla_tail_merged\0xla_Upper\0xla_\0xla_run_onexla_run_two\0xla_unterminated");
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), &bytes).unwrap();
        // `scan`, not `known_names`: a temporary file has no place in the user's cache.
        let names = scan(file.path()).unwrap();
        let expected: BTreeSet<String> =
            ["xla_cpu_enable_fast_math", "xla_tail_merged", "xla_run_two"].into_iter().map(String::from).collect();
        assert_eq!(names, expected);
    }
}
