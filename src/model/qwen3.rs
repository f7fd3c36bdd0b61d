//! The Qwen3 dense decoder layer (MaxText's `decoder_block: qwen3`, `Qwen3DecoderLayer` =
//! `AttentionWithNorm` + `MlpBlock` in `src/maxtext/models/qwen3.py` at 7e5c2f4): Llama 2's
//! pre-norm layer (`llama.rs`) whose attention normalizes each head's queries and keys with an
//! RMSNorm before RoPE when `use_qk_norm` (every Qwen3 model file sets it), scaling the queries by
//! `1 / sqrt(head_dim)` as Llama's. The parameters are Llama's plus, with QK-norm,
//!
//! | name | shape | logical axes | init |
//! |---|---|---|---|
//! | `self_attention.query_norm.scale` | [head_dim] | norm | ones |
//! | `self_attention.key_norm.scale` | [head_dim] | norm | ones |
//!
//! with `normalization_layer_epsilon`, as MaxText's `Attention` builds them.

use crate::tensor::{Tensor, Tree};

use super::attention::LayerContext;
use super::blocks::{Mlp, Norm, SelfAttention};
use super::decoder::{dense_layer_flops, Family, LayerFlops, LayerOutput};
use super::llama;
use super::params::ParamDef;
use super::ModelConfig;

/// The Qwen3 layer.
#[derive(Debug)]
pub struct Qwen3 {
    /// `use_qk_norm`.
    pub qk_norm: bool,
}

impl Qwen3 {
    fn attention(&self, c: &ModelConfig) -> SelfAttention {
        SelfAttention { qk_norm: self.qk_norm.then_some(c.eps), ..SelfAttention::default() }
    }
}

impl Family for Qwen3 {
    fn layer_params(&self, c: &ModelConfig) -> Vec<ParamDef> {
        let norm = Norm::Rms { eps: c.eps };
        let mut defs = norm.params("pre_self_attention_layer_norm", c.emb);
        defs.extend(SelfAttention::params("self_attention", c));
        if self.qk_norm {
            defs.extend(norm.params("self_attention.query_norm", c.head_dim));
            defs.extend(norm.params("self_attention.key_norm", c.head_dim));
        }
        defs.extend(norm.params("post_self_attention_layer_norm", c.emb));
        defs.extend(Mlp::new(c, false, None).params("mlp", c.emb, c.mlp));
        defs
    }

    fn layer(&self, c: &ModelConfig, p: &Tree, x: &Tensor, ctx: &LayerContext) -> LayerOutput {
        LayerOutput::new(llama::layer(c, p, x, ctx, &self.attention(c)))
    }

    fn layer_flops(&self, c: &ModelConfig, tokens: f64, seq: f64) -> LayerFlops {
        dense_layer_flops(c, tokens, seq)
    }
}
