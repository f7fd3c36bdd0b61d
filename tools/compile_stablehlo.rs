//! `cargo run --release --example compile_stablehlo -- FILE.mlir topology=NAME [key=value ...]`:
//! compiles a StableHLO module lowered elsewhere (MaxText's train step from
//! `tools/maxtext_memory.py`, or any JAX `Lowered.as_text()`) for a catalog target without its
//! hardware, through the same deviceless path, plugin, XLA flags and GPU description as
//! `maxrs train-compile` (`aot::CompileTarget`), and prints XLA's per-device memory report in
//! train-compile's table (issue 46: MaxText's step and maxrs's side by side, `tools/maxtext-memory`).
//!
//! Keys: `topology=NAME` (required; `maxrs topologies` lists them), `num_slices=N`,
//! `xla_flags_file=NAME|FILE` (as train-compile's key: `a3mega` picks the set for the target's
//! hosts), `plugin=NAME|PATH`, `gpu_target_config=FILE`. `FILE.mlir` must be partitioned for the
//! target's device count (`mhlo.num_partitions`). With `--shape` and no file it prints the
//! target's `DEVICES HOSTS` (what the lowering needs) and compiles nothing.
//! `XLA_FLAGS=--xla_dump_to=DIR` dumps the compile (`*buffer-assignment.txt`: the live buffers).

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use maxrs::aot::{topology, CompileTarget};
use maxrs::pjrt::xla_flags::apply_flags_file;

const USAGE: &str = "usage: compile_stablehlo FILE.mlir topology=NAME [num_slices=N] [xla_flags_file=NAME|FILE] \
                     [plugin=NAME|PATH] [gpu_target_config=FILE] | compile_stablehlo --shape topology=NAME [num_slices=N]";

#[derive(Default)]
struct Args {
    file: Option<String>,
    shape: bool,
    topology: String,
    num_slices: u32,
    xla_flags_file: String,
    plugin: Option<String>,
    gpu_target_config: Option<String>,
}

fn parse(args: impl Iterator<Item = String>) -> Result<Args> {
    let mut parsed = Args { num_slices: 1, ..Args::default() };
    for arg in args {
        match arg.split_once('=') {
            Some(("topology", v)) => parsed.topology = v.to_string(),
            Some(("num_slices", v)) => {
                parsed.num_slices =
                    v.parse().ok().filter(|n| *n > 0).ok_or_else(|| anyhow!("num_slices={v}: a positive integer"))?
            }
            Some(("xla_flags_file", v)) => parsed.xla_flags_file = v.to_string(),
            Some(("plugin", v)) => parsed.plugin = Some(v.to_string()),
            Some(("gpu_target_config", v)) => parsed.gpu_target_config = Some(v.to_string()),
            Some((key, _)) => bail!(
                "unknown key `{key}`: valid are topology, num_slices, xla_flags_file, plugin, gpu_target_config\n{USAGE}"
            ),
            None if arg == "--shape" => parsed.shape = true,
            None if parsed.file.is_none() && !arg.starts_with('-') => parsed.file = Some(arg),
            None => bail!("unexpected argument `{arg}`\n{USAGE}"),
        }
    }
    if parsed.topology.is_empty() {
        bail!("topology=NAME is required (`maxrs topologies` lists the targets)\n{USAGE}");
    }
    if parsed.file.is_none() != parsed.shape {
        bail!("give either FILE.mlir or --shape\n{USAGE}");
    }
    Ok(parsed)
}

/// `mhlo.num_partitions` of the module's header (JAX writes it on every lowered module).
fn num_partitions(mlir: &str) -> Option<usize> {
    let header = mlir.lines().find(|l| l.trim_start().starts_with("module"))?;
    let rest = &header[header.find("mhlo.num_partitions = ")? + "mhlo.num_partitions = ".len()..];
    rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

fn main() -> Result<()> {
    let args = parse(std::env::args().skip(1))?;
    let target = topology::lookup(&args.topology, args.num_slices)?;
    if args.shape {
        println!("{} {}", target.num_devices(), target.num_hosts());
        return Ok(());
    }
    let file = args.file.expect("parse requires a file without --shape");
    let mlir = std::fs::read_to_string(&file).with_context(|| format!("reading the StableHLO module {file}"))?;
    let partitions = num_partitions(&mlir).unwrap_or(1);
    if partitions != target.num_devices() as usize {
        bail!(
            "{file} is partitioned for {partitions} devices (mhlo.num_partitions), but `{}` has {}: lower it for {} \
             devices",
            target.name,
            target.num_devices(),
            target.num_devices()
        );
    }
    apply_flags_file(&args.xla_flags_file, target.num_hosts())?;
    let compiler = CompileTarget::with_gpu_description(
        &target,
        args.plugin.as_deref(),
        args.gpu_target_config.as_deref().map(Path::new),
    )?;
    if let Some(source) = compiler.gpu_description() {
        println!("GPU description ({}): {source}", target.device_kind);
    }
    let start = std::time::Instant::now();
    let executable = compiler.compile_module(&mlir)?;
    println!(
        "compiled {file} for {} ({} devices) in {:.1} s",
        target.name,
        target.num_devices(),
        start.elapsed().as_secs_f64()
    );
    println!("{}", compiler.memory_report(&executable)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_partition_count_of_a_jax_module_header() {
        let jax = "#loc = loc(unknown)\nmodule @jit_train_step attributes {mhlo.num_partitions = 16 : i32, \
                   mhlo.num_replicas = 1 : i32} {\n}";
        assert_eq!(num_partitions(jax), Some(16));
        assert_eq!(num_partitions("module @m {\n}"), None);
    }

    /// `jax.jit(lambda x, y: (x * 2.0, jnp.sum(y)), in_shardings=P("fsdp") both,
    /// donate_argnums=0)` on two f32[8,4], lowered by JAX 0.12.0.1 for `cuda` over a 2-device
    /// mesh (`.trace(...).lower(lowering_platforms=("cuda",)).as_text()`, locations dropped).
    const JAX_MODULE: &str = r#"module @jit__lambda attributes {mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["fsdp"=2]> {stablehlo.mesh = {axes = [{name = "fsdp", size = 2 : i64}]}}
  func.func public @main(%arg0: tensor<8x4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"fsdp"}, {}]>, tf.aliasing_output = 0 : i32}, %arg1: tensor<8x4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"fsdp"}, {}]>}) -> (tensor<8x4xf32> {jax.result_info = "result[0]", sdy.sharding = #sdy.sharding<@mesh, [{"fsdp"}, {}]>}, tensor<f32> {jax.result_info = "result[1]", sdy.sharding = #sdy.sharding<@mesh, []>}) {
    %cst = stablehlo.constant dense<2.000000e+00> : tensor<f32>
    %0 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<8x4xf32>
    %1 = stablehlo.multiply %arg0, %0 : tensor<8x4xf32>
    %cst_0 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %2 = stablehlo.reduce(%arg1 init: %cst_0) applies stablehlo.add across dimensions = [0, 1] : (tensor<8x4xf32>, tensor<f32>) -> tensor<f32>
    return %1, %2 : tensor<8x4xf32>, tensor<f32>
  }
}"#;

    /// A JAX module compiles as the SPMD program it says: each device holds half of each
    /// argument (2 x 4 x 4 x 4 bytes) and writes its half of `x * 2` into the donated `x`.
    #[test]
    fn a_jax_module_is_partitioned_and_its_donation_kept() {
        assert_eq!(num_partitions(JAX_MODULE), Some(2));
        let target = CompileTarget::new(&topology::lookup("cpu-2", 1).unwrap(), None).unwrap();
        let report = target.memory_report(&target.compile_module(JAX_MODULE).unwrap()).unwrap();
        assert_eq!(report.stats.argument_bytes, 2 * 4 * 4 * 4, "{report}");
        assert_eq!(report.stats.alias_bytes, 4 * 4 * 4, "{report}");
    }

    #[test]
    fn a_missing_topology_or_an_unknown_key_is_named() {
        let args = |v: &[&str]| parse(v.iter().map(|s| s.to_string()));
        assert!(args(&["m.mlir"]).err().unwrap().to_string().starts_with("topology=NAME is required"));
        let err = args(&["m.mlir", "topology=h100-1", "flags=x"]).err().unwrap().to_string();
        assert!(err.starts_with("unknown key `flags`: valid are topology"), "{err}");
        assert!(args(&["--shape", "topology=a3mega-2"]).unwrap().shape);
        assert!(args(&["m.mlir", "--shape", "topology=a3mega-2"]).is_err());
    }
}
