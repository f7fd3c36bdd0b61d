//! The Qwen2 family (`decoder_block: qwen2`, MaxText's Qwen2.5 model files) against an
//! independent f64 reference written here from Hugging Face's `Qwen2DecoderLayer` /
//! `Qwen2Attention` (transformers' `models/qwen2/modeling_qwen2.py`: `q_proj`, `k_proj`, `v_proj`
//! with biases, `o_proj` without; RMSNorms; half-split RoPE; queries scaled by `head_dim^-1/2`;
//! SwiGLU MLP), on qwen2.5-7b's and qwen2.5-1.5b's files shrunk to a tiny size (emb 32, 2
//! layers, vocab 64) in float32 with random non-zero parameters, biases included: embeddings,
//! every layer's output, the logits and the loss, scanned and unrolled, untied and tied logits;
//! the gradient of the loss with respect to the biases against central differences of the
//! reference loss; the bias parameters' names, shapes, axes and initializer (MaxText's
//! `DenseGeneral` in `src/maxtext/layers/linears.py` at MaxText e591f30); the refusals; and
//! `maxrs convert` both ways on a checkpoint in Hugging Face's layout.

use crate::common::family_ref::{
    self, batch, inputs, random_params, rms_norm, scaled_err, silu, Batch, RefOut, RefParams, Spec, B, T,
};
use maxrs::model::{Model, ParamInit};
use ndarray::{s, Array2};
use std::collections::BTreeMap;

use crate::model_families::SIZES;

/// A small RoPE base and a large epsilon, so that both visibly shape the function.
const NUMERICS: &[&str] = &["rope_max_timescale=100", "normalization_layer_epsilon=1e-3"];
const EPS: f64 = 1e-3;
const THETA: f64 = 100.0;

fn shrunk(model_name: &str, extra: &[&str]) -> Model {
    let args: Vec<&str> = SIZES.iter().chain(NUMERICS).chain(extra).copied().collect();
    family_ref::model(model_name, &args)
}

/// What `random_params` draws from: gains in [0.5, 1.5], biases and embeddings in [-0.5, 0.5],
/// kernels with a fan-in scale (family_ref's Llama-like spec: `random_params` reads its family
/// only, and its forward pass is not used here).
pub(crate) fn draw_spec() -> Spec {
    Spec {
        family: family_ref::Family::Llama,
        rope: family_ref::RopeRef::HalfSplit,
        window: None,
        attn_cap: None,
        final_cap: None,
        post_norms: false,
        fused_qkv: false,
        eps: EPS,
        gemma3: None,
        qk_norm: false,
        query_scaled: true,
        position_offset: 0,
    }
}

// ---------------------------------------------------------------------------------------------
// The reference: Hugging Face's Qwen2, in f64 on [B*T, features] matrices (row = b*T + t).
// ---------------------------------------------------------------------------------------------

/// `rotate_half` RoPE (`apply_rotary_pos_emb`): element `i` of each head pairs with `i + d/2`,
/// rotated by `pos / theta^(2i/d)`.
pub(crate) fn rope(x: &Array2<f64>, heads: usize, d: usize) -> Array2<f64> {
    let mut y = x.clone();
    for r in 0..B * T {
        let pos = (r % T) as f64;
        for h in 0..heads {
            for i in 0..d / 2 {
                let angle = pos / THETA.powf(2.0 * i as f64 / d as f64);
                let (a, b) = (h * d + i, h * d + i + d / 2);
                y[[r, a]] = x[[r, a]] * angle.cos() - x[[r, b]] * angle.sin();
                y[[r, b]] = x[[r, b]] * angle.cos() + x[[r, a]] * angle.sin();
            }
        }
    }
    y
}

/// Causal softmax attention of scaled `q` over `k`, `v`, query head `h` reading key/value head
/// `h / (heads / kv_heads)` (`repeat_kv`).
pub(crate) fn attend(
    q: &Array2<f64>,
    k: &Array2<f64>,
    v: &Array2<f64>,
    heads: usize,
    kvh: usize,
    d: usize,
) -> Array2<f64> {
    let mut out = Array2::<f64>::zeros((B * T, heads * d));
    for b in 0..B {
        for h in 0..heads {
            let g = h / (heads / kvh);
            for t in 0..T {
                let qi = q.slice(s![b * T + t, h * d..(h + 1) * d]);
                let scores: Vec<f64> = (0..=t).map(|u| qi.dot(&k.slice(s![b * T + u, g * d..(g + 1) * d]))).collect();
                let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let ex: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
                let z: f64 = ex.iter().sum();
                for (u, e) in ex.iter().enumerate() {
                    let vu = v.slice(s![b * T + u, g * d..(g + 1) * d]);
                    out.slice_mut(s![b * T + t, h * d..(h + 1) * d]).scaled_add(e / z, &vu);
                }
            }
        }
    }
    out
}

/// `Qwen2DecoderLayer`: `x + o_proj(attn(input_layernorm(x)))`, then `+ mlp(post_attention_layernorm(.))`.
fn layer(m: &Model, l: &BTreeMap<String, Array2<f64>>, x: &Array2<f64>) -> Array2<f64> {
    let c = &m.config;
    let (heads, kvh, d) = (c.heads as usize, c.kv_heads as usize, c.head_dim as usize);
    let h = rms_norm(x, &l["pre_self_attention_layer_norm.scale"], EPS);
    let linear = |name: &str| {
        let w = &l[&format!("self_attention.{name}.kernel")];
        h.dot(w) + l[&format!("self_attention.{name}.bias")].row(0)
    };
    let q = rope(&linear("query"), heads, d) / (d as f64).sqrt();
    let k = rope(&linear("key"), kvh, d);
    let a = attend(&q, &k, &linear("value"), heads, kvh, d).dot(&l["self_attention.out.kernel"]);
    let x = x + &a;
    let h = rms_norm(&x, &l["post_self_attention_layer_norm.scale"], EPS);
    let gate = h.dot(&l["mlp.wi_0.kernel"]).mapv(silu);
    let up = h.dot(&l["mlp.wi_1.kernel"]);
    &x + &(gate * up).dot(&l["mlp.wo.kernel"])
}

/// `Qwen2ForCausalLM`: `embed_tokens`, the layers, the final norm, `lm_head` (the embedding
/// itself when tied, without any rescaling: `normalize_embedding_logits: false`).
fn reference(m: &Model, p: &RefParams, b: &Batch) -> RefOut {
    let table = &p.top["token_embedder.embedding"];
    let mut x = Array2::<f64>::zeros((B * T, m.config.emb as usize));
    for (r, &tok) in b.tokens.iter().enumerate() {
        x.row_mut(r).assign(&table.row(tok as usize));
    }
    let embeddings = x.clone();
    let mut layers = Vec::new();
    for l in &p.layers {
        x = layer(m, l, &x);
        layers.push(x.clone());
    }
    let y = rms_norm(&x, &p.top["decoder.decoder_norm.scale"], EPS);
    let logits = match p.top.get("decoder.logits_dense.kernel") {
        Some(w) => y.dot(w),
        None => y.dot(&crate::common::tied_logit_table(table).t()),
    };
    let loss = crate::common::llama_ref::cross_entropy(&logits, &b.targets, &b.seg, 0.0);
    RefOut { embeddings, layers, logits, loss }
}

// ---------------------------------------------------------------------------------------------
// The comparisons.
// ---------------------------------------------------------------------------------------------

/// Embeddings, every layer, logits and loss of `m` against the reference; returns the reference.
fn check_forward(label: &str, m: &Model) -> (RefParams, Batch, RefOut) {
    let (p, b) = (random_params(&draw_spec(), m, 1), batch(m, 2));
    let out = crate::common::run(&crate::common::llama_ref::forward_program(m, 0.0, false), &inputs(m, &p, &b));
    let want = reference(m, &p, &b);
    family_ref::check_outputs(label, m, &out, &want);
    (p, b, want)
}

/// qwen2.5-7b's layer (untied logits), scanned and unrolled; the biases change the function.
#[test]
fn qwen2_matches_the_reference_layer_by_layer() {
    for scan in ["true", "false"] {
        let m = shrunk("qwen2.5-7b", &[&format!("scan_layers={scan}")]);
        let (mut p, b, want) = check_forward(&format!("qwen2.5-7b scan_layers={scan}"), &m);
        for l in &mut p.layers {
            for (name, a) in l.iter_mut() {
                if name.ends_with(".bias") {
                    a.fill(0.0);
                }
            }
        }
        let unbiased = reference(&m, &p, &b).logits;
        let err = scaled_err(&unbiased.iter().copied().collect::<Vec<_>>(), &want.logits);
        assert!(err > 1e-2, "the attention biases change nothing: {err:e}");
    }
}

/// qwen2.5-1.5b's tied logits, `y @ embedding^T` not divided by sqrt(emb)
/// (`normalize_embedding_logits: false` in its MaxText file).
#[test]
fn qwen2_tied_logits_match_the_reference() {
    let m = shrunk("qwen2.5-1.5b", &[]);
    assert!(m.config.logits_via_embedding && !m.config.normalize_embedding_logits);
    assert!(m.param_defs().iter().all(|d| d.name != "decoder.logits_dense.kernel"));
    check_forward("qwen2.5-1.5b", &m);
}

/// `value_and_grad`'s gradient of the loss with respect to bias elements of each projection (and
/// one kernel element) against central differences of the reference loss.
#[test]
fn qwen2_bias_gradients_match_finite_differences() {
    let m = shrunk("qwen2.5-7b", &[]);
    let (p, b) = (random_params(&draw_spec(), &m, 3), batch(&m, 4));
    let out = family_ref::loss_and_gradient(&m, &p, &b);
    let probes = [
        (0, "self_attention.query.bias", 5),
        (1, "self_attention.query.bias", 30),
        (0, "self_attention.key.bias", 3),
        (1, "self_attention.key.bias", 12),
        (0, "self_attention.value.bias", 9),
        (1, "self_attention.query.kernel", 77),
    ];
    for (layer, name, index) in probes {
        let h = 1e-4;
        let nudged = |delta: f64| {
            let mut q = p.clone();
            let a = q.layers[layer].get_mut(name).expect("a layer parameter");
            let cols = a.ncols();
            a[[index / cols, index % cols]] += delta;
            reference(&m, &q, &b).loss
        };
        let fd = (nudged(h) - nudged(-h)) / (2.0 * h);
        let g =
            out[format!("grad.decoder.layers.{name}").as_str()].to_f64()[layer * p.layers[layer][name].len() + index];
        println!("d loss / d {name}[{layer}][{index}]: traced {g:e}, finite difference {fd:e}");
        assert!(fd.abs() > 1e-7, "{name}[{index}] does not affect the loss; pick another probe");
        assert!((g - fd).abs() <= 2e-3 * fd.abs() + 1e-6, "{name}: traced {g} vs finite difference {fd}");
    }
}

/// The biases are `DenseGeneral`'s: the projection's output shape and logical axes (so sharded
/// as the kernel's outputs), zeros at init; the output projection has none, and neither does a
/// model without `attention_bias`.
#[test]
fn qwen2_bias_parameters_are_maxtexts() {
    let m = shrunk("qwen2.5-7b", &[]);
    let defs = m.param_defs();
    let find = |name: &str| defs.iter().find(|d| d.name == name);
    for (proj, heads) in [("query", 4), ("key", 2), ("value", 2)] {
        let kernel = find(&format!("decoder.layers.self_attention.{proj}.kernel")).expect("the kernel");
        let bias = find(&format!("decoder.layers.self_attention.{proj}.bias")).expect("the bias");
        assert_eq!(bias.shape, [2, heads, 8], "{proj}");
        assert_eq!(bias.logical[0], "layers");
        assert_eq!(bias.logical[1..], kernel.logical[2..], "{proj}: the kernel's output axes");
        assert!(matches!(bias.init, ParamInit::Zeros), "{proj}: {:?}", bias.init);
    }
    assert!(find("decoder.layers.self_attention.out.bias").is_none());
    let plain = shrunk("qwen2.5-7b", &["attention_bias=false"]);
    assert!(plain.param_defs().iter().all(|d| !d.name.ends_with(".bias")));
    // 2 layers x (4 + 2 + 2) heads x head_dim 8.
    assert_eq!(m.num_params() - plain.num_params(), 2 * 8 * 8);
    // qwen2 takes use_qk_norm as qwen3 does (MaxText's qwen2.py passes it to `Attention`).
    let qk = shrunk("qwen2.5-7b", &["use_qk_norm=true"]);
    assert!(qk.param_defs().iter().any(|d| d.name == "decoder.layers.self_attention.query_norm.scale"));
}

/// `attention_bias` is refused by name where maxrs's layer does not read it; a qwen2 model that
/// Hugging Face's `Qwen2ForCausalLM` cannot express is refused by `convert to-hf`.
#[test]
fn qwen2_refusals_name_the_culprit() {
    let load = |args: &[&str]| {
        let args: Vec<String> = ["override_model_config=true"].iter().chain(args).map(|s| s.to_string()).collect();
        maxrs::config::load(None, &args).expect("the keys load")
    };
    let c = load(&["model_name=llama2-7b", "attention_bias=true"]);
    let err = Model::from_config(&c).expect_err("llama2 has no attention biases").to_string();
    assert!(err.contains("attention_bias=true") && err.contains("qwen2"), "{err}");
    for (key, why) in [("attention_bias=false", "always has"), ("use_qk_norm=true", "no QK-norm")] {
        let c = load(&["model_name=qwen2.5-7b", key]);
        let err = maxrs::model::hf::check_model(&c).expect_err("not a Qwen2ForCausalLM").to_string();
        assert!(err.contains(key) && err.contains(why), "{err}");
    }
    maxrs::model::hf::check_model(&load(&["model_name=qwen2.5-7b"])).expect("Qwen2.5 converts");
}

/// The tensors of `p` in Hugging Face's `Qwen2ForCausalLM` layout: `nn.Linear` weights are
/// `[out, in]` (maxrs's kernels transposed), biases `[out]`.
fn hf_tensors(p: &RefParams) -> BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    let mut t = BTreeMap::new();
    let mut put = |name: String, a: &Array2<f64>, transpose: bool, flat: bool| {
        let a = if transpose { a.t().to_owned() } else { a.clone() };
        let shape = if flat { vec![a.len()] } else { a.shape().to_vec() };
        t.insert(name, (shape, a.iter().map(|&v| v as f32).collect()));
    };
    put("model.embed_tokens.weight".into(), &p.top["token_embedder.embedding"], false, false);
    put("model.norm.weight".into(), &p.top["decoder.decoder_norm.scale"], false, true);
    put("lm_head.weight".into(), &p.top["decoder.logits_dense.kernel"], true, false);
    for (i, l) in p.layers.iter().enumerate() {
        let hf = |n: &str| format!("model.layers.{i}.{n}");
        put(hf("input_layernorm.weight"), &l["pre_self_attention_layer_norm.scale"], false, true);
        put(hf("post_attention_layernorm.weight"), &l["post_self_attention_layer_norm.scale"], false, true);
        for (ours, theirs) in [("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj"), ("out", "o_proj")] {
            put(hf(&format!("self_attn.{theirs}.weight")), &l[&format!("self_attention.{ours}.kernel")], true, false);
            if ours != "out" {
                put(hf(&format!("self_attn.{theirs}.bias")), &l[&format!("self_attention.{ours}.bias")], false, true);
            }
        }
        for (ours, theirs) in [("wi_0", "gate_proj"), ("wi_1", "up_proj"), ("wo", "down_proj")] {
            put(hf(&format!("mlp.{theirs}.weight")), &l[&format!("mlp.{ours}.kernel")], true, false);
        }
    }
    t
}

/// `maxrs convert from-hf` of a Qwen2 checkpoint (Hugging Face's layout and `config.json`,
/// written here) gives the reference's logits, and `to-hf` gives back the same tensors, bit for
/// bit, and a `Qwen2ForCausalLM` config.
#[test]
fn qwen2_converts_from_and_to_hugging_face() {
    let m = shrunk("qwen2.5-7b", &[]);
    let (p, b) = (random_params(&draw_spec(), &m, 5), batch(&m, 6));
    let d = tempfile::tempdir().unwrap();
    let hf = d.path().join("hf");
    std::fs::create_dir_all(&hf).unwrap();
    let config = serde_json::json!({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 32,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48,
        "num_hidden_layers": 2, "vocab_size": 64, "rms_norm_eps": EPS, "rope_theta": THETA,
        "tie_word_embeddings": false, "hidden_act": "silu", "max_position_embeddings": 32768,
        "use_sliding_window": false, "sliding_window": 32768, "max_window_layers": 28,
        "torch_dtype": "float32", "rope_scaling": null,
    });
    std::fs::write(hf.join("config.json"), config.to_string()).unwrap();
    let tensors = hf_tensors(&p);
    let raws: BTreeMap<&String, crate::convert_hf::Raw> =
        tensors.iter().map(|(n, (shape, v))| (n, crate::convert_hf::raw(shape, v, false))).collect();
    let views: Vec<(&str, &crate::convert_hf::Raw)> = raws.iter().map(|(n, r)| (n.as_str(), r)).collect();
    safetensors::serialize_to_file(views, &None, &hf.join("model.safetensors")).unwrap();

    let ours = d.path().join("maxrs");
    crate::convert_hf::convert(&["from-hf", hf.to_str().unwrap(), ours.to_str().unwrap()]);
    let got = crate::convert_hf::maxrs_logits(&ours, &b.tokens[..T], &[]);
    let want = reference(&m, &p, &b).logits.slice(s![..T, ..]).to_owned();
    let err = scaled_err(&got, &want);
    println!("qwen2 from-hf: logits scaled error vs the reference {err:e}");
    assert!(err < 1e-4, "converted qwen2 logits differ from the reference: {err:e}");

    let back = d.path().join("hf-back");
    crate::convert_hf::convert(&["to-hf", ours.to_str().unwrap(), back.to_str().unwrap()]);
    let (original, returned) = (crate::convert_hf::read_hf(&hf), crate::convert_hf::read_hf(&back));
    assert_eq!(returned.keys().collect::<Vec<_>>(), original.keys().collect::<Vec<_>>());
    for (name, tensor) in &original {
        assert!(returned[name] == *tensor, "{name} converts back bit for bit");
    }
    let written: serde_json::Value = serde_json::from_slice(&std::fs::read(back.join("config.json")).unwrap()).unwrap();
    for field in
        ["architectures", "model_type", "hidden_size", "num_key_value_heads", "rope_theta", "tie_word_embeddings"]
    {
        assert_eq!(written[field], config[field], "config.json's {field}");
    }
}
