//! Every configuration key, declared once: its Rust type, its default (`configs/base.yml`'s
//! text), its meaning (the doc comment's first line; further lines are notes), its source and
//! role, and its range (see `registry.rs` for what each part feeds). The typed [`Config`] and
//! the registry table come out of this one `declare_keys!` invocation, in this order, which is
//! also `configs/base.yml`'s and `--print-config`'s. A new key is one declaration here; then
//! regenerate `configs/base.yml` and the book's key reference (`docs.rs` says how).
//!
//! The keys of `MaxText` are those of MaxText's `src/maxtext/configs/base.yml` at main e591f30,
//! with MaxText's names and defaults unless a note says why maxrs differs; `Maxrs` keys are
//! maxrs's own.

use serde::{Deserialize, Serialize};

use super::choices::{
    none_or_int, AttentionKernel, AttentionType, ContextParallelStrategy, DType, DatasetType, DecoderBlock, DpoAlgo,
    Hardware, LogicalAxisRule, LrScheduleType, OnCheckpointError, PipelineSchedule, ProfilerKind, Quantization,
    RematPolicy, ReorderStrategy, RopeType, RoutedScoreFunc, SamplingStrategy, TokenizerType, WsdDecayStyle,
};
use super::ranges::{
    closed, int, int_or_fill, open, open_max, open_min, MAX_AXIS, MAX_CPU_DEVICES, MAX_EMB, MAX_GPU_HOSTS, MAX_HEADS,
    MAX_SECONDS, MAX_STEPS,
};
use super::registry::Access::{Ignores, Reads, Writes};
use super::registry::Origin::{MaxText, Maxrs};
use super::registry::{declare_keys, Families, Key, KeyType, Section};

const ALL: Families = Families::All;
/// The families with sliding-window layers (`sliding_window_size`).
const SLIDING: Families = Families::Only(&[
    DecoderBlock::Mistral,
    DecoderBlock::Gemma2,
    DecoderBlock::Gemma3,
    DecoderBlock::Olmo3,
    DecoderBlock::GptOss,
    DecoderBlock::Gemma4,
    DecoderBlock::Gemma4Small,
]);
const GEMMA2_3_4: Families =
    Families::Only(&[DecoderBlock::Gemma2, DecoderBlock::Gemma3, DecoderBlock::Gemma4, DecoderBlock::Gemma4Small]);
const GEMMA3_4: Families = Families::Only(&[DecoderBlock::Gemma3, DecoderBlock::Gemma4, DecoderBlock::Gemma4Small]);
/// decoder_block=gemma4 (`src/maxtext/models/gemma4.py` at MaxText e591f30): the global layers'
/// own head size, key/value heads and RoPE, shared key/value projections, value norms.
const GEMMA4: Families = Families::Only(&[DecoderBlock::Gemma4]);
/// decoder_block=gemma4 and gemma4_small (`src/maxtext/models/gemma4_small.py` at MaxText e591f30, whose
/// layers build the same `Attention`): the global layers' own head size, key/value heads and RoPE,
/// value norms.
const GEMMA4_BOTH: Families = Families::Only(&[DecoderBlock::Gemma4, DecoderBlock::Gemma4Small]);
/// decoder_block=gemma4_small (`src/maxtext/models/gemma4_small.py` at MaxText e591f30): per-layer
/// input embeddings, the last layers reusing earlier layers' keys and values, double-wide MLPs.
const GEMMA4_SMALL: Families = Families::Only(&[DecoderBlock::Gemma4Small]);
/// The families with MaxText's default RoPE (`RotaryEmbedding`), whose timescales
/// `rope_linear_scaling_factor` scales (gemma3: its global layers only).
const DEFAULT_ROPE: Families = Families::Only(&[
    DecoderBlock::Llama2,
    DecoderBlock::Mistral,
    DecoderBlock::Mixtral,
    DecoderBlock::Gemma,
    DecoderBlock::Gemma2,
    DecoderBlock::Gemma3,
    DecoderBlock::Qwen2,
    DecoderBlock::Qwen3,
    DecoderBlock::Qwen3Moe,
    DecoderBlock::Qwen3CustomMoe,
    DecoderBlock::Olmo3,
    DecoderBlock::Llama4,
    DecoderBlock::Gemma4,
    DecoderBlock::Gemma4Small,
]);
const GPT3: Families = Families::Only(&[DecoderBlock::Gpt3]);
const MOE: Families = Families::Only(&[
    DecoderBlock::Mixtral,
    DecoderBlock::Qwen3Moe,
    DecoderBlock::Qwen3CustomMoe,
    DecoderBlock::Deepseek,
    DecoderBlock::GptOss,
    DecoderBlock::Llama4,
    DecoderBlock::Gemma4,
]);
/// decoder_block=qwen2, qwen3, qwen3_moe, qwen3_custom_moe, olmo3: `qwen2.py`, `qwen3.py`,
/// `qwen3_custom.py` and `olmo3.py` (MaxText e591f30) all pass `use_qk_norm` to their `Attention`;
/// llama4: `llama4.py`, whose `Attention` takes it as an L2 norm after RoPE.
const QK_NORM: Families = Families::Only(&[
    DecoderBlock::Qwen2,
    DecoderBlock::Qwen3,
    DecoderBlock::Qwen3Moe,
    DecoderBlock::Qwen3CustomMoe,
    DecoderBlock::Olmo3,
    DecoderBlock::Llama4,
]);
/// decoder_block=qwen2, gpt_oss: the blocks maxrs has whose MaxText layer reads `attention_bias`.
const ATTENTION_BIAS: Families = Families::Only(&[DecoderBlock::Qwen2, DecoderBlock::GptOss]);
const NORM_TOPK_PROB: Families = Families::Only(&[
    DecoderBlock::Mixtral,
    DecoderBlock::Qwen3Moe,
    DecoderBlock::Qwen3CustomMoe,
    DecoderBlock::Gemma4,
]);
/// decoder_block=qwen3_custom_moe: `Qwen3CustomMoeDecoderLayer` (`models/qwen3_custom.py`, MaxText
/// e591f30) is the only layer maxrs has that reads `attention_output_dim`, and the only one where
/// `moe_expert_input_dim` may differ from the embedding size.
const QWEN3_CUSTOM: Families = Families::Only(&[DecoderBlock::Qwen3CustomMoe]);
/// decoder_block=deepseek: multi-head latent attention and YaRN (`model::mla`), DeepSeek-V3's
/// routing and shared experts (`model::moe::MoeConfig::deepseek`).
const DEEPSEEK: Families = Families::Only(&[DecoderBlock::Deepseek]);
/// The families with YaRN RoPE (`rope_type: yarn`): deepseek's latent attention, olmo3, gpt_oss.
const YARN: Families = Families::Only(&[DecoderBlock::Deepseek, DecoderBlock::Olmo3, DecoderBlock::GptOss]);
/// The families that scan blocks of `inhomogeneous_layer_cycle_interval` layers.
const LAYER_CYCLE: Families = Families::Only(&[DecoderBlock::Olmo3, DecoderBlock::GptOss, DecoderBlock::Llama4]);
/// decoder_block=deepseek, gpt_oss: a learned routing bias (`routed_bias`).
const ROUTED_BIAS: Families = Families::Only(&[DecoderBlock::Deepseek, DecoderBlock::GptOss]);
/// decoder_block=gpt_oss (`src/maxtext/models/gpt_oss.py` at MaxText e591f30): attention sinks,
/// biased experts with a clamped SwiGLU.
const GPT_OSS: Families = Families::Only(&[DecoderBlock::GptOss]);
/// decoder_block=llama4 (`src/maxtext/models/llama4.py` at MaxText e591f30): chunked attention, NoPE
/// layers with temperature tuning, MoE layers every `interleave_moe_layer_step` layers.
const LLAMA4: Families = Families::Only(&[DecoderBlock::Llama4]);
/// decoder_block=deepseek, llama4, gemma4: MaxText's `RoutedAndSharedMoE` (`layers/moe.py` at e591f30).
const SHARED_EXPERTS: Families = Families::Only(&[DecoderBlock::Deepseek, DecoderBlock::Llama4, DecoderBlock::Gemma4]);

declare_keys! {
    section "Run" {
        /// The run's name: its directory under base_output_directory, and the metrics' run_name.
        run_name: String = "" => MaxText.run(),
        /// Selects models/<model_name>.yml; "default" is a tiny model that trains on CPU in seconds.
        model_name: String = "default" => MaxText.run(),
        /// Allow key=value to change keys that the model file sets.
        override_model_config: bool = false => MaxText.run(),
        /// When true, a layer's logical_axis_rules replace the table instead of merging by name.
        override_logical_axis_rules: bool = false => MaxText.run().model_file(),
    }

    /// Run outputs go to base_output_directory/run_name/ (a local path or gs://bucket/path):
    /// checkpoints/<step>/, tensorboard/<run_name>/, metrics/, config.yml. Empty: no run outputs.
    /// An empty run_name becomes <model_name>_<YYYY-MM-DD-HH-MM> (or $JOBSET_NAME), as in MaxText.
    section "Output, metrics, profiler" {
        /// The directory of the run outputs (local or gs://); empty: none.
        base_output_directory: String = "" => MaxText.path(Writes, Ignores).directory().remote(),
        /// File (local or gs://) that gets one JSON object per step; if empty, none.
        metrics_file: String = "" => MaxText.path(Writes, Ignores).remote(),
        /// How often TensorBoard events and the metrics files are flushed.
        log_period: i64 = 100 => MaxText.run().range(int(1, MAX_STEPS)),
        /// The profiler around the profiled steps: "" (none), xplane or nsys.
        /// xplane: a trace TensorBoard's profile plugin opens, written through the PJRT plugin's
        /// profiler to base_output_directory/run_name/tensorboard/plugins/profile/<time>/<host>.xplane.pb;
        /// nsys: cudaProfilerStart/Stop around the profiled steps, for
        /// `nsys profile --capture-range=cudaProfilerApi`.
        profiler: ProfilerKind = "" => MaxText.run(),
        /// The first profiled step; the steps before it are also left out of the run summary's step time and TFLOP/s.
        skip_first_n_steps_for_profiler: i64 = 1 => MaxText.run().range(int(0, MAX_STEPS)),
        /// How many steps are profiled: skip_first_n_steps_for_profiler .. + profiler_steps - 1.
        profiler_steps: i64 = 5 => MaxText.run().range(int(1, MAX_STEPS)),
    }

    /// In MaxText's order, a run starts from (1) the newest good checkpoint of this run
    /// (base_output_directory/run_name/checkpoints/), else (2) load_parameters_path or
    /// load_full_state_path (not both), else (3) fresh initial state.
    section "Checkpointing" {
        /// Save checkpoints (needs base_output_directory); false unlike MaxText, so quick runs write nothing.
        enable_checkpointing: bool = false => MaxText.run(),
        /// Initial parameters: a safetensors file in maxrs's parameter layout (see docs/src/reference/parameters.md), or a checkpoint directory (its parameters), local or gs://.
        load_parameters_path: String = "" => MaxText.path(Reads, Ignores).directory().remote(),
        /// Initial state: a checkpoint directory (parameters, optimizer state and step), local or gs://.
        load_full_state_path: String = "" => MaxText.path(Reads, Ignores).directory().remote(),
        /// Copy the state off the devices, write it from a background thread.
        async_checkpointing: bool = true => MaxText.run(),
        /// Save after every step s with s % checkpoint_period == 0.
        checkpoint_period: i64 = 10000 => MaxText.run().range(int(1, MAX_STEPS)),
        #[serde(deserialize_with = "none_or_int")]
        /// How many checkpoints to keep, the newest; None keeps every checkpoint.
        // There is at most one checkpoint per step.
        max_num_checkpoints_to_keep: Option<i64> = None => MaxText.run().range(int(1, MAX_STEPS)),
        /// Include step 0 in the schedule.
        save_checkpoint_on_start: bool = true => MaxText.run(),
        /// Save after the last step too.
        save_checkpoint_on_completion: bool = true => MaxText.run(),
        /// On SIGTERM (preemption), save the current step, then exit.
        enable_autocheckpoint: bool = false => MaxText.run(),
        /// Stop or continue training when a checkpoint save fails.
        on_checkpoint_error: OnCheckpointError = "stop" => Maxrs.run(),
    }

    section "Run directory" {
        /// TensorBoard event files under base_output_directory/run_name/tensorboard/.
        enable_tensorboard: bool = true => MaxText.run(),
        /// Metrics files (one JSON object per step) in the run directory; true unlike MaxText.
        /// metrics_step_<first>_to_step_<last>.txt every log_period steps under
        /// base_output_directory/run_name/metrics/.
        gcs_metrics: bool = true => MaxText.run(),
        /// The resolved config as base_output_directory/run_name/config.yml; true unlike MaxText.
        save_config_to_gcs: bool = true => MaxText.run(),
    }

    /// models/<model_name>.yml overrides these.
    section "Model" {
        /// The decoder family, one file each under src/model/.
        /// llama2, mistral (llama2's block plus sliding_window_size), gemma, gemma2, gemma3 (text
        /// only), gpt3, mixtral (llama2 with routed experts), qwen3 (llama2 with QK-norm),
        /// qwen3_moe (qwen3 with routed experts), qwen3_custom_moe (qwen3's attention into an
        /// attention_output_dim latent, routed experts there, then up to the embedding).
        decoder_block: DecoderBlock = "llama2" => MaxText.model(ALL).model_file(),
        /// A power of two that scales the base_* sizes as MaxText does.
        /// With log2(scale) = 3q + r: emb x 2^(q + [r > 1]), query and kv heads and mlp x
        /// 2^(q + [r > 0]), layers x 2^q (head_dim is not scaled).
        // A power of two (checked in validate.rs), and the scaled sizes stay within the base_* ranges.
        global_parameter_scale: i64 = 1 => MaxText.model(ALL).range(int(1, 1 << 12)),
        /// The model width (embedding size), before global_parameter_scale.
        base_emb_dim: i64 = 2048 => MaxText.model(ALL).range(int(1, MAX_EMB)).model_file(),
        /// Query heads, before global_parameter_scale.
        base_num_query_heads: i64 = 16 => MaxText.model(ALL).range(int(1, MAX_HEADS)).model_file(),
        /// Key/value heads, before global_parameter_scale (grouped-query attention when fewer than the query heads).
        base_num_kv_heads: i64 = 16 => MaxText.model(ALL).range(int(1, MAX_HEADS)).model_file(),
        /// The MLP's hidden size, before global_parameter_scale.
        base_mlp_dim: i64 = 7168 => MaxText.model(ALL).range(int(1, 4 * MAX_EMB)).model_file(),
        /// Decoder layers, before global_parameter_scale; gemma2: pairs of (local, global) layers, as in MaxText.
        /// gemma3: layers, a multiple of 6 (maxrs scans blocks of 5 local + 1 global layers and
        /// has no remainder block yet).
        base_num_decoder_layers: i64 = 16 => MaxText.model(ALL).range(int(1, MAX_HEADS)).model_file(),
        /// olmo3: the layers of one scanned block (MaxText's `Olmo3ScannableBlock`), a multiple of 4 (OLMo 3's 3 local + 1 global pattern) dividing the layers; gpt_oss: the same with its 2-layer pattern (1 local + 1 global).
        // MaxText's scan takes num_decoder_layers // interval blocks (`Decoder.__call__`,
        // src/maxtext/layers/decoders.py at e591f30); its other families are refused a value
        // other than 1 (families.rs).
        inhomogeneous_layer_cycle_interval: i64 = 1 => MaxText.model(LAYER_CYCLE).range(int(1, MAX_HEADS)).model_file(),
        /// The size of each attention head (not scaled).
        head_dim: i64 = 128 => MaxText.model(ALL).range(int(1, MAX_HEADS)).model_file(),
        /// The vocabulary size (token ids are int32).
        vocab_size: i64 = 32000 => MaxText.model(ALL).range(int(2, i32::MAX as i64)).model_file(),
        /// One input projection each, multiplied: silu, gelu (tanh approximation), relu, sigmoid, linear.
        mlp_activations: Vec<String> = ["silu", "linear"] => MaxText.model(ALL).model_file(),
        /// gpt_oss: the experts' gate input is clamped to at most this, their linear input to [-this, this] (positive; -1: unset).
        // MaxText's `RoutedMoE.apply_ffn_activation` (layers/moe.py at e591f30) clamps gpt_oss's
        // always, deepseek's when positive (DeepSeek V4, which maxrs does not have yet).
        mlp_activations_limit: f64 = -1.0 => MaxText.model(GPT_OSS).range(closed(-1.0, 1e6)).model_file(),
        /// RMSNorm (LayerNorm for gpt3) epsilon.
        normalization_layer_epsilon: f64 = 1.0e-05 => MaxText.model(ALL).range(open(0.0, 1.0)).model_file(),
        /// RoPE's maximum timescale (the longest wavelength).
        rope_max_timescale: i64 = 10000 => MaxText.model(ALL).range(int(1, 1 << 53)).model_file(),
        /// gemma3, gemma4, gemma4_small: RoPE's maximum timescale in the local (sliding-window) layers; 0 or less: rope_max_timescale.
        // MaxText's `Attention.init_rotary_embedding` (src/maxtext/layers/attentions.py, e591f30)
        // uses it when positive.
        local_rope_max_timescale: i64 = -1 => MaxText.model(GEMMA3_4).range(int(-(1 << 53), 1 << 53)).model_file(),
        /// gemma4, gemma4_small: RoPE's maximum timescale in the global layers; 0 or less: rope_max_timescale.
        // `Gemma4DecoderLayer` (src/maxtext/models/gemma4.py at MaxText e591f30) uses it when positive.
        global_rope_max_timescale: i64 = -1 => MaxText.model(GEMMA4_BOTH).range(int(-(1 << 53), 1 << 53)).model_file(),
        /// gemma4, gemma4_small: the fraction of the global layers' head size that RoPE rotates (the rest keeps angle 0).
        // `Gemma4PartialRotaryEmbedding` (layers/embeddings.py at MaxText e591f30) below 1: the
        // first int(head size x this) / 2 frequencies of each half, exponents over the whole head.
        global_rope_proportion: f64 = 0.25 => MaxText.model(GEMMA4_BOTH).range(closed(0.0, 1.0)).model_file(),
        /// gemma4, gemma4_small: the fraction of the local layers' head_dim that RoPE rotates.
        local_rope_proportion: f64 = 1.0 => MaxText.model(GEMMA4_BOTH).range(closed(0.0, 1.0)).model_file(),
        /// The default RoPE's timescales are multiplied by this (positions / factor): every layer of the families with it, gemma3's global layers; not Llama 3.1's or YaRN's RoPE.
        // MaxText's `RotaryEmbedding.timescale` (src/maxtext/layers/embeddings.py, e591f30) and
        // `Attention.init_rotary_embedding` (attentions.py), which skips gemma3's local layers.
        rope_linear_scaling_factor: f64 = 1.0 => MaxText.model(DEFAULT_ROPE).range(closed(1e-6, 1e6)).model_file(),
        /// default (half-split RoPE), llama3.1 (scaled frequencies, interleaved pairs) or yarn (deepseek, olmo3 and gpt_oss only yet).
        /// llama3.1 is also chosen by a model_name starting with llama3.1, as in MaxText.
        rope_type: RopeType = "default" => MaxText.model(ALL).model_file(),
        /// llama3.1 RoPE: apply Llama 3.1's frequency scaling.
        rope_use_scale: bool = true => MaxText.model(ALL).model_file(),
        /// True ties the output projection to the token embedding.
        logits_via_embedding: bool = false => MaxText.model(ALL).model_file(),
        /// With logits_via_embedding: divide the logits by sqrt(base_emb_dim).
        normalize_embedding_logits: bool = true => MaxText.model(ALL).model_file(),
        /// With logits_via_embedding: logits = cap * tanh(logits / cap); 0 disables.
        final_logits_soft_cap: f64 = 0.0 => MaxText.model(ALL).range(closed(0.0, 1e9)).model_file(),
        /// Positive: learned position embeddings for that many positions (gpt3), added to the token embeddings.
        // 0 (or -1, MaxText's default) disables learned position embeddings.
        trainable_position_size: i64 = -1 => MaxText.model(ALL).range(int_or_fill(0, 1 << 24)).model_file(),
        /// mistral: > 0 limits attention to that many tokens back (0: none); gemma2, gemma3, gemma4, gemma4_small, olmo3, gpt_oss: the local layers' window.
        sliding_window_size: i64 = 0 => MaxText.model(SLIDING).range(int(0, 1 << 24)).model_file(),
        /// qwen2, qwen3, qwen3_moe, qwen3_custom_moe: an RMSNorm over each head's queries and keys before RoPE (QK-norm); olmo3: over all heads' together.
        use_qk_norm: bool = false => MaxText.model(QK_NORM).model_file(),
        /// llama4: every layer n with (n + 1) % this == 0 has no RoPE (NoPE) and attends globally, the others within chunks of chunk_attn_window_size; 0 or less: none.
        // `determine_is_nope_layer` (models/llama4.py at MaxText e591f30).
        nope_layer_interval: i64 = -1 => MaxText.model(LLAMA4).range(int_or_fill(0, MAX_HEADS)).model_file(),
        /// llama4: the chunk of the RoPE layers' attention: a query sees the keys before it in its own chunk of this many tokens (0: none).
        // `ChunkedCausalMask` and `_generate_chunk_attention_mask` (layers/attention_op.py at e591f30).
        chunk_attn_window_size: i64 = 0 => MaxText.model(LLAMA4).range(int(0, 1 << 24)).model_file(),
        /// llama4: the NoPE layers' queries are multiplied by 1 + 0.1 ln(floor((position + 1) / 8192) + 1).
        // `Attention.__call__` (layers/attentions.py at e591f30) with llama4.py's scale 0.1 and floor 8192.
        temperature_tuning: bool = false => MaxText.model(LLAMA4).model_file(),
        /// qwen2: learned biases on the query, key and value projections (not the output's); gpt_oss: on the output's too.
        attention_bias: bool = false => MaxText.model(ATTENTION_BIAS).model_file(),
        /// gpt_oss: a learned logit per query head (`sinks`) joins each softmax's denominator (attention sinks).
        // `Attention.sinks` and `AttentionOp.compute_local_attention` (layers/attentions.py,
        // layers/attention_op.py at MaxText e591f30).
        attention_sink: bool = false => MaxText.model(GPT_OSS).model_file(),
        /// gemma2, gemma3, gemma4, gemma4_small: attention scores = cap * tanh(scores / cap); 0 disables.
        attn_logits_soft_cap: f64 = 0.0 => MaxText.model(GEMMA2_3_4).range(closed(0.0, 1e9)).model_file(),
        /// gemma2, gemma3, gemma4: RMSNorm after attention, before the residual add (gemma4_small: always; false is refused).
        use_post_attn_norm: bool = false => MaxText.model(GEMMA2_3_4).model_file(),
        /// gemma2, gemma3, gemma4: RMSNorm after the MLP, before the residual add (gemma4_small: always; false is refused).
        use_post_ffw_norm: bool = false => MaxText.model(GEMMA2_3_4).model_file(),
        /// gemma4, gemma4_small: the global layers' head size; 0: head_dim.
        global_head_dim: i64 = 0 => MaxText.model(GEMMA4_BOTH).range(int(0, MAX_HEADS)).model_file(),
        /// gemma4, gemma4_small: the global layers' key/value heads (global_parameter_scale leaves it as it is); 0: the local layers'.
        global_num_kv_heads: i64 = 0 => MaxText.model(GEMMA4_BOTH).range(int(0, MAX_HEADS)).model_file(),
        /// gemma4: the global layers' values are their keys' projection (no value kernel), taken before the key norm.
        // `Attention(share_kv_projections=True)` (layers/attentions.py at MaxText e591f30): value =
        // key as projected; the key is then QK-normed and rotated, the value normed by value_norm.
        share_kv_projections: bool = false => MaxText.model(GEMMA4).model_file(),
        /// gemma4, gemma4_small: the values' RMSNorm over each head (every layer) has a learned scale (value_norm.scale); false: none.
        v_norm_with_scale: bool = true => MaxText.model(GEMMA4_BOTH).model_file(),
        /// gemma4_small: the width of each layer's per-layer input (0: none); the per-layer embedding table is vocab_size_per_layer_input x (layers x this).
        // `Gemma4SmallPLE` and `Gemma4SmallDecoderLayer` (models/gemma4_small.py at MaxText e591f30).
        hidden_size_per_layer_input: i64 = 0 => MaxText.model(GEMMA4_SMALL).range(int(0, MAX_EMB)).model_file(),
        /// gemma4_small: the rows of the per-layer embedding table (0: no per-layer inputs).
        vocab_size_per_layer_input: i64 = 0 => MaxText.model(GEMMA4_SMALL).range(int(0, i32::MAX as i64)).model_file(),
        /// gemma4_small: the last this many layers reuse the keys and values of the last earlier layer of their kind (local or global) and have no key/value projections.
        // `kv_donor_layer_idx` (models/gemma4_small.py at MaxText e591f30); none when it is 0 or
        // at least the number of layers (`is_kv_shared_layer`).
        num_kv_shared_layers: i64 = 0 => MaxText.model(GEMMA4_SMALL).range(int(0, MAX_HEADS)).model_file(),
        /// gemma4_small: the layers that reuse keys and values have MLPs twice base_mlp_dim wide.
        use_double_wide_mlp: bool = false => MaxText.model(GEMMA4_SMALL).model_file(),
        /// qwen3_custom_moe: the attention output projection's width (the latent the MoE block runs on); -1: unset (qwen3_custom_moe needs it set).
        // `Qwen3CustomAttention.init_out_w` (models/qwen3_custom.py at MaxText e591f30) refuses a
        // non-positive value; a value other than the embedding size adds layer_up_projection.
        attention_output_dim: i64 = -1 => MaxText.model(QWEN3_CUSTOM).range(int_or_fill(1, MAX_EMB)).model_file(),
        /// gpt3: one [emb, 3, heads, head_dim] projection for query, key and value.
        fused_qkv: bool = false => MaxText.model(GPT3).model_file(),
        /// MaxText's dropout switch. Its dropout_rate is 0 (MaxText's default, the only value maxrs takes), with which flax's Dropout is the identity: both values compute the same step.
        enable_dropout: bool = false => MaxText.program().model_file(),
        /// How attention is computed: autoselected, dot_product, flash, cudnn_flash_te or cudnn_flash_jax.
        /// dot_product: every score at once ([batch, heads, seq, seq] in memory). flash: maxrs's
        /// blockwise attention (an online softmax over 512-token key/value blocks, O(seq) memory
        /// per query block; maxrs has no Pallas or Splash kernels). cudnn_flash_te,
        /// cudnn_flash_jax: XLA's cuDNN fused attention on a CUDA GPU (as JAX emits it; no
        /// Transformer Engine), else blockwise, with the reason in the start-up line.
        /// autoselected (MaxText's default): dot_product on CPU and for sequences under 128
        /// tokens, blockwise otherwise.
        attention: AttentionKernel = "autoselected" => MaxText.model(ALL),
    }

    /// decoder_block=deepseek (MaxText's layers/attention_mla.py and YarnRotaryEmbedding in layers/embeddings.py):
    /// queries and keys of qk_nope_head_dim + qk_rope_head_dim, RoPE on the qk_rope_head_dim part only.
    section "Multi-head latent attention" {
        /// global (every family but deepseek) or mla (deepseek); local_sliding, chunk, full, compressed and block_diffusion are not supported yet.
        attention_type: AttentionType = "global" => MaxText.model(ALL).model_file(),
        /// The queries' low-rank projection (wq_a, q_norm, wq_b); 0: one projection (query).
        q_lora_rank: i64 = 0 => MaxText.model(DEEPSEEK).range(int(0, MAX_EMB)).model_file(),
        /// The keys' and values' shared latent (wkv_a, kv_norm, wkv_b), the compressed cache of decoding.
        kv_lora_rank: i64 = 512 => MaxText.model(DEEPSEEK).range(int(1, MAX_EMB)).model_file(),
        /// Each head's query and key dimensions without RoPE.
        qk_nope_head_dim: i64 = 128 => MaxText.model(DEEPSEEK).range(int(1, MAX_HEADS)).model_file(),
        /// Each head's query and key dimensions with RoPE (the key's are shared by the heads); even.
        qk_rope_head_dim: i64 = 64 => MaxText.model(DEEPSEEK).range(int(2, MAX_HEADS)).model_file(),
        /// Each head's value dimension.
        v_head_dim: i64 = 128 => MaxText.model(DEEPSEEK).range(int(1, MAX_HEADS)).model_file(),
        /// The context length the model is extended to; deepseek: above original_max_position_embeddings the
        /// softmax scale is multiplied by (0.1 mscale ln(rope_factor) + 1)^2; olmo3, gpt_oss (yarn): positions must stay below it.
        max_position_embeddings: i64 = 163840 => MaxText.model(YARN).range(int(1, 1 << 30)).model_file(),
        /// yarn: the context length RoPE's base frequencies were trained for.
        original_max_position_embeddings: i64 = 4096 => MaxText.model(YARN).range(int(1, 1 << 30)).model_file(),
        /// yarn: the context extension factor (low frequencies are divided by it).
        rope_factor: f64 = 40 => MaxText.model(YARN).range(closed(1.0, 1e6)).model_file(),
        /// yarn: rotations over original_max_position_embeddings above which a frequency is kept.
        beta_fast: f64 = 32 => MaxText.model(YARN).range(open(0.0, 1e6)).model_file(),
        /// yarn: rotations below which a frequency is divided by rope_factor (linear ramp between).
        beta_slow: f64 = 1 => MaxText.model(YARN).range(open(0.0, 1e6)).model_file(),
        /// The softmax scale's YaRN correction factor (see max_position_embeddings).
        mscale: f64 = 1.0 => MaxText.model(DEEPSEEK).range(closed(0.0, 1e6)).model_file(),
        /// yarn: RoPE rotates interleaved pairs (x[2i], x[2i+1]); false: the two halves.
        rope_interleave: bool = true => MaxText.model(YARN).model_file(),
        /// yarn: the correction range's bounds are rounded outwards to whole dimensions.
        rope_truncate: bool = true => MaxText.model(YARN).model_file(),
        /// yarn: RoPE's output is multiplied by 0.1 ln(rope_factor) + 1.
        rope_attention_scaling: bool = false => MaxText.model(YARN).model_file(),
        /// Multi-token prediction layers; only 0 is supported yet.
        mtp_num_layers: i64 = 0 => MaxText.model(ALL).range(int(0, MAX_HEADS)).model_file(),
    }

    /// decoder_block=mixtral, qwen3_moe, qwen3_custom_moe, deepseek; MaxText's layers/moe.py.
    section "Mixture of experts" {
        /// Experts in each MoE layer.
        num_experts: i64 = 1 => MaxText.model(MOE).range(int(1, MAX_HEADS)).model_file(),
        /// Experts per token: top-k of the router logits, weights softmax over those k.
        num_experts_per_tok: i64 = 1 => MaxText.model(MOE).range(int(1, MAX_HEADS)).model_file(),
        /// > 0 (with sparse_matmul=false): each expert takes at most ceil(seq x k / experts) x this tokens per sequence, dropping the rest.
        // <= 0: no capacity limit (MaxText's default -1); above, a multiple of the even share.
        capacity_factor: f64 = -1.0 => MaxText.step().read_by_model(MOE).range(closed(-1.0, 1e3)).model_file(),
        /// True: dropless (tokens sorted by expert, grouped matmuls); false: one-hot dispatch einsums (with capacity_factor > 0) or every expert on every token.
        sparse_matmul: bool = true => MaxText.step().read_by_model(MOE).model_file(),
        /// MaxText's choice of grouped-matmul kernel for sparse_matmul; maxrs has one (tiled loops of dense products), so both values compute the same.
        megablox: bool = true => MaxText.program(),
        /// Weight of the Switch Transformer load-balancing loss, added to the loss (learning/moe_lb_loss).
        load_balance_loss_weight: f64 = 0.0 =>
            MaxText.step().read_by_model(MOE).range(closed(0.0, 1e3)).model_file(),
        /// Sum the experts' weighted outputs in float32.
        float32_weight_sum: bool = true => MaxText.step().read_by_model(MOE),
        /// Compute the router logits in float32.
        float32_gate_logits: bool = false => MaxText.step().read_by_model(MOE),
        /// True: the dispatched tokens of the dropping path keep the expert axis for the experts (all-to-all) instead of the batch.
        moe_dispatch_no_expert_sharding: bool = false => MaxText.step().read_by_model(MOE),
        /// deepseek, llama4: the width of the shared MLP, in experts (shared_experts x the experts' width), added to the routed output; gemma4: in base_mlp_dim widths.
        // MaxText's `RoutedAndSharedMoE` (layers/moe.py, e591f30); 0: no shared MLP.
        shared_experts: i64 = 0 => MaxText.model(SHARED_EXPERTS).range(int(0, MAX_HEADS)).model_file(),
        /// deepseek: the router's scores: "" (the logits), sigmoid or softmax (over the experts).
        routed_score_func: RoutedScoreFunc = "" => MaxText.model(DEEPSEEK).model_file(),
        /// deepseek: a learned per-expert bias (gate.bias) added to the scores to choose the experts; under a model_name starting with deepseek3 or deepseek4 the weights come from the unbiased scores, under any other name from the biased ones. gpt_oss: added to the router logits (choice and weights).
        // MaxText's `get_topk` (layers/moe.py, e591f30). Under a deepseek3/deepseek4 name its
        // gradient is zero (it only moves the top-k choice); routed_bias_update_rate moves it.
        routed_bias: bool = false => MaxText.model(ROUTED_BIAS).model_file(),
        /// deepseek: auxiliary-loss-free balancing, bias += rate x sign(mean load - expert's load) after each step; > 0 is not supported yet.
        routed_bias_update_rate: f64 = 0.0 => MaxText.step().read_by_model(DEEPSEEK).range(closed(0.0, 1e3)),
        /// gpt_oss: learned biases on the experts' projections (wi_0_bias, wi_1_bias, wo_bias).
        mlp_bias: bool = false => MaxText.model(GPT_OSS).model_file(),
        /// deepseek: the experts in n_routing_groups equal groups; each token chooses only from its topk_routing_group best groups (-1: no groups; only under a model_name starting with deepseek3 or deepseek4).
        // A group's score is the sum of its two best biased scores (`expert_group_mask`).
        n_routing_groups: i64 = -1 => MaxText.model(DEEPSEEK).range(int_or_fill(1, MAX_HEADS)),
        /// deepseek: how many of the n_routing_groups groups each token chooses its experts from (-1: no groups).
        topk_routing_group: i64 = -1 => MaxText.model(DEEPSEEK).range(int_or_fill(1, MAX_HEADS)),
        /// deepseek: the routing weights are multiplied by this (after sigmoid scores are normalized to sum to 1).
        routed_scaling_factor: f64 = 1.0 => MaxText.model(DEEPSEEK).range(closed(0.0, 1e6)).model_file(),
        /// deepseek: the layers before the routed ones (dense_layers, then moe_layers).
        first_num_dense_layers: i64 = 0 => MaxText.model(DEEPSEEK).range(int(0, MAX_HEADS)).model_file(),
        /// llama4: every layer n with (n + 1) % this == 0 has experts (Llama4MoEBlock_0), the others a dense MLP base_mlp_dim wide.
        // `determine_is_moe_layer` (models/llama4.py at MaxText e591f30).
        interleave_moe_layer_step: i64 = 1 => MaxText.model(LLAMA4).range(int(1, MAX_HEADS)).model_file(),
        /// The experts' hidden size, before global_parameter_scale: deepseek's routed and shared experts, qwen3_moe's experts; mixtral's and qwen3_custom_moe's experts are base_mlp_dim wide, which it must equal.
        /// -1: unset; deepseek refuses it with routed layers, mixtral and qwen3_moe then take base_mlp_dim (MaxText refuses an unset one with num_experts > 1).
        // MaxText's types.py at e591f30: moe_mlp_dim must be positive with num_experts > 1, and
        // equal base_mlp_dim when every layer is routed; for qwen3_moe it replaces base_mlp_dim
        // instead (qwen3.py sizes the experts with moe_mlp_dim, mixtral.py with mlp_dim).
        base_moe_mlp_dim: i64 = -1 => MaxText.model(MOE).range(int_or_fill(1, 4 * MAX_EMB)).model_file(),
        /// qwen3_custom_moe: the width of the tokens entering the experts, equal to attention_output_dim; -1: base_emb_dim.
        // MaxText's `RoutedMoE` (layers/moe.py at e591f30) sizes its gate and experts with it;
        // types.py requires it to equal attention_output_dim for qwen3_custom_moe.
        moe_expert_input_dim: i64 = -1 => MaxText.model(QWEN3_CUSTOM).range(int_or_fill(1, MAX_EMB)).model_file(),
        /// mixtral, qwen3_moe, qwen3_custom_moe: the top-k routing weights (softmax over the chosen logits) are divided by their sum, in dtype; gemma4: its top-k probabilities (softmax over all experts).
        // MaxText's `get_topk` (layers/moe.py at e591f30) renormalizes after the softmax, which
        // already sums to 1: the two values differ by dtype rounding only.
        norm_topk_prob: bool = false => MaxText.model(NORM_TOPK_PROB).model_file(),
    }

    section "Numerics and memory" {
        /// Activations: bfloat16, float32 or float16.
        dtype: DType = "bfloat16" => MaxText.step().read_by_model(ALL),
        /// Parameters and optimizer state.
        weight_dtype: DType = "float32" => MaxText.model(ALL),
        /// Quantized matmuls: "", fp8 or te_fp8_currentscaling (see docs/src/guides/fp8.md).
        /// fp8: XLA-native fp8 GEMMs with delayed scaling (the decoder layers' projections and MLP,
        /// and Mixtral's router and expert einsums, take e4m3 inputs and kernels and e5m2
        /// gradients); te_fp8_currentscaling: Transformer Engine's current scaling, computed by the
        /// same GEMMs (dense families). MaxText's other values are not supported yet.
        // The scales and amax histories are train state (`fp8.*`, checkpointed): a run restores
        // only a checkpoint saved with the same value (the arrays must match).
        quantization: Quantization = "" => MaxText.step().read_by_model(ALL),
        /// Stack the layers' parameters and scan over them; false unrolls the layers (MaxText's unscanned names).
        scan_layers: bool = true => MaxText.model(ALL),
        /// What the backward pass keeps of each layer (MaxText's names); the rest is recomputed.
        /// full and none: only the layer's input (MaxText's none still remats); minimal: the
        /// weight matmul outputs; minimal_with_context (alias minimal_flash): those and the attention
        /// output; save_dot_with_context_except_mlp, save_dot_except_mlpwi, save_dot_except_mlp,
        /// save_qkv_proj, save_out_proj: the named projections. maxrs's own save_everything: no remat.
        remat_policy: RematPolicy = "full" => MaxText.step().read_by_model(ALL),
        /// The seed of the parameters' initialization (a u32 PRNG key, random::key).
        init_weights_seed: i64 = 0 => MaxText.step().range(int(0, u32::MAX as i64)),
        /// The output projection (logits) as an f32 matmul instead of in dtype.
        logits_dot_in_fp32: bool = false => MaxText.model(ALL).model_file(),
        /// The token embedding as a one-hot matmul instead of a gather.
        use_iota_embed: bool = false => MaxText.model(ALL).model_file(),
        /// The loss's logits and cross-entropy in this many tiles of the tokens, one tile after another, each tile's logits recomputed in the backward pass instead of kept (MaxText's vocabulary tiling); 1: all at once.
        /// per_device_batch_size x max_target_length must be a multiple of it (as in MaxText), and so must max_target_length: maxrs's tiles take every num_vocab_tiling-th token of each row.
        num_vocab_tiling: i64 = 1 => MaxText.step().read_by_model(ALL).range(int(1, 1 << 24)),
        /// With num_vocab_tiling > 1: the output head's weights gathered whole (over fsdp, context and expert) once, before the tiles, instead of in every tile; they stay gathered through the backward pass.
        vocab_tiling_ag_once: bool = false => MaxText.step().read_by_model(ALL),
    }

    /// See the data guide (docs/src/guides/data.md). MaxText's default dataset_type is tfds; maxrs has none.
    section "Data" {
        /// synthetic (MaxText's: one batch of random tokens, fed at every step), tokens (a flat file of token ids) or hf (Parquet / JSON Lines / text files, tokenized on the fly).
        dataset_type: DatasetType = "synthetic" => MaxText.run(),
        /// maxrs's own: with dataset_type=synthetic, rows are arithmetic progressions modulo vocab_size, new at every step and seeded by data_shuffle_seed, instead of MaxText's fixed random batch (the default model's quick start sets it).
        /// The next token follows from the previous two, so a small model learns a rule instead of memorizing one batch; the rows are one segment each, whatever packing says.
        synthetic_progression: bool = false => Maxrs.run(),
        /// For dataset_type=tokens: rows of max_target_length + 1 token ids (see docs/src/reference/formats.md).
        dataset_path: String = "" => MaxText.path(Reads, Ignores).remote(),
        /// For dataset_type=hf: a file or glob of .parquet, .jsonl or .txt files; or a weighted mixture "glob,weight;glob,weight" (maxrs's own: grain_train_files' syntax and grain's mixing, see docs/src/guides/data.md).
        hf_train_files: String = "" => MaxText.run(),
        /// For dataset_type=hf, instead of hf_train_files: a JSON file {"name": {"path": GLOB, "weight": W}, ...}, the training mixture by name, which may change on resume (MaxText's grain key, see docs/src/guides/data.md).
        grain_train_mixture_config_path: String = "" => MaxText.path(Reads, Ignores).remote(),
        /// For eval (eval_interval > 0): a file or glob, read in order once per eval.
        hf_eval_files: String = "" => MaxText.run(),
        /// For dataset_type=hf: how the files are found and read, as MaxText's datasets.load_dataset(hf_path, ...): '' reads hf_train_files / hf_eval_files by file extension (maxrs's own; MaxText needs hf_path); json, parquet, csv, text (a row per line) or arrow reads them, or hf_data_dir's files, in that builder's format whatever their names; org/name streams a Hub dataset's split from the Hub ($HF_ENDPOINT, default https://huggingface.co). See docs/src/guides/data.md.
        hf_path: String = "" => MaxText.run(),
        /// A Hub dataset's config (a config_name of its README's configs:); '' the default one.
        hf_name: String = "" => MaxText.run(),
        /// A folder of the dataset whose files make its splits (split names in file or folder names): in the Hub repository, or, with a builder hf_path and no hf_train_files, on the local disk.
        hf_data_dir: String = "" => MaxText.run(),
        /// The split of hf_path's dataset that training reads; hf_train_files' files are the split train.
        train_split: String = "train" => MaxText.run(),
        /// The split of hf_path's dataset that eval reads (eval_interval > 0); with hf_eval_files it is train, as in MaxText.
        hf_eval_split: String = "" => MaxText.run(),
        #[serde(serialize_with = "redact")]
        /// A Hugging Face token for private or gated Hub datasets; '' uses $HF_TOKEN. Sent only to the Hub endpoint's own host, never printed or saved (shown as `<redacted>`).
        hf_access_token: String = "" => MaxText.run(),
        /// The text column of hf_train_files.
        train_data_columns: Vec<String> = ["text"] => MaxText.run(),
        /// The text column of hf_eval_files.
        eval_data_columns: Vec<String> = ["text"] => MaxText.run(),
        /// A SentencePiece .model, or a tokenizer.json (or its folder) with tokenizer_type=huggingface.
        tokenizer_path: String = "" => MaxText.path(Reads, Ignores).directory(),
        /// sentencepiece or huggingface (tiktoken is not supported yet).
        tokenizer_type: TokenizerType = "sentencepiece" => MaxText.run(),
        /// The tokenizer adds BOS to each document.
        add_bos: bool = true => MaxText.run(),
        /// The tokenizer adds EOS to each document.
        add_eos: bool = true => MaxText.run(),
        /// Pack several documents into each row (attention stays within a document); false pads.
        packing: bool = true => MaxText.run(),
        /// With packing: at most this many documents in a row; -1 (or 0): no limit. cuDNN's attention (attention=cudnn_flash_te, cudnn_flash_jax) needs it to keep packed documents apart (MaxText's GPU configs use 32).
        max_segments_per_seq: i64 = -1 => MaxText.step().range(int_or_fill(0, 1 << 24)),
        /// Supervised fine-tuning: rows are conversations (train_data_columns [messages], [prompt, completion] or [question, answer]) rendered with the chat template.
        use_sft: bool = false => MaxText.run(),
        /// With use_sft: the loss counts only the completions (assistant replies), not the prompts.
        sft_train_on_completion_only: bool = false => MaxText.run(),
        /// With use_sft (or use_dpo's conversational pairs): a Jinja chat template; empty: chat_template_path, else the tokenizer_config.json's.
        chat_template: String = "" => MaxText.run(),
        /// With use_sft (or use_dpo's conversational pairs) and no chat_template: a .jinja/.j2/.txt template, or a .json file with a chat_template entry.
        chat_template_path: String = "" => MaxText.path(Reads, Ignores),
        /// Shuffle files and document windows (hf) or rows (tokens) each epoch.
        enable_data_shuffling: bool = true => MaxText.run(),
        /// Seeds the shuffles, and synthetic_progression's rows (MaxText's synthetic batch has fixed keys).
        data_shuffle_seed: i64 = 0 => MaxText.run().range(int(0, i64::MAX)),
        /// Non-zero: the first batch a process reads is fed at every step (for performance runs; MaxText's GPU recipes set it).
        reuse_example_batch: i64 = 0 => MaxText.run().range(int(0, i64::MAX)),
        /// Sequences per device and step; may be fractional; int(devices x this) must be >= 1.
        per_device_batch_size: f64 = 12.0 => MaxText.step().range(open_min(0.0, (1 << 24) as f64)),
        /// The sequence length, in tokens.
        max_target_length: i64 = 2048 => MaxText.step().range(int(1, 1 << 24)).model_file(),
    }

    /// dataset_type=hf with hf_eval_files: after train step s with s >= eval_start_step and
    /// (s - eval_start_step) % eval_interval == 0, the eval files are read once (at most eval_steps
    /// batches if > 0) and eval/avg_loss is logged.
    section "Eval" {
        /// Train steps between evals; -1 (or 0): no eval.
        eval_interval: i64 = -1 => MaxText.run().range(int_or_fill(0, MAX_STEPS)),
        /// Batches per eval; -1 (or 0): the eval files to their end.
        eval_steps: i64 = -1 => MaxText.run().range(int_or_fill(0, MAX_STEPS)),
        /// The first step an eval may follow.
        eval_start_step: i64 = 0 => MaxText.run().range(int(0, MAX_STEPS)),
        /// Eval sequences per device; 0: per_device_batch_size.
        eval_per_device_batch_size: f64 = 0.0 => MaxText.program().range(closed(0.0, (1 << 24) as f64)),
    }

    /// AdamW; the learning rate warms up linearly from 0 over
    /// int(learning_rate_schedule_steps * warmup_steps_fraction) steps, then
    /// - lr_schedule_type=cosine: decays by a cosine to learning_rate * learning_rate_final_fraction at
    ///   the schedule's last step;
    /// - lr_schedule_type=wsd (warmup-stable-decay): stays at learning_rate, then decays over the last
    ///   int(learning_rate_schedule_steps * wsd_decay_steps_fraction) steps, linearly or by a cosine
    ///   (wsd_decay_style), to learning_rate * learning_rate_final_fraction;
    /// and is 0 from learning_rate_schedule_steps to steps.
    section "Training loop and optimizer" {
        /// Training steps.
        steps: i64 = 150001 => MaxText.step().range(int(1, MAX_STEPS)),
        /// Microbatches whose gradients add up to each optimizer step.
        gradient_accumulation_steps: i64 = 1 => MaxText.step().range(int(1, 1 << 20)),
        /// Accumulate as Tunix's optax.MultiSteps (mean of microbatch means) instead of MaxText's own accumulation; no effect with gradient_accumulation_steps=1, the only value maxrs takes it with yet.
        use_tunix_gradient_accumulation: bool = false => MaxText.step(),
        /// The peak learning rate.
        learning_rate: f64 = 3.0e-5 => MaxText.step().range(closed(0.0, 1e3)),
        /// The schedule's length in steps; -1: `steps`.
        learning_rate_schedule_steps: i64 = -1 => MaxText.step().range(int_or_fill(1, MAX_STEPS)),
        /// The schedule after the warmup: cosine or wsd.
        lr_schedule_type: LrScheduleType = "cosine" => MaxText.step(),
        /// The share of the schedule that warms up.
        // MaxText allows 1: warmup over the whole schedule, no cosine phase.
        warmup_steps_fraction: f64 = 0.1 => MaxText.step().range(closed(0.0, 1.0)),
        /// The final learning rate, as a fraction of learning_rate.
        learning_rate_final_fraction: f64 = 0.1 => MaxText.step().range(closed(0.0, 1.0)),
        /// wsd: the share of the schedule that decays.
        // With warmup_steps_fraction it must not exceed 1 either (checked by train::schedule).
        wsd_decay_steps_fraction: f64 = 0.1 => MaxText.step().range(closed(0.0, 1.0)),
        /// wsd: the decay's shape, linear or cosine.
        wsd_decay_style: WsdDecayStyle = "linear" => MaxText.step(),
        /// AdamW's decay rate of the first moment (beta1).
        adam_b1: f64 = 0.9 => MaxText.step().range(open_max(0.0, 1.0)).model_file(),
        /// AdamW's decay rate of the second moment (beta2).
        adam_b2: f64 = 0.95 => MaxText.step().range(open_max(0.0, 1.0)).model_file(),
        /// AdamW's epsilon, outside the square root.
        adam_eps: f64 = 1.0e-8 => MaxText.step().range(closed(0.0, 1.0)).model_file(),
        /// AdamW's epsilon, inside the square root.
        adam_eps_root: f64 = 0.0 => MaxText.step().range(closed(0.0, 1.0)),
        /// AdamW's weight decay.
        adam_weight_decay: f64 = 0.1 => MaxText.step().range(closed(0.0, 1e3)).model_file(),
        /// Clip the gradients' global norm to this; 0 disables clipping.
        gradient_clipping_threshold: f64 = 1.0 => MaxText.step().range(closed(0.0, 1e9)).model_file(),
        /// Weight of the z-loss (the squared log of the softmax normalizer), added to the loss; 0 disables.
        z_loss_multiplier: f64 = 0.0 => MaxText.step().range(closed(0.0, 1e3)),
        /// Stop when the loss is NaN; false: warn and go on.
        abort_on_nan_loss: bool = true => MaxText.run(),
        /// Stop when the loss is infinite; false: warn and go on.
        abort_on_inf_loss: bool = true => MaxText.run(),
    }

    /// MaxText's `use_dpo` and `dpo:` mapping (`configs/post_train/dpo.yml`, `DPO` in
    /// `configs/types.py` at e591f30, which MaxText hands to Tunix's DPO trainer): rows are
    /// preference pairs and the loss is DPO's or ORPO's (`train::dpo`); in a file `dpo: {algo:
    /// orpo}`, on the command line `dpo.algo=orpo`.
    section "DPO" {
        /// Preference training: rows are pairs (train_data_columns [chosen, rejected], the prompt their common prefix, or [prompt, chosen, rejected]; text, or conversations rendered with the chat template) and the loss is dpo.algo's.
        use_dpo: bool = false => MaxText.step(),
        #[key = "dpo.algo"]
        /// dpo (against a frozen reference model), or orpo (no reference: the chosen response's NLL plus dpo.orpo_lambda times the odds-ratio loss).
        dpo_algo: DpoAlgo = "dpo" => MaxText.step(),
        #[key = "dpo.dpo_beta"]
        /// DPO's beta: the scale of the log-likelihood ratios to the reference model in the loss and rewards.
        dpo_dpo_beta: f64 = 0.1 => MaxText.step().range(closed(0.0, 1e6)),
        #[key = "dpo.orpo_lambda"]
        /// ORPO's weight of the odds-ratio loss.
        dpo_orpo_lambda: f64 = 0.1 => MaxText.step().range(closed(0.0, 1e6)),
        #[key = "dpo.dpo_label_smoothing"]
        /// The share of preferences assumed flipped (cDPO's label smoothing), for dpo and orpo.
        dpo_dpo_label_smoothing: f64 = 0.0 => MaxText.step().range(closed(0.0, 1.0)),
        #[key = "dpo.max_prompt_length"]
        #[serde(deserialize_with = "none_or_int")]
        /// The prompt's ids kept (its last ones); null: max_target_length / 2. Each response keeps its first max_target_length minus this.
        dpo_max_prompt_length: Option<i64> = None => MaxText.run().range(int(1, 1 << 24)),
    }

    /// MaxText's `lora:` mapping (`configs/post_train/sft.yml`, `LoRA` in `configs/types.py` at
    /// e591f30): in a file `lora: {enable_lora: true, lora_rank: 16}`, on the command line
    /// `lora.enable_lora=true lora.lora_rank=16`. The matched projections get adapters
    /// (`<kernel>_lora_a`, `<kernel>_lora_b`, as Qwix names them) and only the adapters train.
    section "LoRA" {
        #[key = "lora.enable_lora"]
        /// Train low-rank adapters on the projections lora.lora_module_path matches; every other parameter stays frozen.
        lora_enable_lora: bool = false => MaxText.model(ALL),
        #[key = "lora.lora_rank"]
        /// The adapters' rank r (> 0 with enable_lora).
        lora_rank: i64 = 0 => MaxText.model(ALL).range(int(0, MAX_EMB)),
        #[key = "lora.lora_alpha"]
        /// The adapters' product is scaled by lora_alpha / lora_rank.
        lora_alpha: f64 = 0.0 => MaxText.model(ALL).range(closed(0.0, 1e6)),
        #[key = "lora.lora_module_path"]
        /// A regex over module paths (decoder/layers/self_attention/query) that must match a whole path; empty: the model's entry of MaxText's post_train/lora_module_path.yml.
        lora_module_path: String = "" => MaxText.model(ALL),
        #[key = "lora.lora_restore_path"]
        /// A LoRA run's checkpoint step whose adapters the run starts from (not read when it resumes).
        lora_restore_path: String = "" => MaxText.path(Reads, Ignores).directory().remote(),
    }

    /// maxrs decode; MaxText's decode.py keys. The prompts are right-padded to
    /// max_prefill_predict_length for one prefill, then each sequence gets one token per generate step
    /// from a key/value cache of max_target_length positions, until the tokenizer's EOS or
    /// max_target_length - max_prefill_predict_length generate steps (MaxText's count).
    section "Decoding" {
        /// MaxText's one prompt, or a list: one sequence each, at most int(devices x per_device_batch_size).
        /// Without tokenizer_path, token ids separated by spaces or commas (this default: its UTF-8 bytes).
        prompt: Vec<String> = ["I love to"] => MaxText.run(),
        /// The longest prompt, in tokens.
        // Decoding; what each sampling strategy needs of its keys is checked in validate_decode.
        max_prefill_predict_length: i64 = 64 => MaxText.program().range(int(1, 1 << 24)),
        /// When set, the first prompt's output must start with this text (ids without a tokenizer).
        autoregressive_decode_assert: String = "" => MaxText.run(),
        /// greedy, weighted, nucleus, topk, or composite (top_k -> top_p -> weighted with temperature).
        decode_sampling_strategy: SamplingStrategy = "greedy" => MaxText.program(),
        /// For nucleus / composite: the cumulative probability kept.
        decode_sampling_nucleus_p: f64 = -1 => MaxText.program().range(closed(-1.0, 1.0)),
        /// For topk / composite: the number of most likely tokens kept.
        decode_sampling_top_k: i64 = 0 => MaxText.program().range(int(0, i32::MAX as i64)),
        /// For weighted / composite: the logits are divided by this.
        decode_sampling_temperature: f64 = 1.0 => MaxText.program().range(closed(0.0, 1e6)),
        /// The sampling key is jax.random.PRNGKey(decode_seed) (MaxText's decode.py fixes PRNGKey(1234)).
        // A u32 PRNG key, like init_weights_seed.
        decode_seed: i64 = 1234 => Maxrs.run().range(int(0, u32::MAX as i64)),
        /// deepseek: the cache holds every head's keys and values; false: each token's compressed latent and RoPE key (MLA's cache).
        mla_naive_kvcache: bool = true => MaxText.step().read_by_model(DEEPSEEK),
    }

    /// maxrs train-compile.
    section "Ahead-of-time compilation" {
        /// The compiled train step: train-compile saves it, train loads it instead of compiling.
        compiled_trainstep_file: String = "" => MaxText.path(Reads, Writes),
        /// train-compile's target, e.g. v5e-256, or a GPU topology.
        compile_topology: String = "" => MaxText.program(),
        /// train-compile's number of slices; set to a positive number with compile_topology.
        compile_topology_num_slices: i64 = -1 => MaxText.program().range(int_or_fill(1, MAX_GPU_HOSTS)),
        /// train-compile for a GPU: an XLA GpuTargetConfigProto text describing the GPU (default: the plugin's own, else maxrs's copy).
        gpu_target_config: String = "" => Maxrs.path(Ignores, Reads),
        /// The persistent compilation cache (JAX's, which MaxText sets from this key): programs that took 1 s or more to compile are kept here and loaded by later runs of the same program, plugin, devices and XLA_FLAGS; "" turns it off. A local directory; ~ is the home directory.
        jax_cache_dir: String = "~/jax_cache" => MaxText.run(),
    }

    section "Hardware" {
        /// cpu, gpu, gpu_multiprocess or tpu (MaxText's default is tpu).
        hardware: Hardware = "cpu" => MaxText.program(),
        /// PJRT plugin: cpu, cuda12, cuda13, tpu or a path to a plugin .so.
        plugin: String = "cpu" => Maxrs.path(Reads, Reads),
        /// Number of devices the CPU plugin creates.
        cpu_device_count: i64 = 1 => Maxrs.run().range(int(1, MAX_CPU_DEVICES)),
        /// A file under xla_flags/ whose flags are added to XLA_FLAGS.
        xla_flags_file: String = "" => Maxrs.path(Reads, Reads),
        /// For MFU; 0 looks the peak up from the device kind.
        peak_tflops_per_device: f64 = 0.0 => Maxrs.run().range(closed(0.0, 1e6)),
    }

    /// One process per host, a coordinator on process 0 (see docs/src/guides/multi-host.md).
    /// Empty / -1 values come from the environment (JAX_COORDINATOR_ADDRESS, NNODES, NODE_RANK; Slurm;
    /// Vertex AI; GKE JobSet); set here, they win over it.
    // -1 takes the value from the launcher's environment.
    section "Multi-process jobs" {
        /// host:port of the coordinator (jax.distributed's name).
        coordinator_address: String = "" => Maxrs.run(),
        /// Processes in the job (jax.distributed's name).
        num_processes: i64 = -1 => Maxrs.run().range(int_or_fill(0, MAX_AXIS)),
        /// This process's index (jax.distributed's name).
        process_id: i64 = -1 => Maxrs.run().range(int_or_fill(0, MAX_AXIS)),
        /// True when `maxrs coordinator` serves the job instead of process 0.
        external_coordinator: bool = false => Maxrs.run(),
        /// Seconds registration waits for every process.
        jax_distributed_initialization_timeout: i64 = 300 => MaxText.run().range(int(1, MAX_SECONDS)),
        /// True: every process runs alone, whatever the environment says.
        skip_jax_distributed_system: bool = false => MaxText.run(),
        /// A process silent this long has failed (jax.distributed's name).
        heartbeat_timeout_seconds: i64 = 100 => Maxrs.run().range(int(1, MAX_SECONDS)),
        /// How long the shutdown barrier waits (jax.distributed's name).
        shutdown_timeout_seconds: i64 = 300 => Maxrs.run().range(int(1, MAX_SECONDS)),
    }

    /// What every process waits for and its threads' stacks, on stderr; kill -USR1 logs them any
    /// time. MaxText had collect_stack_trace, stack_trace_to_cloud and stack_trace_interval_seconds
    /// until 61626ae (2026-05-18, "Deprecate cloud_tpu_diagnostics support"); maxrs keeps them as
    /// its own, so that configs which set them still run.
    section "Hang diagnostics" {
        /// Also log the stacks every stack_trace_interval_seconds.
        collect_stack_trace: bool = false => Maxrs.run(),
        /// maxrs logs to stderr; uploading (true) is not supported yet.
        stack_trace_to_cloud: bool = false => Maxrs.run(),
        /// Seconds between collect_stack_trace's logs.
        stack_trace_interval_seconds: i64 = 600 => Maxrs.run().range(int(1, MAX_SECONDS)),
        /// Log once when a step runs longer than this x the median step; 0 disables.
        // 0 (off) or above 1; the gap is checked in validate.rs.
        slow_step_stack_trace_factor: f64 = 10.0 => Maxrs.run().range(closed(0.0, 1e6)),
    }

    /// One axis per group may be -1: it takes what is left. The product of the ICI axes
    /// must equal the devices per slice (or host), that of the DCN axes the number of slices (or hosts).
    section "Parallelism" {
        /// The device mesh's axes, in order (MaxText's less the axes maxrs does not implement).
        mesh_axes: Vec<String> = [
            "data", "stage", "fsdp", "fsdp_transpose", "context", "context_usp_ulysses", "tensor", "tensor_sequence",
            "expert", "autoregressive"
        ] => MaxText.program(),
        /// The mesh axes each logical array axis is sharded over, tried in order (later rows are fallbacks).
        /// The cache_* rows are decoding's key/value cache (MaxText's "Inference (Prefill, Decode,
        /// Cache)" rows).
        logical_axis_rules: Vec<LogicalAxisRule> = [
            ["activation_embed_and_logits_batch", ["data", "stage", "fsdp", "fsdp_transpose", "expert"]],
            [
                "activation_embed_and_logits_batch_sequence",
                ["data", "stage", "fsdp", "fsdp_transpose", "context", "context_usp_ulysses", "expert"]
            ],
            ["activation_vocab", ["tensor", "tensor_sequence"]],
            ["activation_vocab", ["tensor"]],
            ["activation_vocab", "tensor_sequence"],
            ["vocab", ["tensor", "tensor_sequence", "autoregressive"]],
            ["embed_vocab", ["fsdp", "fsdp_transpose", "context", "context_usp_ulysses", "expert"]],
            ["activation_heads", ["tensor", "tensor_sequence", "autoregressive"]],
            ["activation_kv_heads", ["tensor", "tensor_sequence"]],
            ["activation_q_length", ["context", "context_usp_ulysses"]],
            ["activation_kv_length", []],
            ["activation_kv", ["tensor", "tensor_sequence"]],
            ["activation_kv_batch", ["data", "fsdp", "fsdp_transpose", "expert"]],
            ["activation_kv_head_dim", ["tensor", "tensor_sequence"]],
            ["heads", ["tensor", "tensor_sequence", "autoregressive"]],
            ["q_heads", ["tensor", "tensor_sequence", "autoregressive"]],
            ["kv_heads", ["tensor", "tensor_sequence", "autoregressive"]],
            ["qkv", []],
            ["kv", []],
            ["kv_head_dim", []],
            ["q_lora", ["fsdp", "fsdp_transpose", "context", "context_usp_ulysses", "expert"]],
            ["q_lora", ["fsdp", "context", "context_usp_ulysses", "expert"]],
            ["q_lora_up_proj", []],
            ["kv_lora", ["fsdp", "fsdp_transpose", "context", "context_usp_ulysses", "expert"]],
            ["kv_lora", ["fsdp", "context", "context_usp_ulysses", "expert"]],
            ["kv_lora_up_proj", []],
            ["activation_batch_moe", ["data", "fsdp", "fsdp_transpose", "expert"]],
            ["activation_length_moe", ["context", "context_usp_ulysses"]],
            ["activation_norm_length_moe", ["tensor_sequence", "context", "context_usp_ulysses"]],
            ["activation_embed_moe", ["tensor"]],
            ["activation_mlp_moe", ["tensor", "tensor_sequence"]],
            ["activation_exp", ["expert"]],
            ["exp", "expert"],
            ["mlp_moe", ["fsdp_transpose", "tensor", "tensor_sequence", "autoregressive"]],
            ["embed_moe", ["fsdp", "fsdp_transpose", "context", "context_usp_ulysses"]],
            ["embed_moe", ["fsdp", "context", "context_usp_ulysses"]],
            ["activation_mlp", ["tensor", "tensor_sequence"]],
            ["activation_batch", ["data", "fsdp", "fsdp_transpose", "expert"]],
            ["activation_length", ["context", "context_usp_ulysses"]],
            ["activation_norm_length", ["tensor_sequence", "context", "context_usp_ulysses"]],
            ["activation_embed", ["tensor"]],
            ["activation_stage", "stage"],
            ["mlp", ["fsdp_transpose", "tensor", "tensor_sequence", "autoregressive"]],
            ["embed", ["fsdp", "fsdp_transpose", "context", "context_usp_ulysses", "expert"]],
            ["embed", ["fsdp", "context", "context_usp_ulysses", "expert"]],
            ["norm", ["tensor"]],
            ["layers", "stage"],
            ["dense_layers", []],
            ["moe_layers", []],
            ["cache_heads", ["autoregressive", "tensor", "tensor_sequence"]],
            ["cache_batch", []],
            ["cache_kv", []],
            ["cache_sequence", []],
        ] => MaxText.step().read_by_model(ALL).model_file(),
        /// The mesh axes the input batch is laid out over; only all of mesh_axes is supported yet.
        /// Axes used for DCN must be earlier in this list than ICI.
        data_sharding: Vec<Vec<String>> = [
            [
                "data", "stage", "fsdp", "fsdp_transpose", "context", "context_usp_ulysses", "tensor", "tensor_sequence",
                "expert", "autoregressive"
            ]
        ] => MaxText.program(),
        /// The data axis across slices: the recommended DCN axis to be auto-sharded.
        dcn_data_parallelism: i64 = -1 => MaxText.step().range(int_or_fill(1, MAX_AXIS)),
        /// The "stage" axis across hosts: one group of ici_pipeline_parallelism stages on each process, activations passed by PJRT's cross-host transfers (GPUs) or the coordination service (CPU).
        dcn_pipeline_parallelism: i64 = 1 => MaxText.step().range(int_or_fill(1, MAX_AXIS)),
        /// The fsdp axis across slices.
        dcn_fsdp_parallelism: i64 = 1 => MaxText.step().range(int_or_fill(1, MAX_AXIS)),
        /// The fsdp_transpose axis across slices.
        dcn_fsdp_transpose_parallelism: i64 = 1 => MaxText.step().range(int_or_fill(1, MAX_AXIS)),
        /// The context axis across slices.
        dcn_context_parallelism: i64 = 1 => MaxText.step().range(int_or_fill(1, MAX_AXIS)),
        /// The context_usp_ulysses axis across slices: not supported yet with usp (nor in MaxText); 1 otherwise.
        dcn_context_usp_ulysses_parallelism: i64 = 1 => MaxText.step().range(int_or_fill(1, MAX_AXIS)),
        /// The tensor axis across slices: never recommended.
        dcn_tensor_parallelism: i64 = 1 => MaxText.step().range(int_or_fill(1, MAX_AXIS)),
        /// The tensor_sequence axis across slices: never recommended.
        dcn_tensor_sequence_parallelism: i64 = 1 => MaxText.step().range(int_or_fill(1, MAX_AXIS)),
        /// The expert axis across slices.
        dcn_expert_parallelism: i64 = 1 => MaxText.step().range(int_or_fill(1, MAX_AXIS)),
        /// The autoregressive axis across slices: never recommended.
        dcn_autoregressive_parallelism: i64 = 1 => MaxText.step().range(int_or_fill(1, MAX_AXIS)),
        /// The data axis within a slice.
        ici_data_parallelism: i64 = 1 => MaxText.step().range(int_or_fill(1, MAX_AXIS)),
        /// The "stage" axis: pipeline stages, each its own program on its own devices (see below).
        ici_pipeline_parallelism: i64 = 1 => MaxText.step().range(int_or_fill(1, MAX_AXIS)),
        /// The fsdp axis within a slice: the recommended ICI axis to be auto-sharded.
        ici_fsdp_parallelism: i64 = -1 => MaxText.step().range(int_or_fill(1, MAX_AXIS)),
        /// The fsdp_transpose axis within a slice.
        ici_fsdp_transpose_parallelism: i64 = 1 => MaxText.step().range(int_or_fill(1, MAX_AXIS)),
        /// The context axis within a slice.
        ici_context_parallelism: i64 = 1 => MaxText.step().range(int_or_fill(1, MAX_AXIS)),
        /// The context_usp_ulysses axis within a slice: context_parallel_strategy=usp's Ulysses group (the sequence is split over context x this); 1 unless usp.
        ici_context_usp_ulysses_parallelism: i64 = 1 => MaxText.step().range(int_or_fill(1, MAX_AXIS)),
        /// The tensor axis within a slice.
        ici_tensor_parallelism: i64 = 1 => MaxText.step().range(int_or_fill(1, MAX_AXIS)),
        /// The tensor_sequence axis within a slice.
        ici_tensor_sequence_parallelism: i64 = 1 => MaxText.step().range(int_or_fill(1, MAX_AXIS)),
        /// The expert axis within a slice.
        ici_expert_parallelism: i64 = 1 => MaxText.step().range(int_or_fill(1, MAX_AXIS)),
        /// The autoregressive axis within a slice.
        ici_autoregressive_parallelism: i64 = 1 => MaxText.step().range(int_or_fill(1, MAX_AXIS)),
        /// How attention reaches the keys and values of a sequence split over the context axis: all_gather, ring, ulysses or usp.
        /// all_gather: each device gathers every key and value and attends with its own queries.
        /// ring: keys and values go round the context devices, merged by an online softmax.
        /// ulysses: an all-to-all trades the sequence split for a head split and back (heads and
        /// key/value heads must divide over the context axis; no load balancing). usp: Ulysses over
        /// ici_context_usp_ulysses_parallelism devices, then ring attention over the context axis.
        // `AttentionOp` (layers/attention_op.py at MaxText e591f30); maxrs computes each strategy
        // with its own collectives in a manual computation (model::context_parallel).
        context_parallel_strategy: ContextParallelStrategy = "all_gather" => MaxText.step(),
        /// With context parallelism: reorder the sequence so that each context device holds an early and a late part (causal attention's work is then even).
        // `reorder_causal_load_balanced` (utils/max_utils.py at MaxText e591f30), applied to the
        // batch by the train and eval steps (utils/train_utils.py).
        context_parallel_load_balance: bool = true => MaxText.step(),
        /// The load-balancing order: auto, dual_chunk_swap (device i holds chunks i and 2n-1-i of 2n) or striped (device i holds tokens i, i+n, ...; GPU only).
        /// auto: striped for packed batches under ring attention on GPU, else dual_chunk_swap.
        context_parallel_reorder_strategy: ReorderStrategy = "auto" => MaxText.step(),
    }

    /// ici_pipeline_parallelism > 1. maxrs runs each stage as its own programs on its own devices
    /// (MPMD, as the JaxPP fork of MaxText does), handing activations and their gradients between
    /// stages as device buffers; data, fsdp and tensor axes shard inside a stage. The decoder
    /// layers are laid out as MaxText lays them out: num_layers_per_pipeline_stage consecutive
    /// layers form a stage's share, and with num_pipeline_repeats > 1 the shares go round the
    /// stages circularly (layer group g on stage g mod stages), so that
    /// layers = stages x num_pipeline_repeats x num_layers_per_pipeline_stage.
    /// The bubble fraction is (stages - 1) / (num_pipeline_repeats * num_pipeline_microbatches + stages - 1).
    /// MaxText's SPMD-pipeline options (pipeline_delay_activation_forwarding and the keys after
    /// it) tune a loop inside one program; maxrs's stages are separate programs, so only their
    /// defaults are accepted (other values are "not supported yet").
    section "Pipeline parallelism" {
        /// Consecutive decoder layers in each stage's share.
        num_layers_per_pipeline_stage: i64 = 1 => MaxText.program().range(int(1, MAX_HEADS)),
        /// How often the shares go round the stages; -1: layers / (stages * num_layers_per_pipeline_stage).
        num_pipeline_repeats: i64 = -1 => MaxText.program().range(int_or_fill(1, MAX_HEADS)),
        /// -1: pipeline every decoder layer (pipelining only some is not supported yet).
        pipeline_parallel_layers: i64 = -1 => MaxText.program().range(int_or_fill(1, MAX_HEADS)),
        /// Microbatches per step, a multiple of the number of stages; -1: the number of stages.
        /// Each microbatch has int(devices x per_device_batch_size) / num_pipeline_microbatches sequences.
        num_pipeline_microbatches: i64 = -1 => MaxText.program().range(int_or_fill(1, 1 << 20)),
        /// The order of each stage's work: gpipe, 1f1b or interleaved_1f1b (the JaxPP fork's `schedule`).
        /// gpipe: all forwards, then all backwards (activations of every microbatch in flight); 1f1b:
        /// after a warm-up of (stages - stage - 1) forwards, one forward one backward (at most
        /// `stages` microbatches in flight), interleaved over the repeats when num_pipeline_repeats > 1;
        /// interleaved_1f1b: the JaxPP fork's name for the same.
        pipeline_schedule: PipelineSchedule = "1f1b" => Maxrs.program(),
        /// Delay activation forwarding to aid XLA's scheduling (SPMD pipeline).
        pipeline_delay_activation_forwarding: bool = false => MaxText.program(),
        /// All-gather the FSDP weights once per pipeline repeat (SPMD pipeline).
        pipeline_fsdp_ag_once: bool = false => MaxText.program(),
        /// Prefetch the weights of a circular pipeline per repeat (SPMD pipeline).
        pipeline_fsdp_ag_per_repeat: bool = false => MaxText.program(),
        /// Scan over the pipeline iterations (SPMD pipeline).
        scan_pipeline_iterations: bool = true => MaxText.program(),
        /// Scan over the pipeline repeats (SPMD pipeline).
        scan_pipeline_repeats: bool = false => MaxText.program(),
        /// Scan over the layers within a stage (SPMD pipeline).
        scan_layers_per_stage: bool = false => MaxText.program(),
        /// Set the remat policy on the pipeline's scan (SPMD pipeline).
        set_remat_policy_on_pipeline_iterations: bool = true => MaxText.program(),
        /// Set the remat policy on the scan over a stage's layers (SPMD pipeline).
        set_remat_policy_on_layers_per_stage: bool = false => MaxText.program(),
    }
}

impl Config {
    /// Whether training batches may hold several segments a row: `dataset_type=hf` with
    /// `packing=true`, and MaxText's synthetic batch with `packing=true` and
    /// `max_segments_per_seq >= 2` (`data::synthetic`); token files and `synthetic_progression`
    /// give one sequence a row, whatever `packing` says.
    pub fn packed_batches(&self) -> bool {
        match self.dataset_type {
            DatasetType::Hf => self.packing,
            DatasetType::Synthetic => self.packing && self.max_segments_per_seq >= 2 && !self.synthetic_progression,
            DatasetType::Tokens | DatasetType::Tfds | DatasetType::Grain => false,
        }
    }

    /// `max_segments_per_seq` as a limit on the documents of a packed row: none for -1 or 0.
    pub fn max_documents_per_row(&self) -> Option<i64> {
        (self.max_segments_per_seq > 0).then_some(self.max_segments_per_seq)
    }
}

/// A secret's value as it is printed and saved (`--print-config`, the run's config.yml): whether
/// it is set, never what it is.
fn redact<S: serde::Serializer>(value: &str, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(if value.is_empty() { "" } else { "<redacted>" })
}
