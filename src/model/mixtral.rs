//! The Mixtral decoder layer (MaxText's `decoder_block: mixtral`, `src/maxtext/models/mixtral.py`
//! at main e591f30): Llama 2's pre-norm grouped-query attention with RoPE, then, instead of the
//! MLP, the routed mixture-of-experts block of `moe.rs` (`MoeBlock_0`). Embedding, stacking, final
//! norm, logits and loss are the shared decoder's; the block's load-balancing loss is the layer's
//! auxiliary loss `moe_lb_loss` (with more than one expert), which the decoder averages over the
//! layers and adds to the loss.
//!
//! One layer's parameters (stacked on a leading `layers` axis by the decoder): Llama's
//! `pre_self_attention_layer_norm.scale`, `self_attention.{query,key,value,out}.kernel` and
//! `post_self_attention_layer_norm.scale` (see `llama.rs`), and
//!
//! | name | shape | logical axes | init |
//! |---|---|---|---|
//! | `MoeBlock_0.gate.kernel` | [emb, experts] | embed, - | fan_in (emb) |
//! | `MoeBlock_0.wi_0` | [experts, emb, mlp] | exp, embed_moe, mlp_moe | fan_in (experts x mlp) |
//! | `MoeBlock_0.wi_1` | [experts, emb, mlp] | exp, embed_moe, mlp_moe | fan_in (experts x mlp) |
//! | `MoeBlock_0.wo` | [experts, mlp, emb] | exp, mlp_moe, embed_moe | fan_in (experts x emb) |
//!
//! The experts are `base_mlp_dim` wide, as MaxText's Mixtral layer builds them (a set
//! `base_moe_mlp_dim` must equal it, `config::validate`).
//!
//! With `quantization=fp8` the layer's products are MaxText's fp8 ones: the attention projections
//! (`blocks::dense`) and the gate (`MoeBlock_0.gate`) as flax's `Fp8DirectDotGeneralOp`, the
//! experts' einsums as `moe::Products::Fp8` describes, whose state is the layer's
//! `_Fp8EinsumWrapper_<i>.fp8_einsum.*` (MaxText's `MixtralDecoderLayer` is an nnx module run
//! through `to_linen_class`, the linen scope the einsums' modules are created in:
//! `models/mixtral.py` at e591f30).

use crate::config::Config;
use crate::tensor::{Tensor, Tree};

use super::attention::LayerContext;
use super::blocks::Norm;
use super::family::LayerRngs;
use super::family::{attention_flops, constrain, Family, LayerFlops, LayerOutput};
use super::fp8::{self, Scaling};
use super::llama::{self, attention_half, attention_params};
use super::moe::{self, moe_block_with, MoeConfig, Products};
use super::params::ParamDef;
use super::ModelConfig;

/// The residual stream's logical axes in MaxText's Mixtral layer (`activation_axis_names`).
const ACTIVATIONS: &[&str] = &["activation_batch", "activation_norm_length", "activation_embed"];

/// The Mixtral layer: Llama's attention and a routed MoE block.
#[derive(Debug)]
pub struct Mixtral {
    pub moe: MoeConfig,
}

impl Mixtral {
    /// The layer `c` describes. The experts are SwiGLU MLPs (`moe.rs`), so other
    /// `mlp_activations` are refused.
    pub fn from_config(c: &Config, mc: &ModelConfig) -> anyhow::Result<Mixtral> {
        if mc.mlp_activations != ["silu", "linear"] {
            return Err(anyhow::anyhow!(
                "mlp_activations=[{}]: mixtral's experts are SwiGLU MLPs, [silu, linear]; other activations are not supported yet",
                mc.mlp_activations.join(", ")
            ));
        }
        Ok(Mixtral { moe: MoeConfig::from_config(c) })
    }
}

impl Family for Mixtral {
    /// MaxText's `MixtralDecoderLayer` (`src/maxtext/models/mixtral.py` at e591f30) keeps its `rngs` (line 57) and has
    /// a `dropout` (line 122).
    fn layer_rngs(&self, _c: &ModelConfig, _kind: usize) -> Option<LayerRngs> {
        Some(LayerRngs { keeps: true, dropout: true })
    }

    fn layer_params(&self, c: &ModelConfig, _kind: usize) -> Vec<ParamDef> {
        let mut defs = attention_params(c, &llama::ATTENTION);
        defs.extend(
            moe::param_defs(&self.moe, c.emb, c.mlp)
                .into_iter()
                .map(|def| ParamDef { name: format!("MoeBlock_0.{}", def.name), ..def }),
        );
        defs
    }

    /// The products with a kernel (the attention projections, the gate) and the experts' einsums.
    fn fp8_products(&self, c: &ModelConfig, kind: usize) -> Vec<String> {
        let mut products = fp8::kernel_products(&self.layer_params(c, kind));
        products.extend(moe::fp8_einsums(&self.moe));
        products
    }

    fn layer(&self, c: &ModelConfig, _kind: usize, p: &Tree, x: &Tensor, ctx: &LayerContext) -> LayerOutput {
        let x = attention_half(c, p, x, ctx, &llama::ATTENTION);
        let h = constrain(c, Norm::Rms { eps: c.eps }.apply(p, "post_self_attention_layer_norm", &x), ACTIVATIONS);
        let products = match c.fp8 {
            Some(Scaling::Delayed) => Products::Fp8(p),
            // `config` refuses current scaling for Mixtral: MaxText's has no einsum for it.
            Some(Scaling::Current) | None => Products::Plain,
        };
        let block = moe_block_with(c, &self.moe, &p.subtree("MoeBlock_0"), &h, products);
        let aux_losses = block.aux_losses(&self.moe);
        let out = constrain(c, &x + &constrain(c, block.output, ACTIVATIONS), ACTIVATIONS);
        LayerOutput { x: out, aux_losses }
    }

    /// MaxText's MoE terms (`calculate_tflops_training_per_device`, the non-DeepSeek branch): the
    /// router `2 * tokens * emb * experts`, and `num_experts_per_tok` expert MLPs of
    /// `2 * tokens * mlp * emb` per projection — the active experts only, as the dropless
    /// computation does; plus Llama's attention terms.
    fn layer_flops(&self, c: &ModelConfig, _kind: usize, tokens: f64, seq: f64) -> LayerFlops {
        let (e, m) = (c.emb as f64, c.mlp as f64);
        let router = 2.0 * tokens * e * self.moe.num_experts as f64;
        let expert = 2.0 * tokens * m * e * (c.mlp_activations.len() as f64 + 1.0);
        let ffn = router + expert * self.moe.num_experts_per_tok as f64;
        let attention = attention_flops(c, tokens, seq);
        LayerFlops { weights: ffn + attention.weights, attention: attention.attention }
    }
}
