//! The Llama family's Hugging Face layout (`LlamaForCausalLM`, `MistralForCausalLM`): its
//! `config.json` keys and tensor names, to and from maxrs's (`maxrs convert`).
//!
//! | Hugging Face | shape | maxrs | shape |
//! |---|---|---|---|
//! | `model.embed_tokens.weight` | [V, E] | `token_embedder.embedding` | [V, E] |
//! | `model.layers.N.input_layernorm.weight` | [E] | `pre_self_attention_layer_norm.scale` | [E] |
//! | `model.layers.N.self_attn.q_proj.weight` | [H*D, E] | `self_attention.query.kernel` | [E, H, D] |
//! | `model.layers.N.self_attn.k_proj.weight` | [K*D, E] | `self_attention.key.kernel` | [E, K, D] |
//! | `model.layers.N.self_attn.v_proj.weight` | [K*D, E] | `self_attention.value.kernel` | [E, K, D] |
//! | `model.layers.N.self_attn.o_proj.weight` | [E, H*D] | `self_attention.out.kernel` | [H, D, E] |
//! | `model.layers.N.post_attention_layernorm.weight` | [E] | `post_self_attention_layer_norm.scale` | [E] |
//! | `model.layers.N.mlp.gate_proj.weight` | [M, E] | `mlp.wi_0.kernel` | [E, M] |
//! | `model.layers.N.mlp.up_proj.weight` | [M, E] | `mlp.wi_1.kernel` | [E, M] |
//! | `model.layers.N.mlp.down_proj.weight` | [E, M] | `mlp.wo.kernel` | [M, E] |
//! | `model.norm.weight` | [E] | `decoder.decoder_norm.scale` | [E] |
//! | `lm_head.weight` (absent when `tie_word_embeddings`) | [V, E] | `decoder.logits_dense.kernel` | [E, V] |
//!
//! (maxrs's layer parameters are under `decoder.layers.` stacked on a leading `[L]` axis with
//! `scan_layers=true`, or `decoder.layers_N.` without it.) A Hugging Face linear weight is
//! `[out, in]`; maxrs's kernels are `[in..., out...]`: each is a transpose plus a reshape, exact
//! in any dtype.
//!
//! **Queries and keys.** Hugging Face's Llama applies RoPE by `rotate_half`, pairing element `i`
//! of a head with element `i + D/2` (its checkpoint converter permutes Meta's interleaved
//! weights into that order once, `permute` in `convert_llama_weights_to_hf.py`). maxrs's RoPE
//! pairs the same elements (the half-split convention, `model/attention.rs`), with the same
//! frequencies `rope_theta^(-2i/D)`; so q/k weights map with no permutation. Meta's original
//! interleaved checkpoints (`consolidated.*.pth`) are not read: convert them to Hugging Face's
//! layout first.
//!
//! **Query scaling.** Both scale the attention scores by `1/sqrt(head_dim)` at run time, so the
//! query weights are copied unscaled. (MaxText's own converters fold that factor into the query
//! kernel; see `llama.rs`.)

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Result};
use serde_json::{json, Value};

use super::config::Rope;
use super::Model;
use crate::config::{self, Config, DecoderBlock};
use crate::host::HostTensor;

/// One layer's tensors: maxrs name (relative to the layer), Hugging Face name (relative to
/// `model.layers.N.`), and how many leading maxrs dimensions form the Hugging Face `in` axis
/// (`None`: copied as is).
const LAYER: &[(&str, &str, Option<usize>)] = &[
    ("pre_self_attention_layer_norm.scale", "input_layernorm.weight", None),
    ("self_attention.query.kernel", "self_attn.q_proj.weight", Some(1)),
    ("self_attention.key.kernel", "self_attn.k_proj.weight", Some(1)),
    ("self_attention.value.kernel", "self_attn.v_proj.weight", Some(1)),
    ("self_attention.out.kernel", "self_attn.o_proj.weight", Some(2)),
    ("post_self_attention_layer_norm.scale", "post_attention_layernorm.weight", None),
    ("mlp.wi_0.kernel", "mlp.gate_proj.weight", Some(1)),
    ("mlp.wi_1.kernel", "mlp.up_proj.weight", Some(1)),
    ("mlp.wo.kernel", "mlp.down_proj.weight", Some(1)),
];

const GLOBAL: &[(&str, &str, Option<usize>)] = &[
    ("token_embedder.embedding", "model.embed_tokens.weight", None),
    ("decoder.decoder_norm.scale", "model.norm.weight", None),
    ("decoder.logits_dense.kernel", "lm_head.weight", Some(1)),
];

/// maxrs configuration keys (`key=value` text) for a Hugging Face `config.json`; refuses what
/// the Llama family here does not implement, and every field it reads that has the wrong type
/// or a value out of range (errors name the field and its value; the caller names the file).
pub fn config_from_hf(hf: &Value) -> Result<Vec<(String, String)>> {
    let fields = Fields(hf);
    let block = match hf["model_type"].as_str() {
        Some("llama") => "llama2",
        Some("mistral") => "mistral",
        _ => bail!("`model_type` is {}; maxrs converts the Llama family: \"llama\", \"mistral\"", hf["model_type"]),
    };
    match fields.text("hidden_act")? {
        None | Some("silu") => {}
        Some(act) => bail!("`hidden_act` is {act:?}; the Llama family here has a SwiGLU (silu) MLP"),
    }
    if !hf["rope_scaling"].is_null() {
        bail!("`rope_scaling` is {} (Llama 3.1's long-context RoPE): not supported yet", hf["rope_scaling"]);
    }
    for bias in ["attention_bias", "mlp_bias"] {
        if fields.flag(bias)? == Some(true) {
            bail!("`{bias}` is true; the Llama family here has no biases");
        }
    }
    let emb = fields.number("hidden_size", "base_emb_dim", None)?;
    let heads = fields.number("num_attention_heads", "base_num_query_heads", None)?;
    let kv_heads = fields.number("num_key_value_heads", "base_num_kv_heads", Some(heads))?;
    if heads % kv_heads != 0 {
        bail!("`num_key_value_heads` is {kv_heads}, which does not divide `num_attention_heads` {heads}");
    }
    // Hugging Face's default head size, `hidden_size // num_attention_heads`.
    if hf["head_dim"].is_null() && emb < heads {
        bail!("`hidden_size` {emb} is smaller than `num_attention_heads` {heads}: a head would have no dimensions");
    }
    let head_dim = fields.number("head_dim", "head_dim", Some(emb / heads))?;
    let mlp = fields.number("intermediate_size", "base_mlp_dim", None)?;
    let layers = fields.number("num_hidden_layers", "base_num_decoder_layers", None)?;
    let vocab = fields.number("vocab_size", "vocab_size", None)?;
    let eps = fields.value("rms_norm_eps", "normalization_layer_epsilon", None)?;
    let theta = fields.number("rope_theta", "rope_max_timescale", Some(10000))?;
    // Mistral's banded causal mask (a key at most `window - 1` tokens back), as maxrs's mistral
    // block applies `sliding_window_size`; `null` is no window. Llama has no such field.
    let window = if block == "mistral" { fields.window()? } else { 0 };
    Ok(vec![
        ("decoder_block".into(), block.into()),
        ("base_emb_dim".into(), emb.to_string()),
        ("base_num_query_heads".into(), heads.to_string()),
        ("base_num_kv_heads".into(), kv_heads.to_string()),
        ("head_dim".into(), head_dim.to_string()),
        ("base_mlp_dim".into(), mlp.to_string()),
        ("base_num_decoder_layers".into(), layers.to_string()),
        ("vocab_size".into(), vocab.to_string()),
        ("normalization_layer_epsilon".into(), format!("{eps:e}")),
        ("rope_max_timescale".into(), theta.to_string()),
        ("logits_via_embedding".into(), fields.flag("tie_word_embeddings")?.unwrap_or(false).to_string()),
        ("mlp_activations".into(), "[silu, linear]".into()),
        ("sliding_window_size".into(), window.to_string()),
    ])
}

/// The fields of a Hugging Face `config.json`, each checked as it is read. A missing field and
/// `null` are the same to `transformers` (its config classes default both).
struct Fields<'a>(&'a Value);

impl Fields<'_> {
    /// Field `name` as a number in the range of the maxrs key `key` it becomes; `absent` when it
    /// is missing or null (`None`: required).
    fn value(&self, name: &str, key: &str, absent: Option<f64>) -> Result<f64> {
        let range = config::range(key).expect("a numeric maxrs key");
        let x = match &self.0[name] {
            Value::Null => absent.ok_or_else(|| anyhow!("`{name}` is missing; it must be {range}"))?,
            Value::Number(n) => n.as_f64().unwrap_or(f64::NAN),
            other => bail!("`{name}` is {other}; it must be {range}"),
        };
        if !range.contains(x) || (range.minus_one && x == -1.0) {
            bail!("`{name}` is {}; it must be {range} (maxrs's {key})", self.0[name]);
        }
        Ok(x)
    }

    fn number(&self, name: &str, key: &str, absent: Option<i64>) -> Result<i64> {
        Ok(self.value(name, key, absent.map(|a| a as f64))? as i64)
    }

    /// `sliding_window`: null (no window, maxrs's 0) or a positive size.
    fn window(&self) -> Result<i64> {
        let value = &self.0["sliding_window"];
        let range = config::Range { min: 1.0, ..config::range("sliding_window_size").expect("a numeric maxrs key") };
        match value.as_f64() {
            _ if value.is_null() => Ok(0),
            Some(x) if range.contains(x) => Ok(x as i64),
            _ => bail!(
                "`sliding_window` is {value}; it must be null (no window) or {range} (maxrs's sliding_window_size)"
            ),
        }
    }

    /// A boolean field; `None` when missing.
    fn flag(&self, name: &str) -> Result<Option<bool>> {
        match &self.0[name] {
            Value::Null => Ok(None),
            Value::Bool(b) => Ok(Some(*b)),
            other => bail!("`{name}` is {other}; it must be true or false"),
        }
    }

    /// A string field; `None` when missing.
    fn text(&self, name: &str) -> Result<Option<&str>> {
        match &self.0[name] {
            Value::Null => Ok(None),
            Value::String(s) => Ok(Some(s)),
            other => bail!("`{name}` is {other}; it must be a string"),
        }
    }
}

/// Refuses a model this layout does not describe: another family, Llama 3.1's RoPE (it rotates
/// interleaved pairs, Hugging Face's the two halves: the query and key weights would need a
/// permutation).
pub fn check_model(c: &Config, model: &Model) -> Result<()> {
    if !matches!(c.decoder_block, DecoderBlock::Llama2 | DecoderBlock::Mistral) {
        bail!(
            "decoder_block={}: converting {} to Hugging Face's layout is not supported yet (maxrs converts \
             the Llama family: llama2, mistral)",
            c.decoder_block,
            c.decoder_block
        );
    }
    if model.config.rope != Rope::Default {
        bail!("rope_type=llama3.1: Llama 3.1's interleaved RoPE in Hugging Face's layout is not supported yet");
    }
    Ok(())
}

/// The Hugging Face `config.json` of the model `c` describes, with weights of `torch_dtype`.
/// (`check_model` has accepted the model.)
pub fn hf_config(c: &Config, model: &Model, torch_dtype: &str) -> Value {
    let (architecture, model_type) = match c.decoder_block {
        DecoderBlock::Mistral => ("MistralForCausalLM", "mistral"),
        _ => ("LlamaForCausalLM", "llama"),
    };
    // The sizes after `global_parameter_scale`.
    let m = &model.config;
    let mut config = json!({
        "architectures": [architecture],
        "model_type": model_type,
        "hidden_size": m.emb,
        "num_attention_heads": m.heads,
        "num_key_value_heads": m.kv_heads,
        "head_dim": m.head_dim,
        "intermediate_size": m.mlp,
        "num_hidden_layers": m.layers,
        "vocab_size": m.vocab,
        "rms_norm_eps": c.normalization_layer_epsilon,
        "rope_theta": c.rope_max_timescale as f64,
        "tie_word_embeddings": c.logits_via_embedding,
        "hidden_act": "silu",
        "attention_bias": false,
        "mlp_bias": false,
        "max_position_embeddings": c.max_target_length,
        "torch_dtype": torch_dtype,
    });
    if c.decoder_block == DecoderBlock::Mistral {
        // Hugging Face's MistralConfig defaults an absent window to 4096.
        config["sliding_window"] = if c.sliding_window_size > 0 { json!(c.sliding_window_size) } else { Value::Null };
    }
    config
}

/// Every (maxrs parameter name, Hugging Face name, split), per layer for unstacked names; a
/// stacked maxrs name appears once per layer with its layer index.
fn pairs(model: &Model) -> Vec<(String, Option<i64>, String, Option<usize>)> {
    let c = &model.config;
    let mut out = Vec::new();
    for (maxrs, hf, split) in GLOBAL {
        if *maxrs == "decoder.logits_dense.kernel" && c.logits_via_embedding {
            continue;
        }
        out.push((maxrs.to_string(), None, hf.to_string(), *split));
    }
    for layer in 0..c.layers {
        for (maxrs, hf, split) in LAYER {
            let hf = format!("model.layers.{layer}.{hf}");
            if c.scan_layers {
                out.push((format!("decoder.layers.{maxrs}"), Some(layer), hf, *split));
            } else {
                out.push((format!("decoder.layers_{layer}.{maxrs}"), None, hf, *split));
            }
        }
    }
    out
}

/// `[rows, cols]` row-major -> `[cols, rows]`, any element size.
fn transpose(t: &HostTensor, rows: i64, cols: i64, dims: &[i64]) -> HostTensor {
    let size = t.ty.byte_size();
    let (rows, cols) = (rows as usize, cols as usize);
    let mut data = vec![0u8; t.data.len()];
    for r in 0..rows {
        for c in 0..cols {
            let (from, to) = ((r * cols + c) * size, (c * rows + r) * size);
            data[to..to + size].copy_from_slice(&t.data[from..from + size]);
        }
    }
    HostTensor::new(t.ty, dims, data)
}

/// maxrs parameters (names as `Model::param_defs`, no `params.` prefix) from Hugging Face
/// tensors; every expected tensor must be there with its shape, and none may be left over.
pub fn from_hf(model: &Model, hf: &BTreeMap<String, HostTensor>) -> Result<BTreeMap<String, HostTensor>> {
    let defs: BTreeMap<String, Vec<i64>> = model.param_defs().into_iter().map(|d| (d.name, d.shape)).collect();
    let mut stacked: BTreeMap<String, Vec<HostTensor>> = BTreeMap::new();
    let mut out = BTreeMap::new();
    let mut problems = Vec::new();
    let mut used = 0;
    for (name, layer, hf_name, split) in pairs(model) {
        let full = &defs[&name];
        let shape = if layer.is_some() { &full[1..] } else { &full[..] };
        let Some(t) = hf.get(&hf_name) else {
            problems.push(format!("missing {hf_name}"));
            continue;
        };
        used += 1;
        let converted = match split {
            None => (t.dims == shape).then(|| t.clone()),
            Some(k) => {
                let (inner, outer): (i64, i64) = (shape[..k].iter().product(), shape[k..].iter().product());
                (t.dims == [outer, inner]).then(|| transpose(t, outer, inner, shape))
            }
        };
        let Some(converted) = converted else {
            problems.push(format!(
                "{hf_name} is {}, expected {} elements for {name} {shape:?}",
                t.shape_string(),
                shape.iter().product::<i64>()
            ));
            continue;
        };
        match layer {
            Some(_) => stacked.entry(name).or_default().push(converted),
            None => {
                out.insert(name, converted);
            }
        }
    }
    if used < hf.len() {
        let known: Vec<String> = pairs(model).into_iter().map(|p| p.2).collect();
        let extra: Vec<&String> = hf.keys().filter(|k| !known.contains(k)).collect();
        problems.push(format!(
            "tensors the model does not have: {}",
            extra.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
        ));
    }
    if !problems.is_empty() {
        bail!("the Hugging Face checkpoint does not match the model:\n  {}", problems.join("\n  "));
    }
    for (name, layers) in stacked {
        let first = &layers[0];
        let dims = [&[layers.len() as i64][..], &first.dims].concat();
        let data = layers.iter().flat_map(|t| t.data.iter().copied()).collect();
        out.insert(name, HostTensor::new(first.ty, &dims, data));
    }
    Ok(out)
}

/// Hugging Face tensors from maxrs parameters (names as `Model::param_defs`).
pub fn to_hf(model: &Model, params: &BTreeMap<String, HostTensor>) -> Result<BTreeMap<String, HostTensor>> {
    let mut out = BTreeMap::new();
    for (name, layer, hf_name, split) in pairs(model) {
        let t = params.get(&name).ok_or_else(|| anyhow!("the maxrs parameters have no {name}"))?;
        let t = match layer {
            Some(i) => {
                let per = t.data.len() / t.dims[0] as usize;
                HostTensor::new(t.ty, &t.dims[1..], t.data[i as usize * per..(i as usize + 1) * per].to_vec())
            }
            None => t.clone(),
        };
        let converted = match split {
            None => t,
            Some(k) => {
                let (inner, outer): (i64, i64) = (t.dims[..k].iter().product(), t.dims[k..].iter().product());
                transpose(&t, inner, outer, &[outer, inner])
            }
        };
        out.insert(hf_name, converted);
    }
    Ok(out)
}
