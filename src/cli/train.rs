//! `maxrs train [CONFIG] [key=value ...]`: MaxText's `train.py` command line. With no arguments
//! it trains the built-in tiny default model on one CPU device.

use anyhow::Result;
use maxrs::{cluster, config, train};

#[derive(clap::Args)]
pub struct TrainArgs {
    /// A config file (MaxText's configs/base.yml convention; default: the built-in base.yml),
    /// then key=value overrides.
    #[arg(value_name = "CONFIG | key=value")]
    args: Vec<String>,
}

pub fn run(args: TrainArgs) -> Result<()> {
    let c = config::load_args(&args.args)?;
    let interval =
        c.collect_stack_trace.then(|| std::time::Duration::from_secs(c.stack_trace_interval_seconds.max(1) as u64));
    cluster::diagnostics::install(c.slow_step_stack_trace_factor, interval);
    let job = cluster::Cluster::join(&c, cluster::exit_on_cluster_error())?;
    let result = job.pjrt_client(&c).and_then(|client| train::run::train_in(&c, &client, &job));
    if let Err(e) = &result {
        job.report_failure(e);
        return result.map(|_| ());
    }
    job.shutdown()
}
