//! `maxrs train-compile [CONFIG] --topology=NAME [key=value ...]`: MaxText's `train_compile.py`
//! (which takes `compile_topology=NAME compile_topology_num_slices=N`; both spellings work).

use anyhow::{bail, Result};
use maxrs::aot;
use maxrs::config::escape;

#[derive(clap::Args)]
pub struct TrainCompileArgs {
    /// The target (`maxrs topologies` lists them); same as compile_topology=NAME.
    #[arg(long)]
    topology: Option<String>,
    /// Number of slices (TPU); same as compile_topology_num_slices=N. Default with --topology: 1.
    #[arg(long)]
    num_slices: Option<i64>,
    /// Plugin to compile with (default: the plugin key if set, else $MAXRS_PJRT_PLUGIN, else
    /// the target's own: cuda12 for GPUs, tpu for TPUs).
    #[arg(long)]
    plugin: Option<String>,
    #[command(flatten)]
    config: super::ConfigArgs,
}

pub fn run(a: TrainCompileArgs) -> Result<()> {
    let mut args = a.config.args.clone();
    let default_slices = a.topology.is_some() && a.num_slices.is_none();
    for (flag, key, value) in [
        ("--topology", "compile_topology", a.topology),
        ("--num-slices", "compile_topology_num_slices", a.num_slices.map(|n| n.to_string())),
    ] {
        let Some(value) = value else { continue };
        if let Some(other) = args.iter().find(|x| x.starts_with(&format!("{key}=")) && **x != format!("{key}={value}"))
        {
            bail!("{flag}={} and {} disagree; give one", escape(&value), escape(other));
        }
        args.push(format!("{key}={value}"));
    }
    if default_slices && !args.iter().any(|x| x.starts_with("compile_topology_num_slices=")) {
        args.push("compile_topology_num_slices=1".to_string());
    }
    let resolved = super::resolve_config_with(&args, a.plugin.as_deref(), aot::train_compile::apply_target)?;
    if a.config.printed(&resolved) {
        return Ok(());
    }
    // The config file is an input too: the compiled step may not be written over it.
    maxrs::output::check_resolved_paths(&resolved, maxrs::output::Command::TrainCompile)?;
    aot::train_compile::train_compile(&resolved.config)?;
    Ok(())
}
