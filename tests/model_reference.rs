//! The Llama model (`maxrs::model::llama`) against an independent f64 reference written here
//! with ndarray: the tiny default model (emb 256, 4 query heads over 2 kv heads of 64, mlp 512,
//! vocab 512, 2 layers) in float32 on a 2 x 16 batch, with random non-zero parameters made on the
//! host. Embeddings, every layer's output, the logits and the loss are compared layer by layer,
//! with `scan_layers` on and off; the gradient of the loss is checked against finite differences
//! of the reference loss.

mod common;

use maxrs::ir::{DType, Signature};
use maxrs::model::llama::{self, LlamaConfig};
use maxrs::pjrt::HostTensor;
use maxrs::tensor::{trace, value_and_grad, Tree};
use ndarray::{s, Array2, Axis};
use rand::Rng;
use std::collections::BTreeMap;

const B: usize = 2;
const T: usize = 16;

fn config(scan_layers: bool, extra: &[&str]) -> LlamaConfig {
    let mut overrides: Vec<String> =
        vec!["dtype=float32".into(), "weight_dtype=float32".into(), format!("scan_layers={scan_layers}")];
    overrides.extend(extra.iter().map(|s| s.to_string()));
    let c = maxrs::config::load(None, &overrides).expect("config loads");
    let c = LlamaConfig::from_config(&c);
    assert!(c.kv_heads < c.heads, "the test must exercise grouped-query attention");
    assert_eq!(c.layers, 2);
    c
}

/// Per-layer parameters (unstacked), as f64 matrices: kernels flattened to 2-D
/// (`[emb, heads*head_dim]`, `[heads*head_dim, emb]`, ...), scales as `[1, emb]`.
struct RefParams {
    embedding: Array2<f64>,
    layers: Vec<BTreeMap<&'static str, Array2<f64>>>,
    final_norm: Array2<f64>,
    logits_dense: Option<Array2<f64>>,
}

fn random_params(c: &LlamaConfig, seed: u64) -> RefParams {
    let mut rng = common::rng(seed);
    let (e, hd, kvd, m, v) = (
        c.emb as usize,
        (c.heads * c.head_dim) as usize,
        (c.kv_heads * c.head_dim) as usize,
        c.mlp as usize,
        c.vocab as usize,
    );
    let mut mat = |rows: usize, cols: usize, lo: f64, hi: f64| {
        Array2::from_shape_vec((rows, cols), common::uniform(&mut rng, rows * cols, lo, hi)).unwrap()
    };
    // Kernels: uniform with a fan-in scale, so activations stay O(1) through the layers.
    let mut layers = Vec::new();
    for _ in 0..c.layers {
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
    let logits_dense = (!c.logits_via_embedding).then(|| mat(e, v, -a, a));
    RefParams { embedding: mat(v, e, -1.0, 1.0), layers, final_norm: mat(1, e, 0.5, 1.5), logits_dense }
}

/// The parameters as program inputs `params.<name>` in the model's layout.
fn host_params(c: &LlamaConfig, p: &RefParams) -> Tree<HostTensor> {
    let mut out = Tree::new();
    let f32t = |dims: &[i64], values: Vec<f64>| {
        HostTensor::from_f32(dims, &values.iter().map(|&x| x as f32).collect::<Vec<_>>())
    };
    let flat = |a: &Array2<f64>| a.iter().copied().collect::<Vec<f64>>();
    let defs = llama::param_defs(c);
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

fn rms_norm(x: &Array2<f64>, scale: &Array2<f64>, eps: f64) -> Array2<f64> {
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
fn rope(c: &LlamaConfig, x: &Array2<f64>, heads: usize) -> Array2<f64> {
    let d = c.head_dim as usize;
    let mut y = x.clone();
    for r in 0..B * T {
        let pos = (r % T) as f64;
        for h in 0..heads {
            for i in 0..d / 2 {
                let angle = pos / c.rope_max_timescale.powf(2.0 * i as f64 / d as f64);
                let (x1, x2) = (x[[r, h * d + i]], x[[r, h * d + i + d / 2]]);
                y[[r, h * d + i]] = x1 * angle.cos() - x2 * angle.sin();
                y[[r, h * d + i + d / 2]] = x2 * angle.cos() + x1 * angle.sin();
            }
        }
    }
    y
}

fn attention(c: &LlamaConfig, l: &BTreeMap<&str, Array2<f64>>, h: &Array2<f64>) -> Array2<f64> {
    let (heads, kvh, d) = (c.heads as usize, c.kv_heads as usize, c.head_dim as usize);
    let q = rope(c, &h.dot(&l["self_attention.query.kernel"]), heads) / (d as f64).sqrt();
    let k = rope(c, &h.dot(&l["self_attention.key.kernel"]), kvh);
    let v = h.dot(&l["self_attention.value.kernel"]);
    let mut out = Array2::<f64>::zeros((B * T, heads * d));
    for b in 0..B {
        for hh in 0..heads {
            let g = hh / (heads / kvh);
            for t in 0..T {
                let qi = q.slice(s![b * T + t, hh * d..(hh + 1) * d]);
                let scores: Vec<f64> = (0..=t).map(|u| qi.dot(&k.slice(s![b * T + u, g * d..(g + 1) * d]))).collect();
                let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let ex: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
                let z: f64 = ex.iter().sum();
                for (u, e) in ex.iter().enumerate() {
                    let vu = v.slice(s![b * T + u, g * d..(g + 1) * d]);
                    let mut o = out.slice_mut(s![b * T + t, hh * d..(hh + 1) * d]);
                    o.scaled_add(e / z, &vu);
                }
            }
        }
    }
    out.dot(&l["self_attention.out.kernel"])
}

fn layer(c: &LlamaConfig, l: &BTreeMap<&str, Array2<f64>>, x: &Array2<f64>) -> Array2<f64> {
    let h = rms_norm(x, &l["pre_self_attention_layer_norm.scale"], c.eps);
    let x = x + &attention(c, l, &h);
    let h = rms_norm(&x, &l["post_self_attention_layer_norm.scale"], c.eps);
    let gate = h.dot(&l["mlp.wi_0.kernel"]).mapv(|g| g / (1.0 + (-g).exp()));
    let up = h.dot(&l["mlp.wi_1.kernel"]);
    &x + &(gate * up).dot(&l["mlp.wo.kernel"])
}

struct RefOut {
    embeddings: Array2<f64>,
    layers: Vec<Array2<f64>>,
    logits: Array2<f64>,
    loss: f64,
}

fn reference(c: &LlamaConfig, p: &RefParams, tokens: &[i32], targets: &[i32], seg: &[i32], z: f64) -> RefOut {
    let e = c.emb as usize;
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
    let y = rms_norm(&x, &p.final_norm, c.eps);
    let logits = match &p.logits_dense {
        Some(w) => y.dot(w),
        None => y.dot(&p.embedding.t()),
    };
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
    RefOut { embeddings, layers, logits, loss: total / weights }
}

// ---------------------------------------------------------------------------------------------
// The traced model and the comparisons.
// ---------------------------------------------------------------------------------------------

struct Batch {
    tokens: Vec<i32>,
    targets: Vec<i32>,
    seg: Vec<i32>,
}

fn batch(c: &LlamaConfig, seed: u64) -> Batch {
    let mut rng = common::rng(seed);
    let v = c.vocab as i32;
    let tokens = (0..B * T).map(|_| rng.gen_range(0..v)).collect();
    let targets = (0..B * T).map(|_| rng.gen_range(0..v)).collect();
    // The last 3 positions of the second row are padding.
    let seg = (0..B * T).map(|r| if r >= 2 * T - 3 { 0 } else { 1 }).collect();
    Batch { tokens, targets, seg }
}

fn signature(c: &LlamaConfig) -> Signature {
    let mut sig = Signature::new(None);
    llama::declare_params(&mut sig, c, "params");
    for name in ["inputs", "targets", "targets_segmentation"] {
        sig.input(name, DType::S32, &[B as i64, T as i64]);
    }
    sig
}

fn inputs(c: &LlamaConfig, p: &RefParams, b: &Batch) -> Tree<HostTensor> {
    let mut inputs = host_params(c, p);
    let dims = [B as i64, T as i64];
    inputs.insert("inputs", HostTensor::from_i32(&dims, &b.tokens));
    inputs.insert("targets", HostTensor::from_i32(&dims, &b.targets));
    inputs.insert("targets_segmentation", HostTensor::from_i32(&dims, &b.seg));
    inputs
}

/// max |a - b| over max |b|: the error relative to the tensor's scale.
fn scaled_err(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-30);
    got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max) / scale
}

fn check_forward(scan_layers: bool, extra: &[&str], z: f64) {
    let c = config(scan_layers, extra);
    let p = random_params(&c, 1);
    let b = batch(&c, 2);
    let program = trace(&signature(&c), |_ctx, inp| {
        let params = inp.subtree("params");
        let fwd = llama::forward(&c, &params, &inp["inputs"], true);
        let (loss, _) = llama::loss(&c, &params, inp, z);
        Tree::new()
            .with("embeddings", fwd.embeddings)
            .with("layers", fwd.layer_outputs.expect("layer outputs"))
            .with("logits", fwd.logits)
            .with("loss", loss)
    })
    .expect("the model traces");
    let out = common::run(&program, &inputs(&c, &p, &b));
    let want = reference(&c, &p, &b.tokens, &b.targets, &b.seg, z);
    let tol = 1e-4;
    let flat = |a: &Array2<f64>| a.iter().copied().collect::<Vec<_>>();
    let err = scaled_err(&out["embeddings"].to_f64(), &flat(&want.embeddings));
    assert!(err < tol, "embeddings differ: {err:e}");
    let layers = out["layers"].to_f64();
    let per = B * T * c.emb as usize;
    for (i, l) in want.layers.iter().enumerate() {
        let err = scaled_err(&layers[i * per..(i + 1) * per], &flat(l));
        println!("scan_layers={scan_layers} layer {i}: scaled error {err:e}");
        assert!(err < tol, "layer {i} output differs (scan_layers={scan_layers}): {err:e}");
    }
    let err = scaled_err(&out["logits"].to_f64(), &flat(&want.logits));
    println!("scan_layers={scan_layers} logits: scaled error {err:e}");
    assert!(err < tol, "logits differ: {err:e}");
    let loss = out["loss"].to_f64()[0];
    let rel = (loss - want.loss).abs() / want.loss.abs();
    println!("scan_layers={scan_layers} loss {loss} vs reference {} (rel {rel:e})", want.loss);
    assert!(rel < tol, "loss {loss} vs reference {}", want.loss);
}

#[test]
fn forward_matches_reference_unrolled() {
    check_forward(false, &[], 0.0);
}

#[test]
fn forward_matches_reference_scanned() {
    check_forward(true, &[], 0.0);
}

#[test]
fn forward_matches_reference_tied_embedding_z_loss_minimal_remat() {
    check_forward(true, &["logits_via_embedding=true", "remat_policy=minimal"], 1e-2);
}

/// The gradient from `value_and_grad` against central differences of the f64 reference loss.
#[test]
fn gradient_matches_finite_differences() {
    for scan_layers in [true, false] {
        let c = config(scan_layers, &["remat_policy=full"]);
        let p = random_params(&c, 3);
        let b = batch(&c, 4);
        let program = trace(&signature(&c), |_ctx, inp| {
            let (loss, grads) = value_and_grad(&inp.subtree("params"), |params| llama::loss(&c, params, inp, 0.0).0);
            grads.prefixed("grad").with("loss", loss)
        })
        .expect("the gradient traces");
        let out = common::run(&program, &inputs(&c, &p, &b));
        // (layer, reference parameter, row, col) and the element's index in the model's layout.
        let probes: &[(usize, &str, usize, usize)] = &[
            (0, "self_attention.query.kernel", 3, 70),
            (1, "self_attention.key.kernel", 10, 5),
            (0, "self_attention.value.kernel", 200, 100),
            (1, "self_attention.out.kernel", 130, 7),
            (0, "mlp.wi_0.kernel", 17, 300),
            (1, "mlp.wo.kernel", 400, 11),
            (0, "pre_self_attention_layer_norm.scale", 0, 42),
        ];
        for &(li, name, r, col) in probes {
            let mut plus = clone_params(&p);
            let mut minus = clone_params(&p);
            let h = 1e-4;
            plus.layers[li].get_mut(name).unwrap()[[r, col]] += h;
            minus.layers[li].get_mut(name).unwrap()[[r, col]] -= h;
            let fd = (reference(&c, &plus, &b.tokens, &b.targets, &b.seg, 0.0).loss
                - reference(&c, &minus, &b.tokens, &b.targets, &b.seg, 0.0).loss)
                / (2.0 * h);
            let cols = p.layers[li][name].ncols();
            let (grad_name, offset) = if scan_layers {
                (format!("grad.decoder.layers.{name}"), li * p.layers[li][name].len())
            } else {
                (format!("grad.decoder.layers_{li}.{name}"), 0)
            };
            let g = out[grad_name.as_str()].to_f64()[offset + r * cols + col];
            println!(
                "scan_layers={scan_layers} d loss / d {name}[{li}][{r},{col}]: traced {g:e}, finite difference {fd:e}"
            );
            assert!((g - fd).abs() <= 1e-3 * fd.abs() + 1e-6, "{name}: traced {g} vs finite difference {fd}");
        }
    }
}

fn clone_params(p: &RefParams) -> RefParams {
    RefParams {
        embedding: p.embedding.clone(),
        layers: p.layers.clone(),
        final_norm: p.final_norm.clone(),
        logits_dense: p.logits_dense.clone(),
    }
}

/// `init_params`: every parameter of `param_defs` with its shape and dtype, MaxText's scales
/// (embedding stddev 1, kernels stddev sqrt(1/fan_in), norm scales 1), the same values for the
/// same seed and different values for another seed.
#[test]
fn init_params_follow_the_defs_and_the_seed() {
    use maxrs::model::llama::ParamInit;
    use maxrs::tensor::random;
    let c = config(true, &[]);
    let init = |seed: u32| {
        let program = trace(&Signature::new(None), |ctx, _| llama::init_params(&c, &random::key(ctx, seed)))
            .expect("init traces");
        common::run(&program, &Tree::new())
    };
    let (a, again, other) = (init(0), init(0), init(1));
    let defs = llama::param_defs(&c);
    assert_eq!(a.len(), defs.len());
    for def in &defs {
        let values = a[def.name.as_str()].to_f64();
        assert_eq!(a[def.name.as_str()].dims, def.shape, "{}", def.name);
        assert_eq!(values, again[def.name.as_str()].to_f64(), "{} is not deterministic", def.name);
        let n = values.len() as f64;
        let mean = values.iter().sum::<f64>() / n;
        let std = (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt();
        match def.init {
            ParamInit::Ones => assert!(values.iter().all(|&v| v == 1.0), "{}", def.name),
            ParamInit::Normal(s) => assert!((std / s - 1.0).abs() < 0.05, "{}: std {std}", def.name),
            ParamInit::FanIn(fan_in) => {
                let want = (1.0 / fan_in as f64).sqrt();
                assert!((std / want - 1.0).abs() < 0.05, "{}: std {std}, expected {want}", def.name);
                assert!(values.iter().all(|v| v.abs() <= 2.0 * want / 0.8796 + 1e-6), "{} not truncated", def.name);
            }
        }
        if def.init != ParamInit::Ones {
            assert_ne!(values, other[def.name.as_str()].to_f64(), "{} ignores the seed", def.name);
        }
    }
}
