//! `maxrs train`'s job, start to end: plugin and devices -> validated config and mesh -> traced,
//! lowered and compiled train step -> state initialized on the devices (or loaded from
//! `load_parameters_path`) -> the step loop (data in, metrics out, state stays on the devices)
//! -> a summary. [`RunReport`] returns what happened, for tests and benchmarks.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

use crate::aot::artifact;
use crate::cluster::{diagnostics, Cluster};
use crate::config::{self, Config, Derived};
use crate::ir::Program;
use crate::lower::to_stablehlo;
use crate::pjrt::{self, Client, ReadyTime};
use crate::runtime::{self, Compiled, DeviceArray};

use super::data::{host_rows, BatchLoader, DataSource};
use super::flops::{self, StepShape};
use super::metrics::{median_step_time_after, MetricsWriter, PerDeviceWork, StepMetrics};
use super::params_io::{load_parameters, ParamSpec};
use super::profiler::StepProfiler;
use super::step::{step_mesh, TrainStep, BATCH_INPUTS};

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
    /// TFLOPs per device per step (MaxText's formula).
    pub tflops_per_device: f64,
    /// Peak device memory in use after the run, when the plugin reports it.
    pub peak_memory_bytes: Option<i64>,
    /// The share of wall time the devices had finished a step and the host had not yet
    /// dispatched the next (steps after the first `perf_skipped_steps`), when measurable.
    pub device_idle_fraction: Option<f64>,
    /// Steps left out of the performance summary (`skip_first_n_steps_for_profiler`).
    pub perf_skipped_steps: usize,
}

/// The devices of a one-process run: the plugin's client.
pub fn client_for(c: &Config) -> Result<Client> {
    Cluster::single().pjrt_client(c)
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
    let devices = client.devices()?;
    let granules = devices_per_process(&devices);
    if granules.len() != cluster.process_count() {
        bail!(
            "the plugin reports devices of {} processes, but this job has {}",
            granules.len(),
            cluster.process_count()
        );
    }
    let logger = cluster.is_logger();
    let derived = config::validate(c, devices.len(), granules.len())?;
    let step =
        TrainStep::new(c, &derived, step_mesh(&derived, &granules).map_err(|e| anyhow!(e))?).map_err(|e| anyhow!(e))?;
    if logger {
        derived.print_summary(step.model.num_params());
        println!("{}", crate::model::attention::describe(c.attention, step.model.config.attention));
    }
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
    let mut state = initial_state(c, client, &step, &compiled)?;
    report.startup.init = t.elapsed().as_secs_f64();
    if logger {
        println!(
            "start-up: trace {:.3} s, lower {:.3} s, compile {:.3} s, init {:.3} s",
            report.startup.trace, report.startup.lower, report.startup.compile, report.startup.init
        );
    }

    let work = per_device_work(c, &step, &derived, devices.first().map(|d| d.kind.as_str()).unwrap_or(""));
    report.tflops_per_device = work.tflops;
    let seed = u64::try_from(c.data_shuffle_seed).map_err(|_| anyhow!("data_shuffle_seed must be >= 0"))?;
    let path = (!c.dataset_path.is_empty()).then(|| PathBuf::from(&c.dataset_path));
    let source = DataSource::open(
        c.dataset_type.as_str(),
        path.as_deref(),
        seed,
        derived.max_target_length,
        c.vocab_size as u32,
    )?;
    let batch_inputs: Vec<usize> =
        BATCH_INPUTS.iter().map(|n| compiled.input_index(&format!("batch.{n}"))).collect::<Result<_>>()?;
    let (p, n) = (cluster.process_index(), cluster.process_count());
    let rows = compiled.local_rows(batch_inputs[0])?;
    let global = derived.global_batch_size;
    // The rows this process's devices hold: its share of the batch, or all of it when the mesh
    // does not split the batch across processes.
    let mut loader = if rows == (0..global) {
        BatchLoader::new(source, global, 0, 1)?
    } else if rows == host_rows(global, p, n)? {
        BatchLoader::new(source, global, p, n)?
    } else {
        bail!(
            "process {p} of {n} holds batch rows {rows:?} of {global}, which is neither its share {:?} nor the whole \
             batch; shard the batch over the DCN axes in process order (dcn_data_parallelism or dcn_fsdp_parallelism)",
            host_rows(global, p, n)?
        );
    };
    let mut writer = match c.metrics_file.as_str() {
        _ if !logger => None,
        "" => None,
        path => Some(
            MetricsWriter::open(Path::new(path), 0, &c.run_name)
                .with_context(|| format!("metrics_file={path}: cannot open it for writing"))?,
        ),
    };
    let slots = Slots::of(&compiled)?;

    let bar = if logger { progress_bar(derived.steps as u64) } else { ProgressBar::hidden() };
    let mut timing = DeviceTiming::new(c.skip_first_n_steps_for_profiler.max(0) as usize);
    let mut log = |metrics: StepMetrics, report: &mut RunReport| -> Result<()> {
        if logger {
            print_line(&bar, &metrics.log_line());
        }
        if let Some(w) = writer.as_mut() {
            w.write(&metrics).with_context(|| format!("writing metrics_file={}", c.metrics_file))?;
        }
        report.losses.push(metrics.loss);
        report.grad_norms.push(metrics.grad_norm);
        report.learning_rates.push(metrics.learning_rate);
        report.step_times.push(metrics.step_time_seconds);
        bar.inc(1);
        Ok(())
    };
    // The host stays one step ahead: step k is dispatched, then step k + 1's batch goes to the
    // devices and step k - 1's metrics come back while step k runs.
    let mut next_batch = Some(transfer_batch(client, &compiled, &mut loader, &slots, 0)?);
    let mut in_flight: Option<InFlight> = None;
    for step_index in 0..derived.steps as u64 {
        if let Some(p) = profiler.as_mut().filter(|p| p.starts_at(step_index)) {
            if let Some(flight) = in_flight.take() {
                log(finish(&compiled, &slots, flight, &mut timing, work)?, &mut report)?;
            }
            p.start()?;
        }
        let batch = next_batch.take().expect("each step's batch is transferred before it runs");
        let flight = dispatch(&compiled, &mut state, batch, &slots, step_index)?;
        if step_index + 1 < derived.steps as u64 {
            next_batch = Some(transfer_batch(client, &compiled, &mut loader, &slots, step_index + 1)?);
        }
        if let Some(previous) = in_flight.replace(flight) {
            log(finish(&compiled, &slots, previous, &mut timing, work)?, &mut report)?;
        }
        // For hang diagnostics the current step is the one whose metrics are awaited next.
        diagnostics::step_started(step_index);
        if let Some(p) = profiler.as_mut().filter(|p| p.stops_after(step_index)) {
            if let Some(flight) = in_flight.take() {
                log(finish(&compiled, &slots, flight, &mut timing, work)?, &mut report)?;
            }
            p.stop()?;
        }
    }
    if let Some(flight) = in_flight.take() {
        log(finish(&compiled, &slots, flight, &mut timing, work)?, &mut report)?;
    }
    report.device_idle_fraction = timing.idle_fraction();
    report.perf_skipped_steps = timing.skip;
    bar.finish_and_clear();
    diagnostics::set_phase(None, "finished training");
    report.peak_memory_bytes = peak_memory(&client.addressable_devices()?);
    if logger {
        print_summary(&report, &work);
    }
    Ok(report)
}

/// Loads the train step `maxrs train-compile` saved, after checking that it was compiled for
/// this program, these devices (`granules`: the device ids of each process) and this plugin
/// build (see `aot::artifact`).
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

/// The step's inputs as device arrays (batch slots empty): parameters and optimizer state from
/// the init program, parameters from `load_parameters_path` when given.
fn initial_state(
    c: &Config,
    client: &Client,
    step: &TrainStep,
    compiled: &Compiled,
) -> Result<Vec<Option<DeviceArray>>> {
    let from_file = !c.load_parameters_path.is_empty();
    let init = step.init(!from_file).map_err(|e| anyhow!("tracing the initializer: {e}"))?;
    let init = runtime::compile(client, &init)?;
    let outputs = init.execute(&[])?;
    let mut state: Vec<Option<DeviceArray>> = compiled.program.inputs.iter().map(|_| None).collect();
    for (spec, array) in init.program.outputs.iter().zip(outputs) {
        state[compiled.input_index(&spec.name)?] = Some(array);
    }
    if from_file {
        let dtype = runtime::element_type(step.model.config.weight_dtype);
        let expected: Vec<ParamSpec> =
            step.model.param_defs().into_iter().map(|d| ParamSpec { name: d.name, ty: dtype, dims: d.shape }).collect();
        let params = load_parameters(Path::new(&c.load_parameters_path), &expected)?;
        for (name, host) in &params {
            let slot = compiled.input_index(&format!("params.{name}"))?;
            state[slot] = Some(compiled.put(client, slot, host)?);
        }
        println!("loaded {} parameters from {}", params.len(), c.load_parameters_path);
    }
    Ok(state)
}

fn per_device_work(c: &Config, step: &TrainStep, derived: &Derived, device_kind: &str) -> PerDeviceWork {
    let shape = StepShape {
        per_device_batch_size: derived.per_device_batch_size,
        max_target_length: derived.max_target_length as u64,
        gradient_accumulation_steps: derived.gradient_accumulation_steps as u64,
    };
    let configured = (c.peak_tflops_per_device > 0.0).then_some(c.peak_tflops_per_device);
    PerDeviceWork {
        tflops: step.model.training_tflops_per_device(&shape).total,
        tokens: shape.tokens_per_device(),
        peak_tflops: flops::peak_tflops_per_device(device_kind, configured),
    }
}

fn progress_bar(steps: u64) -> ProgressBar {
    let bar = ProgressBar::new(steps);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} steps, {elapsed} elapsed, ~{eta} left")
            .expect("a valid template"),
    );
    bar
}

/// Prints above the progress bar, or plainly when there is none (stderr is not a terminal).
fn print_line(bar: &ProgressBar, line: &str) {
    if bar.is_hidden() {
        println!("{line}");
    } else {
        bar.println(line);
    }
}

fn peak_memory(devices: &[pjrt::Device]) -> Option<i64> {
    devices.iter().filter_map(|d| d.memory_stats().ok().flatten()).filter_map(|s| s.peak_bytes_in_use).max()
}

fn print_summary(report: &RunReport, work: &PerDeviceWork) {
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
    /// The batch inputs, in `BATCH_INPUTS` order.
    batch: Vec<usize>,
    /// `loss`, `grad_norm`, `learning_rate`, `total_weights`.
    metrics: [usize; 4],
    /// For each output, the input slot it feeds next step (state outputs share their input's
    /// name).
    carried: Vec<Option<usize>>,
}

impl Slots {
    fn of(compiled: &Compiled) -> Result<Slots> {
        let metric = |name: &str| compiled.output_index(&format!("metrics.{name}"));
        Ok(Slots {
            batch: BATCH_INPUTS.iter().map(|n| compiled.input_index(&format!("batch.{n}"))).collect::<Result<_>>()?,
            metrics: [metric("loss")?, metric("grad_norm")?, metric("learning_rate")?, metric("total_weights")?],
            carried: compiled.program.outputs.iter().map(|o| compiled.input_index(&o.name).ok()).collect(),
        })
    }
}

/// Step `step`'s batch, read on the host and copied to the devices.
fn transfer_batch(
    client: &Client,
    compiled: &Compiled,
    loader: &mut BatchLoader,
    slots: &Slots,
    step: u64,
) -> Result<Vec<(usize, DeviceArray)>> {
    diagnostics::set_phase(Some(step), "reading and feeding the batch");
    let batch = loader.batch(step)?;
    let named = batch.named();
    let first_row = loader.rows().start as i64;
    slots
        .batch
        .iter()
        .zip(BATCH_INPUTS)
        .map(|(&slot, name)| {
            let host = named.iter().find(|(n, _)| n == name).map(|(_, t)| *t).expect("Batch has every input");
            Ok((slot, compiled.put_rows(client, slot, host, first_row)?))
        })
        .collect()
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
    let mut values = [0.0; 4];
    for ((value, &index), array) in values.iter_mut().zip(&slots.metrics).zip(&flight.metrics) {
        *value = compiled.fetch(index, array)?.to_f64()[0];
    }
    let [loss, grad_norm, learning_rate, weights] = values;
    let done = flight.done.as_ref().and_then(ReadyTime::get).unwrap_or_else(Instant::now);
    let step_time_seconds = timing.completed(flight.dispatched, done);
    diagnostics::step_finished(flight.step);
    if !loss.is_finite() {
        bail!("step {}: the loss is {loss}; stopping (try a lower learning_rate)", flight.step);
    }
    Ok(StepMetrics {
        step: flight.step,
        loss,
        grad_norm,
        learning_rate,
        total_weights: weights as u64,
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

    /// Idle over wall time of the steps after the skipped ones.
    fn idle_fraction(&self) -> Option<f64> {
        let counted = self.steps.get(self.skip..).filter(|s| !s.is_empty())?;
        let wall: f64 = counted.iter().map(|s| s.0).sum();
        (wall > 0.0).then(|| counted.iter().map(|s| s.1).sum::<f64>() / wall)
    }
}
