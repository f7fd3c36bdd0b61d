//! The qwen3_custom_moe family (`decoder_block: qwen3_custom_moe`, MaxText's
//! `Qwen3CustomMoeDecoderLayer` in `src/maxtext/models/qwen3_custom.py` at MaxText e591f30)
//! against an independent f64 reference written here from that file: pre-RMSNorm, Qwen3's
//! attention (QK-norm over each head before half-split RoPE, queries scaled by `head_dim^-1/2`)
//! whose output projection maps to `attention_output_dim`, no residual after attention, the
//! `latent_norm` RMSNorm, the routed MoE (`RoutedMoE`, `layers/moe.py`: top-k of the gate
//! logits, softmax over the chosen ones, renormalized by `norm_topk_prob`, SwiGLU experts) on
//! that latent, then `layer_up_projection` back to `emb`, added to the layer's input.
//!
//! On qwen3-custom-30b-a3b's file shrunk to emb 32, latent 16 (so `attention_output_dim != emb`),
//! 4 experts of 48, top-2, 2 layers, vocab 64, float32: embeddings, every layer's output, the
//! logits and the loss, scanned and unrolled, dropless and every-expert; the gradient of the loss
//! against central differences of the reference loss; the parameters' names, shapes and axes;
//! the refusals; and a short training run on CPU.

use crate::common::family_ref::{self, batch, inputs, random_params, rms_norm, silu, Batch, RefOut, RefParams, B, T};
use maxrs::model::{Model, ParamInit};
use ndarray::{s, Array2};
use std::collections::BTreeMap;

// The Qwen2 reference's RoPE (its base, 100, is TINY's rope_max_timescale), grouped-query
// attention and parameter draw.
use crate::qwen2::{attend, draw_spec, rope};

const EPS: f64 = 1e-3;
const EXPERTS: usize = 4;
const TOP_K: usize = 2;
const MLP: usize = 48;

/// qwen3-custom-30b-a3b's layer at a tiny size; a small RoPE base and a large epsilon, so that
/// both visibly shape the function.
const TINY: &[&str] = &[
    "base_emb_dim=32",
    "base_num_query_heads=4",
    "base_num_kv_heads=2",
    "head_dim=8",
    "base_mlp_dim=48",
    "base_moe_mlp_dim=48",
    "base_num_decoder_layers=2",
    "vocab_size=64",
    "attention_output_dim=16",
    "moe_expert_input_dim=16",
    "num_experts=4",
    "num_experts_per_tok=2",
    "rope_max_timescale=100",
    "normalization_layer_epsilon=1e-3",
];

fn tiny(extra: &[&str]) -> Model {
    let args: Vec<&str> = TINY.iter().chain(extra).copied().collect();
    family_ref::model("qwen3-custom-30b-a3b", &args)
}

/// Random parameters; the experts' kernels (held as `[experts, in x out]`) rescaled to a fan-in
/// scale of their own input width, so that the experts' outputs stay O(1).
fn draw(m: &Model, seed: u64) -> RefParams {
    let mut p = random_params(&draw_spec(), m, seed);
    let e = (EXPERTS as f64).sqrt();
    for l in &mut p.layers {
        let latent = l["latent_norm.scale"].ncols();
        for (name, fan_in) in [("moe_block.wi_0", latent), ("moe_block.wi_1", latent), ("moe_block.wo", MLP)] {
            let a = l.get_mut(name).expect("an expert kernel");
            *a *= e / (fan_in as f64).sqrt();
        }
    }
    p
}

// ---------------------------------------------------------------------------------------------
// The reference, in f64 on [B*T, features] matrices (row = b*T + t).
// ---------------------------------------------------------------------------------------------

/// RMSNorm over each of the `n` heads (`d` columns each) of `x`.
fn per_head_norm(x: &Array2<f64>, n: usize, d: usize, gain: &Array2<f64>) -> Array2<f64> {
    let mut y = x.clone();
    for h in 0..n {
        let cols = s![.., h * d..(h + 1) * d];
        y.slice_mut(cols).assign(&rms_norm(&x.slice(cols).to_owned(), gain, EPS));
    }
    y
}

/// `RoutedMoE` on each row of `x: [B*T, latent]`: the top `TOP_K` gate logits (ties to the lower
/// expert), softmax weights over them divided by their sum (`norm_topk_prob`), the chosen
/// experts' SwiGLU MLPs (`wi_0`, `wi_1`: `[experts, latent x MLP]`, `wo`: `[experts, MLP x
/// latent]`) weighted and summed. Also returns the smallest gap between a row's k-th and
/// (k+1)-th logit.
fn moe(l: &BTreeMap<String, Array2<f64>>, x: &Array2<f64>) -> (Array2<f64>, f64) {
    let logits = x.dot(&l["moe_block.gate.kernel"]);
    let kernel = |name: &str, e: usize, rows: usize| {
        l[name].row(e).to_owned().into_shape_with_order((rows, l[name].ncols() / rows)).expect("an expert kernel")
    };
    let mut out = Array2::<f64>::zeros(x.raw_dim());
    let mut margin = f64::INFINITY;
    for r in 0..x.nrows() {
        let mut order: Vec<usize> = (0..EXPERTS).collect();
        order.sort_by(|&a, &b| logits[[r, b]].partial_cmp(&logits[[r, a]]).unwrap().then(a.cmp(&b)));
        margin = margin.min(logits[[r, order[TOP_K - 1]]] - logits[[r, order[TOP_K]]]);
        let chosen = &order[..TOP_K];
        let mx = logits[[r, chosen[0]]];
        let ex: Vec<f64> = chosen.iter().map(|&e| (logits[[r, e]] - mx).exp()).collect();
        let z: f64 = ex.iter().sum();
        let weights: Vec<f64> = ex.iter().map(|v| v / z).collect();
        let total: f64 = weights.iter().sum();
        let xr = x.row(r);
        for (&e, w) in chosen.iter().zip(&weights) {
            let gate = xr.dot(&kernel("moe_block.wi_0", e, x.ncols())).mapv(silu);
            let up = xr.dot(&kernel("moe_block.wi_1", e, x.ncols()));
            let y = (gate * up).dot(&kernel("moe_block.wo", e, MLP));
            out.row_mut(r).scaled_add(w / total, &y);
        }
    }
    (out, margin)
}

/// One layer: `x + up(moe(latent_norm(out(attention(norm(x))))))`, `up` the identity without
/// `layer_up_projection`. Returns the smallest routing margin too.
fn layer(m: &Model, l: &BTreeMap<String, Array2<f64>>, x: &Array2<f64>) -> (Array2<f64>, f64) {
    let c = &m.config;
    let (heads, kvh, d) = (c.heads as usize, c.kv_heads as usize, c.head_dim as usize);
    let h = rms_norm(x, &l["pre_self_attention_layer_norm.scale"], EPS);
    let w = |n: &str| &l[&format!("self_attention.{n}.kernel")];
    let q = per_head_norm(&h.dot(w("query")), heads, d, &l["self_attention.query_norm.scale"]);
    let k = per_head_norm(&h.dot(w("key")), kvh, d, &l["self_attention.key_norm.scale"]);
    let q = rope(&q, heads, d) / (d as f64).sqrt();
    let k = rope(&k, kvh, d);
    let latent = attend(&q, &k, &h.dot(w("value")), heads, kvh, d).dot(w("out"));
    let latent = rms_norm(&latent, &l["latent_norm.scale"], EPS);
    let (y, margin) = moe(l, &latent);
    let y = match l.get("layer_up_projection.kernel") {
        Some(up) => y.dot(up),
        None => y,
    };
    (x + &y, margin)
}

/// Embedding, the layers, the final RMSNorm and the untied output projection; the smallest
/// routing margin over the layers.
fn reference(m: &Model, p: &RefParams, b: &Batch) -> (RefOut, f64) {
    let table = &p.top["token_embedder.embedding"];
    let mut x = Array2::<f64>::zeros((B * T, m.config.emb as usize));
    for (r, &tok) in b.tokens.iter().enumerate() {
        x.row_mut(r).assign(&table.row(tok as usize));
    }
    let embeddings = x.clone();
    let (mut layers, mut margin) = (Vec::new(), f64::INFINITY);
    for l in &p.layers {
        let (y, gap) = layer(m, l, &x);
        x = y;
        margin = margin.min(gap);
        layers.push(x.clone());
    }
    let y = rms_norm(&x, &p.top["decoder.decoder_norm.scale"], EPS);
    let logits = y.dot(&p.top["decoder.logits_dense.kernel"]);
    let loss = crate::common::llama_ref::cross_entropy(&logits, &b.targets, &b.seg, 0.0);
    (RefOut { embeddings, layers, logits, loss }, margin)
}

// ---------------------------------------------------------------------------------------------
// The comparisons.
// ---------------------------------------------------------------------------------------------

/// Embeddings, every layer, logits and loss of `m` against the reference; with `gradient`, from
/// the same program, the gradient's probes (see [`check_gradient`]).
fn check_forward(label: &str, m: &Model, gradient: bool) {
    let (p, b) = (draw(m, 1), batch(m, 2));
    let (want, margin) = reference(m, &p, &b);
    // f32 and f64 must choose the same experts for the comparison to mean anything.
    assert!(margin > 1e-3, "{label}: a routing near-tie ({margin:e}); pick another seed");
    let program = crate::common::llama_ref::forward_program(m, 0.0, gradient);
    let out = crate::common::run(&program, &inputs(m, &p, &b));
    family_ref::check_outputs(label, m, &out, &want);
    if gradient {
        check_gradient(m, &p, &b, &out);
    }
}

/// The layer with `attention_output_dim` (16) != emb (32), scanned and unrolled, dropless and
/// every-expert (the same numbers), against the reference; the scanned dropless program computes
/// the gradient too (the former test `qwen3_custom_gradients_match_finite_differences`, on its
/// own draw of parameters and batch: one compile for both).
#[test]
fn qwen3_custom_matches_the_reference_layer_by_layer() {
    for (scan, sparse) in [("true", "true"), ("false", "true"), ("true", "false")] {
        let m = tiny(&[&format!("scan_layers={scan}"), &format!("sparse_matmul={sparse}")]);
        let gradient = scan == "true" && sparse == "true";
        check_forward(&format!("qwen3_custom scan_layers={scan} sparse_matmul={sparse}"), &m, gradient);
    }
}

/// With `attention_output_dim` = emb MaxText creates no `layer_up_projection`: the MoE's output
/// is added as it is.
#[test]
fn qwen3_custom_without_up_projection_matches_the_reference() {
    let m = tiny(&["attention_output_dim=32", "moe_expert_input_dim=32"]);
    assert!(m.param_defs().iter().all(|d| !d.name.contains("layer_up_projection")));
    let (p, b) = (draw(&m, 1), batch(&m, 2));
    let (want, margin) = reference(&m, &p, &b);
    assert!(margin > 1e-3, "a routing near-tie ({margin:e}); pick another seed");
    let out = crate::common::run(&crate::common::llama_ref::forward_program(&m, 0.0, false), &inputs(&m, &p, &b));
    family_ref::check_outputs("qwen3_custom attention_output_dim=emb", &m, &out, &want);
}

/// `value_and_grad`'s gradient of the loss (`out`, scanned layers) with respect to elements of the
/// new parameters (and of the narrowed attention output, a gate and an expert kernel) against
/// central differences of the reference loss; the unused `post_self_attention_layer_norm` gets a
/// zero gradient.
fn check_gradient(m: &Model, p: &RefParams, b: &Batch, out: &maxrs::tensor::Tree<maxrs::host::HostTensor>) {
    let probes = [
        (0, "latent_norm.scale", 3),
        (1, "latent_norm.scale", 11),
        (0, "layer_up_projection.kernel", 100),
        (1, "layer_up_projection.kernel", 301),
        (0, "self_attention.out.kernel", 40),
        (1, "moe_block.gate.kernel", 9),
        (0, "moe_block.wi_0", 500),
        (1, "moe_block.wo", 1000),
        (0, "self_attention.query_norm.scale", 2),
    ];
    let grad = |layer: usize, name: &str, index: usize| {
        out[format!("grad.decoder.layers.{name}").as_str()].to_f64()[layer * p.layers[layer][name].len() + index]
    };
    for (layer, name, index) in probes {
        let h = 1e-4;
        let nudged = |delta: f64| {
            let mut q = p.clone();
            let a = q.layers[layer].get_mut(name).expect("a layer parameter");
            let cols = a.ncols();
            a[[index / cols, index % cols]] += delta;
            reference(m, &q, b).0.loss
        };
        let fd = (nudged(h) - nudged(-h)) / (2.0 * h);
        let g = grad(layer, name, index);
        println!("d loss / d {name}[{layer}][{index}]: traced {g:e}, finite difference {fd:e}");
        assert!(fd.abs() > 1e-7, "{name}[{index}] does not affect the loss; pick another probe");
        assert!((g - fd).abs() <= 2e-3 * fd.abs() + 1e-6, "{name}: traced {g} vs finite difference {fd}");
    }
    let unused = out["grad.decoder.layers.post_self_attention_layer_norm.scale"].to_f64();
    assert!(unused.iter().all(|&g| g == 0.0), "the unused norm has a gradient: {unused:?}");
}

/// MaxText's parameters (`qwen3_custom.py` at MaxText e591f30): the output projection to the
/// latent, `latent_norm`, the MoE block sized by the latent with the gate's `("embed", None)`
/// axes, `layer_up_projection` with `("mlp", "embed")`, and the base class's unused
/// `post_self_attention_layer_norm`.
#[test]
fn qwen3_custom_parameters_are_maxtexts() {
    let m = tiny(&[]);
    let defs = m.param_defs();
    let find = |name: &str| {
        defs.iter().find(|d| d.name == format!("decoder.layers.{name}")).unwrap_or_else(|| panic!("{name}"))
    };
    let expect = |name: &str, shape: &[i64], logical: &[&str]| {
        let d = find(name);
        assert_eq!(d.shape, [&[2], shape].concat(), "{name}");
        assert_eq!(d.logical, [&["layers"], logical].concat(), "{name}");
        d
    };
    let out = expect("self_attention.out.kernel", &[4, 8, 16], &["heads", "kv", "embed"]);
    assert!(matches!(out.init, ParamInit::FanIn(32)), "{:?}", out.init);
    expect("latent_norm.scale", &[16], &["norm"]);
    expect("post_self_attention_layer_norm.scale", &[32], &["norm"]);
    expect("moe_block.gate.kernel", &[16, 4], &["embed", ""]);
    expect("moe_block.wi_0", &[4, 16, 48], &["exp", "embed_moe", "mlp_moe"]);
    expect("moe_block.wo", &[4, 48, 16], &["exp", "mlp_moe", "embed_moe"]);
    let up = expect("layer_up_projection.kernel", &[16, 32], &["mlp", "embed"]);
    assert!(matches!(up.init, ParamInit::FanIn(16)), "{:?}", up.init);
    assert!(defs.iter().all(|d| !d.name.contains(".mlp.")), "no dense MLP");
}

/// The two widths are checked as MaxText checks them, and refused by name elsewhere; the family
/// has no Hugging Face layout.
#[test]
fn qwen3_custom_refusals_name_the_culprit() {
    let load = |args: &[&str]| {
        let args: Vec<String> = ["override_model_config=true"].iter().chain(args).map(|s| s.to_string()).collect();
        maxrs::config::load(None, &args).expect("the keys load")
    };
    let custom = |extra: &[&str]| {
        let args: Vec<&str> = ["model_name=qwen3-custom-30b-a3b"].iter().chain(TINY).chain(extra).copied().collect();
        Model::from_config(&load(&args)).map_err(|e| e.to_string())
    };
    let err = custom(&["attention_output_dim=-1", "moe_expert_input_dim=-1"]).expect_err("unset");
    assert!(err.contains("attention_output_dim=-1") && err.contains("positive"), "{err}");
    let err = custom(&["moe_expert_input_dim=8"]).expect_err("unequal");
    assert!(err.contains("moe_expert_input_dim=8") && err.contains("attention_output_dim=16"), "{err}");
    for key in ["attention_output_dim=16", "moe_expert_input_dim=16"] {
        let err =
            Model::from_config(&load(&["model_name=qwen3-30b-a3b", key])).expect_err("not qwen3_moe's").to_string();
        assert!(err.contains(key) && err.contains("qwen3_custom_moe"), "{err}");
    }
    let err = maxrs::model::hf::check_model(&load(&["model_name=qwen3-custom-30b-a3b"])).expect_err("no HF model");
    assert!(err.to_string().contains("decoder_block=qwen3_custom_moe"), "{err}");
}

/// A scaled-down qwen3-custom-30b-a3b (emb 64, latent 32, 8 experts of 64, top-2, 2 layers)
/// trains on CPU through `maxrs train`: the loss falls within 4 steps (5.33 -> 4.92).
#[test]
fn tiny_qwen3_custom_trains() {
    let (losses, stdout) = crate::common::cli::train(&[
        "model_name=qwen3-custom-30b-a3b",
        "override_model_config=true",
        "base_emb_dim=64",
        "base_num_query_heads=4",
        "base_num_kv_heads=2",
        "head_dim=16",
        "base_mlp_dim=64",
        "base_moe_mlp_dim=64",
        "base_num_decoder_layers=2",
        "attention_output_dim=32",
        "moe_expert_input_dim=32",
        "num_experts=8",
        "num_experts_per_tok=2",
        "vocab_size=128",
        "max_target_length=32",
        "per_device_batch_size=4",
        "dtype=float32",
        "steps=4",
        "learning_rate=3e-3",
        "cpu_device_count=1",
    ]);
    println!("losses {losses:?}");
    assert_eq!(losses.len(), 4, "{stdout}");
    assert!(losses[3] < losses[0] - 0.1, "the loss falls: {losses:?}");
}

/// TFLOPs per device of qwen3-custom-30b-a3b (batch 1, sequences of 2048) by MaxText's
/// qwen3_custom_moe branch of `calculate_tflops_training_per_device`
/// (`src/maxtext/utils/maxtext_utils.py` at MaxText e591f30), written out with the file's values:
/// q/k/v from emb, the output projection to attention_output_dim, the up-projection, the router
/// and 8 SwiGLU experts on moe_expert_input_dim, the unembedding; causal attention halved.
#[test]
fn qwen3_custom_tflops_are_maxtexts() {
    let c = maxrs::config::load(None, &["model_name=qwen3-custom-30b-a3b".to_string()]).expect("the model file");
    let m = Model::from_config(&c).expect("the model builds");
    let shape = maxrs::model::flops::StepShape {
        per_device_batch_size: 1.0,
        max_target_length: 2048,
        gradient_accumulation_steps: 1,
    };
    let got = m.training_tflops_per_device(&shape);
    let t = 2048.0;
    let (emb, heads, kv, d, latent, experts, k, mlp, vocab) =
        (2048.0, 16.0, 2.0, 256.0, 768.0, 128.0, 8.0, 2048.0, 151936.0);
    let ffn = 2.0 * t * latent * experts + (2.0 * t * mlp * latent * 2.0 + 2.0 * t * mlp * latent) * k;
    let per_layer = 2.0 * t * emb * (heads + 2.0 * kv) * d + 2.0 * t * latent * heads * d + 2.0 * t * latent * emb;
    let learnable = ((ffn + per_layer) * 48.0 + 2.0 * t * emb * vocab) * 3.0 / 1e12;
    let attention = 4.0 * t * t * heads * d / 2.0 * 48.0 * 3.0 / 1e12;
    println!("qwen3-custom-30b-a3b: {:.2} TFLOPs per device and step (batch 1 x 2048)", got.total);
    assert!((got.learnable_weight - learnable).abs() <= 1e-9 * learnable, "{} vs {learnable}", got.learnable_weight);
    assert!((got.attention - attention).abs() <= 1e-9 * attention, "{} vs {attention}", got.attention);
}
