//! `maxrs train`'s job, start to end: plugin and devices -> validated config and mesh -> the
//! train step built for them (`train::executor`: the SPMD step, or the pipelined one with
//! `ici_pipeline_parallelism > 1`) -> the checks that must pass before the (possibly long)
//! compile -> traced, lowered and compiled step -> state on the devices (restored from the run's
//! newest checkpoint, `load_full_state_path` or `load_parameters_path`, else initialized) -> the
//! step loop (`train::step_loop`: data in, metrics and events out, state stays on the devices,
//! copied off for checkpoints) -> a summary. [`RunReport`] returns what happened, for tests and
//! benchmarks.

use std::ops::Range;
use std::time::Instant;

use anyhow::{bail, Result};
use indicatif::ProgressBar;

use crate::checkpoint::{self, CheckpointManager, DataState as _};
use crate::cluster::preemption::PreemptionSync;
use crate::cluster::{diagnostics, Cluster};
use crate::config::{self, Config, Derived};
use crate::data::{self, EvalData, ProcessShare};
use crate::files::Location;
use crate::model::Model;
use crate::output;
use crate::pjrt::{self, Client};

use super::data_position::DataPosition;
use super::executor::{StepExecutor, StepPlan};
use super::flops;
use super::host_memory::host_memory_bytes;
use super::metrics::PerDeviceWork;
use super::outputs::{self, RunOutputs};
use super::pipeline::run::PipelinedPlan;
use super::profiler::StepProfiler;
use super::recorder::{progress_bar, StepRecorder};
use super::restore::{self, checkpoint_policy, run_checkpoints, Restoring};
use super::signals::Signals;
use super::spmd::SpmdPlan;
use super::step_loop::StepLoop;
use crate::model::flops::StepShape;

/// What [`train`] returns.
pub use super::report::{PipelineReport, RunReport, StartupTimes};

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
    let c = &Config { run_name: outputs::resolved_run_name(c), ..c.clone() };
    let devices = client.devices()?;
    let granules = match crate::cluster::cpu_pipeline_processes(c, cluster.process_count()) {
        // Each process's CPU client has the devices of every process (see the function).
        Some(processes) if client.platform_name()? == "cpu" => {
            let per_process = devices.len() / processes;
            (0..processes).map(|p| (p * per_process..(p + 1) * per_process).map(|id| id as i64).collect()).collect()
        }
        _ => devices_per_process(&devices),
    };
    if granules.len() != cluster.process_count() {
        bail!(
            "the plugin reports devices of {} processes, but this job has {}",
            granules.len(),
            cluster.process_count()
        );
    }
    let derived = config::validate(c, devices.len(), granules.len())?;
    pjrt::compile_cache::configure(&c.jax_cache_dir)?;
    let run = Run { c, client, cluster, derived: &derived, granules: &granules, devices: &devices };
    match derived.pipeline {
        None => run.start(SpmdPlan::new(c, &derived, &granules)?),
        Some(_) => run.start(PipelinedPlan::new(c, &derived, &granules)?.on_process(cluster, client, &granules)?),
    }
}

/// A run's settings and devices, before its step is compiled.
struct Run<'a> {
    c: &'a Config,
    client: &'a Client,
    cluster: &'a Cluster,
    derived: &'a Derived,
    /// The device ids of each process.
    granules: &'a [Vec<i64>],
    devices: &'a [pjrt::Device],
}

impl Run<'_> {
    /// Start-up for the step `plan` (checks, data, compile, initial state), then the step loop.
    fn start<P: StepPlan>(&self, plan: P) -> Result<RunReport> {
        let Run { c, client, cluster, derived, .. } = *self;
        let logger = cluster.is_logger();
        if logger {
            derived.print_summary(plan.model().num_params());
            if let Some(line) = plan.model().lora_summary() {
                println!("{line}");
            }
            println!("{}", crate::model::kernel::describe(c, plan.model().config.attention));
        }
        self.check_before_compile(plan.model())?;
        // The training data opens before the compile, so a bad file or tokenizer fails early and the
        // pipeline reads ahead while XLA compiles (gs:// datasets are read in ranges as they are
        // used). A resumed run or a process feeding only its share reopens it below, once its
        // position and rows are known.
        let mut fresh_data = data::open_train(c, derived.global_batch_size, ProcessShare::SINGLE, None)?;
        // A run whose first batches give the loss nothing to count is refused now, not after the
        // compile and a run of `loss: 0.000` steps.
        fresh_data.check_loss_tokens(c, derived.global_batch_size)?;
        // Before the compile: a profiler that cannot work fails the run now. As in MaxText (without
        // `upload_all_profiler_results`), process 0 profiles.
        let profiler = if logger { StepProfiler::new(c, client.plugin(), derived.steps as u64)? } else { None };

        let mut report = RunReport::default();
        let mut executor = plan.compile(c, client, self.granules, &mut report.startup)?;
        let t = Instant::now();
        diagnostics::set_phase(None, "initializing the state");
        let checkpoints = run_checkpoints(c)?;
        let layouts = executor.state_layouts()?;
        let restoring =
            Restoring { process: cluster.process_index(), processes: cluster.process_count(), layouts: &layouts };
        let start =
            restore::initial_state(c, &executor.state_specs(), &restoring, executor.model(), checkpoints.as_ref())?;
        executor.initialize(start.initial)?;
        report.startup.init = t.elapsed().as_secs_f64();
        report.first_step = start.first_step;
        if logger {
            println!(
                "start-up: trace {:.3} s, lower {:.3} s, compile {:.3} s, init {:.3} s",
                report.startup.trace, report.startup.lower, report.startup.compile, report.startup.init
            );
        }

        let work =
            per_device_work(c, executor.model(), derived, self.devices.first().map(|d| d.kind.as_str()).unwrap_or(""));
        report.tflops_per_device = work.tflops;
        let share = self.share(executor.local_rows())?;
        let mut data_position = DataPosition::new(c, derived.global_batch_size)?;
        if let Some(data) = &start.data {
            data_position.restore_state(data, start.first_step)?;
        } else if start.first_step > 0 && c.dataset_type == config::DatasetType::Synthetic {
            // A full state loaded without a data position (load_full_state_path): real data starts
            // over, as in MaxText; the synthetic sequence is a function of the step, so it goes on.
            data_position.state = Some(data::DataState::Synthetic { step: start.first_step });
        }
        let data = match (share, data_position.state.clone()) {
            (ProcessShare::SINGLE, None) => fresh_data,
            (share, state) => {
                drop(fresh_data);
                data::open_train(c, derived.global_batch_size, share, state)?
            }
        };
        let eval_data = EvalData::open(c, derived.eval_batch_size, share)?;
        let eval = eval_data.is_some();
        if let Some(eval_data) = eval_data {
            executor.open_eval(eval_data, derived.eval_batch_size)?;
        }
        // Only process 0 writes metrics and events; the metrics file is locked to the end of the run.
        let outputs = if logger { RunOutputs::open(c, start.first_step)? } else { RunOutputs::none(c) };
        let manager = checkpoints.map(|dir| CheckpointManager::new(dir, checkpoint_policy(c), self.checkpoint_job()));
        let model_keys = checkpoint::manifest::model_keys(c, executor.model());
        let signals = Signals::install(c.enable_autocheckpoint)?;

        let steps = derived.steps as u64;
        if start.first_step >= steps && logger {
            println!("the restored checkpoint already completed all {steps} steps; nothing to train");
        }
        let bar = if logger { progress_bar(steps.saturating_sub(start.first_step)) } else { ProgressBar::hidden() };
        let step_loop = StepLoop {
            c,
            client,
            logger,
            executor,
            work,
            data,
            data_position,
            eval,
            profiler,
            manager,
            model_keys,
            signals,
            // A process dispatches a step before the previous one completes and checks after
            // dispatching: its peers are up to 2 steps behind (see `cluster::preemption`).
            preemption: PreemptionSync::new(
                cluster.client().cloned(),
                cluster.process_index(),
                cluster.process_count(),
                if <P::Executor as StepExecutor>::RUNS_AHEAD { 3 } else { 2 },
            ),
            recorder: StepRecorder::new(c, bar, logger),
            outputs,
            report,
            first_step: start.first_step,
            steps,
            example_batch: None,
        };
        step_loop.run()
    }

    /// The processes that save the run's checkpoints together.
    fn checkpoint_job(&self) -> checkpoint::Job {
        match self.cluster.client() {
            Some(client) => {
                checkpoint::Job::new(self.cluster.process_index(), self.cluster.process_count(), client.clone())
            }
            None => checkpoint::Job::single(),
        }
    }

    /// Everything the run reads and writes, checked before the (possibly long) compile.
    fn check_before_compile(&self, model: &Model) -> Result<()> {
        let c = self.c;
        output::check_paths(c, output::Command::Train)?;
        if !c.load_parameters_path.is_empty() {
            if let Location::Local(path) = Location::parse(&c.load_parameters_path)? {
                if !path.exists() {
                    bail!("load_parameters_path={}: no such file or checkpoint directory", path.display());
                }
            }
        }
        if let Some(bytes) = host_memory_bytes() {
            let on_host = self.client.platform_name()? == "cpu";
            config::check_host_memory(c, self.derived, model.num_params(), bytes, on_host)?;
        }
        Ok(())
    }

    /// This process's share of each batch, from the rows its devices hold (`rows`): its share of
    /// the batch, or all of it when the mesh does not split the batch across processes.
    fn share(&self, rows: Range<usize>) -> Result<ProcessShare> {
        let (p, n) = (self.cluster.process_index(), self.cluster.process_count());
        let global = self.derived.global_batch_size;
        if rows == (0..global) {
            Ok(ProcessShare::SINGLE)
        } else if rows == data::host_rows(global, p, n)? {
            Ok(ProcessShare { index: p, count: n })
        } else {
            bail!(
                "process {p} of {n} holds batch rows {rows:?} of {global}, which is neither its share {:?} nor the \
                 whole batch; shard the batch over the DCN axes in process order (dcn_data_parallelism or \
                 dcn_fsdp_parallelism)",
                data::host_rows(global, p, n)?
            )
        }
    }
}

fn per_device_work(c: &Config, model: &Model, derived: &Derived, device_kind: &str) -> PerDeviceWork {
    // A preference pair is two sequences, and DPO runs the reference model's forward pass on
    // both: a third more than training on them (forward + backward = 3 forwards).
    let (sequences, reference) = match crate::train::dpo::Dpo::from_config(c) {
        Some(dpo) if dpo.algo == crate::train::dpo::Algo::Dpo => (2.0, 4.0 / 3.0),
        Some(_) => (2.0, 1.0),
        None => (1.0, 1.0),
    };
    let shape = StepShape {
        per_device_batch_size: derived.per_device_batch_size * sequences,
        max_target_length: derived.max_target_length as u64,
        gradient_accumulation_steps: derived.gradient_accumulation_steps as u64,
    };
    let configured = (c.peak_tflops_per_device > 0.0).then_some(c.peak_tflops_per_device);
    PerDeviceWork {
        tflops: model.training_tflops_per_device(&shape).total * reference,
        tokens: shape.tokens_per_device(),
        peak_tflops: flops::peak_tflops_per_device(device_kind, configured),
    }
}
