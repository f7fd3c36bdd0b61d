//! The pipelined step executor of `maxrs train`'s loop (`train::run`): the stage programs
//! traced, compiled (or loaded from `compiled_trainstep_file`) and initialized, each step run
//! through the [`Pipeline`], and the summary line that adds the measured bubble and the host's
//! scheduling time per microbatch.
//!
//! A pipelined step has run when `dispatch` returns (the stages' threads join), so the loop
//! records it before reading the next batch. Its state lives on the stages; checkpoints copy it
//! off in the model's full layout (`pipeline::state`); an eval runs the stages' forward tasks
//! over the eval batches (`pipeline::eval`). The loop's profiler brackets the steps as in an
//! unpipelined run: the plugin's profiler traces every device, so every stage's programs.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::path::Path;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};

use super::executor::{Pipeline, StageExecutables, StepResult};
use super::programs::{PipelineStep, StagePrograms};
use super::schedule::Schedule;
use crate::checkpoint::shards::{ArrayLayout, HostArray};
use crate::cluster::diagnostics;
use crate::config::{Config, Derived};
use crate::data::{Batch, EvalData};
use crate::host::HostTensor;
use crate::lower::to_stablehlo;
use crate::model::Model;
use crate::pjrt::Client;
use crate::runtime::{self, Compiled};
use crate::tensor::Tree;
use crate::train::executor::{Initial, StepExecutor, StepPlan};
use crate::train::metrics::{median_step_time_after, EvalMetrics, PerDeviceWork, StepMetrics};
use crate::train::report::{PipelineReport, RunReport, StartupTimes};
use crate::train::restore;
use crate::train_state::Group;

/// The pipelined step of `c` on the devices of `granules`, compiled (or loaded from
/// `compiled_trainstep_file`) and initialized (from `load_parameters_path`, else the init
/// program); the start-up times go to `startup`.
pub fn build(
    c: &Config,
    client: &Client,
    derived: &Derived,
    granules: &[Vec<i64>],
    startup: &mut StartupTimes,
) -> Result<Pipeline> {
    let mut executor = PipelinedPlan::new(c, derived, granules)?.compile(c, client, granules, startup)?;
    let t = Instant::now();
    diagnostics::set_phase(None, "initializing the state");
    let layouts = executor.state_layouts()?;
    let restoring = restore::Restoring { process: 0, processes: 1, layouts: &layouts };
    let start = restore::initial_state(c, &executor.state_specs(), &restoring, executor.model(), None)?;
    executor.initialize(start.initial)?;
    startup.init = t.elapsed().as_secs_f64();
    Ok(executor.pipeline)
}

/// The pipelined step of a run: its stage programs' plan and schedule, not yet traced.
pub(in crate::train) struct PipelinedPlan {
    step: PipelineStep,
    schedule: Schedule,
    /// Accumulation passes per step (`gradient_accumulation_steps`).
    passes: usize,
    global_batch: usize,
    /// The report's schedule and theoretical bubble.
    report: PipelineReport,
}

impl PipelinedPlan {
    pub fn new(c: &Config, derived: &Derived, granules: &[Vec<i64>]) -> Result<PipelinedPlan> {
        let plan = derived.pipeline.as_ref().ok_or_else(|| anyhow!("the config has no pipeline"))?;
        let mesh = derived.mesh.step_mesh(granules)?.ok_or_else(|| anyhow!("a pipeline needs a mesh"))?;
        let step = PipelineStep::new(c, derived, mesh)?;
        let schedule = Schedule::new(plan);
        schedule.simulate(|_, _| 1.0).map_err(|e| anyhow!("pipeline_schedule={}: {e}", plan.schedule))?;
        let report = PipelineReport {
            schedule: plan.schedule_name().to_string(),
            theoretical_bubble: plan.theoretical_bubble(),
            ..PipelineReport::default()
        };
        Ok(PipelinedPlan {
            step,
            schedule,
            passes: derived.gradient_accumulation_steps,
            global_batch: derived.global_batch_size,
            report,
        })
    }
}

impl StepPlan for PipelinedPlan {
    type Executor = PipelinedStep;

    fn model(&self) -> &Model {
        &self.step.model
    }

    fn compile(
        self,
        c: &Config,
        client: &Client,
        granules: &[Vec<i64>],
        startup: &mut StartupTimes,
    ) -> Result<PipelinedStep> {
        let PipelinedPlan { step, schedule, passes, global_batch, report } = self;
        let t = Instant::now();
        let programs: Vec<StagePrograms> =
            (0..step.layout.stages).map(|s| step.stage_programs(s)).collect::<Result<_>>()?;
        startup.trace = t.elapsed().as_secs_f64();

        let t = Instant::now();
        diagnostics::set_phase(None, "compiling the pipeline stages");
        let executables = match c.compiled_trainstep_file.as_str() {
            "" => {
                let (executables, lowering) = compile_stages(client, &step, &programs)?;
                startup.lower = lowering;
                executables
            }
            path => super::aot::load(c, client, &step, &schedule, &programs, granules, Path::new(path))?,
        };
        startup.compile = t.elapsed().as_secs_f64() - startup.lower;
        let pipeline = Pipeline::new(client, step, schedule, executables, passes)?;
        Ok(PipelinedStep { pipeline, global_batch, report, last_done: None, eval_data: None })
    }
}

/// Lowers and compiles every stage's programs; returns them with the seconds spent lowering.
fn compile_stages(
    client: &Client,
    step: &PipelineStep,
    programs: &[StagePrograms],
) -> Result<(Vec<StageExecutables>, f64)> {
    let mut lowering = 0.0;
    // Stages between the first and the last run the same programs on other devices: each
    // distinct program is compiled once (or loaded from the compilation cache) and its bytes
    // loaded onto each stage's devices.
    let mut compiled: HashMap<String, Vec<u8>> = HashMap::new();
    let mut executables = Vec::new();
    for (stage, stage_programs) in programs.iter().enumerate() {
        executables.push(StageExecutables::build(stage, &step.layout, stage_programs, |name, program| {
            let t = Instant::now();
            let mlir = to_stablehlo(program);
            lowering += t.elapsed().as_secs_f64();
            let options = runtime::compile_options(program);
            let bytes = match compiled.get(&mlir) {
                Some(bytes) => bytes,
                None => {
                    let bytes = client
                        .compile_serialized(&mlir, &options)
                        .with_context(|| format!("compiling the pipeline's {name}"))?;
                    compiled.entry(mlir).or_insert(bytes)
                }
            };
            let executable = client.deserialize_with_options(bytes, &options)?;
            Compiled::new(program, executable)
        })?);
    }
    Ok((executables, lowering))
}

/// The compiled pipeline, its state on the stages, and the report of its bubbles.
pub(in crate::train) struct PipelinedStep {
    pipeline: Pipeline,
    global_batch: usize,
    report: PipelineReport,
    /// When the last step ended (none before the first, or after a pause).
    last_done: Option<Instant>,
    /// The eval files, once `open_eval` compiled the eval.
    eval_data: Option<EvalData>,
}

/// A step that ran, with when it started and ended.
pub(in crate::train) struct Ran {
    step: u64,
    result: StepResult,
    started: Instant,
    done: Instant,
}

/// The arrays a run starts from, each whole: a pipeline runs in one process, which holds every
/// block.
fn whole<C: FromIterator<(String, HostTensor)>>(arrays: BTreeMap<String, HostArray>) -> Result<C> {
    arrays.into_iter().map(|(name, a)| Ok((name, a.assemble()?))).collect()
}

impl StepExecutor for PipelinedStep {
    /// The whole global batch: the pipeline splits it into microbatches.
    type Fed = Batch;
    type InFlight = Ran;
    const RUNS_AHEAD: bool = false;

    fn model(&self) -> &Model {
        &self.pipeline.step.model
    }

    /// The init program's state, its parameters split over the stages; or the given parameters
    /// (the model's full layout), split by the layout.
    fn initialize(&mut self, initial: Initial) -> Result<()> {
        let parameters = match initial {
            Initial::Fresh => None,
            Initial::Parameters(arrays) => Some(Group::Params.subtree(&whole::<Tree<_>>(arrays)?)),
            Initial::State(arrays) => return self.pipeline.restore(&whole(arrays)?),
        };
        self.pipeline.initialize(parameters.as_ref())
    }

    /// All of it: a pipeline runs in one process.
    fn local_rows(&self) -> Range<usize> {
        0..self.global_batch
    }

    fn feed(&self, batch: Batch) -> Result<Batch> {
        Ok(batch)
    }

    fn dispatch(&mut self, step: u64, batch: Batch) -> Result<Ran> {
        diagnostics::step_started(step);
        diagnostics::set_phase(Some(step), "running the pipeline stages");
        let started = Instant::now();
        let result = self.pipeline.step(&batch).with_context(|| format!("step {step}"))?;
        Ok(Ran { step, result, started, done: Instant::now() })
    }

    /// The step took from the previous step's end (the first: its start) to its own.
    fn finish(&mut self, ran: Ran, work: PerDeviceWork) -> Result<StepMetrics> {
        let Ran { step, result, started, done } = ran;
        let step_time_seconds = (done - self.last_done.unwrap_or(started)).as_secs_f64();
        self.last_done = Some(done);
        self.report.bubbles.push(result.timeline.bubble());
        self.report.host_overhead_per_microbatch.push(result.host_overhead_per_microbatch);
        diagnostics::step_finished(step);
        Ok(StepMetrics {
            step,
            loss: result.loss,
            grad_norm: result.grad_norm,
            learning_rate: result.learning_rate,
            total_weights: result.total_weights as u64,
            moe_lb_loss: result.aux_losses.get("moe_lb_loss").copied(),
            // Validation refuses use_dpo with pipeline stages.
            preference: [None; 7],
            step_time_seconds,
            work,
        })
    }

    fn pause_timing(&mut self) {
        self.last_done = None;
    }

    /// Not measured: the host never runs ahead of the stages; their idle share within a step is
    /// the bubble.
    fn device_idle_fraction(&self) -> Option<f64> {
        None
    }

    /// The eval batches split into the train step's microbatches: config validation checks that
    /// the eval batch is a whole number of passes and that its packing is the training data's.
    fn open_eval(&mut self, data: EvalData, _: usize) -> Result<()> {
        if data.packed() != self.pipeline.step.packed {
            bail!(
                "eval with pipeline stages needs eval batches packed as the training batches are (packing with \
                 dataset_type=hf)"
            );
        }
        self.pipeline.open_eval()?;
        self.eval_data = Some(data);
        Ok(())
    }

    /// As the unpipelined eval (`train::eval`): the sums over at most `eval_steps` batches.
    fn eval(&mut self, after_step: u64, eval_steps: i64) -> Result<EvalMetrics> {
        let data = self.eval_data.as_ref().ok_or_else(|| anyhow!("the pipeline's eval is not open"))?;
        let mut batches = data.batches()?;
        let mut metrics = EvalMetrics { step: after_step, ..EvalMetrics::default() };
        while eval_steps <= 0 || (metrics.eval_steps as i64) < eval_steps {
            let Some(batch) = batches.next_batch()? else { break };
            let sums = self.pipeline.eval(&batch).with_context(|| format!("eval after step {after_step}"))?;
            metrics.total_loss += sums.total_loss;
            metrics.total_weights += sums.total_weights;
            metrics.z_loss_sum += sums.z_loss;
            if let Some(lb) = sums.aux_losses.get("moe_lb_loss") {
                *metrics.moe_lb_loss_sum.get_or_insert(0.0) += lb;
            }
            metrics.eval_steps += 1;
        }
        if metrics.eval_steps == 0 {
            bail!("eval after step {after_step}: hf_eval_files gave no batch (no decodable documents)");
        }
        Ok(metrics)
    }

    /// Whole arrays on this process: a pipeline runs in one process.
    fn state_layouts(&self) -> Result<Vec<ArrayLayout>> {
        Ok(self.state_specs().iter().map(|e| ArrayLayout::whole(&e.name, e.ty, &e.dims)).collect())
    }

    fn state_blocks(&mut self) -> Result<Vec<HostArray>> {
        Ok(self.pipeline.state()?.into_iter().map(|(name, t)| HostArray::whole(&name, t)).collect())
    }

    fn summarize(self, report: &mut RunReport, skipped_steps: usize, logger: bool) {
        if logger {
            print_pipeline_summary(&self.report, skipped_steps);
        }
        report.pipeline = Some(self.report);
    }
}

/// The bubble line: the median over the steps after the skipped ones, as the step time's
/// median is taken.
fn print_pipeline_summary(p: &PipelineReport, skipped_steps: usize) {
    let bubble = median_step_time_after(&p.bubbles, skipped_steps).or(p.bubbles.last().copied());
    let overhead = median_step_time_after(&p.host_overhead_per_microbatch, skipped_steps)
        .or(p.host_overhead_per_microbatch.last().copied());
    let (Some(bubble), Some(overhead)) = (bubble, overhead) else { return };
    println!(
        "pipeline: {} bubble {:.1}% measured (stages' idle time, median over steps), {:.1}% in theory; host \
         scheduling {:.3} ms per microbatch",
        p.schedule,
        100.0 * bubble,
        100.0 * p.theoretical_bubble,
        1e3 * overhead
    );
}
