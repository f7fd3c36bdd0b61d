//! `maxrs train` with pipeline parallelism: the stage programs traced, compiled (or loaded from
//! `compiled_trainstep_file`) and initialized, then the step loop with MaxText's log lines, and
//! a summary that adds the measured bubble and the host's scheduling time per microbatch.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use anyhow::{anyhow, Context, Result};

use super::executor::{Pipeline, StageExecutables};
use super::programs::{PipelineStep, StagePrograms};
use super::schedule::Schedule;
use crate::checkpoint::{self, Expected};
use crate::cluster::diagnostics;
use crate::config::{Config, Derived};
use crate::data::{self, ProcessShare};
use crate::lower::to_stablehlo;
use crate::output;
use crate::pjrt::Client;
use crate::runtime::{self, Compiled};
use crate::tensor::Tree;
use crate::train::metrics::{median_step_time_after, StepMetrics};
use crate::train::outputs::RunOutputs;
use crate::train::run::{self, RunReport, StartupTimes, StepRecorder};

/// The pipeline's part of a run's report.
#[derive(Clone, Debug, Default)]
pub struct PipelineReport {
    /// The schedule as it ran (`gpipe`, `1f1b`, `interleaved_1f1b`).
    pub schedule: String,
    /// `(stages - 1) / (repeats x microbatches + stages - 1)`.
    pub theoretical_bubble: f64,
    /// Per step: the stages' mean idle fraction between the first task's start and the last
    /// task's end.
    pub bubbles: Vec<f64>,
    /// Per step: host seconds per microbatch that were neither execution nor waiting.
    pub host_overhead_per_microbatch: Vec<f64>,
}

/// The pipelined step of `c` on the devices of `granules`, compiled (or loaded from
/// `compiled_trainstep_file`) and initialized; the start-up times go to `startup`.
pub fn build(
    c: &Config,
    client: &Client,
    derived: &Derived,
    granules: &[Vec<i64>],
    startup: &mut StartupTimes,
) -> Result<Pipeline> {
    let plan = derived.pipeline.as_ref().ok_or_else(|| anyhow!("the config has no pipeline"))?;
    let mesh =
        derived.mesh.step_mesh(granules).map_err(|e| anyhow!(e))?.ok_or_else(|| anyhow!("a pipeline needs a mesh"))?;
    let step = PipelineStep::new(c, derived, mesh)?;
    let schedule = Schedule::new(plan);
    schedule.simulate(|_, _| 1.0).map_err(|e| anyhow!("pipeline_schedule={}: {e}", plan.schedule))?;

    let t = Instant::now();
    let programs: Vec<StagePrograms> = (0..plan.stages).map(|s| step.stage_programs(s)).collect::<Result<_>>()?;
    startup.trace = t.elapsed().as_secs_f64();

    let t = Instant::now();
    diagnostics::set_phase(None, "compiling the pipeline stages");
    let executables = match c.compiled_trainstep_file.as_str() {
        "" => {
            let mut lowering = 0.0;
            // Stages between the first and the last run the same programs on other devices:
            // each distinct program is compiled once and loaded onto the others' devices.
            let mut compiled: HashMap<String, Vec<u8>> = HashMap::new();
            let mut executables = Vec::new();
            for (stage, stage_programs) in programs.iter().enumerate() {
                executables.push(StageExecutables::build(stage, &step.layout, stage_programs, |name, program| {
                    let t = Instant::now();
                    let mlir = to_stablehlo(program);
                    lowering += t.elapsed().as_secs_f64();
                    let executable = match compiled.get(&mlir) {
                        Some(bytes) => client.deserialize_with_options(bytes, &runtime::compile_options(program))?,
                        None => {
                            let executable = client
                                .compile(&mlir, &runtime::compile_options(program))
                                .with_context(|| format!("compiling the pipeline's {name}"))?;
                            compiled.insert(mlir, executable.executable().serialize()?);
                            executable
                        }
                    };
                    Compiled::new(program, executable)
                })?);
            }
            startup.lower = lowering;
            executables
        }
        path => super::aot::load(c, client, &step, &schedule, &programs, granules, Path::new(path))?,
    };
    startup.compile = t.elapsed().as_secs_f64() - startup.lower;

    let t = Instant::now();
    diagnostics::set_phase(None, "initializing the state");
    let mut pipeline = Pipeline::new(client, step, schedule, executables, derived.gradient_accumulation_steps)?;
    let parameters = match c.load_parameters_path.as_str() {
        "" => None,
        _ => {
            // The same loader as the unpipelined run's (a safetensors file or a checkpoint's
            // parameters, local or gs://), then split over the stages by `initialize`.
            let model = &pipeline.step.model;
            let dtype = runtime::element_type(model.config.weight_dtype);
            let expected: Vec<Expected> = model
                .param_defs()
                .into_iter()
                .map(|d| Expected { name: format!("params.{}", d.name), ty: dtype, dims: d.shape })
                .collect();
            let arrays = run::load_parameter_arrays(c, &expected, &checkpoint::manifest::model_keys(c, model))?;
            Some(arrays.into_iter().map(|(name, t)| (name["params.".len()..].to_string(), t)).collect::<Tree<_>>())
        }
    };
    pipeline.initialize(parameters.as_ref())?;
    startup.init = t.elapsed().as_secs_f64();
    Ok(pipeline)
}

/// Trains `c` with pipeline parallelism on `client`'s devices (one process).
pub fn train(c: &Config, client: &Client, derived: &Derived, granules: &[Vec<i64>]) -> Result<RunReport> {
    let plan = derived.pipeline.clone().ok_or_else(|| anyhow!("the config has no pipeline"))?;
    let mut report = RunReport::default();
    let model = crate::model::Model::from_config(c).map_err(|e| anyhow!(e))?;
    derived.print_summary(model.num_params());
    // Everything the run reads and writes is checked before the compile, as `run::train_in` does.
    output::check_paths(c, output::Command::Train)?;
    let mut data = data::open_train(c, derived.global_batch_size, ProcessShare::SINGLE, None)?;
    let mut pipeline = build(c, client, derived, granules, &mut report.startup)?;
    println!(
        "start-up: trace {:.3} s, lower {:.3} s, compile {:.3} s, init {:.3} s",
        report.startup.trace, report.startup.lower, report.startup.compile, report.startup.init
    );

    let devices = client.devices()?;
    let work = run::per_device_work(c, &model, derived, devices.first().map(|d| d.kind.as_str()).unwrap_or(""));
    report.tflops_per_device = work.tflops;
    let mut outputs = RunOutputs::open(c, 0)?;
    let mut pipeline_report = PipelineReport {
        schedule: plan.schedule_name().to_string(),
        theoretical_bubble: plan.theoretical_bubble(),
        ..PipelineReport::default()
    };
    let skip = c.skip_first_n_steps_for_profiler.max(0) as usize;

    let steps = derived.steps as u64;
    let bar = run::progress_bar(steps);
    let mut recorder = StepRecorder::new(c, &bar, true);
    let mut last = Instant::now();
    for step_index in 0..steps {
        diagnostics::step_started(step_index);
        diagnostics::set_phase(Some(step_index), "reading the batch");
        let batch = data.next_batch()?.ok_or_else(|| anyhow!("step {step_index}: the training data ran out"))?;
        diagnostics::set_phase(Some(step_index), "running the pipeline stages");
        let result = pipeline.step(&batch).with_context(|| format!("step {step_index}"))?;
        let now = Instant::now();
        let metrics = StepMetrics {
            step: step_index,
            loss: result.loss,
            grad_norm: result.grad_norm,
            learning_rate: result.learning_rate,
            total_weights: result.total_weights as u64,
            moe_lb_loss: result.aux_losses.get("moe_lb_loss").copied(),
            step_time_seconds: (now - last).as_secs_f64(),
            work,
        };
        last = now;
        recorder.record(metrics, &mut report, &mut outputs)?;
        pipeline_report.bubbles.push(result.timeline.bubble());
        pipeline_report.host_overhead_per_microbatch.push(result.host_overhead_per_microbatch);
        diagnostics::step_finished(step_index);
    }
    bar.finish_and_clear();
    if let Some(step_index) = recorder.last_step {
        outputs.flush(step_index)?;
    }
    diagnostics::set_phase(None, "finished training");
    report.perf_skipped_steps = skip;
    report.peak_memory_bytes = run::peak_memory(&client.addressable_devices()?);
    run::print_summary(&report, &work);
    print_pipeline_summary(&pipeline_report, skip);
    report.pipeline = Some(pipeline_report);
    Ok(report)
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
