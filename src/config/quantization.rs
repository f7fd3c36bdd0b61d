//! What `quantization` may be combined with. maxrs implements MaxText's `fp8` (flax's XLA-native
//! fp8 dot products with delayed scaling, `model::fp8`) for the dense decoder families; every
//! other value of MaxText's is refused by name, as are the combinations whose fp8 state maxrs
//! does not carry yet.

use super::choices::{DecoderBlock, Quantization};
use super::error::ConfigError;
use super::keys::Config;

/// The decoder families whose layers' projections and MLP are quantized: those built from the
/// shared attention and MLP blocks (`model::blocks`).
pub const FP8_FAMILIES: &[DecoderBlock] =
    &[DecoderBlock::Llama2, DecoderBlock::Mistral, DecoderBlock::Gemma, DecoderBlock::Gemma2];

/// The checks that need no devices.
pub(super) fn check(c: &Config) -> Result<(), ConfigError> {
    match c.quantization {
        Quantization::None => return Ok(()),
        Quantization::Fp8 => {}
        other => {
            return Err(ConfigError::invalid(
                "quantization",
                format!("{other} is not supported yet; maxrs has quantization=fp8 (or \"\" for none)"),
            ))
        }
    }
    if !FP8_FAMILIES.contains(&c.decoder_block) {
        let families: Vec<&str> = FP8_FAMILIES.iter().map(|b| b.as_str()).collect();
        return Err(ConfigError::invalid(
            "quantization",
            format!(
                "fp8 is not supported yet for decoder_block={}; it quantizes decoder_block {}",
                c.decoder_block,
                families.join(", ")
            ),
        ));
    }
    if c.gradient_accumulation_steps > 1 {
        return Err(ConfigError::invalid(
            "quantization, gradient_accumulation_steps",
            format!(
                "quantization=fp8 with gradient_accumulation_steps={} is not supported yet (each micro-batch would \
                 update the fp8 scales); use gradient_accumulation_steps=1",
                c.gradient_accumulation_steps
            ),
        ));
    }
    Ok(())
}

/// Pipeline stages run their own programs, which do not carry the fp8 state yet.
pub(super) fn check_pipeline(c: &Config, pipelined: bool) -> Result<(), ConfigError> {
    if c.quantization == Quantization::Fp8 && pipelined {
        return Err(ConfigError::invalid(
            "quantization, ici_pipeline_parallelism",
            "quantization=fp8 with pipeline parallelism is not supported yet; use ici_pipeline_parallelism=1",
        ));
    }
    Ok(())
}

/// `maxrs decode` runs the model unquantized only.
pub(super) fn check_decode(c: &Config) -> Result<(), ConfigError> {
    if c.quantization != Quantization::None {
        return Err(ConfigError::invalid(
            "quantization",
            format!(
                "{} is not supported by maxrs decode yet; decode with quantization=\"\" (an fp8 run's checkpoint holds \
                 the same parameters)",
                c.quantization
            ),
        ));
    }
    Ok(())
}
