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
//! | `self_attention.query.kernel` | [emb, heads, head_dim] | embed, heads, kv | fan_in / sqrt(head_dim) |
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
//! **Query scaling.** As MaxText's: `1 / sqrt(head_dim)` is folded into the query kernel, whose
//! fan-in draw is divided by `sqrt(head_dim)` rounded to `dtype`, and the queries are not scaled at
//! run time (`blocks::QueryScale::Folded`; `LlamaDecoderLayer` in `src/maxtext/models/llama2.py`
//! at MaxText e591f30 passes its `Attention` no `query_pre_attn_scalar` nor QK-norm). A Hugging
//! Face checkpoint's `q_proj` is divided by `sqrt(head_dim)` on the way in (`hf::llama`).
//!
//! Numerics: weights are cast to `dtype` where used; activations are `dtype`; RMSNorm statistics,
//! RoPE and the softmax are f32.

use crate::tensor::{Tensor, Tree};

use super::attention::LayerContext;
use super::blocks::{Mlp, Norm, QueryScale, SelfAttention};
use super::family::LayerRngs;
use super::family::{constrain, dense_layer_flops, Family, LayerFlops, LayerOutput, BTE};
use super::params::ParamDef;
use super::ModelConfig;

/// The Llama 2 layer: pre-norm grouped-query attention with RoPE and a gated MLP.
#[derive(Debug)]
pub struct Llama;

impl Family for Llama {
    /// MaxText's `LlamaDecoderLayer` (`src/maxtext/models/llama2.py` at e591f30) keeps no `rngs` and has a `dropout`
    /// (line 130).
    fn layer_rngs(&self, _c: &ModelConfig, _kind: usize) -> Option<LayerRngs> {
        Some(LayerRngs { keeps: false, dropout: true })
    }

    fn layer_params(&self, c: &ModelConfig, _kind: usize) -> Vec<ParamDef> {
        layer_params(c)
    }

    fn layer(&self, c: &ModelConfig, _kind: usize, p: &Tree, x: &Tensor, ctx: &LayerContext) -> LayerOutput {
        LayerOutput::new(layer(c, p, x, ctx, &ATTENTION))
    }

    fn layer_flops(&self, c: &ModelConfig, _kind: usize, tokens: f64, seq: f64) -> LayerFlops {
        dense_layer_flops(c, tokens, seq)
    }
}

/// The layer's parameters (the table above), in the order they are drawn.
pub(super) fn layer_params(c: &ModelConfig) -> Vec<ParamDef> {
    let mut defs = attention_params(c, &ATTENTION);
    defs.extend(Mlp::new(c, false, None).params("mlp", c.emb, c.mlp));
    defs
}

/// The attention of Llama's layer (Mistral's and Mixtral's too: their MaxText layers build the
/// same `Attention`), its queries' scale folded into the query kernel.
pub(super) const ATTENTION: SelfAttention = SelfAttention::new(QueryScale::Folded);

/// The attention half's parameters (shared with Mixtral, whose MaxText layer has the same
/// attention, and Qwen3): the two norms (the second normalizes the MLP's input) and `attention`'s
/// projections.
pub(super) fn attention_params(c: &ModelConfig, attention: &SelfAttention) -> Vec<ParamDef> {
    let norm = Norm::Rms { eps: c.eps };
    let mut defs = norm.params("pre_self_attention_layer_norm", c.emb);
    defs.extend(attention.params("self_attention", c));
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
