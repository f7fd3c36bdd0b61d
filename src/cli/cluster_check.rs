//! `maxrs cluster-check [CONFIG] [key=value ...]`: checks a cluster under any launcher (see
//! `cluster::check`).

use std::time::Duration;

use anyhow::{bail, Result};
use maxrs::cluster::check::{cluster_check, CheckOptions};
use maxrs::config;

/// The largest collective message: nccl-tests' customary `-e 8G`.
const MAX_MIB: f64 = 8192.0;
/// Timed runs per size at most.
const MAX_ITERATIONS: usize = 10_000;

#[derive(clap::Args)]
pub struct ClusterCheckArgs {
    /// Stay registered (heartbeating) this many seconds after the checks.
    #[arg(long, default_value_t = 0.0)]
    hold_seconds: f64,
    /// Largest collective message in MiB (sizes grow 4x from 64 KiB).
    #[arg(long, default_value_t = 256.0)]
    max_mib: f64,
    /// Timed runs per collective and size.
    #[arg(long, default_value_t = 10)]
    iterations: usize,
    /// A config file (default: the built-in base.yml), then key=value overrides.
    #[arg(value_name = "CONFIG | key=value")]
    args: Vec<String>,
}

pub fn run(a: ClusterCheckArgs) -> Result<()> {
    // The hold is bounded like the timeout keys (a year).
    let max_hold = config::range("shutdown_timeout_seconds").map_or(365.0 * 86400.0, |r| r.max);
    if !(0.0..=max_hold).contains(&a.hold_seconds) {
        bail!("--hold-seconds {:?}: give 0 to {max_hold} seconds", a.hold_seconds);
    }
    if !(a.max_mib > 0.0 && a.max_mib <= MAX_MIB) {
        bail!("--max-mib {:?}: give a size above 0 and at most {MAX_MIB} MiB", a.max_mib);
    }
    if a.iterations == 0 || a.iterations > MAX_ITERATIONS {
        bail!("--iterations {}: give 1 to {MAX_ITERATIONS}", a.iterations);
    }
    let c = config::load_args(&a.args)?;
    let options = CheckOptions {
        hold: Duration::from_secs_f64(a.hold_seconds),
        max_bytes: (a.max_mib * (1 << 20) as f64) as usize,
        iterations: a.iterations,
    };
    cluster_check(&c, &options)
}
