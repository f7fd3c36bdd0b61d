//! The shape of one train step's work per device, peak TFLOP/s per device kind, and MFU.
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

/// Dense bf16 peak TFLOP/s of one device, from the PJRT device kind (`Device::kind()`), unless
/// `configured` (`peak_tflops_per_device`) overrides it. `None` when unknown (CPU, new chips):
/// then no MFU is reported rather than a wrong one.
pub fn peak_tflops_per_device(device_kind: &str, configured: Option<f64>) -> Option<f64> {
    if configured.is_some() {
        return configured;
    }
    let kind = device_kind.to_ascii_lowercase();
    // Vendor datasheets, dense (no 2:4 sparsity) bf16. H100 PCIe and NVL run at lower clocks
    // and power than SXM, hence the lower peaks; the H200 has the H100 SXM's compute.
    let table: &[(&str, f64)] = &[
        ("h100 pcie", 756.0),
        ("h100 nvl", 835.0),
        ("h100", 989.0),
        ("h200", 989.0),
        ("a100", 312.0),
        ("tpu v4", 275.0),
        ("tpu v5 lite", 197.0),
        ("tpu v5", 459.0),
        ("tpu v6 lite", 918.0),
    ];
    table.iter().find(|(needle, _)| kind.contains(needle)).map(|&(_, peak)| peak)
}

/// Model FLOPs utilisation: achieved over peak, as a fraction (0.5 = 50%).
pub fn mfu(tflops_per_sec_per_device: f64, peak_tflops_per_device: f64) -> f64 {
    tflops_per_sec_per_device / peak_tflops_per_device
}
