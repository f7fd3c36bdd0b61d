//! Finite-difference checks of every differentiable primitive's VJP rule, executed through
//! the CPU plugin in f64: for `loss(x) = sum(f(x) * w)` with random inputs `x` and random
//! weights `w` (a random output cotangent), each element of `value_and_grad`'s gradient must
//! match the central difference `(loss(x + h e) - loss(x - h e)) / 2h`.

use crate::common::{batched_row_gather, f64_tensor, max_rel_diff, rng, run, uniform};
use maxrs::autodiff::value_and_grad;
use maxrs::host::HostTensor;
use maxrs::ir::{DType, DotDims, Prim, RaggedDotMode, RematFences, Signature};
use maxrs::runtime::compile;
use maxrs::tensor::{checkpoint, concatenate, einsum, scan, sort, trace, where_, RematPolicy, Tensor, Trace, Tree};

type Fun = Box<dyn Fn(&Trace, &[Tensor]) -> Tensor>;

struct Case {
    name: &'static str,
    /// Shape and sampling range of each input.
    inputs: Vec<(Vec<i64>, f64, f64)>,
    f: Fun,
    /// Evaluate in f32 through a cast (`convert`): looser step and tolerance.
    coarse: bool,
}

fn case(name: &'static str, inputs: &[(&[i64], f64, f64)], f: impl Fn(&Trace, &[Tensor]) -> Tensor + 'static) -> Case {
    Case {
        name,
        inputs: inputs.iter().map(|(d, lo, hi)| (d.to_vec(), *lo, *hi)).collect(),
        f: Box::new(f),
        coarse: false,
    }
}

const ANY: (f64, f64) = (-1.0, 1.0);
const POS: (f64, f64) = (0.5, 2.0);

fn s(dims: &'static [i64], range: (f64, f64)) -> (&'static [i64], f64, f64) {
    (dims, range.0, range.1)
}

fn idx(ctx: &Trace, dims: &[i64], values: &[i32]) -> Tensor {
    ctx.constant(DType::S32, dims, &values.iter().map(|&v| v as f64).collect::<Vec<_>>())
}

/// A ragged dot in any of its forms (the API exposes the non-contracting one; the others are
/// its gradients).
fn ragged(mode: RaggedDotMode, lhs: &Tensor, rhs: &Tensor, sizes: &Tensor) -> Tensor {
    lhs.trace().bind1(Prim::RaggedDot(mode), &[lhs, rhs, sizes])
}

/// Group sizes with an empty group, a group of several tiles (tiles are at least 8 rows) and
/// rows past the last group.
const GROUPS: [i32; 3] = [9, 0, 10];

fn cases() -> Vec<Case> {
    let a23 = s(&[2, 3], ANY);
    let p23 = s(&[2, 3], POS);
    vec![
        case("neg", &[a23], |_, x| -&x[0]),
        case("exp", &[a23], |_, x| x[0].exp()),
        case("log", &[p23], |_, x| x[0].log()),
        case("log1p", &[s(&[2, 3], (-0.5, 1.0))], |_, x| x[0].log1p()),
        case("tanh", &[a23], |_, x| x[0].tanh()),
        case("logistic", &[a23], |_, x| x[0].sigmoid()),
        case("sqrt", &[p23], |_, x| x[0].sqrt()),
        case("rsqrt", &[p23], |_, x| x[0].rsqrt()),
        case("abs", &[a23], |_, x| x[0].abs()),
        case("sign", &[a23], |_, x| &x[0].sign() * &x[0]),
        case("erf", &[a23], |_, x| x[0].erf()),
        case("erf_inv", &[s(&[2, 3], (-0.9, 0.9))], |_, x| x[0].erf_inv()),
        case("sin", &[a23], |_, x| x[0].sin()),
        case("cos", &[a23], |_, x| x[0].cos()),
        case("add", &[a23, a23], |_, x| &x[0] + &x[1]),
        case("add_broadcast", &[a23, s(&[3], ANY)], |_, x| &x[0] + &x[1]),
        case("sub", &[a23, a23], |_, x| &x[0] - &x[1]),
        case("mul", &[a23, a23], |_, x| &x[0] * &x[1]),
        case("div", &[a23, p23], |_, x| &x[0] / &x[1]),
        case("max", &[a23, a23], |_, x| x[0].maximum(&x[1])),
        case("min", &[a23, a23], |_, x| x[0].minimum(&x[1])),
        case("pow", &[p23, s(&[2, 3], (-1.0, 2.0))], |_, x| x[0].pow(&x[1])),
        case("select", &[a23, a23], |_, x| where_(&x[0].gt(0.0), &x[0] * &x[1], x[1].sin())),
        Case { coarse: true, ..case("convert", &[a23], |_, x| (x[0].astype(DType::F32) * 3.0).astype(DType::F64)) },
        case("dot_matmul", &[a23, s(&[3, 4], ANY)], |_, x| x[0].matmul(&x[1])),
        case("dot_batched", &[s(&[2, 2, 3], ANY), s(&[2, 3, 2], ANY)], |_, x| x[0].matmul(&x[1])),
        case("dot_general_permuted", &[s(&[3, 2, 4], ANY), s(&[4, 2, 3], ANY)], |_, x| {
            x[0].dot_general(
                &x[1],
                DotDims { lhs_batch: vec![1], rhs_batch: vec![1], lhs_contract: vec![2, 0], rhs_contract: vec![0, 2] },
            )
        }),
        // A wider result than the operands (`preferred_element_type`): the f64 cotangent meets
        // the other operand in f64 and each operand's cotangent returns to f32.
        Case {
            coarse: true,
            ..case("dot_preferred", &[s(&[2, 3, 4], ANY), s(&[4, 3, 2], ANY)], |_, x| {
                let dims =
                    DotDims { lhs_batch: vec![1], rhs_batch: vec![1], lhs_contract: vec![2], rhs_contract: vec![0] };
                x[0].astype(DType::F32).dot_general_preferred(&x[1].astype(DType::F32), dims, DType::F64)
            })
        },
        case("einsum_btd_dhk", &[s(&[2, 2, 3], ANY), s(&[3, 2, 2], ANY)], |_, x| {
            einsum("btd,dhk->bthk", &[&x[0], &x[1]])
        }),
        case("einsum_scores", &[s(&[1, 3, 2, 2], ANY), s(&[1, 2, 2, 2], ANY)], |_, x| {
            einsum("bthk,bshk->bhts", &[&x[0], &x[1]])
        }),
        case("einsum_mix", &[s(&[1, 2, 3, 2], ANY), s(&[1, 2, 2, 2], ANY)], |_, x| {
            einsum("bhts,bshk->bthk", &[&x[0], &x[1]])
        }),
        case("einsum_out_proj", &[s(&[1, 2, 2, 2], ANY), s(&[2, 2, 3], ANY)], |_, x| {
            einsum("bthk,hkd->btd", &[&x[0], &x[1]])
        }),
        case("reduce_sum", &[s(&[2, 3, 2], ANY)], |_, x| x[0].sum(&[0, 2])),
        case("reduce_max", &[s(&[2, 3], ANY)], |_, x| x[0].max(&[1])),
        case("reshape", &[a23], |_, x| x[0].reshape(&[3, 2])),
        case("transpose", &[s(&[2, 3, 2], ANY)], |_, x| x[0].transpose(&[2, 0, 1])),
        case("broadcast_stretch", &[s(&[3, 1], ANY)], |_, x| x[0].broadcast_in_dim(&[2, 3, 4], &[1, 2])),
        case("broadcast_permuted", &[a23], |_, x| x[0].broadcast_in_dim(&[3, 4, 2], &[2, 0])),
        case("slice_strided", &[s(&[4, 5], ANY)], |_, x| x[0].slice_strided(&[1, 0], &[4, 5], &[2, 2])),
        case("dynamic_slice", &[s(&[4, 3], ANY)], |c, x| {
            x[0].dynamic_slice(&[&idx(c, &[], &[1]), &idx(c, &[], &[0])], &[2, 3])
        }),
        case("dynamic_update_slice", &[s(&[4, 3], ANY), a23], |c, x| {
            x[0].dynamic_update_slice(&x[1], &[&idx(c, &[], &[2]), &idx(c, &[], &[0])]).sin()
        }),
        case("concatenate", &[a23, s(&[2, 2], ANY)], |_, x| concatenate(&[&x[0], &x[1]], 1)),
        case("take", &[s(&[5, 3], ANY)], |c, x| x[0].take(&idx(c, &[2, 2], &[1, 4, 1, 0]))),
        case("scatter_add", &[s(&[5, 3], ANY), s(&[3, 3], ANY)], |c, x| {
            x[0].scatter_add(&idx(c, &[3], &[3, 1, 3]), &x[1])
        }),
        case("take_along_axis", &[s(&[3, 4], ANY)], |c, x| {
            x[0].take_along_axis(&idx(c, &[3, 2], &[3, 0, 1, 1, 2, 0]), 1)
        }),
        case("take_along_axis_0", &[s(&[3, 4], ANY)], |c, x| {
            x[0].take_along_axis(&idx(c, &[2, 4], &[2, 0, 1, 1, 0, 0, 2, 1]), 0)
        }),
        case("scatter_add_along_axis", &[s(&[3, 4], ANY), s(&[3, 2], ANY)], |c, x| {
            x[0].scatter_add_along_axis(&idx(c, &[3, 2], &[3, 3, 1, 0, 2, 2]), &x[1], 1)
        }),
        case("gather_batched_window", &[s(&[2, 5, 3], ANY)], |c, x| {
            // Per batch row b, rows indices[b, i] of operand[b]: [2, 4, 3].
            x[0].gather(&idx(c, &[2, 4, 1], &[4, 0, 4, 2, 1, 1, 3, 0]), batched_row_gather(3))
        }),
        case("sort_with_payload", &[s(&[3, 4], ANY), s(&[3, 4], ANY)], |_, x| {
            let sorted = sort(&[&x[0], &x[1]], 1, false);
            concatenate(&[&sorted[0], &sorted[1]], 1)
        }),
        case("sort_descending_axis_0", &[s(&[4, 3], ANY)], |_, x| sort(&[&x[0]], 0, true).remove(0)),
        case("argsort_take", &[s(&[3, 4], ANY), s(&[3, 4], ANY)], |_, x| x[1].take_along_axis(&x[0].argsort(1), 1)),
        case("top_k", &[s(&[3, 5], ANY)], |_, x| x[0].top_k(2).0),
        case("cumsum", &[s(&[3, 4], ANY)], |_, x| x[0].cumsum(1)),
        case("cumsum_reverse", &[s(&[3, 4], ANY)], |_, x| x[0].cumsum_reverse(0)),
        case("ragged_dot", &[s(&[20, 3], ANY), s(&[3, 3, 2], ANY)], |c, x| {
            x[0].ragged_dot(&x[1], &idx(c, &[3], &GROUPS))
        }),
        case("ragged_dot_transposed", &[s(&[20, 3], ANY), s(&[3, 2, 3], ANY)], |c, x| {
            ragged(RaggedDotMode::NonContracting { rhs_transposed: true }, &x[0], &x[1], &idx(c, &[3], &GROUPS))
        }),
        case("ragged_dot_contracting", &[s(&[20, 3], ANY), s(&[20, 2], ANY)], |c, x| {
            ragged(RaggedDotMode::Contracting, &x[0], &x[1], &idx(c, &[3], &GROUPS))
        }),
        case("pad", &[a23, s(&[], ANY)], |_, x| x[0].pad(&x[1], &[1, 0], &[0, 2], &[1, 1])),
        case("checkpoint_name", &[a23], |_, x| x[0].checkpoint_name("h").sin()),
        case("softmax", &[a23], |_, x| x[0].softmax(-1)),
        case("log_softmax", &[a23], |_, x| x[0].log_softmax(0)),
        case("logsumexp", &[a23], |_, x| x[0].logsumexp(-1)),
        case("mean", &[a23], |_, x| x[0].mean(&[1])),
        case("rms_norm", &[a23, s(&[3], ANY)], |_, x| x[0].rms_norm(&x[1], 1e-5)),
        case("scan", &[s(&[3, 2, 2], ANY), s(&[2], ANY), s(&[2], ANY)], |_, x| {
            // Carry h, scanned weights w[i], a captured bias; ys feed the loss too.
            let (c, ys) = scan(&Tree::new().with("h", x[1].clone()), &Tree::new().with("w", x[0].clone()), |c, xs| {
                let h = (xs["w"].matmul(&c["h"]) + &x[2]).tanh();
                (Tree::new().with("h", h.clone()), Tree::new().with("y", h.square()))
            });
            &ys["y"].sum(&[0]) + &c["h"]
        }),
        case("remat", &[a23, s(&[3, 3], ANY)], |_, x| {
            let out = checkpoint(
                &RematPolicy::Full,
                RematFences { inputs: true, cotangents: true, wait_for_cotangents: false },
                &Tree::new().with("x", x[0].clone()),
                |t| Tree::new().with("y", t["x"].matmul(&x[1]).tanh().matmul(&x[1])),
            );
            out["y"].clone()
        }),
        // The recomputation waits for the output's cotangent (the embedding's one-hot region).
        case("remat_waiting_for_cotangents", &[a23, s(&[3, 3], ANY)], |_, x| {
            let out = checkpoint(
                &RematPolicy::Full,
                RematFences { inputs: true, cotangents: false, wait_for_cotangents: true },
                &Tree::new().with("x", x[0].clone()),
                |t| Tree::new().with("y", t["x"].matmul(&x[1]).tanh().matmul(&x[1])),
            );
            out["y"].clone()
        }),
    ]
}

/// Names of the inputs: `x0`, `x1`, ... and the output weights `w`.
fn name(i: usize) -> String {
    format!("x{i}")
}

fn check(case: &Case, seed: u64) -> Result<(), String> {
    let mut r = rng(seed);
    let dtype = DType::F64;
    let mut sig = Signature::new(None);
    for (i, (dims, _, _)) in case.inputs.iter().enumerate() {
        sig.input(&name(i), dtype, dims);
    }
    // The output shape, to size the weights.
    let probe = trace(&sig, |ctx, inp| {
        let xs: Vec<Tensor> = (0..case.inputs.len()).map(|i| inp[&name(i)].clone()).collect();
        Tree::new().with("y", (case.f)(ctx, &xs))
    })
    .map_err(|e| e.to_string())?;
    let out_dims = probe.outputs[0].ty.shape.to_vec();
    sig.input("w", dtype, &out_dims);
    let loss_of = |ctx: &Trace, inp: &Tree| {
        let xs: Vec<Tensor> = (0..case.inputs.len()).map(|i| inp[&name(i)].clone()).collect();
        ((case.f)(ctx, &xs) * &inp["w"]).sum_all()
    };
    let grad_program = trace(&sig, |ctx, inp| {
        let params: Tree = inp.iter().filter(|(n, _)| *n != "w").map(|(n, t)| (n, t.clone())).collect();
        let (loss, grads) = value_and_grad(&params, |p| {
            let mut all = p.clone();
            all.insert("w", inp["w"].clone());
            loss_of(ctx, &all)
        });
        grads.prefixed("grad").with("loss", loss)
    })
    .map_err(|e| e.to_string())?;

    let mut values: Vec<Vec<f64>> =
        case.inputs.iter().map(|(d, lo, hi)| uniform(&mut r, d.iter().product::<i64>() as usize, *lo, *hi)).collect();
    let w = uniform(&mut r, out_dims.iter().product::<i64>() as usize, -1.0, 1.0);
    let host = |values: &[Vec<f64>]| -> Tree<HostTensor> {
        let mut t: Tree<HostTensor> =
            values.iter().enumerate().map(|(i, v)| (name(i), f64_tensor(&case.inputs[i].0, v))).collect();
        t.insert("w", f64_tensor(&out_dims, &w));
        t
    };
    // One compiled program gives the gradients and, run at the nudged inputs, the losses of the
    // finite differences (the grad program's `loss` is the forward's; compiling is the cost here).
    let client = crate::common::client();
    let exe = compile(&client, &grad_program).map_err(|e| e.to_string())?;
    let grads = exe.run(&client, &host(&values)).expect("the gradient program runs");
    let loss_at = |values: &[Vec<f64>]| exe.run(&client, &host(values)).expect("loss runs")["loss"].to_f64()[0];
    let h = if case.coarse { 1e-3 } else { 1e-6 };
    let tol = if case.coarse { 1e-3 } else { 1e-6 };
    for i in 0..values.len() {
        let ad = grads[&format!("grad.{}", name(i))].to_f64();
        let mut fd = Vec::with_capacity(ad.len());
        for j in 0..values[i].len() {
            let x = values[i][j];
            values[i][j] = x + h;
            let up = loss_at(&values);
            values[i][j] = x - h;
            let down = loss_at(&values);
            values[i][j] = x;
            fd.push((up - down) / (2.0 * h));
        }
        let err = max_rel_diff(&ad, &fd);
        if err.is_nan() || err > tol {
            return Err(format!(
                "{}: input {i}: autodiff {ad:?} vs finite differences {fd:?} (rel err {err:e})",
                case.name
            ));
        }
    }
    Ok(())
}

#[test]
fn every_vjp_rule_matches_finite_differences() {
    let failures: Vec<String> =
        cases().iter().enumerate().filter_map(|(k, c)| check(c, 1000 + k as u64).err()).collect();
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), cases().len(), failures.join("\n"));
}

/// `stop_gradient` is the one rule finite differences cannot see: its derivative is zero by
/// definition, so `d/dx [x * sg(x)] = sg(x) = x`, where the true derivative is `2x`.
#[test]
fn stop_gradient_blocks_the_gradient() {
    let mut sig = Signature::new(None);
    sig.input("x", DType::F64, &[3]);
    let p = trace(&sig, |_, inp| {
        let (_, g) = value_and_grad(inp, |p| (&p["x"] * &p["x"].stop_gradient()).sum_all());
        g
    })
    .unwrap();
    let x = [0.5, -1.5, 2.0];
    let out = run(&p, &Tree::new().with("x", f64_tensor(&[3], &x)));
    assert_eq!(out["x"].to_f64(), x.to_vec());
}
