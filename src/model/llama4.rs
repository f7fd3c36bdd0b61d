//! The Llama 4 text decoder layer (MaxText's `decoder_block: llama4`, `Llama4DecoderLayer` and
//! `Llama4ScannableBlock` in `src/maxtext/models/llama4.py` at MaxText e591f30), top to bottom:
//! its parameters, the layer, its FLOPs. The vision encoder is not here: `use_multimodal=true`
//! is refused (`config::refused`), and the model files' vision keys are inert as gemma3's are.
//!
//! Layer `n` (0-based over the model) is a NoPE layer when `(n + 1) % nope_layer_interval == 0`
//! (`determine_is_nope_layer`; none with an interval of 0 or less) and an MoE layer when
//! `(n + 1) % interleave_moe_layer_step == 0` (`determine_is_moe_layer`). MaxText scans blocks
//! of `inhomogeneous_layer_cycle_interval` layers (`Llama4ScannableBlock`, its layer `j` typed by
//! `j`), so one maxrs decoder "layer" is such a block, as for gpt-oss (`gpt_oss.rs`):
//! `base_num_decoder_layers` counts the real layers and the stack `layers` holds
//! `layers / interval` blocks. maxrs asks for an interval that both patterns repeat in and that
//! divides the layers, so that the scanned and unscanned models are the same function (MaxText's
//! unscanned layers are typed by `n`). Unscanned, every layer is its own module `layers_<n>`.
//!
//! Each layer is pre-norm (RMSNorms with `normalization_layer_epsilon`):
//! `h = x + attention(norm(x))`, then `h + mlp(norm(h))`. Its attention (`Attention` in
//! `src/maxtext/layers/attentions.py` at e591f30, as `Llama4DecoderLayer` configures it):
//! - RoPE (the model's `rope_type`: Llama 3.1's in the model files) on queries and keys, except
//!   in NoPE layers;
//! - with `use_qk_norm`, outside NoPE layers, an L2 norm of each head's queries and keys after
//!   RoPE, `x / sqrt(mean(x^2) + eps)` with `normalization_layer_epsilon` and no scale
//!   (`L2Norm`), in `dtype`;
//! - queries times `head_dim^-1/2` (`query_pre_attn_scalar`), the kernel unscaled;
//! - with `temperature_tuning`, in NoPE layers, queries times
//!   `1 + 0.1 ln(floor((position + 1) / 8192) + 1)` (scale 0.1 and floor 8192 fixed by
//!   `llama4.py`), computed in `dtype` as MaxText does;
//! - RoPE layers attend within chunks of `chunk_attn_window_size` tokens (`AttentionType.CHUNK`:
//!   a query sees the keys at or before it in its own chunk), NoPE layers globally.
//!
//! Its MLP is MaxText's `MlpBlock` (`mlp`, `base_mlp_dim` wide) in dense layers, and in MoE layers
//! `Llama4MoEBlock_0`, a `RoutedAndSharedMoE` (`moe.rs`) with Llama 4's top-1 sigmoid router
//! (`moe::Router::Llama4`), experts and the shared MLP `base_moe_mlp_dim` wide (times
//! `shared_experts` for the shared one). The block's load-balancing loss is reported per block as
//! the mean over its MoE layers, as gpt-oss's.
//!
//! One block's parameters, for `j` below the interval (stacked on a leading `layers` axis by the
//! decoder: MaxText's scanned names `decoder.layers.layers_<j>.*`):
//!
//! | name | shape | logical axes | init |
//! |---|---|---|---|
//! | `layers_<j>.pre_self_attention_layer_norm.scale` | [emb] | norm | ones |
//! | `layers_<j>.self_attention.{query,key,value,out}.kernel` | as Llama's | | fan_in |
//! | `layers_<j>.post_self_attention_layer_norm.scale` | [emb] | norm | ones |
//! | `layers_<j>.mlp.{wi_0,wi_1,wo}.kernel` (dense layer) | as Llama's | | fan_in |
//! | `layers_<j>.Llama4MoEBlock_0.*` (MoE layer) | `moe::routed_and_shared_param_defs` | | |

use crate::config::{self, Config};
use crate::ir::DType;
use crate::tensor::{Tensor, Tree};

use super::attention::{rope_with, AttendOptions, LayerContext};
use super::blocks::{dense, Mlp, Norm, QueryScale, SelfAttention};
use super::family::{attention_flops, constrain, Family, LayerFlops, LayerOutput, LayerRngs, BTE};
use super::moe::{routed_and_shared_block, routed_and_shared_flops, routed_and_shared_param_defs, MoeConfig};
use super::params::ParamDef;
use super::stacks::{sub_layer_name, Stack};
use super::ModelConfig;

/// The MoE block's name in a layer (MaxText keeps it for its checkpoints' sake).
const MOE: &str = "Llama4MoEBlock_0";

/// Temperature tuning's scale and floor, as `Llama4DecoderLayer` passes them to `Attention`
/// (transformers' `attn_scale` and `floor_scale`).
pub(crate) const TEMPERATURE_SCALE: f64 = 0.1;
pub(crate) const TEMPERATURE_FLOOR: f64 = 8192.0;

/// Whether layer `n` (0-based, in the model or in a block) is a NoPE layer under
/// `nope_layer_interval` `interval` (`determine_is_nope_layer`).
pub(crate) fn is_nope_layer(n: i64, interval: i64) -> bool {
    interval > 0 && (n + 1) % interval == 0
}

/// Whether layer `n` has experts under `interleave_moe_layer_step` `step` (`determine_is_moe_layer`).
pub(crate) fn is_moe_layer(n: i64, step: i64) -> bool {
    (n + 1) % step == 0
}

/// A block of `interval` Llama 4 layers.
#[derive(Debug)]
pub struct Llama4 {
    /// Layers per block (`inhomogeneous_layer_cycle_interval`).
    interval: i64,
    /// `nope_layer_interval` (0 or less: no NoPE layer).
    nope_interval: i64,
    /// `interleave_moe_layer_step`.
    moe_step: i64,
    /// `chunk_attn_window_size`: the RoPE layers' chunk.
    chunk: i64,
    /// `use_qk_norm`: the L2 norm of the RoPE layers' queries and keys.
    qk_norm: bool,
    /// `temperature_tuning` of the NoPE layers' queries.
    temperature_tuning: bool,
    pub moe: MoeConfig,
    /// The experts' hidden size (`base_moe_mlp_dim` scaled as `base_mlp_dim` is).
    pub moe_mlp: i64,
}

impl Llama4 {
    pub fn from_config(c: &Config, mc: &ModelConfig) -> anyhow::Result<Llama4> {
        let layers = mc.layers;
        let (interval, nope, step) =
            (c.inhomogeneous_layer_cycle_interval, c.nope_layer_interval, c.interleave_moe_layer_step);
        let repeats = interval % step == 0 && (nope <= 0 || interval % nope == 0);
        if !repeats || layers % interval != 0 {
            return Err(anyhow::anyhow!(
                "inhomogeneous_layer_cycle_interval={interval}: llama4's scanned block must be a multiple of nope_layer_interval={nope} (when positive) and interleave_moe_layer_step={step} that divides the {layers} decoder layers (MaxText scans {layers} // {interval} blocks, typing their layers by their place in the block); the llama4 model files set 4"
            ));
        }
        let moe_layers = (0..interval).any(|j| (j + 1) % step == 0);
        let rope_layers = nope != 1;
        if rope_layers && c.chunk_attn_window_size <= 0 {
            return Err(anyhow::anyhow!(
                "chunk_attn_window_size={}: llama4's RoPE layers attend within chunks of that many tokens (MaxText refuses a chunk that is not positive); set it (8192 in the llama4 model files)",
                c.chunk_attn_window_size
            ));
        }
        if moe_layers && c.base_moe_mlp_dim < 1 {
            return Err(anyhow::anyhow!(
                "base_moe_mlp_dim={}: llama4's MoE layers (every interleave_moe_layer_step={step}th) have experts and a shared MLP of that hidden size; set it",
                c.base_moe_mlp_dim
            ));
        }
        // MaxText's types.py at e591f30 (`is_fully_moe`).
        if c.num_experts > 1 && step == 1 && interval == 1 && c.base_moe_mlp_dim != c.base_mlp_dim {
            return Err(anyhow::anyhow!(
                "base_moe_mlp_dim={}: with every layer routed (interleave_moe_layer_step=1, inhomogeneous_layer_cycle_interval=1), MaxText requires base_mlp_dim ({}) to equal it",
                c.base_moe_mlp_dim,
                c.base_mlp_dim
            ));
        }
        if moe_layers && mc.mlp_activations != ["silu", "linear"] {
            return Err(anyhow::anyhow!(
                "mlp_activations=[{}]: llama4's experts are SwiGLU MLPs, [silu, linear]; other activations are not supported yet",
                mc.mlp_activations.join(", ")
            ));
        }
        let (_, _, mlp_scale, _) = config::parameter_scales(c.global_parameter_scale);
        Ok(Llama4 {
            interval,
            nope_interval: nope,
            moe_step: step,
            chunk: c.chunk_attn_window_size,
            qk_norm: c.use_qk_norm,
            temperature_tuning: c.temperature_tuning,
            moe: MoeConfig::llama4(c)?,
            moe_mlp: c.base_moe_mlp_dim.max(0) << mlp_scale,
        })
    }

    /// Whether layer `j` of a block is a NoPE layer (global attention, no RoPE).
    fn nope(&self, j: i64) -> bool {
        is_nope_layer(j, self.nope_interval)
    }

    /// Whether layer `j` of a block has experts.
    fn routed(&self, j: i64) -> bool {
        is_moe_layer(j, self.moe_step)
    }

    /// Layer `j`'s attention on the normed `h: [batch, seq, emb]` under `prefix`.
    fn attention(&self, c: &ModelConfig, p: &Tree, prefix: &str, h: &Tensor, ctx: &LayerContext, j: i64) -> Tensor {
        let project = |name: &str, x: &Tensor, axes: usize| dense(c, p, &format!("{prefix}.{name}"), x, axes);
        let (q, k) = (project("query", h, 1), project("key", h, 1));
        let v = project("value", h, 1).checkpoint_name("value_proj");
        let nope = self.nope(j);
        let (q, k) = match nope {
            true => (q, k),
            false => (
                rope_with(&q, &ctx.cos, &ctx.sin, ctx.interleaved_rope),
                rope_with(&k, &ctx.cos, &ctx.sin, ctx.interleaved_rope),
            ),
        };
        let (q, k) = match self.qk_norm && !nope {
            true => (l2_norm(&q, c.eps), l2_norm(&k, c.eps)),
            false => (q, k),
        };
        let mut q = q * (c.head_dim as f64).powf(-0.5);
        if self.temperature_tuning && nope {
            q = (&q * &temperature_scales(&ctx.positions, q.dtype()).expand_dims(-1).expand_dims(-1)).astype(q.dtype());
        }
        let (q, k) = (q.checkpoint_name("query_proj"), k.checkpoint_name("key_proj"));
        let options = AttendOptions::default();
        let out = match nope {
            true => ctx.attend(&q, &k, &v, None, &options),
            false => ctx.attend_chunked(&q, &k, &v, self.chunk, &options),
        };
        project("out", &out, 2).checkpoint_name("out_proj")
    }
}

/// MaxText's `L2Norm` over the last axis (head_dim), in `x`'s dtype.
fn l2_norm(x: &Tensor, eps: f64) -> Tensor {
    x * &(x.square().mean_keepdims(&[-1]) + eps).rsqrt()
}

/// Temperature tuning's `[batch, seq]` query scales for `positions: s32[batch, seq]`, in `dtype`
/// (`Attention.__call__`: `log(floor((positions.astype(dtype) + 1) / 8192) + 1) * 0.1 + 1`). The
/// floor of the non-negative quotient is its truncation to an integer.
fn temperature_scales(positions: &Tensor, dtype: DType) -> Tensor {
    let quotient = (positions.astype(dtype) + 1.0) / TEMPERATURE_FLOOR;
    let floor = quotient.astype(DType::S32).astype(dtype);
    (floor + 1.0).log() * TEMPERATURE_SCALE + 1.0
}

impl Family for Llama4 {
    /// Each layer, MaxText's `Llama4DecoderLayer` (`src/maxtext/models/llama4.py` at e591f30), keeps
    /// its `rngs` (line 336) and has a `dropout` (line 428). The scanned block `Llama4ScannableBlock`
    /// keeps the same object (line 560) at `layers.rngs`, after `layers.layers_0.rngs` in NNX's
    /// order, so it never shows.
    fn layer_rngs(&self, _c: &ModelConfig, _kind: usize) -> Option<LayerRngs> {
        Some(LayerRngs { keeps: true, dropout: true })
    }

    /// `layers / interval` blocks; unscanned, every layer its own module `layers_<n>`.
    fn stacks(&self, c: &ModelConfig) -> Vec<Stack> {
        vec![Stack::new("layers", c.layers / self.interval, 0).per_sub_layer(self.interval, 0)]
    }

    fn layer_params(&self, c: &ModelConfig, _kind: usize) -> Vec<ParamDef> {
        let norm = Norm::Rms { eps: c.eps };
        // `query_pre_attn_scalar` turns MaxText's folding off: the query kernel is drawn as the others.
        let attention = SelfAttention::new(QueryScale::RunTime((c.head_dim as f64).powf(-0.5)));
        (0..self.interval)
            .flat_map(|j| {
                let n = sub_layer_name(j);
                let mut defs = norm.params(&n("pre_self_attention_layer_norm"), c.emb);
                defs.extend(attention.params(&n("self_attention"), c));
                defs.extend(norm.params(&n("post_self_attention_layer_norm"), c.emb));
                match self.routed(j) {
                    true => defs.extend(
                        routed_and_shared_param_defs(c, &self.moe, c.emb, self.moe_mlp)
                            .into_iter()
                            .map(|def| ParamDef { name: n(&format!("{MOE}.{}", def.name)), ..def }),
                    ),
                    false => defs.extend(Mlp::new(c, false, None).params(&n("mlp"), c.emb, c.mlp)),
                }
                defs
            })
            .collect()
    }

    fn layer(&self, c: &ModelConfig, _kind: usize, p: &Tree, x: &Tensor, ctx: &LayerContext) -> LayerOutput {
        let norm = Norm::Rms { eps: c.eps };
        let mut x = x.clone();
        let mut lb_losses = Vec::new();
        for j in 0..self.interval {
            let n = sub_layer_name(j);
            let h = norm.apply(p, &n("pre_self_attention_layer_norm"), &x);
            let attention = constrain(c, self.attention(c, p, &n("self_attention"), &h, ctx, j), BTE);
            let x_mid = constrain(c, &x + &attention, BTE);
            let h = constrain(c, norm.apply(p, &n("post_self_attention_layer_norm"), &x_mid), BTE);
            let mlp = match self.routed(j) {
                true => {
                    let block = routed_and_shared_block(c, &self.moe, &p.subtree(&n(MOE)), &h);
                    lb_losses.push(block.aux_losses(&self.moe));
                    block.output
                }
                false => Mlp::new(c, false, None).apply(c, p, &n("mlp"), &h),
            };
            x = constrain(c, &x_mid + &constrain(c, mlp, BTE), BTE);
        }
        // Each loss's mean over the block's MoE layers.
        let mut aux_losses = Tree::new();
        if let Some(first) = lb_losses.first() {
            for (loss, _) in first.iter() {
                let sum = lb_losses.iter().map(|l| l[loss].clone()).reduce(|a, b| a + b).expect("MoE layers");
                aux_losses.insert(loss, sum / lb_losses.len() as f64);
            }
        }
        LayerOutput { x, aux_losses }
    }

    /// MaxText's counts (`calculate_tflops_training_per_device` in
    /// `src/maxtext/utils/maxtext_utils.py` at e591f30, its llama4 case): the attention
    /// projections, the dense MLP or `calculate_routed_and_shared_ffn_tflops_per_device`'s router,
    /// chosen and shared experts; `calculate_llama4_attention_tflops`' attention, global in the
    /// NoPE layers and over the chunks (`n c^2 + r^2` for `n` whole chunks and a remainder `r` of
    /// the sequence) in the others, halved for causality.
    fn layer_flops(&self, c: &ModelConfig, _kind: usize, tokens: f64, seq: f64) -> LayerFlops {
        let dense_ffn = 2.0 * tokens * (c.mlp * c.emb) as f64 * (c.mlp_activations.len() as f64 + 1.0);
        let moe_ffn = routed_and_shared_flops(&self.moe, c.emb, self.moe_mlp, tokens);
        let attention = attention_flops(c, tokens, seq);
        let chunk = self.chunk as f64;
        let complexity = (seq / chunk).floor() * chunk * chunk + (seq % chunk).powi(2);
        let chunked = 4.0 * (tokens / seq) * complexity * (c.heads * c.head_dim) as f64 / 2.0;
        let mut flops = LayerFlops { weights: 0.0, attention: 0.0 };
        for j in 0..self.interval {
            flops.weights += attention.weights + if self.routed(j) { moe_ffn } else { dense_ffn };
            flops.attention += if self.nope(j) { attention.attention } else { chunked };
        }
        flops
    }
}

#[cfg(test)]
mod tests {
    use super::super::Model;

    /// The model files' stacks (12 blocks of 4) and what each refusal names, on one line: an
    /// interval the patterns do not repeat in or that does not divide the layers, no chunk, no
    /// expert width, several experts a token, another activation list; the multimodal switch; and
    /// llama4's keys in other families.
    #[test]
    fn model_files_load_and_refusals_name_the_culprit() {
        for name in ["llama4-17b-16e", "llama4-17b-128e"] {
            let m = Model::from_args(&[&format!("model_name={name}")]).unwrap();
            let stacks: Vec<(&str, i64)> = m.stacks().iter().map(|s| (s.name, s.count)).collect();
            assert_eq!(stacks, [("layers", 12)], "{name}");
        }
        let llama4 = ["model_name=llama4-17b-128e", "override_model_config=true"];
        let refused = |extra: &[&str], want: &str| {
            let e = Model::from_args(&[&llama4[..], extra].concat()).err().unwrap_or_default();
            assert!(e.contains(want) && !e.contains('\n'), "{extra:?}: {e}");
        };
        refused(
            &["inhomogeneous_layer_cycle_interval=2"],
            "inhomogeneous_layer_cycle_interval=2: llama4's scanned block",
        );
        refused(&["inhomogeneous_layer_cycle_interval=32"], "divides the 48 decoder layers");
        refused(&["chunk_attn_window_size=0"], "chunk_attn_window_size=0: llama4's RoPE layers");
        refused(&["base_moe_mlp_dim=-1"], "base_moe_mlp_dim=-1: llama4's MoE layers");
        refused(&["num_experts_per_tok=2"], "num_experts_per_tok=2: llama4 routes each token to one expert");
        refused(&["mlp_activations=[gelu,linear]"], "mlp_activations=[gelu, linear]: llama4's experts");
        refused(&["use_multimodal=true"], "use_multimodal");
        let e = Model::from_args(&["nope_layer_interval=4"]).err().unwrap_or_default();
        assert!(e.starts_with("nope_layer_interval=4: decoder_block=llama2 does not use"), "{e}");
    }
}
