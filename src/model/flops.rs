//! The shape of one train step's work per device ([`StepShape`]) and its TFLOPs ([`StepTflops`]).
//!
//! The FLOP count itself is the model's (`Model::training_tflops_per_device`, MaxText's
//! `calculate_tflops_training_per_device`): matmuls only, per device (every term uses
//! `per_device_batch_size`, not the global batch), forward + backward = 3 x forward, attention
//! scores counted causally (half of the full `S x S` products), as MaxText has done since 2025
//! (following Megatron-LM and NeMo); MaxText's older, non-causal figures are higher.

/// The per-device work of one train step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepShape {
    /// `per_device_batch_size`; MaxText allows fractions (e.g. 0.5: one sequence per two devices).
    pub per_device_batch_size: f64,
    /// `max_target_length`.
    pub max_target_length: u64,
    /// `gradient_accumulation_steps`: one step does this many micro-batches.
    pub gradient_accumulation_steps: u64,
}

impl StepShape {
    /// Tokens one device processes per step (MaxText's `calculate_tokens_training_per_device`).
    pub fn tokens_per_device(&self) -> f64 {
        self.max_target_length as f64 * self.per_device_batch_size * self.gradient_accumulation_steps as f64
    }
}

/// TFLOPs of one train step on one device, split as MaxText reports it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepTflops {
    pub total: f64,
    /// Matmuls against parameters: FFN, QKV and output projections, and the unembedding.
    pub learnable_weight: f64,
    /// The activation-activation matmuls of attention (`QK^T` and `PV`), causal.
    pub attention: f64,
}
