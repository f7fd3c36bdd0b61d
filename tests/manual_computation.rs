//! Shardy manual computations (`tensor::manual_computation`, JAX's `shard_map`) executed on 4
//! CPU devices: a body applied to each device's shards gives what the same function gives on one
//! device, values and gradients (the gradient is another manual computation over the same axes,
//! `autodiff::manual`), checked against an f64 reference written here; an operand whole along a
//! manual axis cannot be differentiated (its cotangent would be a sum across devices), which is
//! refused by name.

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
