//! fp8 training (`quantization=fp8`): flax's XLA-native fp8 dot products with delayed scaling, as
//! MaxText uses them for the decoder layers' projections and MLP (`Fp8Quantization` in
//! `src/maxtext/layers/quantizations.py`, MaxText e591f30, whose `dot_general_cls` is flax's
//! `Fp8DirectDotGeneralOp`; the logits are not quantized: `decoders.py`'s "We do not quantize the
//! logits matmul").
//!
//! Each quantized product `y = dot_general(x, k)` (one per kernel of a decoder layer) keeps six
//! arrays of state, flax's `Fp8DotGeneralBase` variables (`flax/linen/fp8_ops.py`, flax
//! 18f8f311): `input_scale`, `kernel_scale`, `output_grad_scale` (f32 `[1]`, starting at 1) and
//! `input_amax_history`, `kernel_amax_history`, `output_grad_amax_history` (f32
//! `[AMAX_HISTORY_LENGTH]`, starting at 0). Per step, for `x` and `k` (e4m3fn) in the forward
//! pass and the output's gradient `g` (e5m2) in the backward pass, with the state `(s, h)`:
//!
//! 1. the new scale from the history *before* this step (delayed scaling, `compute_scale` with
//!    margin 0): `s' = max(h) / fp8_max` when `max(h)` is positive and finite, else `s`;
//! 2. the value quantized with it (`quantize`): `clip(v / s', -fp8_max, fp8_max)` in the compute
//!    dtype (the kernel's: `dtype`), converted to the 8-bit type;
//! 3. the new history (`compute_amax_history`): `roll(h, -1)` with `max(|v|)` written at 0.
//!
//! The products are flax's direct ones (`fp8_scaled_dot_general`, `quantized_dot`): the 8-bit
//! values go into the `dot_general` itself, which accumulates into the compute dtype
//! (`preferred_element_type`), and the scales multiply its result: `y = (qx . qk) * sx * sk`,
//! and backward `dx = (qg . qk^T) * sk * sg`, `dk = (qx^T . qg) * sx * sg` (the gradient
//! quantized to e5m2, the operands the forward pass's e4m3 values). XLA's GPU compiler runs such
//! dots as fp8 GEMMs (cuBLASLt or Triton); the quantize-dequantize form flax's `Fp8DotGeneralOp`
//! writes (and maxrs wrote before) it simplifies back to bf16 GEMMs (issue 43). The values are
//! those of the quantize-dequantize form up to where the products are rounded.
//!
//! Mixtral's experts use flax's `Fp8Einsum` instead ([`einsum`], MaxText's `_Fp8EinsumWrapper`):
//! the same product and state behind `jnp.einsum`, so a stacked `[E, ...]` kernel has one scale
//! over all its experts.
//!
//! The new state leaves the step as the *gradient* of the state (flax's
//! `OVERWRITE_WITH_GRADIENT` collection): each product is a `composite` whose backward pass
//! returns the new scales and histories as the cotangents of the old ones ([`dot`]). The train
//! step takes those "gradients" as the new state instead of handing them to the optimizer, and
//! they are neither clipped nor counted in the gradient norm (MaxText's
//! `apply_gradient_clipping`). MaxText has no key for the history length: flax's default, 1024.
//!
//! `quantization=te_fp8_currentscaling` is Transformer Engine's `Float8CurrentScaling` recipe
//! (MaxText hands it to TE; maxrs computes it with the same direct fp8 products): each value is
//! quantized with the scale of its own amax, `max(|v|) / fp8_max` (1 when that is zero or not
//! finite; TE's defaults: no epsilon, no power-of-two scales, e4m3 forward and e5m2 backward,
//! `Float8CurrentScalingQuantizer` in `transformer_engine/pytorch/tensor/float8_tensor.py`).
//! It keeps no state ([`dot_current`]).

use crate::host::f8::F8;
use crate::ir::{DType, DotDims};
use crate::tensor::{composite, concatenate, dot_transpose_lhs, dot_transpose_rhs, where_, Tensor, Tree};

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

/// The products of a layer whose parameters are `layer_params`: one per kernel `<op>.kernel`,
/// named `<op>` (MaxText's `DenseGeneral`s, whose `Fp8DirectDotGeneralOp_0` maxrs leaves out of
/// the state's names).
pub fn kernel_products(layer_params: &[ParamDef]) -> Vec<String> {
    layer_params.iter().filter_map(|p| p.name.strip_suffix(".kernel")).map(str::to_string).collect()
}

/// The fp8 state of a stack whose layers' quantized products are `products` (relative to the
/// layer): stacked over the stack's layers (`decoder.layers.<op>.<name>`, `[layers, n]`) or one
/// per layer (`decoder.layers_<i>.<op>.<name>`), named as the parameters are (`Stack::param_defs`).
pub fn stack_state_defs(products: &[String], stack: &Stack, scan_layers: bool) -> Vec<ParamDef> {
    let per_layer: Vec<ParamDef> = products.iter().flat_map(|op| state_defs(op)).collect();
    stack.param_defs(&per_layer, scan_layers)
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

/// flax's `quantize`: `clip(v / scale, -fp8_max, fp8_max)` in `v`'s dtype, converted to
/// `format`.
fn quantize(format: F8, v: &Tensor, scale: &Tensor) -> Tensor {
    let max = format.max();
    (v / &scale.reshape(&[]).astype(v.dtype())).clamp(-max, max).astype(dtype(format))
}

/// flax's `dequantize` of a product: `v` times `scale` (f32 `[1]`, cast to `v`'s dtype).
fn dequantize(v: &Tensor, scale: &Tensor) -> Tensor {
    v * &scale.reshape(&[]).astype(v.dtype())
}

/// One operand of a quantized product: its 8-bit values and the scale they were quantized with.
struct Quantized {
    q: Tensor,
    scale: Tensor,
}

impl Quantized {
    /// `v` quantized to e4m3fn with `scale`.
    fn e4m3(v: &Tensor, scale: Tensor) -> Quantized {
        Quantized { q: quantize(F8::E4M3FN, v, &scale), scale }
    }
}

/// The forward product (flax's `quantized_dot` and `out_dq`): the 8-bit operands multiplied
/// into `dtype` by one `dot_general`, times both scales.
fn scaled_dot(x: &Quantized, k: &Quantized, dims: &DotDims, dtype: DType) -> Tensor {
    dequantize(&x.q.dot_general_preferred(&k.q, dims.clone(), dtype), &(&x.scale * &k.scale))
}

/// The backward products (flax's `quantized_dot_bwd`): the output's gradient `g` quantized to
/// e5m2 with `g_scale`, multiplied with the other operand's 8-bit values into `g`'s dtype (the
/// compute dtype), times that operand's scale and `g_scale`. Returns the gradients of `x` and `k`.
fn backward_products(g: &Tensor, g_scale: &Tensor, x: &Quantized, k: &Quantized, dims: &DotDims) -> [Tensor; 2] {
    let dtype = Some(g.dtype());
    let qg = quantize(F8::E5M2, g, g_scale);
    let dx = dot_transpose_lhs(&qg, x.q.rank(), &k.q, dims, dtype);
    let dk = dot_transpose_rhs(&qg, &x.q, k.q.rank(), dims, dtype);
    [dequantize(&dx, &(&k.scale * g_scale)), dequantize(&dk, &(&x.scale * g_scale))]
}

/// The quantized product `dot_general(x, kernel, dims)` whose state is in `p` (`<op>.input_scale`,
/// ...), flax's `Fp8DirectDotGeneralOp`: `x` is cast to the kernel's dtype (the compute dtype);
/// both are quantized with their new scales and multiplied as 8-bit values, and the output's
/// gradient will be. One composite: its results after the product are what its backward pass
/// reads (the 8-bit operands, their new scales and histories), flax's residuals.
pub fn dot(p: &Tree, op: &str, x: &Tensor, kernel: &Tensor, dims: &DotDims) -> Tensor {
    let state = |name: &str| &p[format!("{op}.{name}").as_str()];
    let x = x.astype(kernel.dtype());
    let names = STATE.map(state);
    let operands = [&x, kernel, names[0], names[1], names[2], names[3], names[4], names[5]];
    let outs = composite(
        "fp8_dot",
        &operands,
        |a| {
            let format = F8::E4M3FN;
            let qx = Quantized::e4m3(&a[0], next_scale(format, &a[2], &a[3]));
            let qk = Quantized::e4m3(&a[1], next_scale(format, &a[4], &a[5]));
            let y = scaled_dot(&qx, &qk, dims, a[0].dtype());
            let (hx, hk) = (next_history(&a[3], &a[0]), next_history(&a[5], &a[1]));
            vec![y, qx.q, qx.scale, hx, qk.q, qk.scale, hk]
        },
        |ins, outs, cts| {
            let g = &cts[0];
            let g_scale = next_scale(F8::E5M2, &ins[6], &ins[7]);
            let x = Quantized { q: outs[1].clone(), scale: outs[2].clone() };
            let k = Quantized { q: outs[4].clone(), scale: outs[5].clone() };
            let [dx, dk] = backward_products(g, &g_scale, &x, &k, dims);
            let g_history = next_history(&ins[7], g);
            vec![dx, dk, x.scale, outs[3].clone(), k.scale, outs[6].clone(), g_scale, g_history]
        },
    );
    outs[0].clone()
}

/// flax's `Fp8Einsum` (`flax/linen/fp8_ops.py`, flax 18f8f311) on two operands: `jnp.einsum`
/// with [`dot`] as its one `dot_general`, so each operand has one scale over the whole tensor
/// (over every expert of a stacked `[E, ...]` kernel), with the state `<op>.input_scale`, ... in
/// `p`. `spec` is `"x,kernel->out"`; each label of an operand is in the other or in the output
/// (batch labels are in all three, contracted ones in both operands only).
pub fn einsum(p: &Tree, op: &str, spec: &str, x: &Tensor, kernel: &Tensor) -> Tensor {
    let (inputs, out) = spec.split_once("->").expect("an einsum spec `x,kernel->out`");
    let (xl, kl) = inputs.split_once(',').expect("two operands");
    let [xl, kl, out]: [Vec<char>; 3] = [xl, kl, out].map(|l| l.trim().chars().collect());
    let batch: Vec<char> = out.iter().copied().filter(|c| xl.contains(c) && kl.contains(c)).collect();
    let contract: Vec<char> = xl.iter().copied().filter(|c| kl.contains(c) && !out.contains(c)).collect();
    let pos = |l: &[char], c: &char| l.iter().position(|x| x == c).expect("a label of the operand");
    let dims = DotDims {
        lhs_batch: batch.iter().map(|c| pos(&xl, c)).collect(),
        rhs_batch: batch.iter().map(|c| pos(&kl, c)).collect(),
        lhs_contract: contract.iter().map(|c| pos(&xl, c)).collect(),
        rhs_contract: contract.iter().map(|c| pos(&kl, c)).collect(),
    };
    // dot_general's result: the batch labels, then x's free ones, then the kernel's.
    let free =
        |l: &[char]| l.iter().copied().filter(|c| !batch.contains(c) && !contract.contains(c)).collect::<Vec<_>>();
    let labels: Vec<char> = batch.iter().copied().chain(free(&xl)).chain(free(&kl)).collect();
    assert_eq!(labels.len(), out.len(), "einsum \"{spec}\": every label of an operand is in the other or the output");
    let perm: Vec<usize> = out.iter().map(|c| pos(&labels, c)).collect();
    dot(p, op, x, kernel, &dims).transpose(&perm)
}

/// The scale of current scaling: `max(|v|) / fp8_max` as f32 `[1]`, or 1 when that amax is zero
/// or not finite.
pub fn current_scale(format: F8, v: &Tensor) -> Tensor {
    let amax = v.abs().max_all().astype(DType::F32).reshape(&[1]);
    let one = amax.ones_like();
    let finite = where_(&amax.lt(f64::INFINITY), &(&amax / format.max()), &one);
    where_(&amax.gt(0.0), &finite, &one)
}

/// The quantized product `dot_general(x, kernel, dims)` with current scaling, the direct product
/// of [`dot`] with each value's own scale: `x` (cast to the kernel's dtype) and the kernel to
/// e4m3fn, the output's gradient to e5m2.
pub fn dot_current(x: &Tensor, kernel: &Tensor, dims: &DotDims) -> Tensor {
    let x = x.astype(kernel.dtype());
    let outs = composite(
        "fp8_dot_current",
        &[&x, kernel],
        |a| {
            let qx = Quantized::e4m3(&a[0], current_scale(F8::E4M3FN, &a[0]));
            let qk = Quantized::e4m3(&a[1], current_scale(F8::E4M3FN, &a[1]));
            vec![scaled_dot(&qx, &qk, dims, a[0].dtype()), qx.q, qx.scale, qk.q, qk.scale]
        },
        |_, outs, cts| {
            let x = Quantized { q: outs[1].clone(), scale: outs[2].clone() };
            let k = Quantized { q: outs[3].clone(), scale: outs[4].clone() };
            backward_products(&cts[0], &current_scale(F8::E5M2, &cts[0]), &x, &k, dims).into()
        },
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
