//! What `quantization` may be combined with. maxrs implements MaxText's `fp8` (flax's XLA-native
//! fp8 dot products with delayed scaling, `model::fp8`) and `te_fp8_currentscaling` (Transformer
//! Engine's current scaling, computed with the same XLA fp8 products) for the dense decoder
//! families; every other value of MaxText's is refused by name, as are the combinations whose fp8
//! state maxrs does not carry yet.

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
        Quantization::Fp8 | Quantization::TeFp8CurrentScaling => {}
        other => {
            return Err(ConfigError::invalid(
                "quantization",
                format!(
                "{other} is not supported yet; maxrs has quantization=fp8 and te_fp8_currentscaling (or \"\" for none)"
            ),
            ))
        }
    }
    if !FP8_FAMILIES.contains(&c.decoder_block) {
        let families: Vec<&str> = FP8_FAMILIES.iter().map(|b| b.as_str()).collect();
        return Err(ConfigError::invalid(
            "quantization",
            format!(
                "{} is not supported yet for decoder_block={}; it quantizes decoder_block {}",
                c.quantization,
                c.decoder_block,
                families.join(", ")
            ),
        ));
    }
    // Current scaling keeps no state: only delayed scaling's would be updated per micro-batch.
    if c.quantization == Quantization::Fp8 && c.gradient_accumulation_steps > 1 {
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

/// Pipeline stages run their own programs, which do not carry the fp8 state yet (nor has current
/// scaling been checked there).
pub(super) fn check_pipeline(c: &Config, pipelined: bool) -> Result<(), ConfigError> {
    if c.quantization != Quantization::None && pipelined {
        return Err(ConfigError::invalid(
            "quantization, ici_pipeline_parallelism",
            format!(
                "quantization={} with pipeline parallelism is not supported yet; use ici_pipeline_parallelism=1",
                c.quantization
            ),
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

#[cfg(test)]
mod tests {
    use super::super::{load, validate_decode};

    fn refusal(args: &[&str]) -> String {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let c = load(None, &args).unwrap();
        super::super::check(&c).unwrap_err().to_string()
    }

    /// MaxText's other recipes are refused by name, as are the families and combinations whose
    /// fp8 state maxrs does not carry; fp8 and te_fp8_currentscaling pass.
    #[test]
    fn other_values_and_combinations_are_refused_by_name() {
        let want = "is not supported yet; maxrs has quantization=fp8 and te_fp8_currentscaling (or \"\" for none)";
        for value in ["int8", "te_fp8_delayedscaling", "nanoo_fp8", "fp8_full"] {
            let r = refusal(&[&format!("quantization={value}")]);
            assert_eq!(r, format!("quantization: {value} {want}"));
        }
        let r = refusal(&["quantization=fp8", "decoder_block=gpt3", "override_model_config=true"]);
        assert!(r.contains("fp8 is not supported yet for decoder_block=gpt3"), "{r}");
        let r = refusal(&["quantization=fp8", "gradient_accumulation_steps=2"]);
        assert!(r.starts_with("quantization, gradient_accumulation_steps:"), "{r}");
        let current = ["quantization=te_fp8_currentscaling".to_string(), "gradient_accumulation_steps=2".to_string()];
        assert!(super::super::check(&load(None, &current).unwrap()).is_ok(), "current scaling keeps no state");
        let c = load(None, &["quantization=fp8".to_string()]).unwrap();
        assert!(super::super::check(&c).is_ok());
        let r = validate_decode(&c).unwrap_err().to_string();
        assert!(r.contains("not supported by maxrs decode yet"), "{r}");
    }
}
