//! What `quantization` may be combined with. maxrs implements MaxText's `fp8` (flax's XLA-native
//! fp8 dot products with delayed scaling, `model::fp8`) and `te_fp8_currentscaling` (Transformer
//! Engine's current scaling, computed with the same XLA fp8 products) for the dense decoder
//! families, and `fp8` for Mixtral's token-dropping and all-experts MoE paths; every other value
//! of MaxText's is refused by name, as are the combinations whose fp8 state maxrs does not carry
//! yet and those MaxText cannot run.

use super::choices::{DecoderBlock, Quantization};
use super::error::ConfigError;
use super::keys::Config;

/// The decoder families whose layers' products are quantized: those built from the shared
/// attention and MLP blocks (`model::blocks`), and Mixtral's (those attention blocks and the
/// experts of `model::moe`, `fp8` only: see [`check_experts`]).
pub const FP8_FAMILIES: &[DecoderBlock] =
    &[DecoderBlock::Llama2, DecoderBlock::Mistral, DecoderBlock::Gemma, DecoderBlock::Gemma2, DecoderBlock::Mixtral];

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
    if c.decoder_block.has_experts() {
        check_experts(c)?;
    }
    // MaxText refuses delayed scaling with accumulation ("FP8 quantization is not compatible with
    // gradient accumulation", `src/maxtext/configs/types.py` at e591f30); current scaling keeps no
    // state and MaxText accepts it. (A pipeline's microbatches share the state as flax does.)
    if c.quantization == Quantization::Fp8 && c.gradient_accumulation_steps > 1 {
        return Err(ConfigError::invalid(
            "quantization, gradient_accumulation_steps",
            format!(
                "quantization=fp8 with gradient_accumulation_steps={} is not supported: MaxText refuses fp8's \
                 delayed scaling with gradient accumulation; use gradient_accumulation_steps=1 (or \
                 quantization=te_fp8_currentscaling)",
                c.gradient_accumulation_steps
            ),
        ));
    }
    Ok(())
}

/// The MoE paths MaxText e591f30 can quantize (`layers/moe.py`, `layers/quantizations.py`):
/// `dense_matmul`'s einsums come from `quant.einsum()`, which Transformer Engine's recipes raise
/// on, and the dropless `sparse_matmul` reads `quant.quant_dg`, which `Fp8Quantization` lacks
/// (an AttributeError): `fp8` with `sparse_matmul=false` only.
fn check_experts(c: &Config) -> Result<(), ConfigError> {
    if c.quantization == Quantization::TeFp8CurrentScaling {
        return Err(ConfigError::invalid(
            "quantization",
            format!(
                "te_fp8_currentscaling is not supported for decoder_block={}: MaxText's Transformer Engine \
                 quantization has no einsum for the experts; use quantization=fp8",
                c.decoder_block
            ),
        ));
    }
    if c.sparse_matmul {
        return Err(ConfigError::invalid(
            "quantization, sparse_matmul",
            format!(
                "quantization={} with sparse_matmul=true is not supported: MaxText's dropless experts read the AQT \
                 config (quant_dg) that fp8 has none of; use sparse_matmul=false (with capacity_factor as wanted)",
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
        assert!(r.ends_with("it quantizes decoder_block llama2, mistral, gemma, gemma2, mixtral"), "{r}");
        let r = refusal(&["quantization=fp8", "decoder_block=qwen3_moe"]);
        assert!(r.contains("fp8 is not supported yet for decoder_block=qwen3_moe"), "{r}");
        let mixtral = ["quantization=fp8", "decoder_block=mixtral", "num_experts=4", "num_experts_per_tok=2"];
        let r = refusal(&[&mixtral[..], &["sparse_matmul=true"]].concat());
        assert!(r.starts_with("quantization, sparse_matmul: quantization=fp8 with sparse_matmul=true"), "{r}");
        let r = refusal(&[&mixtral[1..], &["sparse_matmul=false", "quantization=te_fp8_currentscaling"]].concat());
        assert!(r.starts_with("quantization: te_fp8_currentscaling is not supported for decoder_block=mixtral"), "{r}");
        for capacity in ["capacity_factor=1", "capacity_factor=-1"] {
            let args: Vec<String> =
                [&mixtral[..], &["sparse_matmul=false", capacity]].concat().iter().map(|a| a.to_string()).collect();
            let c = load(None, &args).unwrap();
            assert!(super::super::check(&c).is_ok(), "{capacity}");
        }
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
