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
use crate::model::Model;
use crate::lower::to_stablehlo;
use crate::pjrt::{self, Client};
use crate::runtime::{self, Compiled, DeviceArray};

use super::data::{host_rows, BatchLoader, DataSource};
use super::flops::{self, StepShape};
use super::metrics::{median_step_time, MetricsWriter, PerDeviceWork, StepMetrics};
use super::params_io::{load_parameters, ParamSpec};
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
    /// With pipeline parallelism: the measured bubble of each step.
    pub pipeline: Option<super::pipeline::run::PipelineReport>,
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
    if derived.pipeline.is_some() {
        return super::pipeline::run::train(c, client, &derived, &granules);
    }
    let step =
        TrainStep::new(c, &derived, step_mesh(&derived, &granules).map_err(|e| anyhow!(e))?).map_err(|e| anyhow!(e))?;
    if logger {
        derived.print_summary(step.model.num_params());
    }

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

    let work = per_device_work(c, &step.model, &derived, devices.first().map(|d| d.kind.as_str()).unwrap_or(""));
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
    let metric = |name: &str| compiled.output_index(&format!("metrics.{name}"));
    let (loss_i, norm_i, lr_i, weights_i) =
        (metric("loss")?, metric("grad_norm")?, metric("learning_rate")?, metric("total_weights")?);

    // For each output, the input slot it feeds next step (state outputs share their input's name).
    let carried: Vec<Option<usize>> =
        compiled.program.outputs.iter().map(|o| compiled.input_index(&o.name).ok()).collect();

    let bar = if logger { progress_bar(derived.steps as u64) } else { ProgressBar::hidden() };
    let mut last = Instant::now();
    for step_index in 0..derived.steps as u64 {
        diagnostics::step_started(step_index);
        diagnostics::set_phase(Some(step_index), "reading and feeding the batch");
        let batch = loader.batch(step_index)?;
        let named = batch.named();
        for (slot, name) in batch_inputs.iter().zip(BATCH_INPUTS) {
            let host = named.iter().find(|(n, _)| n == name).map(|(_, t)| *t).expect("Batch has every input");
            state[*slot] = Some(compiled.put_rows(client, *slot, host, loader.rows().start as i64)?);
        }
        let args: Vec<&DeviceArray> = state.iter().map(|a| a.as_ref().expect("every input is set")).collect();
        diagnostics::set_phase(Some(step_index), "running the train step (XLA's collectives run inside it)");
        let outputs = compiled.execute(&args)?;
        diagnostics::set_phase(Some(step_index), "reading the step's metrics");
        let scalar = |i: usize| -> Result<f64> { Ok(compiled.fetch(i, &outputs[i])?.to_f64()[0]) };
        let (loss, grad_norm, lr, weights) = (scalar(loss_i)?, scalar(norm_i)?, scalar(lr_i)?, scalar(weights_i)?);
        let now = Instant::now();
        let metrics = StepMetrics {
            step: step_index,
            loss,
            grad_norm,
            learning_rate: lr,
            total_weights: weights as u64,
            step_time_seconds: (now - last).as_secs_f64(),
            work,
        };
        last = now;
        if !loss.is_finite() {
            bail!("step {step_index}: the loss is {loss}; stopping (try a lower learning_rate)");
        }
        if logger {
            print_line(&bar, &metrics.log_line());
        }
        if let Some(w) = writer.as_mut() {
            w.write(&metrics).with_context(|| format!("writing metrics_file={}", c.metrics_file))?;
        }
        report.losses.push(loss);
        report.grad_norms.push(grad_norm);
        report.learning_rates.push(lr);
        report.step_times.push(metrics.step_time_seconds);
        // The step's new state becomes the next step's input.
        for (slot, array) in carried.iter().zip(outputs) {
            if let Some(slot) = slot {
                state[*slot] = Some(array);
            }
        }
        bar.inc(1);
        diagnostics::step_finished(step_index);
    }
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
    // `median_step_time` leaves out the first step (warm-up); a one-step run shows that step.
    let median = median_step_time(&report.step_times).or(report.step_times.first().copied());
    let mut line = format!("done: {} steps, loss {first:.3} -> {last:.3}", report.losses.len());
    if let Some(m) = median {
        line.push_str(&format!(", median step {:.4} s, {:.3} TFLOP/s/device", m, work.tflops / m));
    }
    if let Some(peak) = report.peak_memory_bytes {
        line.push_str(&format!(", peak device memory {:.1} MiB", peak as f64 / (1u64 << 20) as f64));
    }
    println!("{line}");
}
