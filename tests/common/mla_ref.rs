//! An independent f64 reference of DeepSeek-V3's dense decoder layer, written from Hugging Face's
//! `DeepseekV3Attention` and `DeepseekV3DecoderLayer` (transformers 5.23.0,
//! `models/deepseek_v3/modeling_deepseek_v3.py`), not from maxrs's code, on `[B*T, features]`
//! matrices (row = b*T + t) in maxrs's (MaxText's) stored layout:
//!
//! - queries `q_b_proj(RMSNorm(q_a_proj(h)))` (or `q_proj(h)`), per head `[nope | rope]`;
//! - `kv_a_proj_with_mqa(h)` = `[latent | k_rot]`; `kv_b_proj(RMSNorm(latent))` per head
//!   `[k_nope | value]`; `k_rot` one head shared by all;
//! - RoPE on the rope parts with the given inverse frequencies (Hugging Face's YaRN values,
//!   recorded by the test), in Hugging Face's interleaved form (`apply_rotary_pos_emb_interleave`:
//!   pairs `(x[2i], x[2i+1])` de-interleaved to halves, then `rotate_half`);
//! - causal softmax attention with `scaling`, the output projection, then a SwiGLU MLP, each
//!   behind an RMSNorm and a residual add.

use super::family_ref::{gated_mlp, rms_norm, silu, RefOut, RefParams, B, T};
use super::llama_ref::{cross_entropy, Batch};
use ndarray::{s, Array2};
use std::collections::BTreeMap;

/// The attention's sizes and numerics, stated by the test.
#[derive(Clone, Debug)]
pub struct MlaSpec {
    pub heads: usize,
    /// 0: one query projection.
    pub q_lora: usize,
    pub kv_lora: usize,
    pub nope: usize,
    pub rope: usize,
    pub v: usize,
    /// RoPE's inverse frequencies (`rope / 2` of them).
    pub inv_freq: Vec<f64>,
    /// Pairs `(x[2i], x[2i+1])` (`rope_interleave`); else halves.
    pub interleave: bool,
    /// The softmax scale (`DeepseekV3Attention.scaling`).
    pub scaling: f64,
    pub eps: f64,
}

/// RoPE of each `rope`-wide head of `x: [B*T, heads * rope]`, returned in Hugging Face's layout
/// (halves).
fn rope(s: &MlaSpec, x: &Array2<f64>, heads: usize, positions: &[usize]) -> Array2<f64> {
    let d = s.rope;
    let mut y = x.clone();
    for r in 0..B * T {
        for h in 0..heads {
            for (i, f) in s.inv_freq.iter().enumerate() {
                let (a, b) = if s.interleave { (2 * i, 2 * i + 1) } else { (i, i + d / 2) };
                let (xa, xb) = (x[[r, h * d + a]], x[[r, h * d + b]]);
                let angle = positions[r] as f64 * f;
                let (c, sn) = (angle.cos(), angle.sin());
                y[[r, h * d + i]] = xa * c - xb * sn;
                y[[r, h * d + i + d / 2]] = xb * c + xa * sn;
            }
        }
    }
    y
}

/// `DeepseekV3Attention` on the normed input `h`.
pub fn attention(s: &MlaSpec, l: &BTreeMap<String, Array2<f64>>, h: &Array2<f64>, positions: &[usize]) -> Array2<f64> {
    let w = |n: &str| &l[&format!("self_attention.{n}.kernel")];
    let (nh, qk) = (s.heads, s.nope + s.rope);
    let q = match s.q_lora {
        0 => h.dot(w("query")),
        _ => rms_norm(&h.dot(w("wq_a")), &l["self_attention.q_norm.scale"], s.eps).dot(w("wq_b")),
    };
    let compressed = h.dot(w("wkv_a"));
    let latent = rms_norm(&compressed.slice(s![.., ..s.kv_lora]).to_owned(), &l["self_attention.kv_norm.scale"], s.eps);
    let kv = latent.dot(w("wkv_b"));
    let k_rot = rope(s, &compressed.slice(s![.., s.kv_lora..]).to_owned(), 1, positions);
    let q_rot = {
        let mut parts = Array2::<f64>::zeros((B * T, nh * s.rope));
        for hh in 0..nh {
            parts
                .slice_mut(s![.., hh * s.rope..(hh + 1) * s.rope])
                .assign(&q.slice(s![.., hh * qk + s.nope..(hh + 1) * qk]));
        }
        rope(s, &parts, nh, positions)
    };
    let mut out = Array2::<f64>::zeros((B * T, nh * s.v));
    for b in 0..B {
        for hh in 0..nh {
            let kvw = s.nope + s.v;
            let query = |t: usize| {
                let r = b * T + t;
                let nope = q.slice(s![r, hh * qk..hh * qk + s.nope]).to_vec();
                [nope, q_rot.slice(s![r, hh * s.rope..(hh + 1) * s.rope]).to_vec()].concat()
            };
            let key = |u: usize| {
                let r = b * T + u;
                let nope = kv.slice(s![r, hh * kvw..hh * kvw + s.nope]).to_vec();
                [nope, k_rot.row(r).to_vec()].concat()
            };
            for t in 0..T {
                let qt = query(t);
                let scores: Vec<f64> =
                    (0..=t).map(|u| qt.iter().zip(key(u)).map(|(a, b)| a * b).sum::<f64>() * s.scaling).collect();
                let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let ex: Vec<f64> = scores.iter().map(|x| (x - mx).exp()).collect();
                let z: f64 = ex.iter().sum();
                for (u, e) in ex.iter().enumerate() {
                    let value = kv.slice(s![b * T + u, hh * kvw + s.nope..(hh + 1) * kvw]);
                    out.slice_mut(s![b * T + t, hh * s.v..(hh + 1) * s.v]).scaled_add(e / z, &value);
                }
            }
        }
    }
    out.dot(w("out"))
}

/// The whole model: embedding, dense DeepSeek layers, final RMSNorm, logits, loss.
pub fn reference(s: &MlaSpec, p: &RefParams, b: &Batch) -> RefOut {
    let table = &p.top["token_embedder.embedding"];
    let mut x = Array2::<f64>::zeros((B * T, table.ncols()));
    for (r, &tok) in b.tokens.iter().enumerate() {
        x.row_mut(r).assign(&table.row(tok as usize));
    }
    let positions: Vec<usize> = (0..B * T).map(|r| r % T).collect();
    let embeddings = x.clone();
    let mut layers = Vec::new();
    for l in &p.layers {
        let norm = |name: &str, x: &Array2<f64>| rms_norm(x, &l[&format!("{name}.scale")], s.eps);
        let x1 = &x + &attention(s, l, &norm("pre_self_attention_layer_norm", &x), &positions);
        x = &x1 + &gated_mlp(l, "mlp", &norm("post_self_attention_layer_norm", &x1), silu);
        layers.push(x.clone());
    }
    let y = rms_norm(&x, &p.top["decoder.decoder_norm.scale"], s.eps);
    let logits = y.dot(&p.top["decoder.logits_dense.kernel"]);
    let loss = cross_entropy(&logits, &b.targets, &b.seg, 0.0);
    RefOut { embeddings, layers, logits, loss }
}
