//! Gemma 4's Hugging Face layout (`Gemma4ForCausalLM`, `model_type: gemma4_text`; the language
//! model of `Gemma4ForConditionalGeneration`, `model_type: gemma4`, whose `text_config` it reads):
//! its `config.json` fields and tensor names, to and from maxrs's `gemma4` and `gemma4_small` blocks
//! (`model/gemma4.rs`, `model/gemma4_small.rs`), as MaxText's converter maps them
//! (`GEMMA4_MAXTEXT_TO_HF_PARAM_MAPPING`, `GEMMA4_SMALL_MAXTEXT_TO_HF_PARAM_MAPPING` and
//! its hooks, `src/maxtext/checkpoint_conversion/utils/param_mapping.py` at e591f30).
//!
//! Hugging Face layer `N` is maxrs's layer `N` unscanned (`decoder.layers_<N>`); scanned, the
//! tensors go through the unscanned layout and are stacked as `Gemma4ScannableBlock` stacks them
//! (`scanned_blocks.local_layers` / `global_layer`, `model/gemma4.rs`).
//!
//! | Hugging Face (`model.layers.N.` / `model.`) | maxrs (in `decoder.layers_<N>.`) | map |
//! |---|---|---|
//! | `embed_tokens.weight` [V, E] | `token_embedder.embedding` | x sqrt(E) |
//! | `input_layernorm` | `pre_self_attention_norm.scale` | copied (no `+ 1`) |
//! | `post_attention_layernorm` | `post_self_attention_norm.scale` | copied |
//! | `{pre,post}_feedforward_layernorm` | `{pre,post}_ffw_norm.scale` | copied |
//! | `self_attn.{q,k,v,o}_proj.weight` (no `v_proj` if shared) | `self_attention.{query,...}.kernel` | transposed |
//! | `self_attn.{q,k}_norm.weight` | `self_attention.{query,key}_norm.scale` | copied |
//! | `mlp.{gate,up,down}_proj.weight` | `mlp.{wi_0,wi_1,wo}.kernel` (experts: `shared_experts`) | transposed |
//! | `router.proj.weight` [X, E] | `mlp.moe_block.MoeBlock_0.gate.kernel` | transposed |
//! | `router.scale` | `mlp.pre_forward_scale_2` | copied |
//! | `router.per_expert_scale` | `mlp.moe_block.MoeBlock_0.per_expert_scale` | copied |
//! | `experts.gate_up_proj` [X, 2M, E] | `MoeBlock_0.wi_0`, `wi_1` [X, E, M] | each expert's rows, halves, transposed |
//! | `experts.down_proj` [X, E, M] | `MoeBlock_0.wo` [X, M, E] | each expert transposed |
//! | `pre_feedforward_layernorm_2`, `post_feedforward_layernorm_{1,2}` | `mlp.<same>.scale` | copied |
//! | `layer_scalar` [1] | `layer_scalar` | copied |
//! | `norm.weight` | `decoder.decoder_norm.scale` | copied |
//!
//! The experts go through per-expert views (`experts.<x>.{gate,up,down}_proj`) of the fused
//! tensors, split on reading and fused on writing. A `Gemma4ForConditionalGeneration` checkpoint's
//! language model is under `model.language_model.`; its vision and audio towers and their
//! embedders (`model.vision_tower.`, `model.embed_vision.`, `model.audio_tower.`,
//! `model.embed_audio.`) are skipped by name: maxrs models the text.
//!
//! `config.json`: `global_head_dim`, `attention_k_eq_v` (`share_kv_projections`) with
//! `num_global_key_value_heads`, `rope_parameters.sliding_attention` (`default`) and
//! `.full_attention` (`proportional` with `partial_rotary_factor`, or `default`) give the RoPE
//! keys, `final_logit_softcapping`, `enable_moe_block` with `num_experts`, `top_k_experts`,
//! `moe_intermediate_size` (one shared MLP, top-k renormalized as Hugging Face's router does).
//! Gemma 4 small (gemma4-e2b/e4b, `decoder_block: gemma4_small`, `model/gemma4_small.rs`): a config
//! with `hidden_size_per_layer_input`, `num_kv_shared_layers` or `use_double_wide_mlp` set (MaxText's
//! `GEMMA4_SMALL_MAXTEXT_TO_HF_PARAM_MAPPING`), its `layer_types` in periods of 5 (model_name
//! gemma4-e2b) or 6 (gemma4-e4b), unscanned; `model.embed_tokens_per_layer.weight` is
//! `decoder.per_layer_embedder.embed_tokens_per_layer` as it is, `per_layer_model_projection` and each
//! layer's `per_layer_input_gate` / `per_layer_projection` are transposed kernels, the norms copied;
//! a layer reusing another's keys and values has no `k_proj`, `v_proj`, `k_norm`.
//!
//! Refused, naming the field: bidirectional text attention, layer types other than these patterns,
//! untied embeddings, biases, an activation other than `gelu_pytorch_tanh`, `rms_norm_eps` other
//! than MaxText's 1e-6, experts or shared key/value projections with Gemma 4 small's fields.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use super::llama::{common_config, common_keys};
use super::{layer_entry, Entry, Fields, Map, Revalue};
use crate::config::{Config, DecoderBlock, RopeType};
use crate::host::{DType, HostTensor};
use crate::model::gemma::LAYER_NORM_EPS;
use crate::model::gemma4::BLOCK;
use crate::model::gemma4_small;
use crate::model::Model;

/// One layer's tensors besides the MLP: maxrs name, Hugging Face name (in `model.layers.N.`), map.
const ATTENTION: &[(&str, &str, Map)] = &[
    ("pre_self_attention_norm.scale", "input_layernorm.weight", Map::COPY),
    ("self_attention.query.kernel", "self_attn.q_proj.weight", Map::linear(1)),
    ("self_attention.key.kernel", "self_attn.k_proj.weight", Map::linear(1)),
    ("self_attention.value.kernel", "self_attn.v_proj.weight", Map::linear(1)),
    ("self_attention.out.kernel", "self_attn.o_proj.weight", Map::linear(2)),
    ("self_attention.query_norm.scale", "self_attn.q_norm.weight", Map::COPY),
    ("self_attention.key_norm.scale", "self_attn.k_norm.weight", Map::COPY),
    ("post_self_attention_norm.scale", "post_attention_layernorm.weight", Map::COPY),
    ("pre_ffw_norm.scale", "pre_feedforward_layernorm.weight", Map::COPY),
    ("post_ffw_norm.scale", "post_feedforward_layernorm.weight", Map::COPY),
    ("layer_scalar", "layer_scalar", Map::COPY),
];

/// The MoE layer's tensors besides the experts.
const MOE: &[(&str, &str, Map)] = &[
    ("mlp.moe_block.shared_experts.wi_0.kernel", "mlp.gate_proj.weight", Map::linear(1)),
    ("mlp.moe_block.shared_experts.wi_1.kernel", "mlp.up_proj.weight", Map::linear(1)),
    ("mlp.moe_block.shared_experts.wo.kernel", "mlp.down_proj.weight", Map::linear(1)),
    ("mlp.moe_block.MoeBlock_0.gate.kernel", "router.proj.weight", Map::linear(1)),
    ("mlp.pre_forward_scale_2", "router.scale", Map::COPY),
    ("mlp.moe_block.MoeBlock_0.per_expert_scale", "router.per_expert_scale", Map::COPY),
    ("mlp.pre_feedforward_layernorm_2.scale", "pre_feedforward_layernorm_2.weight", Map::COPY),
    ("mlp.post_feedforward_layernorm_1.scale", "post_feedforward_layernorm_1.weight", Map::COPY),
    ("mlp.post_feedforward_layernorm_2.scale", "post_feedforward_layernorm_2.weight", Map::COPY),
];

/// The dense layer's MLP.
const DENSE: &[(&str, &str, Map)] = &[
    ("mlp.wi_0.kernel", "mlp.gate_proj.weight", Map::linear(1)),
    ("mlp.wi_1.kernel", "mlp.up_proj.weight", Map::linear(1)),
    ("mlp.wo.kernel", "mlp.down_proj.weight", Map::linear(1)),
];

/// Gemma 4 small's per-layer input tensors of a layer.
const PER_LAYER: &[(&str, &str, Map)] = &[
    ("per_layer_input_gate.kernel", "per_layer_input_gate.weight", Map::linear(1)),
    ("per_layer_projection.kernel", "per_layer_projection.weight", Map::linear(1)),
    ("post_per_layer_input_norm.scale", "post_per_layer_input_norm.weight", Map::COPY),
];

/// The towers of `Gemma4ForConditionalGeneration` that are not the language model.
const SKIPPED: &[&str] = &["model.vision_tower.", "model.embed_vision.", "model.audio_tower.", "model.embed_audio."];

/// The fields of Gemma 4 small (gemma4-e2b, gemma4-e4b; `decoder_block: gemma4_small`): a config
/// with any of them set (not 0, false or missing) is one.
const SMALL_FIELDS: &[&str] = &["hidden_size_per_layer_input", "num_kv_shared_layers", "use_double_wide_mlp"];

/// Where a `Gemma4ForConditionalGeneration` checkpoint keeps the language model.
const LANGUAGE_MODEL: &str = "model.language_model.";

/// The text model's config: `text_config` of a `gemma4` (multimodal) config, else the config.
fn text_config(hf: &Value) -> &Value {
    match hf["model_type"].as_str() {
        Some("gemma4") => &hf["text_config"],
        _ => hf,
    }
}

/// A `rope_parameters` entry's theta and rotated fraction: `default` (all of the head) or
/// `proportional` (`partial_rotary_factor`).
fn rope_of(entry: &Value, field: &str) -> Result<(f64, f64)> {
    let fields = Fields(entry);
    let theta = fields.value("rope_theta", "rope_max_timescale", None).with_context(|| field.to_string())?;
    let proportion = match fields.text("rope_type")? {
        None | Some("default") => 1.0,
        Some("proportional") => fields.value("partial_rotary_factor", "global_rope_proportion", Some(1.0))?,
        Some(other) => {
            bail!("`{field}.rope_type` is {other:?}: gemma4's RoPE is \"default\" or \"proportional\"")
        }
    };
    if fields.0.get("factor").and_then(Value::as_f64).is_some_and(|f| f != 1.0) {
        bail!("`{field}.factor` is {}: scaled RoPE in gemma4 is not supported yet", entry["factor"]);
    }
    Ok((theta, proportion))
}

/// maxrs configuration keys (`key=value` text) for a Gemma 4 `config.json`.
pub fn config_from_hf(hf: &Value) -> Result<Vec<(String, String)>> {
    let text = text_config(hf);
    if !text.is_object() {
        bail!("`text_config` is missing: a gemma4 config keeps its language model's fields there");
    }
    let fields = Fields(text);
    match fields.text("hidden_activation")? {
        None | Some("gelu_pytorch_tanh") => {}
        Some(act) => bail!("`hidden_activation` is {act:?}; maxrs's Gemma 4 MLP is GeGLU with the tanh approximation (\"gelu_pytorch_tanh\")"),
    }
    if fields.flag("tie_word_embeddings")? == Some(false) {
        bail!("`tie_word_embeddings` is false; maxrs's Gemma 4 ties the logits to the embedding");
    }
    fields.absent("attention_bias", "biases in Gemma 4's attention")?;
    // Gemma 4 small (E2B, E4B): per-layer inputs, shared key/value layers or double-wide MLPs.
    let small = SMALL_FIELDS.iter().any(|f| fields.absent(f, "").is_err());
    match fields.text("use_bidirectional_attention")? {
        None | Some("vision") => {}
        Some(other) => {
            bail!("`use_bidirectional_attention` is {other:?} (bidirectional text attention): not supported yet")
        }
    }
    let mut keys = common_keys(&fields)?;
    let eps = fields.value("rms_norm_eps", "normalization_layer_epsilon", Some(LAYER_NORM_EPS))?;
    if eps != LAYER_NORM_EPS {
        bail!("`rms_norm_eps` is {eps}: MaxText's Gemma 4 layer norms use {LAYER_NORM_EPS}; other values are not supported yet");
    }
    let layers = fields.number("num_hidden_layers", "base_num_decoder_layers", None)?;
    let period = check_layer_types(text, layers, small)?;
    let window = fields.window()?;
    if window == 0 {
        bail!("`sliding_window` is null: gemma4's local layers need a window");
    }
    let parameters = &text["rope_parameters"];
    if !parameters.is_object() {
        bail!("`rope_parameters` is {parameters}: gemma4's config gives its two kinds of layer their RoPE there");
    }
    let (local_theta, local_proportion) =
        rope_of(&parameters["sliding_attention"], "rope_parameters.sliding_attention")?;
    let (global_theta, global_proportion) = rope_of(&parameters["full_attention"], "rope_parameters.full_attention")?;
    let head_dim = fields.number("head_dim", "head_dim", None)?;
    let global_head = fields.number("global_head_dim", "global_head_dim", Some(head_dim))?;
    let shared = fields.flag("attention_k_eq_v")?.unwrap_or(false);
    let global_kv = match shared {
        true => fields.number("num_global_key_value_heads", "global_num_kv_heads", Some(0))?,
        // Hugging Face gives the global layers their own key/value heads only with shared
        // projections (`Gemma4TextConfig.__post_init__`).
        false => 0,
    };
    let cap = match text["final_logit_softcapping"] {
        Value::Null => 0.0,
        _ => fields.value("final_logit_softcapping", "final_logits_soft_cap", None)?,
    };
    let moe = fields.flag("enable_moe_block")?.unwrap_or(false);
    if small && (moe || shared) {
        let field = if moe { "enable_moe_block" } else { "attention_k_eq_v" };
        bail!("`{field}` is true with per-layer inputs or shared key/value layers: MaxText's gemma4_small has neither experts nor shared key/value projections; not supported yet");
    }
    let (model_name, block) = match (small, moe) {
        (true, _) => (if period == 5 { "gemma4-e2b" } else { "gemma4-e4b" }, "gemma4_small"),
        (false, true) => ("gemma4-26b", "gemma4"),
        (false, false) => ("gemma4-31b", "gemma4"),
    };
    keys.extend(
        [
            ("model_name", model_name.to_string()),
            ("override_model_config", "true".into()),
            ("decoder_block", block.into()),
            ("sliding_window_size", window.to_string()),
            ("rope_max_timescale", (global_theta as i64).to_string()),
            ("local_rope_max_timescale", (local_theta as i64).to_string()),
            ("global_rope_max_timescale", (global_theta as i64).to_string()),
            ("local_rope_proportion", local_proportion.to_string()),
            ("global_rope_proportion", global_proportion.to_string()),
            ("global_head_dim", global_head.to_string()),
            ("global_num_kv_heads", global_kv.to_string()),
            ("share_kv_projections", shared.to_string()),
            ("v_norm_with_scale", "false".into()),
            ("final_logits_soft_cap", cap.to_string()),
            ("logits_via_embedding", "true".into()),
            ("normalize_embedding_logits", "true".into()),
            ("mlp_activations", "[gelu, linear]".into()),
            ("use_post_attn_norm", "true".into()),
            ("use_post_ffw_norm", "true".into()),
        ]
        .map(|(k, v)| (k.to_string(), v)),
    );
    if moe {
        let experts = fields.number("num_experts", "num_experts", None)?;
        let per_token = fields.number("top_k_experts", "num_experts_per_tok", None)?;
        let width = fields.number("moe_intermediate_size", "base_moe_mlp_dim", None)?;
        keys.extend(
            [
                ("num_experts", experts.to_string()),
                ("num_experts_per_tok", per_token.to_string()),
                ("base_moe_mlp_dim", width.to_string()),
                ("shared_experts", "1".into()),
                ("norm_topk_prob", "true".into()),
            ]
            .map(|(k, v)| (k.to_string(), v)),
        );
    } else {
        keys.push(("num_experts".into(), "1".into()));
    }
    if small {
        // Hugging Face's defaults (`Gemma4TextConfig`) for the fields a config leaves out.
        let width = fields.number("hidden_size_per_layer_input", "hidden_size_per_layer_input", Some(256))?;
        let rows = fields.number("vocab_size_per_layer_input", "vocab_size_per_layer_input", Some(262144))?;
        let shared = fields.number("num_kv_shared_layers", "num_kv_shared_layers", Some(0))?;
        let wide = fields.flag("use_double_wide_mlp")?.unwrap_or(false);
        keys.extend(
            [
                ("hidden_size_per_layer_input", width.to_string()),
                ("vocab_size_per_layer_input", rows.to_string()),
                ("num_kv_shared_layers", shared.to_string()),
                ("use_double_wide_mlp", wide.to_string()),
                // MaxText runs gemma4_small unscanned only (`model::gemma4_small`).
                ("scan_layers", "false".into()),
            ]
            .map(|(k, v)| (k.to_string(), v)),
        );
    }
    Ok(keys)
}

/// `layer_types`, when given, must be Gemma 4's: 5 sliding layers, then a full one, repeated
/// (Hugging Face also makes the last layer full, so a model of whole blocks only); Gemma 4
/// small's (`small`) 4 or 5 sliding layers, then a full one (gemma4-e2b's period of 5, or the
/// period of 6 MaxText gives any other model name). Returns the period.
fn check_layer_types(hf: &Value, layers: i64, small: bool) -> Result<i64> {
    let first_full = hf["layer_types"].as_array().and_then(|t| t.iter().position(|t| t == "full_attention"));
    let period = match first_full {
        Some(4) if small => 5,
        _ => BLOCK,
    };
    if layers % period != 0 {
        bail!("`num_hidden_layers` is {layers}: Hugging Face's Gemma 4 makes the last layer full attention, MaxText's every {period}th; a multiple of {period} is needed");
    }
    super::gemma3::check_sliding_then_full(hf, layers, "gemma4", period)?;
    Ok(period)
}

/// Refuses a gemma4 model Hugging Face's `Gemma4ForCausalLM` cannot express.
pub fn check_model(c: &Config) -> Result<()> {
    if c.v_norm_with_scale {
        bail!("v_norm_with_scale=true: Hugging Face's Gemma 4 normalizes values without a scale");
    }
    if c.global_num_kv_heads > 0 && !c.share_kv_projections && c.global_num_kv_heads != c.base_num_kv_heads {
        bail!("global_num_kv_heads={}: Hugging Face's Gemma 4 gives global layers their own key/value heads only with shared key/value projections (share_kv_projections=true)", c.global_num_kv_heads);
    }
    if c.attn_logits_soft_cap > 0.0 {
        bail!(
            "attn_logits_soft_cap={}: Hugging Face's Gemma 4 has no soft cap of the attention scores",
            c.attn_logits_soft_cap
        );
    }
    if c.rope_linear_scaling_factor != 1.0 || c.rope_type != RopeType::Default {
        bail!("rope_linear_scaling_factor={}: Hugging Face's Gemma 4 RoPE is not scaled", c.rope_linear_scaling_factor);
    }
    if !c.use_post_attn_norm || !c.use_post_ffw_norm {
        bail!("use_post_attn_norm and use_post_ffw_norm must be true: Hugging Face's Gemma 4 layers have both norms");
    }
    if c.num_experts > 1 && (c.shared_experts != 1 || !c.norm_topk_prob) {
        bail!("shared_experts={}, norm_topk_prob={}: Hugging Face's Gemma 4 has one shared MLP and renormalizes the top-k weights", c.shared_experts, c.norm_topk_prob);
    }
    let period = period_of(c);
    if c.base_num_decoder_layers % period != 0 {
        bail!("base_num_decoder_layers={}: Hugging Face's Gemma 4 makes the last layer full attention; a multiple of {period} is needed", c.base_num_decoder_layers);
    }
    Ok(())
}

/// The period of a model's local and global layers: Gemma 4's blocks of 6, Gemma 4 small's by its
/// model name (`model::gemma4_small::period`).
fn period_of(c: &Config) -> i64 {
    match c.decoder_block {
        DecoderBlock::Gemma4Small => gemma4_small::period(&c.model_name),
        _ => BLOCK,
    }
}

/// The Hugging Face `config.json` of a gemma4 model.
pub fn hf_config(c: &Config, model: &Model, torch_dtype: &str) -> Value {
    let m = &model.config;
    let period = period_of(c);
    let layers = (0..m.layers).map(|i| match (i + 1) % period {
        0 => "full_attention",
        _ => "sliding_attention",
    });
    let rope = |theta: i64, proportion: f64| match proportion {
        p if p >= 1.0 => json!({ "rope_type": "default", "rope_theta": theta as f64 }),
        p => json!({ "rope_type": "proportional", "partial_rotary_factor": p, "rope_theta": theta as f64 }),
    };
    let theta = |own: i64| if own > 0 { own } else { c.rope_max_timescale };
    let mut config = common_config(c, model, torch_dtype);
    config["architectures"] = json!(["Gemma4ForCausalLM"]);
    config["model_type"] = json!("gemma4_text");
    config["num_hidden_layers"] = json!(m.layers);
    config["layer_types"] = json!(layers.collect::<Vec<_>>());
    config["hidden_activation"] = json!("gelu_pytorch_tanh");
    config["attention_bias"] = json!(false);
    config["tie_word_embeddings"] = json!(true);
    config["sliding_window"] = json!(c.sliding_window_size);
    config["global_head_dim"] = json!(if c.global_head_dim > 0 { c.global_head_dim } else { c.head_dim });
    config["attention_k_eq_v"] = json!(c.share_kv_projections);
    config["num_global_key_value_heads"] =
        json!(if c.global_num_kv_heads > 0 { c.global_num_kv_heads } else { m.kv_heads });
    config["final_logit_softcapping"] = match c.final_logits_soft_cap {
        cap if cap > 0.0 => json!(cap),
        _ => Value::Null,
    };
    config["hidden_size_per_layer_input"] = json!(c.hidden_size_per_layer_input);
    if c.decoder_block == DecoderBlock::Gemma4Small {
        config["vocab_size_per_layer_input"] = json!(c.vocab_size_per_layer_input);
        config["num_kv_shared_layers"] = json!(c.num_kv_shared_layers);
        config["use_double_wide_mlp"] = json!(c.use_double_wide_mlp);
    }
    config["rope_parameters"] = json!({
        "sliding_attention": rope(theta(c.local_rope_max_timescale), c.local_rope_proportion),
        "full_attention": rope(theta(c.global_rope_max_timescale), c.global_rope_proportion),
    });
    config["enable_moe_block"] = json!(c.num_experts > 1);
    if c.num_experts > 1 {
        config["num_experts"] = json!(c.num_experts);
        config["top_k_experts"] = json!(c.num_experts_per_tok);
        config["moe_intermediate_size"] = json!(c.base_moe_mlp_dim);
    }
    config
}

/// Every tensor of an unscanned gemma4 model, the experts as per-expert views.
fn entries(c: &Config, model: &Model) -> Vec<Entry> {
    let emb_scale = (model.config.emb as f64).sqrt();
    let top = |maxrs: &str, hf: &str, map: Map| Entry { maxrs: maxrs.into(), slot: vec![], hf: hf.into(), map };
    let mut out = vec![
        top("token_embedder.embedding", "model.embed_tokens.weight", Map::value(Revalue::Scale(emb_scale))),
        top("decoder.decoder_norm.scale", "model.norm.weight", Map::COPY),
    ];
    let small = c.decoder_block == DecoderBlock::Gemma4Small;
    if small && c.hidden_size_per_layer_input > 0 {
        // MaxText's table is Hugging Face's, unscaled (`Gemma4SmallPLE` scales it at run time).
        let ple = "decoder.per_layer_embedder";
        out.extend([
            top(&format!("{ple}.embed_tokens_per_layer"), "model.embed_tokens_per_layer.weight", Map::COPY),
            top(
                &format!("{ple}.per_layer_model_projection.kernel"),
                "model.per_layer_model_projection.weight",
                Map::linear(1),
            ),
            top(&format!("{ple}.per_layer_projection_norm.scale"), "model.per_layer_projection_norm.weight", Map::COPY),
        ]);
    }
    // Gemma 4's layers are blocks of 6 sub-layers; Gemma 4 small's one module of them all.
    let size = if small { model.config.layers } else { BLOCK };
    let names: BTreeSet<String> = model.param_defs().into_iter().map(|d| d.name).collect();
    for n in 0..model.config.layers {
        let (block, j) = (n / size, n % size);
        let hf = |name: &str| format!("model.layers.{n}.{name}");
        let mlp = if c.num_experts > 1 { MOE } else { DENSE };
        let per_layer = if small { PER_LAYER } else { &[] };
        for (name, hf_name, map) in ATTENTION.iter().chain(mlp).chain(per_layer) {
            let entry = layer_entry(model, block, &format!("layers_{j}.{name}"), &[], hf(hf_name), *map);
            // A global layer without its value projection (`share_kv_projections`), a layer reusing
            // another's keys and values without either: the model has no such parameter.
            if names.contains(&entry.maxrs) {
                out.push(entry);
            }
        }
        if c.num_experts > 1 {
            for x in 0..c.num_experts {
                for (name, view) in [("wi_0", "gate_proj"), ("wi_1", "up_proj"), ("wo", "down_proj")] {
                    let name = format!("layers_{j}.mlp.moe_block.MoeBlock_0.{name}");
                    out.push(layer_entry(
                        model,
                        block,
                        &name,
                        &[x],
                        hf(&format!("experts.{x}.{view}")),
                        Map::linear(1),
                    ));
                }
            }
        }
    }
    out
}

/// The configuration and model of the same gemma4 model unscanned.
fn unscanned(c: &Config) -> Result<(Config, Model)> {
    let mut uc = c.clone();
    uc.scan_layers = false;
    let model = Model::from_config(&uc)?;
    Ok((uc, model))
}

/// Rows `[from, from + n)` of `t` seen as `rows` rows, as `dims`.
fn rows_of(t: &HostTensor, rows: usize, (from, n): (usize, usize), dims: &[i64]) -> HostTensor {
    let row = t.data.len() / rows;
    HostTensor::new(t.ty, dims, t.data[from * row..(from + n) * row].to_vec())
}

/// maxrs parameters from a Gemma 4 checkpoint's tensors (see `super::from_hf`).
pub fn from_hf(c: &Config, model: &Model, hf: &BTreeMap<String, HostTensor>) -> Result<BTreeMap<String, HostTensor>> {
    let mut tensors = BTreeMap::new();
    for (name, t) in hf {
        if SKIPPED.iter().any(|s| name.starts_with(s)) {
            continue;
        }
        let name = match name.strip_prefix(LANGUAGE_MODEL) {
            Some(rest) => format!("model.{rest}"),
            None => name.clone(),
        };
        // The fused experts as per-expert views `experts.<x>.{gate,up,down}_proj`.
        let (Some(layer), true) = (name.strip_suffix(".experts.gate_up_proj"), t.dims.len() == 3) else {
            match (name.strip_suffix(".experts.down_proj"), t.dims.len() == 3) {
                (Some(layer), true) => {
                    let (x, rows) = (t.dims[0] as usize, t.dims[1] as usize);
                    for e in 0..x {
                        let view = rows_of(t, x * rows, (e * rows, rows), &t.dims[1..]);
                        tensors.insert(format!("{layer}.experts.{e}.down_proj"), view);
                    }
                }
                _ => {
                    tensors.insert(name, t.clone());
                }
            }
            continue;
        };
        let (x, rows, cols) = (t.dims[0] as usize, t.dims[1] as usize, t.dims[2]);
        let half = rows / 2;
        for e in 0..x {
            for (i, view) in ["gate_proj", "up_proj"].iter().enumerate() {
                let part = rows_of(t, x * rows, (e * rows + i * half, half), &[half as i64, cols]);
                tensors.insert(format!("{layer}.experts.{e}.{view}"), part);
            }
        }
    }
    let (uc, um) = unscanned(c)?;
    let params = super::convert_from_hf(&um, &tensors, entries(&uc, &um))?;
    Ok(if c.scan_layers { restack(model, &params, true) } else { params })
}

/// Hugging Face tensors from a gemma4 model's parameters (see `super::to_hf`).
pub fn to_hf(
    c: &Config,
    model: &Model,
    params: &BTreeMap<String, HostTensor>,
    ty: DType,
) -> Result<BTreeMap<String, HostTensor>> {
    let (uc, um) = unscanned(c)?;
    let params = if c.scan_layers { restack(model, params, false) } else { params.clone() };
    let views = super::convert_to_hf(&params, ty, entries(&uc, &um))?;
    let mut out = BTreeMap::new();
    let mut fused: BTreeMap<String, Vec<(usize, usize, HostTensor)>> = BTreeMap::new();
    for (name, t) in views {
        let Some((layer, rest)) = name.split_once(".experts.") else {
            out.insert(name, t);
            continue;
        };
        let (x, view) = rest.split_once('.').expect("an expert view");
        let (tensor, part) = match view {
            "gate_proj" => ("gate_up_proj", 0),
            "up_proj" => ("gate_up_proj", 1),
            _ => ("down_proj", 0),
        };
        let x: usize = x.parse().expect("an expert index");
        fused.entry(format!("{layer}.experts.{tensor}")).or_default().push((x, part, t));
    }
    for (name, mut parts) in fused {
        parts.sort_by_key(|(x, part, _)| (*x, *part));
        let (ty, rows, cols) = (parts[0].2.ty, parts[0].2.dims[0], parts[0].2.dims[1]);
        let experts = parts.iter().map(|(x, _, _)| x + 1).max().unwrap_or(0) as i64;
        let per = parts.len() as i64 / experts;
        let data = parts.into_iter().flat_map(|(_, _, t)| t.data).collect();
        out.insert(name, HostTensor::new(ty, &[experts, per * rows, cols], data));
    }
    Ok(out)
}

/// The model's parameters between the unscanned layout (`decoder.layers_<n>.<p>`) and the
/// scanned one (`to_scanned`; `model` is scanned): a local layer's `[d0, rest..]` is
/// `[block, d0, j, rest..]` of `scanned_blocks.local_layers.<p>`, the global one's `[block, ..]`
/// of `scanned_blocks.global_layer.<p>`.
fn restack(model: &Model, params: &BTreeMap<String, HostTensor>, to_scanned: bool) -> BTreeMap<String, HostTensor> {
    let mut out = BTreeMap::new();
    let layer = |n: usize, rest: &str| format!("decoder.layers_{n}.{rest}");
    for def in model.param_defs() {
        if let Some(rest) = def.name.strip_prefix("decoder.scanned_blocks.local_layers.") {
            let (blocks, d0, locals) = (def.shape[0] as usize, def.shape[1] as usize, def.shape[2] as usize);
            let inner_dims = &def.shape[3..];
            let inner_len = inner_dims.iter().product::<i64>() as usize;
            let own: Vec<i64> = [&[def.shape[1]][..], inner_dims].concat();
            if to_scanned {
                let ty = params[&layer(0, rest)].ty;
                let size = ty.byte_size();
                let mut data = vec![0u8; blocks * d0 * locals * inner_len * size];
                for b in 0..blocks {
                    for j in 0..locals {
                        let t = &params[&layer(BLOCK as usize * b + j, rest)];
                        for a in 0..d0 {
                            let to = ((b * d0 + a) * locals + j) * inner_len * size;
                            let from = a * inner_len * size;
                            data[to..to + inner_len * size].copy_from_slice(&t.data[from..from + inner_len * size]);
                        }
                    }
                }
                out.insert(def.name.clone(), HostTensor::new(ty, &def.shape, data));
            } else {
                let t = &params[&def.name];
                let size = t.ty.byte_size();
                for b in 0..blocks {
                    for j in 0..locals {
                        let mut data = Vec::with_capacity(d0 * inner_len * size);
                        for a in 0..d0 {
                            let from = ((b * d0 + a) * locals + j) * inner_len * size;
                            data.extend_from_slice(&t.data[from..from + inner_len * size]);
                        }
                        out.insert(layer(BLOCK as usize * b + j, rest), HostTensor::new(t.ty, &own, data));
                    }
                }
            }
        } else if let Some(rest) = def.name.strip_prefix("decoder.scanned_blocks.global_layer.") {
            let blocks = def.shape[0] as usize;
            let global = |b: usize| layer(BLOCK as usize * b + BLOCK as usize - 1, rest);
            if to_scanned {
                let ty = params[&global(0)].ty;
                let data = (0..blocks).flat_map(|b| params[&global(b)].data.clone()).collect();
                out.insert(def.name.clone(), HostTensor::new(ty, &def.shape, data));
            } else {
                let t = &params[&def.name];
                let len = t.data.len() / blocks;
                for b in 0..blocks {
                    out.insert(
                        global(b),
                        HostTensor::new(t.ty, &def.shape[1..], t.data[b * len..(b + 1) * len].to_vec()),
                    );
                }
            }
        } else if let Some(t) = params.get(&def.name) {
            out.insert(def.name.clone(), t.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// google/gemma-4-31b-it's text config as the hub has it, nested in a multimodal config,
    /// gives gemma4-31b's model file values; what maxrs does not model is refused naming the field.
    #[test]
    fn hub_config_gives_the_model_file_and_refusals_name_the_field() {
        let text = json!({
            "model_type": "gemma4_text", "hidden_size": 5376, "intermediate_size": 21504,
            "num_hidden_layers": 60, "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 256,
            "global_head_dim": 512, "num_global_key_value_heads": 4, "attention_k_eq_v": true,
            "rms_norm_eps": 1e-6, "sliding_window": 1024, "vocab_size": 262144, "final_logit_softcapping": 30.0,
            "hidden_activation": "gelu_pytorch_tanh", "hidden_size_per_layer_input": 0,
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
            },
        });
        let hub = json!({"model_type": "gemma4", "text_config": text, "vision_config": {}});
        let keys = config_from_hf(&hub).unwrap();
        for (key, value) in [
            ("base_num_decoder_layers", "60"),
            ("global_head_dim", "512"),
            ("global_num_kv_heads", "4"),
            ("share_kv_projections", "true"),
            ("global_rope_proportion", "0.25"),
            ("global_rope_max_timescale", "1000000"),
            ("local_rope_max_timescale", "10000"),
            ("final_logits_soft_cap", "30"),
            ("model_name", "gemma4-31b"),
        ] {
            assert!(keys.contains(&(key.into(), value.into())), "{key}={value} in {keys:?}");
        }
        let refused = |field: &str, value: Value| {
            let mut c = text.clone();
            c[field] = value;
            config_from_hf(&c).unwrap_err().to_string()
        };
        // gemma4-e2b's fields (hf_model_configs.py at MaxText e591f30) give its model file's values.
        let mut e2b = text.clone();
        for (field, value) in [
            ("hidden_size_per_layer_input", json!(256)),
            ("num_kv_shared_layers", json!(20)),
            ("use_double_wide_mlp", json!(true)),
            ("num_hidden_layers", json!(35)),
            ("attention_k_eq_v", json!(false)),
            ("layer_types", json!([vec!["sliding_attention"; 4], vec!["full_attention"]].concat().repeat(7))),
        ] {
            e2b[field] = value;
        }
        let keys = config_from_hf(&e2b).unwrap();
        for (key, value) in [
            ("model_name", "gemma4-e2b"),
            ("decoder_block", "gemma4_small"),
            ("hidden_size_per_layer_input", "256"),
            ("vocab_size_per_layer_input", "262144"),
            ("num_kv_shared_layers", "20"),
            ("use_double_wide_mlp", "true"),
            ("scan_layers", "false"),
        ] {
            assert!(keys.contains(&(key.into(), value.into())), "{key}={value} in {keys:?}");
        }
        e2b["attention_k_eq_v"] = json!(true);
        assert!(config_from_hf(&e2b).unwrap_err().to_string().contains("`attention_k_eq_v` is true"));
        assert!(refused("num_hidden_layers", json!(62)).contains("`num_hidden_layers` is 62"));
        assert!(refused("use_bidirectional_attention", json!("all")).contains("`use_bidirectional_attention`"));
        let e = refused("layer_types", json!(vec!["sliding_attention"; 60]));
        assert!(e.contains("`layer_types[5]`"), "{e}");
    }
}
