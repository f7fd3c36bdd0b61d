//! Running a pipelined step on the devices. Each stage is driven by a host thread of its own,
//! which runs the stage's tasks in the schedule's order: a task starts as soon as its input
//! arrived (the previous chunk's activation, the next chunk's input gradient); its output is
//! handed to the stage that needs it with a device-to-device copy (`PJRT_Buffer_CopyToDevice`,
//! which returns at once: the copy overlaps the sender's next task, and the receiving program
//! waits for it), then the sender drops its own buffer. Every program donates what it consumes
//! (the activation it transforms, the saved layer inputs, the gradient accumulators), so an
//! activation is copied exactly once, from one stage to the next.
//!
//! After the last microbatch each stage computes its gradients' squared norm; the host adds
//! them (the global norm over every stage, as the unpipelined step clips by) and each stage
//! updates its own parameters. Each task's start and end are recorded: the stages' idle
//! fraction is the measured bubble.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use super::layout::StageLayout;
use super::programs::{PipelineStep, StagePrograms, FP8_NEXT, GRAD};
use super::relay::Relay;
use super::schedule::{Pass, Schedule, Task, Timeline, Transfer};
use crate::checkpoint::shards::HostArray;
use crate::data::Batch;
use crate::host::{DType, HostTensor};
use crate::ir::Program;
use crate::pjrt::cross_host::CrossHost;
use crate::pjrt::{Client, Device};
use crate::runtime::{self, Compiled, DeviceArray};
use crate::train::step::batch_inputs;
use crate::train_state::{Group, TrainState};

/// A stage's compiled programs (the order of [`StagePrograms`]).
pub struct StageExecutables {
    pub forward: Vec<Compiled>,
    pub backward: Vec<Compiled>,
    pub norm: Compiled,
    pub update: Compiled,
}

impl StageExecutables {
    /// Stage `stage`'s executables: `compile(name, program)` for each of its programs, named as
    /// [`program_names`] lists them.
    pub fn build(
        stage: usize,
        layout: &StageLayout,
        programs: &StagePrograms,
        mut compile: impl FnMut(&str, &Program) -> Result<Compiled>,
    ) -> Result<StageExecutables> {
        let chunks = layout.stage_chunks(stage);
        let mut each = |pass: &str, programs: &[Program]| -> Result<Vec<Compiled>> {
            chunks.iter().zip(programs).map(|(c, p)| compile(&format!("chunk.{c}.{pass}"), p)).collect()
        };
        let forward = each("forward", &programs.forward)?;
        let backward = each("backward", &programs.backward)?;
        Ok(StageExecutables {
            forward,
            backward,
            norm: compile(&format!("stage.{stage}.norm"), &programs.norm)?,
            update: compile(&format!("stage.{stage}.update"), &programs.update)?,
        })
    }

    fn all(&self) -> impl Iterator<Item = &Compiled> {
        self.forward.iter().chain(&self.backward).chain([&self.norm, &self.update])
    }
}

/// The names of stage `stage`'s programs, in the order [`StageExecutables::build`] compiles them.
pub fn program_names(stage: usize, layout: &StageLayout) -> Vec<String> {
    let chunks = layout.stage_chunks(stage);
    let mut names: Vec<String> = ["forward", "backward"]
        .iter()
        .flat_map(|pass| chunks.iter().map(move |c| format!("chunk.{c}.{pass}")))
        .collect();
    names.push(format!("stage.{stage}.norm"));
    names.push(format!("stage.{stage}.update"));
    names
}

/// One stage: its devices, programs and arrays.
pub(super) struct Stage {
    pub(super) index: usize,
    /// The order of every per-device list of the stage's programs.
    devices: Vec<Device>,
    /// Each device's position in the stage's mesh.
    positions: Vec<usize>,
    pub(super) programs: StageExecutables,
    /// The last stage's `eval.head`, once an eval is opened (`Pipeline::open_eval`).
    pub(super) eval_head: Option<Compiled>,
    /// `params.*`, `opt_state.*`, `grad.*`.
    pub(super) state: HashMap<String, DeviceArray>,
}

/// An activation or input gradient on its way to the task that reads it.
struct Message {
    key: Key,
    array: DeviceArray,
}

/// (accumulation pass, task that reads it).
type Key = (usize, Task);

/// What a stage's step (or eval) gives the whole pipeline's results; sent to the other
/// processes of a pipeline across processes.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub(super) struct StageSummary {
    /// Per microbatch of the last chunk: total_loss, total_weights, z_loss_sum.
    pub(super) losses: Vec<[f64; 3]>,
    /// Each auxiliary loss (`moe_lb_loss`) summed over the stage's layers and the microbatches.
    pub(super) aux: BTreeMap<String, f64>,
}

/// One run of the schedule: what this process's stages did, and every stage's summary.
pub(super) struct Ran {
    pub(super) local: Vec<StageReport>,
    pub(super) every_stage: Vec<StageSummary>,
    /// Its number among the pipeline's runs (the relay's keys name it).
    round: u64,
}

/// Where the relay's keys live in the coordination service's key-value store.
const RELAY_PREFIX: &str = "maxrs/pipeline";

/// What a stage did during a step (or an eval's forward passes).
#[derive(Default)]
pub(super) struct StageReport {
    tasks: Vec<(Task, f64, f64)>,
    /// Seconds waiting for inputs, and executing.
    waiting: f64,
    executing: f64,
    /// The whole task loop.
    total: f64,
    /// Per microbatch of the last chunk: total_loss, total_weights, z_loss_sum.
    pub(super) losses: Vec<[f64; 3]>,
    /// Each auxiliary loss (`moe_lb_loss`) summed over the stage's layers and the microbatches.
    pub(super) aux: BTreeMap<String, f64>,
}

/// The results of one pipelined step.
#[derive(Clone, Debug, Default)]
pub struct StepResult {
    pub loss: f64,
    pub grad_norm: f64,
    pub learning_rate: f64,
    pub total_weights: f64,
    pub z_loss: f64,
    /// Each auxiliary loss of the layers (`moe_lb_loss`), averaged over layers and microbatches
    /// (part of `loss`).
    pub aux_losses: BTreeMap<String, f64>,
    /// When each stage ran each task (all accumulation passes), from the first task's start.
    pub timeline: Timeline,
    /// Host time per microbatch spent on scheduling (neither executing nor waiting for an
    /// input), averaged over the stages.
    pub host_overhead_per_microbatch: f64,
}

/// Which stages this process runs, and how it reaches the others.
pub struct Placement {
    /// The stages this process runs (all of them in a one-process pipeline).
    pub local: Range<usize>,
    /// The other stages' processes, through the coordination service's key-value store: each
    /// stage's step results, and on the CPU plugin (which has no cross-process transfers) the
    /// arrays too; `None` when every stage is local.
    pub relay: Option<Relay>,
    /// The arrays between stages of different processes device to device (NCCL on GPUs), where
    /// the plugin has PJRT's cross-host transfers.
    pub cross_host: Option<CrossHost>,
}

impl Placement {
    /// Every one of `stages` stages in this process.
    pub fn single(stages: usize) -> Placement {
        Placement { local: 0..stages, relay: None, cross_host: None }
    }

    /// The process that runs stage `stage` (each runs as many consecutive stages as this one).
    pub fn process_of(&self, stage: usize) -> usize {
        stage / self.local.len().max(1)
    }
}

/// The compiled pipeline and its state on the devices.
pub struct Pipeline {
    pub step: PipelineStep,
    pub schedule: Schedule,
    pub(super) client: Client,
    /// This process's stages, in stage order (`placement.local`).
    pub(super) stages: Vec<Stage>,
    pub(super) placement: Placement,
    /// What this process's stages receive from other processes', by device (cross-host only).
    receive_shapes: ReceiveShapes,
    passes: usize,
    /// Runs of the schedule so far (steps and evals): the relay's keys name the run.
    rounds: u64,
}

impl Pipeline {
    /// A pipeline of `step`'s programs compiled as `executables` (one per stage of
    /// `placement.local`) on `client`, running `schedule`; `passes` accumulation passes per step.
    /// The state is empty until [`Pipeline::initialize`].
    pub fn new(
        client: &Client,
        step: PipelineStep,
        schedule: Schedule,
        executables: Vec<StageExecutables>,
        passes: usize,
        placement: Placement,
    ) -> Result<Pipeline> {
        if executables.len() != placement.local.len() {
            bail!("{} stages' programs for the stages {:?} of this process", executables.len(), placement.local);
        }
        let stages: Vec<Stage> = placement
            .local
            .clone()
            .zip(executables)
            .map(|(index, programs)| {
                let devices = programs.forward[0].executable.addressable_devices().to_vec();
                let ids: Vec<i32> = devices.iter().map(|d| d.id).collect();
                if let Some(other) = programs
                    .all()
                    .find(|p| p.executable.addressable_devices().iter().map(|d| d.id).collect::<Vec<_>>() != ids)
                {
                    bail!(
                        "stage {index}'s programs run on different devices ({ids:?} and {:?})",
                        other.executable.addressable_devices().iter().map(|d| d.id).collect::<Vec<_>>()
                    );
                }
                let mesh = &step.stage_meshes[index];
                let positions = ids
                    .iter()
                    .map(|&id| {
                        mesh.device_ids()
                            .iter()
                            .position(|&m| m == id as i64)
                            .ok_or_else(|| anyhow!("device {id} is not one of stage {index}'s"))
                    })
                    .collect::<Result<_>>()?;
                Ok(Stage { index, devices, positions, programs, eval_head: None, state: HashMap::new() })
            })
            .collect::<Result<_>>()?;
        let receive_shapes = receive_shapes(&stages, placement.cross_host.is_some());
        Ok(Pipeline { step, schedule, client: client.clone(), stages, placement, receive_shapes, passes, rounds: 0 })
    }

    /// Whether every stage runs in this process (so that its whole state is here).
    pub fn is_whole(&self) -> bool {
        self.placement.relay.is_none()
    }

    /// This process's stage `index`, if it runs it.
    pub(super) fn local_stage_mut(&mut self, index: usize) -> Option<&mut Stage> {
        self.stages.iter_mut().find(|s| s.index == index)
    }

    /// Names of the arrays stage `stage` keeps: its part of the train state and its
    /// accumulators.
    fn state_names(&self, stage: usize) -> Vec<String> {
        let (layout, model) = (&self.step.layout, &self.step.model);
        let (params, fp8) =
            (layout.stage_params(model, stage), layout.stage_defs(model, &model.fp8_state_defs(), stage));
        let mut names = TrainState::from_defs(&params, &fp8, model.config.weight_dtype).names();
        names.extend(params.iter().map(|d| format!("{GRAD}.{}", d.name)));
        names.extend(fp8.iter().map(|d| format!("{FP8_NEXT}.{}", d.name)));
        names
    }

    /// Creates the state: the initializer runs over every device and each stage keeps its
    /// devices' part of what it holds; with `parameters` (`params.*` in the model's full layout,
    /// from `load_parameters_path`: whole, or the blocks of this process's stages) the
    /// parameters come from there instead.
    pub fn initialize(&mut self, parameters: Option<&BTreeMap<String, HostArray>>) -> Result<()> {
        let init = self.step.init(parameters.is_none()).map_err(|e| anyhow!("tracing the initializer: {e}"))?;
        let init = runtime::compile(&self.client, &init)?;
        let ids: Vec<i32> = init.executable.addressable_devices().iter().map(|d| d.id).collect();
        let outputs = init.execute(&[])?;
        let wanted: Vec<Vec<String>> = (0..self.step.layout.stages).map(|s| self.state_names(s)).collect();
        for (spec, array) in init.program.outputs.iter().zip(outputs) {
            let mut buffers: Vec<Option<_>> = array.into_iter().map(Some).collect();
            for stage in &mut self.stages {
                if !wanted[stage.index].contains(&spec.name) {
                    continue;
                }
                let mine = stage
                    .devices
                    .iter()
                    .map(|d| {
                        let at = ids.iter().position(|&id| id == d.id);
                        at.and_then(|i| buffers[i].take())
                            .ok_or_else(|| anyhow!("the initializer left no \"{}\" on device {}", spec.name, d.id))
                    })
                    .collect::<Result<DeviceArray>>()?;
                stage.state.insert(spec.name.clone(), mine);
            }
        }
        if let Some(parameters) = parameters {
            self.put_group(Group::Params, parameters)?;
        }
        for stage in &self.stages {
            if let Some(missing) = wanted[stage.index].iter().find(|n| !stage.state.contains_key(*n)) {
                bail!("stage {} has no \"{missing}\" after initialization", stage.index);
            }
        }
        Ok(())
    }

    /// One optimizer step on `batch` (the global batch): every accumulation pass through the
    /// pipeline, then the norm and the update.
    pub fn step(&mut self, batch: &Batch) -> Result<StepResult> {
        let micro = split_batch(batch, self.passes * self.schedule.microbatches, self.step.packed)?;
        // The gradients are of the step's mean loss, as the unpipelined step's: the head scales
        // each microbatch's summed loss by one over the step's token count, and the layers'
        // auxiliary losses count as their mean over layers and microbatches (as the unpipelined
        // step's gradient accumulation counts them).
        let microbatches = (self.passes * self.schedule.microbatches) as f64;
        let weights = Weights {
            aux: 1.0 / (microbatches * self.step.model.config.layers as f64),
            loss_scale: 1.0 / (batch.total_weights() as f64).max(1.0),
        };
        let ran = self.run_passes(&micro, self.passes, weights, false)?;

        let mut sums = [0.0f64; 3];
        for l in &ran.every_stage.last().expect("a pipeline has stages").losses {
            for k in 0..3 {
                sums[k] += l[k];
            }
        }
        let [total_loss, total_weights, z_loss_sum] = sums;
        let weights = total_weights.max(1.0);
        let mut aux_losses = BTreeMap::new();
        for (name, sum) in ran.every_stage.iter().flat_map(|r| &r.aux) {
            *aux_losses.entry(name.clone()).or_insert(0.0) +=
                sum / (microbatches * self.step.model.config.layers as f64);
        }
        let local_sumsq: Vec<f64> = self.on_every_stage(|stage, _| stage.gradient_sumsq())?;
        let sumsq = self.exchange("sumsq", ran.round, &local_sumsq)?;
        let grad_norm = sumsq.iter().sum::<f64>().sqrt();
        let rates = self.on_every_stage(|stage, client| stage.update(client, grad_norm))?;

        let reports = ran.local;
        let overhead = reports.iter().map(|r| (r.total - r.executing - r.waiting).max(0.0)).sum::<f64>()
            / reports.len() as f64
            / microbatches;
        Ok(StepResult {
            loss: total_loss / weights + aux_losses.values().sum::<f64>(),
            aux_losses,
            grad_norm,
            learning_rate: rates[0],
            total_weights,
            z_loss: z_loss_sum / weights,
            timeline: Timeline { per_stage: reports.into_iter().map(|r| r.tasks).collect() },
            host_overhead_per_microbatch: overhead,
        })
    }

    /// Runs `passes` passes of the schedule over the microbatches `micro` on this process's
    /// stages (one thread each, and one more per stage that receives from another process's);
    /// `forward_only` (an eval) runs only the forward tasks, the last chunk's as `eval.head`.
    /// Returns what each stage did, or the error of the stage that failed first.
    pub(super) fn run_passes(
        &mut self,
        micro: &[HashMap<String, HostTensor>],
        passes: usize,
        weights: Weights,
        forward_only: bool,
    ) -> Result<Ran> {
        self.rounds += 1;
        let stages = self.step.layout.stages;
        let mut devices = vec![None; stages];
        for s in &self.stages {
            devices[s.index] = Some((s.devices.clone(), s.positions.clone()));
        }
        let ctx = StepContext {
            weights,
            schedule: &self.schedule,
            layout: &self.step.layout,
            micro,
            passes,
            forward_only,
            client: &self.client,
            devices,
            relay: self.placement.relay.as_ref(),
            cross_host: self.placement.cross_host.as_ref(),
            stage_devices: self.step.stage_meshes.iter().map(|m| m.device_ids().to_vec()).collect(),
            receive_shapes: &self.receive_shapes,
            round: self.rounds,
            abort: AtomicBool::new(false),
            start: Instant::now(),
        };
        let mut outboxes: Vec<Option<Sender<Message>>> = vec![None; stages];
        let mut inboxes = Vec::new();
        for s in &self.stages {
            let (sender, receiver) = channel();
            outboxes[s.index] = Some(sender);
            inboxes.push(receiver);
        }
        // The links to other processes' stages: each hands its arrays over in one order that the
        // other process follows too (`Schedule::transfers`), from its own thread.
        let mut links: BTreeMap<(usize, usize), Vec<Transfer>> = BTreeMap::new();
        for t in self.schedule.transfers(forward_only) {
            if ctx.devices[t.from].is_some() != ctx.devices[t.to].is_some() {
                links.entry((t.from.min(t.to), t.from.max(t.to))).or_default().push(t);
            }
        }
        let (link_outboxes, link_inboxes): (BTreeMap<_, _>, Vec<_>) = links
            .keys()
            .map(|&pair| {
                let (sender, receiver) = channel();
                ((pair, sender), receiver)
            })
            .unzip();
        let results: Vec<Result<StageReport>> = std::thread::scope(|scope| {
            let ctx = &ctx;
            let links: Vec<_> = links
                .into_values()
                .zip(link_inboxes)
                .map(|(sequence, inbox)| {
                    let outboxes = outboxes.clone();
                    scope.spawn(move || {
                        let stop_the_others = AbortUnlessDone(&ctx.abort);
                        let ran = ctx.run_link(&sequence, &inbox, &outboxes);
                        if ran.is_ok() {
                            std::mem::forget(stop_the_others);
                        }
                        ran.map(|()| StageReport::default())
                    })
                })
                .collect();
            let handles: Vec<_> = self
                .stages
                .iter_mut()
                .zip(inboxes)
                .map(|(stage, inbox)| {
                    let (outboxes, link_outboxes) = (outboxes.clone(), link_outboxes.clone());
                    scope.spawn(move || {
                        let stop_the_others = AbortUnlessDone(&ctx.abort);
                        let report = stage.run_tasks(ctx, &inbox, &outboxes, &link_outboxes);
                        if report.is_ok() {
                            std::mem::forget(stop_the_others);
                        }
                        report
                    })
                })
                .collect();
            let join = |h: std::thread::ScopedJoinHandle<'_, Result<StageReport>>| {
                h.join().unwrap_or_else(|_| Err(anyhow!("a stage's thread panicked")))
            };
            let reports: Vec<_> = handles.into_iter().map(join).collect();
            reports.into_iter().chain(links.into_iter().map(join).filter(Result::is_err)).collect()
        });
        // Report the stage that failed first, not the ones that stopped because of it.
        if results.iter().any(Result::is_err) {
            let mut errors: Vec<anyhow::Error> = results.into_iter().filter_map(Result::err).collect();
            let first = errors.iter().position(|e| !e.to_string().contains(STOPPED)).unwrap_or(0);
            return Err(errors.swap_remove(first));
        }
        let local: Vec<StageReport> = results.into_iter().map(Result::unwrap).collect();
        let summaries: Vec<StageSummary> =
            local.iter().map(|r| StageSummary { losses: r.losses.clone(), aux: r.aux.clone() }).collect();
        let every_stage = self.exchange("summary", self.rounds, &summaries)?;
        Ok(Ran { local, every_stage, round: self.rounds })
    }

    /// Every stage's `value` in stage order, given this process's stages' (in their order): the
    /// other processes' come through the relay under `what` and `round`.
    fn exchange<T: Clone + serde::Serialize + serde::de::DeserializeOwned>(
        &self,
        what: &str,
        round: u64,
        local: &[T],
    ) -> Result<Vec<T>> {
        let Some(relay) = &self.placement.relay else { return Ok(local.to_vec()) };
        let key = |round: u64, stage: usize| format!("{RELAY_PREFIX}/{round}/{what}/{stage}");
        for (stage, value) in self.stages.iter().zip(local) {
            relay.put_value(&key(round, stage.index), &serde_json::to_vec(value)?)?;
            // Every process has read what this one put two rounds ago: it needed it to finish
            // that round, and this process has since had its part of the round after.
            if round > 2 {
                relay.delete(&key(round - 2, stage.index))?;
            }
        }
        let never = AtomicBool::new(false);
        (0..self.step.layout.stages)
            .map(|s| match self.stages.iter().position(|l| l.index == s) {
                Some(i) => Ok(local[i].clone()),
                None => {
                    let bytes = relay.wait(&key(round, s), &never)?;
                    serde_json::from_slice(&bytes).with_context(|| format!("stage {s}'s {what} of round {round}"))
                }
            })
            .collect()
    }

    /// Runs `f` on every stage at once (one thread each); the results in stage order.
    fn on_every_stage<T: Send>(&mut self, f: impl Fn(&mut Stage, &Client) -> Result<T> + Sync) -> Result<Vec<T>> {
        let client = &self.client;
        let f = &f;
        std::thread::scope(|scope| {
            let handles: Vec<_> = self.stages.iter_mut().map(|stage| scope.spawn(move || f(stage, client))).collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("a stage's thread panicked"))))
                .collect()
        })
    }
}

/// By (stage, pass, repeat): the type and shape of each device's block of what the stage's
/// program for that pass and repeat reads from the previous (next) stage.
type ReceiveShapes = HashMap<(usize, Pass, usize), Vec<(DType, Vec<i64>)>>;

/// For each of `stages` (this process's), the blocks its programs read as `activation`
/// (forward) and `cotangent` (backward), by device: what a cross-host receive allocates (only
/// with `cross_host`; the relay's arrays carry their shapes).
fn receive_shapes(stages: &[Stage], cross_host: bool) -> ReceiveShapes {
    let mut shapes = HashMap::new();
    if !cross_host {
        return shapes;
    }
    for stage in stages {
        for (pass, programs, input) in [
            (Pass::Forward, &stage.programs.forward, "activation"),
            (Pass::Backward, &stage.programs.backward, "cotangent"),
        ] {
            for (repeat, program) in programs.iter().enumerate() {
                if let Some(index) = program.find_input(input) {
                    shapes.insert((stage.index, pass, repeat), program.input_block_shapes(index));
                }
            }
        }
    }
    shapes
}

/// Sets the step's abort flag when dropped: a stage's or link's thread holds one until it ends
/// well, so that a failure, or a panic, stops the threads that wait for it instead of leaving
/// them waiting.
struct AbortUnlessDone<'a>(&'a AtomicBool);

impl Drop for AbortUnlessDone<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// What every stage's thread reads during a step.
struct StepContext<'a> {
    schedule: &'a Schedule,
    layout: &'a StageLayout,
    /// Per microbatch (all passes): the batch arrays by name (`inputs`, `targets`, ...).
    micro: &'a [HashMap<String, HostTensor>],
    passes: usize,
    /// An eval: forward tasks only.
    forward_only: bool,
    client: &'a Client,
    /// Per stage: its devices and their positions in its mesh (`None`: another process's).
    devices: Vec<Option<(Vec<Device>, Vec<usize>)>>,
    /// To and from the other processes' stages.
    relay: Option<&'a Relay>,
    /// Arrays to and from the other processes' stages device to device, where the plugin can.
    cross_host: Option<&'a CrossHost>,
    /// Per stage: the global ids of its devices in mesh order.
    stage_devices: Vec<Vec<i64>>,
    /// What a stage of this process receives from another process's, on each of its devices:
    /// by (stage, pass, repeat), the block of its program's `activation` or `cotangent` input.
    receive_shapes: &'a ReceiveShapes,
    /// The run's number among the pipeline's runs.
    round: u64,
    /// The scalars the training programs read.
    weights: Weights,
    /// Set when a stage fails: the others stop waiting.
    abort: AtomicBool,
    start: Instant,
}

/// The scalar inputs of a step's training programs.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Weights {
    /// The backward programs' `aux_weight`: each layer's auxiliary losses' weight in the loss.
    pub aux: f64,
    /// The last chunk's forward `loss_scale`: one over the step's token count.
    pub loss_scale: f64,
}

/// How an error says that a stage stopped because another failed.
pub(super) const STOPPED: &str = "stopped because another stage failed";

impl StepContext<'_> {
    fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Stage `index`'s devices and their mesh positions; it is one of this process's.
    fn local(&self, index: usize) -> &(Vec<Device>, Vec<usize>) {
        self.devices[index].as_ref().expect("a stage of this process")
    }

    /// Copies `array` (on stage `from`'s devices) to stage `to`'s devices: each block to the
    /// device at the same position of the other stage's mesh.
    fn copy_between(&self, array: &DeviceArray, from: usize, to: usize) -> Result<DeviceArray> {
        let (src_positions, (dst_devices, dst_positions)) = (&self.local(from).1, self.local(to));
        dst_devices
            .iter()
            .zip(dst_positions)
            .map(|(device, position)| {
                let i = src_positions.iter().position(|p| p == position).expect("stages have meshes of one shape");
                Ok(array[i].copy_to_device(device)?)
            })
            .collect()
    }

    /// The relay's key of the block at mesh position `position` of what `key`'s task reads.
    fn relay_key(&self, (pass, task): Key, position: usize) -> String {
        format!("{RELAY_PREFIX}/{}/{pass}/{task}/{position}", self.round)
    }

    /// Hands over the arrays of one link between a stage of this process and one of another's,
    /// in `sequence`'s order (every accumulation pass): an array this process sends comes from
    /// its stage's thread through `inbox`; one it receives goes to its stage's inbox.
    fn run_link(
        &self,
        sequence: &[Transfer],
        inbox: &Receiver<Message>,
        outboxes: &[Option<Sender<Message>>],
    ) -> Result<()> {
        let mut pending = HashMap::new();
        for pass in 0..self.passes {
            for (seq, t) in sequence.iter().enumerate() {
                let key = (pass, t.consumer);
                // A transfer's number on the link (the cross-host transfers' keys).
                let id = |position: usize| {
                    ((self.round as i64) << 40) | (((pass * sequence.len() + seq) as i64) << 12) | position as i64
                };
                match &outboxes[t.to] {
                    None => {
                        let array = wait_for(self, inbox, &mut pending, key)?;
                        let positions = &self.local(t.from).1;
                        match (self.cross_host, self.relay) {
                            (Some(cross_host), _) => {
                                let dst: Vec<i32> =
                                    positions.iter().map(|&p| self.stage_devices[t.to][p] as i32).collect();
                                let keys: Vec<i64> = positions.iter().map(|&p| id(p)).collect();
                                cross_host.send(&array.iter().collect::<Vec<_>>(), &dst, &keys)?;
                            }
                            (None, Some(relay)) => {
                                for (block, &position) in array.iter().zip(positions) {
                                    relay.put(&self.relay_key(key, position), &block.to_host()?)?;
                                }
                            }
                            (None, None) => bail!("stage {} runs in no process", t.to),
                        }
                    }
                    Some(outbox) => {
                        let (devices, positions) = self.local(t.to);
                        let shapes = (t.to, t.consumer.pass, self.layout.repeat_of(t.consumer.chunk));
                        let array = devices
                            .iter()
                            .zip(positions)
                            .enumerate()
                            .map(|(d, (device, &position))| match (self.cross_host, self.relay) {
                                (Some(cross_host), _) => {
                                    let shape =
                                        self.receive_shapes.get(&shapes).and_then(|s| s.get(d)).ok_or_else(|| {
                                            anyhow!("stage {} has no program that reads {}", t.to, t.consumer)
                                        })?;
                                    let src = self.stage_devices[t.from][position] as i32;
                                    let mut received = cross_host.receive(
                                        device,
                                        std::slice::from_ref(shape),
                                        &[src],
                                        &[id(position)],
                                    )?;
                                    received.pop().ok_or_else(|| anyhow!("a cross-host receive gave no buffer"))
                                }
                                (None, Some(relay)) => {
                                    let host = relay.take(&self.relay_key(key, position), &self.abort)?;
                                    Ok(self.client.to_device(&host, device)?)
                                }
                                (None, None) => bail!("stage {} runs in no process", t.from),
                            })
                            .collect::<Result<DeviceArray>>()?;
                        // A closed inbox means the stage already stopped; its error is reported.
                        let _ = outbox.send(Message { key, array });
                    }
                }
            }
        }
        Ok(())
    }
}

impl Stage {
    /// The stage's tasks of every accumulation pass, in the schedule's order.
    fn run_tasks(
        &mut self,
        ctx: &StepContext,
        inbox: &Receiver<Message>,
        outboxes: &[Option<Sender<Message>>],
        links: &BTreeMap<(usize, usize), Sender<Message>>,
    ) -> Result<StageReport> {
        let mut report = StageReport::default();
        let loop_start = ctx.now();
        let mut pending: HashMap<Key, DeviceArray> = HashMap::new();
        let microbatches = ctx.schedule.microbatches;
        let scalar = |program: &Compiled, name: &str, v: f64| {
            program.put(ctx.client, program.input_index(name)?, &HostTensor::from_f32(&[], &[v as f32]))
        };
        let aux_weight = scalar(&self.programs.backward[0], "aux_weight", ctx.weights.aux)?;
        // Only the last chunk's forward reads it; the stage that runs it runs it last.
        let last_forward = self.programs.forward.last().expect("a stage runs chunks");
        let loss_scale = match last_forward.find_input("loss_scale") {
            Some(_) => Some(scalar(last_forward, "loss_scale", ctx.weights.loss_scale)?),
            None => None,
        };
        for pass in 0..ctx.passes {
            // Per microbatch, the batch arrays on this stage's devices (put when first needed).
            let mut batches: HashMap<usize, HashMap<String, DeviceArray>> = HashMap::new();
            // Per (chunk, microbatch): what the forward keeps for the backward.
            let mut residuals: HashMap<(usize, usize), HashMap<String, DeviceArray>> = HashMap::new();
            // Without the backward tasks the forward ones keep an order that cannot wait forever:
            // each still waits only for forward tasks that ran before it in the full schedule.
            let tasks =
                ctx.schedule.per_stage[self.index].iter().filter(|t| !ctx.forward_only || t.pass == Pass::Forward);
            for task in tasks {
                let global = pass * microbatches + task.microbatch;
                if let std::collections::hash_map::Entry::Vacant(entry) = batches.entry(task.microbatch) {
                    // Only the arrays the stage's programs read (the targets on the last stage).
                    let mut arrays = HashMap::new();
                    for (name, host) in &ctx.micro[global] {
                        if let Some(array) = self.put_batch(ctx.client, name, host)? {
                            arrays.insert(format!("batch.{name}"), array);
                        }
                    }
                    entry.insert(arrays);
                }
                let key = (pass, *task);
                let waited = ctx.now();
                let input = match (task.pass, ctx.layout.is_first(task.chunk), ctx.layout.is_last(task.chunk)) {
                    (Pass::Forward, true, _) => None,
                    (Pass::Backward, _, true) => None,
                    _ => Some(wait_for(ctx, inbox, &mut pending, key)?),
                };
                report.waiting += ctx.now() - waited;
                let repeat = ctx.layout.repeat_of(task.chunk);
                let batch = &batches[&task.microbatch];
                let (program, mut locals) = match task.pass {
                    Pass::Forward => {
                        let mut locals = HashMap::new();
                        if let Some(x) = input {
                            locals.insert("activation".to_string(), x);
                        }
                        let program = match ctx.forward_only && ctx.layout.is_last(task.chunk) {
                            // The train forward of the last chunk would add to the accumulators.
                            true => {
                                self.eval_head.as_ref().ok_or_else(|| anyhow!("the pipeline's eval is not open"))?
                            }
                            false => &self.programs.forward[repeat],
                        };
                        (program, locals)
                    }
                    Pass::Backward => {
                        let mut locals = residuals
                            .remove(&(task.chunk, task.microbatch))
                            .ok_or_else(|| anyhow!("stage {}: {task} runs before its forward", self.index))?;
                        if let Some(ct) = input {
                            locals.insert("cotangent".to_string(), ct);
                        }
                        (&self.programs.backward[repeat], locals)
                    }
                };
                let started = ctx.now();
                let outputs = execute_named(program, |name| match name {
                    "aux_weight" => Some(&aux_weight),
                    "loss_scale" => loss_scale.as_ref(),
                    _ => batch.get(name).or_else(|| locals.get(name)).or_else(|| self.state.get(name)),
                })
                .with_context(|| format!("stage {} running {task}", self.index))?;
                let ended = ctx.now();
                locals.clear();
                report.executing += ended - started;
                report.tasks.push((*task, started, ended));

                let mut kept = HashMap::new();
                let mut metrics = [0.0; 3];
                for (name, array) in outputs {
                    if name.starts_with(&format!("{GRAD}.")) || name.starts_with(&format!("{FP8_NEXT}.")) {
                        self.state.insert(name, array);
                    } else if name.starts_with("residual.") {
                        kept.insert(name, array);
                    } else if let Some(aux) = name.strip_prefix("metrics.aux.") {
                        let value = program.fetch(program.output_index(&name)?, &array)?.to_f64()[0];
                        *report.aux.entry(aux.to_string()).or_insert(0.0) += value;
                    } else if let Some(metric) = name.strip_prefix("metrics.") {
                        let k = ["total_loss", "total_weights", "z_loss_sum"]
                            .iter()
                            .position(|m| *m == metric)
                            .ok_or_else(|| anyhow!("unexpected output {name}"))?;
                        metrics[k] = program.fetch(program.output_index(&name)?, &array)?.to_f64()[0];
                    } else {
                        // "activation" for the next chunk, "cotangent" for the previous one.
                        let (to_chunk, pass_of) = match task.pass {
                            Pass::Forward => (task.chunk + 1, Pass::Forward),
                            Pass::Backward => (task.chunk - 1, Pass::Backward),
                        };
                        let to = ctx.layout.stage_of(to_chunk);
                        let next = Task { pass: pass_of, chunk: to_chunk, microbatch: task.microbatch };
                        // A closed inbox means that stage (or link) already stopped; its error is reported.
                        match &outboxes[to] {
                            Some(outbox) => {
                                let array = ctx.copy_between(&array, self.index, to)?;
                                let _ = outbox.send(Message { key: (pass, next), array });
                            }
                            None => {
                                let link = links
                                    .get(&(self.index.min(to), self.index.max(to)))
                                    .ok_or_else(|| anyhow!("stage {to} runs in no process"))?;
                                let _ = link.send(Message { key: (pass, next), array });
                            }
                        }
                    }
                }
                if task.pass == Pass::Forward {
                    if !ctx.forward_only {
                        residuals.insert((task.chunk, task.microbatch), kept);
                    }
                    if ctx.layout.is_last(task.chunk) {
                        report.losses.push(metrics);
                    }
                }
            }
            if let Some((chunk, microbatch)) = residuals.keys().next() {
                bail!(
                    "stage {}: the schedule never ran the backward of chunk {chunk}, microbatch {microbatch}",
                    self.index
                );
            }
        }
        report.total = ctx.now() - loop_start;
        Ok(report)
    }

    /// Copies the microbatch array `batch.{name}` to the stage's devices, if a program of the
    /// stage reads it.
    fn put_batch(&self, client: &Client, name: &str, host: &HostTensor) -> Result<Option<DeviceArray>> {
        let input = format!("batch.{name}");
        match self.programs.all().find_map(|p| Some((p, p.find_input(&input)?))) {
            Some((program, index)) => Ok(Some(program.put(client, index, host)?)),
            None => Ok(None),
        }
    }

    /// The squared norm of the stage's gradients of the mean loss.
    fn gradient_sumsq(&mut self) -> Result<f64> {
        let norm = &self.programs.norm;
        let outputs = execute_named(norm, |name| self.state.get(name))?;
        let (name, array) = outputs.into_iter().next().ok_or_else(|| anyhow!("the norm program has no output"))?;
        Ok(norm.fetch(norm.output_index(&name)?, &array)?.to_f64()[0])
    }

    /// The optimizer update; returns the learning rate it used.
    fn update(&mut self, client: &Client, grad_norm: f64) -> Result<f64> {
        let update = &self.programs.update;
        let norm =
            update.put(client, update.input_index("grad_norm")?, &HostTensor::from_f32(&[], &[grad_norm as f32]))?;
        let outputs = execute_named(update, |name| match name {
            "grad_norm" => Some(&norm),
            _ => self.state.get(name),
        })
        .with_context(|| format!("stage {}'s optimizer update", self.index))?;
        let mut rate = f64::NAN;
        for (name, array) in outputs {
            if name == "metrics.learning_rate" {
                rate = update.fetch(update.output_index(&name)?, &array)?.to_f64()[0];
            } else {
                self.state.insert(name, array);
            }
        }
        Ok(rate)
    }
}

/// Waits until the array for `key` arrived, keeping others that arrive meanwhile.
fn wait_for(
    ctx: &StepContext,
    inbox: &Receiver<Message>,
    pending: &mut HashMap<Key, DeviceArray>,
    key: Key,
) -> Result<DeviceArray> {
    loop {
        if let Some(array) = pending.remove(&key) {
            return Ok(array);
        }
        match inbox.recv_timeout(Duration::from_millis(50)) {
            Ok(message) => {
                pending.insert(message.key, message.array);
            }
            Err(RecvTimeoutError::Timeout) if ctx.abort.load(Ordering::SeqCst) => bail!("{STOPPED}"),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => bail!("{STOPPED}"),
        }
    }
}

/// Runs `program` on the arrays `lookup` finds for its inputs (by name); returns its outputs by
/// name. Donated inputs are consumed.
fn execute_named<'a>(
    program: &Compiled,
    lookup: impl Fn(&str) -> Option<&'a DeviceArray>,
) -> Result<Vec<(String, DeviceArray)>> {
    let args = program
        .program
        .inputs
        .iter()
        .map(|input| lookup(&input.name).ok_or_else(|| anyhow!("no array for input \"{}\"", input.name)))
        .collect::<Result<Vec<_>>>()?;
    let outputs = program.execute(&args)?;
    Ok(program.program.outputs.iter().map(|o| o.name.clone()).zip(outputs).collect())
}

/// The global batch split into `count` microbatches, each the batch arrays by name
/// (`batch_inputs(packed)`). Row `r` of microbatch `k` is global row `r x count + k`, as the
/// unpipelined step splits a batch for gradient accumulation (`TrainStep::loss_and_grads`): the
/// same global batch gives the same microbatches either way.
pub(super) fn split_batch(batch: &Batch, count: usize, packed: bool) -> Result<Vec<HashMap<String, HostTensor>>> {
    let rows = batch.inputs.dims[0] as usize;
    if count == 0 || !rows.is_multiple_of(count) {
        bail!("a batch of {rows} rows does not split into {count} microbatches");
    }
    let arrays: Vec<(&str, &HostTensor)> = batch_inputs(packed)
        .into_iter()
        .map(|name| batch.get(name).map(|t| (name, t)).ok_or_else(|| anyhow!("a batch has no {name}")))
        .collect::<Result<_>>()?;
    Ok((0..count)
        .map(|k| {
            arrays
                .iter()
                .map(|(name, t)| {
                    let row_bytes = t.data.len() / rows.max(1);
                    let mut dims = t.dims.clone();
                    dims[0] = (rows / count) as i64;
                    let data: Vec<u8> = (k..rows)
                        .step_by(count)
                        .flat_map(|r| &t.data[r * row_bytes..(r + 1) * row_bytes])
                        .copied()
                        .collect();
                    (name.to_string(), HostTensor::new(t.ty, &dims, data))
                })
                .collect()
        })
        .collect())
}
