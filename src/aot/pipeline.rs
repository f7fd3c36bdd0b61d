//! `maxrs train-compile` for a pipelined step: every stage's programs compiled for the target's
//! devices of that stage, each stage's memory printed and checked, and the executables saved
//! with the schedule in one file (`train::pipeline::aot` reads it back).

use std::path::Path;

use anyhow::{Context, Result};

use super::compile::CompileTarget;
use crate::config::Config;
use crate::runtime::artifact::{self, Platform};
use crate::train::pipeline::aot::{header, lowered, stage_memory, PipelineMemory};
use crate::train::pipeline::executor::program_names;
use crate::train::pipeline::{PipelineStep, Schedule, StagePrograms};

/// What `maxrs train-compile` produced for a pipelined step.
#[derive(Debug)]
pub struct PipelineCompile {
    pub memory: PipelineMemory,
    pub serialized_bytes: usize,
    pub programs: usize,
}

/// Compiles every stage of `step` for `target`, prints and checks the memory, and writes
/// `compiled_trainstep_file` when set.
pub fn train_compile(
    c: &Config,
    target: &CompileTarget,
    step: &PipelineStep,
    schedule: &Schedule,
    devices: String,
) -> Result<PipelineCompile> {
    let programs: Vec<StagePrograms> =
        (0..step.layout.stages).map(|s| step.stage_programs(s)).collect::<Result<_>>()?;
    let lowered = lowered(step, &programs);
    let mut executables = Vec::new();
    for (name, program, mlir) in &lowered {
        executables.push(target.compile_part_lowered(program, mlir).with_context(|| format!("compiling {name}"))?);
    }
    let mut stages = Vec::new();
    let mut offset = 0;
    for (stage, p) in programs.iter().enumerate() {
        let count = program_names(stage, &step.layout).len();
        let stats = executables[offset..offset + count]
            .iter()
            .map(|e| e.compiled_memory_stats())
            .collect::<Result<Vec<_>, _>>()?;
        stages.push(stage_memory(stage, p, &stats, schedule)?);
        offset += count;
    }
    let memory = PipelineMemory {
        schedule: schedule.name.clone(),
        stages,
        capacity: target.usable_bytes_per_device()?,
        device: format!("{} ({})", target.topology().name, target.topology().device_kind),
    };
    memory.check()?;
    println!("{memory}");

    let serialized: Vec<Vec<u8>> = executables.iter().map(|e| e.serialize()).collect::<Result<_, _>>()?;
    let total: usize = serialized.iter().map(Vec::len).sum();
    if !c.compiled_trainstep_file.is_empty() {
        let path = Path::new(&c.compiled_trainstep_file);
        let plugin = crate::pjrt::Plugin::load(&target.plugin().path)?;
        let topology = target.topology();
        let lengths: Vec<u64> = serialized.iter().map(|b| b.len() as u64).collect();
        let platform = Platform {
            devices,
            num_devices: target.num_devices(),
            plugin: artifact::plugin_identity(&plugin),
            platform_version: target.platform_version().to_string(),
            build: target.plugin().build(),
        };
        let mut h = header(c, step, schedule, &lowered, &lengths, platform);
        h.device_ids_per_host = target.granules().to_vec();
        artifact::write(path, &h, &serialized.concat())?;
        println!(
            "wrote the compiled pipeline ({} programs, {} schedule) to {} ({total} bytes)",
            lowered.len(),
            topology.name,
            path.display()
        );
    }
    Ok(PipelineCompile { memory, serialized_bytes: total, programs: lowered.len() })
}
