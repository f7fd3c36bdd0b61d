//! Function transformations in the spirit of JAX: `scan` (MaxText's scan_layers),
//! `checkpoint` (remat) with its policies, `composite` (a function with its own backward pass,
//! JAX's `custom_vjp`), `manual_computation` (a function of each device's shards, JAX's
//! `shard_map`), and the identity-like tags `stop_gradient`, `checkpoint_name` and
//! `with_sharding_constraint`. `value_and_grad` is `crate::autodiff`'s.
//!
//! Each traces its function once, in a child of the current trace (`Trace::current`), into a
//! closed sub-graph; tensors the function closes over are captured and passed in as extra
//! operands.

use super::trace::{usage_error, Tensor, Trace};
use super::Tree;
use crate::ir::{Composite, CustomCall, Manual, ManualAxis, Prim, Remat, RematFences, Scan, Type};
use crate::sharding::PartitionSpec;
use std::sync::Arc;

/// Loops `body(carry, x) -> (carry, y)` over the leading axis of every tensor in `xs`;
/// returns the final carry and the `y`s stacked along a new leading axis. The body is traced
/// once and lowered to a while loop; differentiable (see `autodiff::scan`).
#[track_caller]
pub fn scan(carry: &Tree, xs: &Tree, body: impl FnOnce(&Tree, &Tree) -> (Tree, Tree)) -> (Tree, Tree) {
    scan_in_order(carry, xs, false, body)
}

/// `scan` from the last element of `xs` to the first (`jax.lax.scan(..., reverse=True)`):
/// `ys[i]` is still the body's output for `xs[i]`.
#[track_caller]
pub fn scan_reverse(carry: &Tree, xs: &Tree, body: impl FnOnce(&Tree, &Tree) -> (Tree, Tree)) -> (Tree, Tree) {
    scan_in_order(carry, xs, true, body)
}

#[track_caller]
fn scan_in_order(
    carry: &Tree,
    xs: &Tree,
    reverse: bool,
    body: impl FnOnce(&Tree, &Tree) -> (Tree, Tree),
) -> (Tree, Tree) {
    let parent = Trace::innermost(carry.values().chain(xs.values())).current();
    let length = match xs.values().next() {
        Some(x) if x.rank() > 0 => x.shape()[0],
        _ => usage_error("scan needs at least one scanned tensor (with a leading axis) in xs"),
    };
    if let Some((name, x)) = xs.iter().find(|(_, x)| x.rank() == 0 || x.shape()[0] != length) {
        usage_error(&format!("scan: xs \"{name}\" is {}, but the scan length is {length}", x.ty()));
    }
    let child = parent.child();
    let c_in = carry.map(|_, t| child.input(t.ty().clone()));
    let x_in = xs.map(|_, t| child.input(Type::new(t.dtype(), &t.shape()[1..])));
    let (c_out, ys) = body(&c_in, &x_in);
    for (name, t) in carry.iter() {
        match c_out.get(name) {
            Some(out) if out.ty() == t.ty() => {}
            Some(out) => {
                usage_error(&format!("scan: the body changes carry \"{name}\" from {} to {}", t.ty(), out.ty()))
            }
            None => usage_error(&format!("scan: the body does not return carry \"{name}\"")),
        }
    }
    if c_out.len() != carry.len() {
        usage_error("scan: the body returns carries that are not in the initial carry");
    }
    let outs: Vec<&Tensor> = c_out.values().chain(ys.values()).collect();
    let (mut graph, captures) = child.finish(&outs);
    // Captured tensors are loop constants, which come first in a scan's operands.
    graph.inputs.rotate_right(captures.len());
    let operands: Vec<&Tensor> = captures.iter().chain(carry.values()).chain(xs.values()).collect();
    let spec = Scan { body: Arc::new(graph), length, num_consts: captures.len(), num_carry: carry.len(), reverse };
    let results = parent.bind(Prim::Scan(spec), &operands);
    let (c, y) = results.split_at(carry.len());
    (carry.names().zip(c.iter().cloned()).collect(), ys.names().zip(y.iter().cloned()).collect())
}

/// What a `checkpoint` region keeps for the backward pass; everything else is recomputed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RematPolicy {
    /// Keep nothing but the region's inputs: recompute all of it in the backward pass.
    Full,
    /// No rematerialization: the function is traced inline and everything the backward pass
    /// needs is kept.
    None,
    /// Keep the values tagged by `checkpoint_name` with one of these names.
    SaveNames(Vec<String>),
}

/// Applies `f` to `inputs` as a rematerialization region under `policy`, its backward pass
/// fenced as `fences` says.
#[track_caller]
pub fn checkpoint(policy: &RematPolicy, fences: RematFences, inputs: &Tree, f: impl FnOnce(&Tree) -> Tree) -> Tree {
    let saved_names: Arc<[Arc<str>]> = match policy {
        RematPolicy::None => return f(inputs),
        RematPolicy::Full => Arc::from(Vec::new()),
        RematPolicy::SaveNames(names) => names.iter().map(|n| Arc::from(n.as_str())).collect(),
    };
    let parent = Trace::innermost(inputs.values()).current();
    let child = parent.child();
    let args = inputs.map(|_, t| child.input(t.ty().clone()));
    let outs = f(&args);
    let (graph, captures) = child.finish(&outs.values().collect::<Vec<_>>());
    let operands: Vec<&Tensor> = inputs.values().chain(&captures).collect();
    let results = parent.bind(Prim::Remat(Remat { body: Arc::new(graph), saved_names, fences }), &operands);
    outs.names().zip(results).collect()
}

/// Applies `forward` to `inputs` as one operation whose backward pass is `backward` instead of
/// the derivative of `forward` (JAX's `custom_vjp`): `backward(inputs, results, result
/// cotangents)` returns one cotangent per float input, in input order. Both functions are traced
/// once, on fresh inputs of the same types, and must be closed: they may not use tensors from
/// outside (create constants inside). Used where the backward pass is cheaper written by hand,
/// as in blockwise attention, which recomputes its scores block by block.
#[track_caller]
pub fn composite(
    name: &str,
    inputs: &[&Tensor],
    forward: impl FnOnce(&[Tensor]) -> Vec<Tensor>,
    backward: impl FnOnce(&[Tensor], &[Tensor], &[Tensor]) -> Vec<Tensor>,
) -> Vec<Tensor> {
    let parent = Trace::innermost(inputs.iter().copied());
    let mesh = parent.mesh().cloned();
    let tf = Trace::root(mesh.clone());
    let f_ins: Vec<Tensor> = inputs.iter().map(|t| tf.input(t.ty().clone())).collect();
    let f_outs = forward(&f_ins);
    let (fwd, captures) = tf.finish(&f_outs.iter().collect::<Vec<_>>());
    debug_assert!(captures.is_empty(), "a root trace captures nothing");
    let tb = Trace::root(mesh);
    let b_ins: Vec<Tensor> = inputs.iter().map(|t| tb.input(t.ty().clone())).collect();
    let b_outs: Vec<Tensor> = f_outs.iter().map(|t| tb.input(t.ty().clone())).collect();
    let b_cts: Vec<Tensor> = f_outs.iter().map(|t| tb.input(t.ty().clone())).collect();
    let cts = backward(&b_ins, &b_outs, &b_cts);
    let floats: Vec<&Tensor> = inputs.iter().copied().filter(|t| t.dtype().is_float()).collect();
    if cts.len() != floats.len() || cts.iter().zip(&floats).any(|(ct, x)| ct.ty() != x.ty()) {
        let got: Vec<String> = cts.iter().map(|t| t.ty().to_string()).collect();
        let want: Vec<String> = floats.iter().map(|t| t.ty().to_string()).collect();
        usage_error(&format!(
            "composite {name}: the backward pass returns [{}], but the float inputs are [{}]",
            got.join(", "),
            want.join(", ")
        ));
    }
    let (bwd, _) = tb.finish(&cts.iter().collect::<Vec<_>>());
    let prim = Composite { name: Arc::from(name), forward: Arc::new(fwd), backward: Arc::new(bwd) };
    parent.bind(Prim::Composite(prim), inputs)
}

/// The identity on `inputs` (floats), whose backward pass releases their cotangents together,
/// through one optimization barrier: none reaches the operations before until all are computed.
/// A decoder's output head is fenced this way, as a remat region is (`RematFences::cotangents`):
/// otherwise XLA may defer the head's weight-gradient product to the end of the backward pass and
/// keep the `[batch, seq, vocab]` logits cotangent it reads alive through every layer's.
#[track_caller]
pub fn fence_cotangents(inputs: &[&Tensor]) -> Vec<Tensor> {
    composite(
        "fence_cotangents",
        inputs,
        |xs| xs.to_vec(),
        |_, _, cts| match cts.first() {
            Some(first) => first.trace().bind(Prim::OptimizationBarrier, &cts.iter().collect::<Vec<_>>()),
            None => Vec::new(),
        },
    )
}

/// The results of XLA's custom call `call` on `operands` (which must match its layouts): an
/// opaque kernel such as cuDNN's fused attention. It has no derivative; differentiate through a
/// `composite` whose backward pass is the matching backward call.
#[track_caller]
pub fn custom_call(call: CustomCall, operands: &[&Tensor]) -> Vec<Tensor> {
    Trace::innermost(operands.iter().copied()).bind(Prim::CustomCall(call), operands)
}

/// Applies `body` to every device's shards of `inputs` (JAX's `shard_map`): input `i` is split
/// over mesh axes as `in_specs[i]` says, `body` gets the local shards and returns the local
/// results, which `out_specs` lay out. The manual axes are the axes the specs name (those larger
/// than 1); the body sees no other sharding and may not use tensors from outside (create constants
/// inside). For operations the partitioner cannot split itself, such as custom calls.
#[track_caller]
pub fn manual_computation(
    inputs: &[&Tensor],
    in_specs: &[PartitionSpec],
    out_specs: &[PartitionSpec],
    body: impl FnOnce(&[Tensor]) -> Vec<Tensor>,
) -> Vec<Tensor> {
    let parent = Trace::innermost(inputs.iter().copied());
    let Some(mesh) = parent.mesh() else { usage_error("manual_computation needs a mesh") };
    if in_specs.len() != inputs.len() {
        usage_error(&format!("manual_computation: {} inputs, {} input specs", inputs.len(), in_specs.len()));
    }
    let named: Vec<&String> =
        in_specs.iter().chain(out_specs).flat_map(|s| (0..s.rank()).flat_map(|d| s.dim(d))).collect();
    let axes: Vec<(String, usize)> =
        mesh.axes().iter().filter(|(a, size)| *size > 1 && named.contains(&a)).cloned().collect();
    let manual = |specs: &[PartitionSpec]| -> Vec<PartitionSpec> {
        let keep = |d: &[String]| d.iter().filter(|a| axes.iter().any(|(n, _)| n == *a)).cloned().collect();
        specs.iter().map(|s| PartitionSpec::from_axes((0..s.rank()).map(|d| keep(s.dim(d))).collect())).collect()
    };
    let (in_specs, out_specs) = (manual(in_specs), manual(out_specs));
    let tb = Trace::manual_root(&manual_axes(&axes));
    let mut locals = Vec::with_capacity(inputs.len());
    for (t, spec) in inputs.iter().zip(&in_specs) {
        if let Err(msg) = spec.validate(mesh, t.rank()) {
            super::trace::op_error("manual_computation", &msg, &[t.ty()]);
        }
        let mut dims = t.shape().to_vec();
        for (d, size) in dims.iter_mut().enumerate() {
            let shards: i64 = spec.dim(d).iter().map(|a| mesh.axis_size(a).unwrap_or(1) as i64).product();
            if *size % shards != 0 {
                let msg = format!("dimension {d} does not split into {shards} shards ({spec})");
                super::trace::op_error("manual_computation", &msg, &[t.ty()]);
            }
            *size /= shards;
        }
        locals.push(tb.input(Type::new(t.dtype(), dims)));
    }
    let outs = body(&locals);
    let (graph, captures) = tb.finish(&outs.iter().collect::<Vec<_>>());
    debug_assert!(captures.is_empty(), "a root trace captures nothing");
    parent.bind(Prim::ManualComputation(Manual { body: Arc::new(graph), axes, in_specs, out_specs }), inputs)
}

/// The axes of a manual computation as its body's collectives name them.
pub(crate) fn manual_axes(axes: &[(String, usize)]) -> Vec<ManualAxis> {
    axes.iter().map(|(name, size)| ManualAxis { name: name.clone(), size: *size }).collect()
}

impl Tensor {
    /// The same value, with a zero gradient.
    #[track_caller]
    pub fn stop_gradient(&self) -> Tensor {
        super::trace::apply1(Prim::StopGradient, &[self])
    }

    /// Tags the value for remat policies that save by name (`RematPolicy::SaveNames`).
    #[track_caller]
    pub fn checkpoint_name(&self, name: &str) -> Tensor {
        super::trace::apply1(Prim::Name(Arc::from(name)), &[self])
    }

    /// Pins this value's layout on the program's mesh (ignored when tracing without a mesh, so
    /// the same model code runs on one device).
    #[track_caller]
    pub fn with_sharding_constraint(&self, spec: &PartitionSpec) -> Tensor {
        match self.trace().mesh() {
            None => self.clone(),
            Some(mesh) => {
                if let Err(msg) = spec.validate(mesh, self.rank()) {
                    super::trace::op_error("sharding_constraint", &msg, &[self.ty()]);
                }
                super::trace::apply1(Prim::ShardingConstraint(spec.clone()), &[self])
            }
        }
    }
}
