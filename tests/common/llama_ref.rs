//! An independent f64 reference of the Llama model, written with ndarray on `[B*T, features]`
//! matrices (row = b*T + t): random host parameters, the forward pass, the loss, and the
//! conversion of reference parameters to the model's program inputs. Shared by the model and
//! train-step tests.

use super::{rng, uniform};
use maxrs::host::HostTensor;
use maxrs::ir::{DType, Program, Signature};
use maxrs::model::Model;
use maxrs::tensor::{trace, Tree};
use ndarray::{s, Array2, Axis};
use rand::Rng;
use std::collections::BTreeMap;

pub const B: usize = 2;
pub const T: usize = 16;

pub fn config(scan_layers: bool, extra: &[&str]) -> Model {
    let mut overrides: Vec<String> =
        vec!["dtype=float32".into(), "weight_dtype=float32".into(), format!("scan_layers={scan_layers}")];
    overrides.extend(extra.iter().map(|s| s.to_string()));
    let c = maxrs::config::load(None, &overrides).expect("config loads");
    let c = Model::from_config(&c).expect("the model builds");
    assert!(c.config.kv_heads < c.config.heads, "the test must exercise grouped-query attention");
    c
}

/// Per-layer parameters (unstacked), as f64 matrices: kernels flattened to 2-D
/// (`[emb, heads*head_dim]`, `[heads*head_dim, emb]`, ...), scales as `[1, emb]`.
pub struct RefParams {
    pub embedding: Array2<f64>,
    pub layers: Vec<BTreeMap<&'static str, Array2<f64>>>,
    pub final_norm: Array2<f64>,
    pub logits_dense: Option<Array2<f64>>,
}

pub fn random_params(c: &Model, seed: u64) -> RefParams {
    let mut rng = rng(seed);
    let (e, hd, kvd, m, v) = (
        c.config.emb as usize,
        (c.config.heads * c.config.head_dim) as usize,
        (c.config.kv_heads * c.config.head_dim) as usize,
        c.config.mlp as usize,
        c.config.vocab as usize,
    );
    let mut mat = |rows: usize, cols: usize, lo: f64, hi: f64| {
        Array2::from_shape_vec((rows, cols), uniform(&mut rng, rows * cols, lo, hi)).unwrap()
    };
    // Kernels: uniform with a fan-in scale, so activations stay O(1) through the layers.
    let mut layers = Vec::new();
    for _ in 0..c.config.layers {
        let mut l = BTreeMap::new();
        for (name, rows, cols) in [
            ("self_attention.query.kernel", e, hd),
            ("self_attention.key.kernel", e, kvd),
            ("self_attention.value.kernel", e, kvd),
            ("self_attention.out.kernel", hd, e),
            ("mlp.wi_0.kernel", e, m),
            ("mlp.wi_1.kernel", e, m),
            ("mlp.wo.kernel", m, e),
        ] {
            let a = 1.7 / (rows as f64).sqrt();
            l.insert(name, mat(rows, cols, -a, a));
        }
        l.insert("pre_self_attention_layer_norm.scale", mat(1, e, 0.5, 1.5));
        l.insert("post_self_attention_layer_norm.scale", mat(1, e, 0.5, 1.5));
        layers.push(l);
    }
    let a = 1.7 / (e as f64).sqrt();
    let logits_dense = (!c.config.logits_via_embedding).then(|| mat(e, v, -a, a));
    RefParams { embedding: mat(v, e, -1.0, 1.0), layers, final_norm: mat(1, e, 0.5, 1.5), logits_dense }
}

/// The parameters as program inputs `params.<name>` in the model's layout.
pub fn host_params(c: &Model, p: &RefParams) -> Tree<HostTensor> {
    let mut out = Tree::new();
    let f32t = |dims: &[i64], values: Vec<f64>| {
        HostTensor::from_f32(dims, &values.iter().map(|&x| x as f32).collect::<Vec<_>>())
    };
    let flat = |a: &Array2<f64>| a.iter().copied().collect::<Vec<f64>>();
    let defs = c.param_defs();
    for def in &defs {
        let values: Vec<f64> = if def.name == "token_embedder.embedding" {
            flat(&p.embedding)
        } else if def.name == "decoder.decoder_norm.scale" {
            flat(&p.final_norm)
        } else if def.name == "decoder.logits_dense.kernel" {
            flat(p.logits_dense.as_ref().unwrap())
        } else if let Some(rest) = def.name.strip_prefix("decoder.layers.") {
            // Stacked: layer 0's values, then layer 1's (row-major over the leading axis).
            p.layers.iter().flat_map(|l| flat(&l[rest])).collect()
        } else {
            let rest = def.name.strip_prefix("decoder.layers_").unwrap();
            let (i, name) = rest.split_once('.').unwrap();
            flat(&p.layers[i.parse::<usize>().unwrap()][name])
        };
        assert_eq!(values.len() as i64, def.shape.iter().product::<i64>(), "{}", def.name);
        out.insert(format!("params.{}", def.name), f32t(&def.shape, values));
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The reference, in f64 on [B*T, features] matrices (row = b*T + t).
// ---------------------------------------------------------------------------------------------

pub fn rms_norm(x: &Array2<f64>, scale: &Array2<f64>, eps: f64) -> Array2<f64> {
    let mut y = x.clone();
    for mut row in y.rows_mut() {
        let ms = row.iter().map(|v| v * v).sum::<f64>() / row.len() as f64;
        let inv = 1.0 / (ms + eps).sqrt();
        for (v, s) in row.iter_mut().zip(scale.iter()) {
            *v *= inv * s;
        }
    }
    y
}

/// Half-split RoPE on every head of `x: [B*T, heads*head_dim]`.
pub fn rope(c: &Model, x: &Array2<f64>, heads: usize) -> Array2<f64> {
    let d = c.config.head_dim as usize;
    let mut y = x.clone();
    for r in 0..B * T {
        let pos = (r % T) as f64;
        for h in 0..heads {
            for i in 0..d / 2 {
                let angle = pos / c.config.rope_max_timescale.powf(2.0 * i as f64 / d as f64);
                let (x1, x2) = (x[[r, h * d + i]], x[[r, h * d + i + d / 2]]);
                y[[r, h * d + i]] = x1 * angle.cos() - x2 * angle.sin();
                y[[r, h * d + i + d / 2]] = x2 * angle.cos() + x1 * angle.sin();
            }
        }
    }
    y
}

pub fn attention(c: &Model, l: &BTreeMap<&str, Array2<f64>>, h: &Array2<f64>) -> Array2<f64> {
    let (heads, kvh, d) = (c.config.heads as usize, c.config.kv_heads as usize, c.config.head_dim as usize);
    // No `1/sqrt(head_dim)`: MaxText's Llama and Mixtral hold it in the stored query kernel
    // (`Attention.init_query_w`, `src/maxtext/layers/attentions.py` at e591f30).
    let q = rope(c, &h.dot(&l["self_attention.query.kernel"]), heads);
    let k = rope(c, &h.dot(&l["self_attention.key.kernel"]), kvh);
    let v = h.dot(&l["self_attention.value.kernel"]);
    let mut out = Array2::<f64>::zeros((B * T, heads * d));
    // One [T, T] score matrix per sequence and query head (its key/value head `g`): whole-matrix
    // products keep the finite differences of tests/train_step.rs (two passes per parameter
    // element) cheap in a debug build.
    for b in 0..B {
        let rows = b * T..(b + 1) * T;
        for hh in 0..heads {
            let g = hh / (heads / kvh);
            let (qh, kh, vh) = (
                q.slice(s![rows.clone(), hh * d..(hh + 1) * d]),
                k.slice(s![rows.clone(), g * d..(g + 1) * d]),
                v.slice(s![rows.clone(), g * d..(g + 1) * d]),
            );
            let probs = causal_softmax(qh.dot(&kh.t()));
            out.slice_mut(s![rows.clone(), hh * d..(hh + 1) * d]).assign(&probs.dot(&vh));
        }
    }
    out.dot(&l["self_attention.out.kernel"])
}

/// Row `t` of `scores: [T, T]` softmaxed over the keys `u <= t`, the later ones 0.
fn causal_softmax(mut scores: Array2<f64>) -> Array2<f64> {
    for (t, mut row) in scores.rows_mut().into_iter().enumerate() {
        let mx = row.iter().take(t + 1).cloned().fold(f64::NEG_INFINITY, f64::max);
        let mut z = 0.0;
        for (u, p) in row.iter_mut().enumerate() {
            *p = if u <= t { (*p - mx).exp() } else { 0.0 };
            z += *p;
        }
        row /= z;
    }
    scores
}

pub fn layer(c: &Model, l: &BTreeMap<&str, Array2<f64>>, x: &Array2<f64>) -> Array2<f64> {
    layer_with(c, l, x, attention)
}

/// A Llama layer around the given attention (the packed-documents reference masks differently).
pub fn layer_with(
    c: &Model,
    l: &BTreeMap<&str, Array2<f64>>,
    x: &Array2<f64>,
    attention: impl Fn(&Model, &BTreeMap<&str, Array2<f64>>, &Array2<f64>) -> Array2<f64>,
) -> Array2<f64> {
    let h = rms_norm(x, &l["pre_self_attention_layer_norm.scale"], c.config.eps);
    let x = x + &attention(c, l, &h);
    let h = rms_norm(&x, &l["post_self_attention_layer_norm.scale"], c.config.eps);
    let gate = h.dot(&l["mlp.wi_0.kernel"]).mapv(|g| g / (1.0 + (-g).exp()));
    let up = h.dot(&l["mlp.wi_1.kernel"]);
    &x + &(gate * up).dot(&l["mlp.wo.kernel"])
}

pub struct RefOut {
    pub embeddings: Array2<f64>,
    pub layers: Vec<Array2<f64>>,
    pub logits: Array2<f64>,
    pub loss: f64,
}

pub fn reference(c: &Model, p: &RefParams, tokens: &[i32], targets: &[i32], seg: &[i32], z: f64) -> RefOut {
    let e = c.config.emb as usize;
    let mut x = Array2::<f64>::zeros((B * T, e));
    for (r, &tok) in tokens.iter().enumerate() {
        x.row_mut(r).assign(&p.embedding.row(tok as usize));
    }
    let embeddings = x.clone();
    let mut layers = Vec::new();
    for l in &p.layers {
        x = layer(c, l, &x);
        layers.push(x.clone());
    }
    let y = rms_norm(&x, &p.final_norm, c.config.eps);
    // Tied logits: the table rounded to bf16 (`common::tied_logit_table`), divided by sqrt(emb):
    // MaxText's normalize_embedding_logits, on by default.
    let logits = match &p.logits_dense {
        Some(w) => y.dot(w),
        None => y.dot(&super::tied_logit_table(&p.embedding).t()) / (e as f64).sqrt(),
    };
    let loss = cross_entropy(&logits, targets, seg, z);
    RefOut { embeddings, layers, logits, loss }
}

/// MaxText's loss of `logits` (`[tokens, vocab]`): cross entropy plus `z` x log(Z)^2 per token,
/// averaged over the tokens whose segment is not 0.
pub fn cross_entropy(logits: &Array2<f64>, targets: &[i32], seg: &[i32], z: f64) -> f64 {
    let (mut total, mut weights) = (0.0, 0.0);
    for (r, row) in logits.axis_iter(Axis(0)).enumerate() {
        if seg[r] == 0 {
            continue;
        }
        let mx = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let log_z = mx + row.iter().map(|v| (v - mx).exp()).sum::<f64>().ln();
        total += log_z - row[targets[r] as usize] + z * log_z * log_z;
        weights += 1.0;
    }
    total / weights
}

// ---------------------------------------------------------------------------------------------
// The traced model and the comparisons.
// ---------------------------------------------------------------------------------------------

pub struct Batch {
    pub tokens: Vec<i32>,
    pub targets: Vec<i32>,
    pub seg: Vec<i32>,
}

pub fn batch(c: &Model, seed: u64) -> Batch {
    let mut rng = rng(seed);
    let v = c.config.vocab as i32;
    let tokens = (0..B * T).map(|_| rng.gen_range(0..v)).collect();
    let targets = (0..B * T).map(|_| rng.gen_range(0..v)).collect();
    // The last 3 positions of the second row are padding.
    let seg = (0..B * T).map(|r| if r >= 2 * T - 3 { 0 } else { 1 }).collect();
    Batch { tokens, targets, seg }
}

pub fn signature(c: &Model) -> Signature {
    let mut sig = Signature::new(None);
    c.declare_params(&mut sig, "params");
    for name in ["inputs", "targets", "targets_segmentation"] {
        sig.input(name, DType::S32, &[B as i64, T as i64]);
    }
    sig
}

/// The model's forward pass on [`signature`]'s inputs, returning what the layer-by-layer
/// comparisons read: the embeddings, every layer's output, the logits and the loss (z-loss `z`);
/// with `gradient`, the loss's gradient too (`grad.<name>`), from the same program: a test that
/// checks both compiles once.
pub fn forward_program(c: &Model, z: f64, gradient: bool) -> Program {
    trace(&signature(c), |_ctx, inp| {
        let params = inp.subtree("params");
        let fwd = c.forward(&params, inp, true);
        let (loss, grads) = match gradient {
            true => maxrs::autodiff::value_and_grad(&params, |params| c.loss(params, inp, z).0),
            false => (c.loss(&params, inp, z).0, Tree::new()),
        };
        grads
            .prefixed("grad")
            .with("embeddings", fwd.embeddings)
            .with("layers", fwd.layer_outputs.expect("layer outputs"))
            .with("logits", fwd.logits)
            .with("loss", loss)
    })
    .expect("the model traces")
}

pub fn inputs(c: &Model, p: &RefParams, b: &Batch) -> Tree<HostTensor> {
    with_batch(host_params(c, p), b)
}

/// The program inputs: `params` (a reference's parameters on the host) and the batch.
pub fn with_batch(params: Tree<HostTensor>, b: &Batch) -> Tree<HostTensor> {
    let mut inputs = params;
    let dims = [B as i64, T as i64];
    inputs.insert("inputs", HostTensor::from_i32(&dims, &b.tokens));
    inputs.insert("targets", HostTensor::from_i32(&dims, &b.targets));
    inputs.insert("targets_segmentation", HostTensor::from_i32(&dims, &b.seg));
    inputs
}

/// max |a - b| over max |b|: the error relative to the tensor's scale.
pub fn scaled_err(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-30);
    got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max) / scale
}

pub fn clone_params(p: &RefParams) -> RefParams {
    RefParams {
        embedding: p.embedding.clone(),
        layers: p.layers.clone(),
        final_norm: p.final_norm.clone(),
        logits_dense: p.logits_dense.clone(),
    }
}

/// Every parameter matrix of `p`, in a fixed order.
pub fn param_matrices_mut(p: &mut RefParams) -> Vec<&mut Array2<f64>> {
    let mut out: Vec<&mut Array2<f64>> = vec![&mut p.embedding, &mut p.final_norm];
    out.extend(p.logits_dense.iter_mut());
    for layer in p.layers.iter_mut() {
        out.extend(layer.values_mut());
    }
    out
}

/// `p` with `f` applied to every element.
pub fn map_params(p: &RefParams, mut f: impl FnMut(f64) -> f64) -> RefParams {
    let mut out = clone_params(p);
    for m in param_matrices_mut(&mut out) {
        m.mapv_inplace(&mut f);
    }
    out
}
