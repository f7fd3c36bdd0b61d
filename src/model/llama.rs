//! The Llama 2 decoder layer (MaxText's `decoder_block: llama2`, and `mistral`, whose MaxText
//! layer is the same block), top to bottom: its parameters, attention, MLP, the layer, and its
//! FLOPs. Embedding, layer stacking, final norm, logits and loss are the shared decoder's
//! (`decoder.rs`).
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
//! "fan_in" is MaxText's `variance_scaling(1.0, "fan_in", "truncated_normal")`, fan_in being the
//! product of the input dimensions (`emb` for the projections from the residual stream,
//! `heads x head_dim` for `out`, `mlp` for `wo`).
//!
//! **Query scaling.** Attention scales the queries by `1 / sqrt(head_dim)` explicitly in the
//! forward pass (after RoPE), and the query kernel is initialized like the other kernels. MaxText
//! instead folds `1 / sqrt(head_dim)` into the query kernel's initializer (and its checkpoint
//! converters fold it into the converted query weights) and does not scale at run time: to use a
//! MaxText-converted query kernel here, multiply it by `sqrt(head_dim)`.
//!
//! Numerics: weights are cast to `dtype` where used; activations are `dtype`; RMSNorm statistics,
//! RoPE and the softmax are f32.

use crate::tensor::{einsum, Tensor, Tree};

use super::attention::{rope, LayerContext};
use super::decoder::{constrain, Family, LayerFlops, LayerOutput, BTE};
use super::params::{ParamDef, ParamInit};
use super::ModelConfig;

/// The Llama 2 layer: pre-norm grouped-query attention with RoPE and a SwiGLU MLP.
#[derive(Debug)]
pub struct Llama;

impl Family for Llama {
    fn layer_params(&self, c: &ModelConfig) -> Vec<ParamDef> {
        let (e, m) = (c.emb, c.mlp);
        let mut defs = attention_params(c);
        defs.extend([
            ParamDef::new("mlp.wi_0.kernel", &[e, m], &["embed", "mlp"], ParamInit::FanIn(e)),
            ParamDef::new("mlp.wi_1.kernel", &[e, m], &["embed", "mlp"], ParamInit::FanIn(e)),
            ParamDef::new("mlp.wo.kernel", &[m, e], &["mlp", "embed"], ParamInit::FanIn(m)),
        ]);
        defs
    }

    fn layer(&self, c: &ModelConfig, p: &Tree, x: &Tensor, ctx: &LayerContext) -> LayerOutput {
        let x = attention_block(c, p, x, ctx);
        let h = x.rms_norm(&p["post_self_attention_layer_norm.scale"], c.eps);
        LayerOutput::new(constrain(c, &x + &mlp(c, p, &h), BTE))
    }

    /// MaxText's dense terms: `2 * tokens * mlp * emb` per MLP projection (one per activation, and
    /// the output), and the attention terms of `attention_flops`.
    fn layer_flops(&self, c: &ModelConfig, tokens: f64, seq: f64) -> LayerFlops {
        let ffn = 2.0 * tokens * c.mlp as f64 * c.emb as f64 * (c.mlp_activations.len() as f64 + 1.0);
        let attention = attention_flops(c, tokens, seq);
        LayerFlops { weights: ffn + attention.weights, attention: attention.attention }
    }
}

/// The attention half of a layer's parameters (shared with Mixtral, whose MaxText layer has
/// the same attention): the two norms and the q/k/v/out kernels.
pub(super) fn attention_params(c: &ModelConfig) -> Vec<ParamDef> {
    let (e, h, kv, d) = (c.emb, c.heads, c.kv_heads, c.head_dim);
    vec![
        ParamDef::new("pre_self_attention_layer_norm.scale", &[e], &["norm"], ParamInit::Ones),
        ParamDef::new("self_attention.query.kernel", &[e, h, d], &["embed", "heads", "kv"], ParamInit::FanIn(e)),
        ParamDef::new("self_attention.key.kernel", &[e, kv, d], &["embed", "kv_heads", "kv"], ParamInit::FanIn(e)),
        ParamDef::new("self_attention.value.kernel", &[e, kv, d], &["embed", "kv_heads", "kv"], ParamInit::FanIn(e)),
        ParamDef::new("self_attention.out.kernel", &[h, d, e], &["heads", "kv", "embed"], ParamInit::FanIn(h * d)),
        ParamDef::new("post_self_attention_layer_norm.scale", &[e], &["norm"], ParamInit::Ones),
    ]
}

/// The first half of a layer: `x + attention(rms_norm(x))` (the residual stream after
/// attention, before the MLP's norm).
pub(super) fn attention_block(c: &ModelConfig, p: &Tree, x: &Tensor, ctx: &LayerContext) -> Tensor {
    let h = x.rms_norm(&p["pre_self_attention_layer_norm.scale"], c.eps);
    constrain(c, x + &attention(c, p, &h, ctx), BTE)
}

/// MaxText's attention terms: `2 * tokens * emb * (heads + 2 kv_heads) * head_dim` for q/k/v and
/// `2 * tokens * emb * heads * head_dim` for the output projection (weights); `QK^T` and `PV`
/// counted causally, `4 * tokens * seq * heads * head_dim / 2` (attention).
pub(super) fn attention_flops(c: &ModelConfig, tokens: f64, seq: f64) -> LayerFlops {
    let [e, h, kv, d] = [c.emb, c.heads, c.kv_heads, c.head_dim].map(|x| x as f64);
    let qkv = 2.0 * tokens * e * (h + 2.0 * kv) * d;
    let out = 2.0 * tokens * e * h * d;
    LayerFlops { weights: qkv + out, attention: 4.0 * tokens * seq * h * d / 2.0 }
}

/// Grouped-query causal self-attention on the normed input `h: [batch, seq, emb]`; returns
/// `[batch, seq, emb]`.
fn attention(c: &ModelConfig, p: &Tree, h: &Tensor, ctx: &LayerContext) -> Tensor {
    let w = |name: &str| p[name].astype(c.dtype);
    let q = einsum("btd,dhk->bthk", &[h, &w("self_attention.query.kernel")]).checkpoint_name("query_proj");
    let k = einsum("btd,dhk->bthk", &[h, &w("self_attention.key.kernel")]).checkpoint_name("key_proj");
    let v = einsum("btd,dhk->bthk", &[h, &w("self_attention.value.kernel")]).checkpoint_name("value_proj");
    // Explicit query scaling (see the module docs).
    let q = rope(&q, ctx) * (1.0 / (c.head_dim as f64).sqrt());
    let k = rope(&k, ctx);
    let out = ctx.attend(&q, &k, &v, None);
    einsum("bthk,hkd->btd", &[&out, &w("self_attention.out.kernel")]).checkpoint_name("out_proj")
}

/// SwiGLU: `(silu(h @ wi_0) * (h @ wi_1)) @ wo`.
fn mlp(c: &ModelConfig, p: &Tree, h: &Tensor) -> Tensor {
    let w = |name: &str| p[name].astype(c.dtype);
    let gate = h.matmul(&w("mlp.wi_0.kernel")).checkpoint_name("mlpwi_0");
    let up = h.matmul(&w("mlp.wi_1.kernel")).checkpoint_name("mlpwi_1");
    (gate.silu() * &up).matmul(&w("mlp.wo.kernel")).checkpoint_name("mlpwo")
}
