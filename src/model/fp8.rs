//! fp8 training (`quantization=fp8`): flax's XLA-native fp8 dot products with delayed scaling, as
//! MaxText uses them for the decoder layers' projections and MLP (`Fp8Quantization` in
//! `src/maxtext/layers/quantizations.py`, MaxText e591f30; the logits are not quantized:
//! `decoders.py`'s "We do not quantize the logits matmul").
//!
//! Each quantized product `y = x . k` (one per kernel of a decoder layer) keeps six arrays of
//! state, flax's `Fp8DotGeneralBase` variables (`flax/linen/fp8_ops.py`, flax 18f8f311):
//! `input_scale`, `kernel_scale`, `output_grad_scale` (f32 `[1]`, starting at 1) and
//! `input_amax_history`, `kernel_amax_history`, `output_grad_amax_history` (f32
//! `[AMAX_HISTORY_LENGTH]`, starting at 0). Per step, for `x` and `k` (e4m3fn) in the forward
//! pass and the output's gradient `g` (e5m2) in the backward pass, with the state `(s, h)`:
//!
//! 1. the new scale from the history *before* this step (delayed scaling, `compute_scale` with
//!    margin 0): `s' = max(h) / fp8_max` when `max(h)` is positive and finite, else `s`;
//! 2. the value quantized and dequantized with it (`qdq`): `clip(v / s', -fp8_max, fp8_max)`
//!    converted to the 8-bit type and back, times `s'`, in the compute dtype (the kernel's:
//!    `dtype`);
//! 3. the new history (`compute_amax_history`): `roll(h, -1)` with `max(|v|)` written at 0.
//!
//! The products use the quantized `x` and `k` (and the backward pass the quantized `g`), in the
//! quantize-dequantize form of flax's `Fp8DotGeneralOp` that XLA's GPU compiler rewrites into
//! cuBLASLt fp8 GEMMs (`convert` to f8, `convert` back, scale, around the `dot`). MaxText
//! e591f30 calls flax's `Fp8DirectDotGeneralOp`, which computes the same values with the
//! `dot` on the 8-bit arrays written out; the state and its update rule are the same.
//!
//! The new state leaves the step as the *gradient* of the state (flax's
//! `OVERWRITE_WITH_GRADIENT` collection): each quantize-dequantize is a `composite` whose
//! backward pass returns the new scale and history as the cotangents of the old ones, the
//! value's own cotangent passing straight through (`in_qdq`, `out_qdq`). The train step takes
//! those "gradients" as the new state instead of handing them to the optimizer, and they are
//! neither clipped nor counted in the gradient norm (MaxText's `apply_gradient_clipping`).
//! MaxText has no key for the history length: flax's default, 1024.
//!
//! `quantization=te_fp8_currentscaling` is Transformer Engine's `Float8CurrentScaling` recipe
//! (MaxText hands it to TE; maxrs computes it with the same XLA fp8 products): each value is
//! quantized with the scale of its own amax, `max(|v|) / fp8_max` (1 when that is zero or not
//! finite; TE's defaults: no epsilon, no power-of-two scales, e4m3 forward and e5m2 backward,
//! `Float8CurrentScalingQuantizer` in `transformer_engine/pytorch/tensor/float8_tensor.py`).
//! It keeps no state ([`dot_current`]).

use crate::host::f8::F8;
use crate::ir::DType;
use crate::tensor::{composite, concatenate, where_, Tensor, Tree};

use super::params::{ParamDef, ParamInit};
use super::stacks::Stack;

/// How the scales of the fp8 products are chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scaling {
    /// From the amax history of earlier steps, kept as train state (`quantization=fp8`).
    Delayed,
    /// From the value's own amax (`quantization=te_fp8_currentscaling`).
    Current,
}

/// Entries of each amax history (`Fp8DotGeneralBase.amax_history_length`'s default).
pub const AMAX_HISTORY_LENGTH: i64 = 1024;

/// The state arrays of one quantized product, relative to it, flax's names.
pub const STATE: [&str; 6] = [
    "input_scale",
    "input_amax_history",
    "kernel_scale",
    "kernel_amax_history",
    "output_grad_scale",
    "output_grad_amax_history",
];

/// The logical axis of the state arrays: no rule names it, so they are replicated.
const LOGICAL: &str = "fp8_meta";

/// The state of the product whose kernel is `<op>.kernel`: `<op>.<STATE name>`.
pub fn state_defs(op: &str) -> Vec<ParamDef> {
    STATE
        .iter()
        .map(|name| {
            let (shape, init) = match name.ends_with("_scale") {
                true => (1, ParamInit::Ones),
                false => (AMAX_HISTORY_LENGTH, ParamInit::Zeros),
            };
            ParamDef::new(&format!("{op}.{name}"), &[shape], &[LOGICAL], init)
        })
        .collect()
}

/// The fp8 state of a stack whose layers have the parameters `layer_params`: one product per
/// `<op>.kernel`, stacked over the stack's layers (`decoder.layers.<op>.<name>`, `[layers, n]`) or
/// one per layer (`decoder.layers_<i>.<op>.<name>`), as the parameters are.
pub fn stack_state_defs(layer_params: &[ParamDef], stack: &Stack, scan_layers: bool) -> Vec<ParamDef> {
    let ops = layer_params.iter().filter_map(|p| p.name.strip_suffix(".kernel"));
    let per_layer: Vec<ParamDef> = ops.flat_map(state_defs).collect();
    if stack.scanned(scan_layers) {
        return per_layer.iter().map(|d| stack.stacked(d)).collect();
    }
    (0..stack.count)
        .flat_map(|i| {
            let prefix = stack.layer_prefix(i);
            per_layer.iter().map(move |d| ParamDef { name: format!("{prefix}.{}", d.name), ..d.clone() })
        })
        .collect()
}

/// The 8-bit type of a format.
pub fn dtype(format: F8) -> DType {
    match format {
        F8::E4M3FN => DType::F8E4M3FN,
        F8::E5M2 => DType::F8E5M2,
    }
}

/// `compute_scale` (margin 0): `max(history) / fp8_max` when that maximum is positive and
/// finite, else the old scale. f32 `[1]` in and out.
pub fn next_scale(format: F8, scale: &Tensor, history: &Tensor) -> Tensor {
    let amax = history.max(&[-1]).reshape(&[1]);
    // flax inverts twice (`1 / (fp8_max / amax)`), which rounds differently from
    // `amax / fp8_max` in the last bit: kept as written.
    let old = 1.0 / scale;
    let finite = where_(&amax.lt(f64::INFINITY), &(format.max() / &amax), &old);
    1.0 / &where_(&amax.gt(0.0), &finite, &old)
}

/// `compute_amax_history`: `roll(history, -1)` with `max(|v|)` (as f32) at index 0.
pub fn next_history(history: &Tensor, v: &Tensor) -> Tensor {
    let amax = v.abs().max_all().astype(DType::F32).reshape(&[1]);
    let n = history.shape()[0];
    if n == 1 {
        return amax;
    }
    // roll(-1) moves entry i + 1 to i and entry 0 to the end; entry 1 is then overwritten.
    concatenate(&[&amax, &history.slice_axis(0, 2, n), &history.slice_axis(0, 0, 1)], 0)
}

/// `qdq`: `v` quantized to `format` with `scale` and dequantized, in `v`'s dtype.
pub fn quantize_dequantize(format: F8, v: &Tensor, scale: &Tensor) -> Tensor {
    let s = scale.reshape(&[]).astype(v.dtype());
    let max = format.max();
    (v / &s).clamp(-max, max).astype(dtype(format)).astype(v.dtype()) * &s
}

/// flax's `in_qdq`: `v` quantized (e4m3fn) with the new scale; the backward pass passes the
/// cotangent through and returns the new scale and history as the state's cotangents.
pub fn in_qdq(v: &Tensor, scale: &Tensor, history: &Tensor) -> Tensor {
    let format = F8::E4M3FN;
    let outs = composite(
        "fp8_in_qdq",
        &[v, scale, history],
        |a| {
            let new_scale = next_scale(format, &a[1], &a[2]);
            let new_history = next_history(&a[2], &a[0]);
            vec![quantize_dequantize(format, &a[0], &new_scale), new_scale, new_history]
        },
        |_, outs, cts| vec![cts[0].clone(), outs[1].clone(), outs[2].clone()],
    );
    outs[0].clone()
}

/// flax's `out_qdq`: the identity on `y`; the backward pass quantizes the cotangent (e5m2)
/// with the new scale and returns the new scale and history as the state's cotangents.
pub fn out_qdq(y: &Tensor, scale: &Tensor, history: &Tensor) -> Tensor {
    let format = F8::E5M2;
    let outs = composite(
        "fp8_out_qdq",
        &[y, scale, history],
        |a| vec![a[0].clone()],
        |ins, _, cts| {
            let new_scale = next_scale(format, &ins[1], &ins[2]);
            let new_history = next_history(&ins[2], &cts[0]);
            vec![quantize_dequantize(format, &cts[0], &new_scale), new_scale, new_history]
        },
    );
    outs[0].clone()
}

/// The product `product(x, kernel)` of the quantized product `op` whose state is in `p`
/// (`<op>.input_scale`, ...), flax's `Fp8DotGeneralOp.__call__`: `x` is cast to the kernel's
/// dtype (the compute dtype), both are quantized, and the output's gradient will be.
pub fn dot(p: &Tree, op: &str, x: &Tensor, kernel: &Tensor, product: impl Fn(&Tensor, &Tensor) -> Tensor) -> Tensor {
    let state = |name: &str| &p[format!("{op}.{name}").as_str()];
    let x = in_qdq(&x.astype(kernel.dtype()), state("input_scale"), state("input_amax_history"));
    let k = in_qdq(kernel, state("kernel_scale"), state("kernel_amax_history"));
    out_qdq(&product(&x, &k), state("output_grad_scale"), state("output_grad_amax_history"))
}

/// The scale of current scaling: `max(|v|) / fp8_max` as f32 `[1]`, or 1 when that amax is zero
/// or not finite.
pub fn current_scale(format: F8, v: &Tensor) -> Tensor {
    let amax = v.abs().max_all().astype(DType::F32).reshape(&[1]);
    let one = amax.ones_like();
    let finite = where_(&amax.lt(f64::INFINITY), &(&amax / format.max()), &one);
    where_(&amax.gt(0.0), &finite, &one)
}

/// The product `product(x, kernel)` with current scaling: `x` (cast to the kernel's dtype) and
/// the kernel quantized to e4m3fn with their own scales, the output's gradient to e5m2 with its
/// own; the quantizations pass cotangents straight through.
pub fn dot_current(x: &Tensor, kernel: &Tensor, product: impl Fn(&Tensor, &Tensor) -> Tensor) -> Tensor {
    let quantize = |v: &Tensor| {
        let outs = composite(
            "fp8_current_qdq",
            &[v],
            |a| vec![quantize_dequantize(F8::E4M3FN, &a[0], &current_scale(F8::E4M3FN, &a[0]))],
            |_, _, cts| vec![cts[0].clone()],
        );
        outs[0].clone()
    };
    let y = product(&quantize(&x.astype(kernel.dtype())), &quantize(kernel));
    let outs = composite(
        "fp8_current_grad_qdq",
        &[&y],
        |a| vec![a[0].clone()],
        |_, _, cts| vec![quantize_dequantize(F8::E5M2, &cts[0], &current_scale(F8::E5M2, &cts[0]))],
    );
    outs[0].clone()
}

/// Splits a tree holding the model's parameters and fp8 state (`state_names`) into the two.
pub fn split(tree: &Tree, state_names: &[String]) -> (Tree, Tree) {
    let (mut params, mut state) = (Tree::new(), Tree::new());
    for (name, value) in tree.iter() {
        let side = if state_names.iter().any(|s| s == name) { &mut state } else { &mut params };
        side.insert(name, value.clone());
    }
    (params, state)
}
