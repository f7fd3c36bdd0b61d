//! The Llama 2 decoder layer (MaxText's `decoder_block: llama2`, also Llama 3 and 3.1, whose
//! RoPE is the shared `rope_type`), top to bottom: its parameters, the layer, and its FLOPs.
//! Mistral's layer is this one with a sliding window (`mistral.rs`). Embedding, layer stacking,
//! final norm, logits and loss are the shared decoder's (`decoder.rs`); the norm, attention and
//! MLP blocks are `blocks.rs`'s.
//!
//! One layer's parameters (stacked on a leading `layers` axis by the decoder):
//!
//! | name | shape | logical axes | init |
//! |---|---|---|---|
//! | `pre_self_attention_layer_norm.scale` | [emb] | norm | ones |
//! | `self_attention.query.kernel` | [emb, heads, head_dim] | embed, heads, kv | fan_in |
//! | `self_attention.key.kernel` | [emb, kv_heads, head_dim] | embed, kv_heads, kv | fan_in |
//! | `self_attention.value.kernel` | [emb, kv_heads, head_dim] | embed, kv_heads, kv | fan_in |
//! | `self_attention.out.kernel` | [heads, head_dim, emb] | heads, kv, embed | fan_in (heads x head_dim) |
//! | `post_self_attention_layer_norm.scale` | [emb] | norm | ones |
//! | `mlp.wi_0.kernel` | [emb, mlp] | embed, mlp | fan_in |
//! | `mlp.wi_1.kernel` | [emb, mlp] | embed, mlp | fan_in |
//! | `mlp.wo.kernel` | [mlp, emb] | mlp, embed | fan_in |
//!
//! (`mlp.wi_<i>` is one projection per `mlp_activations` entry, `mlp.wi` when there is one:
//! `[silu, linear]` is SwiGLU.)
//!
//! "fan_in" is MaxText's `variance_scaling(1.0, "fan_in", "truncated_normal")`, fan_in being the
//! product of the input dimensions (`emb` for the projections from the residual stream,
//! `heads x head_dim` for `out`, `mlp` for `wo`).
//!
//! **Query scaling.** Attention scales the queries by `1 / sqrt(head_dim)` explicitly in the
//! forward pass (after RoPE), and the query kernel is initialized like the other kernels. MaxText
//! instead folds `1 / sqrt(head_dim)` into the query kernel's initializer (and its checkpoint
//! converters fold it into the converted query weights) and does not scale at run time: reading
//! a MaxText checkpoint multiplies the query kernel by `sqrt(head_dim)` (`maxtext_factors`).
//!
//! Numerics: weights are cast to `dtype` where used; activations are `dtype`; RMSNorm statistics,
//! RoPE and the softmax are f32.

use crate::tensor::{Tensor, Tree};

use super::attention::LayerContext;
use super::blocks::{Mlp, Norm, SelfAttention};
use super::family::{constrain, dense_layer_flops, folded_queries, Family, LayerFlops, LayerOutput, BTE};
use super::params::ParamDef;
use super::ModelConfig;

/// The Llama 2 layer: pre-norm grouped-query attention with RoPE and a gated MLP.
#[derive(Debug)]
pub struct Llama;

impl Family for Llama {
    fn maxtext_factors(&self, c: &ModelConfig, _kind: usize) -> Vec<(String, f64)> {
        folded_queries(c, &["self_attention"])
    }

    fn layer_params(&self, c: &ModelConfig, _kind: usize) -> Vec<ParamDef> {
        layer_params(c)
    }

    fn layer(&self, c: &ModelConfig, _kind: usize, p: &Tree, x: &Tensor, ctx: &LayerContext) -> LayerOutput {
        LayerOutput::new(layer(c, p, x, ctx, &SelfAttention::default()))
    }

    fn layer_flops(&self, c: &ModelConfig, _kind: usize, tokens: f64, seq: f64) -> LayerFlops {
        dense_layer_flops(c, tokens, seq)
    }
}

/// The layer's parameters (the table above), in the order they are drawn.
pub(super) fn layer_params(c: &ModelConfig) -> Vec<ParamDef> {
    let mut defs = attention_params(c);
    defs.extend(Mlp::new(c, false, None).params("mlp", c.emb, c.mlp));
    defs
}

/// The attention half's parameters (shared with Mixtral, whose MaxText layer has the same
/// attention): the two norms (the second normalizes the MLP's input) and the projections.
pub(super) fn attention_params(c: &ModelConfig) -> Vec<ParamDef> {
    let norm = Norm::Rms { eps: c.eps };
    let mut defs = norm.params("pre_self_attention_layer_norm", c.emb);
    defs.extend(SelfAttention::params("self_attention", c));
    defs.extend(norm.params("post_self_attention_layer_norm", c.emb));
    defs
}

/// `x + attention(norm(x))`, then `+ mlp(norm(.))`, with `attention`'s window and options.
pub(super) fn layer(c: &ModelConfig, p: &Tree, x: &Tensor, ctx: &LayerContext, attention: &SelfAttention) -> Tensor {
    let x = attention_half(c, p, x, ctx, attention);
    let h = Norm::Rms { eps: c.eps }.apply(p, "post_self_attention_layer_norm", &x);
    constrain(c, &x + &Mlp::new(c, false, None).apply(c, p, "mlp", &h), BTE)
}

/// `x + attention(norm(x))`: the residual stream after attention, before the MLP's norm (Mixtral's
/// too).
pub(super) fn attention_half(
    c: &ModelConfig,
    p: &Tree,
    x: &Tensor,
    ctx: &LayerContext,
    attention: &SelfAttention,
) -> Tensor {
    let h = Norm::Rms { eps: c.eps }.apply(p, "pre_self_attention_layer_norm", x);
    constrain(c, x + &attention.apply(c, p, "self_attention", &h, ctx), BTE)
}
