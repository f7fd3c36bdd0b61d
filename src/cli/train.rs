//! `maxrs train [CONFIG] [key=value ...]`: MaxText's `train.py` command line. With no arguments
//! it trains the built-in tiny default model on one CPU device.

use anyhow::Result;
use maxrs::{config, train};

#[derive(clap::Args)]
pub struct TrainArgs {
    /// A config file (MaxText's configs/base.yml convention; default: the built-in base.yml),
    /// then key=value overrides.
    #[arg(value_name = "CONFIG | key=value")]
    args: Vec<String>,
}

pub fn run(args: TrainArgs) -> Result<()> {
    let c = config::load_args(&args.args)?;
    let client = train::run::client_for(&c)?;
    let report = train::run::train(&c, &client)?;
    if report.stopped_by == Some("SIGINT") {
        // The shell's convention for a program ended by Ctrl-C (128 + SIGINT).
        std::process::exit(130);
    }
    Ok(())
}
