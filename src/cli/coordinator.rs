//! `maxrs coordinator --port P --num-processes N [key=value ...]`: a job's coordination service
//! on its own, for launchers that run it apart from the workers (which then set
//! `external_coordinator=true`). Takes the cluster keys (`heartbeat_timeout_seconds`,
//! `jax_distributed_initialization_timeout`, `shutdown_timeout_seconds`, `run_name`); exits 0
//! once every process has shut down, 1 when the job failed, every process included that did not
//! register within `jax_distributed_initialization_timeout` of its start.

use std::net::SocketAddr;

use anyhow::{bail, Result};
use maxrs::{cluster, config};

#[derive(clap::Args)]
pub struct CoordinatorArgs {
    /// The port to listen on (every interface).
    #[arg(long)]
    port: u16,
    /// Processes in the job (at most the num_processes key's bound, 1048576).
    #[arg(long)]
    num_processes: usize,
    /// Cluster keys as key=value (e.g. heartbeat_timeout_seconds=30).
    #[arg(value_name = "key=value")]
    args: Vec<String>,
}

pub fn run(a: CoordinatorArgs) -> Result<()> {
    let max = cluster::settings::max_processes();
    if a.num_processes == 0 || a.num_processes > max {
        bail!("--num-processes {}: give 1 to {max} processes", a.num_processes);
    }
    let c = config::load_over(None, &[], &a.args)?;
    config::validate(&c, 1, 1)?;
    let bind = SocketAddr::from(([0, 0, 0, 0], a.port));
    let config = cluster::service_config(&c, a.num_processes);
    let register_timeout = config.register_timeout.as_secs();
    let coordinator = cluster::Coordinator::start(bind, config)?;
    println!(
        "coordinator: serving job `{}` of {} processes on {}; waiting up to {register_timeout} s for all of them to \
         register (jax_distributed_initialization_timeout)",
        cluster::job_name(&c),
        a.num_processes,
        coordinator.address()
    );
    match coordinator.wait_finished() {
        Ok(()) => {
            println!("coordinator: every process shut down");
            Ok(())
        }
        Err(message) => bail!("the job failed: {message}"),
    }
}
