//! The step loop of `maxrs train`, the same for every step executor: per step, feed (the next
//! batch read and put where the step reads it), dispatch, record (metrics logged, written and
//! judged), then the eval, the checkpoint, the profiler's edges and a signal's stop where due;
//! at the end the last metrics, the final checkpoint and the summary.
//!
//! With an executor that runs ahead of the host (the SPMD step), step k + 1 is dispatched before
//! step k's metrics are read, and step k + 1's batch is put on the devices while step k runs.
//! Where the host needs the state after step k (a checkpoint, an eval, the profiler's clean
//! edges, a stop), the loop finishes step k before dispatching the next, which replaces
//! (donates) that state.
//!
//! Signals: with `enable_autocheckpoint`, SIGTERM (preemption) ends the run after the current
//! step with a checkpoint of it; SIGINT ends it after the current step, waiting for a checkpoint
//! write in flight (a second SIGINT exits at once). The current step is the last one dispatched
//! when the signal is seen; in a job of several processes, SIGTERM to any of them makes every
//! process stop after the same step, a few steps later (`cluster::preemption`), and save it.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::{anyhow, Context, Result};

use crate::checkpoint::{shards, CheckpointManager, DataState as _, Share};
use crate::cluster::diagnostics;
use crate::config::Config;
use crate::data::{self, BatchIterator};
use crate::pjrt::Client;

use super::data_position::DataPosition;
use super::executor::StepExecutor;
use super::metrics::PerDeviceWork;
use super::outputs::RunOutputs;
use super::profiler::StepProfiler;
use super::recorder::{print_line, StepRecorder};
use super::report::{peak_memory, print_summary, RunReport};
use super::signals::Signals;
use crate::cluster::preemption::PreemptionSync;

/// A run after start-up: the executor with its state, and everything the steps feed and write.
pub(super) struct StepLoop<'a, E: StepExecutor> {
    pub c: &'a Config,
    pub client: &'a Client,
    /// This process logs (process 0).
    pub logger: bool,
    pub executor: E,
    pub work: PerDeviceWork,
    pub data: BatchIterator,
    /// The position a checkpoint records: after the last batch dispatched.
    pub data_position: DataPosition,
    /// The executor has an eval step (`open_eval`).
    pub eval: bool,
    pub profiler: Option<StepProfiler>,
    pub manager: Option<CheckpointManager>,
    /// What a checkpoint's manifest records of the model.
    pub model_keys: BTreeMap<String, serde_json::Value>,
    pub signals: Signals,
    /// Where the job's processes agree on the step to stop after a SIGTERM.
    pub preemption: PreemptionSync,
    pub recorder: StepRecorder<'a>,
    pub outputs: RunOutputs,
    pub report: RunReport,
    pub first_step: u64,
    pub steps: u64,
    /// With `reuse_example_batch`, the first batch this process read, fed at every step.
    pub example_batch: Option<data::Batch>,
}

/// A step's batch where the step reads it, with the data position after it.
struct StepBatch<F> {
    fed: F,
    data_state: data::DataState,
    /// How long the input pipeline took to deliver it.
    wait_seconds: f64,
}

impl<E: StepExecutor> StepLoop<'_, E> {
    /// Runs the steps from `first_step` to `steps` (or to a signal's stop), then finishes.
    pub fn run(mut self) -> Result<RunReport> {
        let mut in_flight = self.steps_until_stop()?;
        if let Some(flight) = in_flight.take() {
            self.record(flight)?;
        }
        self.finish()
    }

    /// The steps; returns the one still in flight.
    fn steps_until_stop(&mut self) -> Result<Option<E::InFlight>> {
        let (c, steps) = (self.c, self.steps);
        let mut next_batch = match self.first_step < steps {
            true => Some(self.feed(self.first_step)?),
            false => None,
        };
        let mut in_flight: Option<E::InFlight> = None;
        for step_index in self.first_step..steps {
            if self.profiler.as_ref().is_some_and(|p| p.starts_at(step_index)) {
                if let Some(flight) = in_flight.take() {
                    self.record(flight)?;
                }
                if let Some(p) = self.profiler.as_mut() {
                    p.start()?;
                }
            }
            let batch = next_batch.take().expect("each step's batch is transferred before it runs");
            // From now on the devices hold this step's state; a checkpoint of it records the data
            // position after this step's batch (not after the next one, already read ahead).
            self.data_position.state = Some(batch.data_state);
            self.report.data_wait_times.push(batch.wait_seconds);
            let flight = self.executor.dispatch(step_index, batch.fed)?;
            // A signal seen now stops the run after this step (SIGTERM: after the step the job's
            // processes agree on).
            let signal = self.signals.stop_requested();
            let agreed = self.preemption.stop_before(step_index + 1, signal == Some("SIGTERM"))?;
            let preempted = agreed == Some(step_index + 1);
            let stop = match signal {
                Some("SIGTERM") if !preempted => None,
                None if preempted => Some("SIGTERM"),
                other => other,
            };
            let checkpoint = self.manager.as_ref().is_some_and(|m| m.due(step_index) || preempted);
            let profile_ends = self.profiler.as_ref().is_some_and(|p| p.stops_after(step_index));
            let eval_now = self.eval && eval_due(c, step_index);
            // A step that ran in `dispatch` is recorded before the next batch is read; one the
            // devices still run is recorded after the previous one, once the next batch is fed.
            let flight = match E::RUNS_AHEAD {
                true => Some(flight),
                false => {
                    self.record(flight)?;
                    None
                }
            };
            if stop.is_none() && step_index + 1 < steps {
                next_batch = Some(self.feed(step_index + 1)?);
            }
            if let Some(previous) = std::mem::replace(&mut in_flight, flight) {
                self.record(previous)?;
            }
            if E::RUNS_AHEAD {
                // For hang diagnostics the current step is the one whose metrics are awaited next.
                diagnostics::step_started(step_index);
            }
            if !(checkpoint || eval_now || profile_ends || stop.is_some()) {
                continue;
            }
            // The host needs this step finished (and, for an eval or a checkpoint, its state) before
            // the next step replaces that state.
            if let Some(flight) = in_flight.take() {
                self.record(flight)?;
            }
            if profile_ends {
                if let Some(p) = self.profiler.as_mut() {
                    p.stop()?;
                }
            }
            if eval_now {
                self.eval(step_index)?;
            }
            if checkpoint {
                self.checkpoint(step_index)?;
            }
            if let Some(signal) = stop {
                print_line(&self.recorder.bar, &format!("{signal}: stopping after step {step_index}"));
                self.report.stopped_by = Some(signal);
                break;
            }
        }
        Ok(in_flight)
    }

    /// Step `step`'s batch, read from the input pipeline and put where the step reads it.
    fn feed(&mut self, step: u64) -> Result<StepBatch<E::Fed>> {
        diagnostics::set_phase(Some(step), "reading and feeding the batch");
        let wait = Instant::now();
        // MaxText's `reuse_example_batch` (`common/data_loader.py` at main e591f30): the first
        // batch a process loads is fed at every later step, the input pipeline left where it was.
        let batch = match &self.example_batch {
            Some(batch) => batch.clone(),
            None => {
                let batch = self.data.next_batch()?.ok_or_else(|| anyhow!("the training data ended at step {step}"))?;
                if self.c.reuse_example_batch != 0 {
                    self.example_batch = Some(batch.clone());
                }
                batch
            }
        };
        let wait_seconds = wait.elapsed().as_secs_f64();
        Ok(StepBatch { fed: self.executor.feed(batch)?, data_state: self.data.state(), wait_seconds })
    }

    /// Reads a dispatched step's metrics and records them.
    fn record(&mut self, flight: E::InFlight) -> Result<()> {
        let metrics = self.executor.finish(flight, self.work)?;
        self.recorder.record(metrics, &mut self.report, &mut self.outputs)
    }

    /// Evaluates the state after `step_index`.
    fn eval(&mut self, step_index: u64) -> Result<()> {
        diagnostics::set_phase(Some(step_index), "evaluating");
        let metrics = self.executor.eval(step_index, self.c.eval_steps)?;
        if self.logger {
            print_line(&self.recorder.bar, &metrics.log_line());
        }
        self.outputs.eval(&metrics, &self.c.run_name).context("writing the run's eval metrics")?;
        self.report.evals.push(metrics);
        // The eval's time is not the next train step's.
        self.executor.pause_timing();
        Ok(())
    }

    /// Saves the state after `step_index` (in the background with `async_checkpointing`).
    fn checkpoint(&mut self, step_index: u64) -> Result<()> {
        diagnostics::set_phase(Some(step_index), "copying the state off the devices for a checkpoint");
        self.save(step_index)?;
        // The copy is the checkpoint's cost (`snapshot_seconds`), not the next step's time.
        self.executor.pause_timing();
        Ok(())
    }

    /// Copies the state after `step_index` off the devices, with what the manifest records, and
    /// hands it to the checkpoint manager.
    fn save(&mut self, step_index: u64) -> Result<()> {
        let t = Instant::now();
        let manager = self.manager.as_mut().expect("a checkpoint is due only with a manager");
        let (process, processes) = (manager.job().process, manager.job().processes);
        let layouts = self.executor.state_layouts()?;
        let held = self.executor.state_blocks()?;
        let share = Share {
            step: Some(step_index),
            arrays: shards::to_write(&layouts, held, process, processes)?,
            model: self.model_keys.clone(),
            data: Some(self.data_position.save_state(step_index + 1)),
        };
        self.report.snapshot_seconds.push(t.elapsed().as_secs_f64());
        manager.save_share(share)
    }

    /// After the last step: the summary of the data, the metrics flushed, the final checkpoint
    /// (`save_checkpoint_on_completion`) and the writes in flight waited for, the summary line.
    fn finish(mut self) -> Result<RunReport> {
        self.report.device_idle_fraction = self.executor.device_idle_fraction();
        let skipped = self.c.skip_first_n_steps_for_profiler.max(0) as usize;
        self.report.perf_skipped_steps = skipped;
        self.recorder.bar.finish_and_clear();
        if let Some((documents, undecodable, tokens)) = self.data.text_stats().filter(|_| self.logger) {
            println!(
                "data: {documents} documents, {tokens} tokens packed so far; {undecodable} rows skipped (undecodable, \
                 or a conversation with no user or assistant message)"
            );
        }
        // The position after the last step run (the input pipeline itself may have read ahead).
        self.report.data_state = self.data_position.state.clone();
        diagnostics::set_phase(None, "finishing: metrics, checkpoints");
        let last_step = self.recorder.last_step;
        if let Some(step_index) = last_step {
            self.outputs.flush(step_index)?;
        }
        if let Some(manager) = &self.manager {
            let on_completion = manager.policy.on_completion;
            if let Some(step_index) = last_step.filter(|&s| on_completion && !manager.has(s)) {
                if self.report.stopped_by.is_none() {
                    self.save(step_index)?;
                }
            }
        }
        if let Some(mut manager) = self.manager.take() {
            manager.wait()?;
            self.report.checkpoints = std::mem::take(&mut manager.saved);
            self.report.checkpoint_failures = std::mem::take(&mut manager.failures);
        }
        diagnostics::set_phase(None, "finished training");
        self.report.peak_memory_bytes = peak_memory(&self.client.addressable_devices()?);
        if self.logger {
            print_summary(&self.report, &self.work);
        }
        let mut report = std::mem::take(&mut self.report);
        self.executor.summarize(&mut report, skipped, self.logger);
        Ok(report)
    }
}

/// MaxText's rule (maxtext `src/maxtext/trainers/pre_train/train.py`, main e591f30): eval after
/// train step `s` when `s >= eval_start_step` and `(s - eval_start_step) % eval_interval == 0`.
fn eval_due(c: &Config, step: u64) -> bool {
    let (start, interval) = (c.eval_start_step as u64, c.eval_interval);
    interval > 0 && step >= start && (step - start).is_multiple_of(interval as u64)
}
