//! The Gemma 4 decoder layer, text only (MaxText's `decoder_block: gemma4`: `Gemma4DecoderLayer`,
//! `Gemma4MoE` and `Gemma4ScannableBlock` in `src/maxtext/models/gemma4.py` at e591f30; gemma4-31b
//! dense, gemma4-26b with routed experts beside a shared MLP), top to bottom: its parameters, the
//! layer, its FLOPs. Gemma 4 small (`gemma4_small.rs`) builds its layers from this layer's
//! parameters, attention and feed-forward halves, scalar and attention FLOPs.
//!
//! Like Gemma 3 it repeats 5 local layers (attention over the last `sliding_window_size` tokens)
//! and one global layer (`GEMMA4_ATTENTION_PATTERN`), and one decoder "layer" of maxrs is such a
//! block of 6 (`base_num_decoder_layers` counts the real layers). What differs from Gemma 3:
//! - the global layers have their own head size (`global_head_dim`) and key/value heads
//!   (`global_num_kv_heads`), and with `share_kv_projections` no value kernel: the values are the
//!   keys as projected, before the key norm;
//! - RoPE: `local_rope_max_timescale` / `global_rope_max_timescale` and, below 1, the
//!   `local_rope_proportion` / `global_rope_proportion` of the head rotated
//!   (`Gemma4PartialRotaryEmbedding`, `src/maxtext/layers/embeddings.py` at e591f30: the first
//!   `int(head * proportion) / 2` frequencies of each half keep their full-head timescales, the
//!   rest have angle 0); `rope_linear_scaling_factor` scales a layer whose whole head rotates
//!   (MaxText's default `RotaryEmbedding` there, `Attention.init_rotary_embedding`);
//! - QK norm and a value norm (RMSNorms over the head, epsilon `normalization_layer_epsilon`; the
//!   value norm's scale only with `v_norm_with_scale`), and no query scaling at all
//!   (`query_pre_attn_scalar=1.0`; the query kernel's draw is still divided by `sqrt(head)`,
//!   `Attention.init_query_w`, since `use_qk_norm` is unset);
//! - the layer's output is multiplied by a learned `layer_scalar` ([1], ones);
//! - with `num_experts > 1` (`Gemma4MoE`) the MLP is a shared GeGLU MLP (`shared_experts` times
//!   `base_mlp_dim` wide) on the pre-FFW-normed input, normed by `post_feedforward_layernorm_1`,
//!   plus the routed experts (`moe::Router::Gemma4`) on `pre_feedforward_layernorm_2` of the
//!   residual stream, normed by `post_feedforward_layernorm_2`; the router reads the residual
//!   stream RMS-normed without a scale, times `emb^-1/2` and `pre_forward_scale_2`.
//!
//! cuDNN's fused attention (`attention=cudnn_flash_te`) takes heads of at most 256
//! (`cudnn::unsupported`): the local layers' calls use it, the global layers' (512 in the model
//! files) fall back to blockwise attention call by call (`LayerContext::attend`); MaxText hands
//! them to Transformer Engine's `DotProductAttention`, which takes its unfused attention when no
//! fused kernel is available for the call.
//!
//! Norms are RMSNorms with MaxText's default epsilon 1e-6 (`normalization_layer_epsilon` for the
//! head norms and the router's norm), scale as stored (Gemma 4's checkpoints have no `+ 1`).
//!
//! Names (MaxText's, `Decoder._apply_gemma4_scanned_blocks`, `src/maxtext/layers/decoders.py` at
//! e591f30): scanned, the blocks are the stack `scanned_blocks`, whose 5 local layers are one
//! more scan, `scanned_blocks.local_layers.<p>` with the local axis at MaxText's
//! `param_scan_axis` 1 of each parameter (`nnx_scan.create_scanned_layers`: `[emb, 5, heads,
//! head]` for a query kernel, `[emb, 5]` for a norm scale; stacking adds the blocks' axis in
//! front), and the global one `scanned_blocks.global_layer.<p>`. MaxText names the layers left
//! over after the last block (`num_decoder_layers % 6`) by their module class there, which
//! maxrs does not reproduce: a scanned model whose layers are not a multiple of 6 is refused (the
//! model files have 60 and 30). Unscanned, every layer is its own module `layers_<n>`
//! (`decoders.py:1214`), as Gemma 3's (`LayerNames::PerSubLayer`, a remainder block after the
//! whole ones).
//!
//! One layer's parameters (`<p>` above; `layers_<j>.<p>` unscanned):
//!
//! | name | shape | logical axes | init |
//! |---|---|---|---|
//! | `pre_self_attention_norm.scale` | [emb] | norm | ones |
//! | `self_attention.query.kernel` | [emb, heads, head] | embed, heads, kv | fan_in / sqrt(head) |
//! | `self_attention.{key,value}.kernel` (no value if shared) | [emb, kv_heads, head] | embed, kv_heads, kv | fan_in |
//! | `self_attention.out.kernel` | [heads, head, emb] | heads, kv, embed | fan_in |
//! | `self_attention.{query,key}_norm.scale`, `value_norm.scale` (with `v_norm_with_scale`) | [head] | norm | ones |
//! | `post_self_attention_norm.scale` (with `use_post_attn_norm`) | [emb] | norm | ones |
//! | `pre_ffw_norm.scale` | [emb] | norm | ones |
//! | `mlp.{wi_0,wi_1,wo}.kernel` (dense) | as Gemma's | | fan_in |
//! | `mlp.moe_block.MoeBlock_0.*` (experts; `moe.rs`, with `per_expert_scale`) | | | |
//! | `mlp.moe_block.shared_experts.{wi_0,wi_1,wo}.kernel` (experts) | as Gemma's MLP | | fan_in |
//! | `mlp.pre_forward_scale_2` (experts) | [emb] | embed | ones |
//! | `mlp.{pre_feedforward_layernorm_2,post_feedforward_layernorm_{1,2}}.scale` (experts) | [emb] | norm | ones |
//! | `post_ffw_norm.scale` (with `use_post_ffw_norm`) | [emb] | norm | ones |
//! | `layer_scalar` | [1] | - | ones |
//!
//! (`head`, `kv_heads` are the global layer's own in a global layer.)

use crate::config::{self, Config, RopeType};
use crate::ir::DType;
use crate::tensor::{Tensor, Tree};

use super::attention::{rope_tables, rope_with, AttendOptions, LayerContext};
use super::blocks::{dense, depth_scaling, Mlp, Norm};
use super::family::{constrain, Family, LayerFlops, LayerOutput, LayerRngs, BTE};
use super::gemma::LAYER_NORM_EPS;
use super::moe::{self, MoeConfig, Router};
use super::params::{ParamDef, ParamInit};
use super::stacks::Stack;
use super::ModelConfig;

/// Layers per block: `GEMMA4_ATTENTION_PATTERN`'s length (5 local, then 1 global).
pub const BLOCK: i64 = 6;
/// The local layers of a block.
const LOCAL: i64 = BLOCK - 1;

/// The kinds of layer (`Stack::kind`): a whole block, and (unscanned) the remainder block.
const WHOLE: usize = 0;
const REMAINDER: usize = 1;

/// The attention of a local or a global layer.
#[derive(Clone, Debug)]
pub(super) struct Attention {
    pub(super) kv_heads: i64,
    pub(super) head_dim: i64,
    /// `share_kv_projections`: the values are the keys' projection.
    shared_kv: bool,
    /// RoPE's frequency of each of the head's `head_dim / 2` pairs (0: not rotated).
    pub(super) rope: Vec<f64>,
    /// The local layers' window.
    pub(super) window: Option<i64>,
}

/// A block of 5 local and 1 global Gemma 4 layers.
#[derive(Debug)]
pub struct Gemma4 {
    pub(super) local: Attention,
    pub(super) global: Attention,
    post_attention_norm: bool,
    post_ffw_norm: bool,
    /// `normalization_layer_epsilon`: the head norms' and the router norm's.
    head_eps: f64,
    /// `v_norm_with_scale`.
    value_scale: bool,
    soft_cap: Option<f64>,
    /// The routed experts and their width, with `num_experts > 1`.
    moe: Option<(MoeConfig, i64)>,
    /// The layers after the last whole block (`num_decoder_layers % 6`; unscanned only).
    remainder: i64,
}

/// The RoPE frequencies of a layer with heads of `head_dim`, rotating `proportion` of it, at
/// `max_timescale`: `Gemma4PartialRotaryEmbedding`'s below 1 (`src/maxtext/layers/embeddings.py`
/// at e591f30: `int(head_dim * proportion) // 2` frequencies `max^(-2i / head_dim)`, then
/// zeros), else the default RoPE's, timescales times `linear_factor`.
fn frequencies(head_dim: i64, proportion: f64, max_timescale: f64, linear_factor: f64) -> Vec<f64> {
    let half = head_dim / 2;
    if proportion >= 1.0 {
        return (0..half).map(|i| max_timescale.powf(-2.0 * i as f64 / head_dim as f64) / linear_factor).collect();
    }
    let rotated = (head_dim as f64 * proportion) as i64 / 2;
    (0..half).map(|i| if i < rotated { max_timescale.powf(-2.0 * i as f64 / head_dim as f64) } else { 0.0 }).collect()
}

/// MaxText's timescale of a layer type: its own when positive, else `rope_max_timescale`.
fn timescale(own: i64, c: &Config) -> f64 {
    match own {
        t if t > 0 => t as f64,
        _ => c.rope_max_timescale as f64,
    }
}

impl Gemma4 {
    pub fn from_config(c: &Config, mc: &ModelConfig) -> anyhow::Result<Gemma4> {
        let layers = c.base_num_decoder_layers << config::parameter_scales(c.global_parameter_scale).3;
        if c.sliding_window_size <= 0 {
            return Err(anyhow::anyhow!(
                "sliding_window_size={}: gemma4's local layers attend over a window of that many tokens; set it to a positive size (1024 in the Gemma 4 model files)",
                c.sliding_window_size
            ));
        }
        if c.rope_type != RopeType::Default {
            return Err(anyhow::anyhow!(
                "rope_type={}: gemma4's RoPE is MaxText's default one (partial in the global layers); use rope_type=default",
                c.rope_type
            ));
        }
        if c.scan_layers && layers % BLOCK != 0 {
            return Err(anyhow::anyhow!(
                "base_num_decoder_layers={layers}: with scan_layers=true MaxText scans gemma4 in blocks of 6 and names the layers left over by their module class (Gemma4DecoderLayerToLinen_<i>, src/maxtext/layers/decoders.py at e591f30), which is not supported yet; use a multiple of 6 (the model files have 60 and 30) or scan_layers=false"
            ));
        }
        if mc.fp8.is_some() || mc.lora.is_some() {
            let what = if mc.lora.is_some() { "LoRA (lora.enable_lora)" } else { "fp8 quantization" };
            return Err(anyhow::anyhow!(
                "{what} is not supported yet with decoder_block=gemma4 (its local layers are one more scan in each block); train it without"
            ));
        }
        // MaxText's `Attention.init_rotary_embedding` (layers/attentions.py at e591f30) picks
        // Gemma 4's partial RoPE by the model name; under another it takes `PartialRotaryEmbedding`,
        // which rotates the head's leading part as a whole.
        let partial = c.global_rope_proportion < 1.0 || c.local_rope_proportion < 1.0;
        if partial && !c.model_name.starts_with("gemma4") {
            return Err(anyhow::anyhow!(
                "model_name={}: MaxText gives gemma4's partial RoPE (global_rope_proportion={}, local_rope_proportion={}) its Gemma 4 layout only under a model_name starting with gemma4, and another layout (PartialRotaryEmbedding) otherwise, which is not supported yet; use model_name=gemma4-31b or gemma4-26b with override_model_config=true",
                c.model_name,
                c.global_rope_proportion,
                c.local_rope_proportion
            ));
        }
        let global_head = if c.global_head_dim > 0 { c.global_head_dim } else { c.head_dim };
        let global_kv = if c.global_num_kv_heads > 0 { c.global_num_kv_heads } else { mc.kv_heads };
        if global_head % 2 != 0 {
            return Err(anyhow::anyhow!(
                "global_head_dim={global_head}: RoPE rotates pairs of the head; use an even size (512 in the model files)"
            ));
        }
        if mc.heads % global_kv != 0 {
            return Err(anyhow::anyhow!(
                "global_num_kv_heads={global_kv}: the {} query heads must group evenly over the global layers' key/value heads; use a divisor of {}",
                mc.heads,
                mc.heads
            ));
        }
        let moe = match c.num_experts {
            1 => None,
            _ => {
                if mc.mlp_activations != ["gelu", "linear"] {
                    return Err(anyhow::anyhow!(
                        "mlp_activations=[{}]: gemma4's experts are GeGLU (MaxText takes the first activation for them); other lists with num_experts > 1 are not supported yet (the model files set [gelu, linear])",
                        mc.mlp_activations.join(", ")
                    ));
                }
                if c.base_moe_mlp_dim <= 0 || c.shared_experts < 1 {
                    return Err(anyhow::anyhow!(
                        "base_moe_mlp_dim={}, shared_experts={}: gemma4's MoE layer has routed experts base_moe_mlp_dim wide beside a shared MLP of shared_experts x base_mlp_dim (gemma4-26b: 704 and 1); set both positive",
                        c.base_moe_mlp_dim,
                        c.shared_experts
                    ));
                }
                let width = c.base_moe_mlp_dim << config::parameter_scales(c.global_parameter_scale).2;
                let m =
                    MoeConfig { router: Router::Gemma4, shared_experts: c.shared_experts, ..MoeConfig::from_config(c) };
                Some((m, width))
            }
        };
        let local_timescale = timescale(c.local_rope_max_timescale, c);
        let global_timescale = timescale(c.global_rope_max_timescale, c);
        let factor = c.rope_linear_scaling_factor;
        Ok(Gemma4 {
            local: Attention {
                kv_heads: mc.kv_heads,
                head_dim: c.head_dim,
                shared_kv: false,
                rope: frequencies(c.head_dim, c.local_rope_proportion, local_timescale, factor),
                window: Some(c.sliding_window_size),
            },
            global: Attention {
                kv_heads: global_kv,
                head_dim: global_head,
                shared_kv: c.share_kv_projections,
                rope: frequencies(global_head, c.global_rope_proportion, global_timescale, factor),
                window: None,
            },
            post_attention_norm: c.use_post_attn_norm,
            post_ffw_norm: c.use_post_ffw_norm,
            head_eps: c.normalization_layer_epsilon,
            value_scale: c.v_norm_with_scale,
            soft_cap: mc.attn_logits_soft_cap,
            moe,
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
    fn attention(&self, j: i64) -> &Attention {
        match j {
            LOCAL => &self.global,
            _ => &self.local,
        }
    }

    /// One layer's parameters with attention `a`, named relative to the layer.
    pub(super) fn sub_layer_params(&self, c: &ModelConfig, a: &Attention) -> Vec<ParamDef> {
        let (e, h, kv, d) = (c.emb, c.heads, a.kv_heads, a.head_dim);
        let norm = Norm::Rms { eps: LAYER_NORM_EPS };
        let kernel = |name: &str, shape: &[i64], logical: &[&'static str], init: ParamInit| {
            let contract = if name == "out" { 2 } else { 1 };
            ParamDef::dense_kernel(&format!("self_attention.{name}.kernel"), shape, logical, init, contract)
        };
        let mut defs = norm.params("pre_self_attention_norm", e);
        let query = ParamInit::FanInOver { fan_in: e, depth_scaling: depth_scaling(d, c.dtype) };
        defs.push(kernel("query", &[e, h, d], &["embed", "heads", "kv"], query));
        defs.push(kernel("key", &[e, kv, d], &["embed", "kv_heads", "kv"], ParamInit::FanIn(e)));
        if !a.shared_kv {
            defs.push(kernel("value", &[e, kv, d], &["embed", "kv_heads", "kv"], ParamInit::FanIn(e)));
        }
        defs.push(kernel("out", &[h, d, e], &["heads", "kv", "embed"], ParamInit::FanIn(h * d)));
        let head_norms: &[&str] =
            if self.value_scale { &["query_norm", "key_norm", "value_norm"] } else { &["query_norm", "key_norm"] };
        for name in head_norms {
            defs.extend(norm.params(&format!("self_attention.{name}"), d));
        }
        if self.post_attention_norm {
            defs.extend(norm.params("post_self_attention_norm", e));
        }
        defs.extend(norm.params("pre_ffw_norm", e));
        match &self.moe {
            None => defs.extend(Mlp::new(c, false, None).params("mlp", e, c.mlp)),
            Some((m, width)) => {
                let routed = moe::param_defs(m, e, *width);
                let prefixed =
                    |def: ParamDef| ParamDef { name: format!("mlp.moe_block.MoeBlock_0.{}", def.name), ..def };
                defs.extend(routed.into_iter().map(prefixed));
                let shared = Mlp::new(c, false, None);
                defs.extend(shared.params("mlp.moe_block.shared_experts", e, m.shared_experts * c.mlp));
                defs.push(ParamDef::new("mlp.pre_forward_scale_2", &[e], &["embed"], ParamInit::Ones));
                for name in
                    ["pre_feedforward_layernorm_2", "post_feedforward_layernorm_1", "post_feedforward_layernorm_2"]
                {
                    defs.extend(norm.params(&format!("mlp.{name}"), e));
                }
            }
        }
        if self.post_ffw_norm {
            defs.extend(norm.params("post_ffw_norm", e));
        }
        defs.push(ParamDef::new("layer_scalar", &[1], &[""], ParamInit::Ones));
        defs
    }

    /// One layer (`Gemma4DecoderLayer.__call__`) on `x` with its parameters `p` (named relative to
    /// it), attention `a` with RoPE tables `rope`; returns the output and the MoE losses.
    fn sub_layer(
        &self,
        c: &ModelConfig,
        p: &Tree,
        x: &Tensor,
        ctx: &LayerContext,
        a: &Attention,
        rope: Rope,
    ) -> (Tensor, Tree) {
        let (x, _) = self.attention_block(c, p, x, ctx, a, rope, None);
        let (y, aux) = self.feed_forward(c, p, &x);
        (scaled(c, p, &y), aux)
    }

    /// The attention half of a layer on `x`: `x` plus its normed attention, and the keys and values
    /// it attended over (rotated and normed). With `reused` the layer attends over those keys and
    /// values instead of its own (Gemma 4 small's KV-shared layers: `Attention.__call__` with
    /// `shared_key` and `shared_value`, `src/maxtext/layers/attentions.py` at e591f30), so it has
    /// no key or value projections.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention_block(
        &self,
        c: &ModelConfig,
        p: &Tree,
        x: &Tensor,
        ctx: &LayerContext,
        a: &Attention,
        (cos, sin): Rope,
        reused: Option<&KeyValue>,
    ) -> (Tensor, KeyValue) {
        let norm = Norm::Rms { eps: LAYER_NORM_EPS };
        let head_norm = Norm::Rms { eps: self.head_eps };
        let h = norm.apply(p, "pre_self_attention_norm", x);
        let q = dense(c, p, "self_attention.query", &h, 1);
        let q = head_norm.apply(p, "self_attention.query_norm", &q);
        let q = rope_with(&q, cos, sin, false).checkpoint_name("query_proj");
        let (k, v) = match reused {
            Some(kv) => kv.clone(),
            None => {
                let k = dense(c, p, "self_attention.key", &h, 1);
                // `share_kv_projections`: the value is the key as projected (`Attention.__call__`).
                let v = if a.shared_kv { k.clone() } else { dense(c, p, "self_attention.value", &h, 1) };
                let k = head_norm.apply(p, "self_attention.key_norm", &k);
                let v = match self.value_scale {
                    true => head_norm.apply(p, "self_attention.value_norm", &v),
                    false => rms_unscaled(&v, self.head_eps),
                };
                let v = v.checkpoint_name("value_proj");
                (rope_with(&k, cos, sin, false).checkpoint_name("key_proj"), v)
            }
        };
        let options = AttendOptions { logits_soft_cap: self.soft_cap, float32_qk_product: false };
        let out = ctx.attend(&q, &k, &v, a.window, &options);
        let mut attention = dense(c, p, "self_attention.out", &out, 2).checkpoint_name("out_proj");
        if self.post_attention_norm {
            attention = norm.apply(p, "post_self_attention_norm", &attention);
        }
        (constrain(c, x + &attention, BTE), (k, v))
    }

    /// The feed-forward half of a layer on `x` (the attention half's output): `x` plus its normed
    /// MLP (or experts beside a shared MLP), and the MoE losses.
    pub(super) fn feed_forward(&self, c: &ModelConfig, p: &Tree, x: &Tensor) -> (Tensor, Tree) {
        let norm = Norm::Rms { eps: LAYER_NORM_EPS };
        let h = norm.apply(p, "pre_ffw_norm", x);
        let (mut mlp, aux) = match &self.moe {
            None => (Mlp::new(c, false, None).apply(c, p, "mlp", &h), Tree::new()),
            Some((m, _)) => {
                let shared = Mlp::new(c, false, None).apply(c, p, "mlp.moe_block.shared_experts", &h);
                let shared = norm.apply(p, "mlp.post_feedforward_layernorm_1", &shared);
                let routed_input = norm.apply(p, "mlp.pre_feedforward_layernorm_2", x);
                // The gate's input (`Gemma4MoE.__call__`): the residual stream normed without a
                // scale, times emb^-1/2 and the learned `pre_forward_scale_2`, in the gate's dtype.
                let wide = if c.dtype == DType::F64 { DType::F64 } else { DType::F32 };
                let gate_dtype = if m.float32_gate_logits { wide } else { c.dtype };
                let unscaled = rms_unscaled(x, self.head_eps).astype(gate_dtype);
                let gate_input =
                    (unscaled * (c.emb as f64).powf(-0.5)) * &p["mlp.pre_forward_scale_2"].astype(gate_dtype);
                let block =
                    moe::moe_block_gated(c, m, &p.subtree("mlp.moe_block.MoeBlock_0"), &routed_input, &gate_input);
                let aux = block.aux_losses(m);
                let routed = norm.apply(p, "mlp.post_feedforward_layernorm_2", &block.output);
                (routed + &shared, aux)
            }
        };
        if self.post_ffw_norm {
            mlp = norm.apply(p, "post_ffw_norm", &mlp);
        }
        (constrain(c, x + &constrain(c, mlp, BTE), BTE), aux)
    }
}

/// The RoPE tables `(cos, sin)` of a layer's attention (`rope_tables`).
pub(super) type Rope<'a> = (&'a Tensor, &'a Tensor);

/// A layer's keys and values as attention takes them, rotated and normed.
pub(super) type KeyValue = (Tensor, Tensor);

/// A layer's output `y` times its learned `layer_scalar` (`Gemma4DecoderLayer.__call__`).
pub(super) fn scaled(c: &ModelConfig, p: &Tree, y: &Tensor) -> Tensor {
    y * &p["layer_scalar"].astype(c.dtype)
}

/// An RMSNorm without a scale (MaxText's `RMSNorm(with_scale=False)`): statistics in f32 (f64 for
/// an f64 model), the result in `x`'s dtype.
fn rms_unscaled(x: &Tensor, eps: f64) -> Tensor {
    let dtype = x.dtype();
    let wide = if dtype == DType::F64 { x.clone() } else { x.astype(DType::F32) };
    let inv = (wide.square().mean_keepdims(&[-1]) + eps).rsqrt();
    (wide * &inv).astype(dtype)
}

/// The local layers' parameters stacked on MaxText's inner scan axis: `param_scan_axis` 1
/// (`nnx_scan.create_scanned_layers`, `src/maxtext/layers/nnx_scan.py` at e591f30), logical axis
/// `local_layers`. Not a `DenseGeneral` kernel of leading stacking axes any more.
fn stacked_locally(def: ParamDef) -> ParamDef {
    let at = def.shape.len().min(1);
    let (mut shape, mut logical) = (def.shape.clone(), def.logical.clone());
    shape.insert(at, LOCAL);
    logical.insert(at, "local_layers");
    ParamDef { name: format!("local_layers.{}", def.name), shape, logical, dense: None, ..def }
}

/// Local layer `j`'s parameters out of the block's stacked `local_layers.*` (axis 1).
fn local_slice(p: &Tree, j: i64) -> Tree {
    p.subtree("local_layers").map(|_, t| t.slice_axis(1, j, j + 1).squeeze(1))
}

impl Family for Gemma4 {
    /// Unscanned, each layer, MaxText's `Gemma4DecoderLayer` (`src/maxtext/models/gemma4.py` at
    /// e591f30), keeps its `rngs` (line 178) and has no `dropout`. Scanned, MaxText's tree is not
    /// this one's shape (`_init_scanned_gemma4`, `src/maxtext/layers/nnx_decoders.py:681` at e591f30):
    /// the local layers' streams are stacked over two axes, `[blocks, 5]` (the block's own scan of
    /// them inside the scan of blocks), and a `layers_remainder` block is built even when no layer
    /// is left over, holding the decoder's `Rngs` first; `rng_streams.rs` knows one stacking axis
    /// and the stacks' own layers, so a scanned train state does not convert (refused).
    fn layer_rngs(&self, c: &ModelConfig, _kind: usize) -> Option<LayerRngs> {
        (!c.scan_layers).then_some(LayerRngs { keeps: true, dropout: false })
    }

    /// Scanned: `layers / 6` blocks `scanned_blocks`; unscanned, every layer its own module
    /// `layers_<n>` (the whole blocks, then the remainder's).
    fn stacks(&self, c: &ModelConfig) -> Vec<Stack> {
        let blocks = c.layers / BLOCK;
        if c.scan_layers {
            return vec![Stack::new("scanned_blocks", blocks, WHOLE)];
        }
        let mut stacks = Vec::new();
        if blocks > 0 {
            stacks.push(Stack::new("layers", blocks, WHOLE).per_sub_layer(BLOCK, 0));
        }
        if self.remainder > 0 {
            stacks.push(Stack::single("layers_remainder", REMAINDER).per_sub_layer(self.remainder, blocks * BLOCK));
        }
        stacks
    }

    fn layer_params(&self, c: &ModelConfig, kind: usize) -> Vec<ParamDef> {
        if c.scan_layers {
            let mut defs: Vec<ParamDef> =
                self.sub_layer_params(c, &self.local).into_iter().map(stacked_locally).collect();
            let global = self.sub_layer_params(c, &self.global).into_iter();
            defs.extend(global.map(|def| ParamDef { name: format!("global_layer.{}", def.name), ..def }));
            return defs;
        }
        (0..self.layers(kind))
            .flat_map(|j| {
                let defs = self.sub_layer_params(c, self.attention(j)).into_iter();
                defs.map(move |def| ParamDef { name: format!("layers_{j}.{}", def.name), ..def })
            })
            .collect()
    }

    fn layer(&self, c: &ModelConfig, kind: usize, p: &Tree, x: &Tensor, ctx: &LayerContext) -> LayerOutput {
        // The tables are computed inside the layer (cheap, elementwise) rather than passed in:
        // they would be a full-size input of every remat region otherwise.
        let local = rope_tables(&ctx.positions, &self.local.rope);
        let global = rope_tables(&ctx.positions, &self.global.rope);
        let mut x = x.clone();
        let mut losses: Vec<Tree> = Vec::new();
        let n = self.layers(kind);
        for j in 0..n {
            let own = match (c.scan_layers, j) {
                (true, LOCAL) => p.subtree("global_layer"),
                (true, _) => local_slice(p, j),
                (false, _) => p.subtree(&format!("layers_{j}")),
            };
            let a = self.attention(j);
            let (cos, sin) = if j == LOCAL { &global } else { &local };
            let (y, aux) = self.sub_layer(c, &own, &x, ctx, a, (cos, sin));
            x = y;
            losses.push(aux);
        }
        // Each loss's mean over the block's layers.
        let mut aux_losses = Tree::new();
        for (loss, _) in losses[0].iter() {
            let sum = losses.iter().map(|l| l[loss].clone()).reduce(|a, b| a + b).expect("a block has layers");
            aux_losses.insert(loss, sum / n as f64);
        }
        LayerOutput { x, aux_losses }
    }

    /// MaxText's `calculate_gemma4_tflops_training_per_device` (`src/maxtext/utils/maxtext_utils.py`
    /// at e591f30): each layer's projections at its own heads and head size (one of key and value
    /// with shared projections), a global layer's causal attention `2 * batch * seq^2 * heads *
    /// global_head` and a local one's `4 * batch * (seq * w - w^2 / 2) * heads * head` with `w =
    /// min(window, seq)`; the FFN as `calculate_routed_and_shared_ffn_tflops_per_device` counts it
    /// with experts (router, `k` routed experts, the shared MLP), else the dense MLP.
    fn layer_flops(&self, c: &ModelConfig, kind: usize, tokens: f64, seq: f64) -> LayerFlops {
        let e = c.emb as f64;
        let matrices = c.mlp_activations.len() as f64 + 1.0;
        let ffn = match &self.moe {
            None => 2.0 * tokens * e * c.mlp as f64 * matrices,
            Some((m, width)) => {
                let router = 2.0 * tokens * e * m.num_experts as f64;
                let routed = 2.0 * tokens * e * *width as f64 * matrices * m.num_experts_per_tok as f64;
                router + routed + 2.0 * tokens * e * c.mlp as f64 * matrices * m.shared_experts as f64
            }
        };
        let (mut weights, mut attention) = (0.0, 0.0);
        for j in 0..self.layers(kind) {
            let a = self.attention(j);
            let layer = self.attention_flops(c, a, if a.shared_kv { 1.0 } else { 2.0 }, tokens, seq);
            weights += ffn + layer.weights;
            attention += layer.attention;
        }
        LayerFlops { weights, attention }
    }
}

impl Gemma4 {
    /// One layer's attention FLOPs with attention `a` as MaxText counts them
    /// (`calculate_gemma4_tflops_training_per_device`, and `calculate_gemma4_small_tflops_training_per_device`
    /// for Gemma 4 small, `src/maxtext/utils/maxtext_utils.py` at e591f30): the query and output
    /// projections and `kv_projections` of key and value at the layer's heads and head size; a
    /// global layer's causal attention `2 * batch * seq^2 * heads * head` and a local one's
    /// `4 * batch * (seq * w - w^2 / 2) * heads * head` with `w = min(window, seq)`.
    pub(super) fn attention_flops(
        &self,
        c: &ModelConfig,
        a: &Attention,
        kv_projections: f64,
        tokens: f64,
        seq: f64,
    ) -> LayerFlops {
        let (e, h, kv, d) = (c.emb as f64, c.heads as f64, a.kv_heads as f64, a.head_dim as f64);
        let weights = 2.0 * tokens * e * (h + kv_projections * kv) * d + 2.0 * tokens * e * h * d;
        let batch = tokens / seq;
        let attention = match a.window {
            Some(window) => {
                let w = (window as f64).min(seq);
                4.0 * batch * (seq * w - 0.5 * w * w) * h * d
            }
            None => 2.0 * batch * seq * seq * h * d,
        };
        LayerFlops { weights, attention }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Model;

    /// The partial RoPE by hand: a 16-wide head rotating a quarter keeps 2 frequencies
    /// `1e6^(-2i / 16)` and zeros the other 6 (`Gemma4PartialRotaryEmbedding`); a whole head is
    /// the default RoPE, timescales times the linear factor.
    #[test]
    fn partial_rope_frequencies() {
        let f = super::frequencies(16, 0.25, 1e6, 4.0);
        assert_eq!(f.len(), 8);
        assert_eq!(f[0], 1.0);
        assert!((f[1] - 1e6f64.powf(-2.0 / 16.0)).abs() < 1e-15);
        assert!(f[2..].iter().all(|&x| x == 0.0), "{f:?}");
        let f = super::frequencies(16, 1.0, 1e4, 4.0);
        assert!((f[3] - 1e4f64.powf(-6.0 / 16.0) / 4.0).abs() < 1e-15);
    }

    /// The model files' parameter counts by hand, and their names: gemma4-31b (60 layers, dense:
    /// 10 blocks) and gemma4-26b (30 layers, 128 experts: 5 blocks). Per local layer q, k, v, out
    /// at head 256 and the layer's kv heads, per global layer q, k (shared with v), out at head
    /// 512 and its kv heads; the MLP (GeGLU), or the experts (router, 128 x 3 x 704-wide, the
    /// per-expert scales), the shared MLP (3 x 2112-wide), the router scale and 3 more norms; 4
    /// norms of emb, the head norms (q, k), layer_scalar; the tied embedding and the final norm.
    #[test]
    fn model_files_load_with_maxtext_names() {
        let attention =
            |e: i64, h: i64, kv: i64, d: i64, shared: bool| e * d * (2 * h + if shared { kv } else { 2 * kv }) + 2 * d;
        let dense_mlp = |e: i64, m: i64| 3 * e * m;
        let (e, m) = (5376, 21504);
        let local = attention(e, 32, 16, 256, false) + dense_mlp(e, m) + 4 * e + 1;
        let global = attention(e, 32, 4, 512, true) + dense_mlp(e, m) + 4 * e + 1;
        let m31 = Model::from_args(&["model_name=gemma4-31b"]).unwrap();
        assert_eq!(m31.num_params() as i64, 10 * (5 * local + global) + 262144 * e + e);
        let (e, experts) = (2816, 128);
        let ffn = e * experts + experts * 3 * e * 704 + experts + dense_mlp(e, 2112) + e + 3 * e;
        let local = attention(e, 16, 8, 256, false) + ffn + 4 * e + 1;
        let global = attention(e, 16, 2, 512, true) + ffn + 4 * e + 1;
        let m26 = Model::from_args(&["model_name=gemma4-26b"]).unwrap();
        assert_eq!(m26.num_params() as i64, 5 * (5 * local + global) + 262144 * e + e);
        let shape =
            |m: &super::super::Model, n: &str| m.param_defs().into_iter().find(|d| d.name == n).map(|d| d.shape);
        let s = "decoder.scanned_blocks.";
        assert_eq!(
            shape(&m31, &format!("{s}local_layers.self_attention.query.kernel")),
            Some(vec![10, 5376, 5, 32, 256])
        );
        assert_eq!(shape(&m31, &format!("{s}local_layers.pre_ffw_norm.scale")), Some(vec![10, 5376, 5]));
        assert_eq!(shape(&m31, &format!("{s}global_layer.self_attention.key.kernel")), Some(vec![10, 5376, 4, 512]));
        assert_eq!(shape(&m31, &format!("{s}global_layer.self_attention.value.kernel")), None);
        assert_eq!(shape(&m31, &format!("{s}global_layer.layer_scalar")), Some(vec![10, 1]));
        let moe = format!("{s}global_layer.mlp.moe_block.MoeBlock_0.");
        assert_eq!(shape(&m26, &format!("{moe}per_expert_scale")), Some(vec![5, 128]));
        assert_eq!(shape(&m26, &format!("{moe}wi_0")), Some(vec![5, 128, 2816, 704]));
        let unscanned = Model::from_args(&["model_name=gemma4-26b", "scan_layers=false"]).unwrap();
        let n = "decoder.layers_29.mlp.moe_block.shared_experts.wo.kernel";
        assert_eq!(shape(&unscanned, n), Some(vec![2112, 2816]));
        assert_eq!(unscanned.num_params(), m26.num_params());
    }

    /// What each refusal names, on one line: a scanned count of layers that is not a multiple of
    /// 6, no window, another RoPE type, experts without their widths, LoRA.
    #[test]
    fn refusals_name_the_culprit() {
        let gemma4 = ["model_name=gemma4-26b", "override_model_config=true"];
        let refused = |extra: &[&str], want: &str| {
            let e = Model::from_args(&[&gemma4[..], extra].concat()).err().unwrap_or_default();
            assert!(e.contains(want) && !e.contains('\n'), "{extra:?}: {e}");
        };
        refused(&["base_num_decoder_layers=8"], "base_num_decoder_layers=8: with scan_layers=true");
        refused(&["sliding_window_size=0"], "sliding_window_size=0: gemma4's local layers");
        refused(&["rope_type=llama3.1"], "rope_type=llama3.1: gemma4's RoPE");
        refused(&["shared_experts=0"], "shared_experts=0: gemma4's MoE layer");
        refused(&["quantization=fp8"], "fp8 quantization is not supported yet with decoder_block=gemma4");
        let e = Model::from_args(&["decoder_block=gemma4", "sliding_window_size=4", "base_num_decoder_layers=6"])
            .err()
            .unwrap_or_default();
        assert!(e.starts_with("model_name=default: MaxText gives gemma4's partial RoPE"), "{e}");
        assert!(Model::from_args(&[&gemma4[..], &["base_num_decoder_layers=8", "scan_layers=false"]].concat()).is_ok());
    }
}
