//! Gemma 4's text decoder (`decoder_block=gemma4`) against an independent f64 reference written
//! here from Hugging Face's formulation (transformers' `models/gemma4/modeling_gemma4.py`:
//! `Gemma4TextDecoderLayer`, `Gemma4TextAttention`, `Gemma4TextRouter`, `Gemma4TextExperts`), on
//! `[B*T, features]` matrices: embeddings, every block's output, the logits and the loss of
//! gemma4-31b's and gemma4-26b's files shrunk (emb 32, 4 query heads, local layers 2 key/value
//! heads of 8, global layers 1 of 16 sharing keys and values, partial RoPE, window 5 on 16 tokens,
//! 4 experts of which 2 a token beside the shared MLP), unscanned (every layer its own module,
//! with a remainder block) and scanned (the blocks' local layers one more scan), and the gradient
//! of the loss against central differences of the reference loss at parameters Gemma 4 adds.
//! Gemma 4 small (`decoder_block=gemma4_small`, gemma4-e2b shrunk) the same way: per-layer inputs
//! added after each layer's MLP, the last layers attending over an earlier layer's keys and values.
//!
//! The reference, layer `n` of the model (every 6th global, the others within the window):
//! `h = rms(x) g`; `q = rms_head(h Wq) gq`, `k = rms_head(h Wk) gk`, `v = rms_head(h Wv)` (the
//! raw `h Wk` in a global layer with shared projections); RoPE on `q`, `k` with the layer type's
//! base over its head, a global layer rotating only the first `int(proportion x head) / 2`
//! frequencies (`_compute_proportional_rope_parameters`); softmax(q k^T) v with scale 1;
//! `x += rms(. Wo) g`; the MLP `gelu_tanh(h W0) * (h W1) W2` on `rms(x) g`, or with experts
//! `rms(mlp(.)) g1` plus `rms(sum_e w_e expert_e(rms(x) g2)) g2'`, the router
//! `softmax(rms(x) * scale * emb^-1/2 Wr)`, its top k (renormalized) times `per_expert_scale`;
//! `x += rms(.) g`; `x *= layer_scalar`. The embedding is the stored table (MaxText stores Hugging
//! Face's times `sqrt(emb)`, which Hugging Face multiplies back), the tied logits
//! `y (table / sqrt(emb))^T`, soft-capped.

use std::collections::BTreeMap;

use crate::common::family_ref::{check_outputs, host_params, model, random_params, scaled_err, Family, RefOut};
use crate::common::family_ref::{RefParams, RopeRef, Spec};
use crate::common::llama_ref::{batch, cross_entropy, forward_program, Batch, B, T};
use maxrs::host::HostTensor;
use maxrs::model::Model;
use maxrs::tensor::Tree;
use ndarray::{s, Array1, Array2};

/// The shrunk sizes, the window and RoPE settings that make every feature matter at these sizes
/// (global layers rotate half their head at base 100; local ones all of it at base 10000).
const KEYS: &[&str] = &[
    "base_emb_dim=32",
    "base_num_query_heads=4",
    "base_num_kv_heads=2",
    "head_dim=8",
    "global_head_dim=16",
    "global_num_kv_heads=1",
    "base_mlp_dim=48",
    "vocab_size=64",
    "sliding_window_size=5",
    "local_rope_max_timescale=10000",
    "global_rope_max_timescale=100",
    "global_rope_proportion=0.5",
    "normalization_layer_epsilon=1e-3",
    "final_logits_soft_cap=2.0",
];

/// The experts of the shrunk gemma4-26b, without the file's load-balancing loss (the MoE block's
/// own, `moe_reference`'s; the reference's loss is the cross-entropy).
const EXPERTS: &[&str] =
    &["num_experts=4", "num_experts_per_tok=2", "base_moe_mlp_dim=24", "load_balance_loss_weight=0"];

/// What the reference needs to know beyond the parameters.
#[derive(Clone, Copy)]
struct Settings {
    window: usize,
    local_theta: f64,
    global_theta: f64,
    global_proportion: f64,
    /// `rms_norm_eps` of the head norms, the router's norm and the final norm (the layer norms:
    /// 1e-6).
    eps: f64,
    final_cap: f64,
    /// Experts a token (0: dense).
    top_k: usize,
    /// Gemma 4 small's layers (`Gemma4TextModel` with per-layer inputs and shared keys and values).
    small: Option<Small>,
}

/// Gemma 4 small's layout: every `period`-th layer global, the last `shared` layers reusing keys
/// and values.
#[derive(Clone, Copy)]
struct Small {
    period: usize,
    shared: usize,
}

const SETTINGS: Settings = Settings {
    window: 5,
    local_theta: 10000.0,
    global_theta: 100.0,
    global_proportion: 0.5,
    eps: 1e-3,
    final_cap: 2.0,
    top_k: 0,
    small: None,
};

fn shrunk(model_name: &str, extra: &[&str]) -> Model {
    let args: Vec<&str> = KEYS.iter().chain(extra).copied().collect();
    model(model_name, &args)
}

/// The draw of `random_params` (gains in [0.5, 1.5]; kernels, and the router scale, expert
/// scales and layer scalars, uniform at a fan-in scale).
fn draw(m: &Model) -> RefParams {
    random_params(&Spec::plain(Family::Gemma3, RopeRef::HalfSplit, 1e-3), m, 1)
}

fn rms(x: &Array2<f64>, gain: Option<&Array2<f64>>, eps: f64) -> Array2<f64> {
    let mut y = x.clone();
    for mut row in y.rows_mut() {
        let inv = 1.0 / (row.mapv(|v| v * v).mean().unwrap() + eps).sqrt();
        row.mapv_inplace(|v| v * inv);
        if let Some(g) = gain {
            row *= &g.row(0);
        }
    }
    y
}

/// `rms` of each of the `heads` heads (`d` columns each) of `x`.
fn rms_heads(x: &Array2<f64>, heads: usize, d: usize, gain: Option<&Array2<f64>>, eps: f64) -> Array2<f64> {
    let mut y = x.clone();
    for h in 0..heads {
        let cols = s![.., h * d..(h + 1) * d];
        y.slice_mut(cols).assign(&rms(&x.slice(cols).to_owned(), gain, eps));
    }
    y
}

fn gelu_tanh(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
}

/// Half-split RoPE on each head with inverse frequencies `freq` (one per pair).
fn rope(x: &Array2<f64>, heads: usize, d: usize, freq: &[f64]) -> Array2<f64> {
    let mut y = x.clone();
    for r in 0..B * T {
        let pos = (r % T) as f64;
        for h in 0..heads {
            for (i, f) in freq.iter().enumerate() {
                let (a, b) = (h * d + i, h * d + i + d / 2);
                let (c, s) = ((pos * f).cos(), (pos * f).sin());
                y[[r, a]] = x[[r, a]] * c - x[[r, b]] * s;
                y[[r, b]] = x[[r, b]] * c + x[[r, a]] * s;
            }
        }
    }
    y
}

/// Causal softmax attention with scale 1 (grouped heads), within `window` tokens when given.
fn attend(
    q: &Array2<f64>,
    k: &Array2<f64>,
    v: &Array2<f64>,
    (heads, kvh, d): (usize, usize, usize),
    window: Option<usize>,
) -> Array2<f64> {
    let mut out = Array2::<f64>::zeros((B * T, heads * d));
    for b in 0..B {
        for hh in 0..heads {
            let g = hh / (heads / kvh);
            for t in 0..T {
                let first = window.map_or(0, |w| (t + 1).saturating_sub(w));
                let qi = q.slice(s![b * T + t, hh * d..(hh + 1) * d]);
                let scores: Vec<f64> =
                    (first..=t).map(|u| qi.dot(&k.slice(s![b * T + u, g * d..(g + 1) * d]))).collect();
                let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let ex: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
                let z: f64 = ex.iter().sum();
                for (j, e) in ex.iter().enumerate() {
                    let vu = v.slice(s![b * T + first + j, g * d..(g + 1) * d]);
                    out.slice_mut(s![b * T + t, hh * d..(hh + 1) * d]).scaled_add(e / z, &vu);
                }
            }
        }
    }
    out
}

/// `gelu_tanh(h W0) * (h W1) W2`.
fn geglu(w0: &Array2<f64>, w1: &Array2<f64>, w2: &Array2<f64>, h: &Array2<f64>) -> Array2<f64> {
    (h.dot(w0).mapv(gelu_tanh) * h.dot(w1)).dot(w2)
}

/// Hugging Face's `Gemma4TextDecoderLayer` number `n` of the model, its parameters `l`'s under
/// `prefix` (MaxText's names).
fn layer(
    st: &Settings,
    m: &Model,
    l: &BTreeMap<String, Array2<f64>>,
    x: &Array2<f64>,
    prefix: &str,
    n: usize,
) -> Array2<f64> {
    layer_with(st, m, (l, prefix), x, (n + 1).is_multiple_of(6), None, None).0
}

/// Keys and values as attention takes them (normed, rotated), `[B*T, kv_heads * head]` each.
type KeyValue = (Array2<f64>, Array2<f64>);

/// Hugging Face's `Gemma4TextDecoderLayer`, global or local, on `x` with the parameters of `l`
/// under `prefix`: with `reused` a KV-shared layer's (`Gemma4TextAttention` with
/// `is_kv_shared_layer`: the donor's keys and values, no projections of its own), with
/// `per_layer` its per-layer input `[B*T, width]` (the gate, projection and norm after the MLP).
/// Returns the output and the keys and values it attended over.
fn layer_with(
    st: &Settings,
    m: &Model,
    (l, prefix): (&BTreeMap<String, Array2<f64>>, &str),
    x: &Array2<f64>,
    global: bool,
    reused: Option<&KeyValue>,
    per_layer: Option<&Array2<f64>>,
) -> (Array2<f64>, KeyValue) {
    let c = &m.config;
    let p = |name: &str| l.get(&format!("{prefix}{name}"));
    let w = |name: &str| p(name).unwrap_or_else(|| panic!("no {prefix}{name}"));
    let heads = c.heads as usize;
    let q_kernel = w("self_attention.query.kernel");
    let d = q_kernel.ncols() / heads;
    let freq: Vec<f64> = match global {
        false => (0..d / 2).map(|i| st.local_theta.powf(-2.0 * i as f64 / d as f64)).collect(),
        true => {
            let rotated = (st.global_proportion * d as f64) as usize / 2;
            (0..d / 2)
                .map(|i| if i < rotated { st.global_theta.powf(-2.0 * i as f64 / d as f64) } else { 0.0 })
                .collect()
        }
    };
    let h = rms(x, Some(w("pre_self_attention_norm.scale")), 1e-6);
    let q = rms_heads(&h.dot(q_kernel), heads, d, Some(w("self_attention.query_norm.scale")), st.eps);
    let q = rope(&q, heads, d, &freq);
    let (k, v) = match reused {
        Some(kv) => kv.clone(),
        None => {
            let kvh = w("self_attention.key.kernel").ncols() / d;
            let k_raw = h.dot(w("self_attention.key.kernel"));
            let v_raw = match p("self_attention.value.kernel") {
                Some(wv) => h.dot(wv),
                None => k_raw.clone(),
            };
            let k = rms_heads(&k_raw, kvh, d, Some(w("self_attention.key_norm.scale")), st.eps);
            let v = rms_heads(&v_raw, kvh, d, p("self_attention.value_norm.scale"), st.eps);
            (rope(&k, kvh, d, &freq), v)
        }
    };
    let kvh = k.ncols() / d;
    let window = (!global).then_some(st.window);
    let a = attend(&q, &k, &v, (heads, kvh, d), window).dot(w("self_attention.out.kernel"));
    let x = x + &rms(&a, Some(w("post_self_attention_norm.scale")), 1e-6);
    let h = rms(&x, Some(w("pre_ffw_norm.scale")), 1e-6);
    let f = match st.top_k {
        0 => geglu(w("mlp.wi_0.kernel"), w("mlp.wi_1.kernel"), w("mlp.wo.kernel"), &h),
        k => {
            let shared = "mlp.moe_block.shared_experts.";
            let dense = |n: &str| w(&format!("{shared}{n}.kernel"));
            let f1 = rms(
                &geglu(dense("wi_0"), dense("wi_1"), dense("wo"), &h),
                Some(w("mlp.post_feedforward_layernorm_1.scale")),
                1e-6,
            );
            let e = c.emb as f64;
            let router_in = rms(&x, None, st.eps) * w("mlp.pre_forward_scale_2").row(0) / e.sqrt();
            let moe = "mlp.moe_block.MoeBlock_0.";
            let logits = router_in.dot(w(&format!("{moe}gate.kernel")));
            let scales = w(&format!("{moe}per_expert_scale"));
            let h2 = rms(&x, Some(w("mlp.pre_feedforward_layernorm_2.scale")), 1e-6);
            // Expert `e`'s kernel `[in, out]`: row `e` of the stored `[experts, in * out]`.
            let kernel = |n: &str, e: usize, rows: usize| {
                let row = w(&format!("{moe}{n}")).row(e).to_owned();
                let cols = row.len() / rows;
                row.into_shape_with_order((rows, cols)).unwrap()
            };
            let (emb, width) = (c.emb as usize, w(&format!("{moe}wo")).ncols() / c.emb as usize);
            let mut out = Array2::<f64>::zeros(x.dim());
            for r in 0..x.nrows() {
                let row = logits.row(r);
                let mx = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let probs: Vec<f64> = row.iter().map(|v| (v - mx).exp()).collect();
                let z: f64 = probs.iter().sum();
                let mut order: Vec<usize> = (0..probs.len()).collect();
                order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
                let chosen = &order[..k];
                let total: f64 = chosen.iter().map(|&e| probs[e] / z).sum();
                let hr: Array1<f64> = h2.row(r).to_owned();
                for &e in chosen {
                    let weight = probs[e] / z / total * scales[[0, e]];
                    let gate = hr.dot(&kernel("wi_0", e, emb)).mapv(gelu_tanh);
                    let up = hr.dot(&kernel("wi_1", e, emb));
                    out.row_mut(r).scaled_add(weight, &(gate * up).dot(&kernel("wo", e, width)));
                }
            }
            f1 + rms(&out, Some(w("mlp.post_feedforward_layernorm_2.scale")), 1e-6)
        }
    };
    let mut x = x + &rms(&f, Some(w("post_ffw_norm.scale")), 1e-6);
    if let Some(input) = per_layer {
        let gated = x.dot(w("per_layer_input_gate.kernel")).mapv(gelu_tanh) * input;
        let projected = gated.dot(w("per_layer_projection.kernel"));
        x += &rms(&projected, Some(w("post_per_layer_input_norm.scale")), st.eps);
    }
    (x * w("layer_scalar")[[0, 0]], (k, v))
}

/// The reference of the unscanned model `m` (its stacks' layers are blocks of `layers_<j>.`).
fn reference(st: &Settings, m: &Model, p: &RefParams, b: &Batch) -> RefOut {
    let e = m.config.emb as usize;
    let table = &p.top["token_embedder.embedding"];
    let mut x = Array2::<f64>::zeros((B * T, e));
    for (r, &tok) in b.tokens.iter().enumerate() {
        x.row_mut(r).assign(&table.row(tok as usize));
    }
    let embeddings = x.clone();
    let mut layers = Vec::new();
    if let Some(small) = st.small {
        x = small_layers(st, small, m, p, b, &x);
        layers.push(x.clone());
    }
    for (i, l) in p.layers.iter().enumerate().filter(|_| st.small.is_none()) {
        let n = l.keys().filter(|k| k.ends_with(".pre_ffw_norm.scale")).count();
        x = (0..n).fold(x, |x, j| layer(st, m, l, &x, &format!("layers_{j}."), 6 * i + j));
        layers.push(x.clone());
    }
    let y = rms(&x, Some(&p.top["decoder.decoder_norm.scale"]), st.eps);
    let rounded = match &p.tied_rounding {
        Some(rounding) => table + rounding,
        None => crate::common::tied_logit_table(table),
    };
    let mut logits = y.dot(&(rounded / (e as f64).sqrt()).t());
    logits.mapv_inplace(|v| st.final_cap * (v / st.final_cap).tanh());
    let loss = cross_entropy(&logits, &b.targets, &b.seg, 0.0);
    RefOut { embeddings, layers, logits, loss }
}

/// Gemma 4 small's `Gemma4TextModel` layers on the embeddings `x` (the model's one module holds
/// them all): the per-layer inputs (`get_per_layer_inputs`, `project_per_layer_inputs`: the
/// tokens' rows of `embed_tokens_per_layer` times `sqrt(width)`, plus `rms(x Wp / sqrt(emb)) g`
/// per layer, times `2^-1/2`), then each layer, every `period`-th global, the last `shared`
/// reusing the keys and values of the last earlier layer of their kind (`kv_sharing_modes`).
fn small_layers(st: &Settings, small: Small, m: &Model, p: &RefParams, b: &Batch, x: &Array2<f64>) -> Array2<f64> {
    let l = &p.layers[0];
    let n = l.keys().filter(|k| k.ends_with(".pre_ffw_norm.scale")).count();
    let top = |name: &str| &p.top[&format!("decoder.per_layer_embedder.{name}")];
    let norm = top("per_layer_projection_norm.scale");
    let width = norm.ncols();
    let table = top("embed_tokens_per_layer");
    let projected = x.dot(top("per_layer_model_projection.kernel")) / (m.config.emb as f64).sqrt();
    let input = |j: usize| {
        let cols = s![.., j * width..(j + 1) * width];
        let mut identity = Array2::<f64>::zeros((B * T, width));
        for (r, &tok) in b.tokens.iter().enumerate() {
            identity.row_mut(r).assign(&table.slice(s![tok as usize, j * width..(j + 1) * width]));
        }
        (identity * (width as f64).sqrt() + rms(&projected.slice(cols).to_owned(), Some(norm), st.eps)) * 0.5f64.sqrt()
    };
    let global = |j: usize| (j + 1).is_multiple_of(small.period);
    let first = n - small.shared;
    let mut kept: Vec<Option<KeyValue>> = vec![None; n];
    let mut x = x.clone();
    for j in 0..n {
        let donor = (j >= first).then(|| (0..first).rev().find(|&i| global(i) == global(j)).expect("a donor"));
        let reused = donor.map(|d| kept[d].clone().expect("the donor ran"));
        let (y, kv) = layer_with(st, m, (l, &format!("layers_{j}.")), &x, global(j), reused.as_ref(), Some(&input(j)));
        kept[j] = Some(kv);
        x = y;
    }
    x
}

/// The scanned model's parameters from the unscanned model's (MaxText's layout: a local layer's
/// `[d0, rest..]` at `[block, d0, j, rest..]` of `scanned_blocks.local_layers`, the global one's at
/// `[block, ..]` of `scanned_blocks.global_layer`).
fn scanned_params(scanned: &Model, unscanned: &Tree<HostTensor>) -> Tree<HostTensor> {
    let mut out = Tree::new();
    for def in scanned.param_defs() {
        let name = format!("params.{}", def.name);
        let value = if let Some(rest) = def.name.strip_prefix("decoder.scanned_blocks.local_layers.") {
            let (blocks, d0, locals) = (def.shape[0] as usize, def.shape[1] as usize, def.shape[2] as usize);
            let inner: usize = def.shape[3..].iter().product::<i64>() as usize;
            let mut v = vec![0f32; blocks * d0 * locals * inner];
            for b in 0..blocks {
                for j in 0..locals {
                    let layer = unscanned[format!("params.decoder.layers_{}.{rest}", 6 * b + j).as_str()].to_f64();
                    for a in 0..d0 {
                        for r in 0..inner {
                            v[((b * d0 + a) * locals + j) * inner + r] = layer[a * inner + r] as f32;
                        }
                    }
                }
            }
            HostTensor::from_f32(&def.shape, &v)
        } else if let Some(rest) = def.name.strip_prefix("decoder.scanned_blocks.global_layer.") {
            let v: Vec<f32> = (0..def.shape[0] as usize)
                .flat_map(|b| unscanned[format!("params.decoder.layers_{}.{rest}", 6 * b + 5).as_str()].to_f64())
                .map(|x| x as f32)
                .collect();
            HostTensor::from_f32(&def.shape, &v)
        } else {
            unscanned[name.as_str()].clone()
        };
        out.insert(name, value);
    }
    out
}

/// `m` (unscanned) against the reference, and at each probe (block, the name in it, an element)
/// the traced gradient against central differences of the reference loss; then, when
/// `scanned` is given, the scanned model on the same parameters against the same reference
/// (`m`'s own program then runs only for probes: a compile less).
fn check(label: &str, st: &Settings, m: &Model, probes: &[(usize, &str, usize)], scanned: Option<&Model>) {
    let (p, b) = (draw(m), batch(m, 2));
    let host = host_params(m, &p);
    let want = reference(st, m, &p, &b);
    if !probes.is_empty() || scanned.is_none() {
        let program = forward_program(m, 0.0, !probes.is_empty());
        let out = crate::common::run(&program, &crate::common::llama_ref::with_batch(host.clone(), &b));
        check_outputs(label, m, &out, &want);
        check_gradients(label, st, m, (&p, &b), &out, probes);
    }
    if let Some(s) = scanned {
        let program = forward_program(s, 0.0, false);
        let out = crate::common::run(&program, &crate::common::llama_ref::with_batch(scanned_params(s, &host), &b));
        check_outputs(&format!("{label}, scanned"), s, &out, &want);
    }
}

/// The traced gradients of `out` at each probe against central differences of the reference loss.
fn check_gradients(
    label: &str,
    st: &Settings,
    m: &Model,
    (p, b): (&RefParams, &Batch),
    out: &Tree<HostTensor>,
    probes: &[(usize, &str, usize)],
) {
    for &(block, name, index) in probes {
        let h = 1e-4;
        // A top-level parameter by its full name (`decoder.per_layer_embedder.*`), else a layer's.
        let top = name.starts_with("decoder.");
        let nudged = |delta: f64| {
            let mut q = p.clone();
            let table = &p.top["token_embedder.embedding"];
            q.tied_rounding = Some(crate::common::tied_logit_table(table) - table);
            let a = match top {
                true => q.top.get_mut(name),
                false => q.layers[block].get_mut(name),
            };
            let a = a.unwrap_or_else(|| panic!("{label}: no parameter {name}"));
            let cols = a.ncols();
            a[[index / cols, index % cols]] += delta;
            reference(st, m, &q, b).loss
        };
        let fd = (nudged(h) - nudged(-h)) / (2.0 * h);
        let full = match name.strip_prefix("layers_").and_then(|n| n.split_once('.')) {
            _ if top => format!("grad.{name}"),
            Some((j, rest)) => format!("grad.decoder.layers_{}.{rest}", 6 * block + j.parse::<usize>().unwrap()),
            None => panic!("{label}: {name} is neither a layer's nor a top-level parameter"),
        };
        let g = out[full.as_str()].to_f64()[index];
        println!("{label}: d loss / d {full}[{index}]: traced {g:e}, finite difference {fd:e}");
        assert!(fd.abs() > 1e-7, "{label}: {name}[{index}] does not affect the loss; pick another probe");
        assert!((g - fd).abs() <= 2e-3 * fd.abs() + 1e-6, "{label}: {name}: traced {g} vs finite difference {fd}");
    }
}

/// gemma4-31b shrunk: 8 unscanned layers (a block of 5 local and 1 global, then a remainder of 2
/// local), the gradient at the value norm-free global attention's shared key kernel, the head
/// norms, a layer scalar and the final soft cap's input; 6 layers scanned against unscanned.
#[test]
fn gemma4_dense_against_the_reference() {
    let m = shrunk("gemma4-31b", &["base_num_decoder_layers=8", "scan_layers=false"]);
    let probes = [
        (0, "layers_5.self_attention.key.kernel", 37),
        (0, "layers_5.self_attention.query_norm.scale", 9),
        (0, "layers_2.self_attention.key_norm.scale", 3),
        (0, "layers_4.layer_scalar", 0),
        (1, "layers_1.post_ffw_norm.scale", 11),
    ];
    check("gemma4 dense, 1 block + 2 unscanned", &SETTINGS, &m, &probes, None);
    let unscanned = shrunk("gemma4-31b", &["base_num_decoder_layers=6", "scan_layers=false"]);
    let scanned = shrunk("gemma4-31b", &["base_num_decoder_layers=6"]);
    check("gemma4 dense, 1 block", &SETTINGS, &unscanned, &[], Some(&scanned));
    // The partial RoPE, the window and the shared key/value projection each change the function.
    let (p, b) = (draw(&unscanned), batch(&unscanned, 2));
    let logits = reference(&SETTINGS, &unscanned, &p, &b).logits;
    let whole = Settings { global_proportion: 1.0, ..SETTINGS };
    let unwindowed = Settings { window: 100, ..SETTINGS };
    for other in [whole, unwindowed] {
        let l = reference(&other, &unscanned, &p, &b).logits;
        assert!(scaled_err(&l.iter().copied().collect::<Vec<_>>(), &logits) > 1e-3);
    }
}

/// gemma4-26b shrunk: one block of 6 layers with 4 experts (2 a token) beside the shared MLP,
/// unscanned with every expert on every token (`sparse_matmul=false`, half the CPU of the
/// dropless path's gradient) and the gradient at the router's scale and kernel and a per-expert
/// scale, and scanned with the dropless experts.
#[test]
fn gemma4_moe_against_the_reference() {
    let st = Settings { top_k: 2, ..SETTINGS };
    let m = shrunk(
        "gemma4-26b",
        &[&["base_num_decoder_layers=6", "scan_layers=false", "sparse_matmul=false"], EXPERTS].concat(),
    );
    let scanned = shrunk("gemma4-26b", &[&["base_num_decoder_layers=6"], EXPERTS].concat());
    let probes = [
        (0, "layers_0.mlp.pre_forward_scale_2", 5),
        (0, "layers_5.mlp.moe_block.MoeBlock_0.gate.kernel", 17),
        (0, "layers_3.mlp.moe_block.MoeBlock_0.per_expert_scale", 1),
    ];
    check("gemma4 moe, 1 block", &st, &m, &probes, Some(&scanned));
}

/// gemma4-e2b shrunk (`decoder_block=gemma4_small`): 10 layers in periods of 5 (layers 4 and 9
/// global), the last 4 reusing keys and values (6 to 8 layer 5's, the global 9 layer 4's) with
/// double-wide MLPs, per-layer inputs 8 wide from a 64-row table; the gradient at the per-layer
/// embedding (a row a token reads), its projection, a per-layer gate, both donors' key kernels
/// (read by the layers that reuse them), a reusing layer's query and wide MLP.
#[test]
fn gemma4_small_against_the_reference() {
    let keys = [
        "base_num_decoder_layers=10",
        "scan_layers=false",
        "num_kv_shared_layers=4",
        "hidden_size_per_layer_input=8",
        "vocab_size_per_layer_input=64",
    ];
    let m = shrunk("gemma4-e2b", &keys);
    let st = Settings { small: Some(Small { period: 5, shared: 4 }), ..SETTINGS };
    let token = batch(&m, 2).tokens[3] as usize;
    let row = token * 10 * 8 + 13;
    let probes = [
        (0, "decoder.per_layer_embedder.embed_tokens_per_layer", row),
        (0, "decoder.per_layer_embedder.per_layer_model_projection.kernel", 77),
        (0, "layers_7.per_layer_input_gate.kernel", 20),
        (0, "layers_5.self_attention.key.kernel", 11),
        (0, "layers_4.self_attention.key.kernel", 5),
        (0, "layers_9.self_attention.query.kernel", 40),
        (0, "layers_8.mlp.wo.kernel", 2000),
    ];
    check("gemma4 small, 10 layers", &st, &m, &probes, None);
}

/// Each of Gemma 4 small's layers is a remat region of its own, as MaxText's are, and not the one
/// module that holds them all: under `remat_policy=full` the gradient program fences each layer's
/// operands for its recomputation and its cotangents (2 optimization barriers a layer), so 5 more
/// layers add 10 barriers.
#[test]
fn gemma4_small_layers_are_remat_regions() {
    let barriers = |layers: &str| {
        let m = shrunk("gemma4-e2b", &[layers, "scan_layers=false", "remat_policy=full"]);
        let program = maxrs::tensor::trace(&crate::common::llama_ref::signature(&m), |_, inp| {
            let (loss, grads) =
                maxrs::autodiff::value_and_grad(&inp.subtree("params"), |params| m.loss(params, inp, 0.0).0);
            grads.prefixed("grad").with("loss", loss)
        })
        .expect("the gradient traces");
        maxrs::lower::to_stablehlo(&program).matches("stablehlo.optimization_barrier").count()
    };
    assert_eq!(barriers("base_num_decoder_layers=10") - barriers("base_num_decoder_layers=5"), 2 * 5);
}
