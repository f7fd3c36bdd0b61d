//! TensorBoard's own event-file reader (`EventAccumulator`, which checks the TFRecord CRCs), in
//! a Python virtualenv made once and kept in maxrs's cache (`$MAXRS_CACHE/venvs/`). Only the
//! packages the reader imports are installed (`--no-deps`), pinned.

use std::path::{Path, PathBuf};
use std::process::Command;

const PACKAGES: &[&str] =
    &["tensorboard==2.21.0", "protobuf==7.36.2", "numpy==2.4.6", "absl-py==2.5.1", "packaging==26.3", "six==1.17.0"];

const READ_SCALARS: &str = r#"
import json, sys
from tensorboard.backend.event_processing import event_accumulator as ea
acc = ea.EventAccumulator(sys.argv[1], size_guidance={ea.SCALARS: 0})
acc.Reload()
print(json.dumps({t: [[e.step, e.value] for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}))
"#;

/// The venv's python, created on first use. `None` (the caller returns) when python3 has no
/// `venv` (saying so), or PyPI cannot be reached and [`super::provision::skip_offline`] skips.
fn python() -> Option<PathBuf> {
    let venv = maxrs::pjrt::provision::cache_dir().join("venvs").join("tensorboard-2.21.0");
    let python = venv.join("bin/python");
    if python.is_file() {
        return Some(python);
    }
    let staging = venv.with_extension(format!("tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    let made =
        Command::new("python3").args(["-m", "venv"]).arg(&staging).status().map(|s| s.success()).unwrap_or(false);
    if !made {
        println!("skipped: python3 -m venv is not available, so TensorBoard's reader cannot run");
        return None;
    }
    let installed = Command::new(staging.join("bin/pip"))
        .args(["install", "-q", "--disable-pip-version-check", "--no-deps"])
        .args(PACKAGES)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !installed {
        let _ = std::fs::remove_dir_all(&staging);
        super::provision::skip_offline(&format!("pip install {PACKAGES:?} failed"));
        return None;
    }
    // Another test process may have finished first: either copy is fine.
    if std::fs::rename(&staging, &venv).is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    Some(python)
}

/// Every scalar tag in the event files of `dir`, as TensorBoard reads them: tag -> [(step, value)].
pub fn scalars(dir: &Path) -> Option<serde_json::Value> {
    let python = python()?;
    let out = Command::new(python).args(["-c", READ_SCALARS]).arg(dir).current_dir("/").output().unwrap();
    assert!(out.status.success(), "TensorBoard's reader failed: {}", String::from_utf8_lossy(&out.stderr));
    Some(serde_json::from_slice(&out.stdout).expect("the reader prints JSON"))
}
