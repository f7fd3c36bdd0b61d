//! An independent f64 reference of the decoder families, written with ndarray on `[B*T, features]`
//! matrices (row = b*T + t) from each model's own published formulation, not from maxrs's code:
//!
//! - Llama 2 / Mistral: pre-RMSNorm, grouped-query attention with half-split RoPE, SwiGLU;
//!   Mistral's sliding window `t - w < s <= t`; the queries' `head_dim^-1/2` folded into the stored
//!   query kernel (MaxText's `Attention.init_query_w`, `layers/attentions.py` at e591f30), so the
//!   queries are used as projected (Gemma and Gemma 2 too; Qwen3 scales them, `Spec::query_scaled`);
//! - Llama 3.1: Meta's `apply_scaling` of the RoPE frequencies, rotations of interleaved pairs
//!   (Meta's complex-number form);
//! - Gemma: embeddings times `sqrt(emb)`, RMSNorms times `(1 + scale)`, GeGLU with the tanh GELU,
//!   tied logits `y @ E^T`;
//! - Gemma 2: Gemma's layer twice per stacked layer (local with a window, then global), attention
//!   scores `cap * tanh(s / cap)`, post-attention and post-FFN norms, final logits soft-capped;
//! - Gemma 3 (Hugging Face's `Gemma3DecoderLayer` / `Gemma3Attention`, transformers'
//!   `models/gemma3/modeling_gemma3.py`): Gemma 2's layer with `(1 + w)` RMSNorms of the queries
//!   and keys over head_dim before RoPE, queries scaled by `query_pre_attn_scalar^-1/2`, every 6th
//!   layer global (RoPE base `rope_theta`, frequencies divided by the linear scaling factor), the
//!   others sliding-window (RoPE base `rope_local_base_freq`); no soft caps;
//! - OLMo 3 (Hugging Face's `Olmo3DecoderLayer` / `Olmo3Attention`, transformers'
//!   `models/olmo3/modeling_olmo3.py`): post-norm layers `x + norm(attn(x))`, `+ norm(mlp(.))`,
//!   RMSNorms `q_norm`, `k_norm` over all heads' queries and keys at once before RoPE, queries
//!   scaled by `head_dim^-1/2`, every 4th layer global and the others sliding-window; YaRN RoPE
//!   (transformers' `_compute_yarn_parameters`) in every layer, as MaxText's `olmo3.py` applies it;
//! - gpt-oss (Hugging Face's `GptOssDecoderLayer`, `GptOssAttention`, `GptOssMLP`, transformers'
//!   `models/gpt_oss/modeling_gpt_oss.py`): pre-norm layers, query/key/value/output biases, YaRN
//!   RoPE (without `truncate`) in every layer, queries scaled by `head_dim^-1/2`, each head's sink
//!   logit appended to its scores before the softmax and dropped after it, every other layer
//!   (from the first) within the window; the MLP a router `h W + b`, top-k, softmax over the k
//!   logits, and experts `(clamp(u, -l, l) + 1) * g sigmoid(1.702 g)` with `g = min(h W_g + b_g,
//!   l)`, `u = h W_u + b_u`, then `. W_o + b_o`, weighted and summed;
//! - Llama 4 (Hugging Face's `Llama4TextDecoderLayer`, `Llama4TextAttention`, `Llama4TextMoe`,
//!   transformers' `models/llama4/modeling_llama4.py`): pre-norm layers; every `nope_interval`-th
//!   layer without RoPE and attending globally, the others with Llama 3.1's RoPE, then an L2 norm
//!   (`Llama4TextL2Norm`) of each head's queries and keys with `qk_norm`, attending within chunks
//!   (`create_chunked_causal_mask`: the same chunk, causal); queries scaled by `head_dim^-1/2`, and
//!   in the NoPE layers by `1 + 0.1 ln(1 + floor((position + 1) / 8192))` with temperature tuning;
//!   every `moe_step`-th layer a router `h W`, its top logit's sigmoid scaling the token's input to
//!   that one SwiGLU expert, plus a shared SwiGLU MLP; the others a dense SwiGLU MLP;
//! - GPT-3: LayerNorm `(x - mean) / sqrt(var + eps) * g + b`, learned position embeddings added to
//!   the token embeddings, fused query/key/value with biases, no RoPE, GELU MLP with biases and its
//!   own LayerNorm.
//!
//! Parameters are held in maxrs's (MaxText's) stored layout, and the reference undoes MaxText's
//! reparametrizations where it reads them (`unfold`): Gemma's stored embedding is `E * sqrt(emb)`
//! and stored norm scales `1 + scale`; GPT-3's stored LayerNorm scale is `g - 1`. Finite
//! differences of the reference loss are then taken in stored coordinates, like maxrs's gradients.

use super::{rng, uniform};
use maxrs::host::HostTensor;
use maxrs::model::Model;
use maxrs::tensor::Tree;
use ndarray::{s, Array2};
use std::collections::BTreeMap;

pub use super::llama_ref::{B, T};

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Family {
    Llama,
    Gemma,
    Gemma2,
    Gemma3,
    Olmo3,
    /// gpt-oss, its experts' inputs clamped at `limit` (`swiglu_limit`), `top_k` experts a token.
    GptOss {
        limit: f64,
        top_k: usize,
    },
    /// Llama 4: RoPE layers attend within chunks of `chunk` tokens; layer `n` is NoPE when
    /// `(n + 1) % nope_interval == 0` (0: none) and MoE when `(n + 1) % moe_step == 0`.
    Llama4 {
        chunk: usize,
        nope_interval: usize,
        moe_step: usize,
        qk_norm: bool,
        temperature_tuning: bool,
    },
    Gpt3,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeRef {
    None,
    HalfSplit,
    /// Meta's Llama 3.1 RoPE, with or without the frequency scaling.
    Llama31 {
        scaled: bool,
    },
    /// YaRN on the two halves (transformers' `_compute_yarn_parameters`, the correction range
    /// rounded outwards with `truncate`, its attention factor `0.1 ln(factor) + 1` on cos and sin).
    Yarn {
        factor: f64,
        original_max_position_embeddings: f64,
        beta_fast: f64,
        beta_slow: f64,
        truncate: bool,
    },
}

/// What the reference computes, stated by each test (not read from maxrs's family code).
#[derive(Clone, Debug)]
pub struct Spec {
    pub family: Family,
    pub rope: RopeRef,
    /// Mistral's window, or Gemma 2's local window.
    pub window: Option<usize>,
    pub attn_cap: Option<f64>,
    pub final_cap: Option<f64>,
    pub post_norms: bool,
    pub fused_qkv: bool,
    /// The final norm's epsilon (and every norm's, except Gemma's layer norms: 1e-6).
    pub eps: f64,
    /// Gemma 3's RoPE and query scaling.
    pub gemma3: Option<Gemma3Spec>,
    /// Qwen3's QK-norm (Hugging Face's `Qwen3Attention`: `q_norm`, `k_norm`, RMSNorms with
    /// `rms_norm_eps` over each head's queries and keys before RoPE).
    pub qk_norm: bool,
    /// Queries multiplied by `head_dim^-1/2` after RoPE: MaxText's Qwen3 (its
    /// `query_pre_attn_scalar`). Otherwise the stored query kernel holds that factor, as MaxText's
    /// Llama, Mistral, Gemma and Gemma 2 store it.
    pub query_scaled: bool,
    /// Every token's position is its index in its row plus this (the batch's `inputs_position`).
    pub position_offset: usize,
}

impl Spec {
    /// `family`'s layer with `rope` and norm epsilon `eps`, and none of the options (no window,
    /// soft caps, post-norms, fused QKV, QK-norm; queries scaled in the kernel).
    pub fn plain(family: Family, rope: RopeRef, eps: f64) -> Spec {
        Spec {
            family,
            rope,
            window: None,
            attn_cap: None,
            final_cap: None,
            post_norms: false,
            fused_qkv: false,
            eps,
            gemma3: None,
            qk_norm: false,
            query_scaled: false,
            position_offset: 0,
        }
    }
}

/// Gemma 3's attention settings, in Hugging Face's terms.
#[derive(Clone, Copy, Debug)]
pub struct Gemma3Spec {
    /// `rope_local_base_freq`: the sliding-window layers' RoPE base.
    pub local_theta: f64,
    /// `rope_theta`: the global layers' RoPE base.
    pub global_theta: f64,
    /// `rope_scaling.factor` (`linear`): the global layers' frequencies are divided by it.
    pub global_factor: f64,
    /// `query_pre_attn_scalar`: queries are multiplied by its inverse square root.
    pub query_pre_attn_scalar: f64,
}

/// The model from `model_name` shrunk by `overrides`, in float32.
pub fn model(model_name: &str, overrides: &[&str]) -> Model {
    let mut args: Vec<String> = vec![
        format!("model_name={model_name}"),
        "override_model_config=true".into(),
        "dtype=float32".into(),
        "weight_dtype=float32".into(),
    ];
    args.extend(overrides.iter().map(|s| s.to_string()));
    let c = maxrs::config::load(None, &args).expect("config loads");
    Model::from_config(&c).expect("the model builds")
}

/// Parameters in the model's stored layout as f64 matrices: top-level ones by full name, layer
/// ones by their name inside the (stacked) layer. Kernels are flattened to 2-D (`[emb, heads *
/// head_dim]`, `[heads * head_dim, emb]`, `[emb, 3 * heads * head_dim]`, ...), vectors are `[1, n]`.
#[derive(Clone)]
pub struct RefParams {
    pub top: BTreeMap<String, Array2<f64>>,
    pub layers: Vec<BTreeMap<String, Array2<f64>>>,
    /// The tied logits' bf16 rounding of the table (`common::tied_logit_table` minus the table)
    /// held fixed, or None to round the table as it is. MaxText's gradient passes through the
    /// rounding (JAX transposes a dtype conversion to the reverse conversion), so finite
    /// differences of its loss are taken with the rounding of the point they start from.
    pub tied_rounding: Option<Array2<f64>>,
}

/// The 2-D shape a parameter is held in: vectors as one row, else the first dimension (the
/// first two for GPT-3's `[heads, head_dim, emb]` output kernel and every `out.kernel`) as rows.
fn matrix_shape(name: &str, shape: &[i64]) -> (usize, usize) {
    let n: i64 = shape.iter().product();
    let rows = match shape.len() {
        1 => 1,
        _ if name.ends_with("out.kernel") => shape[0] * shape[1],
        _ if name.ends_with(".bias") => 1,
        _ => shape[0],
    };
    (rows as usize, (n / rows) as usize)
}

/// Random parameters for `spec`'s family: kernels uniform with a fan-in scale (activations stay
/// O(1)), norm scales around their identity value, biases and embeddings O(1).
pub fn random_params(spec: &Spec, m: &Model, seed: u64) -> RefParams {
    let mut rng = rng(seed);
    let mut draw = |name: &str, shape: &[i64]| {
        let (rows, cols) = matrix_shape(name, shape);
        let (lo, hi) = if name.ends_with(".scale") {
            match spec.family {
                // GPT-3's stored scale is g - 1 (identity at 0), the others' are the gain.
                Family::Gpt3 => (-0.5, 0.5),
                Family::Llama
                | Family::Gemma
                | Family::Gemma2
                | Family::Gemma3
                | Family::Olmo3
                | Family::GptOss { .. }
                | Family::Llama4 { .. } => (0.5, 1.5),
            }
        } else if name.ends_with(".bias") || name.ends_with("embedding") {
            (-0.5, 0.5)
        } else if shape.len() == 3 && (name.contains("GptOssMlp.") || name.contains("Llama4MoEBlock_0.MoeBlock_0.")) {
            // The experts' kernels `[experts, in, out]`: the fan-in is `in`.
            let a = 1.7 / (shape[1] as f64).sqrt();
            (-a, a)
        } else {
            let a = 1.7 / (rows as f64).sqrt();
            (-a, a)
        };
        Array2::from_shape_vec((rows, cols), uniform(&mut rng, rows * cols, lo, hi)).unwrap()
    };
    let layers = m.stacks().iter().map(|s| s.count as usize).sum();
    let mut p = RefParams { top: BTreeMap::new(), layers: vec![BTreeMap::new(); layers], tied_rounding: None };
    for def in m.param_defs() {
        match layer_param(m, &def.name) {
            Some((layers, None, rest)) => {
                for layer in &mut p.layers[layers] {
                    layer.insert(rest.clone(), draw(&rest, &def.shape[1..]));
                }
            }
            Some((layers, Some(i), rest)) => {
                p.layers[layers.start + i].insert(rest.clone(), draw(&rest, &def.shape));
            }
            None => {
                p.top.insert(def.name.clone(), draw(&def.name, &def.shape));
            }
        }
    }
    p
}

/// A layer parameter's place: the model's layers its stack holds, the layer within the stack
/// when it is not stacked, and its name in the layer (`None`: a top-level parameter).
pub fn layer_param(m: &Model, name: &str) -> Option<(std::ops::Range<usize>, Option<usize>, String)> {
    let mut first = 0;
    for s in m.stacks() {
        let layers = first..first + s.count as usize;
        first = layers.end;
        if s.scanned(m.config.scan_layers) {
            if let Some(rest) = name.strip_prefix(&format!("{}.", s.prefix())) {
                return Some((layers, None, rest.to_string()));
            }
            continue;
        }
        if let Some((i, own)) = s.unstacked_layer(name, m.config.scan_layers) {
            return Some((layers, Some(i as usize), own));
        }
    }
    None
}

/// The parameters as program inputs `params.<name>` in the model's layout.
pub fn host_params(m: &Model, p: &RefParams) -> Tree<HostTensor> {
    let mut out = Tree::new();
    let flat = |a: &Array2<f64>| a.iter().map(|&x| x as f32).collect::<Vec<f32>>();
    for def in m.param_defs() {
        let values: Vec<f32> = match layer_param(m, &def.name) {
            Some((layers, None, rest)) => p.layers[layers].iter().flat_map(|l| flat(&l[&rest])).collect(),
            Some((layers, Some(i), rest)) => flat(&p.layers[layers.start + i][&rest]),
            None => flat(&p.top[&def.name]),
        };
        assert_eq!(values.len() as i64, def.shape.iter().product::<i64>(), "{}", def.name);
        out.insert(format!("params.{}", def.name), HostTensor::from_f32(&def.shape, &values));
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Building blocks, in f64.
// ---------------------------------------------------------------------------------------------

pub fn rms_norm(x: &Array2<f64>, gain: &Array2<f64>, eps: f64) -> Array2<f64> {
    let mut y = x.clone();
    for mut row in y.rows_mut() {
        let inv = 1.0 / (row.iter().map(|v| v * v).sum::<f64>() / row.len() as f64 + eps).sqrt();
        for (v, g) in row.iter_mut().zip(gain.iter()) {
            *v *= inv * g;
        }
    }
    y
}

fn layer_norm(x: &Array2<f64>, g: &Array2<f64>, b: &Array2<f64>, eps: f64) -> Array2<f64> {
    let mut y = x.clone();
    for mut row in y.rows_mut() {
        let n = row.len() as f64;
        let mean = row.iter().sum::<f64>() / n;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
        for ((v, g), b) in row.iter_mut().zip(g.iter()).zip(b.iter()) {
            *v = (*v - mean) / (var + eps).sqrt() * g + b;
        }
    }
    y
}

fn gelu_tanh(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
}

pub fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

fn add_row(x: &Array2<f64>, bias: &Array2<f64>) -> Array2<f64> {
    x + &bias.row(0)
}

/// Meta's `apply_scaling` (llama-models, `reference_impl/model.py`): scale factor 8, low and high
/// frequency factors 1 and 4, original context 8192.
fn llama31_scale(freq: f64) -> f64 {
    let (factor, low, high, old) = (8.0, 1.0, 4.0, 8192.0);
    let wavelen = 2.0 * std::f64::consts::PI / freq;
    if wavelen < old / high {
        freq
    } else if wavelen > old / low {
        freq / factor
    } else {
        let smooth = (old / wavelen - low) / (high - low);
        (1.0 - smooth) * freq / factor + smooth * freq
    }
}

/// transformers' YaRN (`_compute_yarn_parameters`, `modeling_rope_utils.py`) for frequency `i` of
/// `d / 2`: the inverse frequency blended between `base^(-2i/d)` (extrapolation) and that over
/// `factor` (interpolation) by a linear ramp between the correction dimensions of `beta_fast` and
/// `beta_slow` rotations (floored and ceiled: `truncate`), clamped to `[0, d - 1]`.
fn yarn_frequency(theta: f64, d: usize, i: usize, rope: RopeRef) -> f64 {
    let RopeRef::Yarn { factor, original_max_position_embeddings: omax, beta_fast, beta_slow, truncate } = rope else {
        panic!("a YaRN spec")
    };
    let dim = d as f64;
    let correction = |rotations: f64| dim * (omax / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * theta.ln());
    let (low, high) = (correction(beta_fast), correction(beta_slow));
    let (low, high) = if truncate { (low.floor(), high.ceil()) } else { (low, high) };
    let low = low.max(0.0);
    let mut high = high.min(dim - 1.0);
    if low == high {
        high += 0.001;
    }
    let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
    let extrapolation = 1.0 / theta.powf(2.0 * i as f64 / dim);
    let extrapolation_factor = 1.0 - ramp;
    extrapolation / factor * (1.0 - extrapolation_factor) + extrapolation * extrapolation_factor
}

/// RoPE on every head of `x: [B*T, heads*head_dim]`, frequencies divided by `factor`.
fn rope(spec: &Spec, (theta, factor): (f64, f64), d: usize, x: &Array2<f64>, heads: usize) -> Array2<f64> {
    let mut y = x.clone();
    let attention_factor = match spec.rope {
        RopeRef::Yarn { factor, .. } => 0.1 * factor.ln() + 1.0,
        _ => 1.0,
    };
    for r in 0..B * T {
        let pos = (r % T + spec.position_offset) as f64;
        for h in 0..heads {
            for i in 0..d / 2 {
                let freq = 1.0 / theta.powf(2.0 * i as f64 / d as f64) / factor;
                let (a, b) = match spec.rope {
                    RopeRef::None => return x.clone(),
                    RopeRef::HalfSplit | RopeRef::Yarn { .. } => (h * d + i, h * d + i + d / 2),
                    RopeRef::Llama31 { .. } => (h * d + 2 * i, h * d + 2 * i + 1),
                };
                let freq = match spec.rope {
                    RopeRef::Llama31 { scaled: true } => llama31_scale(freq),
                    RopeRef::Yarn { .. } => yarn_frequency(theta, d, i, spec.rope),
                    _ => freq,
                };
                // (x_a + i x_b) * e^{i pos freq}
                let (c, s) = ((pos * freq).cos() * attention_factor, (pos * freq).sin() * attention_factor);
                y[[r, a]] = x[[r, a]] * c - x[[r, b]] * s;
                y[[r, b]] = x[[r, b]] * c + x[[r, a]] * s;
            }
        }
    }
    y
}

/// Softmax attention of already-scaled `q` over `k`, `v` (grouped heads), causal, within
/// `window` tokens back when given, scores soft-capped by `cap` when given.
fn attend(
    q: &Array2<f64>,
    k: &Array2<f64>,
    v: &Array2<f64>,
    (heads, kvh, d): (usize, usize, usize),
    window: Option<usize>,
    cap: Option<f64>,
) -> Array2<f64> {
    attend_with_sinks(q, k, v, (heads, kvh, d), window, cap, None)
}

/// [`attend`] within chunks of `chunk` tokens (Llama 4's): key `u` is seen from query `t` when
/// `u <= t` and `u / chunk == t / chunk`; globally without a chunk.
fn attend_chunked(
    q: &Array2<f64>,
    k: &Array2<f64>,
    v: &Array2<f64>,
    (heads, kvh, d): (usize, usize, usize),
    chunk: Option<usize>,
) -> Array2<f64> {
    let first = |t: usize| chunk.map_or(0, |c| t / c * c);
    attend_from(q, k, v, (heads, kvh, d), first, None, None)
}

/// [`attend`], with each head's sink logit (`sinks: [1, heads]`) one more term of its softmax's
/// denominator when given (gpt-oss's `eager_attention_forward`).
fn attend_with_sinks(
    q: &Array2<f64>,
    k: &Array2<f64>,
    v: &Array2<f64>,
    (heads, kvh, d): (usize, usize, usize),
    window: Option<usize>,
    cap: Option<f64>,
    sinks: Option<&Array2<f64>>,
) -> Array2<f64> {
    let first = |t: usize| window.map_or(0, |w| (t + 1).saturating_sub(w));
    attend_from(q, k, v, (heads, kvh, d), first, cap, sinks)
}

/// Causal attention in which query `t` sees keys `first(t)..=t`.
fn attend_from(
    q: &Array2<f64>,
    k: &Array2<f64>,
    v: &Array2<f64>,
    (heads, kvh, d): (usize, usize, usize),
    first: impl Fn(usize) -> usize,
    cap: Option<f64>,
    sinks: Option<&Array2<f64>>,
) -> Array2<f64> {
    let mut out = Array2::<f64>::zeros((B * T, heads * d));
    for b in 0..B {
        for hh in 0..heads {
            let g = hh / (heads / kvh);
            for t in 0..T {
                let first = first(t);
                let qi = q.slice(s![b * T + t, hh * d..(hh + 1) * d]);
                let scores: Vec<f64> = (first..=t)
                    .map(|u| {
                        let s = qi.dot(&k.slice(s![b * T + u, g * d..(g + 1) * d]));
                        cap.map_or(s, |c| c * (s / c).tanh())
                    })
                    .collect();
                let sink = sinks.map(|z| z[[0, hh]]);
                let mx = scores.iter().chain(&sink).cloned().fold(f64::NEG_INFINITY, f64::max);
                let ex: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
                let z: f64 = ex.iter().sum::<f64>() + sink.map_or(0.0, |z| (z - mx).exp());
                for (j, e) in ex.iter().enumerate() {
                    let vu = v.slice(s![b * T + first + j, g * d..(g + 1) * d]);
                    out.slice_mut(s![b * T + t, hh * d..(hh + 1) * d]).scaled_add(e / z, &vu);
                }
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The families.
// ---------------------------------------------------------------------------------------------

/// Query/key/value/out attention with RoPE (Llama, Mistral, Qwen3, Gemma, Gemma 2).
fn rope_attention(
    spec: &Spec,
    m: &Model,
    l: &BTreeMap<String, Array2<f64>>,
    prefix: &str,
    h: &Array2<f64>,
    window: Option<usize>,
) -> Array2<f64> {
    let c = &m.config;
    let (heads, kvh, d) = (c.heads as usize, c.kv_heads as usize, c.head_dim as usize);
    let w = |n: &str| &l[&format!("{prefix}.{n}.kernel")];
    let theta = c.rope_max_timescale;
    let (mut q, mut k) = (h.dot(w("query")), h.dot(w("key")));
    if spec.qk_norm {
        let scale = |n: &str| &l[&format!("{prefix}.{n}.scale")];
        q = per_head(&q, heads, d, |x| rms_norm(x, scale("query_norm"), spec.eps));
        k = per_head(&k, kvh, d, |x| rms_norm(x, scale("key_norm"), spec.eps));
    }
    let q = rope(spec, (theta, 1.0), d, &q, heads);
    let q = if spec.query_scaled { q / (d as f64).sqrt() } else { q };
    let k = rope(spec, (theta, 1.0), d, &k, kvh);
    let v = h.dot(w("value"));
    attend(&q, &k, &v, (heads, kvh, d), window, spec.attn_cap).dot(w("out"))
}

/// `f` applied to each of the `n` heads (`d` columns each) of `x`.
fn per_head(x: &Array2<f64>, n: usize, d: usize, f: impl Fn(&Array2<f64>) -> Array2<f64>) -> Array2<f64> {
    let mut y = x.clone();
    for hh in 0..n {
        let cols = s![.., hh * d..(hh + 1) * d];
        y.slice_mut(cols).assign(&f(&x.slice(cols).to_owned()));
    }
    y
}

/// `act_0(h wi_0) * act_1(h wi_1) wo` (Llama: silu x linear; Gemma: tanh GELU x linear).
pub fn gated_mlp(l: &BTreeMap<String, Array2<f64>>, prefix: &str, h: &Array2<f64>, act: fn(f64) -> f64) -> Array2<f64> {
    let gate = h.dot(&l[&format!("{prefix}.wi_0.kernel")]).mapv(act);
    let up = h.dot(&l[&format!("{prefix}.wi_1.kernel")]);
    (gate * up).dot(&l[&format!("{prefix}.wo.kernel")])
}

/// Gemma's own norm scale from MaxText's stored one (`1 + scale`).
fn gemma_scale(stored: &Array2<f64>) -> Array2<f64> {
    stored - 1.0
}

/// Gemma's RMSNorm: `x / rms(x) * (1 + scale)`.
fn gemma_norm(x: &Array2<f64>, scale: &Array2<f64>, eps: f64) -> Array2<f64> {
    rms_norm(x, &(scale + 1.0), eps)
}

/// GPT-3's LayerNorm, its gain `g` being MaxText's stored scale + 1.
fn gpt3_ln(l: &BTreeMap<String, Array2<f64>>, name: &str, x: &Array2<f64>, eps: f64) -> Array2<f64> {
    let g = &l[&format!("{name}.scale")] + 1.0;
    layer_norm(x, &g, &l[&format!("{name}.bias")], eps)
}

/// One Gemma layer (Gemma 2: one half, named by `suffix`).
fn gemma_layer(
    spec: &Spec,
    m: &Model,
    l: &BTreeMap<String, Array2<f64>>,
    x: &Array2<f64>,
    suffix: &str,
    window: Option<usize>,
) -> Array2<f64> {
    let eps = 1e-6;
    let norm = |name: &str, x: &Array2<f64>| gemma_norm(x, &gemma_scale(&l[&format!("{name}{suffix}.scale")]), eps);
    let mut a =
        rope_attention(spec, m, l, &format!("self_attention{suffix}"), &norm("pre_self_attention_norm", x), window);
    if spec.post_norms {
        a = norm("post_self_attention_norm", &a);
    }
    let x = x + &a;
    let mut f = gated_mlp(l, &format!("mlp{suffix}"), &norm("pre_ffw_norm", &x), gelu_tanh);
    if spec.post_norms {
        f = norm("post_ffw_norm", &f);
    }
    &x + &f
}

/// Hugging Face's `Gemma3DecoderLayer` number `layer` (0-based, over the whole model) whose
/// parameters are `l`'s under `prefix`.
fn gemma3_layer(
    spec: &Spec,
    m: &Model,
    l: &BTreeMap<String, Array2<f64>>,
    x: &Array2<f64>,
    prefix: &str,
    layer: usize,
) -> Array2<f64> {
    let c = &m.config;
    let g = spec.gemma3.expect("a Gemma 3 spec");
    let (heads, kvh, d) = (c.heads as usize, c.kv_heads as usize, c.head_dim as usize);
    let sliding = !(layer + 1).is_multiple_of(6);
    let (rope_base, window) =
        if sliding { ((g.local_theta, 1.0), spec.window) } else { ((g.global_theta, g.global_factor), None) };
    let norm =
        |name: &str, x: &Array2<f64>, eps: f64| gemma_norm(x, &gemma_scale(&l[&format!("{prefix}{name}.scale")]), eps);
    // q_norm / k_norm: Gemma3RMSNorm(head_dim, eps=rms_norm_eps) on each head.
    let head_norm = |name: &str, x: &Array2<f64>, n: usize| per_head(x, n, d, |x| norm(name, x, spec.eps));
    let h = norm("pre_self_attention_norm", x, 1e-6);
    let w = |n: &str| &l[&format!("{prefix}self_attention.{n}.kernel")];
    let q = head_norm("self_attention.query_norm", &h.dot(w("query")), heads);
    let k = head_norm("self_attention.key_norm", &h.dot(w("key")), kvh);
    let q = rope(spec, rope_base, d, &q, heads) / g.query_pre_attn_scalar.sqrt();
    let k = rope(spec, rope_base, d, &k, kvh);
    let a = attend(&q, &k, &h.dot(w("value")), (heads, kvh, d), window, spec.attn_cap).dot(w("out"));
    let x = x + &norm("post_self_attention_norm", &a, 1e-6);
    let f = gated_mlp(l, &format!("{prefix}mlp"), &norm("pre_ffw_norm", &x, 1e-6), gelu_tanh);
    &x + &norm("post_ffw_norm", &f, 1e-6)
}

/// Hugging Face's `Olmo3DecoderLayer` number `layer` (0-based, over the whole model) whose
/// parameters are `l`'s under `prefix`: every 4th layer full attention, the others within
/// `spec.window` (`layer_types`' default); the norms use `spec.eps`.
fn olmo3_layer(
    spec: &Spec,
    m: &Model,
    l: &BTreeMap<String, Array2<f64>>,
    x: &Array2<f64>,
    prefix: &str,
    layer: usize,
) -> Array2<f64> {
    let c = &m.config;
    let (heads, kvh, d) = (c.heads as usize, c.kv_heads as usize, c.head_dim as usize);
    let window = if (layer + 1).is_multiple_of(4) { None } else { spec.window };
    let norm = |name: &str, x: &Array2<f64>| rms_norm(x, &l[&format!("{prefix}{name}.scale")], spec.eps);
    let w = |n: &str| &l[&format!("{prefix}attention.{n}.kernel")];
    // q_norm: Olmo3RMSNorm(num_attention_heads * head_dim), k_norm likewise: the whole width.
    let q = norm("attention.query_norm", &x.dot(w("query")));
    let k = norm("attention.key_norm", &x.dot(w("key")));
    let theta = c.rope_max_timescale;
    let q = rope(spec, (theta, 1.0), d, &q, heads) / (d as f64).sqrt();
    let k = rope(spec, (theta, 1.0), d, &k, kvh);
    let a = attend(&q, &k, &x.dot(w("value")), (heads, kvh, d), window, None).dot(w("out"));
    let x = x + &norm("post_self_attention_layer_norm", &a);
    let f = gated_mlp(l, &format!("{prefix}mlp"), &x, silu);
    &x + &norm("post_mlp_layer_norm", &f)
}

/// Hugging Face's `GptOssDecoderLayer` number `layer` (0-based, over the whole model) whose
/// parameters are `l`'s under `prefix` (MaxText's names: `GptOssAttention`, `GptOssMlp`); biases
/// and sinks where the layer has them.
fn gpt_oss_layer(
    spec: &Spec,
    m: &Model,
    l: &BTreeMap<String, Array2<f64>>,
    x: &Array2<f64>,
    prefix: &str,
    layer: usize,
) -> Array2<f64> {
    let Family::GptOss { limit, top_k } = spec.family else { panic!("a gpt-oss spec") };
    let c = &m.config;
    let (heads, kvh, d) = (c.heads as usize, c.kv_heads as usize, c.head_dim as usize);
    let window = if layer.is_multiple_of(2) { spec.window } else { None };
    let p = |n: &str| l.get(&format!("{prefix}{n}"));
    let norm = |name: &str, x: &Array2<f64>| rms_norm(x, p(&format!("{name}.scale")).unwrap(), spec.eps);
    let linear = |n: &str, x: &Array2<f64>| {
        let y = x.dot(p(&format!("GptOssAttention.{n}.kernel")).unwrap());
        match p(&format!("GptOssAttention.{n}.bias")) {
            Some(b) => add_row(&y, b),
            None => y,
        }
    };
    let h = norm("pre_self_attention_layer_norm", x);
    let theta = c.rope_max_timescale;
    let q = rope(spec, (theta, 1.0), d, &linear("query", &h), heads) / (d as f64).sqrt();
    let k = rope(spec, (theta, 1.0), d, &linear("key", &h), kvh);
    let sinks = p("GptOssAttention.sinks");
    let a = attend_with_sinks(&q, &k, &linear("value", &h), (heads, kvh, d), window, None, sinks);
    let x = x + &linear("out", &a);
    let h = norm("post_self_attention_layer_norm", &x);
    let mlp = |n: &str| p(&format!("GptOssMlp.{n}"));
    let mut logits = h.dot(mlp("gate.kernel").unwrap());
    if let Some(bias) = mlp("gate.bias") {
        logits = add_row(&logits, bias);
    }
    // Expert `e`'s kernel `[in, out]` (row `e` of the stored `[experts, in * out]`) and bias row.
    let kernel = |n: &str, e: usize, rows: usize| {
        let w = mlp(n).unwrap().row(e).to_owned();
        let cols = w.len() / rows;
        w.into_shape_with_order((rows, cols)).unwrap()
    };
    let bias = |n: &str, e: usize| mlp(&format!("{n}_bias")).map(|b| b.row(e).to_owned());
    let (emb, hidden) = (c.emb as usize, c.mlp as usize);
    let mut out = Array2::<f64>::zeros(x.dim());
    for r in 0..h.nrows() {
        let row = logits.row(r);
        let mut order: Vec<usize> = (0..row.len()).collect();
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        let chosen = &order[..top_k];
        let mx = chosen.iter().map(|&e| row[e]).fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = chosen.iter().map(|&e| (row[e] - mx).exp()).sum();
        let hr = h.row(r);
        for &e in chosen {
            let weight = (row[e] - mx).exp() / z;
            let with_bias = |y: ndarray::Array1<f64>, n: &str| match bias(n, e) {
                Some(b) => y + b,
                None => y,
            };
            let g = with_bias(hr.dot(&kernel("wi_0", e, emb)), "wi_0").mapv(|g| g.min(limit));
            let u = with_bias(hr.dot(&kernel("wi_1", e, emb)), "wi_1").mapv(|u| u.clamp(-limit, limit));
            let glu = &g * &g.mapv(|g| 1.0 / (1.0 + (-1.702 * g).exp())) * &(u + 1.0);
            let y = with_bias(glu.dot(&kernel("wo", e, hidden)), "wo");
            out.row_mut(r).scaled_add(weight, &y);
        }
    }
    &x + &out
}

/// Hugging Face's `Llama4TextDecoderLayer` number `layer` (0-based, over the whole model) whose
/// parameters are `l`'s under `prefix` (MaxText's names: `self_attention`, `mlp`,
/// `Llama4MoEBlock_0.{MoeBlock_0,shared_experts}`).
fn llama4_layer(
    spec: &Spec,
    m: &Model,
    l: &BTreeMap<String, Array2<f64>>,
    x: &Array2<f64>,
    prefix: &str,
    layer: usize,
) -> Array2<f64> {
    let Family::Llama4 { chunk, nope_interval, moe_step, qk_norm, temperature_tuning } = spec.family else {
        panic!("a Llama 4 spec")
    };
    let c = &m.config;
    let (heads, kvh, d) = (c.heads as usize, c.kv_heads as usize, c.head_dim as usize);
    let nope = nope_interval > 0 && (layer + 1).is_multiple_of(nope_interval);
    let p = |n: &str| &l[&format!("{prefix}{n}")];
    let norm = |name: &str, x: &Array2<f64>| rms_norm(x, p(&format!("{name}.scale")), spec.eps);
    let h = norm("pre_self_attention_layer_norm", x);
    let w = |n: &str| p(&format!("self_attention.{n}.kernel"));
    let (mut q, mut k) = (h.dot(w("query")), h.dot(w("key")));
    if !nope {
        let theta = c.rope_max_timescale;
        q = rope(spec, (theta, 1.0), d, &q, heads);
        k = rope(spec, (theta, 1.0), d, &k, kvh);
        if qk_norm {
            // Llama4TextL2Norm(rms_norm_eps): x / sqrt(mean(x^2) + eps) over each head, no weight.
            let l2 = |x: &Array2<f64>| rms_norm(x, &Array2::ones((1, d)), spec.eps);
            q = per_head(&q, heads, d, l2);
            k = per_head(&k, kvh, d, l2);
        }
    }
    let mut q = q / (d as f64).sqrt();
    if nope && temperature_tuning {
        for (r, mut row) in q.rows_mut().into_iter().enumerate() {
            let position = (r % T + spec.position_offset) as f64;
            row *= ((position + 1.0) / 8192.0).floor().ln_1p() * 0.1 + 1.0;
        }
    }
    let a = attend_chunked(&q, &k, &h.dot(w("value")), (heads, kvh, d), (!nope).then_some(chunk));
    let x = x + &a.dot(w("out"));
    let h = norm("post_self_attention_layer_norm", &x);
    if !(layer + 1).is_multiple_of(moe_step) {
        return &x + &gated_mlp(l, &format!("{prefix}mlp"), &h, silu);
    }
    let moe = format!("{prefix}Llama4MoEBlock_0");
    let experts = |n: &str| &l[&format!("{moe}.MoeBlock_0.{n}")];
    let logits = h.dot(experts("gate.kernel"));
    let (emb, hidden) = (c.emb as usize, experts("wo").ncols() / c.emb as usize);
    let mut out = gated_mlp(l, &format!("{moe}.shared_experts"), &h, silu);
    for r in 0..h.nrows() {
        // Llama4Router: the top logit (the lower expert on a tie) and its sigmoid.
        let row = logits.row(r);
        let e = (0..row.len()).fold(0, |best, e| if row[e] > row[best] { e } else { best });
        let input = &h.row(r) / (1.0 + (-row[e]).exp());
        let kernel =
            |n: &str, rows: usize| experts(n).row(e).to_owned().into_shape_with_order((rows, emb * hidden / rows));
        let gate = input.dot(&kernel("wi_0", emb).unwrap()).mapv(silu);
        let up = input.dot(&kernel("wi_1", emb).unwrap());
        out.row_mut(r).scaled_add(1.0, &(gate * up).dot(&kernel("wo", hidden).unwrap()));
    }
    &x + &out
}

fn gpt3_layer(spec: &Spec, m: &Model, l: &BTreeMap<String, Array2<f64>>, x: &Array2<f64>) -> Array2<f64> {
    let c = &m.config;
    let (heads, d) = (c.heads as usize, c.head_dim as usize);
    let h = gpt3_ln(l, "pre_self_attention_norm", x, spec.eps);
    let proj = |name: &str| {
        add_row(&h.dot(&l[&format!("self_attention.{name}.kernel")]), &l[&format!("self_attention.{name}.bias")])
    };
    let (q, k, v) = if spec.fused_qkv {
        let qkv = proj("qkv_proj");
        let n = heads * d;
        (
            qkv.slice(s![.., 0..n]).to_owned(),
            qkv.slice(s![.., n..2 * n]).to_owned(),
            qkv.slice(s![.., 2 * n..]).to_owned(),
        )
    } else {
        (proj("query"), proj("key"), proj("value"))
    };
    let q = q / (d as f64).sqrt();
    let a = attend(&q, &k, &v, (heads, heads, d), None, None).dot(&l["self_attention.out.kernel"]);
    let x = x + &add_row(&a, &l["self_attention.out.bias"]);
    let h = gpt3_ln(l, "mlp.mlp_layer_norm", &x, spec.eps);
    let hidden = add_row(&h.dot(&l["mlp.wi.kernel"]), &l["mlp.wi.bias"]).mapv(gelu_tanh);
    &x + &add_row(&hidden.dot(&l["mlp.wo.kernel"]), &l["mlp.wo.bias"])
}

pub struct RefOut {
    pub embeddings: Array2<f64>,
    pub layers: Vec<Array2<f64>>,
    pub logits: Array2<f64>,
    pub loss: f64,
}

/// The loss of `m` on `b` with parameters `p` and its gradient (`grad.<name>`), traced with
/// `value_and_grad` and run through the plugin.
pub fn loss_and_gradient(m: &Model, p: &RefParams, b: &Batch) -> Tree<HostTensor> {
    let program = maxrs::tensor::trace(&signature(m), |_ctx, inp| {
        let (loss, grads) =
            maxrs::autodiff::value_and_grad(&inp.subtree("params"), |params| m.loss(params, inp, 0.0).0);
        grads.prefixed("grad").with("loss", loss)
    })
    .expect("the gradient traces");
    super::run(&program, &inputs(m, p, b))
}

/// max |a - b| over max |b|.
pub fn scaled_err(got: &[f64], want: &Array2<f64>) -> f64 {
    let want: Vec<f64> = want.iter().copied().collect();
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-30);
    got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max) / scale
}

/// Checks the outputs of `llama_ref::forward_program` for `m` (embeddings, every layer, logits,
/// loss) against the reference `want`, each within 1e-4 (scaled error, relative loss).
pub fn check_outputs(label: &str, m: &Model, out: &Tree<HostTensor>, want: &RefOut) {
    let tol = 1e-4;
    let err = scaled_err(&out["embeddings"].to_f64(), &want.embeddings);
    assert!(err < tol, "{label}: embeddings differ: {err:e}");
    let layers = out["layers"].to_f64();
    let per = B * T * m.config.emb as usize;
    for (i, l) in want.layers.iter().enumerate() {
        let err = scaled_err(&layers[i * per..(i + 1) * per], l);
        assert!(err < tol, "{label}: layer {i} output differs: {err:e}");
    }
    let err = scaled_err(&out["logits"].to_f64(), &want.logits);
    assert!(err < tol, "{label}: logits differ: {err:e}");
    let loss = out["loss"].to_f64()[0];
    let rel = (loss - want.loss).abs() / want.loss.abs();
    println!("{label}: logits scaled error {err:e}, loss {loss} vs reference {} (rel {rel:e})", want.loss);
    assert!(rel < tol, "{label}: loss {loss} vs reference {}", want.loss);
}

pub fn reference(spec: &Spec, m: &Model, p: &RefParams, b: &Batch) -> RefOut {
    let c = &m.config;
    let e = c.emb as usize;
    let table = &p.top["token_embedder.embedding"];
    // Gemma's own embedding table is MaxText's stored one over sqrt(emb); Gemma scales by sqrt(emb).
    let own_scale = match spec.family {
        Family::Gemma | Family::Gemma2 | Family::Gemma3 => 1.0 / (e as f64).sqrt(),
        Family::Llama | Family::Olmo3 | Family::GptOss { .. } | Family::Llama4 { .. } | Family::Gpt3 => 1.0,
    };
    let (table_own, input_scale) = (table * own_scale, 1.0 / own_scale);
    let mut x = Array2::<f64>::zeros((B * T, e));
    for (r, &tok) in b.tokens.iter().enumerate() {
        x.row_mut(r).assign(&(&table_own.row(tok as usize) * input_scale));
        if let Some(pos) = p.top.get("decoder.position_embedder.embedding") {
            x.row_mut(r).scaled_add(1.0, &pos.row(r % T));
        }
    }
    let embeddings = x.clone();
    let mut layers = Vec::new();
    for (i, l) in p.layers.iter().enumerate() {
        x = match spec.family {
            Family::Llama => {
                let norm = |name: &str, x: &Array2<f64>| rms_norm(x, &l[&format!("{name}.scale")], spec.eps);
                let x = &x
                    + &rope_attention(
                        spec,
                        m,
                        l,
                        "self_attention",
                        &norm("pre_self_attention_layer_norm", &x),
                        spec.window,
                    );
                &x + &gated_mlp(l, "mlp", &norm("post_self_attention_layer_norm", &x), silu)
            }
            Family::Gemma => gemma_layer(spec, m, l, &x, "", None),
            Family::Gemma2 => {
                let x = gemma_layer(spec, m, l, &x, "_local", spec.window);
                gemma_layer(spec, m, l, &x, "_global", None)
            }
            Family::Gemma3 => {
                // A block of 6 layers, or Gemma 3's remainder block of fewer after the last one.
                let n = l.keys().filter(|k| k.ends_with(".pre_self_attention_norm.scale")).count();
                (0..n).fold(x, |x, j| gemma3_layer(spec, m, l, &x, &format!("layers_{j}."), 6 * i + j))
            }
            Family::Olmo3 => {
                // A scanned block of OLMo 3 layers (`inhomogeneous_layer_cycle_interval`).
                let n = l.keys().filter(|k| k.ends_with(".post_mlp_layer_norm.scale")).count();
                (0..n).fold(x, |x, j| olmo3_layer(spec, m, l, &x, &format!("layers_{j}."), n * i + j))
            }
            Family::GptOss { .. } => {
                // A scanned block of gpt-oss layers (`inhomogeneous_layer_cycle_interval`).
                let n = l.keys().filter(|k| k.ends_with(".pre_self_attention_layer_norm.scale")).count();
                (0..n).fold(x, |x, j| gpt_oss_layer(spec, m, l, &x, &format!("layers_{j}."), n * i + j))
            }
            Family::Llama4 { .. } => {
                // A scanned block of Llama 4 layers (`inhomogeneous_layer_cycle_interval`).
                let n = l.keys().filter(|k| k.ends_with(".pre_self_attention_layer_norm.scale")).count();
                (0..n).fold(x, |x, j| llama4_layer(spec, m, l, &x, &format!("layers_{j}."), n * i + j))
            }
            Family::Gpt3 => gpt3_layer(spec, m, l, &x),
        };
        layers.push(x.clone());
    }
    let y = match spec.family {
        Family::Llama | Family::Olmo3 | Family::GptOss { .. } | Family::Llama4 { .. } => {
            rms_norm(&x, &p.top["decoder.decoder_norm.scale"], spec.eps)
        }
        Family::Gemma | Family::Gemma2 | Family::Gemma3 => {
            gemma_norm(&x, &gemma_scale(&p.top["decoder.decoder_norm.scale"]), spec.eps)
        }
        Family::Gpt3 => gpt3_ln(&p.top, "decoder.decoder_norm", &x, spec.eps),
    };
    let mut logits = match p.top.get("decoder.logits_dense.kernel") {
        Some(w) => y.dot(w),
        // Tied: MaxText's product with the table rounded to bf16 (Gemma's own table is the
        // rounded stored one over sqrt(emb)).
        None => {
            let rounded = match &p.tied_rounding {
                Some(rounding) => table + rounding,
                None => super::tied_logit_table(table),
            };
            y.dot(&(rounded * own_scale).t())
        }
    };
    if let Some(cap) = spec.final_cap {
        logits.mapv_inplace(|v| cap * (v / cap).tanh());
    }
    let loss = super::llama_ref::cross_entropy(&logits, &b.targets, &b.seg, 0.0);
    RefOut { embeddings, layers, logits, loss }
}

// ---------------------------------------------------------------------------------------------
// Batches and program inputs.
// ---------------------------------------------------------------------------------------------

// The batch and the traced program's signature are the Llama reference's.
#[allow(unused_imports)] // Not every test binary that includes `common` uses them.
pub use super::llama_ref::{batch, signature, Batch};

pub fn inputs(m: &Model, p: &RefParams, b: &Batch) -> Tree<HostTensor> {
    super::llama_ref::with_batch(host_params(m, p), b)
}
