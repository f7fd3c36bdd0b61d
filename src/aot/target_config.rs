//! The GPU description a CUDA plugin compiles against when no GPU is attached: the text of an
//! XLA `stream_executor.GpuTargetConfigProto` (its `target_config` topology option), from, in
//! order: the file `gpu_target_config=FILE` names; the plugin file itself (XLA embeds one text
//! per GPU model in the plugin library, so it matches that build); maxrs's own copy
//! (`gpu_targets/*.txtpb`, read out of the pinned plugin and labelled with its version), for
//! plugin builds that embed none (jax-cuda13-pjrt 0.11.2 embeds none).
//!
//! In the plugin each text is a NUL-terminated string that starts with OpenXLA's license
//! comment, holds a `gpu_device_info { ... }` block, and names the model in
//! `device_description_str`.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{anyhow, Result};
use memchr::memmem;

use super::topology::GpuTarget;

/// Read size while scanning (plugins are ~500 MB; the whole file is never held at once).
const CHUNK: usize = 8 << 20;
/// A text is ~5 KB; longer runs between NULs are not target configs. Also how many bytes of one
/// chunk are kept for the next, so a text across a chunk edge is seen whole in the next window.
const MAX_TEXT: usize = 64 << 10;

/// The plugin build maxrs's copies were read from (jax-cuda12-pjrt of the same version holds
/// the same texts).
pub const BUNDLED_FROM: &str = "jax-cuda13-pjrt 0.12.0.1";

/// maxrs's copy of `target`'s description.
fn bundled(target: GpuTarget) -> &'static str {
    match target {
        GpuTarget::H100Sxm => include_str!("gpu_targets/h100-sxm.txtpb"),
        GpuTarget::H200 => include_str!("gpu_targets/h200.txtpb"),
    }
}

/// A GPU description and where it came from (for the start-up line and errors).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetDescription {
    pub text: Arc<str>,
    pub source: String,
}

/// `target`'s description for the CUDA plugin at `plugin`: from `file` when given, else the
/// plugin's own, else maxrs's copy. Scanning the plugin takes about a second, so results are
/// kept for the process, per plugin file and target.
pub fn gpu_target_config(plugin: &Path, target: GpuTarget, file: Option<&Path>) -> Result<TargetDescription> {
    if let Some(file) = file {
        let text = crate::input::read_to_string("gpu_target_config", file, crate::input::SETTINGS)?;
        check_describes(&text, target)
            .map_err(|problem| anyhow!("gpu_target_config={:?} {problem}", file.display().to_string()))?;
        return Ok(TargetDescription { text: text.into(), source: format!("the file {}", file.display()) });
    }
    type Key = (PathBuf, &'static str);
    static MEMO: OnceLock<Mutex<HashMap<Key, TargetDescription>>> = OnceLock::new();
    let key = (plugin.to_path_buf(), target.xla_name());
    let memo = MEMO.get_or_init(Default::default);
    if let Some(found) = memo.lock().expect("target config memo poisoned").get(&key) {
        return Ok(found.clone());
    }
    let needle = format!("device_description_str: \"{}\"", target.device_kind());
    let found = match find_text(plugin, needle.as_bytes())? {
        Some(text) => TargetDescription { text: text.into(), source: "the plugin file".to_string() },
        None => TargetDescription {
            text: bundled(target).into(),
            source: format!("maxrs's copy from {BUNDLED_FROM} (this plugin build embeds none)"),
        },
    };
    memo.lock().expect("target config memo poisoned").insert(key, found.clone());
    Ok(found)
}

/// The numbers of a `gpu_device_info` block that XLA sizes kernels and buffers by, divides by,
/// or checks the step's memory against: a description must give each, positive. (A
/// `threads_per_warp: 0` killed the compile with SIGFPE, and `device_memory_size: 0` was
/// compiled against.)
const POSITIVE_DEVICE_INFO: [&str; 17] = [
    "threads_per_block_limit",
    "threads_per_warp",
    "shared_memory_per_block",
    "shared_memory_per_core",
    "threads_per_core_limit",
    "core_count",
    "fpus_per_core",
    "block_dim_limit_x",
    "block_dim_limit_y",
    "block_dim_limit_z",
    "memory_bandwidth",
    "l2_cache_size",
    "clock_rate_ghz",
    "device_memory_size",
    "shared_memory_per_block_optin",
    "registers_per_core_limit",
    "registers_per_block_limit",
];

/// Why `text` is not a description of `target`, if it is not.
fn check_describes(text: &str, target: GpuTarget) -> std::result::Result<(), String> {
    let Some(info) = device_info_fields(text) else {
        return Err("is not an XLA GpuTargetConfigProto text (no `gpu_device_info { ... }` block); give one such as \
                    src/aot/gpu_targets/h100-sxm.txtpb"
            .to_string());
    };
    for field in POSITIVE_DEVICE_INFO {
        let value = info.iter().find(|(name, _)| *name == field).map(|(_, value)| *value);
        if !value.and_then(|v| v.parse::<f64>().ok()).is_some_and(|v| v.is_finite() && v > 0.0) {
            return Err(format!(
                "gives gpu_device_info.{field} {}; it must be a positive number (see \
                 src/aot/gpu_targets/h100-sxm.txtpb)",
                value.map_or("no value".to_string(), |v| format!("as {v}"))
            ));
        }
    }
    let named = text.lines().find_map(|l| l.trim().strip_prefix("device_description_str:")).map(str::trim);
    let wanted = format!("\"{}\"", target.device_kind());
    match named {
        Some(named) if named == wanted => Ok(()),
        named => Err(format!(
            "describes {}, but the topology's GPU is {wanted}; give a description of that GPU, or leave \
             gpu_target_config unset",
            named.unwrap_or("no device (no device_description_str)")
        )),
    }
}

/// The `name: value` fields directly inside the text's `gpu_device_info { ... }` block (not
/// those of blocks nested in it), or `None` when it has no such block. Text format puts one
/// field or brace per line in XLA's descriptions; `#` starts a comment.
fn device_info_fields(text: &str) -> Option<Vec<(&str, &str)>> {
    let mut lines = text.lines().map(|l| l.split('#').next().unwrap_or("").trim());
    lines.find(|l| {
        l.strip_prefix("gpu_device_info").is_some_and(|rest| rest.trim_start().trim_start_matches(':').trim() == "{")
    })?;
    let (mut depth, mut fields) = (1usize, Vec::new());
    for line in lines {
        if line.ends_with('{') {
            depth += 1;
        } else if line == "}" {
            depth -= 1;
            if depth == 0 {
                return Some(fields);
            }
        } else if depth == 1 {
            if let Some((name, value)) = line.split_once(':') {
                fields.push((name.trim(), value.trim()));
            }
        }
    }
    None
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
    fn a_plugin_without_the_target_gets_maxrss_copy_and_a_file_wins() {
        // A "plugin" that embeds the H100's description only.
        let plugin = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(plugin.path(), format!("\0{}\0", config("NVIDIA H100 80GB HBM3"))).unwrap();
        let h200 = gpu_target_config(plugin.path(), GpuTarget::H200, None).unwrap();
        assert_eq!(&*h200.text, bundled(GpuTarget::H200));
        assert!(h200.source.contains("jax-cuda13-pjrt 0.12.0.1"), "{}", h200.source);
        let h100 = gpu_target_config(plugin.path(), GpuTarget::H100Sxm, None).unwrap();
        assert_eq!((&*h100.text, h100.source.as_str()), (config("NVIDIA H100 80GB HBM3").as_str(), "the plugin file"));
        // A named file is used as is, for the GPU it describes only.
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), bundled(GpuTarget::H100Sxm)).unwrap();
        let given = gpu_target_config(Path::new("/nonexistent"), GpuTarget::H100Sxm, Some(file.path())).unwrap();
        assert!(given.source.contains(&file.path().display().to_string()));
        let err = gpu_target_config(Path::new("/x"), GpuTarget::H200, Some(file.path())).unwrap_err().to_string();
        assert!(
            err.contains("describes \"NVIDIA H100 80GB HBM3\", but the topology's GPU is \"NVIDIA H200 141GB HBM3e\""),
            "{err}"
        );
        std::fs::write(file.path(), "name: \"x\"").unwrap();
        let err = gpu_target_config(Path::new("/x"), GpuTarget::H200, Some(file.path())).unwrap_err().to_string();
        assert!(err.contains("is not an XLA GpuTargetConfigProto text") && !err.contains('\n'), "{err}");
    }

    /// A description XLA would divide by zero with, or size a device of no memory by, is refused
    /// naming the field (a description of a modified GPU may change any number).
    #[test]
    fn a_description_needs_every_size_positive() {
        let h100 = bundled(GpuTarget::H100Sxm);
        for (from, to, said) in [
            ("threads_per_warp: 32", "threads_per_warp: 0", "gpu_device_info.threads_per_warp as 0"),
            ("device_memory_size: 84942979072", "device_memory_size: 0", "device_memory_size as 0"),
            ("clock_rate_ghz: 1.98\n  device", "clock_rate_ghz: -1\n  device", "clock_rate_ghz as -1"),
            ("  core_count: 132\n", "", "gpu_device_info.core_count no value"),
        ] {
            assert!(h100.contains(from), "{from}");
            let problem = check_describes(&h100.replacen(from, to, 1), GpuTarget::H100Sxm).unwrap_err();
            assert!(problem.contains(said) && problem.contains("must be a positive number"), "{problem}");
        }
        // The same names nested deeper (a unit's clock) are not the device's.
        let nested = h100.replacen("clock_rate_ghz: 1.98\n  device", "device", 1);
        assert!(check_describes(&nested, GpuTarget::H100Sxm).unwrap_err().contains("clock_rate_ghz no value"));
    }

    /// maxrs's copies are what the pinned plugin embeds, with the device the catalog names.
    #[test]
    fn the_bundled_copies_describe_the_catalog_gpus() {
        for target in [GpuTarget::H100Sxm, GpuTarget::H200] {
            check_describes(bundled(target), target).unwrap();
            let memory = format!("device_memory_size: {}\n", target.memory_bytes());
            assert!(bundled(target).contains(&memory), "{target:?}");
        }
    }
}
