//! Which family each `decoder_block` is: the one place that names every family file, so that
//! the shared decoder (`decoder.rs`) builds its `Family` without importing any of them. Also
//! the refusal of a family-specific key set for a family that does not read it.

use std::sync::Arc;

use crate::config::registry::{self, Families, Key};
use crate::config::{self, Config, DecoderBlock};

use super::family::Family;
use super::{
    deepseek, gemma, gemma2, gemma3, gemma4, gemma4_small, gpt3, gpt_oss, llama, llama4, mistral, mixtral, olmo3,
    qwen2, qwen3, qwen3_custom, ModelConfig,
};

/// Whether a key applies to a family.
type FamilyTest = fn(DecoderBlock) -> bool;

/// Keys MaxText reads in more families than maxrs implements them for, with those families and
/// what MaxText does with them there: `rope_linear_scaling_factor` scales every family's default RoPE (`RotaryEmbedding` in
/// `src/maxtext/layers/embeddings.py`; `Attention.init_rotary_embedding` in
/// `src/maxtext/layers/attentions.py`, e591f30, skips only gemma3's local layers and other kinds
/// of RoPE), which maxrs does but in DeepSeek's latent attention; `local_rope_max_timescale` every
/// `LOCAL_SLIDING` attention (gemma2's local layers). gpt3 has no RoPE.
/// `inhomogeneous_layer_cycle_interval` divides the scan length of every family MaxText scans
/// one layer at a time (`Decoder.__call__`, `src/maxtext/layers/decoders.py` at e591f30).
const NOT_YET: &[(&str, FamilyTest, &str)] = &[
    ("rope_linear_scaling_factor", |b| b == DecoderBlock::Deepseek, "applies it to the default RoPE there too"),
    ("local_rope_max_timescale", |b| b == DecoderBlock::Gemma2, "applies it to the default RoPE there too"),
    (
        "inhomogeneous_layer_cycle_interval",
        |b| !matches!(b, DecoderBlock::Gemma3 | DecoderBlock::Deepseek),
        "scans num_decoder_layers / inhomogeneous_layer_cycle_interval layers there",
    ),
    // Every family's `Attention` reads `attention_sink`, every `RoutedMoE` `mlp_bias`, and
    // deepseek's clamps its SwiGLU by a positive `mlp_activations_limit` (`layers/attentions.py`,
    // `layers/moe.py` at e591f30).
    ("attention_sink", |b| b != DecoderBlock::Gpt3, "adds the sinks to every attention's softmax"),
    ("mlp_bias", |b| b.has_experts(), "adds biases to the experts' projections there too"),
    ("mlp_activations_limit", |b| b == DecoderBlock::Deepseek, "clamps the experts' SwiGLU there when positive"),
];

/// The family `decoder_block` names, with its own keys read from `c`.
pub fn build(c: &Config, mc: &ModelConfig) -> anyhow::Result<Arc<dyn Family>> {
    // A key only some families read (its declaration names them) is ignored by the others in
    // MaxText; maxrs refuses a non-default value of it instead, checking the keys by name.
    let mut optional: Vec<&Key> = registry::keys().iter().filter(|k| matches!(k.families, Families::Only(_))).collect();
    optional.sort_by_key(|k| k.name);
    for declared in optional {
        let key = declared.name;
        if declared.read_by(c.decoder_block) {
            continue;
        }
        if let Some(value) = config::non_default_value(c, key) {
            let users: Vec<&str> =
                DecoderBlock::ALL.iter().filter(|b| declared.read_by(**b)).map(|b| b.as_str()).collect();
            let users = users.join(", ");
            let block = c.decoder_block;
            if let Some((_, _, what)) = NOT_YET.iter().find(|(k, families, _)| *k == key && families(block)) {
                return Err(anyhow::anyhow!(
                    "{key}={value}: not supported yet with decoder_block={block} (MaxText {what}); maxrs applies it to decoder_block {users}"
                ));
            }
            return Err(anyhow::anyhow!(
                "{key}={value}: decoder_block={block} does not use {key} (MaxText ignores it there); it applies to decoder_block {users}"
            ));
        }
    }
    Ok(match c.decoder_block {
        DecoderBlock::Llama2 => Arc::new(llama::Llama),
        DecoderBlock::Mistral => Arc::new(mistral::Mistral::from_config(c)),
        DecoderBlock::Gemma => Arc::new(gemma::Gemma),
        DecoderBlock::Gemma2 => Arc::new(gemma2::Gemma2::from_config(c)?),
        DecoderBlock::Gemma3 => Arc::new(gemma3::Gemma3::from_config(c)?),
        DecoderBlock::Gpt3 => Arc::new(gpt3::Gpt3::from_config(c, mc)?),
        DecoderBlock::Mixtral => Arc::new(mixtral::Mixtral::from_config(c, mc)?),
        DecoderBlock::Qwen2 => Arc::new(qwen2::Qwen2::from_config(c)),
        DecoderBlock::Qwen3 | DecoderBlock::Qwen3Moe => Arc::new(qwen3::Qwen3::from_config(c, mc)?),
        DecoderBlock::Qwen3CustomMoe => Arc::new(qwen3_custom::Qwen3Custom::from_config(c, mc)?),
        DecoderBlock::Deepseek => Arc::new(deepseek::Deepseek::from_config(c, mc)?),
        DecoderBlock::Olmo3 => Arc::new(olmo3::Olmo3::from_config(c)?),
        DecoderBlock::GptOss => Arc::new(gpt_oss::GptOss::from_config(c, mc)?),
        DecoderBlock::Llama4 => Arc::new(llama4::Llama4::from_config(c, mc)?),
        DecoderBlock::Gemma4 => Arc::new(gemma4::Gemma4::from_config(c, mc)?),
        DecoderBlock::Gemma4Small => Arc::new(gemma4_small::Gemma4Small::from_config(c, mc)?),
    })
}
