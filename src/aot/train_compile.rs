//! `maxrs train-compile`'s job (MaxText's `train_compile.py`): the train step `maxrs train` would
//! run, traced from the same config, compiled for `compile_topology` without its hardware; the
//! per-device memory printed and checked against the target's memory; and, with
//! `compiled_trainstep_file`, saved with the header `maxrs train` checks before loading it.

use std::path::Path;
use std::time::Instant;

use anyhow::{anyhow, bail, Result};

use super::compile::{check_plugin, CompileTarget};
use super::memory::MemoryReport;
use super::topology::{self, Platform, Topology};
use crate::config::{self, escape, Config, Hardware, Resolved, Source};
use crate::lower::to_stablehlo;
use crate::model::kernel::{describe, AttentionImpl};
use crate::pjrt::gpu_memory::GpuAllocator;
use crate::pjrt::Plugin;
use crate::runtime::artifact;
use crate::train::pipeline::{aot::PipelineMemory, PipelineStep, Schedule};
use crate::train::step::TrainStep;

/// What a compile produced.
#[derive(Debug)]
pub struct CompileSummary {
    /// The target's name as looked up (`a3mega-2`, `v5e-256 x 2 slices`).
    pub target: String,
    pub num_devices: usize,
    /// Plugin load and target description.
    pub setup_seconds: f64,
    /// Validating the config and tracing the step (lowering is part of the compile).
    pub trace_seconds: f64,
    pub compile_seconds: f64,
    pub memory: CompiledMemory,
    pub serialized_bytes: usize,
}

impl CompileSummary {
    /// The closing line: `compiled [what ]for TARGET (N devices): ...` with the times and the
    /// size of the `bytes_of` (executable or executables).
    fn print(&self, what: &str, bytes_of: &str) {
        let what = if what.is_empty() { String::new() } else { format!("{what} ") };
        println!(
            "compiled {what}for {} ({} devices): set-up {:.2} s, trace {:.3} s, compile {:.2} s, {bytes_of} {} bytes",
            self.target,
            self.num_devices,
            self.setup_seconds,
            self.trace_seconds,
            self.compile_seconds,
            self.serialized_bytes
        );
    }
}

/// The memory a compiled step needs per device.
#[derive(Debug)]
pub enum CompiledMemory {
    /// The one-executable step.
    Step(MemoryReport),
    /// Each stage of a pipelined step, under its schedule.
    Pipeline(PipelineMemory),
}

/// Compiles the train step of `c` for `c.compile_topology` (with
/// `compile_topology_num_slices`); writes `c.compiled_trainstep_file` when set. Fails, after
/// printing the memory table, when the step does not fit a device of the target.
pub fn train_compile(c: &Config) -> Result<CompileSummary> {
    if c.compile_topology.is_empty() {
        bail!("compile_topology=NAME (or --topology=NAME) is required; `maxrs topologies` lists the targets");
    }
    // What the step computes may depend on the hardware (MaxText's autoselected attention):
    // it is the target's, whatever the machine compiling it is. (The platform does not depend on
    // the number of slices, which is checked with the other keys below.)
    let target_kind = topology::lookup(&c.compile_topology, 1)?;
    if !c.gpu_target_config.is_empty() && target_kind.platform != Platform::Cuda {
        bail!(
            "gpu_target_config={:?} describes the GPU of a deviceless CUDA compile, but compile_topology={} is not a \
             GPU target; unset gpu_target_config, or give a GPU topology (`maxrs topologies` lists them)",
            c.gpu_target_config,
            c.compile_topology
        );
    }
    let (hardware, plugin) = target_settings(c, &target_kind);
    check_plugin(&target_kind, &plugin)?;
    let c = &Config { hardware, plugin, ..c.clone() };
    if target_kind.platform == Platform::Cuda {
        // The run's allocator settings decide what fits: a bad one is refused before the compile.
        GpuAllocator::from_env()?;
    }
    // Before any download or compile: the keys on their own, and the files read and written.
    config::check(c)?;
    crate::output::check_paths(c, crate::output::Command::TrainCompile)?;
    // The config checks ask for compile_topology_num_slices >= 1 with compile_topology.
    let slices = c.compile_topology_num_slices.max(1) as u32;
    let t = Instant::now();
    let topology = topology::lookup(&c.compile_topology, slices)?;
    crate::pjrt::xla_flags::apply_flags_file(&c.xla_flags_file, topology.num_hosts())?;
    let description = (!c.gpu_target_config.is_empty()).then(|| Path::new(&c.gpu_target_config));
    let target = CompileTarget::with_gpu_description(&topology, Some(&c.plugin), description)?;
    if let Some(source) = target.gpu_description() {
        println!("GPU description ({}): {source}", topology.device_kind);
    }
    let setup_seconds = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let derived = config::validate(c, target.num_devices(), target.granules().len())?;
    let mesh = derived.mesh.step_mesh(target.granules())?;
    if let Some(plan) = &derived.pipeline {
        let mesh = mesh.ok_or_else(|| anyhow!("a pipeline needs a mesh"))?;
        let step = PipelineStep::new(c, &derived, mesh)?;
        derived.print_summary(step.model.num_params());
        let schedule = Schedule::new(plan);
        schedule.simulate(|_, _| 1.0).map_err(|e| anyhow!("pipeline_schedule={}: {e}", plan.schedule))?;
        let trace_seconds = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let devices = artifact::describe_devices(
            topology.num_hosts() as usize,
            topology.devices_per_host as usize,
            topology.device_kind,
        );
        let compiled = super::pipeline::train_compile(c, &target, &step, &schedule, devices)?;
        let summary = CompileSummary {
            target: topology.name.clone(),
            num_devices: target.num_devices(),
            setup_seconds,
            trace_seconds,
            compile_seconds: t.elapsed().as_secs_f64(),
            memory: CompiledMemory::Pipeline(compiled.memory),
            serialized_bytes: compiled.serialized_bytes,
        };
        summary.print(&format!("{} pipeline programs", compiled.programs), "executables");
        return Ok(summary);
    }
    let step = TrainStep::new(c, &derived, mesh)?;
    derived.print_summary(step.model.num_params());
    if let Some(line) = step.model.lora_summary() {
        println!("{line}");
    }
    println!("{}", describe(c, step.model.config.attention));
    let program = step.train_step().map_err(|e| anyhow!("tracing the train step: {e}"))?;
    let judged = gpu_run_step(c, &step)
        .map(|gpu| gpu.train_step().map_err(|e| anyhow!("tracing the cuDNN-attention train step: {e}")))
        .transpose()?;
    let trace_seconds = t.elapsed().as_secs_f64();

    let t = Instant::now();
    let mlir = to_stablehlo(&program);
    let executable = target.compile_lowered(&program, &mlir)?;
    let memory = target.memory_report(&executable)?;
    let memory = match judged {
        None => memory,
        Some(gpu) => {
            println!("memory of the saved step (blockwise attention):\n{memory}");
            let judged = target.memory_report(&target.compile_lowered(&gpu, &to_stablehlo(&gpu))?)?;
            println!(
                "memory of the step a run on the GPU compiles (cuDNN's attention, whose workspaces XLA sizes only on a \
                 GPU: not counted), which decides whether the run fits:"
            );
            judged
        }
    };
    let compile_seconds = t.elapsed().as_secs_f64();
    memory.check()?; // the error shows the table
    println!("{memory}");

    let bytes = executable.serialize()?;
    if !c.compiled_trainstep_file.is_empty() {
        let path = Path::new(&c.compiled_trainstep_file);
        let plugin = Plugin::load(&target.plugin().path)?;
        let mut header = artifact::header(
            c,
            &step.model,
            &program,
            &mlir,
            artifact::Platform {
                devices: artifact::describe_devices(
                    topology.num_hosts() as usize,
                    topology.devices_per_host as usize,
                    topology.device_kind,
                ),
                num_devices: target.num_devices(),
                plugin: artifact::plugin_identity(&plugin),
                platform_version: target.platform_version().to_string(),
                build: target.plugin().build(),
            },
        );
        header.device_ids_per_host = target.granules().to_vec();
        artifact::write(path, &header, &bytes)?;
        println!("wrote the compiled train step to {} ({} bytes)", path.display(), bytes.len());
    }
    let summary = CompileSummary {
        target: topology.name.clone(),
        num_devices: target.num_devices(),
        setup_seconds,
        trace_seconds,
        compile_seconds,
        memory: CompiledMemory::Step(memory),
        serialized_bytes: bytes.len(),
    };
    summary.print("", "executable");
    Ok(summary)
}

/// The step a run on the target's GPUs compiles, when it is not `step`: with cuDNN's attention
/// (`attention=cudnn_flash_te|cudnn_flash_jax`), which a deviceless compile cannot hold
/// (`model::kernel::cudnn_declined`), so that `step` has blockwise attention instead. The memory
/// verdict is this program's: the one the run executes when it compiles on its GPUs.
fn gpu_run_step(c: &Config, step: &TrainStep) -> Option<TrainStep> {
    let on_gpu = AttentionImpl::for_config(&Config { compile_topology: String::new(), ..c.clone() });
    let (AttentionImpl::Cudnn { .. }, AttentionImpl::Blockwise { .. }) = (on_gpu, step.model.config.attention) else {
        return None;
    };
    let mut gpu = step.clone();
    gpu.model.config.attention = on_gpu;
    Some(gpu)
}

/// The `hardware` and `plugin` a compile for `target` uses. The target decides the hardware, as
/// in MaxText, whose `train_compile.py` takes the devices' platform from `compile_topology`
/// whatever `hardware` says (`get_topology_mesh` in
/// `src/maxtext/trainers/pre_train/train_compile.py`, main at 03bf39d): `hardware` stays only
/// when it names the target's kind (`gpu` or `gpu_multiprocess` for a GPU). `plugin` defaults
/// to the CPU plugin for `maxrs train`, so for another platform's target the catalog names the
/// plugin unless the user picked another (e.g. cuda13).
fn target_settings(c: &Config, target: &Topology) -> (Hardware, String) {
    let hardware = match (c.hardware, target.platform) {
        (Hardware::Gpu | Hardware::GpuMultiprocess, Platform::Cuda) => c.hardware,
        (_, Platform::Cuda) => Hardware::Gpu,
        (_, Platform::Tpu) => Hardware::Tpu,
        (_, Platform::Cpu) => Hardware::Cpu,
    };
    let plugin = if c.plugin == "cpu" { target.plugin.as_str().to_string() } else { c.plugin.clone() };
    (hardware, plugin)
}

/// Applies the target's `hardware` and `plugin` ([`target_settings`]) to a resolved
/// `train-compile` command line, recording `compile_topology=NAME` as their source (shown by
/// `--print-config`). A `hardware=` on the command line that names other hardware than the
/// target's is an error naming both: the user asked for two things. A config file's `hardware`
/// gives way: it is a run setting for the machine the file was written for (MaxText's base.yml
/// says `tpu`), not a choice of compile target.
pub fn apply_target(resolved: &mut Resolved) -> Result<()> {
    let c = &resolved.config;
    if c.compile_topology.is_empty() {
        return Ok(());
    }
    let target = topology::lookup(&c.compile_topology, 1)?;
    let (hardware, plugin) = target_settings(c, &target);
    let origin = Source::Setting(format!("compile_topology={}", escape(&c.compile_topology)));
    if hardware != c.hardware {
        if *resolved.source("hardware") == Source::CommandLine {
            bail!(
                "hardware={} and compile_topology={} disagree: {} is a {} target, compiled as hardware={hardware}; \
                 leave hardware out, or set hardware={hardware}",
                c.hardware,
                escape(&c.compile_topology),
                target.name,
                target.platform
            );
        }
        resolved.config.hardware = hardware;
        resolved.set_source("hardware", origin.clone());
    }
    if plugin != resolved.config.plugin {
        resolved.config.plugin = plugin;
        resolved.set_source("plugin", origin);
    }
    Ok(())
}
