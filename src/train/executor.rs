//! The training loop's view of a train step. A [`StepPlan`] is the step built for the run's
//! devices before the compile (start-up checks the run against its model); compiling it gives a
//! [`StepExecutor`], which holds the state on the devices and runs steps. Two implement them:
//! the SPMD step ([`super::spmd`]: one executable over every device) and the pipelined one
//! ([`super::pipeline::run`]: programs per stage, driven by the host).
//!
//! Everything around the step (start-up, data, metrics, health, when to evaluate and
//! checkpoint, profiler, signals, report) is written once, in [`super::run`] and
//! [`super::step_loop`]; an executor differs only in how it runs a step, an eval and the copies
//! of its state.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use anyhow::Result;

use crate::checkpoint::shards::{ArrayLayout, HostArray};
use crate::checkpoint::Expected;
use crate::config::Config;
use crate::data::{Batch, EvalData};
use crate::model::Model;
use crate::pjrt::Client;
use crate::train_state::{Group, TrainState};

use super::metrics::{EvalMetrics, PerDeviceWork, StepMetrics};
use super::report::{RunReport, StartupTimes};

/// A train step built for the run's devices, not yet compiled.
pub(super) trait StepPlan {
    type Executor: StepExecutor;

    /// The model the step trains.
    fn model(&self) -> &Model;

    /// Traces, lowers and compiles the step (or loads it from `compiled_trainstep_file`) on the
    /// devices of `granules` (the device ids of each process), timing the phases in `startup`.
    /// The state is empty until [`StepExecutor::initialize`].
    fn compile(
        self,
        c: &Config,
        client: &Client,
        granules: &[Vec<i64>],
        startup: &mut StartupTimes,
    ) -> Result<Self::Executor>;
}

/// Where the initial state comes from (`run`'s start-up decides).
pub(super) enum Initial {
    /// The init program (`init_weights_seed`).
    Fresh,
    /// These parameters (`params.…`), the others drawn by the init program (LoRA adapters a
    /// base model lacks, or the base under adapters from `lora.lora_restore_path`), and a fresh
    /// optimizer state; as the blocks this process's devices need
    /// ([`StepExecutor::state_layouts`]).
    Parameters(BTreeMap<String, HostArray>),
    /// A whole state from a checkpoint: every array of [`StepExecutor::state_specs`], as the
    /// blocks this process's devices need ([`StepExecutor::state_layouts`]).
    State(BTreeMap<String, HostArray>),
}

impl Initial {
    /// The keys of the parameters it gives (none: the init program draws them all).
    pub fn parameters(&self) -> BTreeSet<String> {
        let names: Vec<&String> = match self {
            Initial::Fresh => vec![],
            Initial::Parameters(arrays) => arrays.keys().collect(),
            Initial::State(arrays) => arrays.keys().collect(),
        };
        let key = |name: &&String| Group::of(name).filter(|(g, _)| *g == Group::Params).map(|(_, k)| k.to_string());
        names.iter().filter_map(key).collect()
    }
}

/// A compiled train step and its state on the devices.
pub(super) trait StepExecutor {
    /// A step's batch where the step reads it.
    type Fed;
    /// A dispatched step whose metrics have not been read.
    type InFlight;
    /// Whether [`StepExecutor::dispatch`] returns while the devices still run the step: the loop
    /// then reads the next batch and the previous step's metrics meanwhile. Otherwise the step
    /// has run when `dispatch` returns, and the loop records it before reading the next batch.
    const RUNS_AHEAD: bool;

    fn model(&self) -> &Model;

    /// The arrays of the state a checkpoint holds, by their names in checkpoint files: the
    /// model's whole train state, whatever layout the step keeps it in.
    fn state_specs(&self) -> Vec<Expected> {
        Expected::of_state(&TrainState::of(self.model()))
    }

    /// Creates the state on the devices.
    fn initialize(&mut self, initial: Initial) -> Result<()>;

    /// The rows of the global batch this process's devices hold.
    fn local_rows(&self) -> Range<usize>;

    /// Puts a batch (this process's share of the global batch) where the step reads it.
    fn feed(&self, batch: Batch) -> Result<Self::Fed>;

    /// Starts step `step` on `batch`; its new state replaces the old.
    fn dispatch(&mut self, step: u64, batch: Self::Fed) -> Result<Self::InFlight>;

    /// Reads a dispatched step's metrics (waiting for it) and times it.
    fn finish(&mut self, flight: Self::InFlight, work: PerDeviceWork) -> Result<StepMetrics>;

    /// The host did work it was asked for (an eval, a checkpoint copy) with the devices drained:
    /// that time is not the next step's.
    fn pause_timing(&mut self);

    /// The devices' idle share between steps, where the executor measures it.
    fn device_idle_fraction(&self) -> Option<f64>;

    /// Compiles the eval step, which reads `data` in batches of `rows` rows.
    fn open_eval(&mut self, data: EvalData, rows: usize) -> Result<()>;

    /// One pass over the eval data (at most `eval_steps` batches when positive) with the state
    /// after `after_step`.
    fn eval(&mut self, after_step: u64, eval_steps: i64) -> Result<EvalMetrics>;

    /// Every array of the state with every device's block and the process holding it (the
    /// same on every process of the job): which blocks a process restores and writes.
    fn state_layouts(&self) -> Result<Vec<ArrayLayout>>;

    /// The distinct blocks of the state this process's devices hold, copied off the devices,
    /// for a checkpoint.
    fn state_blocks(&mut self) -> Result<Vec<HostArray>>;

    /// Adds the executor's part to the finished run's report (and prints it, on the process
    /// that logs); `skipped_steps` are left out of medians as in the summary.
    fn summarize(self, report: &mut RunReport, skipped_steps: usize, logger: bool);
}
