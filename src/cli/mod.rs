//! Subcommand implementations and what they share: logging set-up and `key=value` parsing.

pub mod cluster_check;
pub mod coordinator;
pub mod decode;
pub mod devices;
pub mod launch;
pub mod submit;
pub mod topologies;
pub mod train;
pub mod train_compile;

use anyhow::{bail, Result};

/// Logs go to stderr; `RUST_LOG` picks the level (default: info for maxrs, warn for the rest).
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,maxrs=info"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false).init();
}

/// Splits `key=value` arguments, refusing anything else with a message naming it.
pub fn parse_key_values(args: &[String]) -> Result<Vec<(String, String)>> {
    args.iter()
        .map(|arg| match arg.split_once('=') {
            Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
            _ => bail!("expected key=value, got {arg:?}"),
        })
        .collect()
}
