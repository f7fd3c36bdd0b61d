//! Gemma 3's Hugging Face layout (`Gemma3ForCausalLM`, `model_type: gemma3_text`): its
//! `config.json` fields and tensor names, to and from maxrs's `gemma3` block (`model/gemma3.rs`).
//!
//! Hugging Face layer `N` is maxrs's block `N / 6`, layer `j = N % 6` (`layers_<j>.` in the block);
//! the layers after the last whole block are the `layers_remainder` block's (`Model::stacks`).
//! Unscanned, the stacks name layer `N` `decoder.layers_<N>` (`Stack::layer_param_name`).
//!
//! | Hugging Face (`model.layers.N.` / `model.`) | maxrs (in layer `layers_<j>.`) | map |
//! |---|---|---|
//! | `embed_tokens.weight` [V, E] | `token_embedder.embedding` | x sqrt(E) |
//! | `input_layernorm.weight` | `pre_self_attention_norm.scale` | + 1 |
//! | `self_attn.{q,k,v,o}_proj.weight` | `self_attention.{query,key,value,out}.kernel` | transposed, as Llama's |
//! | `self_attn.q_norm.weight` | `self_attention.query_norm.scale` | + 1 (times the query fold below) |
//! | `self_attn.k_norm.weight` | `self_attention.key_norm.scale` | + 1 |
//! | `post_attention_layernorm.weight` | `post_self_attention_norm.scale` | + 1 |
//! | `pre_feedforward_layernorm.weight` | `pre_ffw_norm.scale` | + 1 |
//! | `post_feedforward_layernorm.weight` | `post_ffw_norm.scale` | + 1 |
//! | `mlp.{gate,up,down}_proj.weight` | `mlp.{wi_0,wi_1,wo}.kernel` | transposed |
//! | `norm.weight` | `decoder.decoder_norm.scale` | + 1 |
//!
//! The value maps are those of MaxText's converter (`convert_gemma3_chkpt.py`, e591f30): Gemma's
//! `1 + w` norms and `sqrt(E)` embedding folded into the stored parameters; `lm_head` is the
//! embedding (`tie_word_embeddings`).
//!
//! `config.json`: `rope_parameters.full_attention` (or the older `rope_theta` and `rope_scaling`)
//! gives `rope_max_timescale` and, `linear`, `rope_linear_scaling_factor`;
//! `rope_parameters.sliding_attention` (or `rope_local_base_freq`) `local_rope_max_timescale`;
//! `sliding_window` `sliding_window_size`.
//!
//! **Query scaling and the model name**: MaxText multiplies Gemma 3's queries by `s^-1/2` with
//! `s` decided by the model name (`get_query_pre_attn_scalar`, `src/maxtext/models/gemma3.py:52-59`
//! at MaxText e591f30): `head_dim` for gemma3-4b and gemma3-12b, `hidden_size //
//! num_attention_heads` for gemma3-27b; it raises for any other name, and so does maxrs. A
//! checkpoint therefore converts under one of these names, with `override_model_config=true` so
//! that its keys replace the named file's (`model_name`):
//! - `query_pre_attn_scalar` equal to `hidden_size // num_attention_heads` and not to `head_dim`
//!   (Gemma 3 27B: 168 and 128): gemma3-27b, which computes that scalar itself; nothing is folded;
//! - otherwise gemma3-4b (`s = head_dim`); a `query_pre_attn_scalar` other than `head_dim` gets
//!   the difference, `sqrt(head_dim / query_pre_attn_scalar)`, folded into the query norm's gain
//!   (the query's RMSNorm comes before the scaling, so the query kernel cannot carry it). The fold
//!   is exact up to the rounding of the stored gain: the gain multiplies the normed query
//!   elementwise and RoPE and the scaling are linear, so a constant factor moves through both.
//!   Absent, `query_pre_attn_scalar` is `Gemma3TextConfig`'s default, 256.
//!
//! `to-hf` writes the `s` the model name decides.
//! Refused: `layer_types` other than 5 sliding + 1 full repeated, soft caps, an activation other
//! than `gelu_pytorch_tanh`, `use_bidirectional_attention`, untied embeddings, attention biases.

use anyhow::{bail, Result};
use serde_json::{json, Value};

use super::gemma::{self, outer_entries, NORM};
use super::llama::{common_config, common_keys};
use super::{layer_entry, Entry, Fields, Map, Revalue};
use crate::config::Config;
use crate::model::gemma::LAYER_NORM_EPS;
use crate::model::gemma3::{checked_query_pre_attn_scalar, num_layers, query_pre_attn_scalar, scalar_of_name, BLOCK};
use crate::model::Model;

/// One layer's tensors: maxrs name (in `layers_<j>.`), Hugging Face name (in `model.layers.N.`),
/// and the map (the query norm's is `query_norm`'s).
const LAYER: &[(&str, &str, Map)] = &[
    ("pre_self_attention_norm.scale", "input_layernorm.weight", NORM),
    ("self_attention.query.kernel", "self_attn.q_proj.weight", Map::linear(1)),
    ("self_attention.key.kernel", "self_attn.k_proj.weight", Map::linear(1)),
    ("self_attention.value.kernel", "self_attn.v_proj.weight", Map::linear(1)),
    ("self_attention.out.kernel", "self_attn.o_proj.weight", Map::linear(2)),
    ("self_attention.query_norm.scale", "self_attn.q_norm.weight", NORM),
    ("self_attention.key_norm.scale", "self_attn.k_norm.weight", NORM),
    ("post_self_attention_norm.scale", "post_attention_layernorm.weight", NORM),
    ("pre_ffw_norm.scale", "pre_feedforward_layernorm.weight", NORM),
    ("mlp.wi_0.kernel", "mlp.gate_proj.weight", Map::linear(1)),
    ("mlp.wi_1.kernel", "mlp.up_proj.weight", Map::linear(1)),
    ("mlp.wo.kernel", "mlp.down_proj.weight", Map::linear(1)),
    ("post_ffw_norm.scale", "post_feedforward_layernorm.weight", NORM),
];

/// The global layers' RoPE (`rope_theta`, linear factor) and the local layers' `rope_theta`,
/// from `rope_parameters` (transformers 5) or the older `rope_theta`, `rope_scaling` and
/// `rope_local_base_freq` (10000 when absent, as `Gemma3TextConfig`'s default).
fn rope(hf: &Value) -> Result<((Value, f64), Value)> {
    let parameters = &hf["rope_parameters"];
    if !parameters.is_object() {
        let local = hf.get("rope_local_base_freq").cloned().unwrap_or(json!(10000.0));
        return Ok(((hf["rope_theta"].clone(), linear_factor(&hf["rope_scaling"], "rope_scaling")?), local));
    }
    let local = &parameters["sliding_attention"];
    let kind = local.get("rope_type").and_then(|k| k.as_str()).unwrap_or("default");
    if kind != "default" {
        bail!("`rope_parameters.sliding_attention.rope_type` is {kind:?}: gemma3's local layers have the default RoPE");
    }
    let full = &parameters["full_attention"];
    Ok((
        (full["rope_theta"].clone(), linear_factor(full, "rope_parameters.full_attention")?),
        local["rope_theta"].clone(),
    ))
}

/// The factor of a `linear` RoPE scaling (1 when absent or `default`).
fn linear_factor(scaling: &Value, field: &str) -> Result<f64> {
    let kind = scaling.get("rope_type").or_else(|| scaling.get("type")).and_then(|k| k.as_str());
    match kind {
        None | Some("default") => Ok(1.0),
        Some("linear") => {
            let with = json!({ "factor": scaling["factor"] });
            Fields(&with).value("factor", "rope_linear_scaling_factor", None)
        }
        Some(other) => {
            bail!("`{field}.rope_type` is {other:?}: gemma3's global layers have the default or linear RoPE")
        }
    }
}

/// maxrs configuration keys (`key=value` text) for a Gemma 3 `config.json`.
pub fn config_from_hf(hf: &Value) -> Result<Vec<(String, String)>> {
    let fields = Fields(hf);
    match fields.text("hidden_activation")? {
        None | Some("gelu_pytorch_tanh") => {}
        Some(act) => {
            bail!("`hidden_activation` is {act:?}; maxrs's Gemma 3 MLP is GeGLU with the tanh approximation (\"gelu_pytorch_tanh\")")
        }
    }
    if fields.flag("tie_word_embeddings")? == Some(false) {
        bail!("`tie_word_embeddings` is false; maxrs's Gemma 3 ties the logits to the embedding");
    }
    fields.absent("attention_bias", "biases in Gemma 3's attention")?;
    fields.absent("use_bidirectional_attention", "bidirectional attention")?;
    fields.absent("attn_logit_softcapping", "a soft cap of Gemma 3's attention scores")?;
    fields.absent("final_logit_softcapping", "a soft cap of Gemma 3's logits")?;
    let mut keys = common_keys(&fields)?;
    let name = model_name(hf, &keys)?;
    keys.extend([("model_name".into(), name.into()), ("override_model_config".into(), "true".into())]);
    let eps = fields.value("rms_norm_eps", "normalization_layer_epsilon", Some(LAYER_NORM_EPS))?;
    if eps != LAYER_NORM_EPS {
        bail!("`rms_norm_eps` is {eps}: maxrs's Gemma layer norms use {LAYER_NORM_EPS} (as MaxText's); other values are not supported yet");
    }
    let layers = fields.number("num_hidden_layers", "base_num_decoder_layers", None)?;
    check_layer_types(hf, layers)?;
    let window = fields.window()?;
    if window == 0 {
        bail!("`sliding_window` is null: gemma3's local layers need a window");
    }
    let ((theta, factor), local) = rope(hf)?;
    let thetas = json!({ "rope_theta": theta, "local": local });
    let theta = Fields(&thetas).number("rope_theta", "rope_max_timescale", Some(10000))?;
    let local = Fields(&thetas).number("local", "local_rope_max_timescale", None)?;
    keys.extend(
        [
            ("decoder_block", "gemma3".to_string()),
            ("sliding_window_size", window.to_string()),
            ("rope_max_timescale", theta.to_string()),
            ("local_rope_max_timescale", local.to_string()),
            ("rope_linear_scaling_factor", factor.to_string()),
            ("logits_via_embedding", "true".into()),
            ("normalize_embedding_logits", "true".into()),
            ("mlp_activations", "[gelu, linear]".into()),
            ("use_post_attn_norm", "true".into()),
            ("use_post_ffw_norm", "true".into()),
        ]
        .map(|(k, v)| (k.to_string(), v)),
    );
    Ok(keys)
}

/// `Gemma3TextConfig`'s `query_pre_attn_scalar` when `config.json` has none.
const DEFAULT_QUERY_PRE_ATTN_SCALAR: f64 = 256.0;

/// The MaxText model name a checkpoint converts under (see the module header): gemma3-27b when
/// only its rule gives the checkpoint's `query_pre_attn_scalar`, else gemma3-4b.
fn model_name(hf: &Value, keys: &[(String, String)]) -> Result<&'static str> {
    let scalar = gemma::query_pre_attn_scalar(hf, DEFAULT_QUERY_PRE_ATTN_SCALAR)?;
    // `common_keys` gives these three as integers.
    let key = |k: &str| keys.iter().find(|(name, _)| name == k).and_then(|(_, v)| v.parse::<i64>().ok());
    let gives = |name: &str| {
        let (emb, heads, head_dim) = (key("base_emb_dim"), key("base_num_query_heads"), key("head_dim"));
        let s = scalar_of_name(name, emb.unwrap_or(0), heads.unwrap_or(0), head_dim.unwrap_or(0));
        s.map(|s| s as f64) == Some(scalar)
    };
    Ok(if gives("gemma3-27b") && !gives("gemma3-4b") { "gemma3-27b" } else { "gemma3-4b" })
}

/// `layer_types`, and the older `sliding_window_pattern`, when given, must be Gemma 3's: 5
/// sliding layers, then a full one, repeated.
fn check_layer_types(hf: &Value, layers: i64) -> Result<()> {
    for field in ["sliding_window_pattern", "_sliding_window_pattern"] {
        if !hf[field].is_null() && hf[field].as_i64() != Some(BLOCK) {
            bail!(
                "`{field}` is {}: maxrs's gemma3 has a full-attention layer after every 5 sliding ones ({BLOCK})",
                hf[field]
            );
        }
    }
    check_sliding_then_full(hf, layers, "gemma3", BLOCK)
}

/// `layer_types`, when given, must be `period - 1` `sliding_attention` layers, then a
/// `full_attention` one, repeated (Gemma 3's and Gemma 4's pattern of 6, Gemma 4 small's of 5 or 6;
/// `family` names the one in the refusal).
pub(super) fn check_sliding_then_full(hf: &Value, layers: i64, family: &str, period: i64) -> Result<()> {
    let Some(types) = hf["layer_types"].as_array() else { return Ok(()) };
    for i in 0..layers {
        let want = if (i + 1) % period == 0 { "full_attention" } else { "sliding_attention" };
        if types.get(i as usize).and_then(|t| t.as_str()) != Some(want) {
            bail!(
                "`layer_types[{i}]` is {}: maxrs's {family} has {} sliding_attention layers, then a full_attention one, repeated",
                types.get(i as usize).unwrap_or(&Value::Null),
                period - 1
            );
        }
    }
    Ok(())
}

/// The Hugging Face `config.json` of a gemma3 model.
pub fn hf_config(c: &Config, model: &Model, torch_dtype: &str) -> Value {
    let layers = (0..num_layers(c)).map(|i| match (i + 1) % BLOCK {
        0 => "full_attention",
        _ => "sliding_attention",
    });
    let mut config = common_config(c, model, torch_dtype);
    config["architectures"] = json!(["Gemma3ForCausalLM"]);
    config["model_type"] = json!("gemma3_text");
    config["num_hidden_layers"] = json!(num_layers(c));
    config["layer_types"] = json!(layers.collect::<Vec<_>>());
    config["hidden_activation"] = json!("gelu_pytorch_tanh");
    config["attention_bias"] = json!(false);
    config["tie_word_embeddings"] = json!(true);
    // Some: `model` exists, so its name is one `Gemma3::from_config` accepted.
    config["query_pre_attn_scalar"] = json!(query_pre_attn_scalar(c));
    config["sliding_window"] = json!(c.sliding_window_size);
    let local = if c.local_rope_max_timescale > 0 { c.local_rope_max_timescale } else { c.rope_max_timescale };
    let theta = c.rope_max_timescale as f64;
    let factor = c.rope_linear_scaling_factor;
    let full = if factor == 1.0 {
        json!({ "rope_type": "default", "rope_theta": theta })
    } else {
        json!({ "rope_type": "linear", "factor": factor, "rope_theta": theta })
    };
    config["rope_parameters"] = json!({
        "full_attention": full,
        "sliding_attention": { "rope_type": "default", "rope_theta": local as f64 },
    });
    config
}

/// Every tensor of a gemma3 model; `hf_config` is the `config.json` of a checkpoint being read
/// (`from-hf`), whose `query_pre_attn_scalar` may differ from maxrs's.
pub fn entries(c: &Config, model: &Model, hf_config: Option<&Value>) -> Result<Vec<Entry>> {
    let mut out = outer_entries(model);
    let fold = match hf_config {
        Some(hf) => {
            let ours = checked_query_pre_attn_scalar(c)? as f64;
            (ours / gemma::query_pre_attn_scalar(hf, DEFAULT_QUERY_PRE_ATTN_SCALAR)?).sqrt()
        }
        None => 1.0,
    };
    for n in 0..num_layers(c) {
        for (name, hf_name, map) in LAYER {
            let map = match (*name, fold) {
                ("self_attention.query_norm.scale", f) if f != 1.0 => Map::value(Revalue::PlusOneTimes(f)),
                _ => *map,
            };
            let name = format!("layers_{}.{name}", n % BLOCK);
            out.push(layer_entry(model, n / BLOCK, &name, &[], format!("model.layers.{n}.{hf_name}"), map));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// google/gemma-3-4b-it's text config as the hub has it (transformers 4.50's layout:
    /// `rope_theta`, `rope_scaling`, `rope_local_base_freq`) gives gemma3-4b's model file values
    /// (`models/gemma3-4b.yml`; the hub's vocabulary holds the image tokens too); what maxrs does
    /// not model is refused naming the field.
    #[test]
    fn hub_config_gives_the_model_file_and_refusals_name_the_field() {
        let hub = json!({
            "model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240,
            "num_hidden_layers": 34, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
            "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
            "rope_local_base_freq": 10000.0, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "sliding_window": 1024, "sliding_window_pattern": 6, "vocab_size": 262208,
            "hidden_activation": "gelu_pytorch_tanh", "attn_logit_softcapping": null,
            "final_logit_softcapping": null,
        });
        let keys = config_from_hf(&hub).unwrap();
        for (key, value) in [
            ("base_num_decoder_layers", "34"),
            ("head_dim", "256"),
            ("rope_max_timescale", "1000000"),
            ("local_rope_max_timescale", "10000"),
            ("rope_linear_scaling_factor", "8"),
            ("sliding_window_size", "1024"),
            ("decoder_block", "gemma3"),
        ] {
            assert!(keys.contains(&(key.into(), value.into())), "{key}={value} in {keys:?}");
        }
        let refused = |field: &str, value: Value| {
            let mut c = hub.clone();
            c[field] = value;
            config_from_hf(&c).unwrap_err().to_string()
        };
        let e = refused("layer_types", json!(vec!["sliding_attention"; 34]));
        assert!(e.contains("`layer_types[5]`"), "{e}");
        assert!(refused("final_logit_softcapping", json!(30.0)).contains("`final_logit_softcapping`"));
        assert!(
            refused("rope_scaling", json!({"rope_type": "yarn", "factor": 8.0})).contains("`rope_scaling.rope_type`")
        );
        assert!(refused("sliding_window_pattern", json!(2)).contains("`sliding_window_pattern`"));
    }

    /// The model name a checkpoint converts under (`get_query_pre_attn_scalar`,
    /// `src/maxtext/models/gemma3.py:52-59` at MaxText e591f30): Gemma 3 27B's published sizes
    /// (hidden 5376, 32 heads of 128, `query_pre_attn_scalar` 168 = 5376 // 32) give gemma3-27b,
    /// whose rule computes 168, so nothing is folded; `query_pre_attn_scalar = head_dim` gives
    /// gemma3-4b; another scalar gemma3-4b too, its difference folded into the query norm.
    #[test]
    fn the_query_scalar_decides_the_model_name() {
        let config = |scalar: Value| {
            json!({
                "model_type": "gemma3_text", "hidden_size": 5376, "intermediate_size": 21504,
                "num_hidden_layers": 62, "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 128,
                "query_pre_attn_scalar": scalar, "vocab_size": 262208, "sliding_window": 1024, "rms_norm_eps": 1e-6,
            })
        };
        let named = |scalar: Value| {
            let keys = config_from_hf(&config(scalar)).unwrap();
            assert!(keys.contains(&("override_model_config".into(), "true".into())), "{keys:?}");
            keys.into_iter().find(|(k, _)| k == "model_name").map(|(_, v)| v).unwrap()
        };
        assert_eq!(named(json!(168)), "gemma3-27b");
        assert_eq!(named(json!(168.0)), "gemma3-27b");
        assert_eq!(named(json!(128)), "gemma3-4b");
        assert_eq!(named(json!(100)), "gemma3-4b");
        // Absent: Gemma3TextConfig's 256.
        assert_eq!(named(Value::Null), "gemma3-4b");
        let e = config_from_hf(&config(json!(-1))).unwrap_err().to_string();
        assert!(e.starts_with("`query_pre_attn_scalar` is -1"), "{e}");
    }
}
