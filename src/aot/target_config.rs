//! The GPU description a CUDA plugin compiles against when no GPU is attached: the text of an
//! XLA `stream_executor.GpuTargetConfigProto` (its `target_config` topology option). XLA embeds
//! one such text per GPU model in the plugin library, so maxrs reads it from the very plugin
//! file that compiles with it: the description always matches that plugin build, and nothing
//! has to be shipped or downloaded beside the plugin.
//!
//! In the file each text is a NUL-terminated string that starts with OpenXLA's license comment,
//! holds a `gpu_device_info { ... }` block, and names the model in `device_description_str`.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{anyhow, bail, Result};
use memchr::memmem;

use super::topology::GpuTarget;

/// Read size while scanning (plugins are ~500 MB; the whole file is never held at once).
const CHUNK: usize = 8 << 20;
/// A text is ~5 KB; longer runs between NULs are not target configs. Also how many bytes of one
/// chunk are kept for the next, so a text across a chunk edge is seen whole in the next window.
const MAX_TEXT: usize = 64 << 10;

/// The text of `target`'s config in the CUDA plugin at `plugin`. Scanning takes about a second,
/// so results are kept for the process, per plugin file and target.
pub fn gpu_target_config(plugin: &Path, target: GpuTarget) -> Result<Arc<str>> {
    type Key = (PathBuf, &'static str);
    static MEMO: OnceLock<Mutex<HashMap<Key, Arc<str>>>> = OnceLock::new();
    let key = (plugin.to_path_buf(), target.xla_name());
    let memo = MEMO.get_or_init(Default::default);
    if let Some(text) = memo.lock().expect("target config memo poisoned").get(&key) {
        return Ok(text.clone());
    }
    let needle = format!("device_description_str: \"{}\"", target.device_kind());
    let text: Arc<str> = match find_text(plugin, needle.as_bytes())? {
        Some(text) => text.into(),
        None => bail!(
            "the CUDA plugin {} has no GPU target config for {} (no `{needle}` in the file), so it cannot \
             compile for `{}` without that GPU; use the pinned plugin (`cuda12` or `cuda13`), whose XLA \
             ships it",
            plugin.display(),
            target.device_kind(),
            target.xla_name(),
        ),
    };
    memo.lock().expect("target config memo poisoned").insert(key, text.clone());
    Ok(text)
}

/// Scans `path` for the NUL-delimited config text containing `needle`.
fn find_text(path: &Path, needle: &[u8]) -> Result<Option<String>> {
    let read_error = |e: std::io::Error| anyhow!("cannot read plugin file {}: {e}", path.display());
    let mut file = crate::input::open("plugin", path)?;
    let finder = memmem::Finder::new(needle);
    let mut buf = vec![0u8; CHUNK + MAX_TEXT];
    let mut filled = 0;
    loop {
        let n = file.read(&mut buf[filled..]).map_err(read_error)?;
        filled += n;
        if n > 0 && filled < buf.len() {
            continue;
        }
        let window = &buf[..filled];
        if let Some(text) = finder.find_iter(window).find_map(|at| config_text_around(window, at)) {
            return Ok(Some(text));
        }
        if n == 0 {
            return Ok(None);
        }
        // A text of at most MAX_TEXT bytes that ends past this window starts within its last
        // MAX_TEXT bytes, so it lies wholly in the next window.
        buf.copy_within(filled - MAX_TEXT..filled, 0);
        filled = MAX_TEXT;
    }
}

/// The string around position `at` of `window`, bounded by NULs on both sides within
/// `MAX_TEXT`, if it is a target config.
fn config_text_around(window: &[u8], at: usize) -> Option<String> {
    let from = at.saturating_sub(MAX_TEXT);
    let start = from + memchr::memrchr(0, &window[from..at])? + 1;
    let end = at + memchr::memchr(0, &window[at..window.len().min(at + MAX_TEXT)])?;
    let text = std::str::from_utf8(&window[start..end]).ok()?;
    text.contains("gpu_device_info").then(|| text.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(kind: &str) -> String {
        format!("# comment\ngpu_device_info {{\n  core_count: 132\n}}\ndevice_description_str: \"{kind}\"\n")
    }

    #[test]
    fn finds_the_text_across_a_chunk_edge_and_skips_look_alikes() {
        let h100 = config("NVIDIA H100 80GB HBM3");
        let mut bytes = vec![b'x'; 1000];
        // A longer model name sharing the prefix, and the exact name outside a config text.
        bytes.extend_from_slice(b"\0");
        bytes.extend_from_slice(config("NVIDIA H100 80GB HBM3 MIG 1g.10gb").as_bytes());
        bytes.extend_from_slice(b"\0device_description_str: \"NVIDIA H100 80GB HBM3\"\0");
        // The real one straddles the end of the first read.
        bytes.resize(CHUNK + MAX_TEXT - 40, b'y');
        bytes.push(0);
        bytes.extend_from_slice(h100.as_bytes());
        bytes.extend_from_slice(b"\0tail");
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), &bytes).unwrap();
        let needle = b"device_description_str: \"NVIDIA H100 80GB HBM3\"";
        assert_eq!(find_text(file.path(), needle).unwrap(), Some(h100));
        assert_eq!(find_text(file.path(), b"device_description_str: \"NVIDIA H200 141GB HBM3e\"").unwrap(), None);
    }

    #[test]
    fn a_plugin_without_the_target_is_an_error_naming_the_file() {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), config("NVIDIA H100 80GB HBM3")).unwrap();
        let err = gpu_target_config(file.path(), GpuTarget::H200).unwrap_err().to_string();
        assert!(err.contains(&file.path().display().to_string()) && err.contains("NVIDIA H200 141GB HBM3e"), "{err}");
    }
}
