//! The custom Qwen3 MoE decoder layer (MaxText's `decoder_block: qwen3_custom_moe`,
//! `Qwen3CustomMoeDecoderLayer` in `src/maxtext/models/qwen3_custom.py` at MaxText e591f30),
//! top to bottom:
//!
//! 1. `h = RMSNorm(x)` (`pre_self_attention_layer_norm`);
//! 2. Qwen3's attention (`blocks.rs`'s `SelfAttention` with QK-norm when `use_qk_norm`, queries
//!    scaled by `1 / sqrt(head_dim)` at run time) whose output projection maps `[heads, head_dim]` to
//!    `attention_output_dim` instead of `emb` (`Qwen3CustomAttention.init_out_w`): a latent
//!    `a: [batch, seq, attention_output_dim]`, with no residual add;
//! 3. `latent_norm`, an RMSNorm over `attention_output_dim`;
//! 4. the routed MoE block (`moe.rs`, MaxText's `RoutedMoE`) on that latent: its gate and experts
//!    take `moe_expert_input_dim` (which must equal `attention_output_dim`: `types.py` at MaxText
//!    e591f30) wide tokens and return them as wide;
//! 5. `layer_up_projection` (`attention_output_dim -> emb`, only when the two differ), added to
//!    the layer's input `x`.
//!
//! One layer's parameters:
//!
//! | name | shape | logical axes | init |
//! |---|---|---|---|
//! | `pre_self_attention_layer_norm.scale` | [emb] | norm | ones |
//! | `self_attention.{query,key,value}.kernel` | as Llama's (`llama.rs`) | | |
//! | `self_attention.out.kernel` | [heads, head_dim, attention_output_dim] | heads, kv, embed | fan_in (heads x head_dim) |
//! | `self_attention.{query,key}_norm.scale` (use_qk_norm) | [head_dim] | norm | ones |
//! | `post_self_attention_layer_norm.scale` (unused) | [emb] | norm | ones |
//! | `latent_norm.scale` | [attention_output_dim] | norm | ones |
//! | `moe_block.gate.kernel` | [attention_output_dim, experts] | embed, - | fan_in |
//! | `moe_block.{wi_0,wi_1,wo}` | as `moe.rs`'s with attention_output_dim for emb | | |
//! | `layer_up_projection.kernel` (attention_output_dim != emb) | [attention_output_dim, emb] | mlp, embed | fan_in (attention_output_dim) |
//!
//! `post_self_attention_layer_norm` is created by the base class `AttentionWithNorm`
//! (`src/maxtext/models/qwen3.py` at MaxText e591f30) and never called by the custom layer:
//! MaxText's checkpoint holds it, so maxrs declares it too (the parameter names and count match
//! MaxText's; its gradient is zero). The gate's kernel axes are `("embed", None)`, as
//! `qwen3_custom.py` passes them to `RoutedMoE`; the up-projection's `("mlp", "embed")`.

use crate::config::Config;
use crate::tensor::{Tensor, Tree};

use super::attention::LayerContext;
use super::blocks::{dense, Norm, QueryScale, SelfAttention};
use super::family::LayerRngs;
use super::family::{constrain, Family, LayerFlops, LayerOutput, BTE};
use super::llama;
use super::moe::{self, moe_block, MoeConfig};
use super::params::{ParamDef, ParamInit};
use super::ModelConfig;

/// A qwen3_custom_moe layer.
#[derive(Debug)]
pub struct Qwen3Custom {
    /// `use_qk_norm`.
    pub qk_norm: bool,
    /// `attention_output_dim` (= `moe_expert_input_dim`): the latent's width.
    pub latent: i64,
    /// The routed experts on the latent.
    pub moe: MoeConfig,
}

impl Qwen3Custom {
    /// The layer `c` describes, with MaxText's checks of its two widths (`qwen3_custom.py` and
    /// `types.py` at MaxText e591f30); the experts are SwiGLU MLPs (`moe.rs`), as qwen3_moe's.
    pub fn from_config(c: &Config, mc: &ModelConfig) -> anyhow::Result<Qwen3Custom> {
        let (latent, expert_input) = (c.attention_output_dim, c.moe_expert_input_dim);
        if latent <= 0 {
            return Err(anyhow::anyhow!(
                "attention_output_dim={latent}: decoder_block=qwen3_custom_moe needs a positive attention_output_dim (the attention output's width, e.g. 768 in models/qwen3-custom-30b-a3b.yml)"
            ));
        }
        if expert_input != latent {
            return Err(anyhow::anyhow!(
                "moe_expert_input_dim={expert_input}: decoder_block=qwen3_custom_moe runs its experts on the attention output; set it to attention_output_dim={latent}"
            ));
        }
        if mc.mlp_activations != ["silu", "linear"] {
            return Err(anyhow::anyhow!(
                "mlp_activations=[{}]: qwen3_custom_moe's experts are SwiGLU MLPs, [silu, linear]; other activations are not supported yet",
                mc.mlp_activations.join(", ")
            ));
        }
        Ok(Qwen3Custom { qk_norm: c.use_qk_norm, latent, moe: MoeConfig::from_config(c) })
    }

    /// The attention, its queries scaled at run time by `head_dim^-1/2`: MaxText's layer passes
    /// that `query_pre_attn_scalar` (`models/qwen3_custom.py` at MaxText e591f30).
    fn attention(&self, c: &ModelConfig) -> SelfAttention {
        SelfAttention {
            qk_norm: self.qk_norm.then_some(c.eps),
            ..SelfAttention::new(QueryScale::RunTime((c.head_dim as f64).powf(-0.5)))
        }
    }

    /// Whether the latent is projected back up to `emb` (MaxText creates `layer_up_projection`
    /// only then).
    fn up_projection(&self, c: &ModelConfig) -> bool {
        self.latent != c.emb
    }
}

impl Family for Qwen3Custom {
    /// MaxText's `Qwen3CustomMoeDecoderLayer` (`src/maxtext/models/qwen3_custom.py` at e591f30) keeps no `rngs` and has
    /// no `dropout`.
    fn layer_rngs(&self, _c: &ModelConfig, _kind: usize) -> Option<LayerRngs> {
        Some(LayerRngs { keeps: false, dropout: false })
    }

    fn layer_params(&self, c: &ModelConfig, _kind: usize) -> Vec<ParamDef> {
        let norm = Norm::Rms { eps: c.eps };
        // Llama's attention half (with the unused post-attention norm), its output projection
        // narrowed to the latent: the same name, axes and fan-in, `attention_output_dim` outputs.
        let mut defs: Vec<ParamDef> = llama::attention_params(c, &self.attention(c))
            .into_iter()
            .map(|def| match def.name.as_str() {
                "self_attention.out.kernel" => ParamDef { shape: vec![c.heads, c.head_dim, self.latent], ..def },
                _ => def,
            })
            .collect();
        if self.qk_norm {
            defs.extend(norm.params("self_attention.query_norm", c.head_dim));
            defs.extend(norm.params("self_attention.key_norm", c.head_dim));
        }
        defs.extend(norm.params("latent_norm", self.latent));
        defs.extend(
            moe::param_defs(&self.moe, self.latent, c.mlp)
                .into_iter()
                .map(|def| ParamDef { name: format!("moe_block.{}", def.name), ..def }),
        );
        if self.up_projection(c) {
            defs.push(ParamDef::dense_kernel(
                "layer_up_projection.kernel",
                &[self.latent, c.emb],
                &["mlp", "embed"],
                ParamInit::FanIn(self.latent),
                1,
            ));
        }
        defs
    }

    fn layer(&self, c: &ModelConfig, _kind: usize, p: &Tree, x: &Tensor, ctx: &LayerContext) -> LayerOutput {
        let norm = Norm::Rms { eps: c.eps };
        let h = norm.apply(p, "pre_self_attention_layer_norm", x);
        let latent = constrain(c, self.attention(c).apply(c, p, "self_attention", &h, ctx), BTE);
        let latent = norm.apply(p, "latent_norm", &latent);
        let block = moe_block(c, &self.moe, &p.subtree("moe_block"), &latent);
        let aux_losses = block.aux_losses(&self.moe);
        let mut y = constrain(c, block.output, BTE);
        if self.up_projection(c) {
            y = constrain(c, dense(c, p, "layer_up_projection", &y, 1), BTE);
        }
        let out = constrain(c, x + &y, BTE);
        LayerOutput { x: out, aux_losses }
    }

    /// MaxText's qwen3_custom_moe terms (`calculate_tflops_training_per_device` in
    /// `src/maxtext/utils/maxtext_utils.py` at MaxText e591f30): q/k/v from `emb`, the output
    /// projection to `attention_output_dim`, the up-projection `attention_output_dim x emb`
    /// (counted even when the layer has none, as MaxText does), and with several experts the
    /// router and the `num_experts_per_tok` experts on `moe_expert_input_dim`-wide tokens (one
    /// expert MLP on `emb` otherwise).
    fn layer_flops(&self, c: &ModelConfig, _kind: usize, tokens: f64, seq: f64) -> LayerFlops {
        let [e, h, kv, d, latent, mlp] = [c.emb, c.heads, c.kv_heads, c.head_dim, self.latent, c.mlp].map(|x| x as f64);
        let projections = c.mlp_activations.len() as f64 + 1.0;
        let ffn = if self.moe.num_experts > 1 {
            let router = 2.0 * tokens * latent * self.moe.num_experts as f64;
            router + 2.0 * tokens * mlp * latent * projections * self.moe.num_experts_per_tok as f64
        } else {
            2.0 * tokens * mlp * e * projections
        };
        let qkv = 2.0 * tokens * e * (h + 2.0 * kv) * d;
        let out = 2.0 * tokens * latent * h * d;
        let up = 2.0 * tokens * latent * e;
        LayerFlops { weights: ffn + qkv + out + up, attention: 4.0 * tokens * seq * h * d / 2.0 }
    }
}
