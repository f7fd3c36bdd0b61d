//! `ModelConfig`: what every decoder family reads from the run's `Config` (sizes scaled by
//! `global_parameter_scale`, numerics, RoPE, embedding and logits options, layer stacking, remat,
//! sharding rules), and MaxText's `remat_policy` names as tracer policies. A family's own keys
//! (a sliding window, soft caps, experts) are read by the family itself.

use crate::config::{self, Config};
use crate::ir::DType;
use crate::sharding::LogicalRules;
use crate::tensor::RematPolicy;

use super::context_parallel::ContextParallel;
use super::fp8::Scaling;
use super::kernel::{self, AttentionImpl};
use super::lora::Lora;

/// The sizes and numerics every decoder family shares. Sizes are the effective ones (MaxText's
/// `emb_dim`, `num_query_heads`, ...: the `base_*` keys scaled by `global_parameter_scale`).
#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub emb: i64,
    pub heads: i64,
    pub kv_heads: i64,
    pub head_dim: i64,
    pub mlp: i64,
    /// MaxText's decoder layers (`base_num_decoder_layers` scaled; a Gemma 2 decoder layer is a
    /// local and a global one).
    pub layers: i64,
    pub vocab: i64,
    /// `mlp_activations`: one input projection per entry, multiplied together (`[silu, linear]`
    /// is SwiGLU).
    pub mlp_activations: Vec<String>,
    pub eps: f64,
    pub rope_max_timescale: f64,
    pub rope: Rope,
    /// `rope_linear_scaling_factor`: the default RoPE's timescales are multiplied by it.
    pub rope_linear_factor: f64,
    pub logits_via_embedding: bool,
    /// With `logits_via_embedding`: the logits are divided by `sqrt(emb)`.
    pub normalize_embedding_logits: bool,
    /// With `logits_via_embedding`: `cap * tanh(logits / cap)`.
    pub final_logits_soft_cap: Option<f64>,
    /// Learned position embeddings for this many positions (`trainable_position_size > 0`).
    pub trainable_position_size: Option<i64>,
    /// Activations.
    pub dtype: DType,
    /// Parameters.
    pub weight_dtype: DType,
    pub scan_layers: bool,
    /// How attention is computed (`attention`, resolved once by `kernel.rs` for the hardware,
    /// the sequence length and the soft cap).
    pub attention: AttentionImpl,
    /// Attention's scores become `cap * tanh(scores / cap)` (`attn_logits_soft_cap` when positive;
    /// read by Gemma 2 and 3).
    pub attn_logits_soft_cap: Option<f64>,
    /// At most this many documents in a packed row (`max_segments_per_seq` when > 0; the data
    /// packer keeps to it): what cuDNN's packed layout needs to attend within documents.
    pub max_segments_per_seq: Option<i64>,
    /// The logits as an f32 matmul (MaxText's `logits_dot_in_fp32`).
    pub logits_dot_in_fp32: bool,
    /// The token embedding as a one-hot matmul instead of a gather (MaxText's `use_iota_embed`).
    pub use_iota_embed: bool,
    /// `num_vocab_tiling`: the loss's logits in this many tiles of the tokens, each recomputed in
    /// the backward pass (`Model::loss`); 1: all at once.
    pub vocab_tiles: i64,
    /// `vocab_tiling_ag_once`: the tiles read the head's weights gathered once, whole over the
    /// axes that shard their `embed` dimension.
    pub vocab_tiling_ag_once: bool,
    /// Per-layer rematerialization.
    pub remat: RematPolicy,
    /// Whether a layer's recomputation reads its inputs through an optimization barrier: JAX's
    /// `prevent_cse`, as MaxText sets it (`should_prevent_cse_in_remat`,
    /// `src/maxtext/utils/maxtext_utils.py` at e591f30): not with scanned layers, nor with
    /// gradient accumulation on GPUs.
    pub remat_prevent_cse: bool,
    /// `quantization=fp8` (delayed scaling) or `te_fp8_currentscaling` (current scaling): the
    /// layers' projections and MLP are fp8 products (`fp8`).
    pub fp8: Option<Scaling>,
    /// How attention reaches keys and values split over the context axis, and the batch's
    /// load-balancing order (`context_parallel_*`).
    pub context_parallel: ContextParallel,
    /// Logical axis rules for activation sharding constraints (applied only when tracing on a mesh).
    pub rules: LogicalRules,
    /// `lora.enable_lora`: the matched products have adapters (`lora`).
    pub lora: Option<Lora>,
}

/// How RoPE turns positions into rotations (MaxText's `rope_type`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rope {
    /// MaxText's `RotaryEmbedding`: timescales `rope_max_timescale^(2i / head_dim)`, applied to
    /// the two halves of the head dimension.
    Default,
    /// MaxText's `LLaMARotaryEmbedding`: the same timescales, with Llama 3.1's frequency scaling
    /// when `use_scale` (`rope_use_scale`), applied to interleaved pairs `(x[2i], x[2i+1])`.
    Llama31 { use_scale: bool },
}

impl Rope {
    /// MaxText picks the Llama 3.1 rotary embedding when `rope_type` is `llama3.1` or the model's
    /// name starts with `llama3.1` (`init_rotary_embedding` in `src/maxtext/layers/attentions.py`,
    /// e591f30).
    pub fn from_config(c: &Config) -> Rope {
        if c.rope_type == config::RopeType::Llama31 || c.model_name.starts_with("llama3.1") {
            Rope::Llama31 { use_scale: c.rope_use_scale }
        } else {
            Rope::Default
        }
    }
}

impl ModelConfig {
    pub fn from_config(c: &Config) -> ModelConfig {
        let (emb_scale, head_scale, mlp_scale, layer_scale) = config::parameter_scales(c.global_parameter_scale);
        ModelConfig {
            emb: c.base_emb_dim << emb_scale,
            heads: c.base_num_query_heads << head_scale,
            kv_heads: c.base_num_kv_heads << head_scale,
            head_dim: c.head_dim,
            // qwen3_moe's experts are `base_moe_mlp_dim` wide when it is set: MaxText's types.py
            // (e591f30) makes it qwen3_moe's `base_mlp_dim` (every layer is routed), and
            // qwen3.py sizes the experts with `moe_mlp_dim`.
            mlp: match c.decoder_block {
                config::DecoderBlock::Qwen3Moe if c.base_moe_mlp_dim > 0 => c.base_moe_mlp_dim << mlp_scale,
                _ => c.base_mlp_dim << mlp_scale,
            },
            layers: c.base_num_decoder_layers << layer_scale,
            vocab: c.vocab_size,
            mlp_activations: c.mlp_activations.clone(),
            eps: c.normalization_layer_epsilon,
            rope_max_timescale: c.rope_max_timescale as f64,
            rope: Rope::from_config(c),
            rope_linear_factor: c.rope_linear_scaling_factor,
            logits_via_embedding: c.logits_via_embedding,
            normalize_embedding_logits: c.normalize_embedding_logits,
            final_logits_soft_cap: (c.final_logits_soft_cap > 0.0).then_some(c.final_logits_soft_cap),
            trainable_position_size: (c.trainable_position_size > 0).then_some(c.trainable_position_size),
            dtype: c.dtype.ir(),
            weight_dtype: c.weight_dtype.ir(),
            scan_layers: c.scan_layers,
            attention: AttentionImpl::for_config(c),
            context_parallel: ContextParallel::from_config(c),
            attn_logits_soft_cap: kernel::soft_cap(c),
            max_segments_per_seq: c.max_documents_per_row(),
            logits_dot_in_fp32: c.logits_dot_in_fp32,
            use_iota_embed: c.use_iota_embed,
            vocab_tiles: c.num_vocab_tiling,
            vocab_tiling_ag_once: c.vocab_tiling_ag_once,
            remat: remat_policy(c.remat_policy),
            remat_prevent_cse: !(c.scan_layers || (c.gradient_accumulation_steps > 1 && c.hardware.is_gpu())),
            fp8: match c.quantization {
                config::Quantization::Fp8 => Some(Scaling::Delayed),
                config::Quantization::TeFp8CurrentScaling => Some(Scaling::Current),
                _ => None,
            },
            rules: config::logical_rules(c),
            lora: Lora::from_config(c),
        }
    }
}

/// MaxText's `remat_policy` as a tracer policy (`get_remat_policy` in
/// `src/maxtext/layers/decoders.py`, MaxText main at e591f30): every named policy saves the
/// values the model tags with `checkpoint_name` under those names and recomputes the rest.
/// `full` and `none` both give `jax.checkpoint` no policy, which saves nothing: MaxText's `none`
/// still wraps each layer in remat. `save_everything` is maxrs's own: no remat region at all.
pub fn remat_policy(policy: config::RematPolicy) -> RematPolicy {
    use config::RematPolicy as P;
    const QKV: &[&str] = &["query_proj", "value_proj", "key_proj", "kv_proj", "qkv_proj"];
    const MINIMAL: &[&str] = &[
        "query_proj",
        "value_proj",
        "key_proj",
        "kv_proj",
        "qkv_proj",
        "out_proj",
        "mlpwi_0",
        "mlpwi_1",
        "mlpwi",
        "mlpwo",
    ];
    let names = |groups: &[&[&str]]| RematPolicy::SaveNames(groups.concat().iter().map(|n| n.to_string()).collect());
    match policy {
        P::Full | P::None => RematPolicy::Full,
        P::SaveEverything => RematPolicy::None,
        P::Minimal => names(&[MINIMAL]),
        P::MinimalWithContext | P::MinimalFlash => names(&[MINIMAL, &["context"]]),
        P::SaveDotWithContextExceptMlp => names(&[QKV, &["context", "out_proj"]]),
        P::SaveDotExceptMlpwi => names(&[QKV, &["out_proj", "mlpwo"]]),
        P::SaveDotExceptMlp => names(&[QKV, &["out_proj"]]),
        P::SaveQkvProj => names(&[QKV]),
        P::SaveOutProj => names(&[&["out_proj"]]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn saved(policy: config::RematPolicy) -> Vec<String> {
        match remat_policy(policy) {
            RematPolicy::SaveNames(names) => names,
            other => panic!("{policy}: {other:?}"),
        }
    }

    /// `get_individual_scales` of MaxText's `src/maxtext/configs/types.py` (e591f30), evaluated by
    /// hand: 16 = 2^4 (q 1, r 1) scales heads and mlp by 4, emb and layers by 2.
    #[test]
    fn global_parameter_scale_follows_maxtext() {
        assert_eq!(config::parameter_scales(1), (0, 0, 0, 0));
        assert_eq!(config::parameter_scales(2), (0, 1, 1, 0));
        assert_eq!(config::parameter_scales(4), (1, 1, 1, 0));
        assert_eq!(config::parameter_scales(8), (1, 1, 1, 1));
        assert_eq!(config::parameter_scales(16), (1, 2, 2, 1));
        assert_eq!(config::parameter_scales(32), (2, 2, 2, 1));
        assert_eq!(config::parameter_scales(64), (2, 2, 2, 2));
    }

    /// The name lists of `get_remat_policy` / `minimal_policy` in MaxText's
    /// `src/maxtext/layers/decoders.py` (main, e591f30).
    #[test]
    fn policies_save_maxtexts_names() {
        use config::RematPolicy as P;
        assert_eq!(remat_policy(P::Full), RematPolicy::Full);
        assert_eq!(remat_policy(P::None), RematPolicy::Full, "MaxText's none is a remat with no policy");
        assert_eq!(remat_policy(P::SaveEverything), RematPolicy::None);
        let qkv = ["query_proj", "value_proj", "key_proj", "kv_proj", "qkv_proj"];
        assert_eq!(saved(P::SaveQkvProj), qkv);
        let minimal: Vec<&str> =
            qkv.iter().copied().chain(["out_proj", "mlpwi_0", "mlpwi_1", "mlpwi", "mlpwo"]).collect();
        assert_eq!(saved(P::Minimal), minimal);
        let with_context: Vec<&str> = minimal.iter().copied().chain(["context"]).collect();
        assert_eq!(saved(P::MinimalWithContext), with_context);
        assert_eq!(saved(P::MinimalFlash), with_context);
        let mut names = qkv.to_vec();
        names.extend(["context", "out_proj"]);
        assert_eq!(saved(P::SaveDotWithContextExceptMlp), names);
        let mut names = qkv.to_vec();
        names.extend(["out_proj", "mlpwo"]);
        assert_eq!(saved(P::SaveDotExceptMlpwi), names);
        let mut names = qkv.to_vec();
        names.push("out_proj");
        assert_eq!(saved(P::SaveDotExceptMlp), names);
        assert_eq!(saved(P::SaveOutProj), ["out_proj"]);
    }
}
