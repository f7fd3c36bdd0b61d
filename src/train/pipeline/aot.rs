//! A pipelined step compiled ahead of time: the memory each stage needs under the schedule, and
//! the file (`compiled_trainstep_file`) with every executable and the schedule: its programs in
//! file order and its header, which `maxrs train-compile` (`aot::pipeline`) writes and
//! [`load`] checks before `maxrs train` runs the executables instead of compiling.
//!
//! A stage's memory per device is its state (parameters, AdamW moments, gradient accumulators:
//! the update program's arguments), plus the saved layer inputs of every microbatch the
//! schedule keeps in flight on it (`Schedule::max_in_flight`: all of them with gpipe, at most
//! `stages - stage` with 1f1b), plus an activation arriving and one leaving, plus the largest
//! program's temporaries and outputs that are not written over its inputs.

use std::fmt;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use indicatif::HumanBytes;

use super::executor::{program_names, StageExecutables};
use super::programs::{PipelineStep, StagePrograms};
use super::schedule::Schedule;
use crate::config::Config;
use crate::ir::Program;
use crate::lower::to_stablehlo;
use crate::pjrt::{Client, CompiledMemoryStats};
use crate::runtime::artifact::{self, ArtifactHeader, PipelineSection, Platform};
use crate::runtime::Compiled;

/// One stage's memory per device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StageMemory {
    pub stage: usize,
    /// Parameters, optimizer state and gradient accumulators.
    pub state_bytes: u64,
    /// Saved layer inputs of one (chunk, microbatch).
    pub residual_bytes: u64,
    /// How many the schedule keeps at once.
    pub in_flight: usize,
    /// One `[microbatch, seq, emb]` activation.
    pub activation_bytes: u64,
    /// The largest temporaries + non-aliased outputs + code of the stage's programs.
    pub transient_bytes: u64,
}

impl StageMemory {
    pub fn needed_bytes(&self) -> u64 {
        self.state_bytes
            + self.residual_bytes * self.in_flight as u64
            + 2 * self.activation_bytes
            + self.transient_bytes
    }
}

/// Every stage's memory against a device's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PipelineMemory {
    pub schedule: String,
    pub stages: Vec<StageMemory>,
    /// What a stage may use of one device: on a GPU the allocator's share under
    /// `XLA_PYTHON_CLIENT_MEM_FRACTION` (see `pjrt::gpu_memory`), else the device's memory.
    pub capacity: Option<u64>,
    pub device: String,
}

impl PipelineMemory {
    /// An error naming the stage, both sizes and the keys that help, when a stage does not fit.
    pub fn check(&self) -> Result<()> {
        let Some(capacity) = self.capacity else { return Ok(()) };
        match self.stages.iter().find(|s| s.needed_bytes() > capacity) {
            Some(s) => bail!(
                "out of memory: pipeline stage {} needs {} per device, but a device of {} may use {} (on a GPU: \
                 raise XLA_PYTHON_CLIENT_MEM_FRACTION, up to 0.95).\n{self}\nTo fit, use pipeline_schedule=1f1b (fewer microbatches in flight than gpipe), lower \
                 per_device_batch_size or raise num_pipeline_microbatches (smaller microbatches), shard inside the \
                 stages (ici_fsdp_parallelism), or use more stages (ici_pipeline_parallelism).",
                s.stage,
                HumanBytes(s.needed_bytes()),
                self.device,
                HumanBytes(capacity)
            ),
            None => Ok(()),
        }
    }
}

impl fmt::Display for PipelineMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = |n: u64| HumanBytes(n).to_string();
        writeln!(f, "memory per device of each pipeline stage on {} ({}):", self.device, self.schedule)?;
        writeln!(
            f,
            "  {:>5} {:>12} {:>26} {:>14} {:>14} {:>12}",
            "stage", "state", "saved activations", "in/out", "temporaries", "needed"
        )?;
        for s in &self.stages {
            let in_flight = format!("{} x {}", s.in_flight, b(s.residual_bytes));
            write!(
                f,
                "  {:>5} {:>12} {:>26} {:>14} {:>14} {:>12}",
                s.stage,
                b(s.state_bytes),
                in_flight,
                b(2 * s.activation_bytes),
                b(s.transient_bytes),
                b(s.needed_bytes())
            )?;
            if let Some(capacity) = self.capacity {
                write!(f, "  ({:.1}% of {})", 100.0 * s.needed_bytes() as f64 / capacity as f64, b(capacity))?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

/// Per-device bytes of a program's input `name` (its global shape cut by its sharding).
fn input_bytes(program: &Program, name: &str) -> Result<u64> {
    let input = program.inputs.iter().find(|i| i.name == name).ok_or_else(|| anyhow!("no input {name}"))?;
    let dims: Vec<i64> = match (&program.mesh, &input.sharding) {
        (Some(mesh), Some(spec)) => mesh.shard_bounds(spec, &input.ty.shape, 0)?.iter().map(|b| b.1).collect(),
        _ => input.ty.shape.to_vec(),
    };
    Ok(dims.iter().product::<i64>() as u64 * input.ty.dtype.byte_size() as u64)
}

/// Stage memory from its programs and their compiled statistics (`stats[k]` of the k-th name
/// of [`program_names`]).
pub fn stage_memory(
    stage: usize,
    programs: &StagePrograms,
    stats: &[CompiledMemoryStats],
    schedule: &Schedule,
) -> Result<StageMemory> {
    let state_bytes = stats.last().map(|s| s.argument_bytes.max(0) as u64).unwrap_or(0);
    // The backward programs read what the forward ones saved.
    let residual_bytes = programs
        .backward
        .iter()
        .map(|b| {
            let saved = input_bytes(b, "residual.layer_inputs")?;
            let cotangent = if b.inputs.iter().any(|i| i.name == "residual.cotangent") {
                input_bytes(b, "residual.cotangent")?
            } else {
                0
            };
            Ok(saved + cotangent)
        })
        .collect::<Result<Vec<u64>>>()?
        .into_iter()
        .max()
        .unwrap_or(0);
    let activation_bytes = match programs.backward.iter().find(|b| b.inputs.iter().any(|i| i.name == "cotangent")) {
        Some(b) => input_bytes(b, "cotangent")?,
        None => 0,
    };
    let transient_bytes = stats
        .iter()
        .map(|s| (s.temp_bytes + s.output_bytes - s.alias_bytes + s.generated_code_bytes).max(0) as u64)
        .max()
        .unwrap_or(0);
    Ok(StageMemory {
        stage,
        state_bytes,
        residual_bytes,
        in_flight: schedule.max_in_flight()[stage],
        activation_bytes,
        transient_bytes,
    })
}

/// The header section describing `schedule` and the executables `names` (with their lengths).
fn section(schedule: &Schedule, executables: Vec<(String, u64)>) -> PipelineSection {
    PipelineSection {
        schedule: format!(
            "{}, {} stages x {} repeats, {} microbatches",
            schedule.name, schedule.stages, schedule.repeats, schedule.microbatches
        ),
        tasks: schedule.per_stage.iter().map(|tasks| tasks.iter().map(|t| t.to_string()).collect()).collect(),
        executables,
    }
}

/// Every stage's programs by name, in file order, with their StableHLO.
pub fn lowered(step: &PipelineStep, programs: &[StagePrograms]) -> Vec<(String, Program, String)> {
    let mut out = Vec::new();
    for (stage, p) in programs.iter().enumerate() {
        let all = p.forward.iter().chain(&p.backward).chain([&p.norm, &p.update]);
        for (name, program) in program_names(stage, &step.layout).into_iter().zip(all) {
            let mlir = to_stablehlo(program);
            out.push((name, program.clone(), mlir));
        }
    }
    out
}

/// The header of a pipelined step's file: the common one (model and training keys, devices,
/// plugin) over every program's arguments, with a fingerprint of all of them.
pub fn header(
    c: &Config,
    step: &PipelineStep,
    schedule: &Schedule,
    lowered: &[(String, Program, String)],
    lengths: &[u64],
    platform: Platform,
) -> ArtifactHeader {
    let combined: String = lowered.iter().map(|(name, _, mlir)| format!("// {name}\n{mlir}\n")).collect();
    let mut h = artifact::header(c, &step.model, &lowered[0].1, &combined, platform);
    h.arguments = lowered
        .iter()
        .flat_map(|(name, program, _)| {
            program.inputs.iter().map(move |input| artifact::ArgumentSpec {
                name: format!("{name}: {}", input.name),
                dtype: input.ty.dtype.to_string(),
                shape: input.ty.shape.to_vec(),
                sharding: input.sharding.as_ref().map_or_else(|| "replicated".to_string(), |s| s.to_string()),
            })
        })
        .collect();
    let executables = lowered.iter().map(|l| l.0.clone()).zip(lengths.iter().copied()).collect();
    h.pipeline = Some(section(schedule, executables));
    h
}

/// Loads the stage executables `maxrs train-compile` saved at `path`, after checking that they
/// were compiled for these programs, this schedule, these devices and this plugin build.
pub fn load(
    c: &Config,
    client: &Client,
    step: &PipelineStep,
    schedule: &Schedule,
    programs: &[StagePrograms],
    granules: &[Vec<i64>],
    path: &Path,
) -> Result<Vec<StageExecutables>> {
    let devices = client.addressable_devices()?;
    let lowered = lowered(step, programs);
    let (saved, bytes) = artifact::read(path)?;
    let Some(section) = &saved.pipeline else {
        bail!(
            "{} holds a step compiled without pipeline parallelism; recompile it with `maxrs train-compile` and this \
             run's settings",
            path.display()
        );
    };
    let lengths: Vec<u64> = section.executables.iter().map(|e| e.1).collect();
    let platform = Platform {
        devices: artifact::describe_devices(granules.len(), devices.len(), &devices[0].kind),
        num_devices: granules.iter().map(Vec::len).sum(),
        plugin: artifact::plugin_identity(client.plugin()),
        platform_version: client.platform_version()?,
        // Not compared: the plugin identity pins the build (`artifact::plugin` chose it).
        build: None,
    };
    let mut current = header(c, step, schedule, &lowered, &lengths, platform);
    current.device_ids_per_host = granules.to_vec();
    artifact::check_matching(path, &saved, &current)?;
    if lengths.iter().sum::<u64>() != bytes.len() as u64 {
        bail!(
            "{} is truncated: its executables add up to {} bytes, the file has {}",
            path.display(),
            lengths.iter().sum::<u64>(),
            bytes.len()
        );
    }
    let mut offset = 0usize;
    let mut by_name = std::collections::HashMap::new();
    for ((name, program, _), len) in lowered.iter().zip(&lengths) {
        let part = &bytes[offset..offset + *len as usize];
        offset += *len as usize;
        let executable = client.deserialize(part).with_context(|| format!("loading {name} from {}", path.display()))?;
        by_name.insert(name.clone(), Compiled::new(program, executable)?);
    }
    println!("loaded the compiled pipeline ({} programs) from {} (no compile)", lowered.len(), path.display());
    (0..step.layout.stages)
        .map(|stage| {
            StageExecutables::build(stage, &step.layout, &programs[stage], |name, _| {
                by_name.remove(name).ok_or_else(|| anyhow!("{} has no program {name}", path.display()))
            })
        })
        .collect()
}
