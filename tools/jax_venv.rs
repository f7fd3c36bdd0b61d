//! The Python environment of the JAX comparisons in `tools/` (`bench`, `decode_bench`): a
//! virtualenv at `tools/.venv-jax` with `tools/requirements-jax.txt` installed, made once and
//! remade when the requirements change.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

pub fn tools_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tools")
}

/// The virtualenv's python, creating the virtualenv and installing the pinned requirements when
/// they are missing or changed (python3.12 when present, or `MAXRS_BENCH_PYTHON`).
pub fn jax_python() -> Result<PathBuf> {
    let venv = tools_dir().join(".venv-jax");
    let python = venv.join("bin/python");
    let requirements = tools_dir().join("requirements-jax.txt");
    let wanted = std::fs::read_to_string(&requirements)?;
    let stamp = venv.join("installed-requirements.txt");
    if python.exists() && std::fs::read_to_string(&stamp).ok().as_deref() == Some(wanted.as_str()) {
        return Ok(python);
    }
    let base = std::env::var("MAXRS_BENCH_PYTHON").unwrap_or_else(|_| {
        let has = |p: &str| Command::new(p).arg("--version").output().is_ok_and(|o| o.status.success());
        if has("python3.12") { "python3.12" } else { "python3" }.to_string()
    });
    println!("creating {} with {base} and installing {}", venv.display(), requirements.display());
    let run = |cmd: &mut Command| -> Result<()> {
        let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
        if !status.success() {
            bail!("{cmd:?} failed ({status})");
        }
        Ok(())
    };
    run(Command::new(&base).args(["-m", "venv"]).arg(&venv))?;
    run(Command::new(&python).args(["-m", "pip", "install", "--quiet", "-r"]).arg(&requirements))?;
    std::fs::write(&stamp, wanted)?;
    Ok(python)
}
