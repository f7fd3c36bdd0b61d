//! gpt-oss's Hugging Face layout (`GptOssForCausalLM`, `model_type: gpt_oss`): its `config.json`
//! fields and tensor names, to and from maxrs's `gpt_oss` block (`model/gpt_oss.rs`), and the
//! dequantization of the published checkpoints' MXFP4 experts.
//!
//! Hugging Face layer `N` is maxrs's block `N / b`, layer `j = N % b` (`layers_<j>.` in the
//! block of `b = inhomogeneous_layer_cycle_interval` layers, 2 from a `config.json`); unscanned,
//! the stacks name it `decoder.layers_<N>`. Experts `X`, width `M`:
//!
//! | Hugging Face (`model.layers.N.` / `model.`) | maxrs (in layer `layers_<j>.`) | map |
//! |---|---|---|
//! | `embed_tokens.weight`, `norm.weight`, `lm_head.weight` | as Llama's | |
//! | `input_layernorm.weight` | `pre_self_attention_layer_norm.scale` | copied |
//! | `self_attn.{q,k,v,o}_proj.weight` | `GptOssAttention.{query,key,value,out}.kernel` | transposed |
//! | `self_attn.{q,k,v}_proj.bias` [H * D], [K * D] | `GptOssAttention.{query,key,value}.bias` | reshaped |
//! | `self_attn.o_proj.bias` [E] | `GptOssAttention.out.bias` | copied |
//! | `self_attn.sinks` [H] | `GptOssAttention.sinks` | copied |
//! | `post_attention_layernorm.weight` | `post_self_attention_layer_norm.scale` | copied |
//! | `mlp.router.weight` [X, E], `.bias` [X] | `GptOssMlp.gate.kernel` [E, X], `.bias` | transposed, copied |
//! | `mlp.experts.gate_up_proj` [X, E, 2M] | `GptOssMlp.wi_0`, `wi_1` [X, E, M] | even, odd columns |
//! | `mlp.experts.gate_up_proj_bias` [X, 2M] | `GptOssMlp.wi_0_bias`, `wi_1_bias` | even, odd columns |
//! | `mlp.experts.down_proj` [X, M, E], `_bias` [X, E] | `GptOssMlp.wo`, `wo_bias` | copied |
//!
//! (transformers' `GptOssExperts._apply_gate` takes the gate from the even columns of
//! `gate_up_proj`, the up-projection from the odd ones; `models/gpt_oss/modeling_gpt_oss.py` in
//! transformers 5.23.0.)
//!
//! `config.json`: `rope_theta` and `rope_scaling` (or transformers 5's `rope_parameters`) give
//! YaRN's keys as olmo3's do (`olmo3::yarn_keys`); `sliding_window` `sliding_window_size`;
//! `layer_types` must alternate sliding and full attention from a sliding one; `swiglu_limit`
//! (default 7) `mlp_activations_limit`; `swiglu_alpha` must be 1.702 (MaxText's constant);
//! `num_local_experts`, `num_experts_per_tok`.
//!
//! **MXFP4** ([`dequantize_mxfp4`]): OpenAI's checkpoints store the experts' kernels as
//! `<name>_blocks` (u8 `[..., rows, G, 16]`, two 4-bit E2M1 values a byte, the low nibble first)
//! and `<name>_scales` (u8 `[..., rows, G]`, a power-of-two exponent biased by 127, one per 32
//! values), read as transformers' `_convert_moe_packed_tensors` (`integrations/mxfp4.py`,
//! 5.23.0) reads them: value `FP4_VALUES[nibble] * 2^(scale - 127)`, the `G * 32` values of a row
//! along the last axis, then the last two axes swapped. Every such value is exact in bfloat16.

use std::collections::BTreeMap;

use anyhow::{bail, Result};
use serde_json::{json, Value};

use super::llama::{common_config, common_keys};
use super::olmo3::{cycled_entries, rope_parameters, yarn_keys};
use super::{Entry, Fields, Map};
use crate::config::{Config, RopeType};
use crate::host::{DType, HostTensor};
use crate::model::gpt_oss::PATTERN;
use crate::model::Model;

/// One layer's tensors: maxrs name (in `layers_<j>.`), Hugging Face name (in `model.layers.N.`).
const LAYER: &[(&str, &str, Map)] = &[
    ("pre_self_attention_layer_norm.scale", "input_layernorm.weight", Map::COPY),
    ("GptOssAttention.query.kernel", "self_attn.q_proj.weight", Map::linear(1)),
    ("GptOssAttention.key.kernel", "self_attn.k_proj.weight", Map::linear(1)),
    ("GptOssAttention.value.kernel", "self_attn.v_proj.weight", Map::linear(1)),
    ("GptOssAttention.out.kernel", "self_attn.o_proj.weight", Map::linear(2)),
    ("GptOssAttention.query.bias", "self_attn.q_proj.bias", Map::FLAT),
    ("GptOssAttention.key.bias", "self_attn.k_proj.bias", Map::FLAT),
    ("GptOssAttention.value.bias", "self_attn.v_proj.bias", Map::FLAT),
    ("GptOssAttention.out.bias", "self_attn.o_proj.bias", Map::COPY),
    ("GptOssAttention.sinks", "self_attn.sinks", Map::COPY),
    ("post_self_attention_layer_norm.scale", "post_attention_layernorm.weight", Map::COPY),
    ("GptOssMlp.gate.kernel", "mlp.router.weight", Map::linear(1)),
    ("GptOssMlp.gate.bias", "mlp.router.bias", Map::COPY),
    ("GptOssMlp.wi_0", "mlp.experts.gate_up_proj", Map::pair(0)),
    ("GptOssMlp.wi_1", "mlp.experts.gate_up_proj", Map::pair(1)),
    ("GptOssMlp.wi_0_bias", "mlp.experts.gate_up_proj_bias", Map::pair(0)),
    ("GptOssMlp.wi_1_bias", "mlp.experts.gate_up_proj_bias", Map::pair(1)),
    ("GptOssMlp.wo", "mlp.experts.down_proj", Map::COPY),
    ("GptOssMlp.wo_bias", "mlp.experts.down_proj_bias", Map::COPY),
];

/// transformers' `swiglu_alpha` default, MaxText's constant (`apply_ffn_activation`).
const ALPHA: f64 = 1.702;

/// `rope_theta` and the YaRN scaling (`None`: default RoPE), from transformers 5's
/// `rope_parameters` or the hub's `rope_theta` and `rope_scaling`.
fn rope(hf: &Value) -> Result<(Value, Option<(&'static str, Value)>)> {
    let parameters = &hf["rope_parameters"];
    let (theta, scaling, field) = match parameters.is_object() {
        true => (parameters["rope_theta"].clone(), parameters.clone(), "rope_parameters"),
        false => (hf["rope_theta"].clone(), hf["rope_scaling"].clone(), "rope_scaling"),
    };
    let kind = scaling.get("rope_type").or_else(|| scaling.get("type")).and_then(|k| k.as_str());
    match kind {
        None | Some("default") => Ok((theta, None)),
        Some("yarn") => Ok((theta, Some((field, scaling)))),
        Some(other) => bail!("`{field}.rope_type` is {other:?}: maxrs's gpt_oss has YaRN or the default RoPE"),
    }
}

/// maxrs configuration keys (`key=value` text) for a gpt-oss `config.json`.
pub fn config_from_hf(hf: &Value) -> Result<Vec<(String, String)>> {
    let fields = Fields(hf);
    if fields.flag("tie_word_embeddings")? == Some(true) {
        bail!("`tie_word_embeddings` is true: tied gpt-oss logits are not supported yet (MaxText's gpt-oss files are untied)");
    }
    if fields.flag("attention_bias")? == Some(false) {
        bail!("`attention_bias` is false: converting gpt-oss without attention biases is not supported yet");
    }
    let alpha = fields.value("swiglu_alpha", "mlp_activations_limit", Some(ALPHA))?;
    if alpha != ALPHA {
        bail!("`swiglu_alpha` is {alpha}: MaxText's gpt_oss scales the gate by 1.702 (apply_ffn_activation)");
    }
    let mut keys =
        vec![("model_name".to_string(), "gpt-oss-20b".to_string()), ("override_model_config".into(), "true".into())];
    keys.extend(common_keys(&fields)?);
    let layers = fields.number("num_hidden_layers", "base_num_decoder_layers", None)?;
    if layers % PATTERN != 0 {
        bail!("`num_hidden_layers` is {layers}: maxrs's gpt_oss scans blocks of 2 layers (sliding, full); other counts are not supported yet");
    }
    if let Some(types) = hf["layer_types"].as_array() {
        for i in 0..layers {
            let want = if i % PATTERN == 0 { "sliding_attention" } else { "full_attention" };
            if types.get(i as usize).and_then(|t| t.as_str()) != Some(want) {
                bail!(
                    "`layer_types[{i}]` is {}: maxrs's gpt_oss has a sliding_attention layer, then a full_attention one, repeated",
                    types.get(i as usize).unwrap_or(&Value::Null)
                );
            }
        }
    }
    let window = fields.window()?;
    if window == 0 {
        bail!("`sliding_window` is null: gpt_oss's sliding layers need a window");
    }
    let experts = fields.number("num_local_experts", "num_experts", None)?;
    let per_token = fields.number("num_experts_per_tok", "num_experts_per_tok", None)?;
    let limit = fields.value("swiglu_limit", "mlp_activations_limit", Some(7.0))?;
    let (theta, scaling) = rope(hf)?;
    let with_theta = json!({ "rope_theta": theta });
    let theta = Fields(&with_theta).number("rope_theta", "rope_max_timescale", Some(10000))?;
    let positions = fields.number("max_position_embeddings", "max_position_embeddings", None)?;
    keys.extend(
        [
            ("decoder_block", "gpt_oss".to_string()),
            ("inhomogeneous_layer_cycle_interval", PATTERN.to_string()),
            ("sliding_window_size", window.to_string()),
            ("num_experts", experts.to_string()),
            ("num_experts_per_tok", per_token.to_string()),
            ("mlp_activations_limit", limit.to_string()),
            ("rope_max_timescale", theta.to_string()),
            ("max_position_embeddings", positions.to_string()),
            ("logits_via_embedding", "false".into()),
        ]
        .map(|(k, v)| (k.to_string(), v)),
    );
    match scaling {
        None => keys.push(("rope_type".into(), "default".into())),
        Some((field, scaling)) => keys.extend(yarn_keys("gpt_oss", field, &scaling)?),
    }
    Ok(keys)
}

/// Refuses a gpt_oss model Hugging Face's `GptOssForCausalLM` cannot express.
pub fn check_model(c: &Config) -> Result<()> {
    let missing = [
        ("attention_bias", c.attention_bias),
        ("attention_sink", c.attention_sink),
        ("routed_bias", c.routed_bias),
        ("mlp_bias", c.mlp_bias),
    ];
    if let Some((key, _)) = missing.iter().find(|(_, set)| !*set) {
        bail!("{key}=false: Hugging Face's gpt-oss always has it (true in the gpt-oss model files)");
    }
    if c.logits_via_embedding {
        bail!("logits_via_embedding=true: converting tied gpt-oss logits is not supported yet");
    }
    if c.mlp_activations != ["sigmoid", "linear"] {
        bail!(
            "mlp_activations=[{}]: Hugging Face's gpt-oss gate is sigmoid ([sigmoid, linear])",
            c.mlp_activations.join(", ")
        );
    }
    if c.rope_type == RopeType::Yarn && (c.rope_interleave || !c.rope_attention_scaling) {
        bail!(
            "rope_interleave={} rope_attention_scaling={}: Hugging Face's gpt-oss YaRN rotates the two halves and scales by 0.1 ln(factor) + 1 (rope_interleave=false rope_attention_scaling=true)",
            c.rope_interleave,
            c.rope_attention_scaling
        );
    }
    if c.rope_type == RopeType::Default && c.rope_linear_scaling_factor != 1.0 {
        bail!(
            "rope_linear_scaling_factor={}: converting a linear RoPE scaling of gpt_oss is not supported yet",
            c.rope_linear_scaling_factor
        );
    }
    Ok(())
}

/// The Hugging Face `config.json` of a gpt_oss model.
pub fn hf_config(c: &Config, model: &Model, torch_dtype: &str) -> Value {
    let layers = (0..model.config.layers).map(|i| match i % PATTERN {
        0 => "sliding_attention",
        _ => "full_attention",
    });
    let mut config = common_config(c, model, torch_dtype);
    config["architectures"] = json!(["GptOssForCausalLM"]);
    config["model_type"] = json!("gpt_oss");
    config["layer_types"] = json!(layers.collect::<Vec<_>>());
    config["attention_bias"] = json!(true);
    config["tie_word_embeddings"] = json!(false);
    config["sliding_window"] = json!(c.sliding_window_size);
    config["num_local_experts"] = json!(c.num_experts);
    config["num_experts_per_tok"] = json!(c.num_experts_per_tok);
    config["swiglu_limit"] = json!(c.mlp_activations_limit);
    config["swiglu_alpha"] = json!(ALPHA);
    config["rope_parameters"] = rope_parameters(c, &mut config);
    config
}

/// Every tensor of a gpt_oss model (blocks of `inhomogeneous_layer_cycle_interval` layers).
pub fn entries(c: &Config, model: &Model) -> Vec<Entry> {
    cycled_entries(c, model, LAYER)
}

/// transformers' `FP4_VALUES` (`integrations/mxfp4.py`): the E2M1 value of each 4-bit code.
const FP4_VALUES: [f32; 16] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

/// `tensors` with each MXFP4 pair `<name>_blocks`, `<name>_scales` replaced by `<name>` in
/// bfloat16 (see the module header); a `_blocks` tensor without its `_scales` (or of the wrong
/// shape or type) is refused by name.
pub fn dequantize_mxfp4(tensors: &mut BTreeMap<String, HostTensor>) -> Result<()> {
    let packed: Vec<String> = tensors.keys().filter_map(|k| k.strip_suffix("_blocks")).map(str::to_string).collect();
    for name in packed {
        let blocks = tensors.remove(&format!("{name}_blocks")).expect("listed");
        let Some(scales) = tensors.remove(&format!("{name}_scales")) else {
            bail!("{name}_blocks has no {name}_scales: an MXFP4 tensor needs both");
        };
        let rank = blocks.dims.len();
        if blocks.ty != DType::U8
            || scales.ty != DType::U8
            || rank < 3
            || blocks.dims[rank - 1] != 16
            || scales.dims != blocks.dims[..rank - 1]
        {
            bail!(
                "{name}_blocks {:?} {:?} and {name}_scales {:?} {:?}: MXFP4 needs u8 blocks [..., rows, G, 16] and u8 scales [..., rows, G]",
                blocks.ty,
                blocks.dims,
                scales.ty,
                scales.dims
            );
        }
        // `[..., rows, G * 32]` values, then the last two axes swapped.
        let (rows, cols) = (blocks.dims[rank - 3], blocks.dims[rank - 2] * 32);
        let values: Vec<f32> = blocks
            .data
            .chunks(16)
            .zip(&scales.data)
            .flat_map(|(bytes, &scale)| {
                let factor = 2f32.powi(scale as i32 - 127);
                bytes.iter().flat_map(move |b| [b & 0x0f, b >> 4].map(|nibble| FP4_VALUES[nibble as usize] * factor))
            })
            .collect();
        let lead = &blocks.dims[..rank - 3];
        let mut swapped = vec![0f32; values.len()];
        for (m, matrix) in values.chunks((rows * cols) as usize).enumerate() {
            let out = &mut swapped[m * matrix.len()..(m + 1) * matrix.len()];
            for r in 0..rows as usize {
                for c in 0..cols as usize {
                    out[c * rows as usize + r] = matrix[r * cols as usize + c];
                }
            }
        }
        let dims: Vec<i64> = lead.iter().copied().chain([cols, rows]).collect();
        let dequantized = crate::host::convert_float(&HostTensor::from_f32(&dims, &swapped), DType::BF16);
        tensors.insert(name, dequantized);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two experts of one row and 32 values each: codes 0x21 (low nibble 1: 0.5, high 2: 1.0)
    /// then 0xf7 (7: 6.0, 15: -6.0) and the rest 0, under scales 128 (x2) and 125 (x1/4); the
    /// result is `[experts, 32, 1]`, each row's values down the column.
    #[test]
    fn mxfp4_dequantizes_as_transformers_reads_it() {
        let mut bytes = vec![0u8; 32];
        for e in 0..2 {
            bytes[16 * e] = 0x21;
            bytes[16 * e + 1] = 0xf7;
        }
        let mut t = BTreeMap::new();
        t.insert("w_blocks".to_string(), HostTensor::new(DType::U8, &[2, 1, 1, 16], bytes));
        t.insert("w_scales".to_string(), HostTensor::new(DType::U8, &[2, 1, 1], vec![128, 125]));
        dequantize_mxfp4(&mut t).unwrap();
        let w = &t["w"];
        assert_eq!((w.ty, w.dims.clone()), (DType::BF16, vec![2, 32, 1]));
        let v = w.to_f64();
        assert_eq!(v[..4], [1.0, 2.0, 12.0, -12.0]);
        assert_eq!(v[32..36], [0.125, 0.25, 1.5, -1.5]);
        assert!(v[4..32].iter().chain(&v[36..]).all(|x| *x == 0.0));
        let mut lone = BTreeMap::new();
        lone.insert("x_blocks".to_string(), HostTensor::new(DType::U8, &[1, 1, 1, 16], vec![0; 16]));
        let err = dequantize_mxfp4(&mut lone).unwrap_err().to_string();
        assert_eq!(err, "x_blocks has no x_scales: an MXFP4 tensor needs both");
    }
}
