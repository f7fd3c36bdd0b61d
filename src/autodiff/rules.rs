//! The VJP rule of every primitive, in one exhaustive match: given the primal operands and
//! results, the results' cotangents and which operands need one, the operands' cotangents
//! (`None`: zero, or not differentiable — integer, boolean and index operands).

use super::{manual, remat, scan, Extra};
use crate::ir::{
    BinaryOp, Collective, Composite, DType, GatherDims, Prim, RaggedDotMode, ReduceOp, ScatterDims, UnaryOp,
};
use crate::tensor::{dot_transpose_lhs, dot_transpose_rhs, sort, usage_error, where_, Tensor, Trace};
use std::f64::consts::PI;

pub(crate) fn vjp(
    dest: &Trace,
    prim: &Prim,
    ins: &[&Tensor],
    outs: &[&Tensor],
    extra: &Extra,
    cts: &[Option<Tensor>],
    needs: &[bool],
) -> Vec<Option<Tensor>> {
    // Single-result primitives are only visited with a cotangent for that result.
    let g = || cts[0].as_ref().expect("cotangent of the single result");
    let only = |i: usize, f: &dyn Fn() -> Tensor| if needs[i] { Some(f()) } else { None };
    match prim {
        Prim::Unary(op) => vec![unary(*op, ins[0], outs[0], g())],
        Prim::Binary(op) => binary(*op, ins[0], ins[1], outs[0], g(), needs),
        Prim::Compare(_) => vec![None, None],
        Prim::Select => {
            let (p, g) = (ins[0], g());
            vec![None, only(1, &|| where_(p, g, 0.0)), only(2, &|| where_(p, 0.0, g))]
        }
        Prim::Convert(_) => vec![only(0, &|| g().astype(ins[0].dtype()))],
        Prim::Iota { .. } | Prim::Constant { .. } => vec![],
        // With a preferred result type the cotangent has that type: the other operand meets it
        // there, and each operand's cotangent returns to the operand's type (as JAX's transpose
        // rules convert it). Without one every conversion here is the identity.
        Prim::DotGeneral { dims, .. } => {
            let (lhs, rhs, g) = (ins[0], ins[1], g());
            vec![
                only(0, &|| dot_transpose_lhs(g, lhs.rank(), &rhs.astype(g.dtype()), dims, None).astype(lhs.dtype())),
                only(1, &|| dot_transpose_rhs(g, &lhs.astype(g.dtype()), rhs.rank(), dims, None).astype(rhs.dtype())),
            ]
        }
        Prim::Reduce { op: ReduceOp::Sum, axes } => vec![Some(unreduce(g(), ins[0].shape(), axes))],
        Prim::Reduce { op: ReduceOp::Max, axes } => {
            // The cotangent is shared equally among the positions attaining the maximum.
            let x = ins[0];
            let hit = x.eq(unreduce(outs[0], x.shape(), axes)).astype(x.dtype());
            let count = unreduce(&hit.sum(&axes.iter().map(|&a| a as isize).collect::<Vec<_>>()), x.shape(), axes);
            vec![Some(unreduce(g(), x.shape(), axes) * &hit / &count)]
        }
        Prim::Reshape(_) => vec![Some(g().reshape(ins[0].shape()))],
        Prim::Transpose(perm) => {
            let mut inverse = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inverse[p] = i;
            }
            vec![Some(g().transpose(&inverse))]
        }
        Prim::BroadcastInDim { shape, dims } => vec![Some(unbroadcast(g(), ins[0].shape(), shape, dims))],
        Prim::Slice { start, limit: _, strides } => {
            let (x, g) = (ins[0], g());
            let mut high = Vec::with_capacity(x.rank());
            for d in 0..x.rank() {
                let taken = if g.shape()[d] == 0 { 0 } else { (g.shape()[d] - 1) * strides[d] + 1 };
                high.push(x.shape()[d] - start[d] - taken);
            }
            let interior: Vec<i64> = strides.iter().map(|s| s - 1).collect();
            vec![Some(g.pad(0.0, start, &high, &interior))]
        }
        Prim::DynamicSlice { .. } => {
            let starts = &ins[1..];
            let mut r = vec![Some(ins[0].zeros_like().dynamic_update_slice(g(), starts))];
            r.extend(starts.iter().map(|_| None));
            r
        }
        Prim::DynamicUpdateSlice => {
            let (update, starts) = (ins[1], &ins[2..]);
            let mut r = vec![
                only(0, &|| g().dynamic_update_slice(&update.zeros_like(), starts)),
                only(1, &|| g().dynamic_slice(starts, update.shape())),
            ];
            r.extend(starts.iter().map(|_| None));
            r
        }
        Prim::Concatenate { axis } => {
            let mut offset = 0;
            ins.iter()
                .enumerate()
                .map(|(i, x)| {
                    let len = x.shape()[*axis];
                    offset += len;
                    only(i, &|| g().slice_axis(*axis as isize, offset - len, offset))
                })
                .collect()
        }
        Prim::Gather(d) => {
            vec![only(0, &|| ins[0].zeros_like().scatter_add_with(ins[1], g(), gather_transpose(d))), None]
        }
        Prim::ScatterAdd(d) => {
            vec![only(0, &|| g().clone()), None, only(2, &|| g().gather(ins[1], scatter_transpose(d, ins[2].shape())))]
        }
        Prim::Sort { axis, descending } => {
            // Every result is its operand permuted along `axis`: send each cotangent back
            // through the permutation, found by sorting positions along with the keys.
            let a = *axis as isize;
            let positions = dest.iota(DType::S32, ins[0].shape(), *axis);
            let perm = sort(&[ins[0], &positions], a, *descending).remove(1);
            ins.iter()
                .zip(cts)
                .zip(needs)
                .map(|((x, ct), &need)| match (need, ct) {
                    (true, Some(ct)) => Some(x.zeros_like().scatter_add_along_axis(&perm, ct, a)),
                    _ => None,
                })
                .collect()
        }
        Prim::TopK { .. } => {
            let values_ct = cts[0].as_ref().expect("only the values carry a cotangent");
            vec![Some(ins[0].zeros_like().scatter_add_along_axis(outs[1], values_ct, -1))]
        }
        // Each input reaches the outputs at and after it (before it, for `reverse`).
        Prim::Cumsum { axis, reverse: false } => vec![Some(g().cumsum_reverse(*axis as isize))],
        Prim::Cumsum { axis, reverse: true } => vec![Some(g().cumsum(*axis as isize))],
        Prim::RaggedDot(mode) => ragged_dot(dest, *mode, ins, g(), needs),
        Prim::Pad { low, high, interior } => {
            let g = g();
            let limit: Vec<i64> = (0..g.rank()).map(|d| g.shape()[d] - high[d]).collect();
            let strides: Vec<i64> = interior.iter().map(|i| i + 1).collect();
            let operand = g.slice_strided(low, &limit, &strides);
            let value = only(1, &|| g.sum_all() - operand.sum_all());
            vec![needs[0].then_some(operand), value]
        }
        Prim::StopGradient => vec![None],
        Prim::Name(_) => vec![Some(g().clone())],
        // The cotangent of a constrained value is laid out the same way (as JAX does).
        Prim::ShardingConstraint(spec) => vec![Some(dest.bind1(Prim::ShardingConstraint(spec.clone()), &[g()]))],
        Prim::OptimizationBarrier => cts.to_vec(),
        Prim::Scan(s) => match extra {
            Extra::Scan(tape) => scan::backward(dest, s, ins, outs, tape, cts),
            Extra::None | Extra::Remat(_) => unreachable!("an active scan is recorded with its scan tape"),
        },
        Prim::Composite(c) => composite(dest, c, ins, outs, cts, needs),
        // A custom call is an opaque kernel: its derivative is whatever backward kernel goes with
        // it, which only the code that emits it knows. So it is differentiated through the
        // `Composite` that wraps it (whose backward graph calls the backward kernel) and never
        // on its own: the composite is re-bound whole in the forward pass and its VJP evaluates
        // the backward graph, so no rule reaches the custom call inside.
        Prim::CustomCall(call) => usage_error(&format!(
            "custom_call @{} has no derivative of its own: wrap it in a composite whose backward pass is the matching backward call",
            call.target
        )),
        Prim::ManualComputation(m) => manual::backward(dest, m, ins, outs, cts, needs),
        Prim::Collective(c) => match transposed(c) {
            Some(t) => vec![only(0, &|| dest.bind1(Prim::Collective(t.clone()), &[g()]))],
            None => vec![],
        },
        Prim::Remat(r) => match extra {
            Extra::Remat(saved) => remat::backward(dest, r, ins, saved, cts, needs),
            Extra::None | Extra::Scan(_) => unreachable!("an active remat region is recorded with its saved values"),
        },
    }
}

/// The composite's own backward graph, evaluated on operands, results and result cotangents
/// (zeros where a result has none); it returns one cotangent per float operand.
fn composite(
    dest: &Trace,
    c: &Composite,
    ins: &[&Tensor],
    outs: &[&Tensor],
    cts: &[Option<Tensor>],
    needs: &[bool],
) -> Vec<Option<Tensor>> {
    let mut args: Vec<Tensor> = ins.iter().chain(outs).map(|&t| t.clone()).collect();
    args.extend(cts.iter().zip(outs).map(|(ct, out)| ct.clone().unwrap_or_else(|| out.zeros_like())));
    let tape = super::forward_with(dest, &c.backward, &args, vec![false; c.backward.types.len()], &mut |_, _| None);
    let mut float_cts = tape.outputs(&c.backward).into_iter();
    ins.iter()
        .zip(needs)
        .map(|(x, &need)| {
            let ct = x.dtype().is_float().then(|| float_cts.next().expect("one cotangent per float operand"));
            ct.filter(|_| need)
        })
        .collect()
}

fn unary(op: UnaryOp, x: &Tensor, y: &Tensor, g: &Tensor) -> Option<Tensor> {
    Some(match op {
        UnaryOp::Neg => -g,
        UnaryOp::Exp => g * y,
        UnaryOp::Log => g / x,
        UnaryOp::Log1p => g / &(x + 1.0),
        UnaryOp::Tanh => g * &(1.0 - &y.square()),
        UnaryOp::Logistic => g * &(y * &(1.0 - y)),
        UnaryOp::Sqrt => g / &(y * 2.0),
        UnaryOp::Rsqrt => g * &(y / x) * -0.5,
        UnaryOp::Abs => g * &x.sign(),
        // Piecewise constant: the derivative is zero wherever it exists.
        UnaryOp::Sign => return None,
        UnaryOp::Erf => g * &(-x.square()).exp() * (2.0 / PI.sqrt()),
        UnaryOp::ErfInv => g * &y.square().exp() * (PI.sqrt() / 2.0),
        UnaryOp::Sin => g * &x.cos(),
        UnaryOp::Cos => -(g * &x.sin()),
    })
}

fn binary(op: BinaryOp, x: &Tensor, y: &Tensor, out: &Tensor, g: &Tensor, needs: &[bool]) -> Vec<Option<Tensor>> {
    let pick = |fx: &dyn Fn() -> Tensor, fy: &dyn Fn() -> Tensor| vec![needs[0].then(fx), needs[1].then(fy)];
    match op {
        BinaryOp::Add => pick(&|| g.clone(), &|| g.clone()),
        BinaryOp::Sub => pick(&|| g.clone(), &|| -g),
        BinaryOp::Mul => pick(&|| g * y, &|| g * x),
        BinaryOp::Div => pick(&|| g / y, &|| -(g * out) / y),
        // Ties split the cotangent evenly, as JAX does.
        BinaryOp::Max | BinaryOp::Min => {
            let share =
                |a: &Tensor, b: &Tensor| g * &where_(&a.eq(out), where_(&b.eq(out), g.full_like(0.5), 1.0), 0.0);
            pick(&|| share(x, y), &|| share(y, x))
        }
        BinaryOp::Pow => pick(
            // y * x^(y-1), defined as 0 where y == 0 (x^-1 may be infinite there).
            &|| g * &where_(&y.eq(0.0), 0.0, y * &x.pow(y - 1.0)),
            // log(x) * x^y, with log(0) replaced by 0 (the term is 0 * log 0 there).
            &|| g * &(where_(&x.eq(0.0), 1.0, x).log() * out),
        ),
        // Integer-only operations: their operands are never active.
        BinaryOp::And | BinaryOp::Or | BinaryOp::Xor | BinaryOp::ShiftLeft | BinaryOp::ShiftRightLogical => {
            vec![None, None]
        }
    }
}

/// The scatter that adds a gather's cotangent back where the gather read it (JAX's
/// `_gather_transpose_rule`).
fn gather_transpose(d: &GatherDims) -> ScatterDims {
    ScatterDims {
        update_window_dims: d.offset_dims.clone(),
        inserted_window_dims: d.collapsed_slice_dims.clone(),
        input_batching_dims: d.operand_batching_dims.clone(),
        scatter_indices_batching_dims: d.start_indices_batching_dims.clone(),
        scatter_dims_to_operand_dims: d.start_index_map.clone(),
        index_vector_dim: d.index_vector_dim,
    }
}

/// The gather that reads a scatter's cotangent where the updates went (JAX's
/// `_scatter_add_transpose_rule`): slices of the update window's sizes.
fn scatter_transpose(d: &ScatterDims, updates: &[i64]) -> GatherDims {
    let mut window = d.update_window_dims.iter();
    let rank = d.inserted_window_dims.len() + d.input_batching_dims.len() + d.update_window_dims.len();
    let slice_sizes = (0..rank)
        .map(|r| match d.inserted_window_dims.contains(&r) || d.input_batching_dims.contains(&r) {
            true => 1,
            false => updates[*window.next().expect("one window dim per kept operand dim")],
        })
        .collect();
    GatherDims {
        offset_dims: d.update_window_dims.clone(),
        collapsed_slice_dims: d.inserted_window_dims.clone(),
        operand_batching_dims: d.input_batching_dims.clone(),
        start_indices_batching_dims: d.scatter_indices_batching_dims.clone(),
        start_index_map: d.scatter_dims_to_operand_dims.clone(),
        index_vector_dim: d.index_vector_dim,
        slice_sizes,
    }
}

/// Cotangents of a ragged dot's `lhs` and `rhs`: again ragged dots over the same groups.
/// With `out[m] = lhs[m] @ W[g]`, `d lhs[m] = g[m] @ W[g]^T` and `d W[g] = lhs[rows of g]^T @
/// g[rows of g]` (the contracting form); the contracting form's own cotangents are
/// non-contracting products with the cotangent as the weights.
fn ragged_dot(dest: &Trace, mode: RaggedDotMode, ins: &[&Tensor], g: &Tensor, needs: &[bool]) -> Vec<Option<Tensor>> {
    let (lhs, rhs, sizes) = (ins[0], ins[1], ins[2]);
    let bind = |mode, a: &Tensor, b: &Tensor| dest.bind1(Prim::RaggedDot(mode), &[a, b, sizes]);
    let non_contracting = |rhs_transposed| RaggedDotMode::NonContracting { rhs_transposed };
    let (d_lhs, d_rhs): (&dyn Fn() -> Tensor, &dyn Fn() -> Tensor) = match mode {
        RaggedDotMode::NonContracting { rhs_transposed: false } => {
            (&|| bind(non_contracting(true), g, rhs), &|| bind(RaggedDotMode::Contracting, lhs, g))
        }
        RaggedDotMode::NonContracting { rhs_transposed: true } => {
            (&|| bind(non_contracting(false), g, rhs), &|| bind(RaggedDotMode::Contracting, g, lhs))
        }
        RaggedDotMode::Contracting => {
            (&|| bind(non_contracting(true), rhs, g), &|| bind(non_contracting(false), lhs, g))
        }
    };
    vec![needs[0].then(d_lhs), needs[1].then(d_rhs), None]
}

/// The collective whose result is the cotangent of `c`'s operand, given `c`'s result's: each
/// is linear, and its transpose moves the data back (`None`: no operand, `axis_index`).
fn transposed(c: &Collective) -> Option<Collective> {
    Some(match c.clone() {
        Collective::AllGather { axis, dim } => Collective::ReduceScatter { axis, dim },
        Collective::ReduceScatter { axis, dim } => Collective::AllGather { axis, dim },
        Collective::Permute { axis, pairs } => {
            Collective::Permute { axis, pairs: pairs.into_iter().map(|(from, to)| (to, from)).collect() }
        }
        Collective::AllToAll { axis, split, concat } => Collective::AllToAll { axis, split: concat, concat: split },
        Collective::AxisIndex { .. } => return None,
    })
}

/// Broadcasts a reduced cotangent back over the reduced `axes` of `shape`.
fn unreduce(g: &Tensor, shape: &[i64], axes: &[usize]) -> Tensor {
    let kept: Vec<usize> = (0..shape.len()).filter(|d| !axes.contains(d)).collect();
    g.broadcast_in_dim(shape, &kept)
}

/// The transpose of `broadcast_in_dim`: sums over the added and the stretched dimensions.
fn unbroadcast(g: &Tensor, operand: &[i64], shape: &[i64], dims: &[usize]) -> Tensor {
    let added: Vec<isize> = (0..shape.len()).filter(|d| !dims.contains(d)).map(|d| d as isize).collect();
    let summed = g.sum(&added);
    // `summed` has the operand's dims in increasing order of `dims`; put them in operand order.
    let mut order: Vec<usize> = (0..dims.len()).collect();
    order.sort_by_key(|&i| dims[i]);
    let mut perm = vec![0; dims.len()];
    for (pos, &i) in order.iter().enumerate() {
        perm[i] = pos;
    }
    let ordered = summed.transpose(&perm);
    let stretched: Vec<isize> =
        (0..operand.len()).filter(|&i| operand[i] == 1 && shape[dims[i]] != 1).map(|i| i as isize).collect();
    ordered.sum_keepdims(&stretched)
}
