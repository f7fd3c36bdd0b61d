//! The OLMo 3 decoder layer (MaxText's `decoder_block: olmo3`, `Olmo3DecoderLayer` and
//! `Olmo3ScannableBlock` in `src/maxtext/models/olmo3.py` at MaxText e591f30), top to bottom: its
//! parameters, the layer, its FLOPs.
//!
//! OLMo 3 repeats 3 sliding-window layers (attention over the last `sliding_window_size` tokens)
//! and one global layer (`OLMO3_ATTENTION_PATTERN`; layer `n` has pattern entry `n % 4`).
//! MaxText scans blocks of `inhomogeneous_layer_cycle_interval` layers (`Olmo3ScannableBlock`, its
//! layer `j` with pattern entry `j % 4`; `Decoder.__call__` in `src/maxtext/layers/decoders.py` at
//! e591f30 takes `num_decoder_layers // interval` of them), so one maxrs decoder "layer" is such a
//! block, as for gemma3 (`gemma3.rs`): `base_num_decoder_layers` counts the real layers and the
//! stack `layers` holds `layers / interval` blocks. maxrs asks for an interval that is a multiple
//! of 4 and divides the layers: MaxText's scan would silently drop a remainder, and another
//! interval would give the scanned and unscanned models different patterns. Unscanned, every
//! layer is its own module `layers_<n>` (`decoders.py:1243` at MaxText e591f30), which
//! `Stack::per_sub_layer` names.
//!
//! Each layer is post-norm, without norms on its inputs:
//! `x + norm(attention(x))`, then `+ norm(mlp(.))` (MaxText's `post_self_attention_layer_norm`,
//! `post_mlp_layer_norm`; RMSNorms with `normalization_layer_epsilon`). Its attention
//! (`Attention` in `src/maxtext/layers/attentions.py` at e591f30) has:
//! - QK-norm over all heads at once: `GlobalRMSNorm` (`layers/normalizations.py`), an RMSNorm of
//!   the `[heads * head_dim]` queries and the `[kv_heads * head_dim]` keys, before RoPE. MaxText
//!   picks it by `model_name.startswith("olmo3")` (per-head otherwise), so maxrs refuses
//!   decoder_block=olmo3 under another name;
//! - queries times `head_dim^-1/2` after RoPE (`query_pre_attn_scalar`), the kernel unscaled;
//! - one RoPE for every layer, sliding or global: `rope_type` (the same for all layers, as the
//!   comment in `olmo3.py` says it matches Hugging Face), YaRN (`mla::yarn_frequencies`, its
//!   `rope_attention_scaling` factor `0.1 ln(rope_factor) + 1` on the rotated values, pairs per
//!   `rope_interleave`) or the default RoPE (`rope_max_timescale`, `rope_linear_scaling_factor`).
//!
//! One block's parameters, for `j` below the interval (stacked on a leading `layers` axis by the
//! decoder: MaxText's scanned names `decoder.layers.layers_<j>.*`):
//!
//! | name | shape | logical axes | init |
//! |---|---|---|---|
//! | `layers_<j>.attention.{query,key,value,out}.kernel` | as Llama's | | fan_in |
//! | `layers_<j>.attention.query_norm.scale` | [heads * head_dim] | norm | ones |
//! | `layers_<j>.attention.key_norm.scale` | [kv_heads * head_dim] | norm | ones |
//! | `layers_<j>.post_self_attention_layer_norm.scale` | [emb] | norm | ones |
//! | `layers_<j>.mlp.{wi_0,wi_1,wo}.kernel` | as Llama's | | fan_in |
//! | `layers_<j>.post_mlp_layer_norm.scale` | [emb] | norm | ones |

use crate::config::{self, Config};
use crate::tensor::{Tensor, Tree};

use super::attention::{rope_scaled, rope_tables, rope_with, AttendOptions, LayerContext};
use super::blocks::{dense, Mlp, Norm, QueryScale, SelfAttention};
use super::family::LayerRngs;
use super::family::{constrain, dense_layer_flops, Family, LayerFlops, LayerOutput, BTE};
use super::mla::yarn_or_default_rope;
use super::params::{ParamDef, ParamInit};
use super::stacks::{sub_layer_name, Stack};
use super::ModelConfig;

/// `OLMO3_ATTENTION_PATTERN`'s length: 3 sliding-window layers, then 1 global.
pub const PATTERN: i64 = 4;

/// A block of `interval` OLMo 3 layers.
#[derive(Debug)]
pub struct Olmo3 {
    /// Layers per block (`inhomogeneous_layer_cycle_interval`).
    interval: i64,
    /// The sliding layers' window (`sliding_window_size`).
    window: i64,
    /// RoPE's frequencies, the same in every layer.
    rope: Vec<f64>,
    /// RoPE rotates interleaved pairs (YaRN's `rope_interleave`).
    interleaved: bool,
    /// YaRN's `rope_attention_scaling` factor on the rotated values.
    rope_scale: Option<f64>,
}

impl Olmo3 {
    pub fn from_config(c: &Config) -> anyhow::Result<Olmo3> {
        let layers = c.base_num_decoder_layers << config::parameter_scales(c.global_parameter_scale).3;
        let interval = c.inhomogeneous_layer_cycle_interval;
        if !c.model_name.starts_with("olmo3") {
            return Err(anyhow::anyhow!(
                "model_name={}: MaxText's olmo3 normalizes queries and keys over all heads only for a model_name starting with olmo3 (attentions.py at e591f30; per head otherwise, which maxrs does not support for olmo3 yet); use model_name=olmo3-7b override_model_config=true with the model's keys",
                c.model_name
            ));
        }
        if !c.use_qk_norm {
            return Err(anyhow::anyhow!(
                "use_qk_norm=false is not supported yet with decoder_block=olmo3; every OLMo 3 model file sets use_qk_norm: true"
            ));
        }
        if interval % PATTERN != 0 || layers % interval != 0 {
            return Err(anyhow::anyhow!(
                "inhomogeneous_layer_cycle_interval={interval}: olmo3's scanned block must be a multiple of its 4-layer pattern (3 sliding, 1 global) that divides the {layers} decoder layers (MaxText scans {layers} // {interval} blocks and drops the rest); the OLMo 3 model files set 4"
            ));
        }
        if c.sliding_window_size <= 0 {
            return Err(anyhow::anyhow!(
                "sliding_window_size={}: olmo3's sliding layers attend over a window of that many tokens; set it to a positive size (4096 in the OLMo 3 model files)",
                c.sliding_window_size
            ));
        }
        let (rope, interleaved, rope_scale) = yarn_or_default_rope(c, "olmo3")?;
        Ok(Olmo3 { interval, window: c.sliding_window_size, rope, interleaved, rope_scale })
    }

    /// Layer `j`'s window: its sliding layers' (pattern entries 0 to 2), none for the global one.
    fn window(&self, j: i64) -> Option<i64> {
        (j % PATTERN != PATTERN - 1).then_some(self.window)
    }

    /// Layer `j`'s attention on `x: [batch, seq, emb]` under `prefix`, with the RoPE tables
    /// `(cos, sin)`.
    fn attention(
        &self,
        c: &ModelConfig,
        (p, prefix): (&Tree, &str),
        x: &Tensor,
        ctx: &LayerContext,
        (cos, sin): (&Tensor, &Tensor),
        j: i64,
    ) -> Tensor {
        let project = |name: &str, x: &Tensor, axes: usize| dense(c, p, &format!("{prefix}.{name}"), x, axes);
        // `GlobalRMSNorm`: the heads flattened into one axis, normed, unflattened.
        let norm = |name: &str, x: &Tensor| {
            let s = x.shape().to_vec();
            let flat = x.reshape(&[s[0], s[1], s[2] * s[3]]);
            Norm::Rms { eps: c.eps }.apply(p, &format!("{prefix}.{name}"), &flat).reshape(&s)
        };
        let rope = |x: &Tensor| match self.rope_scale {
            Some(scale) => rope_scaled(x, cos, sin, self.interleaved, scale),
            None => rope_with(x, cos, sin, self.interleaved),
        };
        let q = norm("query_norm", &project("query", x, 1));
        let k = norm("key_norm", &project("key", x, 1));
        let v = project("value", x, 1).checkpoint_name("value_proj");
        let q = (rope(&q) * (c.head_dim as f64).powf(-0.5)).checkpoint_name("query_proj");
        let k = rope(&k).checkpoint_name("key_proj");
        let out = ctx.attend(&q, &k, &v, self.window(j), &AttendOptions::default());
        project("out", &out, 2).checkpoint_name("out_proj")
    }
}

/// The projections' parameters: the query kernel drawn as the others, its `head_dim^-1/2` applied
/// at run time (`query_pre_attn_scalar`; MaxText's `init_query_w` does not fold it with QK-norm).
fn projections(c: &ModelConfig) -> SelfAttention {
    SelfAttention::new(QueryScale::RunTime((c.head_dim as f64).powf(-0.5)))
}

impl Family for Olmo3 {
    /// MaxText's `Olmo3DecoderLayer` (`src/maxtext/models/olmo3.py` at e591f30) keeps no `rngs` and has a `dropout`
    /// (line 146).
    fn layer_rngs(&self, _c: &ModelConfig, _kind: usize) -> Option<LayerRngs> {
        Some(LayerRngs { keeps: false, dropout: true })
    }

    /// `layers / interval` blocks; unscanned, every layer its own module `layers_<n>`.
    fn stacks(&self, c: &ModelConfig) -> Vec<Stack> {
        vec![Stack::new("layers", c.layers / self.interval, 0).per_sub_layer(self.interval, 0)]
    }

    fn layer_params(&self, c: &ModelConfig, _kind: usize) -> Vec<ParamDef> {
        let norm = Norm::Rms { eps: c.eps };
        let qk_norm = |n: &str, features: i64| ParamDef::new(n, &[features], &["norm"], ParamInit::Ones);
        (0..self.interval)
            .flat_map(|j| {
                let n = sub_layer_name(j);
                let mut defs = projections(c).params(&n("attention"), c);
                defs.push(qk_norm(&n("attention.query_norm.scale"), c.heads * c.head_dim));
                defs.push(qk_norm(&n("attention.key_norm.scale"), c.kv_heads * c.head_dim));
                defs.extend(norm.params(&n("post_self_attention_layer_norm"), c.emb));
                defs.extend(Mlp::new(c, false, None).params(&n("mlp"), c.emb, c.mlp));
                defs.extend(norm.params(&n("post_mlp_layer_norm"), c.emb));
                defs
            })
            .collect()
    }

    fn layer(&self, c: &ModelConfig, _kind: usize, p: &Tree, x: &Tensor, ctx: &LayerContext) -> LayerOutput {
        let norm = Norm::Rms { eps: c.eps };
        // The tables are computed inside the layer (cheap, elementwise) rather than passed in, as
        // gemma3's: they would be a full-size input of every remat region otherwise.
        let (cos, sin) = rope_tables(&ctx.positions, &self.rope);
        let mut x = x.clone();
        for j in 0..self.interval {
            let n = sub_layer_name(j);
            let attention = self.attention(c, (p, &n("attention")), &x, ctx, (&cos, &sin), j);
            let h = constrain(c, &x + &norm.apply(p, &n("post_self_attention_layer_norm"), &attention), BTE);
            let mlp = Mlp::new(c, false, None).apply(c, p, &n("mlp"), &h);
            x = constrain(c, &h + &norm.apply(p, &n("post_mlp_layer_norm"), &mlp), BTE);
        }
        LayerOutput::new(x)
    }

    /// MaxText's dense count for every layer (`calculate_tflops_training_per_device` in
    /// `src/maxtext/utils/maxtext_utils.py` at e591f30 has no olmo3 case: its sliding layers are
    /// counted as global).
    fn layer_flops(&self, c: &ModelConfig, _kind: usize, tokens: f64, seq: f64) -> LayerFlops {
        let dense = dense_layer_flops(c, tokens, seq);
        let n = self.interval as f64;
        LayerFlops { weights: n * dense.weights, attention: n * dense.attention }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Model;

    /// The model files' stacks (8 and 16 blocks of 4) and what each refusal names, on one line:
    /// another model name (MaxText's per-head QK-norm), an interval that is not a multiple of 4 or
    /// does not divide the layers (MaxText's scan drops the rest), YaRN past its table, the
    /// interval in another family (its scan length there).
    #[test]
    fn model_files_load_and_refusals_name_the_culprit() {
        for (name, blocks) in [("olmo3-7b", 8), ("olmo3-7b-pt", 8), ("olmo3-32b", 16)] {
            let m = Model::from_args(&[&format!("model_name={name}")]).unwrap();
            let stacks: Vec<(&str, i64)> = m.stacks().iter().map(|s| (s.name, s.count)).collect();
            assert_eq!(stacks, [("layers", blocks)], "{name}");
        }
        let olmo3 = ["model_name=olmo3-7b", "override_model_config=true"];
        let refused = |extra: &[&str], want: &str| {
            let e = Model::from_args(&[&olmo3[..], extra].concat()).err().unwrap_or_default();
            assert!(e.contains(want) && !e.contains('\n'), "{extra:?}: {e}");
        };
        refused(
            &["inhomogeneous_layer_cycle_interval=2"],
            "inhomogeneous_layer_cycle_interval=2: olmo3's scanned block",
        );
        refused(&["base_num_decoder_layers=6"], "divides the 6 decoder layers");
        refused(&["max_target_length=70000"], "max_target_length=70000: olmo3's YaRN RoPE");
        let e = Model::from_args(&[
            "decoder_block=olmo3",
            "use_qk_norm=true",
            "sliding_window_size=4",
            "base_num_decoder_layers=4",
        ])
        .err()
        .unwrap_or_default();
        assert!(e.starts_with("model_name=default: MaxText's olmo3 normalizes"), "{e}");
        let e = Model::from_args(&["inhomogeneous_layer_cycle_interval=2"]).err().unwrap_or_default();
        assert!(e.contains("not supported yet with decoder_block=llama2 (MaxText scans"), "{e}");
    }
}
