//! `maxrs train`'s job, start to end: plugin and devices -> validated config and mesh -> traced,
//! lowered and compiled train step -> state on the devices (restored from the run's newest
//! checkpoint, `load_full_state_path` or `load_parameters_path`, else initialized) -> the step
//! loop (data in, metrics and events out, state stays on the devices, copied off for
//! checkpoints) -> a summary. [`RunReport`] returns what happened, for tests and benchmarks.
//!
//! The host stays a step ahead of the devices: step k + 1 is dispatched before step k's metrics
//! are read, and step k + 1's batch is put on the devices while step k runs. Where the host needs
//! the state after step k (a checkpoint, an eval, the profiler's clean edges, a stop), the loop
//! finishes step k before dispatching the next, which replaces (donates) that state.
//!
//! Signals: with `enable_autocheckpoint`, SIGTERM (preemption) ends the run after the current
//! step with a checkpoint of it; SIGINT ends it after the current step, waiting for a checkpoint
//! write in flight (a second SIGINT exits at once). The current step is the last one dispatched
//! when the signal is seen.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

use crate::checkpoint::{self, CheckpointManager, Checkpoints, DataState, Expected, OnError, Policy, Saved, Snapshot};
use crate::cluster::{diagnostics, Cluster};
use crate::config::{self, Config, Derived, OnCheckpointError};
use crate::files::Location;
use crate::ir::Program;
use crate::lower::to_stablehlo;
use crate::model::Model;
use crate::output;
use crate::pjrt::{self, Client, ReadyTime};
use crate::runtime::artifact;
use crate::runtime::{self, Compiled, DeviceArray};
use crate::storage;

use crate::data::{self, Batch, BatchIterator, EvalData, ProcessShare};

use super::data_position::DataPosition;
use super::flops;
use super::health::Health;
use super::metrics::{median_step_time_after, EvalMetrics, PerDeviceWork, StepMetrics};
use super::outputs::{self, RunOutputs};
use super::profiler::StepProfiler;
use super::step::{batch_inputs, TrainStep};
use crate::host::params_io::{load_parameters, ParamSpec};
use crate::model::flops::StepShape;

/// Wall times of the start-up phases, in seconds.
#[derive(Clone, Debug, Default)]
pub struct StartupTimes {
    /// Plugin load and client creation.
    pub client: f64,
    /// Tracing the train step (with its gradient) into the IR.
    pub trace: f64,
    /// IR to StableHLO text.
    pub lower: f64,
    /// XLA compile of the train step, or loading the one `compiled_trainstep_file` names.
    pub compile: f64,
    /// Building the initial state on the devices (init program or parameter file).
    pub init: f64,
}

/// What a run did.
#[derive(Clone, Debug, Default)]
pub struct RunReport {
    pub startup: StartupTimes,
    /// Per step.
    pub losses: Vec<f64>,
    pub grad_norms: Vec<f64>,
    pub learning_rates: Vec<f64>,
    pub step_times: Vec<f64>,
    /// Each eval: the train step it followed and its metrics.
    pub evals: Vec<EvalMetrics>,
    /// Seconds per step the loop waited for the input pipeline's next batch.
    pub data_wait_times: Vec<f64>,
    /// The data stream's position after the last step (what a checkpoint saves).
    pub data_state: Option<data::DataState>,
    /// TFLOPs per device per step (MaxText's formula).
    pub tflops_per_device: f64,
    /// Peak device memory in use after the run, when the plugin reports it.
    pub peak_memory_bytes: Option<i64>,
    /// The first step this run executed (0, or one past the restored checkpoint's step).
    pub first_step: u64,
    /// Checkpoints written, in order.
    pub checkpoints: Vec<Saved>,
    /// Seconds the loop spent copying the state off the devices for each checkpoint: with
    /// `async_checkpointing`, the training time a save costs.
    pub snapshot_seconds: Vec<f64>,
    /// Saves that failed under `on_checkpoint_error=continue`.
    pub checkpoint_failures: Vec<String>,
    /// The signal that ended the run early (`SIGTERM`, `SIGINT`).
    pub stopped_by: Option<&'static str>,
    /// The share of wall time the devices had finished a step and the host had not yet
    /// dispatched the next (steps after the first `perf_skipped_steps`), when measurable.
    pub device_idle_fraction: Option<f64>,
    /// Steps left out of the performance summary (`skip_first_n_steps_for_profiler`).
    pub perf_skipped_steps: usize,
    /// With pipeline parallelism: the measured bubble of each step.
    pub pipeline: Option<super::pipeline::run::PipelineReport>,
}

/// Total memory of this machine, from `/proc/meminfo` (Linux); `None` elsewhere.
fn host_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Trains as configured on `client`'s devices, as the only process.
pub fn train(c: &Config, client: &Client) -> Result<RunReport> {
    train_in(c, client, &Cluster::single())
}

/// The device ids of each process (the mesh's DCN granules), in process order, each in id order.
fn devices_per_process(devices: &[pjrt::Device]) -> Vec<Vec<i64>> {
    let mut per_process: std::collections::BTreeMap<i32, Vec<i64>> = Default::default();
    for d in devices {
        per_process.entry(d.process_index).or_default().push(d.id as i64);
    }
    per_process
        .into_values()
        .map(|mut ids| {
            ids.sort_unstable();
            ids
        })
        .collect()
}

/// Trains as configured on every process's devices (`client.devices()`): this process is
/// `cluster.process_index()` of `cluster.process_count()`, feeds the batch rows its devices own,
/// and only process 0 logs and writes metrics.
pub fn train_in(c: &Config, client: &Client, cluster: &Cluster) -> Result<RunReport> {
    let mut report = RunReport::default();
    let c = &Config { run_name: outputs::resolved_run_name(c), ..c.clone() };
    let devices = client.devices()?;
    let granules = devices_per_process(&devices);
    if granules.len() != cluster.process_count() {
        bail!(
            "the plugin reports devices of {} processes, but this job has {}",
            granules.len(),
            cluster.process_count()
        );
    }
    if cluster.process_count() > 1 && (c.enable_checkpointing || !c.load_full_state_path.is_empty()) {
        bail!(
            "enable_checkpointing / load_full_state_path in a job of {} processes: multi-process checkpoints are not \
             supported yet (each process would have to write the shards it holds); set enable_checkpointing=false",
            cluster.process_count()
        );
    }
    let logger = cluster.is_logger();
    let derived = config::validate(c, devices.len(), granules.len())?;
    if derived.pipeline.is_some() {
        return super::pipeline::run::train(c, client, &derived, &granules);
    }
    let step = TrainStep::new(c, &derived, derived.mesh.step_mesh(&granules).map_err(|e| anyhow!(e))?)
        .map_err(|e| anyhow!(e))?;
    if logger {
        derived.print_summary(step.model.num_params());
        println!("{}", crate::model::attention::describe(c.attention, step.model.config.attention));
    }

    // Everything the run reads and writes is checked before the (possibly long) compile.
    output::check_paths(c, output::Command::Train)?;
    if !c.load_parameters_path.is_empty() {
        if let Location::Local(path) = Location::parse(&c.load_parameters_path)? {
            if !path.exists() {
                bail!("load_parameters_path={}: no such file or checkpoint directory", path.display());
            }
        }
    }
    if let Some(bytes) = host_memory_bytes() {
        config::check_host_memory(c, &derived, step.model.num_params(), bytes, client.platform_name()? == "cpu")?;
    }
    // The training data opens before the compile, so a bad file or tokenizer fails early and the
    // pipeline reads ahead while XLA compiles (a gs:// token file is read from a local copy: the
    // input pipeline reads local files). A resumed run or a process feeding only its share
    // reopens it below, once its position and rows are known.
    let dataset_copy = remote_dataset_copy(c)?;
    let data_config = match &dataset_copy {
        Some(path) => Config { dataset_path: path.display().to_string(), ..c.clone() },
        None => c.clone(),
    };
    let fresh_data = data::open_train(&data_config, derived.global_batch_size, ProcessShare::SINGLE, None)?;

    // Before the compile: a profiler that cannot work fails the run now. As in MaxText (without
    // `upload_all_profiler_results`), process 0 profiles.
    let mut profiler = if logger { StepProfiler::new(c, client.plugin(), derived.steps as u64)? } else { None };

    let t = Instant::now();
    let program = step.train_step().map_err(|e| anyhow!("tracing the train step: {e}"))?;
    report.startup.trace = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mlir = to_stablehlo(&program);
    report.startup.lower = t.elapsed().as_secs_f64();
    let t = Instant::now();
    diagnostics::set_phase(None, "compiling the train step");
    let compiled = match c.compiled_trainstep_file.as_str() {
        "" => runtime::compile_lowered(client, &program, &mlir).context("compiling the train step")?,
        path => load_step(c, client, &step, &program, &mlir, &granules, Path::new(path))?,
    };
    report.startup.compile = t.elapsed().as_secs_f64();

    let t = Instant::now();
    diagnostics::set_phase(None, "initializing the state");
    let checkpoints = run_checkpoints(c)?;
    let start = initial_state(c, client, &step, &compiled, checkpoints.as_ref())?;
    let mut state = start.state;
    report.startup.init = t.elapsed().as_secs_f64();
    report.first_step = start.first_step;
    if logger {
        println!(
            "start-up: trace {:.3} s, lower {:.3} s, compile {:.3} s, init {:.3} s",
            report.startup.trace, report.startup.lower, report.startup.compile, report.startup.init
        );
    }

    let work = per_device_work(c, &step.model, &derived, devices.first().map(|d| d.kind.as_str()).unwrap_or(""));
    report.tflops_per_device = work.tflops;
    let batch_names = batch_inputs(step.packed);
    let batch_slots: Vec<usize> =
        batch_names.iter().map(|n| compiled.input_index(&format!("batch.{n}"))).collect::<Result<_>>()?;
    let (p, n) = (cluster.process_index(), cluster.process_count());
    let rows = compiled.local_rows(batch_slots[0])?;
    let global = derived.global_batch_size;
    // The rows this process's devices hold: its share of the batch, or all of it when the mesh
    // does not split the batch across processes.
    let share = if rows == (0..global) {
        ProcessShare::SINGLE
    } else if rows == data::host_rows(global, p, n)? {
        ProcessShare { index: p, count: n }
    } else {
        bail!(
            "process {p} of {n} holds batch rows {rows:?} of {global}, which is neither its share {:?} nor the whole \
             batch; shard the batch over the DCN axes in process order (dcn_data_parallelism or dcn_fsdp_parallelism)",
            data::host_rows(global, p, n)?
        );
    };
    let first_row = rows.start as i64;
    let mut data_position = DataPosition::new(c, global)?;
    if let Some(data) = &start.data {
        data_position.restore_state(data, start.first_step)?;
    } else if start.first_step > 0 && c.dataset_type == config::DatasetType::Synthetic {
        // A full state loaded without a data position (load_full_state_path): real data starts
        // over, as in MaxText; the synthetic sequence is a function of the step, so it goes on.
        data_position.state = Some(data::DataState::Synthetic { step: start.first_step });
    }
    let mut train_data = match (share, data_position.state) {
        (ProcessShare::SINGLE, None) => fresh_data,
        (share, state) => {
            drop(fresh_data);
            data::open_train(&data_config, global, share, state)?
        }
    };
    let eval = match EvalData::open(&data_config, derived.eval_batch_size, share)? {
        Some(eval_data) => Some(Evaluator::new(client, &step, &compiled, eval_data, derived.eval_batch_size)?),
        None => None,
    };
    // Only process 0 writes metrics and events; the metrics file is locked to the end of the run.
    let mut outputs = if logger { RunOutputs::open(c, start.first_step)? } else { RunOutputs::none(c) };
    let mut manager = checkpoints.map(|dir| CheckpointManager::new(dir, checkpoint_policy(c)));
    let state_slots = StateSlots::new(&step, &compiled)?;
    let model_keys = checkpoint::manifest::model_keys(c, &step.model);
    let signals = Signals::install(c.enable_autocheckpoint)?;

    let slots = Slots::of(&compiled, batch_names, batch_slots)?;

    let steps = derived.steps as u64;
    if start.first_step >= steps && logger {
        println!("the restored checkpoint already completed all {steps} steps; nothing to train");
    }
    let bar = if logger { progress_bar(steps.saturating_sub(start.first_step)) } else { ProgressBar::hidden() };
    let mut timing = DeviceTiming::new(c.skip_first_n_steps_for_profiler.max(0) as usize);
    let mut recorder = StepRecorder::new(c, &bar, logger);
    let mut feed = Feed { data: &mut train_data, first_row };
    let mut next_batch = match start.first_step < steps {
        true => Some(feed.transfer(client, &compiled, &slots, start.first_step)?),
        false => None,
    };
    let mut in_flight: Option<InFlight> = None;
    for step_index in start.first_step..steps {
        if let Some(p) = profiler.as_mut().filter(|p| p.starts_at(step_index)) {
            if let Some(flight) = in_flight.take() {
                recorder.record(finish(&compiled, &slots, flight, &mut timing, work)?, &mut report, &mut outputs)?;
            }
            p.start()?;
        }
        let batch = next_batch.take().expect("each step's batch is transferred before it runs");
        // From now on the devices hold this step's state; a checkpoint of it records the data
        // position after this step's batch (not after the next one, already read ahead).
        data_position.state = Some(batch.data_state);
        report.data_wait_times.push(batch.wait_seconds);
        let flight = dispatch(&compiled, &mut state, batch.arrays, &slots, step_index)?;
        // A signal seen now stops the run after this step.
        let stop = signals.stop_requested();
        let preempted = stop == Some("SIGTERM");
        let checkpoint = manager.as_ref().is_some_and(|m| m.due(step_index) || preempted);
        let profile_ends = profiler.as_ref().is_some_and(|p| p.stops_after(step_index));
        let eval_now = eval.is_some() && eval_due(c, step_index);
        if stop.is_none() && step_index + 1 < steps {
            next_batch = Some(feed.transfer(client, &compiled, &slots, step_index + 1)?);
        }
        if let Some(previous) = in_flight.replace(flight) {
            recorder.record(finish(&compiled, &slots, previous, &mut timing, work)?, &mut report, &mut outputs)?;
        }
        // For hang diagnostics the current step is the one whose metrics are awaited next.
        diagnostics::step_started(step_index);
        if !(checkpoint || eval_now || profile_ends || stop.is_some()) {
            continue;
        }
        // The host needs this step finished (and, for an eval or a checkpoint, its state) before
        // the next step replaces that state.
        if let Some(flight) = in_flight.take() {
            recorder.record(finish(&compiled, &slots, flight, &mut timing, work)?, &mut report, &mut outputs)?;
        }
        if profile_ends {
            if let Some(p) = profiler.as_mut() {
                p.stop()?;
            }
        }
        if let Some(eval) = eval.as_ref().filter(|_| eval_now) {
            diagnostics::set_phase(Some(step_index), "evaluating");
            let metrics = eval.run(client, &state, step_index, c.eval_steps)?;
            if logger {
                print_line(&bar, &metrics.log_line());
            }
            outputs.eval(&metrics, &c.run_name).context("writing the run's eval metrics")?;
            report.evals.push(metrics);
            // The eval's time is not the next train step's.
            timing.pause();
        }
        if let Some(manager) = manager.as_mut().filter(|_| checkpoint) {
            diagnostics::set_phase(Some(step_index), "copying the state off the devices for a checkpoint");
            let t = Instant::now();
            let snapshot = state_slots.snapshot(&compiled, &state, step_index, &model_keys, &data_position)?;
            report.snapshot_seconds.push(t.elapsed().as_secs_f64());
            manager.save(snapshot)?;
            // The copy is the checkpoint's cost (`snapshot_seconds`), not the next step's time.
            timing.pause();
        }
        if let Some(signal) = stop {
            print_line(&bar, &format!("{signal}: stopping after step {step_index}"));
            report.stopped_by = Some(signal);
            break;
        }
    }
    if let Some(flight) = in_flight.take() {
        recorder.record(finish(&compiled, &slots, flight, &mut timing, work)?, &mut report, &mut outputs)?;
    }
    report.device_idle_fraction = timing.idle_fraction();
    report.perf_skipped_steps = timing.skip;
    bar.finish_and_clear();
    if let Some((documents, undecodable, tokens)) = train_data.text_stats().filter(|_| logger) {
        println!("data: {documents} documents, {tokens} tokens packed so far; {undecodable} rows could not be decoded (skipped)");
    }
    // The position after the last step run (the pipeline itself may have read ahead).
    report.data_state = data_position.state;
    diagnostics::set_phase(None, "finishing: metrics, checkpoints");
    let last_step = recorder.last_step;
    if let Some(step_index) = last_step {
        outputs.flush(step_index)?;
    }
    if let Some(mut manager) = manager {
        if let Some(step_index) = last_step.filter(|&s| manager.policy.on_completion && !manager.has(s)) {
            if report.stopped_by.is_none() {
                let t = Instant::now();
                let snapshot = state_slots.snapshot(&compiled, &state, step_index, &model_keys, &data_position)?;
                report.snapshot_seconds.push(t.elapsed().as_secs_f64());
                manager.save(snapshot)?;
            }
        }
        manager.wait()?;
        report.checkpoints = std::mem::take(&mut manager.saved);
        report.checkpoint_failures = std::mem::take(&mut manager.failures);
    }
    diagnostics::set_phase(None, "finished training");
    report.peak_memory_bytes = peak_memory(&client.addressable_devices()?);
    if logger {
        print_summary(&report, &work);
    }
    Ok(report)
}

/// What happens to a finished step's metrics, in both training loops (this one and the
/// pipelined one): logged (by the process that logs) and written, then judged (as MaxText's
/// metric_logger: the step's metrics are written, then the run may stop), and kept in the report.
pub(super) struct StepRecorder<'a> {
    run_name: &'a str,
    bar: &'a ProgressBar,
    logger: bool,
    health: Health,
    /// The last step recorded.
    pub last_step: Option<u64>,
}

impl<'a> StepRecorder<'a> {
    pub fn new(c: &'a Config, bar: &'a ProgressBar, logger: bool) -> StepRecorder<'a> {
        StepRecorder { run_name: &c.run_name, bar, logger, health: Health::new(c), last_step: None }
    }

    pub fn record(&mut self, metrics: StepMetrics, report: &mut RunReport, outputs: &mut RunOutputs) -> Result<()> {
        if self.logger {
            print_line(self.bar, &metrics.log_line());
        }
        outputs.step(&metrics, self.run_name).context("writing the run's metrics")?;
        let verdict = self.health.observe(metrics.step, metrics.loss, metrics.grad_norm);
        if verdict.is_err() {
            self.bar.finish_and_clear();
        }
        if let Some(warning) = verdict? {
            self.bar.suspend(|| tracing::warn!("{warning}"));
        }
        report.losses.push(metrics.loss);
        report.grad_norms.push(metrics.grad_norm);
        report.learning_rates.push(metrics.learning_rate);
        report.step_times.push(metrics.step_time_seconds);
        self.last_step = Some(metrics.step);
        self.bar.inc(1);
        Ok(())
    }
}

/// The run's checkpoints directory, when `enable_checkpointing` (validation made sure
/// `base_output_directory` is set then).
fn run_checkpoints(c: &Config) -> Result<Option<Checkpoints>> {
    if !c.enable_checkpointing {
        return Ok(None);
    }
    let dir = outputs::run_dir(c)?.expect("validated: checkpointing has base_output_directory");
    Ok(Some(Checkpoints::new(dir.join("checkpoints"))))
}

fn checkpoint_policy(c: &Config) -> Policy {
    Policy {
        period: c.checkpoint_period as u64,
        on_start: c.save_checkpoint_on_start,
        on_completion: c.save_checkpoint_on_completion,
        asynchronous: c.async_checkpointing,
        keep: c.max_num_checkpoints_to_keep.map(|n| n as usize),
        on_error: match c.on_checkpoint_error {
            OnCheckpointError::Stop => OnError::Stop,
            OnCheckpointError::Continue => OnError::Continue,
        },
    }
}

/// A local copy of a `gs://` `dataset_path` (deleted when dropped); `None` for a local one.
fn remote_dataset_copy(c: &Config) -> Result<Option<tempfile::TempPath>> {
    if c.dataset_path.is_empty() {
        return Ok(None);
    }
    match Location::parse(&c.dataset_path)? {
        Location::Local(_) => Ok(None),
        remote => Ok(Some(storage::download(&remote)?)),
    }
}

/// Where each state array lives: its name, its input slot and the output that carries it.
struct StateSlots {
    slots: Vec<(String, usize, usize)>,
}

impl StateSlots {
    fn new(step: &TrainStep, compiled: &Compiled) -> Result<StateSlots> {
        let slots = step
            .state_specs()
            .into_iter()
            .map(|(name, ..)| Ok((name.clone(), compiled.input_index(&name)?, compiled.output_index(&name)?)))
            .collect::<Result<_>>()?;
        Ok(StateSlots { slots })
    }

    /// Copies the state after `step_index` off the devices (each array assembled from its
    /// shards), with what the manifest records.
    fn snapshot(
        &self,
        compiled: &Compiled,
        state: &[Option<DeviceArray>],
        step_index: u64,
        model: &BTreeMap<String, serde_json::Value>,
        data: &dyn DataState,
    ) -> Result<Snapshot> {
        let arrays = self
            .slots
            .iter()
            .map(|(name, input, output)| {
                let array = state[*input].as_ref().expect("state slots are always set");
                Ok((name.clone(), compiled.fetch(*output, array)?))
            })
            .collect::<Result<_>>()?;
        Ok(Snapshot {
            step: Some(step_index),
            arrays,
            model: model.clone(),
            data: Some(data.save_state(step_index + 1)),
        })
    }
}

/// SIGTERM (with `enable_autocheckpoint`) and SIGINT, noted by flags the loop checks after each
/// step; the handlers are removed when the run ends.
struct Signals {
    terminate: Arc<AtomicBool>,
    interrupt: Arc<AtomicBool>,
    ids: Vec<signal_hook::SigId>,
}

impl Signals {
    fn install(autocheckpoint: bool) -> Result<Signals> {
        use signal_hook::consts::{SIGINT, SIGTERM};
        use signal_hook::flag;
        let terminate = Arc::new(AtomicBool::new(false));
        let interrupt = Arc::new(AtomicBool::new(false));
        let mut ids = Vec::new();
        let fail = |e: std::io::Error| anyhow!("cannot install a signal handler: {e}");
        // A second SIGINT exits at once (130 = 128 + SIGINT), as an impatient user expects.
        ids.push(flag::register_conditional_shutdown(SIGINT, 130, interrupt.clone()).map_err(fail)?);
        ids.push(flag::register(SIGINT, interrupt.clone()).map_err(fail)?);
        if autocheckpoint {
            ids.push(flag::register(SIGTERM, terminate.clone()).map_err(fail)?);
        }
        Ok(Signals { terminate, interrupt, ids })
    }

    fn stop_requested(&self) -> Option<&'static str> {
        if self.terminate.load(Ordering::Relaxed) {
            Some("SIGTERM")
        } else if self.interrupt.load(Ordering::Relaxed) {
            Some("SIGINT")
        } else {
            None
        }
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}

/// Copies a batch's arrays `names` (this process's rows, from `first_row` of the global batch)
/// into the step's input `slots`.
fn put_batch(
    client: &Client,
    compiled: &Compiled,
    slots: &[usize],
    names: &[&str],
    batch: &Batch,
    first_row: i64,
    state: &mut [Option<DeviceArray>],
) -> Result<()> {
    for (slot, name) in slots.iter().zip(names) {
        let host = batch.get(name).expect("a Batch has every input");
        state[*slot] = Some(compiled.put_rows(client, *slot, host, first_row)?);
    }
    Ok(())
}

/// MaxText's rule (maxtext `src/maxtext/trainers/pre_train/train.py`, main e591f30): eval after
/// train step `s` when `s >= eval_start_step` and `(s - eval_start_step) % eval_interval == 0`.
fn eval_due(c: &Config, step: u64) -> bool {
    let (start, interval) = (c.eval_start_step as u64, c.eval_interval);
    interval > 0 && step >= start && (step - start).is_multiple_of(interval as u64)
}

/// The compiled eval step and its data.
struct Evaluator {
    compiled: Compiled,
    data: EvalData,
    /// For each eval input: the train state slot holding it (parameters), or `None` (batch).
    from_state: Vec<Option<usize>>,
    batch_names: Vec<&'static str>,
    batch_slots: Vec<usize>,
    outputs: [usize; 3],
    /// The load-balancing loss's output, for models with experts.
    lb_output: Option<usize>,
}

impl Evaluator {
    fn new(client: &Client, step: &TrainStep, train: &Compiled, data: EvalData, rows: usize) -> Result<Evaluator> {
        // Eval batches are text (`hf_eval_files`): packed whenever `packing` is on.
        let packed = data.packed();
        let program = step.eval_step(rows as i64, packed).map_err(|e| anyhow!("tracing the eval step: {e}"))?;
        let compiled = runtime::compile(client, &program).context("compiling the eval step")?;
        let from_state = compiled
            .program
            .inputs
            .iter()
            .map(|i| if i.name.starts_with("params.") { train.input_index(&i.name).map(Some) } else { Ok(None) })
            .collect::<Result<_>>()?;
        let batch_names = batch_inputs(packed);
        let batch_slots =
            batch_names.iter().map(|n| compiled.input_index(&format!("batch.{n}"))).collect::<Result<_>>()?;
        let out = |n: &str| compiled.output_index(&format!("metrics.{n}"));
        let outputs = [out("total_loss")?, out("total_weights")?, out("z_loss")?];
        let lb_output = out("moe_lb_loss").ok();
        Ok(Evaluator { compiled, data, from_state, batch_names, batch_slots, outputs, lb_output })
    }

    /// One pass over the eval files (at most `eval_steps` batches when positive) with the
    /// current parameters.
    fn run(
        &self,
        client: &Client,
        state: &[Option<DeviceArray>],
        after_step: u64,
        eval_steps: i64,
    ) -> Result<EvalMetrics> {
        // This process's rows of the global eval batch.
        let first_row = self.compiled.local_rows(self.batch_slots[0])?.start as i64;
        let mut metrics = EvalMetrics { step: after_step, ..EvalMetrics::default() };
        let mut batches: BatchIterator = self.data.batches();
        let mut slots: Vec<Option<DeviceArray>> = self.compiled.program.inputs.iter().map(|_| None).collect();
        while eval_steps <= 0 || (metrics.eval_steps as i64) < eval_steps {
            let Some(batch) = batches.next_batch()? else { break };
            put_batch(client, &self.compiled, &self.batch_slots, &self.batch_names, &batch, first_row, &mut slots)?;
            let args: Vec<&DeviceArray> = slots
                .iter()
                .zip(&self.from_state)
                .map(|(own, train_slot)| match train_slot {
                    Some(t) => state[*t].as_ref().expect("the train state is set"),
                    None => own.as_ref().expect("every batch input is set"),
                })
                .collect();
            let outputs = self.compiled.execute(&args)?;
            let scalar = |i: usize| -> Result<f64> { Ok(self.compiled.fetch(i, &outputs[i])?.to_f64()[0]) };
            metrics.total_loss += scalar(self.outputs[0])?;
            metrics.total_weights += scalar(self.outputs[1])?;
            metrics.z_loss_sum += scalar(self.outputs[2])?;
            if let Some(i) = self.lb_output {
                *metrics.moe_lb_loss_sum.get_or_insert(0.0) += scalar(i)?;
            }
            metrics.eval_steps += 1;
        }
        if metrics.eval_steps == 0 {
            bail!("eval after step {after_step}: hf_eval_files gave no batch (no decodable documents)");
        }
        Ok(metrics)
    }
}

/// Loads the train step `maxrs train-compile` saved, after checking that it was compiled for
/// this program, these devices (`granules`: the device ids of each process) and this plugin
/// build (see `runtime::artifact`).
fn load_step(
    c: &Config,
    client: &Client,
    step: &TrainStep,
    program: &Program,
    mlir: &str,
    granules: &[Vec<i64>],
    path: &Path,
) -> Result<Compiled> {
    let devices = client.addressable_devices()?;
    let num_devices = granules.iter().map(Vec::len).sum();
    let mut current = artifact::header(
        c,
        &step.model,
        program,
        mlir,
        artifact::Platform {
            devices: artifact::describe_devices(granules.len(), devices.len(), &devices[0].kind),
            num_devices,
            plugin: artifact::plugin_identity(client.plugin()),
            platform_version: client.platform_version()?,
        },
    );
    current.device_ids_per_host = granules.to_vec();
    let bytes = artifact::load_matching(path, &current)?;
    let executable = client.deserialize(&bytes).with_context(|| format!("loading {}", path.display()))?;
    println!("loaded the compiled train step from {} (no compile)", path.display());
    Compiled::new(program, executable)
}

/// The state a run starts from.
struct Start {
    /// The step's inputs as device arrays (batch slots empty).
    state: Vec<Option<DeviceArray>>,
    first_step: u64,
    /// The data position to continue from (a resumed run only).
    data: Option<serde_json::Value>,
}

/// MaxText's order (maxtext `src/maxtext/configs/base.yml`, checkpointing section, commit
/// e591f30): the run's own newest good checkpoint; else `load_full_state_path` (parameters,
/// optimizer state and step; the data starts over) or `load_parameters_path` (parameters; the
/// optimizer state is fresh); else the init program. Restored arrays are put onto this run's
/// mesh with its shardings, whatever mesh wrote them.
fn initial_state(
    c: &Config,
    client: &Client,
    step: &TrainStep,
    compiled: &Compiled,
    checkpoints: Option<&Checkpoints>,
) -> Result<Start> {
    let expected: Vec<Expected> = step
        .state_specs()
        .into_iter()
        .map(|(name, dtype, dims, _)| Expected { name, ty: runtime::element_type(dtype), dims })
        .collect();
    let model_keys = checkpoint::manifest::model_keys(c, &step.model);
    let mut restored = None;
    if let Some(checkpoints) = checkpoints {
        checkpoints.remove_incomplete()?;
        if let Some(loaded) = checkpoints.restore_latest(&expected, &model_keys)? {
            let step_done =
                loaded.manifest.step.ok_or_else(|| anyhow!("{}: the checkpoint has no step", loaded.location))?;
            println!("resuming from the checkpoint of step {step_done} ({})", loaded.location);
            let data = loaded.manifest.data.clone();
            restored = Some((loaded.arrays, step_done + 1, data));
        }
    }
    if restored.is_none() && !c.load_full_state_path.is_empty() {
        let dir = Location::parse(&c.load_full_state_path)?;
        let loaded = checkpoint::dir::load(&dir, &expected, &model_keys, false)
            .with_context(|| format!("load_full_state_path={dir}"))?;
        let step_done = loaded.manifest.step.ok_or_else(|| {
            anyhow!("load_full_state_path={dir}: a parameters-only checkpoint (no step); use load_parameters_path")
        })?;
        println!("loaded the full state of step {step_done} from {dir}; training continues at step {}", step_done + 1);
        restored = Some((loaded.arrays, step_done + 1, None));
    }
    let parameters = match restored {
        None if !c.load_parameters_path.is_empty() => Some(load_parameter_arrays(c, &expected, &model_keys)?),
        _ => None,
    };

    let with_params = restored.is_none() && parameters.is_none();
    let init = step.init(with_params).map_err(|e| anyhow!("tracing the initializer: {e}"))?;
    let init = runtime::compile(client, &init)?;
    let outputs = init.execute(&[])?;
    let mut state: Vec<Option<DeviceArray>> = compiled.program.inputs.iter().map(|_| None).collect();
    for (spec, array) in init.program.outputs.iter().zip(outputs) {
        state[compiled.input_index(&spec.name)?] = Some(array);
    }
    let (arrays, first_step, data) = match (restored, parameters) {
        (Some(restored), _) => restored,
        (None, Some(params)) => (params, 0, None),
        (None, None) => (BTreeMap::new(), 0, None),
    };
    for (name, host) in &arrays {
        let slot = compiled.input_index(name)?;
        state[slot] = Some(compiled.put(client, slot, host)?);
    }
    Ok(Start { state, first_step, data })
}

/// The parameters `load_parameters_path` names: a checkpoint directory (its `params`, float
/// types converted to `weight_dtype`) or a safetensors file, local or gs://. Keys are the train
/// step's names (`params.…`).
pub(super) fn load_parameter_arrays(
    c: &Config,
    expected: &[Expected],
    model_keys: &BTreeMap<String, serde_json::Value>,
) -> Result<BTreeMap<String, crate::host::HostTensor>> {
    let location = Location::parse(&c.load_parameters_path)?;
    let params: Vec<Expected> = expected.iter().filter(|e| e.name.starts_with("params.")).cloned().collect();
    let is_checkpoint = storage::is_file(&location.join(checkpoint::manifest::MANIFEST_FILE))?;
    let arrays = if is_checkpoint {
        checkpoint::dir::load(&location, &params, model_keys, true)
            .with_context(|| format!("load_parameters_path={location}"))?
            .arrays
    } else {
        let specs: Vec<ParamSpec> = params
            .iter()
            .map(|e| ParamSpec { name: e.name["params.".len()..].to_string(), ty: e.ty, dims: e.dims.clone() })
            .collect();
        let local = match &location {
            Location::Local(path) => load_parameters(path, &specs)?,
            remote => load_parameters(&storage::download(remote)?, &specs)?,
        };
        local.into_iter().map(|(name, tensor)| (format!("params.{name}"), tensor)).collect()
    };
    println!("loaded {} parameters from {location}", arrays.len());
    Ok(arrays)
}

pub(super) fn per_device_work(c: &Config, model: &Model, derived: &Derived, device_kind: &str) -> PerDeviceWork {
    let shape = StepShape {
        per_device_batch_size: derived.per_device_batch_size,
        max_target_length: derived.max_target_length as u64,
        gradient_accumulation_steps: derived.gradient_accumulation_steps as u64,
    };
    let configured = (c.peak_tflops_per_device > 0.0).then_some(c.peak_tflops_per_device);
    PerDeviceWork {
        tflops: model.training_tflops_per_device(&shape).total,
        tokens: shape.tokens_per_device(),
        peak_tflops: flops::peak_tflops_per_device(device_kind, configured),
    }
}

pub(super) fn progress_bar(steps: u64) -> ProgressBar {
    let bar = ProgressBar::new(steps);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} steps, {elapsed} elapsed, ~{eta} left")
            .expect("a valid template"),
    );
    bar
}

/// Prints above the progress bar, or plainly when there is none (stderr is not a terminal).
pub(super) fn print_line(bar: &ProgressBar, line: &str) {
    if bar.is_hidden() {
        println!("{line}");
    } else {
        bar.println(line);
    }
}

pub(super) fn peak_memory(devices: &[pjrt::Device]) -> Option<i64> {
    devices.iter().filter_map(|d| d.memory_stats().ok().flatten()).filter_map(|s| s.peak_bytes_in_use).max()
}

pub(super) fn print_summary(report: &RunReport, work: &PerDeviceWork) {
    let (Some(first), Some(last)) = (report.losses.first(), report.losses.last()) else { return };
    // The first `skip_first_n_steps_for_profiler` steps (compilation, warm-up) are left out; a
    // run with no step after them shows its last step.
    let median =
        median_step_time_after(&report.step_times, report.perf_skipped_steps).or(report.step_times.last().copied());
    let mut line = format!("done: {} steps, loss {first:.3} -> {last:.3}", report.losses.len());
    if let Some(m) = median {
        line.push_str(&format!(", median step {:.4} s, {:.3} TFLOP/s/device", m, work.tflops / m));
    }
    if let Some(idle) = report.device_idle_fraction {
        line.push_str(&format!(", device waiting for the host {:.1}% of the time", idle * 100.0));
    }
    if let Some(peak) = report.peak_memory_bytes {
        line.push_str(&format!(", peak device memory {:.1} MiB", peak as f64 / (1u64 << 20) as f64));
    }
    println!("{line}");
}

/// Where the loop's inputs and outputs are in the compiled step.
struct Slots {
    /// The batch inputs (`batch_inputs(packed)`) and their slots.
    batch_names: Vec<&'static str>,
    batch: Vec<usize>,
    /// `loss`, `grad_norm`, `learning_rate`, `total_weights`, and `moe_lb_loss` for models with
    /// experts.
    metrics: Vec<usize>,
    /// For each output, the input slot it feeds next step (state outputs share their input's
    /// name).
    carried: Vec<Option<usize>>,
}

impl Slots {
    fn of(compiled: &Compiled, batch_names: Vec<&'static str>, batch: Vec<usize>) -> Result<Slots> {
        let metric = |name: &str| compiled.output_index(&format!("metrics.{name}"));
        Ok(Slots {
            batch_names,
            batch,
            metrics: [metric("loss")?, metric("grad_norm")?, metric("learning_rate")?, metric("total_weights")?]
                .into_iter()
                .chain(metric("moe_lb_loss").ok())
                .collect(),
            carried: compiled.program.outputs.iter().map(|o| compiled.input_index(&o.name).ok()).collect(),
        })
    }
}

/// The training data and this process's first row of the global batch.
struct Feed<'a> {
    data: &'a mut BatchIterator,
    first_row: i64,
}

/// A step's batch on the devices, with the data position after it.
struct StepBatch {
    arrays: Vec<(usize, DeviceArray)>,
    data_state: data::DataState,
    /// How long the input pipeline took to deliver it.
    wait_seconds: f64,
}

impl Feed<'_> {
    /// Step `step`'s batch, read from the input pipeline and copied to the devices.
    fn transfer(&mut self, client: &Client, compiled: &Compiled, slots: &Slots, step: u64) -> Result<StepBatch> {
        diagnostics::set_phase(Some(step), "reading and feeding the batch");
        let wait = Instant::now();
        let batch = self.data.next_batch()?.ok_or_else(|| anyhow!("the training data ended at step {step}"))?;
        let wait_seconds = wait.elapsed().as_secs_f64();
        let arrays = slots
            .batch
            .iter()
            .zip(&slots.batch_names)
            .map(|(&slot, name)| {
                let host = batch.get(name).expect("a Batch has every input");
                Ok((slot, compiled.put_rows(client, slot, host, self.first_row)?))
            })
            .collect::<Result<_>>()?;
        Ok(StepBatch { arrays, data_state: self.data.state(), wait_seconds })
    }
}

/// A dispatched step whose metrics have not been read.
struct InFlight {
    step: u64,
    /// The metric outputs, in `Slots::metrics` order.
    metrics: Vec<DeviceArray>,
    /// When the step's loss became ready, where the plugin reports it.
    done: Option<ReadyTime>,
    dispatched: Instant,
}

/// Starts step `step` on `batch`; its new state replaces the old in `state` (the devices run it
/// in order), its metrics stay on the devices until `finish`.
fn dispatch(
    compiled: &Compiled,
    state: &mut [Option<DeviceArray>],
    batch: Vec<(usize, DeviceArray)>,
    slots: &Slots,
    step: u64,
) -> Result<InFlight> {
    for (slot, array) in batch {
        state[slot] = Some(array);
    }
    let args: Vec<&DeviceArray> = state.iter().map(|a| a.as_ref().expect("every input is set")).collect();
    diagnostics::set_phase(Some(step), "running the train step (XLA's collectives run inside it)");
    let dispatched = Instant::now();
    let mut outputs: Vec<Option<DeviceArray>> = compiled.execute(&args)?.into_iter().map(Some).collect();
    for (output, slot) in outputs.iter_mut().zip(&slots.carried) {
        if let Some(slot) = slot {
            state[*slot] = output.take();
        }
    }
    let metrics: Vec<DeviceArray> =
        slots.metrics.iter().map(|&i| outputs[i].take().expect("metrics are not carried")).collect();
    let done = metrics[0].first().and_then(|b| b.ready_time().ok());
    Ok(InFlight { step, metrics, done, dispatched })
}

/// Reads a dispatched step's metrics (waiting for it) and times it.
fn finish(
    compiled: &Compiled,
    slots: &Slots,
    flight: InFlight,
    timing: &mut DeviceTiming,
    work: PerDeviceWork,
) -> Result<StepMetrics> {
    diagnostics::set_phase(Some(flight.step), "reading the step's metrics");
    let values = slots
        .metrics
        .iter()
        .zip(&flight.metrics)
        .map(|(&index, array)| Ok(compiled.fetch(index, array)?.to_f64()[0]))
        .collect::<Result<Vec<f64>>>()?;
    let (loss, grad_norm, learning_rate, weights) = (values[0], values[1], values[2], values[3]);
    let done = flight.done.as_ref().and_then(ReadyTime::get).unwrap_or_else(Instant::now);
    let step_time_seconds = timing.completed(flight.dispatched, done);
    diagnostics::step_finished(flight.step);
    Ok(StepMetrics {
        step: flight.step,
        loss,
        grad_norm,
        learning_rate,
        total_weights: weights as u64,
        moe_lb_loss: values.get(4).copied(),
        step_time_seconds,
        work,
    })
}

/// When each step finished on the devices, and how long they waited for the host before the
/// next: step `k` took from step `k - 1`'s completion (step 0: its dispatch) to its own, and
/// the devices were idle for the part of that before step `k` was dispatched.
struct DeviceTiming {
    /// Steps left out of the idle share (`skip_first_n_steps_for_profiler`).
    skip: usize,
    last_done: Option<Instant>,
    /// Per completed step: (wall seconds, idle seconds).
    steps: Vec<(f64, f64)>,
}

impl DeviceTiming {
    fn new(skip: usize) -> DeviceTiming {
        DeviceTiming { skip, last_done: None, steps: Vec::new() }
    }

    /// Records a step dispatched at `dispatched` and done at `done`; returns its step time.
    fn completed(&mut self, dispatched: Instant, done: Instant) -> f64 {
        let start = self.last_done.unwrap_or(dispatched);
        let wall = done.saturating_duration_since(start).as_secs_f64();
        let idle = match self.last_done {
            Some(previous) => dispatched.saturating_duration_since(previous).as_secs_f64(),
            None => 0.0,
        };
        self.last_done = Some(done.max(start));
        self.steps.push((wall, idle.min(wall)));
        wall
    }

    /// The host did work it was asked for (a checkpoint copy) with the devices drained: the next
    /// step is timed from its own dispatch, and the gap is not counted as idle.
    fn pause(&mut self) {
        self.last_done = None;
    }

    /// Idle over wall time of the steps after the skipped ones.
    fn idle_fraction(&self) -> Option<f64> {
        let counted = self.steps.get(self.skip..).filter(|s| !s.is_empty())?;
        let wall: f64 = counted.iter().map(|s| s.0).sum();
        (wall > 0.0).then(|| counted.iter().map(|s| s.1).sum::<f64>() / wall)
    }
}
