//! The Qwen3 decoder layers (MaxText's `decoder_block: qwen3` and `qwen3_moe`,
//! `Qwen3DecoderLayer` and `Qwen3MoeDecoderLayer` in `src/maxtext/models/qwen3.py` at 7e5c2f4):
//! both are `AttentionWithNorm` — Llama 2's pre-norm attention (`llama.rs`) whose queries and
//! keys get a per-head RMSNorm before RoPE when `use_qk_norm` (every Qwen3 model file sets it),
//! queries scaled by `1 / sqrt(head_dim)` — followed by Llama's MLP (`qwen3`) or a routed
//! mixture-of-experts block (`qwen3_moe`: `moe.rs` under `moe_block.`, its experts
//! `base_moe_mlp_dim` wide when set, else `base_mlp_dim`: `ModelConfig::mlp`; no shared expert).
//! The MoE router's weights are the softmax over the top-k logits, which is Qwen3's
//! `norm_topk_prob: true` (all of its MoE checkpoints); MaxText's `norm_topk_prob` divides them
//! by their sum once more (`moe.rs`).
//!
//! One layer's parameters besides Llama's attention ones (`attention_params` in `llama.rs`):
//!
//! | name | shape | logical axes | init |
//! |---|---|---|---|
//! | `self_attention.query_norm.scale` (QK-norm) | [head_dim] | norm | ones |
//! | `self_attention.key_norm.scale` (QK-norm) | [head_dim] | norm | ones |
//! | `mlp.{wi_0,wi_1,wo}.kernel` (qwen3) | as Llama's | | |
//! | `moe_block.{gate.kernel,wi_0,wi_1,wo}` (qwen3_moe) | as Mixtral's `MoeBlock_0` | | |
//!
//! The QK-norms use `normalization_layer_epsilon`, as MaxText's `Attention` builds them.

use crate::config::{Config, DecoderBlock};
use crate::tensor::{Tensor, Tree};

use super::attention::LayerContext;
use super::blocks::{Mlp, Norm, QueryScale, SelfAttention};
use super::family::LayerRngs;
use super::family::{attention_flops, constrain, dense_layer_flops, Family, LayerFlops, LayerOutput, BTE};
use super::llama;
use super::moe::{self, moe_block, MoeConfig};
use super::params::ParamDef;
use super::ModelConfig;

/// A Qwen3 layer.
#[derive(Debug)]
pub struct Qwen3 {
    /// `use_qk_norm`.
    pub qk_norm: bool,
    /// The routed experts (`qwen3_moe`) in place of the MLP.
    pub moe: Option<MoeConfig>,
}

impl Qwen3 {
    /// The layer `c` describes; the experts are SwiGLU MLPs (`moe.rs`), as Mixtral's.
    pub fn from_config(c: &Config, mc: &ModelConfig) -> anyhow::Result<Qwen3> {
        let moe = (c.decoder_block == DecoderBlock::Qwen3Moe).then(|| MoeConfig::from_config(c));
        if moe.is_some() && mc.mlp_activations != ["silu", "linear"] {
            return Err(anyhow::anyhow!(
                "mlp_activations=[{}]: qwen3_moe's experts are SwiGLU MLPs, [silu, linear]; other activations are not supported yet",
                mc.mlp_activations.join(", ")
            ));
        }
        Ok(Qwen3 { qk_norm: c.use_qk_norm, moe })
    }

    /// The attention, its queries scaled at run time by `head_dim^-1/2`: MaxText's Qwen3 layers
    /// pass that `query_pre_attn_scalar` (`models/qwen3.py` at MaxText e591f30).
    fn attention(&self, c: &ModelConfig) -> SelfAttention {
        SelfAttention {
            qk_norm: self.qk_norm.then_some(c.eps),
            ..SelfAttention::new(QueryScale::RunTime((c.head_dim as f64).powf(-0.5)))
        }
    }
}

impl Family for Qwen3 {
    /// MaxText's `Qwen3DecoderLayer` and `Qwen3MoeDecoderLayer` (`src/maxtext/models/qwen3.py` at e591f30) keep no
    /// `rngs` and have no `dropout`.
    fn layer_rngs(&self, _c: &ModelConfig, _kind: usize) -> Option<LayerRngs> {
        Some(LayerRngs { keeps: false, dropout: false })
    }

    fn layer_params(&self, c: &ModelConfig, _kind: usize) -> Vec<ParamDef> {
        let norm = Norm::Rms { eps: c.eps };
        let mut defs = llama::attention_params(c, &self.attention(c));
        if self.qk_norm {
            defs.extend(norm.params("self_attention.query_norm", c.head_dim));
            defs.extend(norm.params("self_attention.key_norm", c.head_dim));
        }
        match &self.moe {
            None => defs.extend(Mlp::new(c, false, None).params("mlp", c.emb, c.mlp)),
            Some(m) => defs.extend(
                moe::param_defs(m, c.emb, c.mlp)
                    .into_iter()
                    .map(|def| ParamDef { name: format!("moe_block.{}", def.name), ..def }),
            ),
        }
        defs
    }

    fn layer(&self, c: &ModelConfig, _kind: usize, p: &Tree, x: &Tensor, ctx: &LayerContext) -> LayerOutput {
        let Some(m) = &self.moe else {
            return LayerOutput::new(llama::layer(c, p, x, ctx, &self.attention(c)));
        };
        let x = llama::attention_half(c, p, x, ctx, &self.attention(c));
        let h = Norm::Rms { eps: c.eps }.apply(p, "post_self_attention_layer_norm", &x);
        let block = moe_block(c, m, &p.subtree("moe_block"), &h);
        let aux_losses = block.aux_losses(m);
        let out = constrain(c, &x + &block.output, BTE);
        LayerOutput { x: out, aux_losses }
    }

    /// Llama's terms, or with experts Mixtral's (`mixtral.rs`): the router and the
    /// `num_experts_per_tok` active expert MLPs.
    fn layer_flops(&self, c: &ModelConfig, _kind: usize, tokens: f64, seq: f64) -> LayerFlops {
        let Some(m) = &self.moe else { return dense_layer_flops(c, tokens, seq) };
        let (e, mlp) = (c.emb as f64, c.mlp as f64);
        let router = 2.0 * tokens * e * m.num_experts as f64;
        let expert = 2.0 * tokens * mlp * e * (c.mlp_activations.len() as f64 + 1.0);
        let attention = attention_flops(c, tokens, seq);
        LayerFlops {
            weights: router + expert * m.num_experts_per_tok as f64 + attention.weights,
            attention: attention.attention,
        }
    }
}
