//! `maxrs launch --num-processes N [--coordinator-port P] [--gpus-per-process K] -- ARGS`:
//! N local processes of one job running `maxrs ARGS` (see `cluster::launch`).

use anyhow::{Context, Result};
use maxrs::cluster::launch::{launch, LaunchOptions};

#[derive(clap::Args)]
pub struct LaunchArgs {
    /// How many processes to start (at most 256).
    #[arg(long)]
    num_processes: usize,
    /// The coordinator's port on 127.0.0.1 (default: a free one).
    #[arg(long)]
    coordinator_port: Option<u16>,
    /// Give each process this many GPUs (CUDA_VISIBLE_DEVICES), rank i getting GPUs i*K..(i+1)*K
    /// (at most 64 in all).
    #[arg(long)]
    gpus_per_process: Option<usize>,
    /// The maxrs command each process runs, after `--` (e.g. `-- train configs/base.yml ...`).
    #[arg(last = true, required = true, value_name = "MAXRS ARGS")]
    args: Vec<String>,
}

/// Returns the exit status of the whole launch.
pub fn run(a: LaunchArgs) -> Result<u8> {
    let program = std::env::current_exe().context("finding the maxrs binary")?;
    let options = LaunchOptions {
        num_processes: a.num_processes,
        coordinator_port: a.coordinator_port,
        gpus_per_process: a.gpus_per_process,
        program,
        args: a.args,
    };
    Ok(launch(&options)? as u8)
}
