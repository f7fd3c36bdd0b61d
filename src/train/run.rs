//! `maxrs train`'s job, start to end: plugin and devices -> validated config and mesh -> traced,
//! lowered and compiled train step -> state initialized on the devices (or loaded from
//! `load_parameters_path`) -> the step loop (data in, metrics out, state stays on the devices)
//! -> a summary. [`RunReport`] returns what happened, for tests and benchmarks.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

use crate::aot::artifact;
use crate::config::{self, Config, Derived};
use crate::ir::Program;
use crate::lower::to_stablehlo;
use crate::pjrt::{self, Client, Value};
use crate::runtime::{self, Compiled, DeviceArray};

use super::data::{BatchLoader, DataSource};
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
}

/// The devices of a run: the plugin's client.
pub fn client_for(c: &Config) -> Result<Client> {
    pjrt::xla_flags::apply_flags_file(&c.xla_flags_file)?;
    if c.plugin == "cpu" {
        let n = usize::try_from(c.cpu_device_count)
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| anyhow!("cpu_device_count={}: must be a positive number of devices", c.cpu_device_count))?;
        return pjrt::cpu_client(n);
    }
    let (_, plugin) = pjrt::load_plugin(Some(&c.plugin))?;
    Ok(Client::create(&plugin, &[] as &[(String, Value)], None)?)
}

/// Trains as configured on `client`'s devices.
pub fn train(c: &Config, client: &Client) -> Result<RunReport> {
    let mut report = RunReport::default();
    let devices = client.addressable_devices()?;
    let derived = config::validate(c, devices.len(), 1)?;
    // One process: all devices form one granule, in id order.
    let ids: Vec<i64> = devices.iter().map(|d| d.id as i64).collect();
    let step =
        TrainStep::new(c, &derived, step_mesh(&derived, &[ids]).map_err(|e| anyhow!(e))?).map_err(|e| anyhow!(e))?;
    derived.print_summary(step.model.num_params());

    let t = Instant::now();
    let program = step.train_step().map_err(|e| anyhow!("tracing the train step: {e}"))?;
    report.startup.trace = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mlir = to_stablehlo(&program);
    report.startup.lower = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let compiled = match c.compiled_trainstep_file.as_str() {
        "" => runtime::compile_lowered(client, &program, &mlir).context("compiling the train step")?,
        path => load_step(c, client, &step, &program, &mlir, Path::new(path))?,
    };
    report.startup.compile = t.elapsed().as_secs_f64();

    let t = Instant::now();
    let mut state = initial_state(c, client, &step, &compiled)?;
    report.startup.init = t.elapsed().as_secs_f64();
    println!(
        "start-up: trace {:.3} s, lower {:.3} s, compile {:.3} s, init {:.3} s",
        report.startup.trace, report.startup.lower, report.startup.compile, report.startup.init
    );

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
    let mut loader = BatchLoader::new(source, derived.global_batch_size, 0, 1)?;
    let mut writer = match c.metrics_file.as_str() {
        "" => None,
        path => Some(
            MetricsWriter::open(Path::new(path), 0, &c.run_name)
                .with_context(|| format!("metrics_file={path}: cannot open it for writing"))?,
        ),
    };
    let batch_inputs: Vec<usize> =
        BATCH_INPUTS.iter().map(|n| compiled.input_index(&format!("batch.{n}"))).collect::<Result<_>>()?;
    let metric = |name: &str| compiled.output_index(&format!("metrics.{name}"));
    let (loss_i, norm_i, lr_i, weights_i) =
        (metric("loss")?, metric("grad_norm")?, metric("learning_rate")?, metric("total_weights")?);
    let lb_i = metric("moe_lb_loss").ok();

    // For each output, the input slot it feeds next step (state outputs share their input's name).
    let carried: Vec<Option<usize>> =
        compiled.program.outputs.iter().map(|o| compiled.input_index(&o.name).ok()).collect();

    let bar = progress_bar(derived.steps as u64);
    let mut last = Instant::now();
    for step_index in 0..derived.steps as u64 {
        let batch = loader.batch(step_index)?;
        let named = batch.named();
        for (slot, name) in batch_inputs.iter().zip(BATCH_INPUTS) {
            let host = named.iter().find(|(n, _)| n == name).map(|(_, t)| *t).expect("Batch has every input");
            state[*slot] = Some(compiled.put(client, *slot, host)?);
        }
        let args: Vec<&DeviceArray> = state.iter().map(|a| a.as_ref().expect("every input is set")).collect();
        let outputs = compiled.execute(&args)?;
        let scalar = |i: usize| -> Result<f64> { Ok(compiled.fetch(i, &outputs[i])?.to_f64()[0]) };
        let (loss, grad_norm, lr, weights) = (scalar(loss_i)?, scalar(norm_i)?, scalar(lr_i)?, scalar(weights_i)?);
        let now = Instant::now();
        let metrics = StepMetrics {
            step: step_index,
            loss,
            grad_norm,
            learning_rate: lr,
            total_weights: weights as u64,
            moe_lb_loss: lb_i.map(scalar).transpose()?,
            step_time_seconds: (now - last).as_secs_f64(),
            work,
        };
        last = now;
        if !loss.is_finite() {
            bail!("step {step_index}: the loss is {loss}; stopping (try a lower learning_rate)");
        }
        print_line(&bar, &metrics.log_line());
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
    }
    bar.finish_and_clear();
    report.peak_memory_bytes = peak_memory(&devices);
    print_summary(&report, &work);
    Ok(report)
}

/// Loads the train step `maxrs train-compile` saved, after checking that it was compiled for
/// this program, these devices and this plugin build (see `aot::artifact`).
fn load_step(
    c: &Config,
    client: &Client,
    step: &TrainStep,
    program: &Program,
    mlir: &str,
    path: &Path,
) -> Result<Compiled> {
    let devices = client.addressable_devices()?;
    let current = artifact::header(
        c,
        &step.model,
        program,
        mlir,
        artifact::Platform {
            devices: artifact::describe_devices(1, devices.len(), &devices[0].kind),
            num_devices: devices.len(),
            plugin: artifact::plugin_identity(client.plugin()),
            platform_version: client.platform_version()?,
        },
    );
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
