//! Llama 4's Hugging Face text layout (`Llama4ForCausalLM`, `model_type: llama4_text`): its
//! `config.json` fields and tensor names, to and from maxrs's `llama4` block (`model/llama4.rs`).
//! The multimodal `Llama4ForConditionalGeneration` (`model_type: llama4`) is refused: maxrs has no
//! vision encoder.
//!
//! Hugging Face layer `N` is maxrs's block `N / b`, layer `j = N % b` (`layers_<j>.` in the block
//! of `b = inhomogeneous_layer_cycle_interval` layers); unscanned, the stacks name it
//! `decoder.layers_<N>`. Experts `X`, their width `M` (`intermediate_size`), the dense layers'
//! `intermediate_size_mlp`:
//!
//! | Hugging Face (`model.layers.N.` / `model.`) | maxrs (in layer `layers_<j>.`) | map |
//! |---|---|---|
//! | `embed_tokens.weight`, `norm.weight`, `lm_head.weight` | as Llama's | |
//! | `input_layernorm.weight` | `pre_self_attention_layer_norm.scale` | copied |
//! | `self_attn.{q,k,v,o}_proj.weight` | `self_attention.{query,key,value,out}.kernel` | transposed |
//! | `post_attention_layernorm.weight` | `post_self_attention_layer_norm.scale` | copied |
//! | `feed_forward.{gate,up,down}_proj.weight` (dense layer) | `mlp.{wi_0,wi_1,wo}.kernel` | transposed |
//! | `feed_forward.router.weight` [X, E] | `Llama4MoEBlock_0.MoeBlock_0.gate.kernel` [E, X] | transposed |
//! | `feed_forward.experts.gate_up_proj` [X, E, 2M] | `….MoeBlock_0.wi_0`, `wi_1` [X, E, M] | first, second half |
//! | `feed_forward.experts.down_proj` [X, M, E] | `….MoeBlock_0.wo` | copied |
//! | `feed_forward.shared_expert.{gate,up,down}_proj.weight` | `….shared_experts.{wi_0,wi_1,wo}.kernel` | transposed |
//!
//! (transformers' `Llama4TextExperts.forward` takes the gate from the first half of
//! `gate_up_proj`'s columns, the up-projection from the second; `Llama4TextAttention` rotates
//! interleaved pairs (`apply_rotary_emb`, complex numbers), as maxrs's Llama 3.1 RoPE does, so
//! the query and key rows are not permuted; its queries are scaled at run time, as MaxText's
//! llama4 scales them (`query_pre_attn_scalar`), so nothing is folded. `models/llama4/` in
//! transformers 5.23.0.)
//!
//! `config.json`: `no_rope_layers` and `moe_layers` must follow MaxText's patterns
//! (`nope_layer_interval` from `no_rope_layer_interval`, `interleave_moe_layer_step`), and
//! `layer_types` chunked attention in the RoPE layers and full attention in the others;
//! `attention_chunk_size` is `chunk_attn_window_size`; `attn_temperature_tuning`
//! `temperature_tuning`, whose `floor_scale` and `attn_scale` must be MaxText's 8192 and 0.1;
//! `rope_parameters` (or `rope_theta`, `rope_scaling`) Llama 3.1's scaling (`rope_use_scale`) or
//! none; one expert a token and one shared expert, as MaxText's llama4 has them.

use anyhow::{bail, Result};
use serde_json::{json, Value};

use super::llama::{
    common_config, common_keys, llama31_scaling, outer_entries, rope_fields, ATTENTION, LLAMA31_SCALING,
};
use super::{layer_entry, Entry, Fields, Map};
use crate::config::{Config, RopeType};
use crate::model::llama4::{is_moe_layer, is_nope_layer, TEMPERATURE_FLOOR, TEMPERATURE_SCALE};
use crate::model::Model;

/// A dense layer's MLP.
const DENSE: &[(&str, &str, Map)] = &[
    ("mlp.wi_0.kernel", "feed_forward.gate_proj.weight", Map::linear(1)),
    ("mlp.wi_1.kernel", "feed_forward.up_proj.weight", Map::linear(1)),
    ("mlp.wo.kernel", "feed_forward.down_proj.weight", Map::linear(1)),
];

/// An MoE layer's block.
const MOE: &[(&str, &str, Map)] = &[
    ("Llama4MoEBlock_0.MoeBlock_0.gate.kernel", "feed_forward.router.weight", Map::linear(1)),
    ("Llama4MoEBlock_0.MoeBlock_0.wi_0", "feed_forward.experts.gate_up_proj", Map::half(0)),
    ("Llama4MoEBlock_0.MoeBlock_0.wi_1", "feed_forward.experts.gate_up_proj", Map::half(1)),
    ("Llama4MoEBlock_0.MoeBlock_0.wo", "feed_forward.experts.down_proj", Map::COPY),
    ("Llama4MoEBlock_0.shared_experts.wi_0.kernel", "feed_forward.shared_expert.gate_proj.weight", Map::linear(1)),
    ("Llama4MoEBlock_0.shared_experts.wi_1.kernel", "feed_forward.shared_expert.up_proj.weight", Map::linear(1)),
    ("Llama4MoEBlock_0.shared_experts.wo.kernel", "feed_forward.shared_expert.down_proj.weight", Map::linear(1)),
];

fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// maxrs configuration keys (`key=value` text) for a Llama 4 text `config.json`.
pub fn config_from_hf(hf: &Value) -> Result<Vec<(String, String)>> {
    let fields = Fields(hf);
    match fields.text("hidden_act")? {
        None | Some("silu") => {}
        Some(act) => bail!("`hidden_act` is {act:?}; Llama 4's MLPs are SwiGLU (silu)"),
    }
    if fields.flag("attention_bias")? == Some(true) {
        bail!(
            "`attention_bias` is true: Llama 4 with attention biases is not supported yet (MaxText's llama4 has none)"
        );
    }
    if fields.flag("tie_word_embeddings")? == Some(true) {
        bail!("`tie_word_embeddings` is true: tied Llama 4 logits are not supported yet (MaxText's llama4 files are untied)");
    }
    fields.absent("router_jitter_noise", "noise on the router logits in training")?;
    // `intermediate_size` is the experts' width, `intermediate_size_mlp` the dense layers'.
    let mut keys: Vec<(String, String)> =
        common_keys(&fields)?.into_iter().filter(|(k, _)| k != "base_mlp_dim").collect();
    let layers = fields.number("num_hidden_layers", "base_num_decoder_layers", None)?;
    let moe_mlp = fields.number("intermediate_size", "base_moe_mlp_dim", Some(8192))?;
    let mlp = fields.number("intermediate_size_mlp", "base_mlp_dim", Some(16384))?;
    let experts = fields.number("num_local_experts", "num_experts", Some(16))?;
    if fields.number("num_experts_per_tok", "num_experts_per_tok", Some(1))? != 1 {
        bail!(
            "`num_experts_per_tok` is {}: MaxText's llama4 routes a token to one expert; more are not supported yet",
            hf["num_experts_per_tok"]
        );
    }
    let step = fields.number("interleave_moe_layer_step", "interleave_moe_layer_step", Some(1))?;
    if let Some(listed) = hf["moe_layers"].as_array() {
        let want: Vec<i64> = (0..layers).filter(|n| is_moe_layer(*n, step)).collect();
        if listed.iter().map(|v| v.as_i64()).collect::<Vec<_>>() != want.iter().map(|n| Some(*n)).collect::<Vec<_>>() {
            bail!(
                "`moe_layers` is {}: maxrs's llama4 has an MoE layer every `interleave_moe_layer_step` ({step}) layers, {want:?}; other layers are not supported yet",
                hf["moe_layers"]
            );
        }
    }
    let interval = fields.number("no_rope_layer_interval", "nope_layer_interval", Some(4))?;
    if let Some(listed) = hf["no_rope_layers"].as_array().filter(|l| !l.is_empty()) {
        for n in 0..layers {
            let want = if is_nope_layer(n, interval) { 0 } else { 1 };
            if listed.get(n as usize).and_then(|v| v.as_i64()) != Some(want) {
                bail!(
                    "`no_rope_layers[{n}]` is {}: maxrs's llama4 has no RoPE in every `no_rope_layer_interval` ({interval})th layer only",
                    listed.get(n as usize).unwrap_or(&Value::Null)
                );
            }
        }
    }
    if let Some(types) = hf["layer_types"].as_array() {
        for n in 0..layers {
            let want = if is_nope_layer(n, interval) { "full_attention" } else { "chunked_attention" };
            if types.get(n as usize).and_then(|t| t.as_str()) != Some(want) {
                bail!(
                    "`layer_types[{n}]` is {}: maxrs's llama4 attends within chunks in its RoPE layers and fully in its NoPE layers",
                    types.get(n as usize).unwrap_or(&Value::Null)
                );
            }
        }
    }
    let chunk = match &hf["attention_chunk_size"] {
        Value::Null if interval == 1 => 0,
        Value::Null => bail!("`attention_chunk_size` is null: maxrs's llama4 RoPE layers attend within chunks; set it"),
        _ => fields.number("attention_chunk_size", "chunk_attn_window_size", None)?,
    };
    let tuning = fields.flag("attn_temperature_tuning")?.unwrap_or(true);
    for (name, want) in [("floor_scale", TEMPERATURE_FLOOR), ("attn_scale", TEMPERATURE_SCALE)] {
        let value = hf[name].as_f64().unwrap_or(want);
        if tuning && value != want {
            bail!("`{name}` is {}: MaxText's llama4 tunes the temperature with {name} {want}; other values are not supported yet", hf[name]);
        }
    }
    // MaxText scans blocks in which both patterns repeat: their least common multiple.
    let block = if interval > 0 { interval / gcd(interval, step) * step } else { step };
    if layers % block != 0 {
        bail!(
            "`num_hidden_layers` is {layers}: maxrs's llama4 scans blocks of {block} layers (no_rope_layer_interval {interval}, interleave_moe_layer_step {step}), which must divide it"
        );
    }
    let (theta, scaling) = rope_fields(hf);
    let with_theta = json!({ "rope_theta": theta });
    let theta = Fields(&with_theta).number("rope_theta", "rope_max_timescale", Some(500000))?;
    if let Some((field, scaling)) = scaling {
        llama31_scaling(field, scaling)?;
    }
    let qk_norm = fields.flag("use_qk_norm")?.unwrap_or(true);
    keys.extend(
        [
            ("decoder_block", "llama4".to_string()),
            ("base_mlp_dim", mlp.to_string()),
            ("base_moe_mlp_dim", moe_mlp.to_string()),
            ("num_experts", experts.to_string()),
            ("num_experts_per_tok", "1".into()),
            ("shared_experts", "1".into()),
            ("interleave_moe_layer_step", step.to_string()),
            ("nope_layer_interval", interval.to_string()),
            ("inhomogeneous_layer_cycle_interval", block.to_string()),
            ("chunk_attn_window_size", chunk.to_string()),
            ("temperature_tuning", tuning.to_string()),
            ("use_qk_norm", qk_norm.to_string()),
            ("rope_max_timescale", theta.to_string()),
            // transformers rotates Llama 4's interleaved pairs, scaled or not.
            ("rope_type", "llama3.1".into()),
            ("rope_use_scale", scaling.is_some().to_string()),
            ("logits_via_embedding", "false".into()),
            ("mlp_activations", "[silu, linear]".into()),
        ]
        .map(|(k, v)| (k.to_string(), v)),
    );
    Ok(keys)
}

/// Refuses a llama4 model Hugging Face's `Llama4ForCausalLM` cannot express.
pub fn check_model(c: &Config) -> Result<()> {
    if c.logits_via_embedding {
        bail!("logits_via_embedding=true: converting tied Llama 4 logits is not supported yet");
    }
    if c.mlp_activations != ["silu", "linear"] {
        bail!(
            "mlp_activations=[{}]: Hugging Face's Llama 4 MLPs are SwiGLU ([silu, linear])",
            c.mlp_activations.join(", ")
        );
    }
    if c.shared_experts != 1 {
        bail!("shared_experts={}: Hugging Face's Llama 4 has one shared expert in each MoE layer", c.shared_experts);
    }
    if c.rope_type != RopeType::Llama31 {
        bail!(
            "rope_type={}: Hugging Face's Llama 4 rotates interleaved pairs (rope_type=llama3.1, with rope_use_scale for its scaling)",
            c.rope_type
        );
    }
    Ok(())
}

/// The Hugging Face `config.json` of a llama4 model.
pub fn hf_config(c: &Config, model: &Model, torch_dtype: &str) -> Value {
    let m = &model.config;
    let (interval, step) = (c.nope_layer_interval, c.interleave_moe_layer_step);
    let mut config = common_config(c, model, torch_dtype);
    config["architectures"] = json!(["Llama4ForCausalLM"]);
    config["model_type"] = json!("llama4_text");
    config["hidden_act"] = json!("silu");
    config["attention_bias"] = json!(false);
    config["tie_word_embeddings"] = json!(false);
    config["intermediate_size"] =
        json!(c.base_moe_mlp_dim.max(0) << crate::config::parameter_scales(c.global_parameter_scale).2);
    config["intermediate_size_mlp"] = json!(m.mlp);
    config["num_local_experts"] = json!(c.num_experts);
    config["num_experts_per_tok"] = json!(1);
    config["interleave_moe_layer_step"] = json!(step);
    config["moe_layers"] = json!((0..m.layers).filter(|n| is_moe_layer(*n, step)).collect::<Vec<_>>());
    config["no_rope_layer_interval"] = json!(interval.max(0));
    config["no_rope_layers"] = json!((0..m.layers).map(|n| i64::from(!is_nope_layer(n, interval))).collect::<Vec<_>>());
    let types = (0..m.layers).map(|n| if is_nope_layer(n, interval) { "full_attention" } else { "chunked_attention" });
    config["layer_types"] = json!(types.collect::<Vec<_>>());
    config["attention_chunk_size"] =
        if c.chunk_attn_window_size > 0 { json!(c.chunk_attn_window_size) } else { Value::Null };
    config["use_qk_norm"] = json!(c.use_qk_norm);
    config["attn_temperature_tuning"] = json!(c.temperature_tuning);
    config["floor_scale"] = json!(TEMPERATURE_FLOOR as i64);
    config["attn_scale"] = json!(TEMPERATURE_SCALE);
    let theta = c.rope_max_timescale as f64;
    config["rope_parameters"] = match c.rope_use_scale {
        true => {
            let mut p: serde_json::Map<String, Value> =
                LLAMA31_SCALING.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
            p.insert("rope_type".into(), json!("llama3"));
            p.insert("rope_theta".into(), json!(theta));
            Value::Object(p)
        }
        false => json!({ "rope_type": "default", "rope_theta": theta }),
    };
    config
}

/// Every tensor of a llama4 model (blocks of `inhomogeneous_layer_cycle_interval` layers).
pub fn entries(c: &Config, model: &Model) -> Vec<Entry> {
    let mut out = outer_entries(model);
    let block = c.inhomogeneous_layer_cycle_interval;
    for n in 0..model.config.layers {
        let ffn = if is_moe_layer(n, c.interleave_moe_layer_step) { MOE } else { DENSE };
        for (name, hf_name, map) in ATTENTION.iter().chain(ffn) {
            let name = format!("layers_{}.{name}", n % block);
            out.push(layer_entry(model, n / block, &name, &[], format!("model.layers.{n}.{hf_name}"), *map));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Llama 4 text config of 4 layers (NoPE every 4th, MoE every 2nd) converts to the keys of
    /// one block of 4; each field maxrs does not model is refused by name, on one line.
    #[test]
    fn config_fields_convert_and_refusals_name_the_field() {
        let hf = json!({
            "model_type": "llama4_text", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16, "intermediate_size": 32, "intermediate_size_mlp": 96, "num_hidden_layers": 4,
            "vocab_size": 128, "rms_norm_eps": 1e-5, "num_local_experts": 4, "interleave_moe_layer_step": 2,
            "no_rope_layer_interval": 4, "attention_chunk_size": 8, "rope_theta": 500000.0,
        });
        let keys = config_from_hf(&hf).unwrap();
        for (key, value) in [
            ("base_mlp_dim", "96"),
            ("base_moe_mlp_dim", "32"),
            ("inhomogeneous_layer_cycle_interval", "4"),
            ("chunk_attn_window_size", "8"),
            ("rope_use_scale", "false"),
            ("use_qk_norm", "true"),
        ] {
            assert!(keys.contains(&(key.to_string(), value.to_string())), "{key}={value}: {keys:?}");
        }
        let refused = |field: &str, value: Value, want: &str| {
            let mut c = hf.clone();
            c[field] = value;
            let err = super::super::config_from_hf(&c).unwrap_err().to_string();
            assert!(err.starts_with(want) && !err.contains('\n'), "{field}: {err}");
        };
        refused("num_experts_per_tok", json!(2), "`num_experts_per_tok` is 2");
        refused("moe_layers", json!([0, 1, 2, 3]), "`moe_layers` is [0,1,2,3]");
        refused("no_rope_layers", json!([1, 0, 1, 0]), "`no_rope_layers[1]` is 0");
        refused("layer_types", json!(vec!["full_attention"; 4]), "`layer_types[0]` is \"full_attention\"");
        refused("floor_scale", json!(4), "`floor_scale` is 4");
        refused("attention_chunk_size", Value::Null, "`attention_chunk_size` is null");
        refused("num_hidden_layers", json!(6), "`num_hidden_layers` is 6");
        refused("model_type", json!("llama4"), "`model_type` is \"llama4\"");
    }
}
