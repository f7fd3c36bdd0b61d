//! Sharding: mesh device order, MaxText's logical axis rules, host shard splitting, and a
//! sharded training step on 8 CPU devices (data, fsdp and tensor parallel specs, constraints
//! inside a scanned layer stack, donated parameters) that must give the numbers of 1 device.

use crate::common::{max_rel_diff, rng, run, uniform};
use maxrs::autodiff::value_and_grad_with_aux;
use maxrs::host::HostTensor;
use maxrs::host::{assemble, shard};
use maxrs::ir::{DType, Program, Signature};
use maxrs::lower::to_stablehlo;
use maxrs::sharding::{Mesh, PartitionSpec};
use maxrs::tensor::{scan, trace, Tree};

#[test]
fn hybrid_mesh_keeps_ici_axes_within_a_host() {
    // 2 hosts x 4 devices; "data" spans hosts (DCN), "fsdp" stays inside one (ICI).
    let hosts = vec![vec![10, 11, 12, 13], vec![20, 21, 22, 23]];
    let mesh = Mesh::hybrid(&["data", "fsdp"], &[1, 4], &[2, 1], &hosts).unwrap();
    assert_eq!(mesh.axes(), &[("data".to_string(), 2), ("fsdp".to_string(), 4)]);
    assert_eq!(mesh.device_ids(), &[10, 11, 12, 13, 20, 21, 22, 23]);
    // DCN factor is the major one within an axis: data=2x2 over 2 hosts of 2x2 devices.
    let hosts = vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]];
    let mesh = Mesh::hybrid(&["data", "tensor"], &[2, 2], &[2, 1], &hosts).unwrap();
    assert_eq!(mesh.device_ids(), &[0, 1, 2, 3, 4, 5, 6, 7]);
    let mesh = Mesh::hybrid(&["tensor", "data"], &[2, 2], &[1, 2], &hosts).unwrap();
    assert_eq!(mesh.device_ids(), &[0, 1, 4, 5, 2, 3, 6, 7]);
    assert!(Mesh::hybrid(&["data"], &[4], &[2], &[vec![0, 1, 2, 3]]).is_err());
}

#[test]
fn logical_rules_follow_maxtext() {
    let mesh = Mesh::new(&[("data", 2), ("fsdp", 4), ("tensor", 1), ("expert", 1)]);
    let rules = maxrs::config::logical_rules(&maxrs::config::load(None, &[]).unwrap());
    // Size-1 axes are skipped; an axis used by an earlier dimension is not reused.
    assert_eq!(
        rules.spec(&["activation_batch", "activation_length", "activation_embed"], &mesh),
        PartitionSpec::new(&[&["data", "fsdp"], &[], &[]])
    );
    assert_eq!(rules.spec(&["embed", "mlp"], &mesh), PartitionSpec::new(&[&["fsdp"], &[]]));
    assert_eq!(rules.spec(&["activation_batch", "embed"], &mesh), PartitionSpec::new(&[&["data", "fsdp"], &[]]));
    assert_eq!(rules.spec(&["layers", "unknown"], &mesh), PartitionSpec::new(&[&[], &[]]));
    // Fallback rows: `mlp` (earlier in the table) takes fsdp_transpose, so `embed`'s first row
    // is blocked and its second, [fsdp, context, expert], applies.
    let mesh = Mesh::new(&[("fsdp", 2), ("fsdp_transpose", 2), ("tensor", 2)]);
    assert_eq!(rules.spec(&["embed", "mlp"], &mesh), PartitionSpec::new(&[&["fsdp"], &["fsdp_transpose", "tensor"]]));
    assert_eq!(rules.spec(&["embed"], &mesh), PartitionSpec::new(&[&["fsdp", "fsdp_transpose"]]));
}

#[test]
fn shards_split_and_reassemble() {
    let mesh = Mesh::new(&[("a", 2), ("b", 3)]);
    let spec = PartitionSpec::new(&[&["b"], &[], &["a"]]);
    let values: Vec<f32> = (0..6 * 2 * 4).map(|v| v as f32).collect();
    let global = HostTensor::from_f32(&[6, 2, 4], &values);
    let positions: Vec<usize> = (0..6).collect();
    let shards: Vec<HostTensor> = positions.iter().map(|&p| shard(&global, &mesh, &spec, p).unwrap()).collect();
    assert_eq!(shards[0].dims, vec![2, 2, 2]);
    // Position 1 is a=0, b=1: rows 2..4, columns 0..2 of the last dim.
    assert_eq!(shards[1].to_f32(), vec![16., 17., 20., 21., 24., 25., 28., 29.]);
    assert_eq!(assemble(&shards, &positions, &mesh, &spec, &[6, 2, 4]).unwrap(), global);
    assert!(shard(&HostTensor::from_f32(&[5], &[0.0; 5]), &mesh, &PartitionSpec::new(&[&["b"]]), 0).is_err());
}

const B: i64 = 8;
const E: i64 = 8;
const M: i64 = 16;
const LAYERS: i64 = 2;

fn spec(dims: &[&[&str]]) -> PartitionSpec {
    PartitionSpec::new(dims)
}

/// A training step: a scanned stack of MLP blocks, loss, gradients, SGD update.
fn train_step(mesh: Option<Mesh>) -> Program {
    let sharded = mesh.is_some();
    let mut sig = Signature::new(mesh.clone());
    let rules = maxrs::config::logical_rules(&maxrs::config::load(None, &[]).unwrap());
    let logical = |names: &[&str]| mesh.as_ref().map(|m| rules.spec(names, m));
    let params = [
        ("params.wi", vec![LAYERS, E, M], ["layers", "embed", "mlp"]),
        ("params.wo", vec![LAYERS, M, E], ["layers", "mlp", "embed"]),
    ];
    for (name, dims, names) in &params {
        let input = sig.input(name, DType::F32, dims).donated();
        if let Some(s) = logical(names) {
            input.sharded(s.clone());
            sig.output_sharding(name, s);
        }
    }
    let x = sig.input("x", DType::F32, &[B, E]);
    if sharded {
        x.sharded(spec(&[&["data", "fsdp"], &[]]));
        sig.output_sharding("y", spec(&[&["data", "fsdp"], &["tensor"]]));
    }
    trace(&sig, |_, inp| {
        let x = inp["x"].clone();
        let (loss, aux, grads) = value_and_grad_with_aux(&inp.subtree("params"), |p| {
            let (c, ys) = scan(&Tree::new().with("h", x.clone()), p, |c, w| {
                let act = c["h"].matmul(&w["wi"]).with_sharding_constraint(&spec(&[&["data", "fsdp"], &["tensor"]]));
                let h =
                    (&c["h"] + &act.tanh().matmul(&w["wo"])).with_sharding_constraint(&spec(&[&["data", "fsdp"], &[]]));
                (Tree::new().with("h", h), Tree::new().with("act", act))
            });
            let loss = c["h"].square().mean_all() + ys["act"].mean_all();
            (loss, Tree::new().with("y", c["h"].matmul(&p["wi"].slice_axis(0, 0, 1).squeeze(0))))
        });
        let mut out = Tree::new().with("loss", loss).with("y", aux["y"].clone());
        for (name, g) in grads.iter() {
            out.insert(format!("params.{name}"), &inp[&format!("params.{name}")] - &(g * 0.1));
        }
        out
    })
    .expect("traces")
}

fn host_inputs() -> Tree<HostTensor> {
    let mut r = rng(11);
    let mut t = Tree::new();
    for (name, dims) in [("params.wi", vec![LAYERS, E, M]), ("params.wo", vec![LAYERS, M, E]), ("x", vec![B, E])] {
        let n: i64 = dims.iter().product();
        let v: Vec<f32> = uniform(&mut r, n as usize, -0.5, 0.5).into_iter().map(|x| x as f32).collect();
        t.insert(name, HostTensor::from_f32(&dims, &v));
    }
    t
}

#[test]
fn sharded_step_on_8_devices_matches_one_device() {
    let mesh = Mesh::new(&[("data", 2), ("fsdp", 2), ("tensor", 2)]);
    let sharded = train_step(Some(mesh));
    let single = train_step(None);
    let mlir = to_stablehlo(&sharded);
    assert!(mlir.contains("mhlo.num_partitions = 8 : i32"));
    assert!(
        mlir.contains(r#"sdy.sharding = #sdy.sharding<@mesh, [{}, {"fsdp"}, {"tensor"}]>, tf.aliasing_output"#),
        "{mlir}"
    );
    assert!(mlir.contains("sdy.sharding_constraint"));
    let a = run(&sharded, &host_inputs());
    let b = run(&single, &host_inputs());
    assert_eq!(a.names().collect::<Vec<_>>(), vec!["loss", "params.wi", "params.wo", "y"]);
    for (name, t) in a.iter() {
        let (x, y): (Vec<f64>, Vec<f64>) = (t.to_f64(), b[name].to_f64());
        assert_eq!(t.dims, b[name].dims);
        let err = max_rel_diff(&x, &y);
        assert!(err < 1e-5, "{name}: sharded and single-device results differ by {err:e}");
    }
    // The step moved the parameters.
    assert!(max_rel_diff(&a["params.wi"].to_f64(), &host_inputs()["params.wi"].to_f64()) > 1e-4);
    // Each device's block of each input, as the runtime derives it from the program's shardings
    // and checks arguments against, is the parameter of XLA's partitioned program.
    let compiled = maxrs::runtime::compile(&maxrs::pjrt::cpu_client(8).unwrap(), &sharded).unwrap();
    let partitioned = &compiled.executable.signature().unwrap().parameters;
    assert_eq!(partitioned.len(), sharded.inputs.len());
    for (i, parameter) in partitioned.iter().enumerate() {
        for block in compiled.input_block_shapes(i) {
            assert_eq!(&block, parameter, "input {}", sharded.inputs[i].name);
        }
    }
}

#[test]
fn constraints_are_checked_against_the_mesh_where_written() {
    let mut sig = Signature::new(Some(Mesh::new(&[("data", 2)])));
    sig.input("x", DType::F32, &[4]);
    let bad = spec(&[&["model"]]);
    let line = line!() + 1;
    let err = trace(&sig, |_, i| Tree::new().with("y", i["x"].with_sharding_constraint(&bad))).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("sharding_constraint")
            && msg.contains("\"model\"")
            && msg.contains(&format!("tests/sharding.rs:{line}")),
        "{msg}"
    );
}
