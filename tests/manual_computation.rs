//! Shardy manual computations (`tensor::manual_computation`, JAX's `shard_map`) executed on 4
//! CPU devices: a body applied to each device's shards gives what the same function gives on one
//! device, values and gradients (the gradient is another manual computation over the same axes,
//! `autodiff::manual`), checked against an f64 reference written here; an operand whole along a
//! manual axis cannot be differentiated (its cotangent would be a sum across devices), which is
//! refused by name. The body's collectives (`all_gather`, `psum_scatter`, `ppermute`,
//! `all_to_all`, `axis_index`, JAX's `lax` collectives with `tiled=True`) move each device's
//! shards as an ndarray reference moves them, and their transposes give the gradient finite
//! differences give.

use crate::common::{f64_tensor, rng, run, uniform};
use maxrs::autodiff::value_and_grad;
use maxrs::host::HostTensor;
use maxrs::ir::{DType, Signature};
use maxrs::lower::to_stablehlo;
use maxrs::sharding::{Mesh, PartitionSpec};
use maxrs::tensor::{manual_computation, trace, Tree};

const ROWS: i64 = 4;
const COLS: i64 = 6;

fn mesh() -> Mesh {
    Mesh::new(&[("data", 2), ("tensor", 2)])
}

fn split() -> PartitionSpec {
    PartitionSpec::new(&[&["data"], &["tensor"]])
}

/// `y = sin(x) * x + s` per device (`s` whole on every device: no gradient asked for it), and
/// `loss = sum(y * w)` with its gradient with respect to `x`.
fn inputs() -> Tree<HostTensor> {
    let mut r = rng(5);
    let n = (ROWS * COLS) as usize;
    Tree::new()
        .with("x", f64_tensor(&[ROWS, COLS], &uniform(&mut r, n, -2.0, 2.0)))
        .with("w", f64_tensor(&[ROWS, COLS], &uniform(&mut r, n, -1.0, 1.0)))
        .with("s", f64_tensor(&[], &[0.25]))
}

#[test]
fn manual_body_on_shards_matches_the_reference_with_its_gradient() {
    let mut sig = Signature::new(Some(mesh()));
    sig.input("x", DType::F64, &[ROWS, COLS]);
    sig.input("w", DType::F64, &[ROWS, COLS]);
    sig.input("s", DType::F64, &[]);
    let program = trace(&sig, |_, inp| {
        let s = inp["s"].stop_gradient();
        let f = |x: &maxrs::tensor::Tensor| {
            let specs = [split(), PartitionSpec::replicated()];
            let y =
                manual_computation(&[x, &s], &specs, &[split()], |local| vec![local[0].sin() * &local[0] + &local[1]]);
            y[0].clone()
        };
        let y = f(&inp["x"]);
        let (_, grads) =
            value_and_grad(&Tree::new().with("x", inp["x"].clone()), |p| (f(&p["x"]) * &inp["w"]).sum_all());
        Tree::new().with("y", y).with("dx", grads["x"].clone())
    })
    .expect("traces");
    let mlir = to_stablehlo(&program);
    assert_eq!(
        mlir.matches("sdy.manual_computation(").count(),
        2,
        "the forward (y and the loss share it) and the backward:\n{mlir}"
    );
    let inp = inputs();
    let got = run(&program, &inp);
    let (x, w, s) = (inp["x"].to_f64(), inp["w"].to_f64(), 0.25);
    for (i, ((&xi, &wi), (yi, dxi))) in
        x.iter().zip(&w).zip(got["y"].to_f64().iter().zip(got["dx"].to_f64())).enumerate()
    {
        let (want_y, want_dx) = (xi.sin() * xi + s, (xi.cos() * xi + xi.sin()) * wi);
        assert!((yi - want_y).abs() < 1e-12, "y[{i}] = {yi}, want {want_y}");
        assert!((dxi - want_dx).abs() < 1e-12, "dx[{i}] = {dxi}, want {want_dx}");
    }
}

#[test]
fn gradient_of_an_operand_whole_along_a_manual_axis_is_refused() {
    let mut sig = Signature::new(Some(mesh()));
    sig.input("x", DType::F64, &[ROWS, COLS]);
    let err = trace(&sig, |_, inp| {
        let (_, grads) = value_and_grad(inp, |p| {
            // Split over `data` only, but `tensor` is manual too (the result names it).
            let (rows_only, both) = (PartitionSpec::new(&[&["data"], &[]]), split());
            manual_computation(&[&p["x"]], &[rows_only], &[both], |l| vec![&l[0] * 2.0])[0].sum_all()
        });
        grads
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("whole along manual axis \"tensor\""), "{err}");
}

/// Collectives in a manual body on 8 devices (`data` 2 x `context` 4, manual over both): each
/// device's results, laid out `[data, context, ..]`, against the shards moved by hand. `x` is
/// `[2, 8, 4]`, split over `data` and `context`: device `(d, c)` holds `x[d, 2c..2c+2, :]`.
fn collectives_program() -> maxrs::ir::Program {
    let mesh = Mesh::new(&[("data", 2), ("context", 4)]);
    let mut sig = Signature::new(Some(mesh));
    sig.input("x", DType::F64, &[2, 8, 4]);
    for (name, dims) in COLLECTIVE_OUTPUTS {
        sig.input(&format!("w_{name}"), DType::F64, &[&[2, 4][..], &dims[..]].concat());
    }
    let per_device = |rank: usize| {
        let rest: Vec<&[&str]> = vec![&[]; rank];
        PartitionSpec::new(&[&[&["data"][..], &["context"][..]][..], &rest[..]].concat())
    };
    let body = |x: &maxrs::tensor::Tensor| {
        let spec = PartitionSpec::new(&[&["data"], &["context"], &[]]);
        let mut outs: Vec<PartitionSpec> = COLLECTIVE_OUTPUTS.iter().map(|(_, d)| per_device(d.len())).collect();
        outs.push(per_device(0));
        manual_computation(&[x], &[spec], &outs, |l| {
            let ring: Vec<(usize, usize)> = (0..4).map(|k| (k, (k + 1) % 4)).collect();
            let at = maxrs::tensor::axis_index;
            let lead = |t: maxrs::tensor::Tensor| {
                let dims = [&[1, 1][..], &t.shape()[1..]].concat();
                t.reshape(&dims)
            };
            vec![
                lead(l[0].all_gather("context", 1)),
                lead(l[0].psum_scatter("context", 2)),
                lead(l[0].ppermute("context", &ring)),
                lead(l[0].all_to_all("context", 2, 1)),
                (at(l[0].trace(), "data") * 10 + at(l[0].trace(), "context")).reshape(&[1, 1]),
            ]
        })
    };
    trace(&sig, |_, inp| {
        let mut ys = body(&inp["x"]);
        let index = ys.pop().expect("the mesh index");
        let loss_of = |ys: &[maxrs::tensor::Tensor]| {
            let terms: Vec<maxrs::tensor::Tensor> = ys
                .iter()
                .zip(COLLECTIVE_OUTPUTS)
                .map(|(y, (name, _))| (y * &inp[&format!("w_{name}")]).sum_all())
                .collect();
            terms.iter().skip(1).fold(terms[0].clone(), |a, b| a + b)
        };
        let (loss, grads) = value_and_grad(&Tree::new().with("x", inp["x"].clone()), |p| loss_of(&body(&p["x"])));
        let mut out = Tree::new().with("loss", loss).with("dx", grads["x"].clone()).with("index", index);
        for (y, (name, _)) in ys.into_iter().zip(COLLECTIVE_OUTPUTS) {
            out.insert(name, y);
        }
        out
    })
    .expect("traces")
}

/// The float results of `collectives_program`, each device's shape after its two leading 1s.
const COLLECTIVE_OUTPUTS: [(&str, [i64; 2]); 4] =
    [("all_gather", [8, 4]), ("psum_scatter", [2, 1]), ("ppermute", [2, 4]), ("all_to_all", [8, 1])];

/// Device `(d, c)`'s shard of `x` (`[2, 8, 4]`) without its leading 1: `x[d, 2c..2c+2, :]`.
fn shard(x: &ndarray::Array3<f64>, d: usize, c: usize) -> ndarray::Array2<f64> {
    x.slice(ndarray::s![d, 2 * c..2 * c + 2, ..]).to_owned()
}

#[test]
fn collectives_move_shards_between_the_devices_of_an_axis() {
    use ndarray::{concatenate, s, Array2, Array3, Axis};
    let program = collectives_program();
    let mlir = to_stablehlo(&program);
    for op in ["all_gather", "reduce_scatter", "collective_permute", "all_to_all", "partition_id"] {
        assert!(mlir.contains(&format!("stablehlo.{op}")), "{op} in:\n{mlir}");
    }
    let mut r = rng(11);
    let x = Array3::from_shape_vec((2, 8, 4), uniform(&mut r, 64, -1.0, 1.0)).unwrap();
    let mut inp = Tree::new().with("x", f64_tensor(&[2, 8, 4], x.as_slice().unwrap()));
    for (name, dims) in COLLECTIVE_OUTPUTS {
        let dims = [&[2, 4][..], &dims[..]].concat();
        let n = dims.iter().product::<i64>() as usize;
        inp.insert(format!("w_{name}"), f64_tensor(&dims, &uniform(&mut r, n, -1.0, 1.0)));
    }
    let got = run(&program, &inp);
    let device = |name: &str, d: usize, c: usize| {
        let t = &got[name];
        let per: usize = t.dims[2..].iter().product::<i64>() as usize;
        let at = (d * 4 + c) * per;
        let (rows, cols) = (t.dims[2] as usize, t.dims[3] as usize);
        Array2::from_shape_vec((rows, cols), t.to_f64()[at..at + per].to_vec()).unwrap()
    };
    for d in 0..2 {
        for c in 0..4 {
            let whole = x.slice(s![d, .., ..]).to_owned();
            assert_eq!(device("all_gather", d, c), whole, "all_gather on ({d}, {c})");
            let sum = (0..4).map(|k| shard(&x, d, k)).fold(Array2::<f64>::zeros((2, 4)), |a, b| a + b);
            let mine = sum.slice(s![.., c..c + 1]).to_owned();
            assert!((device("psum_scatter", d, c) - &mine).iter().all(|e| e.abs() < 1e-12), "psum_scatter ({d}, {c})");
            assert_eq!(device("ppermute", d, c), shard(&x, d, (c + 3) % 4), "ppermute on ({d}, {c})");
            let parts: Vec<Array2<f64>> = (0..4).map(|k| shard(&x, d, k).slice(s![.., c..c + 1]).to_owned()).collect();
            let views: Vec<_> = parts.iter().map(|p| p.view()).collect();
            assert_eq!(device("all_to_all", d, c), concatenate(Axis(0), &views).unwrap(), "all_to_all ({d}, {c})");
        }
    }
    let index: Vec<i32> = got["index"].to_f64().iter().map(|&v| v as i32).collect();
    assert_eq!(index, (0..2).flat_map(|d| (0..4).map(move |c| d * 10 + c)).collect::<Vec<_>>());

    // The gradient (each collective's transpose, in the manual backward) against central
    // differences of the loss, run through the same program.
    let client = crate::common::client();
    let exe = maxrs::runtime::compile(&client, &program).expect("compiles");
    let loss_at = |x: &[f64]| {
        let mut inp = inp.clone();
        inp.insert("x", f64_tensor(&[2, 8, 4], x));
        exe.run(&client, &inp).expect("runs")["loss"].to_f64()[0]
    };
    let (ad, mut xs) = (got["dx"].to_f64(), x.as_slice().unwrap().to_vec());
    let h = 1e-6;
    for j in 0..xs.len() {
        let v = xs[j];
        xs[j] = v + h;
        let up = loss_at(&xs);
        xs[j] = v - h;
        let down = loss_at(&xs);
        xs[j] = v;
        let fd = (up - down) / (2.0 * h);
        assert!((ad[j] - fd).abs() < 1e-6 * (1.0 + fd.abs()), "dx[{j}]: autodiff {} vs finite differences {fd}", ad[j]);
    }
}

/// A manual computation over `tensor` alone leaves `data` to the partitioner: an operand sharded
/// over `data` stays so through it (its dimensions are open, as JAX's `shard_map` writes them),
/// so the partitioned program moves nothing. Closed, the rows were gathered over `data` at its
/// boundary and sliced again after it. (A collective in the body, whose replica groups name
/// devices, still keeps the partitioner from splitting the body further: bodies that have one
/// name every axis their operands are split over, as the context-parallel strategies do.)
#[test]
fn the_axes_left_to_the_partitioner_keep_their_sharding() {
    let mut sig = Signature::new(Some(mesh()));
    sig.input("x", DType::F32, &[ROWS, COLS]).sharded(split());
    sig.output_sharding("y", split());
    let program = trace(&sig, |_, inp| {
        let columns = PartitionSpec::new(&[&[], &["tensor"]]);
        let specs = [columns];
        let out = manual_computation(&[&inp["x"]], &specs, &specs, |parts| vec![&parts[0] * 2.0]);
        Tree::new().with("y", out[0].clone())
    })
    .expect("traces");
    let compiled = maxrs::runtime::compile(&maxrs::pjrt::cpu_client(4).unwrap(), &program).unwrap();
    let (_, module) = compiled.executable.executable().optimized_program().unwrap();
    // The optimized module is an `HloModuleProto`: each instruction's opcode is its field 2, a
    // string (tag 0x12, its length, its bytes); the same words in metadata are not opcodes.
    let opcode = |name: &str| {
        let quoted: Vec<u8> = [0x12, name.len() as u8].into_iter().chain(name.bytes()).collect();
        module.windows(quoted.len()).filter(|w| *w == quoted.as_slice()).count()
    };
    for collective in ["all-gather", "all-to-all", "collective-permute", "all-reduce"] {
        assert_eq!(opcode(collective), 0, "{collective}: the rows stay split over data");
    }
    assert_eq!(opcode("multiply"), 1, "the opcode count sees the body");
    let x: Vec<f32> = (0..ROWS * COLS).map(|i| i as f32).collect();
    let y = run(&program, &Tree::new().with("x", HostTensor::from_f32(&[ROWS, COLS], &x)));
    assert_eq!(y["y"].to_f32(), x.iter().map(|v| v * 2.0).collect::<Vec<_>>());
}
