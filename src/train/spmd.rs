//! The SPMD step executor: the whole train step (`step::TrainStep`) as one executable over every
//! device, compiled here or loaded from `compiled_trainstep_file`. The state stays on the
//! devices: each step's state outputs replace (donate) its inputs, and it is copied off only for
//! a checkpoint or read in place by the eval step.
//!
//! Dispatch returns while the devices run the step, so the loop stays a step ahead: step k + 1
//! is dispatched before step k's metrics are read, and its batch is put on the devices while
//! step k runs.

use std::ops::Range;
use std::path::Path;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};

use crate::checkpoint::shards::{ArrayLayout, HostArray};
use crate::cluster::diagnostics;
use crate::config::{Config, Derived};
use crate::data::{Batch, EvalData};
use crate::ir::Program;
use crate::lower::to_stablehlo;
use crate::model::Model;
use crate::pjrt::{gpu_memory, Client, ReadyTime};
use crate::runtime::artifact;
use crate::runtime::{self, Compiled, DeviceArray};

use super::dpo::METRICS;
use super::eval::Evaluator;
use super::executor::{Initial, StepExecutor, StepPlan};
use super::metrics::{EvalMetrics, PerDeviceWork, StepMetrics};
use super::report::{RunReport, StartupTimes};
use super::step::TrainStep;
use super::timing::DeviceTiming;
use crate::checkpoint::Expected;

/// The SPMD step of a run, traced on the run's mesh.
pub(super) struct SpmdPlan {
    step: TrainStep,
}

impl SpmdPlan {
    pub fn new(c: &Config, derived: &Derived, granules: &[Vec<i64>]) -> Result<SpmdPlan> {
        let mesh = derived.mesh.step_mesh(granules)?;
        Ok(SpmdPlan { step: TrainStep::new(c, derived, mesh)? })
    }
}

impl StepPlan for SpmdPlan {
    type Executor = SpmdStep;

    fn model(&self) -> &Model {
        &self.step.model
    }

    fn compile(
        self,
        c: &Config,
        client: &Client,
        granules: &[Vec<i64>],
        startup: &mut StartupTimes,
    ) -> Result<SpmdStep> {
        let step = self.step;
        let t = Instant::now();
        let program = step.train_step().map_err(|e| anyhow!("tracing the train step: {e}"))?;
        startup.trace = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let mlir = to_stablehlo(&program);
        startup.lower = t.elapsed().as_secs_f64();
        let t = Instant::now();
        diagnostics::set_phase(None, "compiling the train step");
        let compiled = match c.compiled_trainstep_file.as_str() {
            "" => runtime::compile_lowered(client, &program, &mlir).context("compiling the train step")?,
            path => load_step(c, client, &step, &program, &mlir, granules, Path::new(path))?,
        };
        startup.compile = t.elapsed().as_secs_f64();
        let stats = compiled.executable.executable().compiled_memory_stats()?;
        let short = match gpu_memory::step_shortfall(client, &stats)? {
            Some(short) => Some(short),
            None => super::host_memory::cpu_step_shortfall(client, &stats)?,
        };
        if let Some(short) = short {
            bail!("out of memory: the train step {short}. To fit, {}.", crate::config::MEMORY_REMEDIES);
        }

        let slots = Slots::of(&compiled, step.batch_names().0)?;
        let rows = compiled.local_rows(slots.batch[0])?;
        let state_slots = step
            .state()
            .names()
            .into_iter()
            .map(|name| Ok((name.clone(), compiled.input_index(&name)?, compiled.output_index(&name)?)))
            .collect::<Result<_>>()?;
        Ok(SpmdStep {
            client: client.clone(),
            state: compiled.program.inputs.iter().map(|_| None).collect(),
            step,
            compiled,
            slots,
            rows,
            state_slots,
            granules: granules.to_vec(),
            timing: DeviceTiming::new(c.skip_first_n_steps_for_profiler.max(0) as usize),
            eval: None,
        })
    }
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
            // Not compared: the plugin identity pins the build (`artifact::plugin` chose it).
            build: None,
        },
    );
    current.device_ids_per_host = granules.to_vec();
    let bytes = artifact::load_matching(path, &current)?;
    let executable = client.deserialize(&bytes).with_context(|| format!("loading {}", path.display()))?;
    println!("loaded the compiled train step from {} (no compile)", path.display());
    Compiled::new(program, executable)
}

/// The compiled SPMD step and its state on the devices.
pub(super) struct SpmdStep {
    client: Client,
    step: TrainStep,
    compiled: Compiled,
    /// The step's inputs as device arrays (batch slots hold the last batch put).
    state: Vec<Option<DeviceArray>>,
    slots: Slots,
    /// The rows of the global batch this process's devices hold.
    rows: Range<usize>,
    /// Where each state array lives: its name, its input slot and the output that carries it.
    state_slots: Vec<(String, usize, usize)>,
    /// The device ids of each process.
    granules: Vec<Vec<i64>>,
    timing: DeviceTiming,
    eval: Option<Evaluator>,
}

/// Where the loop's inputs and outputs are in the compiled step.
struct Slots {
    /// The batch inputs (`TrainStep::batch_names`) and their slots.
    batch_names: Vec<&'static str>,
    batch: Vec<usize>,
    /// `loss`, `grad_norm`, `learning_rate`, `total_weights`, and `moe_lb_loss` for models with
    /// experts.
    metrics: Vec<usize>,
    /// The preference metrics (`dpo::METRICS`) the step outputs.
    preference: [Option<usize>; 7],
    /// For each output, the input slot it feeds next step (state outputs share their input's
    /// name).
    carried: Vec<Option<usize>>,
}

impl Slots {
    fn of(compiled: &Compiled, batch_names: Vec<&'static str>) -> Result<Slots> {
        let batch = batch_names.iter().map(|n| compiled.input_index(&format!("batch.{n}"))).collect::<Result<_>>()?;
        let metric = |name: &str| compiled.output_index(&format!("metrics.{name}"));
        Ok(Slots {
            batch_names,
            batch,
            metrics: [metric("loss")?, metric("grad_norm")?, metric("learning_rate")?, metric("total_weights")?]
                .into_iter()
                .chain(metric("moe_lb_loss").ok())
                .collect(),
            preference: METRICS.map(|(name, _)| metric(name).ok()),
            carried: compiled.program.outputs.iter().map(|o| compiled.find_input(&o.name)).collect(),
        })
    }
}

/// A dispatched step whose metrics have not been read.
pub(super) struct InFlight {
    step: u64,
    /// The metric outputs, in `Slots::metrics` order.
    metrics: Vec<DeviceArray>,
    /// The preference metrics' outputs, where the step has them.
    preference: Vec<Option<DeviceArray>>,
    /// When the step's loss became ready, where the plugin reports it.
    done: Option<ReadyTime>,
    dispatched: Instant,
}

impl StepExecutor for SpmdStep {
    /// The batch's arrays on the devices, with their input slots.
    type Fed = Vec<(usize, DeviceArray)>;
    type InFlight = InFlight;
    const RUNS_AHEAD: bool = true;

    fn model(&self) -> &Model {
        &self.step.model
    }

    /// Runs the init program (without the parameters when they come from elsewhere), then puts
    /// the given arrays onto this run's mesh with its shardings, whatever mesh wrote them.
    fn initialize(&mut self, initial: Initial) -> Result<()> {
        let t = std::time::Instant::now();
        let init = self.step.init(&initial.parameters()).map_err(|e| anyhow!("tracing the initializer: {e}"))?;
        let traced = t.elapsed().as_secs_f64();
        let init = runtime::compile(&self.client, &init)?;
        let compiled = t.elapsed().as_secs_f64();
        let outputs = init.execute(&[])?;
        tracing::debug!(
            "init program: trace {traced:.3} s, compile {:.3} s, run {:.3} s",
            compiled - traced,
            t.elapsed().as_secs_f64() - compiled
        );
        for (spec, array) in init.program.outputs.iter().zip(outputs) {
            self.state[self.compiled.input_index(&spec.name)?] = Some(array);
        }
        match initial {
            Initial::Fresh => {}
            Initial::Parameters(arrays) => {
                for (name, array) in &arrays {
                    let slot = self.compiled.input_index(name)?;
                    let put =
                        |slot| self.compiled.put_blocks(&self.client, slot, |bounds| array.block(&bounds.to_vec()));
                    self.state[slot] = Some(put(slot)?);
                    // DPO's reference model starts as the given weights too.
                    let copy = name.strip_prefix("params.").map(|key| format!("reference.{key}"));
                    if let Some(slot) = copy.and_then(|copy| self.compiled.find_input(&copy)) {
                        self.state[slot] = Some(put(slot)?);
                    }
                }
            }
            Initial::State(arrays) => {
                for (name, array) in &arrays {
                    let slot = self.compiled.input_index(name)?;
                    let put = self.compiled.put_blocks(&self.client, slot, |bounds| array.block(&bounds.to_vec()))?;
                    self.state[slot] = Some(put);
                }
            }
        }
        Ok(())
    }

    /// The step's state: the model's, and DPO's reference copy.
    fn state_specs(&self) -> Vec<Expected> {
        Expected::of_state(&self.step.state())
    }

    fn local_rows(&self) -> Range<usize> {
        self.rows.clone()
    }

    /// Copies this process's rows of the batch into the step's batch inputs.
    fn feed(&self, batch: Batch) -> Result<Self::Fed> {
        let first_row = self.rows.start as i64;
        self.slots
            .batch
            .iter()
            .zip(&self.slots.batch_names)
            .map(|(&slot, name)| {
                let host = batch.get(name).expect("a Batch has every input");
                Ok((slot, self.compiled.put_rows(&self.client, slot, host, first_row)?))
            })
            .collect()
    }

    /// The new state replaces the old in `state` (the devices run steps in order); the metrics
    /// stay on the devices until `finish`.
    fn dispatch(&mut self, step: u64, batch: Self::Fed) -> Result<InFlight> {
        for (slot, array) in batch {
            self.state[slot] = Some(array);
        }
        let args: Vec<&DeviceArray> = self.state.iter().map(|a| a.as_ref().expect("every input is set")).collect();
        diagnostics::set_phase(Some(step), "running the train step (XLA's collectives run inside it)");
        let dispatched = Instant::now();
        let mut outputs: Vec<Option<DeviceArray>> = self.compiled.execute(&args)?.into_iter().map(Some).collect();
        for (output, slot) in outputs.iter_mut().zip(&self.slots.carried) {
            if let Some(slot) = slot {
                self.state[*slot] = output.take();
            }
        }
        let metrics: Vec<DeviceArray> =
            self.slots.metrics.iter().map(|&i| outputs[i].take().expect("metrics are not carried")).collect();
        let preference = self.slots.preference.iter().map(|i| i.and_then(|i| outputs[i].take())).collect();
        let done = metrics[0].first().and_then(|b| b.ready_time().ok());
        Ok(InFlight { step, metrics, preference, done, dispatched })
    }

    fn finish(&mut self, flight: InFlight, work: PerDeviceWork) -> Result<StepMetrics> {
        diagnostics::set_phase(Some(flight.step), "reading the step's metrics");
        let values = self
            .slots
            .metrics
            .iter()
            .zip(&flight.metrics)
            .map(|(&index, array)| Ok(self.compiled.fetch(index, array)?.to_f64()[0]))
            .collect::<Result<Vec<f64>>>()?;
        let (loss, grad_norm, learning_rate, weights) = (values[0], values[1], values[2], values[3]);
        let mut preference = [None; 7];
        for ((value, slot), array) in preference.iter_mut().zip(&self.slots.preference).zip(&flight.preference) {
            if let (Some(index), Some(array)) = (slot, array) {
                *value = Some(self.compiled.fetch(*index, array)?.to_f64()[0]);
            }
        }
        let done = flight.done.as_ref().and_then(ReadyTime::get).unwrap_or_else(Instant::now);
        let step_time_seconds = self.timing.completed(flight.dispatched, done);
        diagnostics::step_finished(flight.step);
        Ok(StepMetrics {
            step: flight.step,
            loss,
            grad_norm,
            learning_rate,
            total_weights: weights as u64,
            moe_lb_loss: values.get(4).copied(),
            preference,
            step_time_seconds,
            work,
        })
    }

    fn pause_timing(&mut self) {
        self.timing.pause();
    }

    fn device_idle_fraction(&self) -> Option<f64> {
        self.timing.idle_fraction()
    }

    fn open_eval(&mut self, data: EvalData, rows: usize) -> Result<()> {
        self.eval = Some(Evaluator::new(&self.client, &self.step, &self.compiled, data, rows)?);
        Ok(())
    }

    fn eval(&mut self, after_step: u64, eval_steps: i64) -> Result<EvalMetrics> {
        let eval = self.eval.as_ref().expect("the loop evaluates after open_eval");
        eval.run(&self.client, &self.state, after_step, eval_steps)
    }

    fn state_layouts(&self) -> Result<Vec<ArrayLayout>> {
        self.state_slots
            .iter()
            .map(|(name, input, _)| {
                let spec = &self.compiled.program.inputs[*input];
                Ok(ArrayLayout {
                    name: name.clone(),
                    ty: spec.ty.dtype,
                    dims: spec.ty.shape.to_vec(),
                    blocks: self.compiled.input_blocks(*input, &self.granules)?,
                })
            })
            .collect()
    }

    fn state_blocks(&mut self) -> Result<Vec<HostArray>> {
        self.state_slots
            .iter()
            .map(|(name, input, output)| {
                let array = self.state[*input].as_ref().expect("state slots are always set");
                let spec = &self.compiled.program.outputs[*output];
                Ok(HostArray {
                    name: name.clone(),
                    ty: spec.ty.dtype,
                    dims: spec.ty.shape.to_vec(),
                    blocks: self.compiled.fetch_blocks(*output, array)?,
                })
            })
            .collect()
    }

    fn summarize(self, _: &mut RunReport, _: usize, _: bool) {}
}
