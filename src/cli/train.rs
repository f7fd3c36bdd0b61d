//! `maxrs train [CONFIG] [key=value ...]`: MaxText's `train.py` command line. With no arguments
//! it trains the built-in tiny default model on one CPU device.

use anyhow::Result;
use maxrs::{cluster, config, train};

#[derive(clap::Args)]
pub struct TrainArgs {
    /// Plugin: a path to a .so or a name (cpu, cuda12, cuda13, tpu); same as plugin=P.
    /// Default: the plugin key if set, else $MAXRS_PJRT_PLUGIN, else cpu.
    #[arg(long)]
    plugin: Option<String>,
    #[command(flatten)]
    config: super::ConfigArgs,
}

pub fn run(args: TrainArgs) -> Result<()> {
    let resolved = super::resolve_config(&args.config.args, args.plugin.as_deref())?;
    if args.config.printed(&resolved) {
        return Ok(());
    }
    // Every key on its own before anything starts (a huge cpu_device_count crashes the plugin),
    // then what the run reads and writes.
    config::check(&resolved.config)?;
    maxrs::output::check_resolved_paths(&resolved, maxrs::output::Command::Train)?;
    let mut c = resolved.config;
    // A compiled step loads only into the plugin build that compiled it: that build's file.
    if let Some(plugin) = maxrs::runtime::artifact::plugin_for_step(&c)? {
        c.plugin = plugin.display().to_string();
    }
    let interval =
        c.collect_stack_trace.then(|| std::time::Duration::from_secs(c.stack_trace_interval_seconds.max(1) as u64));
    cluster::diagnostics::install(c.slow_step_stack_trace_factor, interval);
    let job = cluster::Cluster::join(&c, cluster::exit_on_cluster_error())?;
    let report = match job.pjrt_client(&c).and_then(|client| train::run::train_in(&c, &client, &job)) {
        Ok(report) => report,
        Err(e) => {
            job.report_failure(&e);
            return Err(e);
        }
    };
    job.shutdown()?;
    if report.stopped_by == Some("SIGINT") {
        // The shell's convention for a program ended by Ctrl-C (128 + SIGINT).
        std::process::exit(130);
    }
    Ok(())
}
