//! Gemma's and Gemma 2's Hugging Face layout (`GemmaForCausalLM`, `Gemma2ForCausalLM`): their
//! `config.json` fields and tensor names, to and from maxrs's `gemma` and `gemma2` blocks.
//!
//! | Hugging Face (`model.layers.N.` / `model.`) | maxrs (in layer or pair) | map |
//! |---|---|---|
//! | `embed_tokens.weight` [V, E] | `token_embedder.embedding` | x sqrt(E) |
//! | `input_layernorm.weight` | `pre_self_attention_norm.scale` | + 1 |
//! | `self_attn.q_proj.weight` | `self_attention.query.kernel` | transposed, x `query_pre_attn_scalar^-1/2` |
//! | `self_attn.{k,v,o}_proj.weight` | `self_attention.{key,value,out}.kernel` | transposed, as Llama's |
//! | `post_attention_layernorm.weight` (Gemma) | `pre_ffw_norm.scale` | + 1 |
//! | `post_attention_layernorm.weight` (Gemma 2) | `post_self_attention_norm.scale` | + 1 |
//! | `pre_feedforward_layernorm.weight` (Gemma 2) | `pre_ffw_norm.scale` | + 1 |
//! | `post_feedforward_layernorm.weight` (Gemma 2) | `post_ffw_norm.scale` | + 1 |
//! | `mlp.{gate,up,down}_proj.weight` | `mlp.{wi_0,wi_1,wo}.kernel` | transposed |
//! | `norm.weight` | `decoder.decoder_norm.scale` | + 1 |
//!
//! The value maps are Gemma's reparametrizations as MaxText stores them (see `model/gemma.rs`:
//! its converter `convert_gemma_chkpt.py` folds `sqrt(E)` into the embedding and `1 +` into the
//! norm scales); the tied logits divide the folded factor out again. Gemma 2's Hugging Face
//! layers `2p` (sliding window) and `2p + 1` (global) are maxrs's pair `p`'s `_local` and
//! `_global` halves (`Gemma2Config.layer_types`: `sliding_attention` for even layers).
//!
//! **Query scaling.** Hugging Face's Gemma scales scores by `head_dim^-1/2`, its Gemma 2 by
//! `query_pre_attn_scalar^-1/2`; maxrs's queries are not scaled at run time, the factor being
//! folded into the query kernel as MaxText's (`model/gemma.rs`). So `from-hf` multiplies the query
//! weights by that factor (`query_pre_attn_scalar` being `head_dim` when absent; Gemma 2 27B's
//! is 144 where its head_dim is 128), as MaxText's converters do (`convert_gemma_chkpt.py`:
//! `head_dim**-0.5`, `convert_gemma2_chkpt.py`: its `query_pre_attn_scalar`, in
//! `checkpoint_conversion/standalone_scripts/` at MaxText e591f30); `to-hf` divides by
//! `head_dim^-1/2` and writes `query_pre_attn_scalar = head_dim`. Both compute in f64 and round to
//! f32 once, so a round trip may move a query weight by one f32 rounding.

use anyhow::{bail, Result};
use serde_json::{json, Value};

use super::llama::{common_config, common_keys, rope_fields};
use super::{layer_entry, Entry, Fields, Map, Revalue};
use crate::config::{Config, DecoderBlock};
use crate::model::gemma::LAYER_NORM_EPS;
use crate::model::Model;

pub(super) const NORM: Map = Map::value(Revalue::PlusOne);

/// maxrs configuration keys (`key=value` text) for a Gemma or Gemma 2 `config.json`.
pub fn config_from_hf(hf: &Value) -> Result<Vec<(String, String)>> {
    let fields = Fields(hf);
    let gemma2 = hf["model_type"] == "gemma2";
    // transformers' GemmaMLP / Gemma2MLP use `hidden_activation` when set, else `hidden_act`
    // (Gemma's original configs say "gelu" there and mean the tanh approximation).
    let act = match fields.text("hidden_activation")? {
        Some(act) => ("hidden_activation", act),
        None => ("hidden_act", fields.text("hidden_act")?.unwrap_or("gelu_pytorch_tanh")),
    };
    let tanh = act.1 == "gelu_pytorch_tanh" || (act.0 == "hidden_act" && act.1 == "gelu");
    if !tanh {
        bail!(
            "`{}` is {:?}; maxrs's Gemma MLP is GeGLU with the tanh approximation (\"gelu_pytorch_tanh\")",
            act.0,
            act.1
        );
    }
    if fields.flag("attention_bias")? == Some(true) {
        bail!("`attention_bias` is true; Gemma here has no biases");
    }
    if fields.flag("tie_word_embeddings")? == Some(false) {
        bail!("`tie_word_embeddings` is false; maxrs's Gemma ties the logits to the embedding");
    }
    let mut keys = common_keys(&fields)?;
    // The layer norms use MaxText's RMSNorm default (see `model/gemma.rs`).
    let eps = fields.value("rms_norm_eps", "normalization_layer_epsilon", Some(LAYER_NORM_EPS))?;
    if eps != LAYER_NORM_EPS {
        bail!("`rms_norm_eps` is {eps}: maxrs's Gemma layer norms use {LAYER_NORM_EPS} (as MaxText's); other values are not supported yet");
    }
    let (theta, scaling) = rope_fields(hf);
    if let Some((field, value)) = scaling {
        bail!("`{field}` is {value}: RoPE scaling for Gemma is not supported yet");
    }
    let with_theta = json!({ "rope_theta": theta });
    let theta = Fields(&with_theta).number("rope_theta", "rope_max_timescale", Some(10000))?;
    keys.push(("rope_max_timescale".into(), theta.to_string()));
    keys.push(("decoder_block".into(), if gemma2 { "gemma2" } else { "gemma" }.into()));
    keys.push(("logits_via_embedding".into(), "true".into()));
    keys.push(("normalize_embedding_logits".into(), "true".into()));
    keys.push(("mlp_activations".into(), "[gelu, linear]".into()));
    if gemma2 {
        let layers = fields.number("num_hidden_layers", "base_num_decoder_layers", None)?;
        if layers % 2 != 0 {
            bail!("`num_hidden_layers` is {layers}: maxrs's gemma2 has (local, global) pairs of layers; an odd count is not supported yet");
        }
        check_layer_types(hf, layers)?;
        keys.retain(|(k, _)| k != "base_num_decoder_layers");
        keys.push(("base_num_decoder_layers".into(), (layers / 2).to_string()));
        let window = fields.window()?;
        if window == 0 {
            bail!("`sliding_window` is null: gemma2's local layers need a window");
        }
        keys.push(("sliding_window_size".into(), window.to_string()));
        for (field, key) in
            [("attn_logit_softcapping", "attn_logits_soft_cap"), ("final_logit_softcapping", "final_logits_soft_cap")]
        {
            let cap = if hf[field].is_null() { 0.0 } else { fields.value(field, key, None)? };
            keys.push((key.into(), cap.to_string()));
        }
        keys.push(("use_post_attn_norm".into(), "true".into()));
        keys.push(("use_post_ffw_norm".into(), "true".into()));
    } else {
        fields.absent("sliding_window", "a sliding window in Gemma")?;
    }
    Ok(keys)
}

/// Gemma 2's `layer_types`, when given, must alternate sliding and full attention from a
/// sliding first layer (the only pattern maxrs's pairs have).
fn check_layer_types(hf: &Value, layers: i64) -> Result<()> {
    let Some(types) = hf["layer_types"].as_array() else { return Ok(()) };
    for i in 0..layers as usize {
        let want = if i % 2 == 0 { "sliding_attention" } else { "full_attention" };
        if types.get(i).and_then(|t| t.as_str()) != Some(want) {
            bail!("`layer_types[{i}]` is {}: maxrs's gemma2 alternates sliding_attention and full_attention layers, sliding first", types.get(i).unwrap_or(&Value::Null));
        }
    }
    Ok(())
}

/// The checkpoint's `query_pre_attn_scalar` (its queries are scaled by its `^-1/2`), `absent`
/// when it has none.
pub(super) fn query_pre_attn_scalar(hf: &Value, absent: f64) -> Result<f64> {
    let scalar = &hf["query_pre_attn_scalar"];
    match scalar.as_f64() {
        None if scalar.is_null() => Ok(absent),
        Some(s) if s > 0.0 && s.is_finite() => Ok(s),
        _ => bail!("`query_pre_attn_scalar` is {scalar}; it must be a positive number"),
    }
}

/// The Hugging Face `config.json` of a gemma or gemma2 model.
pub fn hf_config(c: &Config, model: &Model, torch_dtype: &str) -> Value {
    let gemma2 = c.decoder_block == DecoderBlock::Gemma2;
    let mut config = common_config(c, model, torch_dtype);
    config["architectures"] = json!([if gemma2 { "Gemma2ForCausalLM" } else { "GemmaForCausalLM" }]);
    config["model_type"] = json!(if gemma2 { "gemma2" } else { "gemma" });
    config["hidden_activation"] = json!("gelu_pytorch_tanh");
    config["hidden_act"] = json!("gelu_pytorch_tanh");
    config["attention_bias"] = json!(false);
    config["tie_word_embeddings"] = json!(true);
    config["rope_theta"] = json!(c.rope_max_timescale as f64);
    if gemma2 {
        config["num_hidden_layers"] = json!(2 * model.config.layers);
        config["query_pre_attn_scalar"] = json!(model.config.head_dim);
        config["sliding_window"] = json!(c.sliding_window_size);
        let cap = |x: f64| if x > 0.0 { json!(x) } else { Value::Null };
        config["attn_logit_softcapping"] = cap(c.attn_logits_soft_cap);
        config["final_logit_softcapping"] = cap(c.final_logits_soft_cap);
    }
    config
}

/// The tensors of one Gemma layer (`suffix` "" for Gemma, `_local` / `_global` for a Gemma 2
/// pair's half) from Hugging Face's layer `hf_layer`.
fn layer(model: &Model, pair: i64, hf_layer: i64, suffix: &str, query: Map, gemma2: bool, out: &mut Vec<Entry>) {
    let norms: &[(&str, &str)] = if gemma2 {
        &[
            ("pre_self_attention_norm", "input_layernorm"),
            ("post_self_attention_norm", "post_attention_layernorm"),
            ("pre_ffw_norm", "pre_feedforward_layernorm"),
            ("post_ffw_norm", "post_feedforward_layernorm"),
        ]
    } else {
        &[("pre_self_attention_norm", "input_layernorm"), ("pre_ffw_norm", "post_attention_layernorm")]
    };
    let hf = |name: &str| format!("model.layers.{hf_layer}.{name}");
    for (name, hf_name) in norms {
        out.push(layer_entry(
            model,
            pair,
            &format!("{name}{suffix}.scale"),
            &[],
            hf(&format!("{hf_name}.weight")),
            NORM,
        ));
    }
    let linears = [
        ("self_attention", "query", "self_attn.q_proj", query),
        ("self_attention", "key", "self_attn.k_proj", Map::linear(1)),
        ("self_attention", "value", "self_attn.v_proj", Map::linear(1)),
        ("self_attention", "out", "self_attn.o_proj", Map::linear(2)),
        ("mlp", "wi_0", "mlp.gate_proj", Map::linear(1)),
        ("mlp", "wi_1", "mlp.up_proj", Map::linear(1)),
        ("mlp", "wo", "mlp.down_proj", Map::linear(1)),
    ];
    for (block, name, hf_name, map) in linears {
        out.push(layer_entry(
            model,
            pair,
            &format!("{block}{suffix}.{name}.kernel"),
            &[],
            hf(&format!("{hf_name}.weight")),
            map,
        ));
    }
}

/// The tensors outside the layers of a Gemma family model: the embedding (x sqrt(E)) and the final
/// norm.
pub(super) fn outer_entries(model: &Model) -> Vec<Entry> {
    let emb_scale = (model.config.emb as f64).sqrt();
    vec![
        Entry {
            maxrs: "token_embedder.embedding".into(),
            slot: vec![],
            hf: "model.embed_tokens.weight".into(),
            map: Map::value(Revalue::Scale(emb_scale)),
        },
        Entry { maxrs: "decoder.decoder_norm.scale".into(), slot: vec![], hf: "model.norm.weight".into(), map: NORM },
    ]
}

/// `Gemma2Config`'s `query_pre_attn_scalar` when `config.json` has none.
const GEMMA2_DEFAULT_QUERY_PRE_ATTN_SCALAR: f64 = 256.0;

/// Every tensor of a gemma or gemma2 model. `query_pre_attn_scalar` comes from the checkpoint
/// being read (`from-hf`); maxrs's own models have `head_dim`'s.
pub fn entries(c: &Config, model: &Model, hf_config: Option<&Value>) -> Result<Vec<Entry>> {
    let m = &model.config;
    let mut out = outer_entries(model);
    let head_dim = m.head_dim as f64;
    // Gemma's attention scales by `head_dim^-1/2`; Gemma 2's by its `query_pre_attn_scalar`, whose
    // default in transformers' `Gemma2Config` is 256.
    let absent = match c.decoder_block {
        DecoderBlock::Gemma2 => GEMMA2_DEFAULT_QUERY_PRE_ATTN_SCALAR,
        _ => head_dim,
    };
    let scalar = match hf_config {
        Some(hf) => query_pre_attn_scalar(hf, absent)?,
        None => head_dim,
    };
    let query = Map { value: Revalue::Scale(scalar.powf(-0.5)), ..Map::linear(1) };
    for pair in 0..m.layers {
        if c.decoder_block == DecoderBlock::Gemma2 {
            layer(model, pair, 2 * pair, "_local", query, true, &mut out);
            layer(model, pair, 2 * pair + 1, "_global", query, true, &mut out);
        } else {
            layer(model, pair, pair, "", query, false, &mut out);
        }
    }
    Ok(out)
}
