//! The Gemma decoder layer (MaxText's `decoder_block: gemma`, `GemmaDecoderLayer` in
//! `src/maxtext/models/gemma.py`, e591f30), top to bottom: its parameters, the layer, its FLOPs.
//! Gemma is a pre-norm decoder with multi-query attention (`gemma-2b`: one kv head) or multi-head
//! attention (`gemma-7b`), head_dim 256, a GeGLU MLP (`mlp_activations: [gelu, linear]`, gelu
//! being the tanh approximation) and tied logits (`logits_via_embedding`).
//!
//! One layer's parameters (stacked on a leading `layers` axis by the decoder):
//!
//! | name | shape | logical axes | init |
//! |---|---|---|---|
//! | `pre_self_attention_norm.scale` | [emb] | norm | ones |
//! | `self_attention.query.kernel` | [emb, heads, head_dim] | embed, heads, kv | fan_in / sqrt(head_dim) |
//! | `self_attention.key.kernel` | [emb, kv_heads, head_dim] | embed, kv_heads, kv | fan_in |
//! | `self_attention.value.kernel` | [emb, kv_heads, head_dim] | embed, kv_heads, kv | fan_in |
//! | `self_attention.out.kernel` | [heads, head_dim, emb] | heads, kv, embed | fan_in |
//! | `pre_ffw_norm.scale` | [emb] | norm | ones |
//! | `mlp.wi_0.kernel` (gelu) | [emb, mlp] | embed, mlp | fan_in |
//! | `mlp.wi_1.kernel` (linear) | [emb, mlp] | embed, mlp | fan_in |
//! | `mlp.wo.kernel` | [mlp, emb] | mlp, embed | fan_in |
//!
//! **Gemma's reparametrizations, as MaxText stores them.** Gemma scales the token embeddings by
//! `sqrt(emb)` and its RMSNorms multiply by `1 + scale`. MaxText (and so maxrs) keeps both folded
//! into the stored parameters, as its converter does (`convert_gemma_chkpt.py`: embedding
//! `x sqrt(emb)`, every norm scale `+ 1`): the embedding lookup is unscaled, the norms multiply by
//! `scale` (initialized to ones), and the tied logits are divided by `sqrt(emb)`
//! (`normalize_embedding_logits`, true by default), which undoes the folded factor. The result is
//! Gemma's function exactly (the tests check it against Gemma's own formulation). The queries'
//! `1 / sqrt(head_dim)` is folded into the query kernel too, as MaxText's `Attention` does when
//! given no `query_pre_attn_scalar` (`GemmaDecoderLayer` gives none; `blocks::QueryScale::Folded`):
//! its draw is divided by `sqrt(head_dim)` rounded to `dtype`, the queries are not scaled at run
//! time, and the converter multiplies the original query weights by `head_dim^-1/2`. To load an
//! original Gemma checkpoint, multiply its embedding by `sqrt(emb)`, its query kernel by
//! `head_dim^-1/2`, and add 1 to its norm scales (`hf::gemma` does).
//!
//! The layer norms use epsilon 1e-6 whatever `normalization_layer_epsilon` says: MaxText's Gemma
//! layer does not pass it to them (`RMSNorm`'s default); the final norm uses it.

use crate::tensor::{Tensor, Tree};

use super::attention::LayerContext;
use super::blocks::{Mlp, Norm, QueryScale, SelfAttention};
use super::family::LayerRngs;
use super::family::{constrain, dense_layer_flops, Family, LayerFlops, LayerOutput, BTE};
use super::params::ParamDef;
use super::ModelConfig;

/// The epsilon of MaxText's `RMSNorm` when none is given, which Gemma's layer norms use.
pub const LAYER_NORM_EPS: f64 = 1e-6;

/// Gemma's attention, its queries' scale folded into the query kernel.
const ATTENTION: SelfAttention = SelfAttention::new(QueryScale::Folded);

/// The Gemma layer.
#[derive(Debug)]
pub struct Gemma;

impl Family for Gemma {
    /// MaxText's `GemmaDecoderLayer` (`src/maxtext/models/gemma.py` at e591f30) keeps its `rngs` (line 58) and has a
    /// `dropout` (line 117).
    fn layer_rngs(&self, _c: &ModelConfig, _kind: usize) -> Option<LayerRngs> {
        Some(LayerRngs { keeps: true, dropout: true })
    }

    fn layer_params(&self, c: &ModelConfig, _kind: usize) -> Vec<ParamDef> {
        let norm = Norm::Rms { eps: LAYER_NORM_EPS };
        let mut defs = norm.params("pre_self_attention_norm", c.emb);
        defs.extend(ATTENTION.params("self_attention", c));
        defs.extend(norm.params("pre_ffw_norm", c.emb));
        defs.extend(Mlp::new(c, false, None).params("mlp", c.emb, c.mlp));
        defs
    }

    /// `x + attention(norm(x))`, then `+ mlp(norm(.))`.
    fn layer(&self, c: &ModelConfig, _kind: usize, p: &Tree, x: &Tensor, ctx: &LayerContext) -> LayerOutput {
        let norm = Norm::Rms { eps: LAYER_NORM_EPS };
        let h = norm.apply(p, "pre_self_attention_norm", x);
        let x = constrain(c, x + &ATTENTION.apply(c, p, "self_attention", &h, ctx), BTE);
        let h = norm.apply(p, "pre_ffw_norm", &x);
        LayerOutput::new(constrain(c, &x + &Mlp::new(c, false, None).apply(c, p, "mlp", &h), BTE))
    }

    fn layer_flops(&self, c: &ModelConfig, _kind: usize, tokens: f64, seq: f64) -> LayerFlops {
        dense_layer_flops(c, tokens, seq)
    }
}
