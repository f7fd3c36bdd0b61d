//! Finding files that pip installed: asks `python3` (or `$MAXRS_PYTHON`) once for its `sys.path`
//! and looks for a wheel member there, with the version from the package's `.dist-info` folder.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use super::command::stdout_within;

/// How long `python3` may take to print its path; a slow interpreter must not stall maxrs.
const PYTHON_TIMEOUT: Duration = Duration::from_secs(5);

/// The interpreter whose packages maxrs looks in (default `python3` on `PATH`); set to an empty
/// value, maxrs looks in no Python packages at all (and starts no interpreter: asking one through
/// pyenv's shims costs ~0.2 s of every command's start).
const PYTHON_ENV: &str = "MAXRS_PYTHON";

/// The existing directories on `python3`'s `sys.path`; empty when there is no usable python3 or
/// `$MAXRS_PYTHON` is empty. Asked once per process.
pub(super) fn site_dirs() -> &'static [PathBuf] {
    static DIRS: OnceLock<Vec<PathBuf>> = OnceLock::new();
    DIRS.get_or_init(|| {
        let python = std::env::var_os(PYTHON_ENV).unwrap_or_else(|| "python3".into());
        if python.is_empty() {
            return Vec::new();
        }
        let mut cmd = Command::new(python);
        cmd.args(["-c", "import sys, json; print(json.dumps(sys.path))"]);
        let dirs = stdout_within(cmd, PYTHON_TIMEOUT)
            .and_then(|out| serde_json::from_str::<Vec<String>>(out.trim()).ok())
            .unwrap_or_default()
            .into_iter()
            .map(PathBuf::from)
            // "" is the script's directory: a relative entry would depend on the working directory.
            .filter(|dir| dir.is_absolute() && dir.is_dir())
            .collect();
        tracing::debug!(?dirs, "python3 sys.path");
        dirs
    })
}

/// A file installed by pip, and its package's version when the `.dist-info` folder tells it.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Installed {
    pub path: PathBuf,
    pub version: Option<String>,
}

/// The first `<dir>/<member>` that exists among `dirs`, in `sys.path` order (the one Python imports).
pub(super) fn find_installed(dirs: &[PathBuf], package: &str, member: &str) -> Option<Installed> {
    dirs.iter().find_map(|dir| {
        let path = dir.join(member);
        path.is_file().then(|| Installed { version: dist_info_version(dir, package), path })
    })
}

/// The version in `<dir>/<normalized package>-<version>.dist-info`, if pip left one.
pub(super) fn dist_info_version(dir: &Path, package: &str) -> Option<String> {
    let wanted = normalize(package);
    std::fs::read_dir(dir).ok()?.flatten().find_map(|entry| {
        let file_name = entry.file_name().into_string().ok()?;
        let (name, version) = file_name.strip_suffix(".dist-info")?.split_once('-')?;
        (normalize(name) == wanted).then(|| version.to_string())
    })
}

/// Wheel and dist-info names spell `-` and `.` as `_` and may differ in case (PEP 427/503).
pub(super) fn normalize(name: &str) -> String {
    name.chars().map(|c| if c == '-' || c == '.' { '_' } else { c.to_ascii_lowercase() }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_member_and_dist_info_version() {
        let site = tempfile::tempdir().unwrap();
        let so = site.path().join("jax_plugins/xla_cuda13/xla_cuda_plugin.so");
        std::fs::create_dir_all(so.parent().unwrap()).unwrap();
        std::fs::write(&so, b"not really a plugin").unwrap();
        std::fs::create_dir(site.path().join("jax_cuda13_pjrt-0.11.2.dist-info")).unwrap();
        let empty = tempfile::tempdir().unwrap();
        let dirs = [empty.path().to_path_buf(), site.path().to_path_buf()];
        let found = find_installed(&dirs, "jax-cuda13-pjrt", "jax_plugins/xla_cuda13/xla_cuda_plugin.so");
        assert_eq!(found, Some(Installed { path: so, version: Some("0.11.2".into()) }));
        assert_eq!(find_installed(&dirs, "libtpu", "libtpu/libtpu.so"), None);
    }
}
