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

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};

use super::executor::{Pipeline, Placement, StageExecutables, StepResult};
use super::programs::{PipelineStep, StagePrograms};
use super::relay::Relay;
use super::schedule::Schedule;
use crate::checkpoint::shards::{ArrayLayout, HostArray};
use crate::cluster::{diagnostics, Cluster};
use crate::config::{Config, Derived};
use crate::data::{Batch, EvalData};
use crate::lower::to_stablehlo;
use crate::model::Model;
use crate::pjrt::cross_host::CrossHost;
use crate::pjrt::Client;
use crate::runtime::{self, Compiled};
use crate::train::executor::{Initial, StepExecutor, StepPlan};
use crate::train::metrics::{median_step_time_after, EvalMetrics, PerDeviceWork, StepMetrics};
use crate::train::report::{PipelineReport, RunReport, StartupTimes};
use crate::train::restore;

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
    /// The stages this process runs.
    placement: Placement,
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
            placement: Placement::single(plan.stages),
        })
    }

    /// The plan for this process of `cluster`: with pipeline stages over the DCN
    /// (`dcn_pipeline_parallelism`, one group of stages a process) it runs its group, whose stage
    /// meshes must be on its own devices, and reaches the others' device to device through
    /// PJRT's cross-host transfers (GPUs), or through the relay (the CPU plugin).
    pub fn on_process(mut self, cluster: &Cluster, client: &Client, granules: &[Vec<i64>]) -> Result<PipelinedPlan> {
        let (p, processes) = (cluster.process_index(), cluster.process_count());
        if processes == 1 {
            return Ok(self);
        }
        // Arrays between processes go device to device where the plugin can (NCCL on GPUs); the
        // CPU plugin, which cannot, relays them through the coordination service.
        let platform = client.platform_name()?;
        let cross_host = match platform.as_str() {
            "cpu" => None,
            _ => Some(CrossHost::of(client).map_err(|why| {
                anyhow!(
                    "pipeline stages on {processes} processes of {platform} hand their activations over with PJRT's \
                     cross-host transfers, which this plugin cannot: {why}"
                )
            })?),
        };
        let per_process = self.step.layout.stages / processes;
        let local = p * per_process..(p + 1) * per_process;
        for s in local.clone() {
            let ids = self.step.stage_meshes[s].device_ids();
            if per_process == 0 || ids.iter().any(|id| !granules[p].contains(id)) {
                bail!(
                    "{} pipeline stages on {processes} processes: a stage spanning several processes is not supported \
                     yet; set dcn_pipeline_parallelism to the number of processes and the other dcn_* axes to 1",
                    self.step.layout.stages
                );
            }
        }
        println!("pipeline: process {p} of {processes} runs stages {}..={}", local.start, local.end - 1);
        let relay = cluster.client().map(|c| Relay::new(c.clone()));
        if relay.is_none() {
            bail!("process {p} of {processes} has no coordination client to reach the other processes' stages");
        }
        self.placement = Placement { local, relay, cross_host };
        Ok(self)
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
        let PipelinedPlan { step, schedule, passes, global_batch, report, placement } = self;
        let t = Instant::now();
        let programs: Vec<StagePrograms> =
            placement.local.clone().map(|s| step.stage_programs(s)).collect::<Result<_>>()?;
        startup.trace = t.elapsed().as_secs_f64();

        let t = Instant::now();
        diagnostics::set_phase(None, "compiling the pipeline stages");
        let executables = match c.compiled_trainstep_file.as_str() {
            "" => {
                let (executables, lowering) = compile_stages(client, &step, placement.local.start, &programs)?;
                startup.lower = lowering;
                executables
            }
            path if placement.relay.is_none() => {
                super::aot::load(c, client, &step, &schedule, &programs, granules, Path::new(path))?
            }
            _ => bail!("compiled_trainstep_file with pipeline stages on several processes is not supported yet"),
        };
        startup.compile = t.elapsed().as_secs_f64() - startup.lower;
        let pipeline = Pipeline::new(client, step, schedule, executables, passes, placement)?;
        Ok(PipelinedStep { pipeline, global_batch, report, last_done: None, eval_data: None })
    }
}

/// Lowers and compiles the programs of the stages from `first` on; returns them with the seconds
/// spent lowering.
fn compile_stages(
    client: &Client,
    step: &PipelineStep,
    first: usize,
    programs: &[StagePrograms],
) -> Result<(Vec<StageExecutables>, f64)> {
    let mut lowering = 0.0;
    // Stages between the first and the last run the same programs on other devices: each
    // distinct program is compiled once (or loaded from the compilation cache) and its bytes
    // loaded onto each stage's devices.
    let mut compiled: HashMap<String, Vec<u8>> = HashMap::new();
    let mut executables = Vec::new();
    for (stage, stage_programs) in (first..).zip(programs) {
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

impl StepExecutor for PipelinedStep {
    /// The whole global batch: the pipeline splits it into microbatches.
    type Fed = Batch;
    type InFlight = Ran;
    const RUNS_AHEAD: bool = false;

    fn model(&self) -> &Model {
        &self.pipeline.step.model
    }

    /// The init program's state, its parameters split over the stages; or the given parameters
    /// or state (the blocks of the model's full layout this process's stages hold), split by the
    /// layout.
    fn initialize(&mut self, initial: Initial) -> Result<()> {
        match initial {
            Initial::Fresh => self.pipeline.initialize(None),
            Initial::Parameters(arrays) => self.pipeline.initialize(Some(&arrays)),
            Initial::State(arrays) => self.pipeline.restore(&arrays),
        }
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

    /// The blocks of the full layout each stage holds, on the process that runs it.
    fn state_layouts(&self) -> Result<Vec<ArrayLayout>> {
        self.pipeline.state_layouts(&self.state_specs())
    }

    fn state_blocks(&mut self) -> Result<Vec<HostArray>> {
        self.pipeline.state_blocks(&self.state_specs())
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
