//! Subcommand implementations and what they share: logging set-up, the error report,
//! `key=value` parsing, and loading a command's config with the plugin rule applied.

pub mod cluster_check;
pub mod convert;
pub mod coordinator;
pub mod decode;
pub mod devices;
pub mod launch;
pub mod plugins;
pub mod submit;
pub mod tokenize;
pub mod topologies;
pub mod train;
pub mod train_compile;

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU8, Ordering};

use anyhow::{bail, Result};
use maxrs::config::{self, Resolved, Source};
use maxrs::pjrt::provision::{choose_plugin, resolve_choice};

static VERBOSITY: AtomicU8 = AtomicU8::new(0);

/// How many `-v` were given.
pub fn verbosity() -> u8 {
    VERBOSITY.load(Ordering::Relaxed)
}

/// Whether stderr may carry colours: a terminal, and `NO_COLOR` unset (no-color.org).
pub fn color() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Sets the log levels, before any plugin is loaded (XLA reads `TF_CPP_MIN_LOG_LEVEL` once):
/// - XLA's own C++ logging (absl): errors only by default, which hides the warnings XLA prints
///   in every multi-device run (Shardy, "All log messages before absl::InitializeLog()");
///   `-v` shows warnings, `-vv` everything; a `TF_CPP_MIN_LOG_LEVEL` the user set wins.
/// - maxrs's logs go to stderr: `RUST_LOG` picks the level (default: info for maxrs, warn for
///   the rest; `-v`: debug for maxrs), plain text unless stderr is a colour terminal.
pub fn init_logging(verbosity: u8) {
    VERBOSITY.store(verbosity, Ordering::Relaxed);
    if std::env::var_os("TF_CPP_MIN_LOG_LEVEL").is_none() {
        let level = 2u8.saturating_sub(verbosity);
        // Single-threaded here: no plugin or logger thread exists yet.
        std::env::set_var("TF_CPP_MIN_LOG_LEVEL", level.to_string());
    }
    let default = if verbosity > 0 { "warn,maxrs=debug" } else { "warn,maxrs=info" };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(color())
        .with_target(false)
        .init();
}

/// The error and its causes on one line, each cause once: a message that already quotes its
/// cause (`dataset_path=x: No such file (os error 2)`) does not get it appended again.
pub fn error_report(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
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

/// The config part of the `train` and `train-compile` command lines.
#[derive(clap::Args)]
pub struct ConfigArgs {
    /// Print every resolved config key, its value and where it came from, and exit.
    #[arg(long)]
    pub print_config: bool,
    /// A config file (MaxText's configs/base.yml convention; default: the built-in base.yml),
    /// then key=value overrides.
    #[arg(value_name = "CONFIG | key=value")]
    pub args: Vec<String>,
}

impl ConfigArgs {
    /// With `--print-config`: prints the resolved config (unless `-v` already did) and says the
    /// command is done.
    pub fn printed(&self, resolved: &Resolved) -> bool {
        if self.print_config && verbosity() == 0 {
            println!("{}", resolved.listing());
        }
        self.print_config
    }
}

/// Loads a `train`/`train-compile` command line (config file, `key=value`), applies the plugin
/// rule (`--plugin`, `plugin=`, `MAXRS_PJRT_PLUGIN`; see `provision::choose_plugin`), and shows
/// the resolved config with its sources when asked (`--print-config`, or `-v`).
pub fn resolve_config(args: &[String], plugin_flag: Option<&str>) -> Result<Resolved> {
    resolve_config_with(args, plugin_flag, |_| Ok(()))
}

/// [`resolve_config`], with `adjust` applied before the config is shown (`train-compile` lets
/// its target decide the hardware).
pub fn resolve_config_with(
    args: &[String],
    plugin_flag: Option<&str>,
    adjust: impl FnOnce(&mut Resolved) -> Result<()>,
) -> Result<Resolved> {
    let mut resolved = config::resolve_args(args)?;
    let key = resolved.source("plugin").is_user().then(|| resolved.config.plugin.clone());
    let choice = choose_plugin(plugin_flag, key.as_deref())?;
    if choice.origin != "the default" {
        // Found (or fetched) now, so that a missing file is reported with what named it.
        resolve_choice(&choice)?;
    }
    if choice.origin != "plugin=" && choice.origin != "the default" {
        resolved.config.plugin = choice.spec;
        resolved.set_source("plugin", Source::Setting(choice.origin.to_string()));
    }
    adjust(&mut resolved)?;
    if verbosity() > 0 {
        println!("{}", resolved.listing());
    }
    Ok(resolved)
}
