//! What the attention-kind keys must be together: `attention_type` (global for every family but
//! deepseek, whose layers are MaxText's multi-head latent attention, `mla`), `rope_type=yarn`
//! (implemented for deepseek's latent attention and olmo3 only), the latent attention's sizes, and
//! multi-token prediction (not supported yet).

use super::choices::{AttentionType, DecoderBlock, RopeType};
use super::error::ConfigError;
use super::keys::Config;

impl Config {
    /// The width of each query and key head the attention kernels see: multi-head latent
    /// attention's `qk_nope_head_dim + qk_rope_head_dim`, else `head_dim`.
    pub fn qk_head_dim(&self) -> i64 {
        match self.attention_type {
            AttentionType::Mla => self.qk_nope_head_dim + self.qk_rope_head_dim,
            _ => self.head_dim,
        }
    }
}

pub(super) fn check(c: &Config) -> Result<(), ConfigError> {
    let deepseek = c.decoder_block == DecoderBlock::Deepseek;
    if c.mtp_num_layers > 0 {
        return Err(ConfigError::invalid(
            "mtp_num_layers",
            format!(
                "mtp_num_layers={}: multi-token prediction is not supported yet; set mtp_num_layers=0",
                c.mtp_num_layers
            ),
        ));
    }
    match (deepseek, c.attention_type) {
        (true, AttentionType::Mla) | (false, AttentionType::Global) => {}
        (true, other) => {
            return Err(ConfigError::invalid(
                "attention_type",
                format!("attention_type={other}: decoder_block=deepseek's layers are multi-head latent attention; set attention_type=mla"),
            ))
        }
        (false, other) => {
            return Err(ConfigError::invalid(
                "attention_type",
                format!(
                    "attention_type={other} is not supported yet for decoder_block={}; use global (mla is deepseek's)",
                    c.decoder_block
                ),
            ))
        }
    }
    if c.rope_type == RopeType::Yarn
        && !deepseek
        && !matches!(c.decoder_block, DecoderBlock::Olmo3 | DecoderBlock::GptOss)
    {
        return Err(ConfigError::invalid(
            "rope_type",
            format!(
                "yarn is supported for decoder_block=deepseek, olmo3 and gpt_oss only yet (decoder_block={}); use rope_type=default or llama3.1",
                c.decoder_block
            ),
        ));
    }
    if !deepseek {
        return Ok(());
    }
    if c.rope_type == RopeType::Llama31 {
        return Err(ConfigError::invalid(
            "rope_type",
            "llama3.1 is not supported yet for decoder_block=deepseek; use rope_type=yarn or default",
        ));
    }
    if c.base_num_query_heads != c.base_num_kv_heads {
        return Err(ConfigError::invalid(
            "base_num_kv_heads",
            format!(
                "base_num_kv_heads={}: multi-head latent attention has one key and value per query head; set it to base_num_query_heads={}",
                c.base_num_kv_heads, c.base_num_query_heads
            ),
        ));
    }
    if c.qk_rope_head_dim % 2 != 0 {
        return Err(ConfigError::invalid(
            "qk_rope_head_dim",
            format!(
                "qk_rope_head_dim={}; rotary embeddings rotate pairs of dimensions, so it must be even",
                c.qk_rope_head_dim
            ),
        ));
    }
    Ok(())
}
