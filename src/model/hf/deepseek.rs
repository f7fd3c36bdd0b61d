//! DeepSeek-V3's Hugging Face layout (`DeepseekV3ForCausalLM`, `model_type: deepseek_v3`,
//! transformers 5.23.0's `models/deepseek_v3/`): its `config.json` fields and tensor names, to
//! and from maxrs's `deepseek` block (multi-head latent attention, `model/mla.rs`).
//!
//! | Hugging Face (`model.layers.N.`) | shape | maxrs (in the layer) | shape |
//! |---|---|---|---|
//! | `input_layernorm.weight` | [E] | `pre_self_attention_layer_norm.scale` | [E] |
//! | `self_attn.q_proj.weight` (no `q_lora_rank`) | [H*(N+R), E] | `self_attention.query.kernel` | [E, H, N+R] |
//! | `self_attn.q_a_proj.weight` | [Q, E] | `self_attention.wq_a.kernel` | [E, Q] |
//! | `self_attn.q_a_layernorm.weight` | [Q] | `self_attention.q_norm.scale` | [Q] |
//! | `self_attn.q_b_proj.weight` | [H*(N+R), Q] | `self_attention.wq_b.kernel` | [Q, H, N+R] |
//! | `self_attn.kv_a_proj_with_mqa.weight` | [C+R, E] | `self_attention.wkv_a.kernel` | [E, C+R] |
//! | `self_attn.kv_a_layernorm.weight` | [C] | `self_attention.kv_norm.scale` | [C] |
//! | `self_attn.kv_b_proj.weight` | [H*(N+V), C] | `self_attention.wkv_b.kernel` | [C, H, N+V] |
//! | `self_attn.o_proj.weight` | [E, H*V] | `self_attention.out.kernel` | [H, V, E] |
//! | `post_attention_layernorm.weight` | [E] | `post_self_attention_layer_norm.scale` | [E] |
//! | `mlp.{gate,up,down}_proj.weight` (dense layers) | as Llama's | `mlp.{wi_0,wi_1,wo}.kernel` | as Llama's |
//! | `mlp.gate.weight` (routed layers) | [X, E] | `DeepSeekMoeBlock_0.MoeBlock_0.gate.kernel` | [E, X] |
//! | `mlp.gate.e_score_correction_bias` | [X] | `DeepSeekMoeBlock_0.MoeBlock_0.gate.bias` | [X] |
//! | `mlp.experts.J.{gate,up,down}_proj.weight` | [M, E], [M, E], [E, M] | `DeepSeekMoeBlock_0.MoeBlock_0.{wi_0,wi_1,wo}[J]` | [E, M], [E, M], [M, E] |
//! | `mlp.shared_experts.{gate,up,down}_proj.weight` | [S*M, E], ... | `DeepSeekMoeBlock_0.shared_experts.{wi_0,wi_1,wo}.kernel` | [E, S*M], ... |
//!
//! (N `qk_nope_head_dim`, R `qk_rope_head_dim`, V `v_head_dim`, Q `q_lora_rank`, C
//! `kv_lora_rank`, X experts, M `moe_intermediate_size`, S `n_shared_experts`; the embedding,
//! final norm and `lm_head` are Llama's; the layers before `first_k_dense_replace` are dense.) Every map is a
//! transpose:
//! both apply RoPE to the same elements in the same order (`rope_interleave`: pairs `(2i, 2i+1)`
//! in both; Hugging Face de-interleaves them at run time, `apply_rotary_pos_emb_interleave`) and
//! scale the scores at run time.
//!
//! **RoPE and softmax scale.** YaRN's `rope_scaling` (`factor`, `original_max_position_embeddings`,
//! `beta_fast`, `beta_slow`, `truncate`) maps onto MaxText's keys of the same meaning. Hugging
//! Face scales the softmax by `(0.1 mscale_all_dim ln(factor) + 1)^2` and RoPE's cos/sin by
//! `mscale'(mscale) / mscale'(mscale_all_dim)`; MaxText by `(0.1 mscale ln(rope_factor) + 1)^2`
//! when `max_position_embeddings > original_max_position_embeddings`, and RoPE by
//! `0.1 ln(rope_factor) + 1` with `rope_attention_scaling`. The two agree when `mscale` equals
//! `mscale_all_dim` (DeepSeek-V3's 1.0: maxrs's `mscale`, no RoPE scaling) or `mscale_all_dim`
//! is 0 or absent (RoPE scaled, no softmax factor); other combinations are refused by field.
//!
//! Which layers: `first_k_dense_replace` is `first_num_dense_layers`; the routed layers after it
//! are maxrs's `moe_layers`, with DeepSeek-V3's router (the per-expert tensors of the published
//! checkpoints; `transformers` 5 fuses them on loading), which MaxText computes only under a
//! `deepseek3*` model name: a model with routed layers converts under one (`v3_model_name`), and
//! one named otherwise is refused by `check_model`.

use anyhow::{bail, Result};
use serde_json::{json, Value};

use super::llama::{common_config, common_keys, outer_entries, rope_fields};
use super::{layer_entry, Entry, Fields, Map};
use crate::config::{Config, RopeType, RoutedScoreFunc};
use crate::model::moe::{routes_as_deepseek_v3, DEEPSEEK_V3_PREFIXES};
use crate::model::Model;

/// maxrs configuration keys (`key=value` text) for a DeepSeek-V3 `config.json`.
pub fn config_from_hf(hf: &Value) -> Result<Vec<(String, String)>> {
    let fields = Fields(hf);
    match fields.text("hidden_act")? {
        None | Some("silu") => {}
        Some(act) => bail!("`hidden_act` is {act:?}; DeepSeek-V3's MLPs here are SwiGLU (silu)"),
    }
    if fields.flag("attention_bias")? == Some(true) {
        bail!("`attention_bias` is true; maxrs's multi-head latent attention has no biases");
    }
    if !hf["quantization_config"].is_null() {
        bail!(
            "`quantization_config` is {}: quantized (fp8 block-scaled) weights are not supported yet; dequantize the checkpoint first",
            hf["quantization_config"]
        );
    }
    for field in ["num_nextn_predict_layers", "num_mtp_layers"] {
        fields.absent(field, "multi-token prediction modules")?;
    }
    let mut keys: Vec<(String, String)> = common_keys(&fields)?.into_iter().filter(|(k, _)| k != "head_dim").collect();
    let heads = fields.number("num_attention_heads", "base_num_query_heads", None)?;
    if fields.number("num_key_value_heads", "base_num_kv_heads", Some(heads))? != heads {
        bail!(
            "`num_key_value_heads` is {}: multi-head latent attention has `num_attention_heads` {heads}",
            hf["num_key_value_heads"]
        );
    }
    let layers = fields.number("num_hidden_layers", "base_num_decoder_layers", None)?;
    let dense = fields.number("first_k_dense_replace", "first_num_dense_layers", Some(3))?.min(layers);
    keys.push(("first_num_dense_layers".into(), dense.to_string()));
    if dense < layers {
        keys.extend(moe_keys(&fields, dense)?);
    }
    let q_lora = fields.number("q_lora_rank", "q_lora_rank", Some(0))?;
    keys.push(("q_lora_rank".into(), q_lora.to_string()));
    for (field, key) in [
        ("kv_lora_rank", "kv_lora_rank"),
        ("qk_nope_head_dim", "qk_nope_head_dim"),
        ("qk_rope_head_dim", "qk_rope_head_dim"),
        ("v_head_dim", "v_head_dim"),
        ("max_position_embeddings", "max_position_embeddings"),
    ] {
        keys.push((key.into(), fields.number(field, key, None)?.to_string()));
    }
    keys.push(("rope_interleave".into(), fields.flag("rope_interleave")?.unwrap_or(true).to_string()));
    keys.extend(yarn_keys(hf)?);
    keys.push(("decoder_block".into(), "deepseek".into()));
    keys.push(("attention_type".into(), "mla".into()));
    let tied = fields.flag("tie_word_embeddings")?.unwrap_or(false);
    keys.push(("logits_via_embedding".into(), tied.to_string()));
    if tied {
        keys.push(("normalize_embedding_logits".into(), "false".into()));
    }
    keys.push(("mlp_activations".into(), "[silu, linear]".into()));
    if dense < layers {
        let name = v3_model_name(&keys);
        keys.extend([("model_name".into(), name.into()), ("override_model_config".into(), "true".into())]);
    }
    Ok(keys)
}

/// The model name a DeepSeek-V3 with routed layers converts under: Hugging Face's
/// `DeepseekV3TopkRouter` weighs the chosen experts by their unbiased scores, which MaxText does
/// only for a `model_name` starting with deepseek3 or deepseek4 (`get_topk`, `layers/moe.py` at
/// e591f30). MaxText's `deepseek3-671b` when the parameters have its shapes, else
/// `deepseek3-test`; `override_model_config=true` lets the converted keys replace the file's.
fn v3_model_name(keys: &[(String, String)]) -> &'static str {
    const FULL: &str = "deepseek3-671b";
    let shapes = |keys: &[(String, String)]| {
        let args: Vec<String> = [format!("model_name={FULL}"), "override_model_config=true".into()]
            .into_iter()
            .chain(keys.iter().map(|(k, v)| format!("{k}={v}")))
            .collect();
        let c = crate::config::load(None, &args).ok()?;
        let defs = Model::from_config(&c).ok()?.param_defs();
        Some(defs.into_iter().map(|d| (d.name, d.shape)).collect::<Vec<_>>())
    };
    match shapes(keys) {
        Some(converted) if Some(&converted) == shapes(&[]).as_ref() => FULL,
        _ => "deepseek3-test",
    }
}

/// The routed layers' keys: DeepSeek-V3's router (`DeepseekV3TopkRouter`: sigmoid scores, the
/// `e_score_correction_bias` for the choice, `n_group` / `topk_group`, normalized top-k weights
/// times `routed_scaling_factor`) and `n_shared_experts`, `moe_intermediate_size` wide. With no
/// dense layer, MaxText requires `base_mlp_dim` equal to the experts' width: it is set so
/// (`intermediate_size` is then unused).
fn moe_keys(fields: &Fields, dense: i64) -> Result<Vec<(String, String)>> {
    let hf = fields.0;
    if fields.flag("norm_topk_prob")? == Some(false) {
        bail!("`norm_topk_prob` is false: maxrs's DeepSeek router normalizes the top-k weights; not supported yet");
    }
    match fields.text("scoring_func")? {
        None | Some("sigmoid") => {}
        Some(other) => bail!(
            "`scoring_func` is {other:?}: DeepSeek-V3's router scores with sigmoid; other scores are not supported yet"
        ),
    }
    match fields.text("topk_method")? {
        None | Some("noaux_tc") => {}
        Some(other) => {
            bail!("`topk_method` is {other:?}: maxrs routes as DeepSeek-V3 (\"noaux_tc\"); not supported yet")
        }
    }
    let experts = fields.number("n_routed_experts", "num_experts", Some(256))?;
    let k = fields.number("num_experts_per_tok", "num_experts_per_tok", Some(8))?;
    let shared = fields.number("n_shared_experts", "shared_experts", Some(1))?;
    if shared < 1 {
        bail!(
            "`n_shared_experts` is {shared}: Hugging Face's DeepSeek-V3 always has a shared expert; 0 is not supported"
        );
    }
    let width = fields.number("moe_intermediate_size", "base_moe_mlp_dim", Some(2048))?;
    let groups = fields.number("n_group", "n_routing_groups", Some(8))?;
    let top_groups = fields.number("topk_group", "topk_routing_group", Some(4))?;
    let scaling = fields.value("routed_scaling_factor", "routed_scaling_factor", Some(2.5))?;
    let mut keys = vec![
        ("num_experts".into(), experts.to_string()),
        ("num_experts_per_tok".into(), k.to_string()),
        ("shared_experts".into(), shared.to_string()),
        ("base_moe_mlp_dim".into(), width.to_string()),
        ("routed_scaling_factor".into(), scaling.to_string()),
        ("routed_score_func".into(), "sigmoid".into()),
        ("routed_bias".into(), "true".into()),
    ];
    // One group holding every expert is no grouping.
    if groups > 1 {
        keys.push(("n_routing_groups".into(), groups.to_string()));
        keys.push(("topk_routing_group".into(), top_groups.to_string()));
    } else if top_groups != 1 {
        bail!("`topk_group` is {}: with `n_group` {} it must be 1", hf["topk_group"], hf["n_group"]);
    }
    if dense == 0 {
        keys.push(("base_mlp_dim".into(), width.to_string()));
    }
    Ok(keys)
}

/// The RoPE keys of a config's YaRN `rope_scaling` (or `rope_parameters`).
fn yarn_keys(hf: &Value) -> Result<Vec<(String, String)>> {
    let (theta, scaling) = rope_fields(hf);
    let with_theta = json!({ "rope_theta": theta });
    let theta = Fields(&with_theta).number("rope_theta", "rope_max_timescale", Some(10000))?;
    let Some((field, scaling)) = scaling else {
        bail!("`rope_scaling` is null: maxrs converts DeepSeek-V3's YaRN RoPE (rope_type \"yarn\"); plain RoPE is not supported yet");
    };
    let kind = scaling.get("rope_type").or_else(|| scaling.get("type")).cloned().unwrap_or(Value::Null);
    if kind != "yarn" {
        bail!("`{field}.rope_type` is {kind}: maxrs converts DeepSeek-V3's YaRN RoPE (\"yarn\"); other RoPE scalings are not supported yet");
    }
    let s = Fields(scaling);
    if !scaling["attention_factor"].is_null() {
        bail!(
            "`{field}.attention_factor` is {}: an explicit RoPE attention factor is not supported yet",
            scaling["attention_factor"]
        );
    }
    let original = s.number("original_max_position_embeddings", "original_max_position_embeddings", None)?;
    let factor = s.value("factor", "rope_factor", None)?;
    // `beta_fast or 32`, `beta_slow or 1`: transformers' defaults, also for 0.
    let beta = |name: &str, default: f64| match scaling[name].as_f64() {
        None if scaling[name].is_null() => Ok(default),
        Some(0.0) => Ok(default),
        _ => s.value(name, name, None),
    };
    let (beta_fast, beta_slow) = (beta("beta_fast", 32.0)?, beta("beta_slow", 1.0)?);
    let truncate = s.flag("truncate")?.unwrap_or(true);
    let mscale = s.value("mscale", "mscale", Some(0.0))?;
    let all_dim = s.value("mscale_all_dim", "mscale", Some(0.0))?;
    let extended = Fields(hf).number("max_position_embeddings", "max_position_embeddings", None)? > original;
    let (maxrs_mscale, rope_scaling) = if all_dim == 0.0 {
        // Hugging Face: RoPE scaled by 0.1 ln(factor) + 1, no softmax factor.
        (0.0, true)
    } else if mscale == all_dim && extended {
        (all_dim, false)
    } else if mscale == all_dim {
        bail!(
            "`max_position_embeddings` is {}, not above `{field}.original_max_position_embeddings` {original}: MaxText applies the softmax's mscale factor only to an extended context",
            hf["max_position_embeddings"]
        );
    } else {
        bail!(
            "`{field}.mscale` is {} and `mscale_all_dim` {}: maxrs models them equal (DeepSeek-V3's) or mscale_all_dim 0; other combinations are not supported yet",
            scaling["mscale"],
            scaling["mscale_all_dim"]
        );
    };
    Ok(vec![
        ("rope_max_timescale".into(), theta.to_string()),
        ("rope_type".into(), "yarn".into()),
        ("rope_factor".into(), factor.to_string()),
        ("original_max_position_embeddings".into(), original.to_string()),
        ("beta_fast".into(), beta_fast.to_string()),
        ("beta_slow".into(), beta_slow.to_string()),
        ("rope_truncate".into(), truncate.to_string()),
        ("mscale".into(), maxrs_mscale.to_string()),
        ("rope_attention_scaling".into(), rope_scaling.to_string()),
    ])
}

/// Refuses a deepseek model Hugging Face's `DeepseekV3ForCausalLM` cannot express.
pub fn check_model(c: &Config) -> Result<()> {
    if c.rope_type != RopeType::Yarn {
        bail!("rope_type={}: maxrs converts deepseek with YaRN RoPE (rope_type=yarn) only yet", c.rope_type);
    }
    let layers = c.base_num_decoder_layers << crate::config::parameter_scales(c.global_parameter_scale).3;
    if c.first_num_dense_layers < layers {
        // Hugging Face's router: sigmoid scores, a correction bias, a shared expert.
        if c.routed_score_func != RoutedScoreFunc::Sigmoid || !c.routed_bias || c.shared_experts < 1 {
            bail!(
                "routed_score_func={:?}, routed_bias={}, shared_experts={}: Hugging Face's DeepSeek-V3 routes with sigmoid scores and a correction bias and has a shared expert (sigmoid, true, >= 1)",
                c.routed_score_func.as_str(),
                c.routed_bias,
                c.shared_experts
            );
        }
        // With the bias the two routings differ (see `v3_model_name`).
        if !routes_as_deepseek_v3(&c.model_name) {
            bail!(
                "model_name={}: MaxText weighs this model's experts by their biased scores, Hugging Face's DeepSeek-V3 by the unbiased ones, as MaxText does only for a model_name starting with {DEEPSEEK_V3_PREFIXES} (get_topk, layers/moe.py at e591f30); convert only a model trained under such a name (e.g. model_name=deepseek3-test override_model_config=true with its keys)",
                c.model_name
            );
        }
    }
    let softmax_factor = c.max_position_embeddings > c.original_max_position_embeddings && c.mscale != 0.0;
    if c.rope_attention_scaling == softmax_factor {
        bail!(
            "rope_attention_scaling={} with mscale={} (max_position_embeddings={}, original_max_position_embeddings={}): \
             Hugging Face's YaRN scales either RoPE or the softmax by mscale, so one of them must be on",
            c.rope_attention_scaling,
            c.mscale,
            c.max_position_embeddings,
            c.original_max_position_embeddings
        );
    }
    Ok(())
}

/// The Hugging Face `config.json` of a deepseek model (`check_model` passed).
pub fn hf_config(c: &Config, model: &Model, torch_dtype: &str) -> Value {
    let m = &model.config;
    let mut config = common_config(c, model, torch_dtype);
    config["architectures"] = json!(["DeepseekV3ForCausalLM"]);
    config["model_type"] = json!("deepseek_v3");
    config["hidden_act"] = json!("silu");
    config["attention_bias"] = json!(false);
    config["tie_word_embeddings"] = json!(c.logits_via_embedding);
    config["head_dim"] = json!(c.qk_rope_head_dim);
    config["q_lora_rank"] = if c.q_lora_rank == 0 { Value::Null } else { json!(c.q_lora_rank) };
    config["kv_lora_rank"] = json!(c.kv_lora_rank);
    config["qk_nope_head_dim"] = json!(c.qk_nope_head_dim);
    config["qk_rope_head_dim"] = json!(c.qk_rope_head_dim);
    config["v_head_dim"] = json!(c.v_head_dim);
    config["first_k_dense_replace"] = json!(c.first_num_dense_layers);
    if c.first_num_dense_layers < m.layers {
        let (groups, top_groups) = match c.n_routing_groups {
            -1 => (1, 1),
            g => (g, c.topk_routing_group),
        };
        config["n_routed_experts"] = json!(c.num_experts);
        config["num_experts_per_tok"] = json!(c.num_experts_per_tok);
        config["n_shared_experts"] = json!(c.shared_experts);
        let mlp_scale = crate::config::parameter_scales(c.global_parameter_scale).2;
        config["moe_intermediate_size"] = json!(c.base_moe_mlp_dim << mlp_scale);
        config["routed_scaling_factor"] = json!(c.routed_scaling_factor);
        config["n_group"] = json!(groups);
        config["topk_group"] = json!(top_groups);
        config["norm_topk_prob"] = json!(true);
        config["scoring_func"] = json!("sigmoid");
        config["topk_method"] = json!("noaux_tc");
    }
    config["num_nextn_predict_layers"] = json!(0);
    config["max_position_embeddings"] = json!(c.max_position_embeddings);
    config["rope_interleave"] = json!(c.rope_interleave);
    config["rope_theta"] = json!(c.rope_max_timescale as f64);
    let mscale = if c.rope_attention_scaling { 0.0 } else { c.mscale };
    config["rope_scaling"] = json!({
        "rope_type": "yarn",
        "factor": c.rope_factor,
        "original_max_position_embeddings": c.original_max_position_embeddings,
        "beta_fast": c.beta_fast,
        "beta_slow": c.beta_slow,
        "truncate": c.rope_truncate,
        "mscale": mscale,
        "mscale_all_dim": mscale,
    });
    config
}

/// Every tensor of a deepseek model.
pub fn entries(c: &Config, model: &Model) -> Vec<Entry> {
    let m = &model.config;
    let mut out = outer_entries(model);
    let query: &[(&str, &str, Map)] = match c.q_lora_rank {
        0 => &[("query.kernel", "q_proj.weight", Map::linear(1))],
        _ => &[
            ("wq_a.kernel", "q_a_proj.weight", Map::linear(1)),
            ("q_norm.scale", "q_a_layernorm.weight", Map::COPY),
            ("wq_b.kernel", "q_b_proj.weight", Map::linear(1)),
        ],
    };
    let key_value: &[(&str, &str, Map)] = &[
        ("wkv_a.kernel", "kv_a_proj_with_mqa.weight", Map::linear(1)),
        ("kv_norm.scale", "kv_a_layernorm.weight", Map::COPY),
        ("wkv_b.kernel", "kv_b_proj.weight", Map::linear(1)),
        ("out.kernel", "o_proj.weight", Map::linear(2)),
    ];
    for layer in 0..m.layers {
        let hf = |name: &str| format!("model.layers.{layer}.{name}");
        let mut add =
            |name: &str, hf_name: &str, map: Map| out.push(layer_entry(model, layer, name, &[], hf(hf_name), map));
        add("pre_self_attention_layer_norm.scale", "input_layernorm.weight", Map::COPY);
        for (name, hf_name, map) in query.iter().chain(key_value) {
            add(&format!("self_attention.{name}"), &format!("self_attn.{hf_name}"), *map);
        }
        add("post_self_attention_layer_norm.scale", "post_attention_layernorm.weight", Map::COPY);
        const MLP: [(&str, &str); 3] = [("wi_0", "gate_proj"), ("wi_1", "up_proj"), ("wo", "down_proj")];
        if layer < c.first_num_dense_layers {
            for (name, hf_name) in MLP {
                add(&format!("mlp.{name}.kernel"), &format!("mlp.{hf_name}.weight"), Map::linear(1));
            }
            continue;
        }
        let block = "DeepSeekMoeBlock_0";
        add(&format!("{block}.MoeBlock_0.gate.kernel"), "mlp.gate.weight", Map::linear(1));
        add(&format!("{block}.MoeBlock_0.gate.bias"), "mlp.gate.e_score_correction_bias", Map::COPY);
        for (name, hf_name) in MLP {
            add(
                &format!("{block}.shared_experts.{name}.kernel"),
                &format!("mlp.shared_experts.{hf_name}.weight"),
                Map::linear(1),
            );
        }
        for expert in 0..c.num_experts {
            for (name, hf_name) in MLP {
                let hf_name = hf(&format!("mlp.experts.{expert}.{hf_name}.weight"));
                out.push(layer_entry(
                    model,
                    layer,
                    &format!("{block}.MoeBlock_0.{name}"),
                    &[expert],
                    hf_name,
                    Map::linear(1),
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a DeepSeek-V3 checkpoint has that maxrs does not model is refused naming the field;
    /// DeepSeek-V3's own YaRN maps onto MaxText's keys.
    #[test]
    fn deepseek_v3_fields_map_or_are_refused_by_name() {
        let v3 = json!({
            "model_type": "deepseek_v3", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4,
            "intermediate_size": 96, "num_hidden_layers": 2, "vocab_size": 128, "rms_norm_eps": 1e-6,
            "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 12,
            "first_k_dense_replace": 2, "max_position_embeddings": 163840, "rope_theta": 10000.0,
            "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
        });
        let keys = config_from_hf(&v3).unwrap();
        for want in [("q_lora_rank", "24"), ("rope_factor", "40"), ("mscale", "1"), ("rope_attention_scaling", "false")]
        {
            assert!(keys.contains(&(want.0.into(), want.1.into())), "{want:?} in {keys:?}");
        }
        let refused = |field: &str, value: Value, want: &str| {
            let mut c = v3.clone();
            match field.split_once('.') {
                Some((outer, inner)) => c[outer][inner] = value,
                None => c[field] = value,
            }
            let err = config_from_hf(&c).unwrap_err().to_string();
            assert!(err.starts_with(want), "{field}: {err}");
        };
        refused("num_nextn_predict_layers", json!(1), "`num_nextn_predict_layers` is 1 (multi-token prediction");
        refused("quantization_config", json!({"quant_method": "fp8"}), "`quantization_config` is");
        // Routed layers from `first_k_dense_replace` on, with DeepSeek-V3's defaults.
        let mut moe = v3.clone();
        moe["first_k_dense_replace"] = json!(1);
        let keys = config_from_hf(&moe).unwrap();
        for want in [
            ("first_num_dense_layers", "1"),
            ("num_experts", "256"),
            ("n_routing_groups", "8"),
            ("routed_bias", "true"),
        ] {
            assert!(keys.contains(&(want.0.into(), want.1.into())), "{want:?} in {keys:?}");
        }
        for (field, value, want) in [
            ("scoring_func", json!("softmax"), "`scoring_func` is \"softmax\""),
            ("norm_topk_prob", json!(false), "`norm_topk_prob` is false"),
            ("n_shared_experts", json!(0), "`n_shared_experts` is 0"),
        ] {
            let mut c = moe.clone();
            c[field] = value;
            let err = config_from_hf(&c).unwrap_err().to_string();
            assert!(err.starts_with(want), "{field}: {err}");
        }
        assert!(keys.contains(&("model_name".into(), "deepseek3-test".into())), "{keys:?}");
        refused("num_key_value_heads", json!(2), "`num_key_value_heads` is 2");
        refused("rope_scaling.mscale", json!(0.707), "`rope_scaling.mscale` is 0.707");
        refused("rope_scaling.type", json!("linear"), "`rope_scaling.rope_type` is \"linear\"");
        refused("rope_scaling", Value::Null, "`rope_scaling` is null");
        refused("max_position_embeddings", json!(4096), "`max_position_embeddings` is 4096");
    }

    /// DeepSeek-V3's published `config.json` (deepseek-ai/DeepSeek-V3, less its fp8
    /// `quantization_config`) converts under MaxText's deepseek3-671b, whose shapes it has, with
    /// its 8 expert groups (the model file has none): the keys load and route as DeepSeek-V3.
    /// The same model under kimi-k2-1t's name routes otherwise and is not converted to
    /// Hugging Face.
    #[test]
    fn a_routed_deepseek_v3_converts_under_a_deepseek3_model_name() {
        let v3 = json!({
            "model_type": "deepseek_v3", "hidden_size": 7168, "num_attention_heads": 128, "num_key_value_heads": 128,
            "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
            "first_k_dense_replace": 3, "vocab_size": 129280, "rms_norm_eps": 1e-6, "n_routed_experts": 256,
            "num_experts_per_tok": 8, "n_shared_experts": 1, "routed_scaling_factor": 2.5, "n_group": 8,
            "topk_group": 4, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64, "v_head_dim": 128, "max_position_embeddings": 163840, "rope_theta": 10000,
            "tie_word_embeddings": false, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
            "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
        });
        let keys = config_from_hf(&v3).unwrap();
        let args: Vec<String> = keys.iter().map(|(k, v)| format!("{k}={v}")).collect();
        assert!(args.contains(&"model_name=deepseek3-671b".to_string()), "{args:?}");
        let c = crate::config::load(None, &args).unwrap();
        let routed = |c: &Config| match crate::model::moe::MoeConfig::deepseek(c).unwrap().router {
            crate::model::moe::Router::DeepSeek(r) => (r.v3, r.groups),
            other => panic!("{other:?}"),
        };
        assert_eq!(routed(&c), (true, Some((8, 4))));
        check_model(&c).unwrap();
        let renamed: Vec<String> = args
            .iter()
            .map(|a| if a.starts_with("model_name=") { "model_name=kimi-k2-1t".into() } else { a.clone() })
            .collect();
        let err = check_model(&crate::config::load(None, &renamed).unwrap()).unwrap_err().to_string();
        assert!(
            err.starts_with("model_name=kimi-k2-1t: MaxText weighs this model's experts by their biased scores"),
            "{err}"
        );
    }
}
