//! The Gemma 2 decoder layer (MaxText's `decoder_block: gemma2`, `Gemma2DecoderLayer` in
//! `src/maxtext/models/gemma2.py`, e591f30), top to bottom: its parameters, the layer, its FLOPs.
//!
//! Gemma 2 alternates a local layer (attention over the last `sliding_window_size` tokens) and a
//! global one. As in MaxText, one decoder "layer" here is such a pair, so
//! `base_num_decoder_layers` counts pairs (`gemma2-2b`'s 13 are its 26 layers) and the scan runs
//! over pairs (MaxText's scan length is `num_decoder_layers / inhomogeneous_layer_cycle_interval`,
//! and the Gemma 2 model files leave the interval at 1). Each half is a Gemma layer (`gemma.rs`:
//! the same reparametrized norms and embedding, GeGLU, tied logits) with attention scores
//! soft-capped (`attn_logits_soft_cap`) and, with `use_post_attn_norm` / `use_post_ffw_norm`,
//! an RMSNorm on the attention and MLP outputs before each residual add. The global half computes
//! the query-key product in f32, as MaxText's does. The final logits are soft-capped by the
//! shared decoder (`final_logits_soft_cap`).
//!
//! One layer's (pair's) parameters, for `<h>` in `local`, `global` (stacked on a leading
//! `layers` axis by the decoder):
//!
//! | name | shape | logical axes | init |
//! |---|---|---|---|
//! | `pre_self_attention_norm_<h>.scale` | [emb] | norm | ones |
//! | `self_attention_<h>.query.kernel` | [emb, heads, head_dim] | embed, heads, kv | fan_in / sqrt(head_dim) |
//! | `self_attention_<h>.key.kernel` | [emb, kv_heads, head_dim] | embed, kv_heads, kv | fan_in |
//! | `self_attention_<h>.value.kernel` | [emb, kv_heads, head_dim] | embed, kv_heads, kv | fan_in |
//! | `self_attention_<h>.out.kernel` | [heads, head_dim, emb] | heads, kv, embed | fan_in |
//! | `post_self_attention_norm_<h>.scale` (with `use_post_attn_norm`) | [emb] | norm | ones |
//! | `pre_ffw_norm_<h>.scale` | [emb] | norm | ones |
//! | `mlp_<h>.wi_0.kernel` (gelu) | [emb, mlp] | embed, mlp | fan_in |
//! | `mlp_<h>.wi_1.kernel` (linear) | [emb, mlp] | embed, mlp | fan_in |
//! | `mlp_<h>.wo.kernel` | [mlp, emb] | mlp, embed | fan_in |
//! | `post_ffw_norm_<h>.scale` (with `use_post_ffw_norm`) | [emb] | norm | ones |
//!
//! Both halves fold the queries' `1 / sqrt(head_dim)` into the query kernel as Gemma's do
//! (`gemma.rs`): `Gemma2DecoderLayer` passes its `Attention`s no `query_pre_attn_scalar`.

use crate::config::Config;
use crate::tensor::{Tensor, Tree};

use super::attention::{AttendOptions, LayerContext};
use super::blocks::{Mlp, Norm, QueryScale, SelfAttention};
use super::family::LayerRngs;
use super::family::{constrain, dense_layer_flops, Family, LayerFlops, LayerOutput, BTE};
use super::gemma::LAYER_NORM_EPS;
use super::params::ParamDef;
use super::ModelConfig;

/// A local and a global Gemma 2 layer.
#[derive(Debug)]
pub struct Gemma2 {
    /// The local layer's window (`sliding_window_size`).
    pub window: i64,
    pub post_attn_norm: bool,
    pub post_ffw_norm: bool,
}

impl Gemma2 {
    pub fn from_config(c: &Config) -> anyhow::Result<Gemma2> {
        if c.sliding_window_size <= 0 {
            return Err(anyhow::anyhow!(
                "sliding_window_size={}: gemma2's local layers attend over a window of that many tokens; set it to a positive size (4096 in the Gemma 2 model files)",
                c.sliding_window_size
            ));
        }
        Ok(Gemma2 {
            window: c.sliding_window_size,
            post_attn_norm: c.use_post_attn_norm,
            post_ffw_norm: c.use_post_ffw_norm,
        })
    }

    /// The attention of the local (`local`) or global half.
    fn attention(&self, c: &ModelConfig, local: bool) -> SelfAttention {
        let options = AttendOptions { logits_soft_cap: c.attn_logits_soft_cap, float32_qk_product: !local };
        SelfAttention { window: local.then_some(self.window), options, ..SelfAttention::new(QueryScale::Folded) }
    }

    fn half_params(&self, c: &ModelConfig, half: &str) -> Vec<ParamDef> {
        let attention = self.attention(c, half == "local").params(&format!("self_attention_{half}"), c);
        sandwich_params(c, &|n| format!("{n}_{half}"), self.post_norms(), attention)
    }

    fn post_norms(&self) -> PostNorms {
        PostNorms { attention: self.post_attn_norm, ffw: self.post_ffw_norm }
    }

    /// One half: `x + post_norm(attention(norm(x)))`, then `+ post_norm(mlp(norm(.)))`.
    fn half(&self, c: &ModelConfig, p: &Tree, x: &Tensor, ctx: &LayerContext, half: &str) -> Tensor {
        let attention = self.attention(c, half == "local");
        sandwich(c, p, x, &|n| format!("{n}_{half}"), self.post_norms(), |name, h| attention.apply(c, p, name, h, ctx))
    }
}

/// Which of the optional norms after attention and after the MLP a Gemma 2 or 3 layer has
/// (`use_post_attn_norm`, `use_post_ffw_norm`).
#[derive(Clone, Copy, Debug)]
pub(super) struct PostNorms {
    pub attention: bool,
    pub ffw: bool,
}

/// The parameters of a `sandwich` layer whose names `name` maps (`pre_ffw_norm` ->
/// `pre_ffw_norm_local` in Gemma 2, `layers_0.pre_ffw_norm` in Gemma 3), with `attention`'s.
pub(super) fn sandwich_params(
    c: &ModelConfig,
    name: &dyn Fn(&str) -> String,
    post: PostNorms,
    attention: Vec<ParamDef>,
) -> Vec<ParamDef> {
    let norm = Norm::Rms { eps: LAYER_NORM_EPS };
    let mut defs = norm.params(&name("pre_self_attention_norm"), c.emb);
    defs.extend(attention);
    if post.attention {
        defs.extend(norm.params(&name("post_self_attention_norm"), c.emb));
    }
    defs.extend(norm.params(&name("pre_ffw_norm"), c.emb));
    defs.extend(Mlp::new(c, false, None).params(&name("mlp"), c.emb, c.mlp));
    if post.ffw {
        defs.extend(norm.params(&name("post_ffw_norm"), c.emb));
    }
    defs
}

/// A Gemma 2 or Gemma 3 layer: `x + post_norm(attention(norm(x)))`, then
/// `+ post_norm(mlp(norm(.)))`, parameters named by `name`; `attention(prefix, h)` is the
/// attention block under `prefix` on the normed input.
pub(super) fn sandwich(
    c: &ModelConfig,
    p: &Tree,
    x: &Tensor,
    name: &dyn Fn(&str) -> String,
    post: PostNorms,
    attention: impl Fn(&str, &Tensor) -> Tensor,
) -> Tensor {
    let norm = Norm::Rms { eps: LAYER_NORM_EPS };
    let h = norm.apply(p, &name("pre_self_attention_norm"), x);
    let mut a = attention(&name("self_attention"), &h);
    if post.attention {
        a = norm.apply(p, &name("post_self_attention_norm"), &a);
    }
    let x = constrain(c, x + &a, BTE);
    let h = norm.apply(p, &name("pre_ffw_norm"), &x);
    let mut m = Mlp::new(c, false, None).apply(c, p, &name("mlp"), &h);
    if post.ffw {
        m = norm.apply(p, &name("post_ffw_norm"), &m);
    }
    constrain(c, &x + &m, BTE)
}

impl Family for Gemma2 {
    /// MaxText's `Gemma2DecoderLayer` (`src/maxtext/models/gemma2.py` at e591f30) keeps its `rngs` (line 59) and has a
    /// `dropout` (line 137).
    fn layer_rngs(&self, _c: &ModelConfig, _kind: usize) -> Option<LayerRngs> {
        Some(LayerRngs { keeps: true, dropout: true })
    }

    fn layer_params(&self, c: &ModelConfig, _kind: usize) -> Vec<ParamDef> {
        let mut defs = self.half_params(c, "local");
        defs.extend(self.half_params(c, "global"));
        defs
    }

    fn layer(&self, c: &ModelConfig, _kind: usize, p: &Tree, x: &Tensor, ctx: &LayerContext) -> LayerOutput {
        let x = self.half(c, p, x, ctx, "local");
        LayerOutput::new(self.half(c, p, &x, ctx, "global"))
    }

    /// MaxText's `calculate_gemma2_tflops_training_per_device`: twice the dense weight terms,
    /// causal global attention `2 * batch * seq^2 * heads * head_dim` and local attention
    /// `4 * batch * (seq * w - w^2 / 2) * heads * head_dim` with `w = min(window, seq)`.
    fn layer_flops(&self, c: &ModelConfig, _kind: usize, tokens: f64, seq: f64) -> LayerFlops {
        let dense = dense_layer_flops(c, tokens, seq);
        let (global, local) = global_and_local_attention_flops(c, tokens, seq, self.window);
        LayerFlops { weights: 2.0 * dense.weights, attention: global + local }
    }
}

/// MaxText's attention FLOPs of one global layer, causal `2 * batch * seq^2 * heads * head_dim`,
/// and of one local layer, `4 * batch * (seq * w - w^2 / 2) * heads * head_dim` with
/// `w = min(window, seq)` (Gemma 2's and Gemma 3's counts in `src/maxtext/utils/maxtext_utils.py`).
pub(super) fn global_and_local_attention_flops(c: &ModelConfig, tokens: f64, seq: f64, window: i64) -> (f64, f64) {
    let (batch, heads_dim) = (tokens / seq, (c.heads * c.head_dim) as f64);
    let w = (window as f64).min(seq);
    (2.0 * batch * seq * seq * heads_dim, 4.0 * batch * (seq * w - 0.5 * w * w) * heads_dim)
}
