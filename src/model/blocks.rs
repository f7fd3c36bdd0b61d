//! MaxText's layer blocks that several families share, each as its parameters (named relative to
//! the block's prefix, MaxText's names) and its computation:
//!
//! - [`Norm`]: `RMSNorm` (`<name>.scale`) and GPT-3's `LayerNorm` (`<name>.scale`, applied as
//!   `scale + 1`, and `<name>.bias`) — MaxText's `get_norm_layer`;
//! - [`Mlp`]: `MlpBlock`, one input projection per activation (`wi` for one, `wi_0`, `wi_1`, ...
//!   for several) multiplied together, then `wo`; optional biases and pre-norm (GPT-3);
//! - [`SelfAttention`]: `Attention`'s query, key, value and output projections around RoPE and
//!   `LayerContext::attend` (sliding window, soft cap, f32 query-key product; dot-product or
//!   blockwise; the key/value cache when decoding), its queries' `1 / sqrt(head_dim)` folded into
//!   the query kernel or applied at run time as MaxText's family does it ([`QueryScale`]).
//!
//! Numerics as MaxText's: weights are cast to `dtype` where used; RMSNorm statistics, RoPE and
//! the softmax are f32; GPT-3's LayerNorm reduces in `dtype` (`reductions_in_fp32=False`). With
//! fp8 quantization every product with a kernel (MaxText's `DenseGeneral`s) is an fp8 product.

use crate::host::{convert_float, HostTensor};
use crate::ir::{DType, DotDims};
use crate::tensor::{Tensor, Tree};

use super::fp8::{self, Scaling};
use super::lora;

use super::attention::{rope_with, AttendOptions, LayerContext};
use super::params::{ParamDef, ParamInit};
use super::ModelConfig;

/// The product of `x` with the kernel `<op>.kernel` (cast to `dtype`), MaxText's `DenseGeneral`:
/// `x`'s last `axes` dims contracted with the kernel's first `axes` (`_compute_dot_general` in
/// `src/maxtext/layers/linears.py`, e591f30: `dot_general(inputs, kernel, ((axis,
/// contract_ind), ((), ())))`); an fp8 product with `quantization=fp8` (state
/// `<op>.input_scale`, ... in `p`) or `te_fp8_currentscaling`, which take those dims as they are.
pub(super) fn dense(c: &ModelConfig, p: &Tree, op: &str, x: &Tensor, axes: usize) -> Tensor {
    let kernel = p[format!("{op}.kernel").as_str()].astype(c.dtype);
    let dims = DotDims {
        lhs_batch: vec![],
        rhs_batch: vec![],
        lhs_contract: (x.rank() - axes..x.rank()).collect(),
        rhs_contract: (0..axes).collect(),
    };
    let product = match c.fp8 {
        Some(Scaling::Delayed) => fp8::dot(p, op, x, &kernel, &dims),
        Some(Scaling::Current) => fp8::dot_current(x, &kernel, &dims),
        None => x.dot_general(&kernel, dims),
    };
    let adapted = c.lora.as_ref().and_then(|l| lora::delta(p, op, x, axes, &kernel.shape()[axes..], l.scale()));
    match adapted {
        Some(delta) => (product.astype(DType::F32) + &delta).astype(product.dtype()),
        None => product,
    }
}

/// A normalization layer and its epsilon.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Norm {
    /// `x / sqrt(mean(x^2) + eps) * scale` (statistics in f32); `scale` starts at ones.
    Rms { eps: f64 },
    /// MaxText's `Gpt3LayerNorm`: `(x - mean) / sqrt(var + eps) * (scale + 1) + bias`, computed in
    /// the activations' dtype; `scale` and `bias` start at zeros.
    Gpt3LayerNorm { eps: f64 },
}

impl Norm {
    /// The parameters of the norm called `name` over `features`.
    pub fn params(&self, name: &str, features: i64) -> Vec<ParamDef> {
        match self {
            Norm::Rms { .. } => vec![ParamDef::new(&format!("{name}.scale"), &[features], &["norm"], ParamInit::Ones)],
            Norm::Gpt3LayerNorm { .. } => vec![
                ParamDef::new(&format!("{name}.scale"), &[features], &["norm"], ParamInit::Zeros),
                ParamDef::new(&format!("{name}.bias"), &[features], &["norm"], ParamInit::Zeros),
            ],
        }
    }

    /// The norm called `name` (parameters in `p`) over the last axis of `x`.
    pub fn apply(&self, p: &Tree, name: &str, x: &Tensor) -> Tensor {
        let scale = &p[format!("{name}.scale").as_str()];
        match *self {
            Norm::Rms { eps } => x.rms_norm(scale, eps),
            Norm::Gpt3LayerNorm { eps } => {
                let dtype = x.dtype();
                let centered = x - &x.mean_keepdims(&[-1]);
                let var = centered.square().mean_keepdims(&[-1]);
                let normed = centered * &(var + eps).rsqrt();
                normed * &(scale.astype(dtype) + 1.0) + &p[format!("{name}.bias").as_str()].astype(dtype)
            }
        }
    }
}

/// An MLP activation (`mlp_activations` entry).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    Silu,
    /// flax's `gelu`: the tanh approximation.
    Gelu,
    Relu,
    Sigmoid,
    Linear,
}

impl Activation {
    /// MaxText's name (`config::MLP_ACTIVATIONS` lists those maxrs implements).
    pub fn parse(name: &str) -> Option<Activation> {
        Some(match name {
            "silu" => Activation::Silu,
            "gelu" => Activation::Gelu,
            "relu" => Activation::Relu,
            "sigmoid" => Activation::Sigmoid,
            "linear" => Activation::Linear,
            _ => return None,
        })
    }

    pub fn apply(self, x: &Tensor) -> Tensor {
        match self {
            Activation::Silu => x.silu(),
            Activation::Gelu => x.gelu(),
            Activation::Relu => x.relu(),
            Activation::Sigmoid => x.sigmoid(),
            Activation::Linear => x.clone(),
        }
    }
}

/// MaxText's `MlpBlock`: `(act_0(h @ wi_0) * act_1(h @ wi_1) * ...) @ wo`.
#[derive(Clone, Debug, PartialEq)]
pub struct Mlp {
    pub activations: Vec<Activation>,
    /// Biases on every projection (`wi*.bias`: [mlp], `wo.bias`: [emb]).
    pub use_bias: bool,
    /// A norm of the input inside the block (`mlp_layer_norm`), as GPT-3's.
    pub pre_norm: Option<Norm>,
}

impl Mlp {
    /// The block for `c.mlp_activations` (names checked by `Model::from_config`).
    pub fn new(c: &ModelConfig, use_bias: bool, pre_norm: Option<Norm>) -> Mlp {
        let activations = c.mlp_activations.iter().filter_map(|a| Activation::parse(a)).collect();
        Mlp { activations, use_bias, pre_norm }
    }

    /// MaxText's names of the input projections: `wi` when there is one, else `wi_0`, `wi_1`, ...
    fn input_names(&self) -> Vec<String> {
        match self.activations.len() {
            1 => vec!["wi".to_string()],
            n => (0..n).map(|i| format!("wi_{i}")).collect(),
        }
    }

    /// The block's parameters under `prefix` (e.g. `mlp`).
    pub fn params(&self, prefix: &str, emb: i64, mlp: i64) -> Vec<ParamDef> {
        let mut defs = self.pre_norm.map(|n| n.params(&format!("{prefix}.mlp_layer_norm"), emb)).unwrap_or_default();
        let mut dense = |name: &str, fan_in: i64, out: i64, logical: [&'static str; 2]| {
            defs.push(ParamDef::dense_kernel(
                &format!("{prefix}.{name}.kernel"),
                &[fan_in, out],
                &logical,
                ParamInit::FanIn(fan_in),
                1,
            ));
            if self.use_bias {
                defs.push(ParamDef::new(&format!("{prefix}.{name}.bias"), &[out], &logical[1..], ParamInit::Zeros));
            }
        };
        for name in self.input_names() {
            dense(&name, emb, mlp, ["embed", "mlp"]);
        }
        dense("wo", mlp, emb, ["mlp", "embed"]);
        defs
    }

    /// The block on `h: [batch, seq, emb]`. Each input projection is tagged `mlp<name>` and the
    /// output `mlpwo` (MaxText's `checkpoint_name`s, which remat policies save).
    pub fn apply(&self, c: &ModelConfig, p: &Tree, prefix: &str, h: &Tensor) -> Tensor {
        let dense = |name: &str, x: &Tensor| {
            let y = dense(c, p, &format!("{prefix}.{name}"), x, 1);
            match self.use_bias {
                true => y + &p[format!("{prefix}.{name}.bias").as_str()].astype(c.dtype),
                false => y,
            }
        };
        let h = match self.pre_norm {
            Some(norm) => norm.apply(p, &format!("{prefix}.mlp_layer_norm"), h),
            None => h.clone(),
        };
        let hidden = self
            .input_names()
            .iter()
            .zip(&self.activations)
            .map(|(name, act)| act.apply(&dense(name, &h).checkpoint_name(&format!("mlp{name}"))))
            .reduce(|a, b| a * &b)
            .expect("an MLP has at least one activation");
        dense("wo", &hidden).checkpoint_name("mlpwo")
    }
}

/// How an attention block scales its queries, as MaxText's `Attention` does
/// (`src/maxtext/layers/attentions.py` at MaxText e591f30).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum QueryScale {
    /// `1 / sqrt(head_dim)` folded into the query kernel, nothing at run time: MaxText's default
    /// (`Attention.init_query_w` draws the kernel as the others and divides it by `depth_scaling`,
    /// [`depth_scaling`]; `Attention.__call__` scales only by a `query_pre_attn_scalar`, and
    /// every attention kernel of `layers/attention_op.py` takes `scale=1.0`). The stored kernel is
    /// MaxText's, so Adam trains it as MaxText does.
    Folded,
    /// The queries multiplied by this after RoPE, the kernel drawn as the others: MaxText's
    /// `query_pre_attn_scalar` (neither None nor 1.0), which turns the folding off.
    RunTime(f64),
}

/// MaxText's `depth_scaling`: `sqrt(head_dim)` in f32 (`jnp.sqrt` of an int) cast to `dtype`, e.g.
/// 11.3125 for head_dim 128 in bfloat16 (`Attention.init_query_w`, `layers/attentions.py` at
/// MaxText e591f30).
pub fn depth_scaling(head_dim: i64, dtype: DType) -> f64 {
    let sqrt = HostTensor::from_f32(&[], &[(head_dim as f32).sqrt()]);
    convert_float(&sqrt, dtype).to_f64()[0]
}

/// MaxText's `Attention` block for self-attention: grouped-query projections, RoPE on queries and
/// keys, the queries' scale folded into the query kernel or applied after RoPE ([`QueryScale`]),
/// causal attention (`LayerContext::attend`), output projection.
///
/// With `qk_norm` (MaxText's `use_qk_norm`, Gemma 3) the queries and keys are RMS-normalized over
/// `head_dim` after their projections, before RoPE (`query_norm.scale`, `key_norm.scale`:
/// `[head_dim]`, ones), as `Attention.__call__` does (`src/maxtext/layers/attentions.py`, e591f30).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SelfAttention {
    /// Keys at most this many tokens back (`t - s < window`), besides causality.
    pub window: Option<i64>,
    pub options: AttendOptions,
    /// QK-norm (MaxText's `use_qk_norm`): an RMSNorm over each head's queries and keys, with this
    /// epsilon, before RoPE (`query_norm.scale`, `key_norm.scale`: [head_dim]).
    pub qk_norm: Option<f64>,
    /// Where the queries' scale is: in the query kernel or applied at run time.
    pub queries: QueryScale,
    /// Learned biases on the query, key and value projections (`<proj>.bias`: the projection's
    /// output shape and axes, zeros), added in `dtype` after the product, before QK-norm and RoPE:
    /// MaxText's `use_bias_in_projections` as qwen2 sets it from `attention_bias`, which leaves the
    /// output projection without one (`Attention.init_out_w` in `src/maxtext/layers/attentions.py`,
    /// `DenseGeneral` in `layers/linears.py`, e591f30).
    pub qkv_bias: bool,
}

impl SelfAttention {
    /// Plain causal attention (no window, soft cap, QK-norm or biases) with `queries`.
    pub const fn new(queries: QueryScale) -> SelfAttention {
        let options = AttendOptions { logits_soft_cap: None, float32_qk_product: false };
        SelfAttention { window: None, options, qk_norm: None, queries, qkv_bias: false }
    }

    /// The projections' parameters under `prefix` (e.g. `self_attention`): the query kernel's
    /// draw divided by [`depth_scaling`] when its scale is folded in.
    pub fn params(&self, prefix: &str, c: &ModelConfig) -> Vec<ParamDef> {
        let (e, h, kv, d) = (c.emb, c.heads, c.kv_heads, c.head_dim);
        // Every projection contracts the embedding but `out`, which contracts heads and head_dim.
        let def = |name: &str, shape: &[i64], logical: &[&'static str], init: ParamInit| {
            let contract = if name == "out" { 2 } else { 1 };
            ParamDef::dense_kernel(&format!("{prefix}.{name}.kernel"), shape, logical, init, contract)
        };
        let query = match self.queries {
            QueryScale::Folded => ParamInit::FanInOver { fan_in: e, depth_scaling: depth_scaling(d, c.dtype) },
            QueryScale::RunTime(_) => ParamInit::FanIn(e),
        };
        vec![
            def("query", &[e, h, d], &["embed", "heads", "kv"], query),
            def("key", &[e, kv, d], &["embed", "kv_heads", "kv"], ParamInit::FanIn(e)),
            def("value", &[e, kv, d], &["embed", "kv_heads", "kv"], ParamInit::FanIn(e)),
            def("out", &[h, d, e], &["heads", "kv", "embed"], ParamInit::FanIn(h * d)),
        ]
    }

    /// `params`, with the projection biases and the query and key norms when the block has them.
    pub fn all_params(&self, prefix: &str, c: &ModelConfig) -> Vec<ParamDef> {
        let mut defs = self.params(prefix, c);
        if self.qkv_bias {
            let (h, kv, d) = (c.heads, c.kv_heads, c.head_dim);
            for (name, heads, axis) in [("query", h, "heads"), ("key", kv, "kv_heads"), ("value", kv, "kv_heads")] {
                defs.push(ParamDef::new(
                    &format!("{prefix}.{name}.bias"),
                    &[heads, d],
                    &[axis, "kv"],
                    ParamInit::Zeros,
                ));
            }
        }
        if self.qk_norm.is_some() {
            for name in ["query_norm", "key_norm"] {
                defs.push(ParamDef::new(&format!("{prefix}.{name}.scale"), &[c.head_dim], &["norm"], ParamInit::Ones));
            }
        }
        defs
    }

    /// The block on the normed input `h: [batch, seq, emb]`; returns `[batch, seq, emb]`.
    pub fn apply(&self, c: &ModelConfig, p: &Tree, prefix: &str, h: &Tensor, ctx: &LayerContext) -> Tensor {
        self.apply_with_rope(c, p, prefix, h, ctx, (&ctx.cos, &ctx.sin))
    }

    /// `apply` with the RoPE tables `(cos, sin)` (`attention::rope_tables`) instead of the
    /// context's (Gemma 3's local and global layers have their own).
    pub fn apply_with_rope(
        &self,
        c: &ModelConfig,
        p: &Tree,
        prefix: &str,
        h: &Tensor,
        ctx: &LayerContext,
        (cos, sin): (&Tensor, &Tensor),
    ) -> Tensor {
        // `btd,dhk->bthk`, and `bthk,hkd->btd` for the output.
        let project = |name: &str, x: &Tensor, axes: usize| dense(c, p, &format!("{prefix}.{name}"), x, axes);
        let input = |name: &str| match self.qkv_bias {
            true => project(name, h, 1) + &p[format!("{prefix}.{name}.bias").as_str()].astype(c.dtype),
            false => project(name, h, 1),
        };
        let q = input("query");
        let k = input("key");
        let v = input("value").checkpoint_name("value_proj");
        let (q, k) = match self.qk_norm {
            Some(eps) => {
                let norm = Norm::Rms { eps };
                (norm.apply(p, &format!("{prefix}.query_norm"), &q), norm.apply(p, &format!("{prefix}.key_norm"), &k))
            }
            None => (q, k),
        };
        let q = match self.queries {
            QueryScale::Folded => rope_with(&q, cos, sin, ctx.interleaved_rope),
            QueryScale::RunTime(scale) => rope_with(&q, cos, sin, ctx.interleaved_rope) * scale,
        };
        // Tagged as attention reads them, after RoPE and scaling, as MaxText's
        // `Attention.__call__` tags `query_proj` and `key_proj` (`src/maxtext/layers/attentions.py`,
        // e591f30): a policy that saves them does not recompute RoPE in the backward pass.
        let q = q.checkpoint_name("query_proj");
        let k = rope_with(&k, cos, sin, ctx.interleaved_rope).checkpoint_name("key_proj");
        let out = ctx.attend(&q, &k, &v, self.window, &self.options);
        project("out", &out, 2).checkpoint_name("out_proj")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every activation name the configuration accepts has an implementation here.
    #[test]
    fn every_accepted_activation_parses() {
        for name in crate::config::MLP_ACTIVATIONS {
            assert!(Activation::parse(name).is_some(), "{name}");
        }
        assert_eq!(Activation::parse("swish"), None);
    }

    /// MaxText's `jnp.sqrt(head_dim).astype(dtype)`: sqrt(128) is 11.3125 in bfloat16 (8
    /// significant bits, steps of 1/16 in [8, 16)) and 11.313708305358887 in float32, as JAX 0.12
    /// gives them (`float(jnp.sqrt(128).astype(jnp.bfloat16))`, `float(jnp.sqrt(128))`).
    #[test]
    fn depth_scaling_is_rounded_to_dtype() {
        assert_eq!(depth_scaling(128, DType::BF16), 11.3125);
        assert_eq!(depth_scaling(128, DType::F32), 11.313_708_305_358_887);
        assert_eq!(depth_scaling(256, DType::BF16), 16.0);
    }
}
