//! The Gemma 3 decoder layer, text only (MaxText's `decoder_block: gemma3`, `Gemma3DecoderLayer`
//! and `Gemma3ScannableBlock` in `src/maxtext/models/gemma3.py`, e591f30), top to bottom: its
//! parameters, the layer, its FLOPs.
//!
//! Gemma 3 repeats 5 local layers (attention over the last `sliding_window_size` tokens) and one
//! global layer (`GEMMA3_ATTENTION_PATTERN`). MaxText scans blocks of these 6 layers
//! (`Decoder._apply_gemma3_scanned_blocks`, `src/maxtext/layers/decoders.py`, e591f30), and so
//! one decoder "layer" of maxrs is such a block: `base_num_decoder_layers` counts the real layers,
//! as in MaxText's model files, and the decoder stacks `base_num_decoder_layers / 6` blocks.
//! MaxText runs the layers left over (gemma3-4b's 34 = 5 x 6 + 4) as a separate
//! `layers_remainder` block, which maxrs does not have yet: it refuses a layer count that is not
//! a multiple of 6.
//!
//! Each layer is Gemma 2's (`gemma2::sandwich`: the norms before and, with `use_post_attn_norm`
//! / `use_post_ffw_norm`, after attention and the MLP; Gemma's folded `1 + scale` norms and
//! `sqrt(emb)` embedding, GeGLU, tied logits divided by `sqrt(emb)`), with, in its attention:
//! - QK norm: RMSNorms (epsilon `normalization_layer_epsilon`) over `head_dim` of the queries and
//!   keys before RoPE (`use_qk_norm=True` in `Gemma3DecoderLayer`);
//! - queries multiplied by `query_pre_attn_scalar` after RoPE, which MaxText derives from the
//!   model name (`get_query_pre_attn_scalar`): `(emb / heads)^-1/2` for gemma3-27b,
//!   `head_dim^-1/2` otherwise (MaxText raises for another name; maxrs takes `head_dim^-1/2`);
//! - RoPE with `local_rope_max_timescale` in the local layers and `rope_max_timescale` with the
//!   timescales times `rope_linear_scaling_factor` in the global ones (`Attention.init_rotary_embedding`,
//!   `src/maxtext/layers/attentions.py`, e591f30: the factor skips gemma3's local layers);
//! - no soft caps in the model files (`attn_logits_soft_cap` works as in Gemma 2 when set).
//!
//! One block's parameters, for `j` in 0..6 (layer `j` is global when `j == 5`; stacked on a
//! leading `layers` axis by the decoder, which gives MaxText's scanned names
//! `decoder.layers.layers_<j>.*`):
//!
//! | name | shape | logical axes | init |
//! |---|---|---|---|
//! | `layers_<j>.pre_self_attention_norm.scale` | [emb] | norm | ones |
//! | `layers_<j>.self_attention.{query,key,value,out}.kernel` | as Gemma's | | fan_in |
//! | `layers_<j>.self_attention.query_norm.scale` | [head_dim] | norm | ones |
//! | `layers_<j>.self_attention.key_norm.scale` | [head_dim] | norm | ones |
//! | `layers_<j>.post_self_attention_norm.scale` (with `use_post_attn_norm`) | [emb] | norm | ones |
//! | `layers_<j>.pre_ffw_norm.scale` | [emb] | norm | ones |
//! | `layers_<j>.mlp.{wi_0,wi_1,wo}.kernel` | as Gemma's | | fan_in |
//! | `layers_<j>.post_ffw_norm.scale` (with `use_post_ffw_norm`) | [emb] | norm | ones |

use crate::config::{self, Config, RopeType};
use crate::tensor::{Tensor, Tree};

use super::attention::{default_frequencies, rope_tables, AttendOptions, AttentionImpl, LayerContext};
use super::blocks::SelfAttention;
use super::decoder::{dense_layer_flops, Family, LayerFlops, LayerOutput};
use super::gemma2::{global_and_local_attention_flops, sandwich, sandwich_params, PostNorms};
use super::params::ParamDef;
use super::ModelConfig;

/// Layers per block: `GEMMA3_ATTENTION_PATTERN`'s length (5 local, then 1 global).
pub const BLOCK: i64 = 6;

/// A block of 5 local and 1 global Gemma 3 layers.
#[derive(Debug)]
pub struct Gemma3 {
    /// The local layers' window (`sliding_window_size`).
    window: i64,
    soft_cap: Option<f64>,
    post: PostNorms,
    /// Dot-product attention where the model's would be blockwise (a soft cap, as in Gemma 2).
    how: Option<AttentionImpl>,
    /// RoPE frequencies of the local and the global layers.
    local_rope: Vec<f64>,
    global_rope: Vec<f64>,
    query_scale: f64,
    qk_norm_eps: f64,
}

/// MaxText's `get_query_pre_attn_scalar` (`src/maxtext/models/gemma3.py`, e591f30).
fn query_pre_attn_scalar(c: &Config) -> f64 {
    match c.model_name.as_str() {
        "gemma3-27b" => ((c.base_emb_dim / c.base_num_query_heads) as f64).powf(-0.5),
        _ => (c.head_dim as f64).powf(-0.5),
    }
}

impl Gemma3 {
    pub fn from_config(c: &Config, mc: &ModelConfig) -> Result<Gemma3, String> {
        let layers = c.base_num_decoder_layers << config::parameter_scales(c.global_parameter_scale).3;
        if layers % BLOCK != 0 {
            return Err(format!(
                "base_num_decoder_layers={}: gemma3 layers run in blocks of {BLOCK} (5 local, 1 global) and maxrs has no \
                 remainder block (MaxText's layers_remainder) yet; use a multiple of {BLOCK} (gemma3-12b has 48)",
                c.base_num_decoder_layers
            ));
        }
        if c.sliding_window_size <= 0 {
            return Err(format!(
                "sliding_window_size={}: gemma3's local layers attend over a window of that many tokens; set it to a positive size (1024 in the Gemma 3 model files)",
                c.sliding_window_size
            ));
        }
        if c.rope_type != RopeType::Default {
            return Err(format!(
                "rope_type={}: gemma3's RoPE is MaxText's default one; use rope_type=default",
                c.rope_type
            ));
        }
        let soft_cap = (c.attn_logits_soft_cap > 0.0).then_some(c.attn_logits_soft_cap);
        let how = match (soft_cap, mc.attention) {
            (Some(cap), AttentionImpl::Blockwise { .. } | AttentionImpl::Cudnn { .. }) => match c.attention {
                config::AttentionKernel::Autoselected => Some(AttentionImpl::DotProduct),
                kernel => {
                    return Err(format!(
                        "attention={kernel}: maxrs's blockwise attention has no attn_logits_soft_cap ({cap}) yet; use attention=dot_product"
                    ))
                }
            },
            _ => None,
        };
        let local_timescale = match c.local_rope_max_timescale {
            t if t > 0 => t,
            _ => c.rope_max_timescale,
        };
        Ok(Gemma3 {
            window: c.sliding_window_size,
            soft_cap,
            post: PostNorms { attention: c.use_post_attn_norm, ffw: c.use_post_ffw_norm },
            how,
            local_rope: default_frequencies(c.head_dim, local_timescale as f64, 1.0),
            global_rope: default_frequencies(c.head_dim, c.rope_max_timescale as f64, c.rope_linear_scaling_factor),
            query_scale: query_pre_attn_scalar(c),
            qk_norm_eps: c.normalization_layer_epsilon,
        })
    }

    /// The attention of layer `j` of a block.
    fn attention(&self, j: i64) -> SelfAttention {
        SelfAttention {
            window: (j < BLOCK - 1).then_some(self.window),
            options: AttendOptions { logits_soft_cap: self.soft_cap, float32_qk_product: false },
            how: self.how,
            qk_norm: Some(self.qk_norm_eps),
            query_scale: Some(self.query_scale),
        }
    }
}

fn name(j: i64) -> impl Fn(&str) -> String {
    move |n| format!("layers_{j}.{n}")
}

impl Family for Gemma3 {
    fn layer_params(&self, c: &ModelConfig, _kind: usize) -> Vec<ParamDef> {
        (0..BLOCK)
            .flat_map(|j| {
                let attention = self.attention(j).all_params(&name(j)("self_attention"), c);
                sandwich_params(c, &name(j), self.post, attention)
            })
            .collect()
    }

    fn layer(&self, c: &ModelConfig, _kind: usize, p: &Tree, x: &Tensor, ctx: &LayerContext) -> LayerOutput {
        // The tables are computed inside the layer (cheap, elementwise) rather than passed in:
        // they would be a full-size input of every remat region otherwise.
        let local = rope_tables(&ctx.positions, &self.local_rope);
        let global = rope_tables(&ctx.positions, &self.global_rope);
        let mut x = x.clone();
        for j in 0..BLOCK {
            let attention = self.attention(j);
            let (cos, sin) = if attention.window.is_some() { &local } else { &global };
            x = sandwich(c, p, &x, &name(j), self.post, |prefix, h| {
                attention.apply_with_rope(c, p, prefix, h, ctx, (cos, sin))
            });
        }
        LayerOutput::new(x)
    }

    /// MaxText's `calculate_mixed_attention_model_tflops_training_per_device` with an attention
    /// pattern of 6 (`src/maxtext/utils/maxtext_utils.py`, e591f30): the dense weight terms of 6
    /// layers, one global layer's causal attention `2 * batch * seq^2 * heads * head_dim` and 5
    /// local ones `4 * batch * (seq * w - w^2 / 2) * heads * head_dim` with `w = min(window, seq)`.
    fn layer_flops(&self, c: &ModelConfig, _kind: usize, tokens: f64, seq: f64) -> LayerFlops {
        let dense = dense_layer_flops(c, tokens, seq);
        let (global, local) = global_and_local_attention_flops(c, tokens, seq, self.window);
        LayerFlops { weights: BLOCK as f64 * dense.weights, attention: global + (BLOCK - 1) as f64 * local }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(args: &[&str]) -> Config {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        crate::config::load(None, &args).unwrap()
    }

    /// `get_query_pre_attn_scalar` by hand: gemma3-27b's emb 5376 / 32 heads = 168, not its
    /// head_dim 128; the others use head_dim.
    #[test]
    fn query_scale_follows_maxtext() {
        assert_eq!(query_pre_attn_scalar(&load(&["model_name=gemma3-27b"])), 168f64.powf(-0.5));
        assert_eq!(query_pre_attn_scalar(&load(&["model_name=gemma3-12b"])), 256f64.powf(-0.5));
    }

    /// gemma3-12b's parameter count from its model file, by hand: per layer q, k, v, out
    /// (3840 x 256 x (16 + 8 + 8 + 16)), the GeGLU MLP (3 x 3840 x 15360), four norms of 3840
    /// and two QK norms of 256; 48 layers, the tied embedding (262144 x 3840) and the final norm.
    #[test]
    fn twelve_b_has_its_parameter_count_and_4b_is_refused() {
        let c = load(&["model_name=gemma3-12b"]);
        let m = super::super::Model::from_config(&c).unwrap();
        assert_eq!(m.config.layers, 8, "48 layers in blocks of 6");
        let layer = 3840 * 256 * (16 + 8 + 8 + 16) + 3 * 3840 * 15360 + 4 * 3840 + 2 * 256;
        assert_eq!(m.num_params(), 48 * layer + 262144 * 3840 + 3840);
        let e = super::super::Model::from_config(&load(&["model_name=gemma3-4b"])).unwrap_err();
        assert!(e.contains("base_num_decoder_layers=34") && e.contains("multiple of 6"), "{e}");
    }
}
