//! Bad flag values. XLA parses `XLA_FLAGS` inside the plugin and ends the whole process when a
//! value does not parse (`--xla_cpu_enable_fast_math=maybe`), after a 90-line usage dump. The
//! names are checked against the plugin file (`scan`), but the types are only known to XLA, so
//! the values are tried in a child process: the `maxrs` binary run as `maxrs __xla-flags-probe
//! PLUGIN` loads the plugin and creates a client with the same `XLA_FLAGS`. If the child dies
//! on a value, its report is turned into one line per flag, with the type and default XLA
//! lists for it. A set of flags that passed is remembered per plugin file version
//! (`<cache>/xla-flag-values/`), so the probe costs one plugin start per new set of flags, and
//! nothing when `XLA_FLAGS` is empty (the default run).
//!
//! Only the binary can re-run itself: it calls [`enable`] at start (the library in tests does not,
//! and skips the probe). A child that fails for another reason (a GPU plugin on a machine
//! without a GPU) proves nothing, and the run goes on.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant, UNIX_EPOCH};

use anyhow::{bail, Result};
use sha2::{Digest, Sha256};

use crate::pjrt::provision::cache_dir;
use crate::pjrt::{Client, Plugin, Value};

/// The hidden first argument that makes the binary a probe.
pub const PROBE_ARG: &str = "__xla-flags-probe";
/// How long a probe may take (a plugin start is about a second).
const PROBE_TIMEOUT: Duration = Duration::from_secs(120);

static PROGRAM: OnceLock<PathBuf> = OnceLock::new();

/// Lets [`check_values`] run `program` (the `maxrs` binary) as the probe.
pub fn enable(program: PathBuf) {
    let _ = PROGRAM.set(program);
}

/// The probe's side: load `plugin` and create a client under the inherited `XLA_FLAGS`.
/// Exit 0: the flags parsed; 3: the client could not be made for another reason.
pub fn probe_main(plugin: &Path) -> ExitCode {
    let created = Plugin::load(plugin).map_err(anyhow::Error::from).and_then(|p| {
        Client::create(&p, &[] as &[(String, Value)], None)?;
        Ok(())
    });
    match created {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::from(3),
    }
}

/// Checks the values of the flags in `xla_flags` (the `XLA_FLAGS` text) with `plugin` (see the
/// module docs). The error names each flag whose value XLA cannot read.
pub fn check_values(xla_flags: &str, plugin: &Path) -> Result<()> {
    let Some(program) = PROGRAM.get() else { return Ok(()) };
    if xla_flags.trim().is_empty() {
        return Ok(());
    }
    let marker = marker_path(xla_flags, plugin);
    if marker.as_ref().is_some_and(|m| m.is_file()) {
        return Ok(());
    }
    let Some((status_ok, stderr)) = run_probe(program, plugin) else { return Ok(()) };
    let bad = bad_values(&stderr);
    if !bad.is_empty() {
        bail!(
            "XLA_FLAGS: {}; XLA would end the process on {} (flags may change type between XLA versions)",
            bad.join("; "),
            if bad.len() == 1 { "it" } else { "them" }
        );
    }
    if status_ok {
        if let Some(marker) = marker {
            let _ = crate::files::write_atomic(&marker, |_| Ok(()));
        }
    } else {
        tracing::debug!("the XLA flag probe could not start {}; its values are not checked", plugin.display());
    }
    Ok(())
}

/// `<cache>/xla-flag-values/<sha256 of the flags and the plugin file version>`.
fn marker_path(xla_flags: &str, plugin: &Path) -> Option<PathBuf> {
    let meta = std::fs::metadata(plugin).ok()?;
    let mtime = meta.modified().ok()?.duration_since(UNIX_EPOCH).ok()?.as_nanos();
    let mut hasher = Sha256::new();
    hasher.update(xla_flags.as_bytes());
    hasher.update([0]);
    hasher.update(plugin.as_os_str().as_encoded_bytes());
    hasher.update(meta.len().to_le_bytes());
    hasher.update(mtime.to_le_bytes());
    let hex = crate::pjrt::provision::hex(&hasher.finalize()[..12]);
    Some(cache_dir().join("xla-flag-values").join(hex))
}

/// Runs the probe; its success and stderr, or `None` when it could not be run or timed out.
fn run_probe(program: &Path, plugin: &Path) -> Option<(bool, String)> {
    let mut child = Command::new(program)
        .arg(PROBE_ARG)
        .arg(plugin)
        .env("TF_CPP_MIN_LOG_LEVEL", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    let mut pipe = child.stderr.take()?;
    // Read while the child runs, so a long report cannot fill the pipe and stall it.
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + PROBE_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    };
    Some((status.success(), reader.join().ok()?))
}

/// `--name=value is not a valid TYPE (XLA's default: D)` for each value XLA refused, from its
/// report: `Couldn't interpret value V for flag F.` lines and the usage table's
/// `\t--F=DEFAULT\tTYPE\tDESCRIPTION` rows.
fn bad_values(stderr: &str) -> Vec<String> {
    const MARK: &str = "Couldn't interpret value ";
    let mut bad = Vec::new();
    for line in stderr.lines() {
        let Some(rest) = line.split_once(MARK).map(|(_, r)| r) else { continue };
        let Some((value, flag)) = rest.rsplit_once(" for flag ") else { continue };
        let flag = flag.trim_end_matches('.');
        let row = stderr.lines().find_map(|l| {
            let mut cells = l.trim_start().split('\t');
            let first = cells.next()?.strip_prefix(&format!("--{flag}="))?;
            Some((first.trim().to_string(), cells.next()?.trim().to_string()))
        });
        bad.push(match row {
            Some((default, ty)) => format!("--{flag}={value} is not a valid {ty} (XLA's default: {default})"),
            None => format!("--{flag}={value} is not a value XLA can read"),
        });
    }
    bad
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xlas_report_becomes_one_line_per_flag() {
        // Captured from the CPU plugin (lammps-jax-pjrt-cpu 0.11.2), shortened.
        let stderr = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n\
            E0000 00:00:1795448381.584234    4519 command_line_flags.cc:93] Couldn't interpret value maybe for flag xla_cpu_enable_fast_math.\n\
            E0000 00:00:1795448381.584342    4519 command_line_flags.cc:63] Couldn't interpret value high for flag xla_backend_optimization_level.\n\
            usage: --xla_cpu_enable_fast_math=maybe --xla_backend_optimization_level=high\n\
            Flags:\n\
            \t--xla_cpu_enable_fast_math=false \tbool\tEnable unsafe fast-math optimizations in the CPU compiler.\n\
            \t--xla_backend_optimization_level=3\tint32\tNumerical optimization level for the XLA compiler backend.\n";
        assert_eq!(
            bad_values(stderr),
            [
                "--xla_cpu_enable_fast_math=maybe is not a valid bool (XLA's default: false)",
                "--xla_backend_optimization_level=high is not a valid int32 (XLA's default: 3)",
            ]
        );
        assert!(bad_values("F0000 something else died\n").is_empty());
    }
}
