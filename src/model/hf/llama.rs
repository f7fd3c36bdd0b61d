//! The Llama family's Hugging Face layout (`LlamaForCausalLM` for Llama 2, 3, 3.1 and 3.3,
//! `MistralForCausalLM`, `MixtralForCausalLM`): its `config.json` fields and tensor names, to and
//! from maxrs's `llama2`, `mistral` and `mixtral` blocks; and `Qwen3ForCausalLM` /
//! `Qwen3MoeForCausalLM` (maxrs's `qwen3` / `qwen3_moe`: Llama's tensors plus
//! `self_attn.q_norm.weight` / `k_norm.weight` [D] as `self_attention.query_norm.scale` /
//! `key_norm.scale`; Qwen3 MoE's experts as Mixtral's below, named `mlp.gate.weight` and
//! `mlp.experts.J.{gate,up,down}_proj.weight`, maxrs's `moe_block.*`); and `Qwen2ForCausalLM`
//! (maxrs's `qwen2`, Qwen2.5: Llama's tensors plus `self_attn.{q,k,v}_proj.bias` [H*D], [K*D],
//! [K*D] as `self_attention.{query,key,value}.bias` [H, D], [K, D], [K, D]; transformers'
//! `Qwen2Attention` always has these three biases and none on `o_proj`, and its queries are
//! scaled at run time, as MaxText's qwen2 layer and maxrs's, so nothing is folded).
//!
//! | Hugging Face | shape | maxrs | shape |
//! |---|---|---|---|
//! | `model.embed_tokens.weight` | [V, E] | `token_embedder.embedding` | [V, E] |
//! | `model.layers.N.input_layernorm.weight` | [E] | `pre_self_attention_layer_norm.scale` | [E] |
//! | `model.layers.N.self_attn.q_proj.weight` | [H*D, E] | `self_attention.query.kernel` (x D^-1/2 but Qwen's) | [E, H, D] |
//! | `model.layers.N.self_attn.k_proj.weight` | [K*D, E] | `self_attention.key.kernel` | [E, K, D] |
//! | `model.layers.N.self_attn.v_proj.weight` | [K*D, E] | `self_attention.value.kernel` | [E, K, D] |
//! | `model.layers.N.self_attn.o_proj.weight` | [E, H*D] | `self_attention.out.kernel` | [H, D, E] |
//! | `model.layers.N.post_attention_layernorm.weight` | [E] | `post_self_attention_layer_norm.scale` | [E] |
//! | `model.layers.N.mlp.gate_proj.weight` | [M, E] | `mlp.wi_0.kernel` | [E, M] |
//! | `model.layers.N.mlp.up_proj.weight` | [M, E] | `mlp.wi_1.kernel` | [E, M] |
//! | `model.layers.N.mlp.down_proj.weight` | [E, M] | `mlp.wo.kernel` | [M, E] |
//! | Mixtral: `model.layers.N.block_sparse_moe.gate.weight` | [X, E] | `MoeBlock_0.gate.kernel` | [E, X] |
//! | Mixtral: `...block_sparse_moe.experts.J.w1.weight` | [M, E] | `MoeBlock_0.wi_0[J]` | [E, M] |
//! | Mixtral: `...block_sparse_moe.experts.J.w3.weight` | [M, E] | `MoeBlock_0.wi_1[J]` | [E, M] |
//! | Mixtral: `...block_sparse_moe.experts.J.w2.weight` | [E, M] | `MoeBlock_0.wo[J]` | [M, E] |
//! | `model.norm.weight` | [E] | `decoder.decoder_norm.scale` | [E] |
//! | `lm_head.weight` (absent when `tie_word_embeddings`) | [V, E] | `decoder.logits_dense.kernel` | [E, V] |
//!
//! (maxrs's layer parameters are under `decoder.layers.` stacked on a leading `[L]` axis with
//! `scan_layers=true`, or `decoder.layers_N.` without it.)
//!
//! **Queries and keys.** Hugging Face's Llama applies RoPE by `rotate_half`, pairing element `i`
//! of a head with element `i + D/2` (its converter permutes Meta's interleaved weights into that
//! order once, `permute` in `convert_llama_weights_to_hf.py`). maxrs's default RoPE pairs the
//! same elements with the same frequencies `rope_theta^(-2i/D)`, so q/k weights map with no
//! permutation. Llama 3.1's RoPE in maxrs (as MaxText's `LLaMARotaryEmbedding`) rotates
//! interleaved pairs `(2i, 2i + 1)`, as Meta's checkpoints are laid out: a checkpoint with
//! `rope_scaling` of type `llama3` becomes `rope_type=llama3.1` with its q/k rows permuted back
//! to Meta's order, and `to-hf` permutes them forward again (exact both ways).
//!
//! **Query scaling.** Hugging Face scales the attention scores by `1/sqrt(head_dim)` at run time;
//! maxrs's llama2, mistral and mixtral layers, as MaxText's, fold it into the query kernel
//! (`model/llama.rs`), so `from-hf` multiplies their query weights by `head_dim^-1/2` and `to-hf`
//! divides by it, in f64 rounded to f32 once (a round trip may move a query weight by one f32
//! rounding), as MaxText's converters fold it (`scale_query_layer` in
//! `checkpoint_conversion/utils/param_mapping.py` at MaxText e591f30: `1/np.sqrt(head_dim)` as an
//! f32). maxrs's Qwen layers scale at run time, as MaxText's and Hugging Face's: copied as they are.

use anyhow::{bail, Result};
use serde_json::{json, Value};

use super::{layer_entry, Entry, Fields, Map, Revalue};
use crate::config::{Config, DecoderBlock};
use crate::model::config::Rope;
use crate::model::Model;

/// One layer's attention tensors: maxrs name (relative to the layer), Hugging Face name
/// (relative to `model.layers.N.`), map (Llama 4's layers too).
pub(super) const ATTENTION: &[(&str, &str, Map)] = &[
    ("pre_self_attention_layer_norm.scale", "input_layernorm.weight", Map::COPY),
    ("self_attention.query.kernel", "self_attn.q_proj.weight", Map::linear(1)),
    ("self_attention.key.kernel", "self_attn.k_proj.weight", Map::linear(1)),
    ("self_attention.value.kernel", "self_attn.v_proj.weight", Map::linear(1)),
    ("self_attention.out.kernel", "self_attn.o_proj.weight", Map::linear(2)),
    ("post_self_attention_layer_norm.scale", "post_attention_layernorm.weight", Map::COPY),
];

const MLP: &[(&str, &str, Map)] = &[
    ("mlp.wi_0.kernel", "mlp.gate_proj.weight", Map::linear(1)),
    ("mlp.wi_1.kernel", "mlp.up_proj.weight", Map::linear(1)),
    ("mlp.wo.kernel", "mlp.down_proj.weight", Map::linear(1)),
];

/// Llama 3.1's `rope_scaling` (its `config.json`), which maxrs's `rope_type=llama3.1` computes
/// (`llama31_scaled_frequency`, MaxText's `LLaMARotaryEmbedding` constants).
pub(super) const LLAMA31_SCALING: [(&str, f64); 4] = [
    ("factor", 8.0),
    ("low_freq_factor", 1.0),
    ("high_freq_factor", 4.0),
    ("original_max_position_embeddings", 8192.0),
];

/// `rope_theta` and the RoPE scaling of a config: `transformers` 5 writes both into
/// `rope_parameters` (`{"rope_type": "default", "rope_theta": ...}`), earlier versions and most
/// published checkpoints as `rope_theta` and `rope_scaling`. Returns the field name the scaling
/// was read from with it.
pub fn rope_fields(hf: &Value) -> (Value, Option<(&'static str, &Value)>) {
    let parameters = &hf["rope_parameters"];
    if parameters.is_object() {
        let kind = parameters.get("rope_type").or_else(|| parameters.get("type"));
        let scaled = !matches!(kind.and_then(|k| k.as_str()), None | Some("default"));
        return (parameters["rope_theta"].clone(), scaled.then_some(("rope_parameters", parameters)));
    }
    let scaling = &hf["rope_scaling"];
    (hf["rope_theta"].clone(), (!scaling.is_null()).then_some(("rope_scaling", scaling)))
}

/// maxrs configuration keys (`key=value` text) for a Llama, Mistral or Mixtral `config.json`.
pub fn config_from_hf(hf: &Value) -> Result<Vec<(String, String)>> {
    let fields = Fields(hf);
    let block = match hf["model_type"].as_str() {
        Some("mistral") => "mistral",
        Some("mixtral") => "mixtral",
        Some("qwen2") => "qwen2",
        Some("qwen3") => "qwen3",
        Some("qwen3_moe") => "qwen3_moe",
        _ => "llama2",
    };
    match fields.text("hidden_act")? {
        None | Some("silu") => {}
        Some(act) => bail!("`hidden_act` is {act:?}; the Llama family here has a SwiGLU (silu) MLP"),
    }
    // Qwen2's q/k/v biases are not a config field: transformers' `Qwen2Attention` always has them.
    let biases: &[&str] = if block == "qwen2" { &["mlp_bias"] } else { &["attention_bias", "mlp_bias"] };
    for &bias in biases {
        if fields.flag(bias)? == Some(true) {
            bail!("`{bias}` is true; the Llama family here has no biases");
        }
    }
    let mut keys = common_keys(&fields)?;
    let (theta, scaling) = rope_fields(hf);
    let with_theta = serde_json::json!({ "rope_theta": theta });
    let theta = Fields(&with_theta).number("rope_theta", "rope_max_timescale", Some(10000))?;
    keys.push(("rope_max_timescale".into(), theta.to_string()));
    if let Some((field, scaling)) = scaling {
        llama31_scaling(field, scaling)?;
        keys.push(("rope_type".into(), "llama3.1".into()));
    }
    keys.push(("decoder_block".into(), block.into()));
    let tied = fields.flag("tie_word_embeddings")?.unwrap_or(block == "qwen3");
    let qwen3 = block.starts_with("qwen3");
    keys.push(("logits_via_embedding".into(), tied.to_string()));
    if tied {
        // Tied logits are the plain product with the embedding (no 1/sqrt(emb)).
        keys.push(("normalize_embedding_logits".into(), "false".into()));
    }
    keys.push(("mlp_activations".into(), "[silu, linear]".into()));
    match block {
        // Mistral's banded causal mask (a key at most `window - 1` tokens back), as maxrs's
        // mistral block applies `sliding_window_size`; `null` is no window.
        "mistral" => keys.push(("sliding_window_size".into(), fields.window()?.to_string())),
        "mixtral" => {
            if fields.window()? != 0 {
                bail!(
                    "`sliding_window` is {}: maxrs's mixtral attends over the whole sequence; not supported yet",
                    hf["sliding_window"]
                );
            }
            fields.absent("router_jitter_noise", "noise on the router logits in training")?;
            let experts = fields.number("num_local_experts", "num_experts", None)?;
            let k = fields.number("num_experts_per_tok", "num_experts_per_tok", None)?;
            if k > experts {
                bail!("`num_experts_per_tok` is {k}, more than `num_local_experts` {experts}");
            }
            keys.push(("num_experts".into(), experts.to_string()));
            keys.push(("num_experts_per_tok".into(), k.to_string()));
        }
        _ => {}
    }
    if (qwen3 || block == "qwen2") && fields.flag("use_sliding_window")? == Some(true) {
        bail!("`use_sliding_window` is true: Qwen's sliding-window layers are not supported yet");
    }
    if qwen3 {
        keys.push(("use_qk_norm".into(), "true".into()));
    }
    if block == "qwen2" {
        keys.push(("attention_bias".into(), "true".into()));
    }
    if block == "qwen3_moe" {
        keys.extend(qwen3_moe_keys(&fields)?);
    }
    Ok(keys)
}

/// A Qwen3 MoE config's expert keys: every layer routed (`decoder_sparse_step` 1, no
/// `mlp_only_layers`) with renormalized top-k weights (`norm_topk_prob`), the experts
/// `moe_intermediate_size` wide (maxrs's `base_mlp_dim`, replacing `intermediate_size`'s).
fn qwen3_moe_keys(fields: &Fields) -> Result<Vec<(String, String)>> {
    let hf = fields.0;
    if fields.number("decoder_sparse_step", "num_experts", Some(1))? != 1 {
        bail!(
            "`decoder_sparse_step` is {}: maxrs's qwen3_moe routes every layer; not supported yet",
            hf["decoder_sparse_step"]
        );
    }
    if hf["mlp_only_layers"].as_array().is_some_and(|a| !a.is_empty()) {
        bail!("`mlp_only_layers` is {}: dense layers among qwen3_moe's are not supported yet", hf["mlp_only_layers"]);
    }
    if fields.flag("norm_topk_prob")? == Some(false) {
        bail!("`norm_topk_prob` is false: maxrs's router renormalizes the top-k weights; not supported yet");
    }
    let experts = fields.number("num_experts", "num_experts", None)?;
    let k = fields.number("num_experts_per_tok", "num_experts_per_tok", None)?;
    if k > experts {
        bail!("`num_experts_per_tok` is {k}, more than `num_experts` {experts}");
    }
    let width = fields.number("moe_intermediate_size", "base_mlp_dim", None)?;
    Ok(vec![
        ("num_experts".into(), experts.to_string()),
        ("num_experts_per_tok".into(), k.to_string()),
        ("base_mlp_dim".into(), width.to_string()),
    ])
}

/// The sizes every family's config has, as maxrs keys.
pub fn common_keys(fields: &Fields) -> Result<Vec<(String, String)>> {
    let emb = fields.number("hidden_size", "base_emb_dim", None)?;
    let heads = fields.number("num_attention_heads", "base_num_query_heads", None)?;
    let kv_heads = fields.number("num_key_value_heads", "base_num_kv_heads", Some(heads))?;
    if heads % kv_heads != 0 {
        bail!("`num_key_value_heads` is {kv_heads}, which does not divide `num_attention_heads` {heads}");
    }
    // Hugging Face's default head size, `hidden_size // num_attention_heads`.
    if fields.0["head_dim"].is_null() && emb < heads {
        bail!("`hidden_size` {emb} is smaller than `num_attention_heads` {heads}: a head would have no dimensions");
    }
    let head_dim = fields.number("head_dim", "head_dim", Some(emb / heads))?;
    let mlp = fields.number("intermediate_size", "base_mlp_dim", None)?;
    let layers = fields.number("num_hidden_layers", "base_num_decoder_layers", None)?;
    let vocab = fields.number("vocab_size", "vocab_size", None)?;
    let eps = fields.value("rms_norm_eps", "normalization_layer_epsilon", None)?;
    Ok(vec![
        ("base_emb_dim".into(), emb.to_string()),
        ("base_num_query_heads".into(), heads.to_string()),
        ("base_num_kv_heads".into(), kv_heads.to_string()),
        ("head_dim".into(), head_dim.to_string()),
        ("base_mlp_dim".into(), mlp.to_string()),
        ("base_num_decoder_layers".into(), layers.to_string()),
        ("vocab_size".into(), vocab.to_string()),
        ("normalization_layer_epsilon".into(), format!("{eps:e}")),
    ])
}

/// Accepts Llama 3.1's RoPE scaling (`rope_type` `llama3` with Llama 3.1's constants), naming
/// the first field that differs.
pub(super) fn llama31_scaling(field: &str, scaling: &Value) -> Result<()> {
    let kind = scaling.get("rope_type").or_else(|| scaling.get("type")).cloned().unwrap_or(Value::Null);
    if kind != "llama3" {
        bail!("`{field}.rope_type` is {kind}: maxrs has Llama 3.1's RoPE scaling (\"llama3\"); other RoPE scalings are not supported yet");
    }
    for (name, want) in LLAMA31_SCALING {
        if scaling[name].as_f64() != Some(want) {
            bail!(
                "`{field}.{name}` is {}: maxrs's Llama 3.1 RoPE has {name} {want} (MaxText's constants); other values are not supported yet",
                scaling[name]
            );
        }
    }
    Ok(())
}

/// The Hugging Face `config.json` of a llama2, mistral or mixtral model.
pub fn hf_config(c: &Config, model: &Model, torch_dtype: &str) -> Value {
    let (architecture, model_type) = match c.decoder_block {
        DecoderBlock::Mistral => ("MistralForCausalLM", "mistral"),
        DecoderBlock::Mixtral => ("MixtralForCausalLM", "mixtral"),
        DecoderBlock::Qwen2 => ("Qwen2ForCausalLM", "qwen2"),
        DecoderBlock::Qwen3 => ("Qwen3ForCausalLM", "qwen3"),
        DecoderBlock::Qwen3Moe => ("Qwen3MoeForCausalLM", "qwen3_moe"),
        _ => ("LlamaForCausalLM", "llama"),
    };
    let mut config = common_config(c, model, torch_dtype);
    config["architectures"] = json!([architecture]);
    config["model_type"] = json!(model_type);
    config["hidden_act"] = json!("silu");
    // Qwen2Config has no `attention_bias` (its q/k/v biases are always there: `check_model`).
    if c.decoder_block != DecoderBlock::Qwen2 {
        config["attention_bias"] = json!(false);
    }
    config["mlp_bias"] = json!(false);
    config["tie_word_embeddings"] = json!(c.logits_via_embedding);
    config["rope_theta"] = json!(c.rope_max_timescale as f64);
    if model.config.rope == (Rope::Llama31 { use_scale: true }) {
        // As Llama 3.1's config.json has them: the context length an integer, the factors floats.
        let number = |k: &str, v: f64| if k.starts_with("original") { json!(v as i64) } else { json!(v) };
        let mut scaling: serde_json::Map<String, Value> =
            LLAMA31_SCALING.iter().map(|(k, v)| (k.to_string(), number(k, *v))).collect();
        scaling.insert("rope_type".into(), json!("llama3"));
        config["rope_scaling"] = Value::Object(scaling);
    }
    match c.decoder_block {
        // Hugging Face's MistralConfig defaults an absent window to 4096.
        DecoderBlock::Mistral => {
            config["sliding_window"] =
                if c.sliding_window_size > 0 { json!(c.sliding_window_size) } else { Value::Null }
        }
        DecoderBlock::Mixtral => {
            config["sliding_window"] = Value::Null;
            config["num_local_experts"] = json!(c.num_experts);
            config["num_experts_per_tok"] = json!(c.num_experts_per_tok);
        }
        DecoderBlock::Qwen2 => config["use_sliding_window"] = json!(false),
        DecoderBlock::Qwen3Moe => {
            config["num_experts"] = json!(c.num_experts);
            config["num_experts_per_tok"] = json!(c.num_experts_per_tok);
            config["moe_intermediate_size"] = json!(model.config.mlp);
            config["norm_topk_prob"] = json!(true);
            config["decoder_sparse_step"] = json!(1);
            config["mlp_only_layers"] = json!([]);
        }
        _ => {}
    }
    config
}

/// The fields every family's `config.json` has (the sizes after `global_parameter_scale`).
pub fn common_config(c: &Config, model: &Model, torch_dtype: &str) -> Value {
    let m = &model.config;
    json!({
        "hidden_size": m.emb,
        "num_attention_heads": m.heads,
        "num_key_value_heads": m.kv_heads,
        "head_dim": m.head_dim,
        "intermediate_size": m.mlp,
        "num_hidden_layers": m.layers,
        "vocab_size": m.vocab,
        "rms_norm_eps": c.normalization_layer_epsilon,
        "max_position_embeddings": c.max_target_length,
        "torch_dtype": torch_dtype,
    })
}

/// The embedding, the final norm and (untied) `lm_head`, as Llama's (DeepSeek-V3's too).
pub fn outer_entries(model: &Model) -> Vec<Entry> {
    let mut out = vec![
        Entry {
            maxrs: "token_embedder.embedding".into(),
            slot: vec![],
            hf: "model.embed_tokens.weight".into(),
            map: Map::COPY,
        },
        Entry {
            maxrs: "decoder.decoder_norm.scale".into(),
            slot: vec![],
            hf: "model.norm.weight".into(),
            map: Map::COPY,
        },
    ];
    if !model.config.logits_via_embedding {
        out.push(Entry {
            maxrs: "decoder.logits_dense.kernel".into(),
            slot: vec![],
            hf: "lm_head.weight".into(),
            map: Map::linear(1),
        });
    }
    out
}

/// Every tensor of a llama2, mistral or mixtral model.
pub fn entries(c: &Config, model: &Model) -> Vec<Entry> {
    let m = &model.config;
    let mut out = outer_entries(model);
    let interleave = matches!(m.rope, Rope::Llama31 { .. }).then_some(m.head_dim);
    // The families whose query kernel holds the queries' scale (`blocks::QueryScale::Folded`;
    // tests/convert_families.rs checks each family's logits against transformers').
    let folded = matches!(c.decoder_block, DecoderBlock::Llama2 | DecoderBlock::Mistral | DecoderBlock::Mixtral);
    for layer in 0..m.layers {
        let hf = |name: &str| format!("model.layers.{layer}.{name}");
        for (name, hf_name, map) in ATTENTION {
            let mut map = *map;
            if name.ends_with("query.kernel") || name.ends_with("key.kernel") {
                map.interleave_heads = interleave;
            }
            if name.ends_with("query.kernel") && folded {
                map.value = Revalue::Scale((m.head_dim as f64).powf(-0.5));
            }
            out.push(layer_entry(model, layer, name, &[], hf(hf_name), map));
        }
        if c.decoder_block == DecoderBlock::Qwen2 {
            for (name, hf_name) in [("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")] {
                let (name, hf_name) = (format!("self_attention.{name}.bias"), hf(&format!("self_attn.{hf_name}.bias")));
                out.push(layer_entry(model, layer, &name, &[], hf_name, Map::FLAT));
            }
        }
        if c.use_qk_norm {
            for (name, hf_name) in [("query_norm", "q_norm"), ("key_norm", "k_norm")] {
                let (name, hf_name) =
                    (format!("self_attention.{name}.scale"), hf(&format!("self_attn.{hf_name}.weight")));
                out.push(layer_entry(model, layer, &name, &[], hf_name, Map::COPY));
            }
        }
        // The experts: Mixtral's names, or Qwen3 MoE's (its MLP's names per expert).
        let (block, hf_block, names) = match c.decoder_block {
            DecoderBlock::Mixtral => ("MoeBlock_0", "block_sparse_moe", ["w1", "w3", "w2"]),
            DecoderBlock::Qwen3Moe => ("moe_block", "mlp", ["gate_proj", "up_proj", "down_proj"]),
            _ => {
                for (name, hf_name, map) in MLP {
                    out.push(layer_entry(model, layer, name, &[], hf(hf_name), *map));
                }
                continue;
            }
        };
        let gate = (format!("{block}.gate.kernel"), hf(&format!("{hf_block}.gate.weight")));
        out.push(layer_entry(model, layer, &gate.0, &[], gate.1, Map::linear(1)));
        for expert in 0..c.num_experts {
            for (name, hf_name) in ["wi_0", "wi_1", "wo"].iter().zip(names) {
                let hf_name = hf(&format!("{hf_block}.experts.{expert}.{hf_name}.weight"));
                out.push(layer_entry(model, layer, &format!("{block}.{name}"), &[expert], hf_name, Map::linear(1)));
            }
        }
    }
    out
}
