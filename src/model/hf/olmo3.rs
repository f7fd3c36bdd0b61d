//! OLMo 3's Hugging Face layout (`Olmo3ForCausalLM`, `model_type: olmo3`): its `config.json`
//! fields and tensor names, to and from maxrs's `olmo3` block (`model/olmo3.rs`), as MaxText's
//! converter maps them (`OLMO3_MAXTEXT_TO_HF_PARAM_MAPPING` and its hooks in
//! `checkpoint_conversion/utils/param_mapping.py` at MaxText e591f30: kernels transposed, norms
//! copied).
//!
//! Hugging Face layer `N` is maxrs's block `N / b`, layer `j = N % b` (`layers_<j>.` in the
//! block of `b = inhomogeneous_layer_cycle_interval` layers, 4 from a `config.json`); unscanned,
//! the stacks name it `decoder.layers_<N>`.
//!
//! | Hugging Face (`model.layers.N.` / `model.`) | maxrs (in layer `layers_<j>.`) | map |
//! |---|---|---|
//! | `embed_tokens.weight` [V, E] | `token_embedder.embedding` | copied |
//! | `self_attn.{q,k,v,o}_proj.weight` | `attention.{query,key,value,out}.kernel` | transposed |
//! | `self_attn.q_norm.weight` [H * D] | `attention.query_norm.scale` | copied |
//! | `self_attn.k_norm.weight` [K * D] | `attention.key_norm.scale` | copied |
//! | `post_attention_layernorm.weight` | `post_self_attention_layer_norm.scale` | copied |
//! | `mlp.{gate,up,down}_proj.weight` | `mlp.{wi_0,wi_1,wo}.kernel` | transposed |
//! | `post_feedforward_layernorm.weight` | `post_mlp_layer_norm.scale` | copied |
//! | `norm.weight`, `lm_head.weight` | `decoder.decoder_norm.scale`, `decoder.logits_dense.kernel` | as Llama's |
//!
//! `config.json`: `rope_theta` and `rope_scaling` (or transformers 5's `rope_parameters`, whose
//! `full_attention` entry holds the scaling) give `rope_type` default or yarn with its keys
//! (YaRN's attention factor `0.1 ln(factor) + 1`: `rope_attention_scaling=true`); `to-hf` writes
//! `rope_parameters` for both kinds of layer (from `rope_theta` alone transformers 5.23's
//! `Olmo3Config` gives the sliding layers its default base, 500000, not `rope_theta`);
//! `sliding_window` `sliding_window_size`; `layer_types` must be OLMo 3's 3 sliding + 1 full.
//!
//! **YaRN and the sliding layers**: MaxText's `olmo3.py` (e591f30) applies the one RoPE to every
//! layer, as transformers 4 did; transformers 5 (`Olmo3RotaryEmbedding`, 5.23.0) gives the
//! sliding layers the default RoPE and YaRN to the full ones only. maxrs computes MaxText's model,
//! so a YaRN checkpoint (OLMo 3 7B Instruct, 32B) converts to it as MaxText's converter does, and
//! its sliding layers differ from transformers 5's; without `rope_scaling` (the pre-training
//! revisions, `olmo3-7b-pt`) the two agree (`tests/convert_families.rs`).

use anyhow::{bail, Result};
use serde_json::{json, Value};

use super::llama::{common_config, common_keys, outer_entries};
use super::{layer_entry, Entry, Fields, Map};
use crate::config::{Config, RopeType};
use crate::model::olmo3::PATTERN;
use crate::model::Model;

/// One layer's tensors: maxrs name (in `layers_<j>.`), Hugging Face name (in `model.layers.N.`).
const LAYER: &[(&str, &str, Map)] = &[
    ("attention.query.kernel", "self_attn.q_proj.weight", Map::linear(1)),
    ("attention.key.kernel", "self_attn.k_proj.weight", Map::linear(1)),
    ("attention.value.kernel", "self_attn.v_proj.weight", Map::linear(1)),
    ("attention.out.kernel", "self_attn.o_proj.weight", Map::linear(2)),
    ("attention.query_norm.scale", "self_attn.q_norm.weight", Map::COPY),
    ("attention.key_norm.scale", "self_attn.k_norm.weight", Map::COPY),
    ("post_self_attention_layer_norm.scale", "post_attention_layernorm.weight", Map::COPY),
    ("mlp.wi_0.kernel", "mlp.gate_proj.weight", Map::linear(1)),
    ("mlp.wi_1.kernel", "mlp.up_proj.weight", Map::linear(1)),
    ("mlp.wo.kernel", "mlp.down_proj.weight", Map::linear(1)),
    ("post_mlp_layer_norm.scale", "post_feedforward_layernorm.weight", Map::COPY),
];

/// `rope_theta` and the scaling (`None`: default RoPE), from `rope_parameters` (transformers 5:
/// the full-attention layers' entry; the sliding layers' must be default RoPE of the same base)
/// or the older `rope_theta` and `rope_scaling`.
fn rope(hf: &Value) -> Result<(Value, Option<(&'static str, Value)>)> {
    let parameters = &hf["rope_parameters"];
    let (theta, scaling, field) = if parameters.is_object() {
        let (full, sliding) = (&parameters["full_attention"], &parameters["sliding_attention"]);
        let kind = sliding.get("rope_type").and_then(|k| k.as_str()).unwrap_or("default");
        if kind != "default" || sliding["rope_theta"] != full["rope_theta"] {
            bail!(
                "`rope_parameters.sliding_attention` is {sliding}: MaxText's olmo3 has one RoPE base for every layer; the sliding layers' must be default RoPE with the full layers' rope_theta"
            );
        }
        (full["rope_theta"].clone(), full.clone(), "rope_parameters.full_attention")
    } else {
        (hf["rope_theta"].clone(), hf["rope_scaling"].clone(), "rope_scaling")
    };
    let kind = scaling.get("rope_type").or_else(|| scaling.get("type")).and_then(|k| k.as_str());
    match kind {
        None | Some("default") => Ok((theta, None)),
        Some("yarn") => Ok((theta, Some((field, scaling)))),
        Some(other) => bail!("`{field}.rope_type` is {other:?}: maxrs's olmo3 has the default RoPE or YaRN"),
    }
}

/// The YaRN keys of `family`'s `rope_scaling` (olmo3, gpt_oss) whose attention factor is
/// transformers' default, `0.1 ln(factor) + 1` (MaxText's `rope_attention_scaling`).
pub(super) fn yarn_keys(family: &str, field: &str, scaling: &Value) -> Result<Vec<(String, String)>> {
    for name in ["attention_factor", "mscale", "mscale_all_dim"] {
        if !scaling[name].is_null() {
            bail!("`{field}.{name}` is {}: maxrs's {family} YaRN has transformers' default attention factor; setting it is not supported yet", scaling[name]);
        }
    }
    let s = Fields(scaling);
    let original = s.number("original_max_position_embeddings", "original_max_position_embeddings", None)?;
    let factor = s.value("factor", "rope_factor", None)?;
    // `beta_fast or 32`, `beta_slow or 1`: transformers' defaults.
    let beta_fast = s.value("beta_fast", "beta_fast", Some(32.0))?;
    let beta_slow = s.value("beta_slow", "beta_slow", Some(1.0))?;
    let truncate = s.flag("truncate")?.unwrap_or(true);
    Ok([
        ("rope_type", "yarn".to_string()),
        ("rope_factor", factor.to_string()),
        ("original_max_position_embeddings", original.to_string()),
        ("beta_fast", beta_fast.to_string()),
        ("beta_slow", beta_slow.to_string()),
        ("rope_truncate", truncate.to_string()),
        ("rope_attention_scaling", "true".into()),
        ("rope_interleave", "false".into()),
    ]
    .map(|(k, v)| (k.to_string(), v))
    .to_vec())
}

/// maxrs configuration keys (`key=value` text) for an OLMo 3 `config.json`, under
/// `model_name=olmo3-7b` (MaxText picks olmo3's whole-width QK-norm by the name).
pub fn config_from_hf(hf: &Value) -> Result<Vec<(String, String)>> {
    let fields = Fields(hf);
    match fields.text("hidden_act")? {
        None | Some("silu") => {}
        Some(act) => bail!("`hidden_act` is {act:?}; maxrs's OLMo 3 MLP is SwiGLU (\"silu\")"),
    }
    if fields.flag("tie_word_embeddings")? == Some(true) {
        bail!("`tie_word_embeddings` is true: tied OLMo 3 logits are not supported yet (MaxText's olmo3 files are untied)");
    }
    fields.absent("attention_bias", "biases in OLMo 3's attention")?;
    let mut keys =
        vec![("model_name".to_string(), "olmo3-7b".to_string()), ("override_model_config".into(), "true".into())];
    keys.extend(common_keys(&fields)?);
    let layers = fields.number("num_hidden_layers", "base_num_decoder_layers", None)?;
    if layers % PATTERN != 0 {
        bail!("`num_hidden_layers` is {layers}: maxrs's olmo3 scans blocks of 4 layers (3 sliding, 1 full); other counts are not supported yet");
    }
    if let Some(types) = hf["layer_types"].as_array() {
        for i in 0..layers {
            let want = if (i + 1) % PATTERN == 0 { "full_attention" } else { "sliding_attention" };
            if types.get(i as usize).and_then(|t| t.as_str()) != Some(want) {
                bail!(
                    "`layer_types[{i}]` is {}: maxrs's olmo3 has 3 sliding_attention layers, then a full_attention one, repeated",
                    types.get(i as usize).unwrap_or(&Value::Null)
                );
            }
        }
    }
    let window = fields.window()?;
    if window == 0 {
        bail!("`sliding_window` is null: olmo3's sliding layers need a window");
    }
    let (theta, scaling) = rope(hf)?;
    let with_theta = json!({ "rope_theta": theta });
    let theta = Fields(&with_theta).number("rope_theta", "rope_max_timescale", Some(10000))?;
    let positions = fields.number("max_position_embeddings", "max_position_embeddings", None)?;
    keys.extend(
        [
            ("decoder_block", "olmo3".to_string()),
            ("inhomogeneous_layer_cycle_interval", PATTERN.to_string()),
            ("use_qk_norm", "true".into()),
            ("sliding_window_size", window.to_string()),
            ("rope_max_timescale", theta.to_string()),
            ("max_position_embeddings", positions.to_string()),
            ("mlp_activations", "[silu, linear]".into()),
            ("logits_via_embedding", "false".into()),
        ]
        .map(|(k, v)| (k.to_string(), v)),
    );
    match scaling {
        None => keys.push(("rope_type".into(), "default".into())),
        Some((field, scaling)) => keys.extend(yarn_keys("olmo3", field, &scaling)?),
    }
    Ok(keys)
}

/// Refuses an olmo3 model Hugging Face's `Olmo3ForCausalLM` cannot express.
pub fn check_model(c: &Config) -> Result<()> {
    if c.logits_via_embedding {
        bail!("logits_via_embedding=true: converting tied OLMo 3 logits is not supported yet");
    }
    if c.rope_type == RopeType::Yarn && (c.rope_interleave || !c.rope_attention_scaling) {
        bail!(
            "rope_interleave={} rope_attention_scaling={}: Hugging Face's OLMo 3 YaRN rotates the two halves and scales by 0.1 ln(factor) + 1 (rope_interleave=false rope_attention_scaling=true)",
            c.rope_interleave,
            c.rope_attention_scaling
        );
    }
    if c.rope_type == RopeType::Default && c.rope_linear_scaling_factor != 1.0 {
        bail!(
            "rope_linear_scaling_factor={}: converting a linear RoPE scaling of olmo3 is not supported yet",
            c.rope_linear_scaling_factor
        );
    }
    Ok(())
}

/// The Hugging Face `config.json` of an olmo3 model.
pub fn hf_config(c: &Config, model: &Model, torch_dtype: &str) -> Value {
    let layers = (0..model.config.layers).map(|i| match (i + 1) % PATTERN {
        0 => "full_attention",
        _ => "sliding_attention",
    });
    let mut config = common_config(c, model, torch_dtype);
    config["architectures"] = json!(["Olmo3ForCausalLM"]);
    config["model_type"] = json!("olmo3");
    config["layer_types"] = json!(layers.collect::<Vec<_>>());
    config["hidden_act"] = json!("silu");
    config["attention_bias"] = json!(false);
    config["tie_word_embeddings"] = json!(false);
    config["sliding_window"] = json!(c.sliding_window_size);
    // transformers 5's `rope_parameters`, both kinds of layer stated: from `rope_theta` alone its
    // `Olmo3Config` (5.23.0) gives the sliding layers its default base, 500000.
    let theta = c.rope_max_timescale as f64;
    let full = rope_parameters(c, &mut config);
    config["rope_parameters"] = json!({
        "full_attention": full,
        "sliding_attention": { "rope_type": "default", "rope_theta": theta },
    });
    config
}

/// Every tensor of an olmo3 model (blocks of `inhomogeneous_layer_cycle_interval` layers).
pub fn entries(c: &Config, model: &Model) -> Vec<Entry> {
    cycled_entries(c, model, LAYER)
}

/// Every tensor of a model whose scanned blocks are `inhomogeneous_layer_cycle_interval` layers
/// (`layers_<j>` of block `b` is Hugging Face's layer `b * interval + j`), each layer's as
/// `layer` maps them (OLMo 3, gpt-oss).
pub(super) fn cycled_entries(c: &Config, model: &Model, layer: &[(&str, &str, Map)]) -> Vec<Entry> {
    let mut out = outer_entries(model);
    let block = c.inhomogeneous_layer_cycle_interval;
    for n in 0..model.config.layers {
        for (name, hf_name, map) in layer {
            let name = format!("layers_{}.{name}", n % block);
            out.push(layer_entry(model, n / block, &name, &[], format!("model.layers.{n}.{hf_name}"), *map));
        }
    }
    out
}

/// transformers 5's `rope_parameters` of the run's RoPE (`yarn` or `default`, as
/// [`crate::model::mla::yarn_or_default_rope`] takes them); YaRN also sets `config`'s
/// `max_position_embeddings`, the length its table covers (OLMo 3, gpt-oss).
pub(super) fn rope_parameters(c: &Config, config: &mut Value) -> Value {
    let theta = c.rope_max_timescale as f64;
    match c.rope_type {
        RopeType::Yarn => {
            config["max_position_embeddings"] = json!(c.max_position_embeddings);
            json!({
                "rope_type": "yarn",
                "rope_theta": theta,
                "factor": c.rope_factor,
                "original_max_position_embeddings": c.original_max_position_embeddings,
                "beta_fast": c.beta_fast,
                "beta_slow": c.beta_slow,
                "truncate": c.rope_truncate,
            })
        }
        _ => json!({ "rope_type": "default", "rope_theta": theta }),
    }
}
