//! Model FLOPs per train step, peak TFLOP/s per device kind, and MFU.
//!
//! The count is MaxText's `calculate_tflops_training_per_device` (maxtext_utils.py) for
//! decoders with standard multi-head / grouped-query attention, dense or with routed experts
//! (Mixtral: only the `num_experts_per_tok` active experts count, plus the router; MaxText main
//! e591f30, `src/maxtext/utils/maxtext_utils.py`). It counts matmuls only, per
//! device: every term uses `per_device_batch_size`, not the global batch, so the result is what
//! one device computes when the global batch is spread evenly. Forward + backward = 3 x forward.
//! Attention scores are counted causally (half of the full `S x S` products), as MaxText has done
//! since 2025 (following Megatron-LM and NeMo); MaxText's older, non-causal figures are higher.

/// The model dimensions the FLOP count depends on (MaxText's config names in the docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelDims {
    /// `emb_dim`.
    pub emb: u64,
    /// `num_query_heads`.
    pub num_query_heads: u64,
    /// `num_kv_heads`.
    pub num_kv_heads: u64,
    /// `head_dim`.
    pub head_dim: u64,
    /// `mlp_dim`.
    pub mlp_dim: u64,
    /// `num_decoder_layers`.
    pub num_layers: u64,
    /// `vocab_size`.
    pub vocab: u64,
    /// `len(mlp_activations)`: 2 for Llama's `["silu", "linear"]` (gate and up projections).
    pub mlp_activations_count: u64,
    /// `num_experts`: more than 1 makes every layer's MLP a routed MoE block of `mlp_dim`-wide
    /// experts.
    pub num_experts: u64,
    /// `num_experts_per_tok`: the experts each token runs through.
    pub num_experts_per_tok: u64,
}

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

/// MaxText's `calculate_tflops_training_per_device` for a dense or a Mixtral-style MoE decoder.
pub fn training_tflops_per_device(dims: &ModelDims, shape: &StepShape) -> StepTflops {
    let b = shape.per_device_batch_size;
    let s = shape.max_target_length as f64;
    let emb = dims.emb as f64;
    let mlp = dims.mlp_dim as f64;
    let heads = dims.num_query_heads as f64;
    let kv_heads = dims.num_kv_heads as f64;
    let hd = dims.head_dim as f64;
    let layers = dims.num_layers as f64;
    let vocab = dims.vocab as f64;

    // One up-projection per activation (gate and up for SwiGLU) plus the down-projection; with
    // experts, per active expert, plus the router's logits (one per expert).
    let one_mlp = 2.0 * b * s * mlp * emb * dims.mlp_activations_count as f64 + 2.0 * b * s * mlp * emb;
    let ffn = match dims.num_experts {
        0 | 1 => one_mlp,
        experts => 2.0 * b * s * emb * experts as f64 + one_mlp * dims.num_experts_per_tok as f64,
    };
    let qkv = 2.0 * b * s * emb * (heads + 2.0 * kv_heads) * hd;
    let out_projection = 2.0 * b * s * emb * heads * hd;
    let unembedding = 2.0 * b * s * emb * vocab;
    // QK^T and PV: 2 matmuls x 2 FLOPs per multiply-add; the causal mask halves the useful work.
    let causal_attention = 4.0 * b * s * s * heads * hd / 2.0;

    let accumulation = shape.gradient_accumulation_steps as f64;
    let learnable_weight = ((ffn + qkv + out_projection) * layers + unembedding) * 3.0 / 1e12 * accumulation;
    let attention = causal_attention * layers * 3.0 / 1e12 * accumulation;
    StepTflops { total: learnable_weight + attention, learnable_weight, attention }
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
