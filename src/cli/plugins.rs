//! `maxrs plugins fetch NAME --dest DIR [--version V]`: a plugin build (and, for a GPU plugin,
//! the CUDA compile tools) in a folder laid out as maxrs's cache, to copy to a machine without
//! network and use there with `MAXRS_CACHE=DIR` (or the plugin file's path as `plugin=`).

use std::path::PathBuf;

use anyhow::{anyhow, Result};
use maxrs::pjrt::provision::{PluginName, Provisioner, CACHE_ENV};

#[derive(clap::Args)]
pub struct PluginsArgs {
    #[command(subcommand)]
    command: PluginsCommand,
}

#[derive(clap::Subcommand)]
enum PluginsCommand {
    /// Put a plugin build (and a GPU plugin's CUDA compile tools) into DIR, from this machine's
    /// installed packages or cache, else downloaded and verified.
    Fetch {
        /// cpu, cuda12, cuda13 or tpu.
        name: String,
        /// The folder to fill (created if missing); copy it to the target machine.
        #[arg(long)]
        dest: PathBuf,
        /// The build's version (default: maxrs's pinned one); use the one a compiled step names.
        #[arg(long)]
        version: Option<String>,
    },
}

pub fn run(args: PluginsArgs) -> Result<()> {
    match args.command {
        PluginsCommand::Fetch { name, dest, version } => {
            let name: PluginName = name.parse().map_err(|e| anyhow!("{e}"))?;
            let version = version.unwrap_or_else(|| name.pin().version.to_string());
            let placed = Provisioner::from_env().bundle(name, &version, &dest)?;
            for path in &placed {
                println!("{}", path.display());
            }
            println!(
                "copy {} to the target machine and set {CACHE_ENV}=<its path there> (or plugin=<the .so's path>)",
                dest.display()
            );
            Ok(())
        }
    }
}
