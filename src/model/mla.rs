//! MaxText's multi-head latent attention (`attention_type: mla`, class `MLA` in
//! `src/maxtext/layers/attention_mla.py`, main at e591f30), DeepSeek-V2/V3's attention, and the
//! YaRN RoPE it uses (`YarnRotaryEmbedding` in `src/maxtext/layers/embeddings.py`, e591f30).
//!
//! Queries and keys have `qk_nope_head_dim + qk_rope_head_dim` dimensions per head; RoPE rotates
//! only the last `qk_rope_head_dim` of them. The queries come from the input directly (`query`,
//! `q_lora_rank: 0`) or through a low-rank latent (`wq_a`, RMSNorm `q_norm`, `wq_b`). Keys and
//! values share one latent per token: `wkv_a` projects the input to `kv_lora_rank` latent
//! dimensions (RMSNorm `kv_norm`) plus `qk_rope_head_dim` dimensions that, rotated, are every
//! head's RoPE key part (`k_rope`); `wkv_b` expands the latent to each head's key part without
//! RoPE and its value (`v_head_dim`). The queries are multiplied by the softmax scale
//! `(qk_nope_head_dim + qk_rope_head_dim)^-0.5`, times `(0.1 mscale ln(rope_factor) + 1)^2` when
//! `max_position_embeddings > original_max_position_embeddings`, as MaxText does.
//!
//! Parameters, under the layer's `self_attention.` (MaxText's names; its kernel initializer for
//! MLA is `variance_scaling(1.0, "fan_in", "normal")`):
//!
//! | name | shape | logical axes |
//! |---|---|---|
//! | `query.kernel` (`q_lora_rank: 0`) | [emb, heads, qk_nope + qk_rope] | embed, q_heads, kv |
//! | `wq_a.kernel` | [emb, q_lora_rank] | embed, q_lora_up_proj |
//! | `q_norm.scale` | [q_lora_rank] | norm |
//! | `wq_b.kernel` | [q_lora_rank, heads, qk_nope + qk_rope] | q_lora, q_heads, kv |
//! | `wkv_a.kernel` | [emb, kv_lora_rank + qk_rope] | embed, kv_lora_up_proj |
//! | `kv_norm.scale` | [kv_lora_rank] | norm |
//! | `wkv_b.kernel` | [kv_lora_rank, heads, qk_nope + v_head_dim] | kv_lora, kv_heads, kv_head_dim |
//! | `out.kernel` | [heads, v_head_dim, emb] | heads, kv, embed |
//!
//! RoPE's layout: MaxText's YaRN takes interleaved pairs (`rope_interleave`) and returns the
//! rotated halves concatenated; maxrs's rotation keeps the pairs interleaved. Queries and keys
//! are laid out alike, so the scores (and everything observable) are the same.

use crate::config::{Config, RopeType};
use crate::tensor::{concatenate, Tensor, Tree};

use super::attention::{default_frequencies, rope_scaled, rope_tables, rope_with, AttendOptions, LayerContext};
use super::blocks::{dense, Norm};
use super::family::LayerFlops;
use super::kernel::AttentionImpl;
use super::params::{ParamDef, ParamInit};
use super::ModelConfig;

/// MaxText's MLA block.
#[derive(Clone, Debug, PartialEq)]
pub struct Mla {
    /// 0: queries projected directly (`query`).
    pub q_lora_rank: i64,
    pub kv_lora_rank: i64,
    pub qk_nope_head_dim: i64,
    pub qk_rope_head_dim: i64,
    pub v_head_dim: i64,
    /// What the queries are multiplied by.
    pub softmax_scale: f64,
    pub rope: MlaRope,
    /// Decoding caches the normed latent and the rotated RoPE key (`mla_naive_kvcache=false`,
    /// MaxText's `MlaKVCache`) instead of every head's keys and values.
    pub latent_cache: bool,
}

/// RoPE on the `qk_rope_head_dim` dimensions.
#[derive(Clone, Debug, PartialEq)]
pub struct MlaRope {
    /// The angle per position of each pair.
    pub frequencies: Vec<f64>,
    /// Pairs `(x[2i], x[2i+1])` (YaRN's `rope_interleave`); else the two halves.
    pub interleaved: bool,
    /// YaRN's `rope_attention_scaling`: the rotated values are multiplied by this.
    pub scale: Option<f64>,
}

impl Mla {
    /// The block `c` describes (keys checked by `config::validate`).
    pub fn from_config(c: &Config) -> Mla {
        let mut softmax_scale = (c.qk_head_dim() as f64).powf(-0.5);
        if c.max_position_embeddings > c.original_max_position_embeddings {
            let m = 0.1 * c.mscale * c.rope_factor.ln() + 1.0;
            softmax_scale *= m * m;
        }
        let dim = c.qk_rope_head_dim;
        let theta = c.rope_max_timescale as f64;
        let rope = match c.rope_type {
            RopeType::Yarn => MlaRope {
                frequencies: yarn_frequencies(&Yarn::from_config(c, dim)),
                interleaved: c.rope_interleave,
                scale: Yarn::attention_scale(c),
            },
            // MaxText's `RotaryEmbedding` over `qk_rope_head_dim` dimensions (validation refuses
            // llama3.1 for MLA).
            RopeType::Default | RopeType::Llama31 => {
                MlaRope { frequencies: default_frequencies(dim, theta, 1.0), interleaved: false, scale: None }
            }
        };
        Mla {
            q_lora_rank: c.q_lora_rank,
            kv_lora_rank: c.kv_lora_rank,
            qk_nope_head_dim: c.qk_nope_head_dim,
            qk_rope_head_dim: c.qk_rope_head_dim,
            v_head_dim: c.v_head_dim,
            softmax_scale,
            rope,
            latent_cache: !c.mla_naive_kvcache,
        }
    }

    fn qk_head_dim(&self) -> i64 {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// The block's parameters under `prefix` (e.g. `self_attention`).
    pub fn params(&self, prefix: &str, c: &ModelConfig) -> Vec<ParamDef> {
        let (e, h, qk) = (c.emb, c.heads, self.qk_head_dim());
        // Every kernel but `out` contracts its first dimension only (its fan-in).
        let kernel = |name: &str, shape: &[i64], logical: &[&'static str]| {
            let init = ParamInit::FanInNormal(shape[0]);
            ParamDef::dense_kernel(&format!("{prefix}.{name}.kernel"), shape, logical, init, 1)
        };
        let norm = |name: &str, n: i64| Norm::Rms { eps: c.eps }.params(&format!("{prefix}.{name}"), n);
        let mut defs = Vec::new();
        if self.q_lora_rank == 0 {
            defs.push(kernel("query", &[e, h, qk], &["embed", "q_heads", "kv"]));
        } else {
            let r = self.q_lora_rank;
            defs.push(kernel("wq_a", &[e, r], &["embed", "q_lora_up_proj"]));
            defs.extend(norm("q_norm", r));
            defs.push(kernel("wq_b", &[r, h, qk], &["q_lora", "q_heads", "kv"]));
        }
        let r = self.kv_lora_rank;
        defs.push(kernel("wkv_a", &[e, r + self.qk_rope_head_dim], &["embed", "kv_lora_up_proj"]));
        defs.extend(norm("kv_norm", r));
        defs.push(kernel(
            "wkv_b",
            &[r, h, self.qk_nope_head_dim + self.v_head_dim],
            &["kv_lora", "kv_heads", "kv_head_dim"],
        ));
        defs.push(ParamDef::dense_kernel(
            &format!("{prefix}.out.kernel"),
            &[h, self.v_head_dim, e],
            &["heads", "kv", "embed"],
            ParamInit::FanInNormal(h * self.v_head_dim),
            2,
        ));
        defs
    }

    /// The block on the normed input `h: [batch, seq, emb]`; returns `[batch, seq, emb]`.
    pub fn apply(&self, c: &ModelConfig, p: &Tree, prefix: &str, h: &Tensor, ctx: &LayerContext) -> Tensor {
        // DenseGeneral over the last `axes` dims of `x`: one for every projection here (`btd,dhk->
        // bthk`, `btd,dr->btr`, `btr,rhk->bthk`), two for the output's (`bthk,hkd->btd`).
        let project = |name: &str, x: &Tensor, axes: usize| dense(c, p, &format!("{prefix}.{name}"), x, axes);
        let norm = |name: &str, x: &Tensor| Norm::Rms { eps: c.eps }.apply(p, &format!("{prefix}.{name}"), x);
        let (cos, sin) = rope_tables(&ctx.positions, &self.rope.frequencies);
        let rope = |x: &Tensor| match self.rope.scale {
            Some(scale) => rope_scaled(x, &cos, &sin, self.rope.interleaved, scale),
            None => rope_with(x, &cos, &sin, self.rope.interleaved),
        };
        let (nope, qk) = (self.qk_nope_head_dim, self.qk_head_dim());

        // Queries, MaxText's `mla_query_projection`: the checkpoint names are its.
        let q = if self.q_lora_rank == 0 {
            project("query", h, 1)
        } else {
            let latent = project("wq_a", h, 1).checkpoint_name("query_wa_proj");
            let latent = norm("q_norm", &latent).checkpoint_name("mla_q");
            project("wq_b", &latent, 1)
        };
        let q = concatenate(&[&q.slice_axis(3, 0, nope), &rope(&q.slice_axis(3, nope, qk))], 3);
        let q = (q * self.softmax_scale).checkpoint_name("query_proj");

        // Keys and values, MaxText's `mla_kv_projection`.
        let low_rank = project("wkv_a", h, 1).checkpoint_name("kv_wa_proj");
        let (b, t) = (h.shape()[0], h.shape()[1]);
        let latent = norm("kv_norm", &low_rank.slice_axis(2, 0, self.kv_lora_rank)).checkpoint_name("mla_kv");
        let k_rope =
            rope(&low_rank.slice_axis(2, self.kv_lora_rank, self.kv_lora_rank + self.qk_rope_head_dim).reshape(&[
                b,
                t,
                1,
                self.qk_rope_head_dim,
            ]));
        let out = if self.latent_cache {
            let latent = latent.reshape(&[b, t, 1, self.kv_lora_rank]);
            let expand = |latent: &Tensor, k_rope: &Tensor| {
                let s = latent.shape();
                let (k, v) = self.keys_values(c, p, prefix, &latent.reshape(&[s[0], s[1], s[3]]), k_rope);
                (k.checkpoint_name("key_proj"), self.padded(c, &v).checkpoint_name("value_proj"))
            };
            ctx.attend_latent(&q, [&latent, &k_rope], expand)
        } else {
            let (k, v) = self.keys_values(c, p, prefix, &latent, &k_rope);
            let (k, v) = (k.checkpoint_name("key_proj"), self.padded(c, &v).checkpoint_name("value_proj"));
            ctx.attend(&q, &k, &v, None, &AttendOptions::default())
        };
        // The values' padding (`padded`) sliced off.
        let out = out.slice_axis(3, 0, self.v_head_dim);
        project("out", &out, 2).checkpoint_name("out_proj")
    }

    /// Every head's keys and values, `[batch, len, heads, qk_head_dim]` and `[batch, len, heads,
    /// v_head_dim]`, from the normed latent `[batch, len, kv_lora_rank]` and the rotated shared
    /// RoPE key `[batch, len, 1, qk_rope_head_dim]` (MaxText's `mla_get_key_value`).
    fn keys_values(
        &self,
        c: &ModelConfig,
        p: &Tree,
        prefix: &str,
        latent: &Tensor,
        k_rope: &Tensor,
    ) -> (Tensor, Tensor) {
        // `btr,rhk->bthk`: every head's key part and value from the latent.
        let kv = dense(c, p, &format!("{prefix}.wkv_b"), latent, 1);
        let nope = self.qk_nope_head_dim;
        let (k_nope, v) = (kv.slice_axis(3, 0, nope), kv.slice_axis(3, nope, nope + self.v_head_dim));
        let s = k_nope.shape();
        let k_rope = k_rope.broadcast_in_dim(&[s[0], s[1], s[2], self.qk_rope_head_dim], &[0, 1, 2, 3]);
        (concatenate(&[&k_nope, &k_rope.astype(k_nope.dtype())], 3), v)
    }

    /// `v` padded with zeros to the keys' head dimension where attention takes one head
    /// dimension (blockwise attention, cuDNN's); the zero dimensions add nothing to the output,
    /// which `apply` slices back. Dot-product attention takes `v` as it is.
    fn padded(&self, c: &ModelConfig, v: &Tensor) -> Tensor {
        let (qk, dv) = (self.qk_head_dim(), self.v_head_dim);
        if c.attention == AttentionImpl::DotProduct || qk == dv {
            return v.clone();
        }
        v.pad(0.0, &[0, 0, 0, 0], &[0, 0, 0, qk - dv], &[0, 0, 0, 0])
    }

    /// MaxText's `calculate_mla_tflops_per_device` (`src/maxtext/utils/maxtext_utils.py`,
    /// e591f30) for `tokens` tokens in sequences of `seq`: the projections, and attention's
    /// products counted causally.
    pub fn flops(&self, c: &ModelConfig, tokens: f64, seq: f64) -> LayerFlops {
        let [e, h, qk, v] = [c.emb, c.heads, self.qk_head_dim(), self.v_head_dim].map(|x| x as f64);
        let [q_lora, kv_lora, nope, rope] =
            [self.q_lora_rank, self.kv_lora_rank, self.qk_nope_head_dim, self.qk_rope_head_dim].map(|x| x as f64);
        let q = match self.q_lora_rank {
            0 => 2.0 * tokens * e * h * qk,
            _ => 2.0 * tokens * (e * q_lora + q_lora * h * qk),
        };
        let kv = 2.0 * tokens * (e * (kv_lora + rope) + kv_lora * h * (nope + v));
        let out = 2.0 * tokens * e * h * v;
        LayerFlops { weights: q + kv + out, attention: 2.0 * tokens * seq * h * (qk + v) / 2.0 }
    }
}

/// YaRN's inputs (MaxText's `YarnRotaryEmbedding` arguments).
#[derive(Clone, Copy, Debug)]
pub struct Yarn {
    /// The rotated dimensions (`qk_rope_head_dim`).
    pub dim: i64,
    /// `rope_max_timescale`.
    pub theta: f64,
    pub factor: f64,
    pub beta_fast: f64,
    pub beta_slow: f64,
    pub original_max_position_embeddings: i64,
    pub truncate: bool,
}

impl Yarn {
    /// The YaRN keys of `c` (`rope_max_timescale`, `rope_factor`, `beta_fast`, `beta_slow`,
    /// `original_max_position_embeddings`, `rope_truncate`) over `dim` rotated dimensions.
    pub fn from_config(c: &Config, dim: i64) -> Yarn {
        Yarn {
            dim,
            theta: c.rope_max_timescale as f64,
            factor: c.rope_factor,
            beta_fast: c.beta_fast,
            beta_slow: c.beta_slow,
            original_max_position_embeddings: c.original_max_position_embeddings,
            truncate: c.rope_truncate,
        }
    }

    /// `rope_attention_scaling`'s factor on the rotated values, `0.1 ln(rope_factor) + 1` (none
    /// without it, or at a factor of 1 or less).
    pub fn attention_scale(c: &Config) -> Option<f64> {
        (c.rope_attention_scaling && c.rope_factor > 1.0).then(|| 0.1 * c.rope_factor.ln() + 1.0)
    }
}

/// RoPE of a family whose model files choose YaRN for every layer (OLMo 3, gpt-oss): its
/// frequencies, whether their halves interleave, and YaRN's attention scale. `default` RoPE is
/// taken too; Llama 3.1's is refused for `family` (`decoder_block`).
pub fn yarn_or_default_rope(c: &Config, family: &str) -> anyhow::Result<(Vec<f64>, bool, Option<f64>)> {
    match c.rope_type {
        RopeType::Yarn => {
            // MaxText's YaRN reads its table at each position (`freqs_cis`, max_position_embeddings rows).
            anyhow::ensure!(
                c.max_target_length <= c.max_position_embeddings,
                "max_target_length={}: {family}'s YaRN RoPE covers positions below max_position_embeddings={}; \
                 shorten the sequence or raise max_position_embeddings",
                c.max_target_length,
                c.max_position_embeddings
            );
            Ok((yarn_frequencies(&Yarn::from_config(c, c.head_dim)), c.rope_interleave, Yarn::attention_scale(c)))
        }
        RopeType::Default => {
            let theta = c.rope_max_timescale as f64;
            Ok((default_frequencies(c.head_dim, theta, c.rope_linear_scaling_factor), false, None))
        }
        RopeType::Llama31 => anyhow::bail!(
            "rope_type=llama3.1 is not supported yet with decoder_block={family}; use yarn (as its model files do) or default"
        ),
    }
}

/// YaRN's frequencies (`YarnRotaryEmbedding.freqs_cis`, MaxText e591f30, after DeepSeek-V3's
/// `precompute_freqs_cis`): the base frequencies `theta^(-2i / dim)`, divided by `factor` below
/// the correction range (slow rotations), kept above it, blended linearly inside it. The range
/// is where a frequency makes `beta_fast` down to `beta_slow` rotations over the original
/// context, rounded outwards with `truncate` and clamped to `[0, dim - 1]`.
pub fn yarn_frequencies(y: &Yarn) -> Vec<f64> {
    let half = y.dim / 2;
    let correction_dim = |rotations: f64| {
        y.dim as f64 * (y.original_max_position_embeddings as f64 / (rotations * 2.0 * std::f64::consts::PI)).ln()
            / (2.0 * y.theta.ln())
    };
    let (mut low, mut high) = (correction_dim(y.beta_fast), correction_dim(y.beta_slow));
    if y.truncate {
        (low, high) = (low.floor(), high.ceil());
    }
    let (low, mut high) = (low.max(0.0), high.min(y.dim as f64 - 1.0));
    if low == high {
        high += 0.001;
    }
    (0..half)
        .map(|i| {
            let base = y.theta.powf(-2.0 * i as f64 / y.dim as f64);
            let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
            let smooth = 1.0 - ramp;
            base / y.factor * (1.0 - smooth) + base * smooth
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hugging Face's YaRN (`ROPE_INIT_FUNCTIONS["yarn"]` in transformers 5.23.0's
    /// `modeling_rope_utils.py`, f32) for DeepSeek-V3's settings (qk_rope_head_dim 64, theta
    /// 10000, factor 40, original context 4096, beta_fast 32, beta_slow 1), recorded with
    /// `DeepseekV3Config(qk_rope_head_dim=64, rope_theta=10000.0, rope_scaling={"rope_type":
    /// "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "beta_fast": 32,
    /// "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0})`, and for the tiny one of
    /// `tests/deepseek.rs` (dim 8, theta 100, factor 4, original context 64, beta_fast 4).
    #[test]
    fn yarn_frequencies_match_hugging_face() {
        let v3 = Yarn {
            dim: 64,
            theta: 10000.0,
            factor: 40.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            original_max_position_embeddings: 4096,
            truncate: true,
        };
        let hf_v3 = [
            1.0,
            0.7498942017555237,
            0.5623413324356079,
            0.4216965138912201,
            0.3162277638912201,
            0.23713736236095428,
            0.17782793939113617,
            0.1333521455526352,
            0.10000000149011612,
            0.07498941570520401,
            0.05623412877321243,
            0.039006926119327545,
            0.026879360899329185,
            0.01837814413011074,
            0.012447956018149853,
            0.0083345090970397,
            0.005500000435858965,
            0.0035619973205029964,
            0.002249365206807852,
            0.0013705134624615312,
            0.0007905694073997438,
            0.0004149904125370085,
            0.00017782794020604342,
            3.333803397254087e-05,
            2.499999936844688e-05,
            1.8747354260995053e-05,
            1.4058532542549074e-05,
            1.0542412383074407e-05,
            7.905694474175107e-06,
            5.928434347879374e-06,
            4.445698323252145e-06,
            3.3338035336782923e-06,
        ];
        let tiny =
            Yarn { dim: 8, theta: 100.0, factor: 4.0, beta_fast: 4.0, original_max_position_embeddings: 64, ..v3 };
        let hf_tiny = [1.0, 0.23717081546783447, 0.04999999701976776, 0.007905694656074047];
        for (yarn, hf) in [(v3, &hf_v3[..]), (tiny, &hf_tiny[..])] {
            let ours = yarn_frequencies(&yarn);
            assert_eq!(ours.len(), hf.len());
            for (i, (a, b)) in ours.iter().zip(hf).enumerate() {
                assert!((a - b).abs() <= 1e-6 * b, "{yarn:?}: frequency {i}: {a} vs Hugging Face's {b}");
            }
        }
    }
}
