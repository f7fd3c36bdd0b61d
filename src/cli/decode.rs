//! `maxrs decode [CONFIG] [key=value ...]`: MaxText's `decode.py` command line: prefill the
//! prompts, generate with a key/value cache, print the outputs and the timings.

use anyhow::Result;
use maxrs::inference::run::PromptOrigin;
use maxrs::{cluster, config, inference};

#[derive(clap::Args)]
pub struct DecodeArgs {
    /// A config file (MaxText's configs/base.yml convention; default: the built-in base.yml),
    /// then key=value overrides (prompt, max_prefill_predict_length, load_parameters_path, ...).
    #[arg(value_name = "CONFIG | key=value")]
    args: Vec<String>,
}

pub fn run(args: DecodeArgs) -> Result<()> {
    let resolved = config::resolve_args(&args.args)?;
    let origin = match resolved.source("prompt") {
        config::Source::Default => PromptOrigin::Default,
        _ => PromptOrigin::User,
    };
    let client = cluster::client_for(&resolved.config)?;
    inference::run::decode(&resolved.config, &client, origin).map(|_| ())
}
