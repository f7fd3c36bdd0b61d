//! The step at which every process of a job stops after a preemption notice (SIGTERM to one or
//! more processes, as GKE, Vertex AI and Slurm send it), so that all save the same step and
//! exit. JAX does the same through this coordination service: a notice to any host is
//! propagated to all and every host reaches the same sync step (jax-ml/jax
//! `jax/experimental/multihost_utils.py` `reached_preemption_sync_point`, commit e59a050).
//!
//! Between steps every process asks [`PreemptionSync::stop_before`], which never blocks (a
//! process waiting there could hold up a peer inside a step's collectives or a checkpoint's
//! commit): a process that was signalled sets `maxrs_preemption/requested`; a process that sees
//! it set (its own or another's) publishes the next step it would run, and steps on until every
//! process has published. The stop is then the largest + a margin, as in JAX's preemption sync
//! manager (openxla/xla `xla/tsl/distributed_runtime/preemption/preemption_sync_manager.cc`,
//! `ComputeSyncCallCounter`: the sync point is the largest call counter + 1): the processes of
//! an SPMD job are a bounded number of steps apart (a step completes only once every process
//! joined its collectives), so with the margin above that bound, when the last one publishes,
//! none has passed the stop. The margin is the caller's: 1 where a process checks before each
//! step and no process starts a step before all finished the previous one; more where the host
//! dispatches steps ahead of their completion and checks after dispatching.

use anyhow::{anyhow, bail, Result};
use std::sync::Arc;

use super::CoordinationClient;

const REQUESTED: &str = "maxrs_preemption/requested";
/// `AT/<process>`: the next step of each process when it saw the request.
const AT: &str = "maxrs_preemption/at";

/// One process's view of the job's preemption agreement.
pub struct PreemptionSync {
    client: Option<Arc<CoordinationClient>>,
    process: usize,
    processes: usize,
    /// Added to the largest published step (see the module docs).
    margin: u64,
    /// Whether this process published its step.
    published: bool,
    /// The agreed step, once known.
    agreed: Option<u64>,
}

impl PreemptionSync {
    pub fn new(
        client: Option<Arc<CoordinationClient>>,
        process: usize,
        processes: usize,
        margin: u64,
    ) -> PreemptionSync {
        PreemptionSync { client, process, processes, margin, published: false, agreed: None }
    }

    /// Called between steps (`next`: the first step this process has not run) with whether
    /// this process was signalled: once every process has seen the request, the step before
    /// which every process stops (the checkpoint is of the step before it); `None` to go on.
    /// Once known the answer stays.
    pub fn stop_before(&mut self, next: u64, signalled: bool) -> Result<Option<u64>> {
        if self.agreed.is_some() {
            return Ok(self.agreed);
        }
        let Some(client) = self.client.as_ref().filter(|_| self.processes > 1) else {
            self.agreed = signalled.then_some(next);
            return Ok(self.agreed);
        };
        if !self.published {
            if !signalled && client.key_value_try_get(REQUESTED)?.is_none() {
                return Ok(None);
            }
            // Several processes may be signalled at once: the first one sets it.
            if signalled && client.key_value_try_get(REQUESTED)?.is_none() {
                if let Err(e) = client.key_value_set(REQUESTED, self.process.to_string().as_bytes(), false) {
                    tracing::debug!("preemption already requested: {e:#}");
                }
            }
            client.key_value_set(&format!("{AT}/{}", self.process), next.to_string().as_bytes(), false)?;
            self.published = true;
        }
        let published = client.key_value_dir_get(AT)?;
        if published.len() < self.processes {
            return Ok(None);
        }
        let mut largest = 0;
        for (key, value) in &published {
            let at: u64 = std::str::from_utf8(value)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| anyhow!("{key}: the coordinator answered {value:?}"))?;
            largest = largest.max(at);
        }
        let stop = largest + self.margin;
        if next > stop {
            bail!(
                "after a preemption notice the job stops before step {stop}, but this process already ran step {}: \
                 its processes were more than {} steps apart",
                next - 1,
                self.margin
            );
        }
        self.agreed = Some(stop);
        Ok(self.agreed)
    }
}
