//! MaxText's layer blocks that several families share, each as its parameters (named relative to
//! the block's prefix, MaxText's names) and its computation:
//!
//! - [`Norm`]: `RMSNorm` (`<name>.scale`) and GPT-3's `LayerNorm` (`<name>.scale`, applied as
//!   `scale + 1`, and `<name>.bias`) — MaxText's `get_norm_layer`;
//! - [`Mlp`]: `MlpBlock`, one input projection per activation (`wi` for one, `wi_0`, `wi_1`, ...
//!   for several) multiplied together, then `wo`; optional biases and pre-norm (GPT-3);
//! - [`SelfAttention`]: `Attention`'s query, key, value and output projections around RoPE and
//!   `LayerContext::attend` (sliding window, soft cap, f32 query-key product; dot-product or
//!   blockwise; the key/value cache when decoding).
//!
//! Numerics as MaxText's: weights are cast to `dtype` where used; RMSNorm statistics, RoPE and
//! the softmax are f32; GPT-3's LayerNorm reduces in `dtype` (`reductions_in_fp32=False`). With
//! fp8 quantization every product with a kernel (MaxText's `DenseGeneral`s) is an fp8 product.

use crate::ir::DotDims;
use crate::tensor::{Tensor, Tree};

use super::fp8::{self, Scaling};

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
    match c.fp8 {
        Some(Scaling::Delayed) => fp8::dot(p, op, x, &kernel, &dims),
        Some(Scaling::Current) => fp8::dot_current(x, &kernel, &dims),
        None => x.dot_general(&kernel, dims),
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
    Linear,
}

impl Activation {
    /// MaxText's name (`config::MLP_ACTIVATIONS` lists those maxrs implements).
    pub fn parse(name: &str) -> Option<Activation> {
        Some(match name {
            "silu" => Activation::Silu,
            "gelu" => Activation::Gelu,
            "relu" => Activation::Relu,
            "linear" => Activation::Linear,
            _ => return None,
        })
    }

    fn apply(self, x: &Tensor) -> Tensor {
        match self {
            Activation::Silu => x.silu(),
            Activation::Gelu => x.gelu(),
            Activation::Relu => x.relu(),
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
            defs.push(ParamDef::new(
                &format!("{prefix}.{name}.kernel"),
                &[fan_in, out],
                &logical,
                ParamInit::FanIn(fan_in),
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

/// MaxText's `Attention` block for self-attention: grouped-query projections, RoPE on queries and
/// keys, queries scaled by `1 / sqrt(head_dim)` at run time (docs/src/reference/parameters.md),
/// causal attention (`LayerContext::attend`), output projection.
///
/// With `qk_norm` (MaxText's `use_qk_norm`, Gemma 3) the queries and keys are RMS-normalized over
/// `head_dim` after their projections, before RoPE (`query_norm.scale`, `key_norm.scale`:
/// `[head_dim]`, ones), as `Attention.__call__` does (`src/maxtext/layers/attentions.py`, e591f30).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SelfAttention {
    /// Keys at most this many tokens back (`t - s < window`), besides causality.
    pub window: Option<i64>,
    pub options: AttendOptions,
    /// QK-norm (MaxText's `use_qk_norm`): an RMSNorm over each head's queries and keys, with this
    /// epsilon, before RoPE (`query_norm.scale`, `key_norm.scale`: [head_dim]).
    pub qk_norm: Option<f64>,
    /// What the queries are multiplied by after RoPE, instead of `1 / sqrt(head_dim)` (MaxText's
    /// `query_pre_attn_scalar`).
    pub query_scale: Option<f64>,
    /// Learned biases on the query, key and value projections (`<proj>.bias`: the projection's
    /// output shape and axes, zeros), added in `dtype` after the product, before QK-norm and RoPE:
    /// MaxText's `use_bias_in_projections` as qwen2 sets it from `attention_bias`, which leaves the
    /// output projection without one (`Attention.init_out_w` in `src/maxtext/layers/attentions.py`,
    /// `DenseGeneral` in `layers/linears.py`, e591f30).
    pub qkv_bias: bool,
}

impl SelfAttention {
    /// The block's parameters under `prefix` (e.g. `self_attention`).
    pub fn params(prefix: &str, c: &ModelConfig) -> Vec<ParamDef> {
        let (e, h, kv, d) = (c.emb, c.heads, c.kv_heads, c.head_dim);
        let def = |name: &str, shape: &[i64], logical: &[&'static str], fan_in: i64| {
            ParamDef::new(&format!("{prefix}.{name}.kernel"), shape, logical, ParamInit::FanIn(fan_in))
        };
        vec![
            def("query", &[e, h, d], &["embed", "heads", "kv"], e),
            def("key", &[e, kv, d], &["embed", "kv_heads", "kv"], e),
            def("value", &[e, kv, d], &["embed", "kv_heads", "kv"], e),
            def("out", &[h, d, e], &["heads", "kv", "embed"], h * d),
        ]
    }

    /// `params`, with the projection biases and the query and key norms when the block has them.
    pub fn all_params(&self, prefix: &str, c: &ModelConfig) -> Vec<ParamDef> {
        let mut defs = SelfAttention::params(prefix, c);
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
        // Tagged as attention reads them, after RoPE and scaling, as MaxText's
        // `Attention.__call__` tags `query_proj` and `key_proj` (`src/maxtext/layers/attentions.py`,
        // e591f30): a policy that saves them does not recompute RoPE in the backward pass.
        let scale = self.query_scale.unwrap_or(1.0 / (c.head_dim as f64).sqrt());
        let q = (rope_with(&q, cos, sin, ctx.interleaved_rope) * scale).checkpoint_name("query_proj");
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
}
