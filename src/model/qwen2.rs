//! The Qwen2 decoder layer (MaxText's `decoder_block: qwen2`, Qwen2.5's models: `Qwen2DecoderLayer`
//! in `src/maxtext/models/qwen2.py` at MaxText e591f30): Llama 2's pre-norm layer (`llama.rs`:
//! RMSNorms, grouped-query attention with half-split RoPE, the `mlp_activations` MLP) whose
//! query, key and value projections have learned biases when `attention_bias` (every Qwen2.5
//! model file sets it; the output projection never has one: `Attention.init_out_w` in
//! `src/maxtext/layers/attentions.py` at MaxText e591f30 turns its bias off for qwen2), and whose
//! queries and keys get a per-head RMSNorm before RoPE when `use_qk_norm` (qwen2.py passes it to
//! `Attention` as qwen3.py does; the Qwen2.5 files set it false).
//!
//! Queries are scaled by `1 / sqrt(head_dim)` after RoPE at run time: qwen2.py sets
//! `query_pre_attn_scalar = head_dim ** -0.5`, which makes MaxText's `Attention` multiply the
//! queries by it and not fold it into the query kernel's initializer (`init_query_w`), so unlike
//! Llama's (`llama.rs`) a MaxText qwen2 query kernel is used here as it is.
//!
//! One layer's parameters besides Llama's (`llama.rs`):
//!
//! | name | shape | logical axes | init |
//! |---|---|---|---|
//! | `self_attention.query.bias` (attention_bias) | [heads, head_dim] | heads, kv | zeros |
//! | `self_attention.key.bias` (attention_bias) | [kv_heads, head_dim] | kv_heads, kv | zeros |
//! | `self_attention.value.bias` (attention_bias) | [kv_heads, head_dim] | kv_heads, kv | zeros |
//! | `self_attention.query_norm.scale` (use_qk_norm) | [head_dim] | norm | ones |
//! | `self_attention.key_norm.scale` (use_qk_norm) | [head_dim] | norm | ones |
//!
//! The biases are `DenseGeneral`'s (`src/maxtext/layers/linears.py` at MaxText e591f30): the
//! kernel's output shape and output logical axes (so sharded as the kernel's outputs), zeros at
//! init (`default_bias_init`), cast to `dtype` and added after the product.

use crate::config::Config;
use crate::tensor::{Tensor, Tree};

use super::attention::LayerContext;
use super::blocks::{Mlp, Norm, QueryScale, SelfAttention};
use super::family::LayerRngs;
use super::family::{dense_layer_flops, Family, LayerFlops, LayerOutput};
use super::llama;
use super::params::ParamDef;
use super::ModelConfig;

/// A Qwen2 layer.
#[derive(Debug)]
pub struct Qwen2 {
    /// `attention_bias`.
    pub bias: bool,
    /// `use_qk_norm`.
    pub qk_norm: bool,
}

impl Qwen2 {
    /// The layer `c` describes.
    pub fn from_config(c: &Config) -> Qwen2 {
        Qwen2 { bias: c.attention_bias, qk_norm: c.use_qk_norm }
    }

    /// The attention, its queries scaled at run time by `head_dim^-1/2`: MaxText's qwen2 layer
    /// passes that `query_pre_attn_scalar` (`models/qwen2.py` at MaxText e591f30).
    fn attention(&self, c: &ModelConfig) -> SelfAttention {
        SelfAttention {
            qkv_bias: self.bias,
            qk_norm: self.qk_norm.then_some(c.eps),
            ..SelfAttention::new(QueryScale::RunTime((c.head_dim as f64).powf(-0.5)))
        }
    }
}

impl Family for Qwen2 {
    /// MaxText's `Qwen2DecoderLayer` (`src/maxtext/models/qwen2.py` at e591f30) keeps no `rngs` and has no `dropout`.
    fn layer_rngs(&self, _c: &ModelConfig, _kind: usize) -> Option<LayerRngs> {
        Some(LayerRngs { keeps: false, dropout: false })
    }

    fn layer_params(&self, c: &ModelConfig, _kind: usize) -> Vec<ParamDef> {
        let norm = Norm::Rms { eps: c.eps };
        let mut defs = norm.params("pre_self_attention_layer_norm", c.emb);
        defs.extend(self.attention(c).all_params("self_attention", c));
        defs.extend(norm.params("post_self_attention_layer_norm", c.emb));
        defs.extend(Mlp::new(c, false, None).params("mlp", c.emb, c.mlp));
        defs
    }

    fn layer(&self, c: &ModelConfig, _kind: usize, p: &Tree, x: &Tensor, ctx: &LayerContext) -> LayerOutput {
        LayerOutput::new(llama::layer(c, p, x, ctx, &self.attention(c)))
    }

    /// Llama's: MaxText's `calculate_tflops_training_per_device` (`src/maxtext/utils/maxtext_utils.py`
    /// at MaxText e591f30) has no term for the biases' additions.
    fn layer_flops(&self, c: &ModelConfig, _kind: usize, tokens: f64, seq: f64) -> LayerFlops {
        dense_layer_flops(c, tokens, seq)
    }
}
