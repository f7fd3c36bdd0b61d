//! The Gemma 3 decoder layer, text only (MaxText's `decoder_block: gemma3`, `Gemma3DecoderLayer`
//! and `Gemma3ScannableBlock` in `src/maxtext/models/gemma3.py`, e591f30), top to bottom: its
//! parameters, the layer, its FLOPs.
//!
//! Gemma 3 repeats 5 local layers (attention over the last `sliding_window_size` tokens) and one
//! global layer (`GEMMA3_ATTENTION_PATTERN`). MaxText scans blocks of these 6 layers
//! (`Decoder._apply_gemma3_scanned_blocks`, `src/maxtext/layers/decoders.py`, e591f30), and so
//! one decoder "layer" of maxrs is such a block: `base_num_decoder_layers` counts the real layers,
//! as in MaxText's model files, and the decoder stacks `base_num_decoder_layers / 6` blocks
//! (stack `layers`). The layers left over (4 of gemma3-4b's 34, 2 of gemma3-27b's 62) run after
//! them as one more block of that many layers, MaxText's `layers_remainder`
//! (`Gemma3ScannableBlock(num_of_layers=num_decoder_layers % 6)`, applied once outside the scan),
//! whose layer `j` has the attention of position `j` of the pattern: all local, since fewer than
//! 6 remain (`get_attention_type(layer_id)` with the block's own `layer_id`). Unscanned, MaxText
//! builds one module per layer instead (`src/maxtext/layers/decoders.py:1205,1246` at MaxText
//! e591f30: `Gemma3DecoderLayer` named `layers_<n>`, attention `get_attention_type(n)`), and so
//! does maxrs's naming (`LayerNames::PerSubLayer`): layer `j` of block `b` is
//! `decoder.layers_<6b+j>.*`, the remainder's layer `j` is `decoder.layers_<6 * blocks + j>.*`.
//!
//! Each layer is Gemma 2's (`gemma2::sandwich`: the norms before and, with `use_post_attn_norm`
//! / `use_post_ffw_norm`, after attention and the MLP; Gemma's folded `1 + scale` norms and
//! `sqrt(emb)` embedding, GeGLU, tied logits divided by `sqrt(emb)`), with, in its attention:
//! - QK norm: RMSNorms (epsilon `normalization_layer_epsilon`) over `head_dim` of the queries and
//!   keys before RoPE (`use_qk_norm=True` in `Gemma3DecoderLayer`);
//! - queries multiplied by `query_pre_attn_scalar` after RoPE, which MaxText derives from the
//!   model name (`get_query_pre_attn_scalar`): `(emb // heads)^-1/2` for gemma3-27b,
//!   `head_dim^-1/2` for gemma3-4b and gemma3-12b; another name is refused, as MaxText raises
//!   for it (a custom size runs as `model_name=gemma3-4b override_model_config=true`);
//! - RoPE with `local_rope_max_timescale` in the local layers and `rope_max_timescale` with the
//!   timescales times `rope_linear_scaling_factor` in the global ones (`Attention.init_rotary_embedding`,
//!   `src/maxtext/layers/attentions.py`, e591f30: the factor skips gemma3's local layers);
//! - no soft caps in the model files (`attn_logits_soft_cap` works as in Gemma 2 when set).
//!
//! One block's parameters, for `j` in 0..6 (layer `j` is global when `j == 5`; stacked on a
//! leading `layers` axis by the decoder, which gives MaxText's scanned names
//! `decoder.layers.layers_<j>.*`; the remainder's, `j` below its length, are
//! `decoder.layers_remainder.layers_<j>.*`):
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

use super::attention::{default_frequencies, rope_tables, AttendOptions, LayerContext};
use super::blocks::{QueryScale, SelfAttention};
use super::family::LayerRngs;
use super::family::{dense_layer_flops, Family, LayerFlops, LayerOutput};
use super::gemma2::{global_and_local_attention_flops, sandwich, sandwich_params, PostNorms};
use super::params::ParamDef;
use super::stacks::{sub_layer_name, Stack};
use super::ModelConfig;

/// Layers per block: `GEMMA3_ATTENTION_PATTERN`'s length (5 local, then 1 global).
pub const BLOCK: i64 = 6;

/// A block of 5 local and 1 global Gemma 3 layers.
#[derive(Debug)]
pub struct Gemma3 {
    /// The local layers' window (`sliding_window_size`).
    window: i64,
    post: PostNorms,
    /// RoPE frequencies of the local and the global layers.
    local_rope: Vec<f64>,
    global_rope: Vec<f64>,
    query_scale: f64,
    qk_norm_eps: f64,
    /// The layers after the last whole block (`num_decoder_layers % 6`).
    remainder: i64,
}

/// The kinds of layer (`Stack::kind`): a whole block, and the remainder block.
const WHOLE: usize = 0;
const REMAINDER: usize = 1;

/// The model names MaxText's `get_query_pre_attn_scalar` knows (`src/maxtext/models/gemma3.py:52-59`
/// at MaxText e591f30); it raises for any other.
const MODEL_NAMES: &str = "gemma3-4b, gemma3-12b or gemma3-27b";

/// The `s` of MaxText's `get_query_pre_attn_scalar` (`src/maxtext/models/gemma3.py:52-59` at
/// MaxText e591f30), which multiplies the queries by `s^-1/2`, for a model named `name`:
/// `head_dim` for gemma3-4b and gemma3-12b, `base_emb_dim // base_num_query_heads` for
/// gemma3-27b (Hugging Face's `query_pre_attn_scalar`); None for a name MaxText raises for.
pub fn scalar_of_name(name: &str, base_emb_dim: i64, base_num_query_heads: i64, head_dim: i64) -> Option<i64> {
    match name {
        "gemma3-4b" | "gemma3-12b" => Some(head_dim),
        "gemma3-27b" => base_emb_dim.checked_div(base_num_query_heads),
        _ => None,
    }
}

/// [`scalar_of_name`] of `c`'s model (None where `Gemma3::from_config` refuses the name).
pub fn query_pre_attn_scalar(c: &Config) -> Option<i64> {
    scalar_of_name(&c.model_name, c.base_emb_dim, c.base_num_query_heads, c.head_dim)
}

/// [`query_pre_attn_scalar`], or the error naming the model name MaxText raises for, with the
/// names it knows and the way to run another size.
pub fn checked_query_pre_attn_scalar(c: &Config) -> anyhow::Result<i64> {
    query_pre_attn_scalar(c).ok_or_else(|| {
        anyhow::anyhow!(
            "model_name={}: MaxText's gemma3 scales its queries by a rule of the model name and knows only {MODEL_NAMES} (get_query_pre_attn_scalar, src/maxtext/models/gemma3.py:52-59 at e591f30, raises ValueError otherwise); for another size use model_name=gemma3-4b override_model_config=true with the model's keys (queries times head_dim^-1/2; gemma3-27b's rule is (base_emb_dim // base_num_query_heads)^-1/2)",
            c.model_name
        )
    })
}

/// The model's layers (not blocks): `base_num_decoder_layers` scaled by `global_parameter_scale`.
pub fn num_layers(c: &Config) -> i64 {
    c.base_num_decoder_layers << config::parameter_scales(c.global_parameter_scale).3
}

impl Gemma3 {
    pub fn from_config(c: &Config) -> anyhow::Result<Gemma3> {
        let layers = num_layers(c);
        if c.sliding_window_size <= 0 {
            return Err(anyhow::anyhow!(
                "sliding_window_size={}: gemma3's local layers attend over a window of that many tokens; set it to a positive size (1024 in the Gemma 3 model files)",
                c.sliding_window_size
            ));
        }
        if c.rope_type != RopeType::Default {
            return Err(anyhow::anyhow!(
                "rope_type={}: gemma3's RoPE is MaxText's default one; use rope_type=default",
                c.rope_type
            ));
        }
        let scalar = checked_query_pre_attn_scalar(c)?;
        let local_timescale = match c.local_rope_max_timescale {
            t if t > 0 => t,
            _ => c.rope_max_timescale,
        };
        Ok(Gemma3 {
            window: c.sliding_window_size,
            post: PostNorms { attention: c.use_post_attn_norm, ffw: c.use_post_ffw_norm },
            local_rope: default_frequencies(c.head_dim, local_timescale as f64, 1.0),
            global_rope: default_frequencies(c.head_dim, c.rope_max_timescale as f64, c.rope_linear_scaling_factor),
            query_scale: (scalar as f64).powf(-0.5),
            qk_norm_eps: c.normalization_layer_epsilon,
            remainder: layers % BLOCK,
        })
    }

    /// The layers of a block of `kind`.
    fn layers(&self, kind: usize) -> i64 {
        match kind {
            WHOLE => BLOCK,
            _ => self.remainder,
        }
    }

    /// The attention of layer `j` of a block.
    fn attention(&self, c: &ModelConfig, j: i64) -> SelfAttention {
        SelfAttention {
            window: (j < BLOCK - 1).then_some(self.window),
            options: AttendOptions { logits_soft_cap: c.attn_logits_soft_cap, float32_qk_product: false },
            qk_norm: Some(self.qk_norm_eps),
            queries: QueryScale::RunTime(self.query_scale),
            qkv_bias: false,
        }
    }
}

impl Family for Gemma3 {
    /// MaxText's `Gemma3DecoderLayer` (`src/maxtext/models/gemma3.py` at e591f30) keeps its `rngs` (line 89) and has a
    /// `dropout` (line 175).
    fn layer_rngs(&self, _c: &ModelConfig, _kind: usize) -> Option<LayerRngs> {
        Some(LayerRngs { keeps: true, dropout: true })
    }

    /// `Decoder._apply_gemma3_scanned_blocks` (`src/maxtext/layers/decoders.py`, e591f30): the
    /// whole blocks, then the remainder; unscanned, every layer its own module `layers_<n>`
    /// (`src/maxtext/layers/decoders.py:1205,1246` at MaxText e591f30).
    fn stacks(&self, c: &ModelConfig) -> Vec<Stack> {
        let blocks = c.layers / BLOCK;
        let mut stacks = vec![Stack::new("layers", blocks, WHOLE).per_sub_layer(BLOCK, 0)];
        if self.remainder > 0 {
            let remainder = Stack::single("layers_remainder", REMAINDER);
            stacks.push(remainder.per_sub_layer(self.remainder, blocks * BLOCK));
        }
        stacks
    }

    fn layer_params(&self, c: &ModelConfig, kind: usize) -> Vec<ParamDef> {
        (0..self.layers(kind))
            .flat_map(|j| {
                let attention = self.attention(c, j).all_params(&sub_layer_name(j)("self_attention"), c);
                sandwich_params(c, &sub_layer_name(j), self.post, attention)
            })
            .collect()
    }

    fn layer(&self, c: &ModelConfig, kind: usize, p: &Tree, x: &Tensor, ctx: &LayerContext) -> LayerOutput {
        // The tables are computed inside the layer (cheap, elementwise) rather than passed in:
        // they would be a full-size input of every remat region otherwise.
        let local = rope_tables(&ctx.positions, &self.local_rope);
        let global = rope_tables(&ctx.positions, &self.global_rope);
        let mut x = x.clone();
        for j in 0..self.layers(kind) {
            let attention = self.attention(c, j);
            let (cos, sin) = if attention.window.is_some() { &local } else { &global };
            x = sandwich(c, p, &x, &sub_layer_name(j), self.post, |prefix, h| {
                attention.apply_with_rope(c, p, prefix, h, ctx, (cos, sin))
            });
        }
        LayerOutput::new(x)
    }

    /// MaxText's `calculate_mixed_attention_model_tflops_training_per_device` with an attention
    /// pattern of 6 (`src/maxtext/utils/maxtext_utils.py`, e591f30): the dense weight terms of
    /// each layer, a global layer's causal attention `2 * batch * seq^2 * heads * head_dim` and a
    /// local one's `4 * batch * (seq * w - w^2 / 2) * heads * head_dim` with `w = min(window, seq)`
    /// (MaxText counts `layers / 6` global layers: one per whole block, none in the remainder).
    fn layer_flops(&self, c: &ModelConfig, kind: usize, tokens: f64, seq: f64) -> LayerFlops {
        let dense = dense_layer_flops(c, tokens, seq);
        let (global, local) = global_and_local_attention_flops(c, tokens, seq, self.window);
        let layers = self.layers(kind);
        let globals = layers / BLOCK;
        LayerFlops {
            weights: layers as f64 * dense.weights,
            attention: globals as f64 * global + (layers - globals) as f64 * local,
        }
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
    /// head_dim 128; gemma3-4b and -12b use head_dim; another name is refused at model build, as
    /// MaxText raises for it (`src/maxtext/models/gemma3.py:52-59` at MaxText e591f30), with the
    /// way to run a custom size.
    #[test]
    fn query_scale_follows_maxtext() {
        assert_eq!(query_pre_attn_scalar(&load(&["model_name=gemma3-27b"])), Some(168));
        assert_eq!(query_pre_attn_scalar(&load(&["model_name=gemma3-12b"])), Some(256));
        assert_eq!(query_pre_attn_scalar(&load(&["model_name=gemma3-4b"])), Some(256));
        let custom = load(&["decoder_block=gemma3", "base_num_decoder_layers=6", "sliding_window_size=4"]);
        let e = super::super::Model::from_config(&custom).unwrap_err().to_string();
        assert!(
            e.starts_with(
                "model_name=default: MaxText's gemma3 scales its queries by a rule of the model name and knows only \
                 gemma3-4b, gemma3-12b or gemma3-27b (get_query_pre_attn_scalar, src/maxtext/models/gemma3.py:52-59 \
                 at e591f30, raises ValueError otherwise); for another size use model_name=gemma3-4b \
                 override_model_config=true"
            ),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
    }

    /// gemma3's RoPE keys elsewhere: refused as not supported yet where MaxText reads them
    /// (`rope_linear_scaling_factor` in every family's default RoPE, `local_rope_max_timescale` in
    /// gemma2's local layers), as ignored where it does not; `local_rope_max_timescale` <= 0 is
    /// unset, as in MaxText.
    #[test]
    fn rope_keys_elsewhere_are_refused_truthfully() {
        let model = |args: &[&str]| super::super::Model::from_config(&load(args)).map_err(|e| e.to_string());
        let e = model(&["decoder_block=deepseek", "attention_type=mla", "rope_linear_scaling_factor=2"]).unwrap_err();
        assert!(e.contains("not supported yet with decoder_block=deepseek"), "{e}");
        let e = model(&["decoder_block=gemma2", "sliding_window_size=4", "local_rope_max_timescale=100"]).unwrap_err();
        assert!(e.contains("not supported yet with decoder_block=gemma2"), "{e}");
        let e = model(&["local_rope_max_timescale=100"]).unwrap_err();
        assert!(e.contains("MaxText ignores it there"), "{e}");
        let gemma3 = ["model_name=gemma3-4b", "override_model_config=true", "base_num_decoder_layers=6"];
        let local = |timescale: &str| {
            let m = model(&[&gemma3[..], &[&format!("local_rope_max_timescale={timescale}")]].concat()).unwrap();
            format!("{:?}", m.family)
        };
        assert_eq!(local("0"), local("-1"));
    }

    /// The parameter counts of gemma3-4b, -12b and -27b from their model files, by hand: per
    /// layer q, k, v, out (`emb x head_dim x (heads + 2 kv_heads + heads)`), the GeGLU MLP
    /// (`3 x emb x mlp`), four norms of `emb` and two QK norms of `head_dim`; the tied embedding
    /// (262144 x emb) and the final norm.
    #[test]
    fn parameter_counts_and_the_remainder_block() {
        for (name, layers, emb, heads, kv, head_dim, mlp, blocks) in [
            ("gemma3-4b", 34, 2560, 8, 4, 256, 10240, 5),
            ("gemma3-12b", 48, 3840, 16, 8, 256, 15360, 8),
            ("gemma3-27b", 62, 5376, 32, 16, 128, 21504, 10),
        ] {
            let m = super::super::Model::from_config(&load(&[&format!("model_name={name}")])).unwrap();
            let layer = emb * head_dim * (2 * heads + 2 * kv) + 3 * emb * mlp + 4 * emb + 2 * head_dim;
            assert_eq!(m.num_params(), layers * layer + 262144 * emb + emb, "{name}");
            let stacks: Vec<(&str, i64)> = m.stacks().iter().map(|s| (s.name, s.count)).collect();
            let mut want = vec![("layers", blocks)];
            if layers % 6 != 0 {
                want.push(("layers_remainder", 1));
            }
            assert_eq!(stacks, want, "{name}");
        }
        // gemma3-4b's remainder: 4 local layers without a `layers` axis, after 5 stacked blocks.
        let m = super::super::Model::from_config(&load(&["model_name=gemma3-4b"])).unwrap();
        let shape = |n: &str| m.param_defs().into_iter().find(|d| d.name == n).map(|d| d.shape);
        assert_eq!(shape("decoder.layers.layers_5.self_attention.query.kernel"), Some(vec![5, 2560, 8, 256]));
        assert_eq!(shape("decoder.layers_remainder.layers_3.self_attention.query.kernel"), Some(vec![2560, 8, 256]));
        assert_eq!(shape("decoder.layers_remainder.layers_4.self_attention.query.kernel"), None);
        // Unscanned, one module per layer (decoders.py:1205,1246 at MaxText e591f30): layer 33,
        // the remainder's last, is `layers_33`, and the model's layers are the same arrays.
        let m = super::super::Model::from_config(&load(&["model_name=gemma3-4b", "scan_layers=false"])).unwrap();
        let shape = |n: &str| m.param_defs().into_iter().find(|d| d.name == n).map(|d| d.shape);
        assert_eq!(shape("decoder.layers_33.self_attention.query.kernel"), Some(vec![2560, 8, 256]));
        assert_eq!(shape("decoder.layers_34.self_attention.query.kernel"), None);
        assert_eq!(m.num_params(), 34 * (2560 * 256 * 24 + 3 * 2560 * 10240 + 4 * 2560 + 512) + 262145 * 2560);
    }
}
