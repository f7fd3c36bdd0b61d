//! `maxrs cluster-check [CONFIG] [key=value ...]`: checks a cluster under any launcher (see
//! `cluster::check`).

use std::time::Duration;

use anyhow::Result;
use maxrs::cluster::check::{cluster_check, CheckOptions};
use maxrs::config;

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
    let c = config::load_args(&a.args)?;
    let options = CheckOptions {
        hold: Duration::from_secs_f64(a.hold_seconds.max(0.0)),
        max_bytes: (a.max_mib.max(0.0) * (1 << 20) as f64) as usize,
        iterations: a.iterations,
    };
    cluster_check(&c, &options)
}
