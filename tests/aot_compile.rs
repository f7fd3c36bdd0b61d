//! Compiling for hardware this machine does not have: a sharded training step of a 2-layer MLP
//! (loss and gradients; weights sharded over `fsdp`, the batch over `data` and `fsdp`) on the
//! mesh the configuration derives for the target, compiled for two A3 Mega hosts (16 H100),
//! two v5e-256 slices (512 chips) and 8 CPU devices. Each executable must serialize, report
//! its memory, and take the per-device (sharded) argument shapes.
//!
//! The GPU and TPU plugins are downloaded on first use (~180 and ~130 MB): those tests need the
//! network, and skip only as `skip_offline` (tests/common/provision.rs) allows.

use std::time::Instant;

use crate::common::provision::provisioned;

use maxrs::aot::topology::{lookup, GpuTarget};
use maxrs::aot::{target_config, CompileTarget};
use maxrs::autodiff::value_and_grad;
use maxrs::config;
use maxrs::host::DType;
use maxrs::ir::{Program, Signature};
use maxrs::pjrt::provision::resolve_plugin;
use maxrs::sharding::{Mesh, PartitionSpec};
use maxrs::tensor::trace;

const EMBED: i64 = 512;
const MLP: i64 = 1024;
const PER_DEVICE_BATCH: i64 = 2;

/// Loss and gradients of `mean((tanh(x w1) w2 - x)^2)`.
fn mlp_step(mesh: Mesh) -> Program {
    let batch = PER_DEVICE_BATCH * mesh.size() as i64;
    let mut sig = Signature::new(Some(mesh));
    let rows = PartitionSpec::new(&[&["fsdp"], &[]]);
    let columns = PartitionSpec::new(&[&[], &["fsdp"]]);
    sig.input("x", DType::F32, &[batch, EMBED]).sharded(PartitionSpec::new(&[&["data", "fsdp"], &[]]));
    sig.input("params.w1", DType::F32, &[EMBED, MLP]).sharded(rows.clone());
    sig.input("params.w2", DType::F32, &[MLP, EMBED]).sharded(columns.clone());
    sig.output_sharding("grad.w1", rows).output_sharding("grad.w2", columns);
    trace(&sig, |_, inp| {
        let x = inp["x"].clone();
        let (loss, grads) = value_and_grad(&inp.subtree("params"), |p| {
            (&x.matmul(&p["w1"]).tanh().matmul(&p["w2"]) - &x).square().mean_all()
        });
        grads.prefixed("grad").with("loss", loss)
    })
    .expect("traces")
}

/// The mesh MaxText's defaults give the target (`dcn_data_parallelism=-1` over hosts or
/// slices, `ici_fsdp_parallelism=-1` within them), laid out on the target's devices.
fn target_mesh(target: &CompileTarget) -> Mesh {
    let cfg = config::load(None, &[]).expect("default config");
    let derived = config::validate(&cfg, target.num_devices(), target.granules().len()).expect("valid for the target");
    derived.mesh.physical(target.granules()).expect("mesh fits the target")
}

/// Compiles the step for `name` with `slices` slices and checks the executable; returns it
/// with the target, or `None` when skipped (no network, `MAXRS_TESTS_OFFLINE` set).
fn compile_and_check(name: &str, slices: u32) -> Option<CompileTarget> {
    let topology = lookup(name, slices).unwrap();
    if !provisioned(&topology) {
        return None;
    }
    let started = Instant::now();
    let target = CompileTarget::new(&topology, None).unwrap();
    let setup = started.elapsed();
    let mesh = target_mesh(&target);
    let (data, fsdp) = (mesh.axis_size("data").unwrap() as i64, mesh.axis_size("fsdp").unwrap() as i64);
    assert_eq!((data * fsdp) as usize, topology.num_devices() as usize);
    let program = mlp_step(mesh);
    let started = Instant::now();
    let executable = target.compile(&program).unwrap();
    let compile = started.elapsed();
    let serialized = executable.serialize().unwrap();
    println!(
        "{name} x{slices} ({} devices): target set-up {setup:.2?}, compile {compile:.2?}, serialized {} bytes",
        target.num_devices(),
        serialized.len()
    );
    assert!(!serialized.is_empty());

    let f32 = DType::F32;
    let signature = executable.signature().unwrap();
    let batch = PER_DEVICE_BATCH * data * fsdp;
    let expected =
        vec![(f32, vec![batch / (data * fsdp), EMBED]), (f32, vec![EMBED / fsdp, MLP]), (f32, vec![MLP, EMBED / fsdp])];
    assert_eq!(signature.parameters, expected, "per-device argument shapes on {name}");

    let report = target.memory_report(&executable).unwrap();
    println!("{report}");
    let stats = report.stats;
    let sharded: i64 = expected.iter().map(|(_, dims)| 4 * dims.iter().product::<i64>()).sum();
    // Layout padding (TPU tiles) may add to the sharded bytes, never reach the unsharded ones.
    assert!(stats.argument_bytes >= sharded && stats.argument_bytes < sharded * fsdp, "{stats:?}");
    assert!(stats.output_bytes > 0 && stats.temp_bytes >= 0, "{stats:?}");
    report.check().unwrap();
    Some(target)
}

#[test]
fn a3mega_2_compiles_for_16_h100_on_two_hosts() {
    let Some(target) = compile_and_check("a3mega-2", 1) else { return };
    assert_eq!(target.platform_name(), "cuda");
    assert_eq!(target.granules(), [(0..8).collect::<Vec<i64>>(), (8..16).collect()]);
    assert_eq!(target.memory_bytes_per_device(), Some(GpuTarget::H100Sxm.memory_bytes()));
}

#[test]
fn v5e_256_compiles_for_two_slices_of_256_chips() {
    let Some(target) = compile_and_check("v5e-256", 2) else { return };
    assert_eq!(target.platform_name(), "tpu");
    let granules = target.granules();
    assert_eq!(granules.len(), 2);
    assert_eq!(granules[0], (100_000..100_256).collect::<Vec<i64>>());
    assert_eq!(granules[1], (200_000..200_256).collect::<Vec<i64>>());
    let memory = target.memory_bytes_per_device().unwrap();
    assert!(memory > 15 << 30 && memory <= 16 << 30, "v5e HBM as libtpu reports it: {memory}");
}

#[test]
fn cpu_8_compiles_on_a_client() {
    let target = compile_and_check("cpu-8", 1).expect("the CPU plugin is always provisioned");
    assert_eq!(target.platform_name(), "cpu");
    assert_eq!(target.granules(), [(0..8).collect::<Vec<i64>>()]);
    assert_eq!(target.memory_bytes_per_device(), None);
}

#[test]
fn a_mesh_that_does_not_match_the_target_is_refused() {
    let target = CompileTarget::new(&lookup("cpu-8", 1).unwrap(), None).unwrap();
    let err = target.compile(&mlp_step(Mesh::new(&[("data", 1), ("fsdp", 4)]))).err().unwrap().to_string();
    assert!(err.contains("mesh has 4 devices, but `cpu-8` has 8"), "{err}");
    let elsewhere = Mesh::hybrid(&["data", "fsdp"], &[1, 8], &[1, 1], &[(100..108).collect()]).unwrap();
    let err = target.compile(&mlp_step(elsewhere)).err().unwrap().to_string();
    assert!(err.contains("device id 100 is not a device of the target") && err.contains("0..=7"), "{err}");
    let err = CompileTarget::new(&lookup("v5e-8", 1).unwrap(), Some("cuda12")).err().unwrap().to_string();
    assert!(err.contains("`v5e-8` is a tpu target, but plugin `cuda12` compiles for cuda; use `tpu`"), "{err}");
}

#[test]
fn the_cuda_plugin_describes_the_catalog_gpus() {
    let topology = lookup("a3ultra-1", 1).unwrap();
    if !provisioned(&topology) {
        return;
    }
    let plugin = resolve_plugin(Some("cuda12")).unwrap().path;
    for target in [GpuTarget::H100Sxm, GpuTarget::H200] {
        let text = target_config::gpu_target_config(&plugin, target, None).unwrap().text;
        assert!(text.contains(&format!("device_memory_size: {}\n", target.memory_bytes())), "{text}");
        assert!(text.contains(&format!("device_description_str: \"{}\"", target.device_kind())), "{text}");
    }
}

#[test]
fn the_plugins_describe_every_family_as_the_catalog_does() {
    let names = [
        ("a3-1", 2),
        ("a3ultra-2", 1),
        ("h100-1", 1),
        ("h100-8", 1),
        ("cpu-4", 1),
        ("v4-8", 1),
        ("v4-128", 2),
        ("v5e-1", 1),
        ("v5e-16", 1),
        ("v5p-8", 1),
        ("v5p-1024", 1),
        ("v6e-8", 1),
        ("v6e-256", 4),
    ];
    for (name, slices) in names {
        let topology = lookup(name, slices).unwrap();
        if !provisioned(&topology) {
            continue;
        }
        let started = Instant::now();
        let target = CompileTarget::new(&topology, None).unwrap_or_else(|e| panic!("{name} x{slices}: {e:#}"));
        println!(
            "{name} x{slices}: {} devices in {} groups, {:?} bytes each, {} {} ({:.2?})",
            target.num_devices(),
            target.granules().len(),
            target.memory_bytes_per_device(),
            target.platform_name(),
            target.platform_version().lines().next().unwrap_or(""),
            started.elapsed()
        );
        assert_eq!(target.num_devices(), topology.num_devices() as usize);
    }
}
