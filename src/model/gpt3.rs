//! The GPT-3 decoder layer (MaxText's `decoder_block: gpt3`, `Gpt3DecoderLayer` in
//! `src/maxtext/models/gpt3.py`, e591f30), top to bottom: its parameters, attention, the layer,
//! its FLOPs. GPT-3 is a pre-LayerNorm decoder with biases on every projection, multi-head
//! attention without RoPE (positions come from the learned `decoder.position_embedder` of the
//! shared decoder, `trainable_position_size`), query, key and value from one fused projection
//! (`fused_qkv`, as the GPT-3 model files set it), a GELU MLP (`mlp_activations: [gelu]`) with its
//! own LayerNorm, and tied logits. Its LayerNorms are MaxText's `Gpt3LayerNorm`: statistics in
//! the activations' dtype, `(x - mean) / sqrt(var + eps) * (scale + 1) + bias` with `scale` and
//! `bias` starting at zeros; the decoder's final norm is one too.
//!
//! One layer's parameters (stacked on a leading `layers` axis by the decoder):
//!
//! | name | shape | logical axes | init |
//! |---|---|---|---|
//! | `pre_self_attention_norm.scale`, `.bias` | [emb] | norm | zeros |
//! | `self_attention.qkv_proj.kernel` (`fused_qkv`) | [emb, 3, heads, head_dim] | embed, qkv, heads, kv | fan_in normal |
//! | `self_attention.qkv_proj.bias` (`fused_qkv`) | [3, heads, head_dim] | qkv, heads, kv | zeros |
//! | `self_attention.{query,key,value}.kernel` (otherwise) | [emb, heads, head_dim] | embed, heads, kv | fan_in normal |
//! | `self_attention.{query,key,value}.bias` (otherwise) | [heads, head_dim] | heads, kv | zeros |
//! | `self_attention.out.kernel` | [heads, head_dim, emb] | heads, kv, embed | fan_in normal |
//! | `self_attention.out.bias` | [emb] | embed | zeros |
//! | `mlp.mlp_layer_norm.scale`, `.bias` | [emb] | norm | zeros |
//! | `mlp.wi.kernel` | [emb, mlp] | embed, mlp | fan_in |
//! | `mlp.wi.bias` | [mlp] | mlp | zeros |
//! | `mlp.wo.kernel` | [mlp, emb] | mlp, embed | fan_in |
//! | `mlp.wo.bias` | [emb] | embed | zeros |
//!
//! "fan_in normal" is MaxText's GPT-3 attention initializer, `variance_scaling(1.0, "fan_in",
//! "normal")` (untruncated); the MLP's kernels use the truncated one of every other family. The
//! queries are divided by `sqrt(head_dim)` at run time, as MaxText's GPT-3 attention does too.

use crate::config::{self, Config};
use crate::tensor::{Tensor, Tree};

use super::attention::{AttendOptions, LayerContext};
use super::blocks::{dense, Mlp, Norm};
use super::family::LayerRngs;
use super::family::{constrain, dense_layer_flops, Family, LayerFlops, LayerOutput, BTE};
use super::params::{ParamDef, ParamInit};
use super::ModelConfig;

/// The GPT-3 layer.
#[derive(Debug)]
pub struct Gpt3 {
    pub fused_qkv: bool,
}

impl Gpt3 {
    pub fn from_config(c: &Config, mc: &ModelConfig) -> anyhow::Result<Gpt3> {
        if mc.heads != mc.kv_heads {
            return Err(anyhow::anyhow!(
                "base_num_kv_heads={}: gpt3's attention is multi-head, so it must equal base_num_query_heads={} (MaxText asserts the same)",
                c.base_num_kv_heads, c.base_num_query_heads
            ));
        }
        for key in ["rope_max_timescale", "rope_type"] {
            if let Some(value) = config::non_default_value(c, key) {
                return Err(anyhow::anyhow!(
                    "{key}={value}: gpt3 has no RoPE (its positions are learned embeddings, trainable_position_size)"
                ));
            }
        }
        Ok(Gpt3 { fused_qkv: c.fused_qkv })
    }

    fn norm(c: &ModelConfig) -> Norm {
        Norm::Gpt3LayerNorm { eps: c.eps }
    }

    fn mlp(c: &ModelConfig) -> Mlp {
        Mlp::new(c, true, Some(Gpt3::norm(c)))
    }
}

impl Family for Gpt3 {
    /// MaxText's `Gpt3DecoderLayer` (`src/maxtext/models/gpt3.py` at e591f30) keeps its `rngs` (line 406) and has a
    /// `dropout` (line 460).
    fn layer_rngs(&self, _c: &ModelConfig, _kind: usize) -> Option<LayerRngs> {
        Some(LayerRngs { keeps: true, dropout: true })
    }

    fn layer_params(&self, c: &ModelConfig, _kind: usize) -> Vec<ParamDef> {
        let (e, h, d) = (c.emb, c.heads, c.head_dim);
        let mut defs = Gpt3::norm(c).params("pre_self_attention_norm", e);
        let mut dense = |name: &str, kernel: &[i64], logical: &[&'static str], bias_dims: usize, fan_in: i64| {
            let kernel_name = format!("self_attention.{name}.kernel");
            let contract = kernel.len() - bias_dims;
            let init = ParamInit::FanInNormal(fan_in);
            defs.push(ParamDef::dense_kernel(&kernel_name, kernel, logical, init, contract));
            let (shape, axes) = (&kernel[kernel.len() - bias_dims..], &logical[logical.len() - bias_dims..]);
            defs.push(ParamDef::new(&format!("self_attention.{name}.bias"), shape, axes, ParamInit::Zeros));
        };
        if self.fused_qkv {
            dense("qkv_proj", &[e, 3, h, d], &["embed", "qkv", "heads", "kv"], 3, e);
        } else {
            for name in ["query", "key", "value"] {
                dense(name, &[e, h, d], &["embed", "heads", "kv"], 2, e);
            }
        }
        dense("out", &[h, d, e], &["heads", "kv", "embed"], 1, h * d);
        defs.extend(Gpt3::mlp(c).params("mlp", e, c.mlp));
        defs
    }

    /// `x + attention(norm(x))`, then `+ mlp(.)` (the MLP block norms its input itself).
    fn layer(&self, c: &ModelConfig, _kind: usize, p: &Tree, x: &Tensor, ctx: &LayerContext) -> LayerOutput {
        let h = Gpt3::norm(c).apply(p, "pre_self_attention_norm", x);
        let x = constrain(c, x + &self.attention(c, p, &h, ctx), BTE);
        LayerOutput::new(constrain(c, &x + &Gpt3::mlp(c).apply(c, p, "mlp", &x), BTE))
    }

    fn layer_flops(&self, c: &ModelConfig, _kind: usize, tokens: f64, seq: f64) -> LayerFlops {
        dense_layer_flops(c, tokens, seq)
    }

    fn final_norm(&self, c: &ModelConfig) -> Norm {
        Gpt3::norm(c)
    }
}

impl Gpt3 {
    /// Causal multi-head attention (no RoPE) on the normed input `h: [batch, seq, emb]`.
    fn attention(&self, c: &ModelConfig, p: &Tree, h: &Tensor, ctx: &LayerContext) -> Tensor {
        let bias = |name: &str| p[format!("self_attention.{name}.bias").as_str()].astype(c.dtype);
        // MaxText's DenseGeneral products (`btd,dnhk->btnhk`, `btd,dhk->bthk`, `bthk,hkd->btd`).
        let project =
            |name: &str, x: &Tensor, axes: usize| dense(c, p, &format!("self_attention.{name}"), x, axes) + &bias(name);
        let (q, k, v) = if self.fused_qkv {
            let qkv = project("qkv_proj", h, 1).checkpoint_name("qkv_proj");
            let (b, t, heads, d) = (qkv.shape()[0], qkv.shape()[1], qkv.shape()[3], qkv.shape()[4]);
            let part = |i: i64| qkv.slice_axis(2, i, i + 1).reshape(&[b, t, heads, d]);
            (part(0), part(1), part(2))
        } else {
            (project("query", h, 1), project("key", h, 1), project("value", h, 1))
        };
        let q = (q * (1.0 / (c.head_dim as f64).sqrt())).checkpoint_name("query_proj");
        let (k, v) = (k.checkpoint_name("key_proj"), v.checkpoint_name("value_proj"));
        let out = ctx.attend(&q, &k, &v, None, &AttendOptions::default());
        project("out", &out, 2).checkpoint_name("out_proj")
    }
}
