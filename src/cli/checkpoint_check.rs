//! `maxrs checkpoint-check [CONFIG] [key=value ...]`: the checkpoints of a job, checked under any
//! launcher without a model or an XLA program. Every process holds its shards of a small
//! synthetic state (`checkpoint::drill`: `--devices-per-process` devices each, split `--fsdp`
//! ways), restores the run's newest checkpoint if there is one (reading only the slices its
//! blocks need, whatever process count and mesh saved it) and compares it bit for bit with what
//! it must hold, then "trains" to `steps` (`--step-ms` per step), saving on the run's schedule
//! (`checkpoint_period`, `async_checkpointing`, `max_num_checkpoints_to_keep`,
//! `save_checkpoint_on_completion`) into `base_output_directory/run_name/checkpoints` with the
//! same multi-process commit as `maxrs train` (`--verify-only`: restores and compares the newest
//! checkpoint, and fails when there is none). With `enable_autocheckpoint`, SIGTERM to any
//! process makes every process save the same step and exit 0. The tests kill it at random
//! moments; on a real cluster it checks the storage and the commit before a long job.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};
use maxrs::checkpoint::dir::load_blocks;
use maxrs::checkpoint::drill::{model_keys, Mesh};
use maxrs::checkpoint::{CheckpointManager, Checkpoints, Job, OnError, Policy};
use maxrs::cluster::preemption::PreemptionSync;
use maxrs::cluster::{exit_on_cluster_error, Cluster};
use maxrs::config::{self, Config};
use maxrs::files::Location;

#[derive(clap::Args)]
pub struct CheckpointCheckArgs {
    /// Devices each process holds shards for.
    #[arg(long, default_value_t = 4)]
    devices_per_process: usize,
    /// Ways the sharded arrays are split (default: --devices-per-process, so that every process
    /// holds a whole replica, as data parallelism across hosts does).
    #[arg(long)]
    fsdp: Option<usize>,
    /// Milliseconds each step takes.
    #[arg(long, default_value_t = 10)]
    step_ms: u64,
    /// The seed of the state's values.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Restore and compare the newest checkpoint, then stop (an error when there is none).
    #[arg(long)]
    verify_only: bool,
    /// A config file (default: the built-in base.yml), then key=value overrides.
    #[arg(value_name = "CONFIG | key=value")]
    args: Vec<String>,
}

pub fn run(a: CheckpointCheckArgs) -> Result<()> {
    if a.step_ms > 60_000 {
        bail!("--step-ms {}: give 0 to 60000", a.step_ms);
    }
    let c = config::load_args(&a.args)?;
    if c.base_output_directory.is_empty() {
        bail!("base_output_directory is empty: give the directory (local or gs://) the checkpoints go to");
    }
    // Before joining: a preemption notice during start-up also ends the job with 0 (after the
    // steps every process has run, or none).
    let terminate = Arc::new(AtomicBool::new(false));
    if c.enable_autocheckpoint {
        signal_hook::flag::register(signal_hook::consts::SIGTERM, terminate.clone())
            .map_err(|e| anyhow::anyhow!("cannot install the SIGTERM handler: {e}"))?;
    }
    let cluster = Cluster::join(&c, exit_on_cluster_error())?;
    match check(&c, &a, &cluster, &terminate) {
        Ok(()) => {
            cluster.shutdown()?;
            Ok(())
        }
        Err(e) => {
            cluster.report_failure(&e);
            Err(e)
        }
    }
}

fn check(c: &Config, a: &CheckpointCheckArgs, cluster: &Cluster, terminate: &AtomicBool) -> Result<()> {
    let (process, processes) = (cluster.process_index(), cluster.process_count());
    let mesh = Mesh::new(processes, a.devices_per_process, a.fsdp.unwrap_or(a.devices_per_process))?;
    let run_name = if c.run_name.is_empty() { "checkpoint-check" } else { c.run_name.as_str() };
    let checkpoints = Checkpoints::new(Location::parse(&c.base_output_directory)?.join(run_name).join("checkpoints"));
    if process == 0 {
        checkpoints.remove_incomplete()?;
    }
    let (expected, wanted) = (mesh.expected(), mesh.wanted(process));
    let restored =
        checkpoints.restore_latest_by(|dir, _| load_blocks(dir, &expected, &model_keys(), false, &wanted))?;
    let first = match &restored {
        Some(loaded) => {
            let step = loaded.manifest.step.expect("restore_latest_by checked the step");
            mesh.verify(a.seed, step, process, loaded)?;
            println!(
                "restored the checkpoint of step {step} ({} processes wrote it; this process read {} bytes): identical",
                loaded.manifest.processes.unwrap_or(1),
                loaded.bytes_read
            );
            step + 1
        }
        None if a.verify_only => bail!(
            "--verify-only: no checkpoint in {dir} to verify (committed step folders such as {dir}/3 with a \
             manifest.json, as checkpoint-check saves them for this base_output_directory and run_name)",
            dir = checkpoints.dir
        ),
        None => {
            println!("no checkpoint in {}: starting at step 0", checkpoints.dir);
            0
        }
    };
    if a.verify_only {
        return Ok(());
    }
    let job = match cluster.client() {
        Some(client) => Job::new(process, processes, client.clone()),
        None => Job::single(),
    };
    let job_timeout = job.timeout;
    let policy = Policy {
        period: c.checkpoint_period.max(1) as u64,
        on_start: c.save_checkpoint_on_start,
        on_completion: c.save_checkpoint_on_completion,
        asynchronous: c.async_checkpointing,
        keep: c.max_num_checkpoints_to_keep.map(|n| n as usize),
        on_error: OnError::Stop,
    };
    let mut manager = CheckpointManager::new(checkpoints, policy, job);
    let mut sync = PreemptionSync::new(cluster.client().cloned(), process, processes, 1);
    // A step is a collective: no process starts a step before every process finished the one
    // before (the processes of an SPMD job are at most one step apart).
    let step_barrier = |step: u64| -> Result<()> {
        match cluster.client() {
            Some(client) => client.wait_at_barrier(
                "checkpoint_check/step",
                Duration::from_secs(c.heartbeat_timeout_seconds.max(1) as u64 + job_timeout.as_secs()),
                &[],
            ),
            None => Ok(()),
        }
        .map_err(|e| anyhow::anyhow!("step {step}: {e:#}"))
    };
    let steps = c.steps.max(0) as u64;
    let data = |step: u64| serde_json::json!({"kind": "checkpoint_check", "next_step": step + 1, "process": process});
    let mut next = first;
    while next < steps {
        if let Some(stop) = sync.stop_before(next, terminate.load(Ordering::Relaxed))? {
            if next >= stop {
                if let Some(last) = stop.checked_sub(1).filter(|&s| s >= first && !manager.has(s)) {
                    manager.save_share(mesh.share(a.seed, last, process, data(last)))?;
                }
                manager.wait()?;
                println!("preempted: stopped before step {stop}, every process saved the step before it");
                return Ok(());
            }
        }
        step_barrier(next)?;
        std::thread::sleep(Duration::from_millis(a.step_ms));
        if manager.due(next) {
            manager.save_share(mesh.share(a.seed, next, process, data(next)))?;
        }
        next += 1;
    }
    if let Some(last) = steps.checked_sub(1).filter(|&s| s >= first && manager.policy.on_completion && !manager.has(s))
    {
        manager.save_share(mesh.share(a.seed, last, process, data(last)))?;
    }
    manager.wait()?;
    println!("checkpoint-check: OK: {} saves, steps {first}..{steps}", manager.saved.len());
    Ok(())
}
