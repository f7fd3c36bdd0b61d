//! The step at which every process of a job stops after a preemption notice (SIGTERM to one or
//! more processes, as GKE, Vertex AI and Slurm send it), so that all save the same step and
//! exit. JAX does the same through this coordination service: a notice to any host is
//! propagated to all and every host reaches the same sync step (jax-ml/jax
//! `jax/experimental/multihost_utils.py` `reached_preemption_sync_point`, commit e59a050).
//!
//! Between steps every process asks [`PreemptionSync::stop_before`]: a process that was
//! signalled sets `maxrs_preemption/requested`; a process that sees it set (its own or another's)
//! publishes the next step it would run and waits for every other's; the stop step is the
//! largest. A process behind runs on to it: every step up to the largest was dispatched on every
//! process (a process completes a step only when all joined its collectives), so none waits on
//! a peer that waits on it.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Result};

use super::CoordinationClient;

const REQUESTED: &str = "maxrs_preemption/requested";

/// One process's view of the job's preemption agreement.
pub struct PreemptionSync {
    client: Option<Arc<CoordinationClient>>,
    process: usize,
    processes: usize,
    /// How long to wait for the others' steps (they are at most a step or two apart).
    timeout: Duration,
    /// The agreed step, once known.
    agreed: Option<u64>,
}

impl PreemptionSync {
    pub fn new(client: Option<Arc<CoordinationClient>>, process: usize, processes: usize, timeout: Duration) -> PreemptionSync {
        PreemptionSync { client, process, processes, timeout, agreed: None }
    }

    /// Called between steps (`next`: the first step this process has not run) with whether
    /// this process was signalled: once a stop was requested anywhere in the job, the step
    /// before which every process stops (its checkpoint is of the step before that); `None` to go
    /// on. Once known the answer stays.
    pub fn stop_before(&mut self, next: u64, signalled: bool) -> Result<Option<u64>> {
        if self.agreed.is_some() {
            return Ok(self.agreed);
        }
        let Some(client) = self.client.as_ref().filter(|_| self.processes > 1) else {
            self.agreed = signalled.then_some(next);
            return Ok(self.agreed);
        };
        if signalled {
            // Several processes may be signalled at once: the first one sets it.
            if client.key_value_try_get(REQUESTED)?.is_none() {
                if let Err(e) = client.key_value_set(REQUESTED, self.process.to_string().as_bytes(), false) {
                    tracing::debug!("preemption already requested: {e:#}");
                }
            }
        } else if client.key_value_try_get(REQUESTED)?.is_none() {
            return Ok(None);
        }
        let mine = next;
        client.key_value_set(&format!("maxrs_preemption/at/{}", self.process), mine.to_string().as_bytes(), false)?;
        let mut stop = mine;
        for p in (0..self.processes).filter(|&p| p != self.process) {
            let key = format!("maxrs_preemption/at/{p}");
            let value = client
                .blocking_key_value_get(&key, self.timeout)
                .map_err(|e| anyhow!("agreeing on the step to stop at after a preemption notice: {e:#}"))?;
            let theirs: u64 = std::str::from_utf8(&value)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| anyhow!("{key}: the coordinator answered {value:?}"))?;
            stop = stop.max(theirs);
        }
        self.agreed = Some(stop);
        Ok(Some(stop))
    }
}
