//! The gpt-oss decoder layer (MaxText's `decoder_block: gpt_oss`, `GptOssDecoderLayer` and
//! `GptOssScannableBlock` in `src/maxtext/models/gpt_oss.py` at MaxText e591f30), top to bottom:
//! its parameters, the layer, its FLOPs.
//!
//! gpt-oss alternates a sliding-window layer (attention over the last `sliding_window_size`
//! tokens) and a global one (`GPT_OSS_ATTENTION_PATTERN`; layer `n` has pattern entry `n % 2`).
//! MaxText scans blocks of `inhomogeneous_layer_cycle_interval` layers (`GptOssScannableBlock`,
//! its layer `j` with pattern entry `j % 2`), so one maxrs decoder "layer" is such a block, as for
//! olmo3 (`olmo3.rs`): `base_num_decoder_layers` counts the real layers and the stack `layers`
//! holds `layers / interval` blocks. maxrs asks for an interval that is a multiple of 2 and
//! divides the layers (MaxText's scan would drop a remainder). Unscanned, every layer is its own
//! module `layers_<n>` (`Stack::per_sub_layer`).
//!
//! Each layer is pre-norm (RMSNorms with `normalization_layer_epsilon`):
//! `h = x + attention(norm(x))`, then `h + moe(norm(h))`. Its attention (`Attention` in
//! `src/maxtext/layers/attentions.py` at e591f30) has:
//! - biases on all four projections with `attention_bias` (`use_bias_in_projections`; unlike
//!   qwen2's, the output projection's too);
//! - queries times `head_dim^-1/2` after RoPE (`query_pre_attn_scalar`), the kernel unscaled;
//! - attention sinks with `attention_sink`: a learned logit per query head (`sinks`, [heads],
//!   zeros, f32) in each softmax's denominator (`LayerContext::attend_sinks`). cuDNN's fused
//!   attention has none: `attention=cudnn_flash_te|cudnn_flash_jax` is refused, as MaxText's
//!   `validate_gpu_flash_attention` (`layers/attention_op.py` at e591f30) refuses it;
//! - one RoPE for every layer: YaRN (`mla::yarn_frequencies`, with `rope_attention_scaling`'s
//!   factor and `rope_interleave`'s pairs) or the default RoPE, as olmo3's.
//!
//! Its MLP is the routed MoE block (`moe.rs`, `RoutedMoE`) with gpt-oss's router bias, expert
//! biases and clamped GLU (`moe::GptOssExperts`); its experts are `base_mlp_dim` wide
//! (`intermediate_dim=config.mlp_dim`). The block's load-balancing loss is reported per block as
//! the mean over its layers, so the decoder's mean over blocks is MaxText's mean over layers.
//!
//! One block's parameters, for `j` below the interval (stacked on a leading `layers` axis by the
//! decoder: MaxText's scanned names `decoder.layers.layers_<j>.*`):
//!
//! | name | shape | logical axes | init |
//! |---|---|---|---|
//! | `layers_<j>.pre_self_attention_layer_norm.scale` | [emb] | norm | ones |
//! | `layers_<j>.GptOssAttention.{query,key,value,out}.kernel` | as Llama's | | fan_in |
//! | `layers_<j>.GptOssAttention.{query,key,value}.bias` (attention_bias) | the projection's output | | zeros |
//! | `layers_<j>.GptOssAttention.out.bias` (attention_bias) | [emb] | embed | zeros |
//! | `layers_<j>.GptOssAttention.sinks` (attention_sink) | [heads] | - | zeros |
//! | `layers_<j>.post_self_attention_layer_norm.scale` | [emb] | norm | ones |
//! | `layers_<j>.GptOssMlp.*` | `moe::param_defs` | | |

use crate::config::{self, AttentionKernel, Config};
use crate::tensor::{Tensor, Tree};

use super::attention::{rope_scaled, rope_tables, rope_with, AttendOptions, LayerContext};
use super::blocks::{dense, Activation, Norm, QueryScale, SelfAttention};
use super::family::LayerRngs;
use super::family::{attention_flops, constrain, Family, LayerFlops, LayerOutput, BTE};
use super::gemma2::global_and_local_attention_flops;
use super::mla::yarn_or_default_rope;
use super::moe::{self, GptOssExperts, MoeConfig};
use super::params::{ParamDef, ParamInit};
use super::stacks::{sub_layer_name, Stack};
use super::ModelConfig;

/// `GPT_OSS_ATTENTION_PATTERN`'s length: 1 sliding-window layer, then 1 global.
pub const PATTERN: i64 = 2;

/// A block of `interval` gpt-oss layers.
#[derive(Debug)]
pub struct GptOss {
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
    /// `attention_bias`: biases on the query, key, value and output projections.
    bias: bool,
    /// `attention_sink`.
    sinks: bool,
    pub moe: MoeConfig,
}

impl GptOss {
    pub fn from_config(c: &Config, mc: &ModelConfig) -> anyhow::Result<GptOss> {
        let layers = c.base_num_decoder_layers << config::parameter_scales(c.global_parameter_scale).3;
        let interval = c.inhomogeneous_layer_cycle_interval;
        if interval % PATTERN != 0 || layers % interval != 0 {
            return Err(anyhow::anyhow!(
                "inhomogeneous_layer_cycle_interval={interval}: gpt_oss's scanned block must be a multiple of its 2-layer pattern (1 sliding, 1 global) that divides the {layers} decoder layers (MaxText scans {layers} // {interval} blocks and drops the rest); the gpt-oss model files set 2"
            ));
        }
        if c.sliding_window_size <= 0 {
            return Err(anyhow::anyhow!(
                "sliding_window_size={}: gpt_oss's sliding layers attend over a window of that many tokens; set it to a positive size (128 in the gpt-oss model files)",
                c.sliding_window_size
            ));
        }
        if c.attention_sink && matches!(c.attention, AttentionKernel::CudnnFlashTe | AttentionKernel::CudnnFlashJax) {
            return Err(anyhow::anyhow!(
                "attention={}: cuDNN's fused attention has no attention sinks (attention_sink=true), and MaxText refuses it with sinks too (validate_gpu_flash_attention, layers/attention_op.py at e591f30); use attention=flash (maxrs's blockwise attention) or dot_product",
                c.attention
            ));
        }
        let activation = match mc.mlp_activations.as_slice() {
            [first, second] if second == "linear" => Activation::parse(first),
            _ => None,
        };
        let Some(activation) = activation else {
            return Err(anyhow::anyhow!(
                "mlp_activations=[{}]: gpt_oss's experts take the first activation for their clamped GLU and a linear second input; other lists are not supported yet (the model files set [sigmoid, linear])",
                mc.mlp_activations.join(", ")
            ));
        };
        if c.mlp_activations_limit <= 0.0 {
            return Err(anyhow::anyhow!(
                "mlp_activations_limit={}: gpt_oss clamps its experts' inputs at this limit (MaxText applies it whatever its value); set a positive limit (7.0 in the model files)",
                c.mlp_activations_limit
            ));
        }
        let (rope, interleaved, rope_scale) = yarn_or_default_rope(c, "gpt_oss")?;
        let experts = GptOssExperts {
            gate_bias: c.routed_bias,
            expert_bias: c.mlp_bias,
            limit: c.mlp_activations_limit,
            activation,
        };
        let moe = MoeConfig { gpt_oss: Some(experts), ..MoeConfig::from_config(c) };
        Ok(GptOss {
            interval,
            window: c.sliding_window_size,
            rope,
            interleaved,
            rope_scale,
            bias: c.attention_bias,
            sinks: c.attention_sink,
            moe,
        })
    }

    /// Layer `j`'s window: the sliding layer's (pattern entry 0), none for the global one.
    fn window(&self, j: i64) -> Option<i64> {
        (j % PATTERN == 0).then_some(self.window)
    }

    /// Layer `j`'s attention on the normed `x: [batch, seq, emb]` under `prefix`, with the RoPE
    /// tables `(cos, sin)`.
    fn attention(
        &self,
        c: &ModelConfig,
        (p, prefix): (&Tree, &str),
        x: &Tensor,
        ctx: &LayerContext,
        (cos, sin): (&Tensor, &Tensor),
        j: i64,
    ) -> Tensor {
        let project = |name: &str, x: &Tensor, axes: usize| {
            let y = dense(c, p, &format!("{prefix}.{name}"), x, axes);
            match self.bias {
                true => y + &p[format!("{prefix}.{name}.bias").as_str()].astype(c.dtype),
                false => y,
            }
        };
        let rope = |x: &Tensor| match self.rope_scale {
            Some(scale) => rope_scaled(x, cos, sin, self.interleaved, scale),
            None => rope_with(x, cos, sin, self.interleaved),
        };
        let q = project("query", x, 1);
        let k = project("key", x, 1);
        let v = project("value", x, 1).checkpoint_name("value_proj");
        let q = (rope(&q) * (c.head_dim as f64).powf(-0.5)).checkpoint_name("query_proj");
        let k = rope(&k).checkpoint_name("key_proj");
        let sinks = self.sinks.then(|| p[format!("{prefix}.sinks").as_str()].clone());
        let out = ctx.attend_sinks([&q, &k, &v], self.window(j), &AttendOptions::default(), sinks.as_ref());
        project("out", &out, 2).checkpoint_name("out_proj")
    }
}

impl Family for GptOss {
    /// MaxText's `GptOssDecoderLayer` (`src/maxtext/models/gpt_oss.py` at e591f30) keeps no `rngs` and has a `dropout`
    /// (line 135).
    fn layer_rngs(&self, _c: &ModelConfig, _kind: usize) -> Option<LayerRngs> {
        Some(LayerRngs { keeps: false, dropout: true })
    }

    /// `layers / interval` blocks; unscanned, every layer its own module `layers_<n>`.
    fn stacks(&self, c: &ModelConfig) -> Vec<Stack> {
        vec![Stack::new("layers", c.layers / self.interval, 0).per_sub_layer(self.interval, 0)]
    }

    fn layer_params(&self, c: &ModelConfig, _kind: usize) -> Vec<ParamDef> {
        let norm = Norm::Rms { eps: c.eps };
        // The query kernel is drawn as the others: `query_pre_attn_scalar` turns MaxText's folding off.
        let scale = QueryScale::RunTime((c.head_dim as f64).powf(-0.5));
        let attention = SelfAttention { qkv_bias: self.bias, ..SelfAttention::new(scale) };
        (0..self.interval)
            .flat_map(|j| {
                let n = sub_layer_name(j);
                let mut defs = norm.params(&n("pre_self_attention_layer_norm"), c.emb);
                defs.extend(attention.all_params(&n("GptOssAttention"), c));
                if self.bias {
                    defs.push(ParamDef::new(&n("GptOssAttention.out.bias"), &[c.emb], &["embed"], ParamInit::Zeros));
                }
                if self.sinks {
                    defs.push(ParamDef::new(&n("GptOssAttention.sinks"), &[c.heads], &[""], ParamInit::Zeros));
                }
                defs.extend(norm.params(&n("post_self_attention_layer_norm"), c.emb));
                defs.extend(
                    moe::param_defs(&self.moe, c.emb, c.mlp)
                        .into_iter()
                        .map(|def| ParamDef { name: n(&format!("GptOssMlp.{}", def.name)), ..def }),
                );
                defs
            })
            .collect()
    }

    fn layer(&self, c: &ModelConfig, _kind: usize, p: &Tree, x: &Tensor, ctx: &LayerContext) -> LayerOutput {
        let norm = Norm::Rms { eps: c.eps };
        // The tables are computed inside the layer (cheap, elementwise) rather than passed in, as
        // olmo3's: they would be a full-size input of every remat region otherwise.
        let (cos, sin) = rope_tables(&ctx.positions, &self.rope);
        let mut x = x.clone();
        let mut lb_losses = Vec::new();
        for j in 0..self.interval {
            let n = sub_layer_name(j);
            let h = norm.apply(p, &n("pre_self_attention_layer_norm"), &x);
            let attention = self.attention(c, (p, &n("GptOssAttention")), &h, ctx, (&cos, &sin), j);
            let h = constrain(c, &x + &attention, BTE);
            let block = moe::moe_block(
                c,
                &self.moe,
                &p.subtree(&n("GptOssMlp")),
                &norm.apply(p, &n("post_self_attention_layer_norm"), &h),
            );
            lb_losses.push(block.aux_losses(&self.moe));
            x = constrain(c, &h + &constrain(c, block.output, BTE), BTE);
        }
        // Each loss's mean over the block's layers.
        let mut aux_losses = Tree::new();
        for (loss, _) in lb_losses[0].iter() {
            let sum = lb_losses.iter().map(|l| l[loss].clone()).reduce(|a, b| a + b).expect("a block has layers");
            aux_losses.insert(loss, sum / self.interval as f64);
        }
        LayerOutput { x, aux_losses }
    }

    /// MaxText's counts (`calculate_tflops_training_per_device` in `src/maxtext/utils/maxtext_utils.py`
    /// at e591f30, its gpt_oss case): the router `2 * tokens * emb * experts` and
    /// `num_experts_per_tok` experts of 3 projections, the attention projections, and
    /// `calculate_mixed_attention_model_tflops_training_per_device`'s attention with a pattern of
    /// 2: one global layer in 2, the others over the window.
    fn layer_flops(&self, c: &ModelConfig, _kind: usize, tokens: f64, seq: f64) -> LayerFlops {
        let (e, m) = (c.emb as f64, c.mlp as f64);
        let router = 2.0 * tokens * e * self.moe.num_experts as f64;
        let expert = 2.0 * tokens * m * e * 3.0;
        let ffn = router + expert * self.moe.num_experts_per_tok as f64;
        let projections = attention_flops(c, tokens, seq).weights;
        let (global, local) = global_and_local_attention_flops(c, tokens, seq, self.window);
        let globals = self.interval / PATTERN;
        LayerFlops {
            weights: self.interval as f64 * (ffn + projections),
            attention: globals as f64 * global + (self.interval - globals) as f64 * local,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Model;

    /// The model files' stacks (12 and 18 blocks of 2) and what each refusal names, on one line:
    /// an interval that is not a multiple of 2 or does not divide the layers, YaRN past its table,
    /// cuDNN's attention with sinks, a non-positive clamp, another activation list, no window;
    /// and gpt-oss's keys in other families.
    #[test]
    fn model_files_load_and_refusals_name_the_culprit() {
        for (name, blocks) in [("gpt-oss-20b", 12), ("gpt-oss-120b", 18)] {
            let m = Model::from_args(&[&format!("model_name={name}")]).unwrap();
            let stacks: Vec<(&str, i64)> = m.stacks().iter().map(|s| (s.name, s.count)).collect();
            assert_eq!(stacks, [("layers", blocks)], "{name}");
        }
        let gpt_oss = ["model_name=gpt-oss-20b", "override_model_config=true"];
        let refused = |extra: &[&str], want: &str| {
            let e = Model::from_args(&[&gpt_oss[..], extra].concat()).err().unwrap_or_default();
            assert!(e.contains(want) && !e.contains('\n'), "{extra:?}: {e}");
        };
        refused(
            &["inhomogeneous_layer_cycle_interval=3"],
            "inhomogeneous_layer_cycle_interval=3: gpt_oss's scanned block",
        );
        refused(&["inhomogeneous_layer_cycle_interval=16"], "divides the 24 decoder layers");
        refused(&["max_target_length=140000"], "max_target_length=140000: gpt_oss's YaRN RoPE");
        refused(
            &["attention=cudnn_flash_te"],
            "attention=cudnn_flash_te: cuDNN's fused attention has no attention sinks",
        );
        refused(&["mlp_activations_limit=-1"], "mlp_activations_limit=-1: gpt_oss clamps");
        refused(&["mlp_activations=[silu,silu]"], "mlp_activations=[silu, silu]: gpt_oss's experts");
        refused(&["sliding_window_size=0"], "sliding_window_size=0: gpt_oss's sliding layers");
        // MaxText's other families read the sinks and the experts' biases too; maxrs not yet.
        let e = Model::from_args(&["attention_sink=true"]).err().unwrap_or_default();
        assert!(e.starts_with("attention_sink=true: not supported yet with decoder_block=llama2"), "{e}");
        let e =
            Model::from_args(&["decoder_block=mixtral", "num_experts=4", "mlp_bias=true"]).err().unwrap_or_default();
        assert!(e.starts_with("mlp_bias=true: not supported yet with decoder_block=mixtral"), "{e}");
    }
}
