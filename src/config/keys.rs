//! The typed configuration: one field per key of `configs/base.yml`, with MaxText's names.
//!
//! The field list is the list of valid keys: loading checks every key against it (see `value.rs`),
//! so adding a key here and a default in `configs/base.yml` is all a new key needs.

use serde::{Deserialize, Serialize};

use super::error::quote;

/// Declares a string-valued key's closed set of values; `VALUES` feeds error suggestions.
macro_rules! string_enum {
    ($(#[$meta:meta])* $name:ident { $($variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
        pub enum $name {
            $(#[serde(rename = $text)] $variant),+
        }

        impl $name {
            /// Every accepted spelling, in declaration order.
            pub const VALUES: &'static [&'static str] = &[$($text),+];

            /// Every value, in declaration order.
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $text),+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

string_enum!(
    /// `dtype` (activations) and `weight_dtype` (parameters, optimizer state).
    DType { Bfloat16 = "bfloat16", Float32 = "float32", Float16 = "float16" }
);

string_enum!(
    /// What the backward pass recomputes instead of keeping from the forward pass.
    RematPolicy {
        Full = "full",
        Minimal = "minimal",
        MinimalWithContext = "minimal_with_context",
        MinimalFlash = "minimal_flash",
        SaveDotWithContextExceptMlp = "save_dot_with_context_except_mlp",
        SaveDotExceptMlpwi = "save_dot_except_mlpwi",
        SaveDotExceptMlp = "save_dot_except_mlp",
        SaveQkvProj = "save_qkv_proj",
        SaveOutProj = "save_out_proj",
        None = "none",
        SaveEverything = "save_everything",
    }
);

string_enum!(
    /// MaxText's `attention`: how attention is computed (see `model::attention::AttentionImpl`
    /// for what each kind maps to in maxrs).
    AttentionKernel {
        Autoselected = "autoselected",
        DotProduct = "dot_product",
        Flash = "flash",
        CudnnFlashTe = "cudnn_flash_te",
        CudnnFlashJax = "cudnn_flash_jax",
    }
);

string_enum!(
    /// MaxText's `profiler`: none, an XPlane trace (TensorBoard's profile plugin), or the CUDA
    /// profiler API around the profiled steps (for Nsight Systems).
    ProfilerKind { None = "", Xplane = "xplane", Nsys = "nsys" }
);

string_enum!(
    /// MaxText's `lr_schedule_type`: warmup then cosine decay, or warmup-stable-decay.
    LrScheduleType { Cosine = "cosine", Wsd = "wsd" }
);

string_enum!(
    /// MaxText's `wsd_decay_style`: the shape of the WSD schedule's decay.
    WsdDecayStyle { Linear = "linear", Cosine = "cosine" }
);

string_enum!(
    /// MaxText's `hardware` key.
    Hardware { Cpu = "cpu", Gpu = "gpu", GpuMultiprocess = "gpu_multiprocess", Tpu = "tpu" }
);

string_enum!(
    /// Where training batches come from.
    DatasetType { Synthetic = "synthetic", Tokens = "tokens", Hf = "hf" }
);

string_enum!(
    /// MaxText's `tokenizer_type`.
    TokenizerType { SentencePiece = "sentencepiece", HuggingFace = "huggingface", Tiktoken = "tiktoken" }
);

string_enum!(
    /// The order in which each pipeline stage runs its forward and backward work (`pipeline_schedule`,
    /// the JaxPP fork's `schedule`): all forwards then all backwards, or one forward one backward
    /// after a warm-up (interleaved over the repeats when `num_pipeline_repeats` > 1).
    PipelineSchedule { Gpipe = "gpipe", OneFOneB = "1f1b", Interleaved1F1B = "interleaved_1f1b" }
);

string_enum!(
    /// maxrs's `on_checkpoint_error`: what a failed checkpoint save does to the run.
    OnCheckpointError { Stop = "stop", Continue = "continue" }
);

string_enum!(
    /// MaxText's decoder block styles that maxrs implements, one family file each under
    /// `src/model/`; mixtral is llama2's with a routed MoE block for the MLP.
    DecoderBlock {
        Llama2 = "llama2",
        Mistral = "mistral",
        Gemma = "gemma",
        Gemma2 = "gemma2",
        Gpt3 = "gpt3",
        Mixtral = "mixtral",
    }
);

string_enum!(
    /// MaxText's `decode_sampling_strategy`: how `maxrs decode` picks each next token.
    SamplingStrategy {
        Greedy = "greedy",
        Weighted = "weighted",
        Nucleus = "nucleus",
        Topk = "topk",
        Composite = "composite",
    }
);

string_enum!(
    /// MaxText's `rope_type`: `default` (half-split RoPE) or `llama3.1` (Llama 3.1's scaled
    /// frequencies on interleaved pairs); `yarn` is refused by validation as not supported yet.
    RopeType { Default = "default", Llama31 = "llama3.1", Yarn = "yarn" }
);

/// The MLP activations maxrs implements (`mlp_activations` entries; MaxText's names: `gelu` is
/// flax's tanh approximation).
pub const MLP_ACTIVATIONS: &[&str] = &["silu", "gelu", "relu", "linear"];

/// The closed set of values of a string key, if it has one.
pub(crate) fn choices(key: &str) -> Option<&'static [&'static str]> {
    match key {
        "dtype" | "weight_dtype" => Some(DType::VALUES),
        "remat_policy" => Some(RematPolicy::VALUES),
        "attention" => Some(AttentionKernel::VALUES),
        "profiler" => Some(ProfilerKind::VALUES),
        "lr_schedule_type" => Some(LrScheduleType::VALUES),
        "wsd_decay_style" => Some(WsdDecayStyle::VALUES),
        "hardware" => Some(Hardware::VALUES),
        "dataset_type" => Some(DatasetType::VALUES),
        "tokenizer_type" => Some(TokenizerType::VALUES),
        "decoder_block" => Some(DecoderBlock::VALUES),
        "decode_sampling_strategy" => Some(SamplingStrategy::VALUES),
        "rope_type" => Some(RopeType::VALUES),
        "on_checkpoint_error" => Some(OnCheckpointError::VALUES),
        "pipeline_schedule" => Some(PipelineSchedule::VALUES),
        _ => None,
    }
}

/// The keys a model file (`models/<name>.yml`) may set: the model's shape and variant keys, the
/// logical axis rules it needs, and the sequence length and optimizer settings MaxText's GPT-3
/// files carry (the keys MaxText's own model files set, among those maxrs has). A model file that
/// sets any other key is refused; run settings belong in the config file or on the command line.
/// A new model key is added here as well as to `Config`.
pub const MODEL_KEYS: &[&str] = &[
    "decoder_block",
    "base_emb_dim",
    "base_num_query_heads",
    "base_num_kv_heads",
    "base_mlp_dim",
    "base_num_decoder_layers",
    "head_dim",
    "vocab_size",
    "mlp_activations",
    "normalization_layer_epsilon",
    "rope_max_timescale",
    "rope_type",
    "rope_use_scale",
    "logits_via_embedding",
    "normalize_embedding_logits",
    "final_logits_soft_cap",
    "trainable_position_size",
    "sliding_window_size",
    "attn_logits_soft_cap",
    "use_post_attn_norm",
    "use_post_ffw_norm",
    "fused_qkv",
    "use_iota_embed",
    "logits_dot_in_fp32",
    "enable_dropout",
    "num_experts",
    "num_experts_per_tok",
    "capacity_factor",
    "sparse_matmul",
    "load_balance_loss_weight",
    "logical_axis_rules",
    "override_logical_axis_rules",
    // MaxText's GPT-3 files also set the sequence length and the optimizer they were trained with.
    "max_target_length",
    "adam_b1",
    "adam_b2",
    "adam_eps",
    "adam_weight_decay",
    "gradient_clipping_threshold",
];

/// MaxText keys of the checkpointing, run-output and data areas that maxrs refuses, with the
/// reason or what to do instead: loading refuses them by name rather than calling them unknown
/// (maxtext `src/maxtext/configs/base.yml`, commit e591f30).
pub(crate) fn not_supported_yet(key: &str) -> Option<&'static str> {
    const ORBAX: &str = "maxrs writes safetensors checkpoints with a manifest, not Orbax's OCDBT/Zarr storage";
    Some(match key {
        "checkpoint_storage_target_data_file_size_bytes"
        | "checkpoint_storage_use_ocdbt"
        | "checkpoint_storage_use_zarr3"
        | "checkpoint_storage_concurrent_gb"
        | "enable_orbax_v1"
        | "source_checkpoint_layout"
        | "checkpoint_conversion_fn" => ORBAX,
        "enable_continuous_checkpointing" => "checkpoints are saved every checkpoint_period steps",
        "enable_single_replica_ckpt_restoring" | "colocated_python_checkpointing" => "one process restores everything",
        "checkpoint_todelete_subdir" | "checkpoint_todelete_full_path" => {
            "max_num_checkpoints_to_keep deletes old checkpoints outright"
        }
        "enable_emergency_checkpoint"
        | "enable_multi_tier_checkpointing"
        | "local_checkpoint_directory"
        | "local_checkpoint_period"
        | "multi_tier_checkpointing_backup_interval_minutes"
        | "multi_tier_checkpointing_backup_interval_steps" => "there is one checkpoint directory per run",
        "lora_input_adapters_path" | "hf_lora_adapter_path" => "maxrs has no LoRA",
        "checkpoint_is_quantized" => "maxrs has no quantized checkpoints",
        "use_vertex_tensorboard" | "vertex_tensorboard_project" | "vertex_tensorboard_region" | "enable_wandb" => {
            "TensorBoard event files are written to base_output_directory/run_name/tensorboard/"
        }
        "hf_path" | "hf_name" | "hf_data_dir" | "hf_eval_split" | "hf_access_token" => {
            "maxrs reads no Hub datasets; give local files with hf_train_files / hf_eval_files"
        }
        "tokenize_train_data" | "tokenize_eval_data" => {
            "pre-tokenized hf columns are not read; convert with `maxrs tokenize` and use dataset_type=tokens"
        }
        "grain_train_files" | "grain_eval_files" | "grain_file_type" | "dataset_name" | "eval_dataset_name"
        | "train_split" | "eval_split" => "maxrs has no grain or tfds pipeline; use dataset_type=hf or tokens",
        "use_truncation"
        | "max_segments_per_seq"
        | "num_epoch"
        | "generate_padding_batch_train"
        | "generate_padding_batch_eval"
        | "expansion_factor_real_data"
        | "use_sft"
        | "use_dpo"
        | "use_chat_template" => "maxrs always truncates documents and repeats epochs until `steps`",
        _ => return None,
    })
}

/// Integer keys whose value may also be `None` (MaxText's spelling; `null` in YAML): those with
/// a row in `ranges::OPTIONAL_KEYS`.
pub(crate) fn nullable_int(key: &str) -> bool {
    super::ranges::OPTIONAL_KEYS.iter().any(|(k, _)| *k == key)
}

/// An optional integer written as MaxText does: `None` (a string to YAML), `null`, or a number.
fn none_or_int<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<i64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Int(i64),
        Text(String),
        Null,
    }
    match Option::<Raw>::deserialize(deserializer)? {
        None | Some(Raw::Null) => Ok(None),
        Some(Raw::Int(n)) => Ok(Some(n)),
        Some(Raw::Text(t)) if matches!(t.trim(), "None" | "none" | "null" | "") => Ok(None),
        Some(Raw::Text(t)) => t
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| serde::de::Error::custom(format!("{} is not an integer or None", quote(&t)))),
    }
}

/// The mesh axes of one logical axis rule: MaxText writes either one name or a list.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RuleAxes {
    One(String),
    Many(Vec<String>),
}

impl RuleAxes {
    pub fn to_vec(&self) -> Vec<String> {
        match self {
            RuleAxes::One(axis) => vec![axis.clone()],
            RuleAxes::Many(axes) => axes.clone(),
        }
    }
}

/// One row of `logical_axis_rules`: `[logical name, mesh axes]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LogicalAxisRule(pub String, pub RuleAxes);

/// Every configuration key. Comments on the keys live in `configs/base.yml`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Config {
    // Run
    pub run_name: String,
    pub model_name: String,
    pub override_model_config: bool,
    pub override_logical_axis_rules: bool,
    pub base_output_directory: String,
    pub metrics_file: String,
    pub log_period: i64,
    pub profiler: ProfilerKind,
    pub skip_first_n_steps_for_profiler: i64,
    pub profiler_steps: i64,
    pub enable_checkpointing: bool,
    pub load_parameters_path: String,
    pub load_full_state_path: String,
    pub async_checkpointing: bool,
    pub checkpoint_period: i64,
    #[serde(deserialize_with = "none_or_int")]
    pub max_num_checkpoints_to_keep: Option<i64>,
    pub save_checkpoint_on_start: bool,
    pub save_checkpoint_on_completion: bool,
    pub enable_autocheckpoint: bool,
    pub on_checkpoint_error: OnCheckpointError,
    pub enable_tensorboard: bool,
    pub gcs_metrics: bool,
    pub save_config_to_gcs: bool,

    // Model
    pub decoder_block: DecoderBlock,
    pub global_parameter_scale: i64,
    pub base_emb_dim: i64,
    pub base_num_query_heads: i64,
    pub base_num_kv_heads: i64,
    pub base_mlp_dim: i64,
    pub base_num_decoder_layers: i64,
    pub head_dim: i64,
    pub vocab_size: i64,
    pub mlp_activations: Vec<String>,
    pub normalization_layer_epsilon: f64,
    pub rope_max_timescale: i64,
    pub rope_type: RopeType,
    pub rope_use_scale: bool,
    pub logits_via_embedding: bool,
    pub normalize_embedding_logits: bool,
    pub final_logits_soft_cap: f64,
    pub trainable_position_size: i64,
    pub sliding_window_size: i64,
    pub attn_logits_soft_cap: f64,
    pub use_post_attn_norm: bool,
    pub use_post_ffw_norm: bool,
    pub fused_qkv: bool,
    pub enable_dropout: bool,
    pub attention: AttentionKernel,

    // Mixture of experts
    pub num_experts: i64,
    pub num_experts_per_tok: i64,
    pub capacity_factor: f64,
    pub sparse_matmul: bool,
    pub megablox: bool,
    pub load_balance_loss_weight: f64,
    pub float32_weight_sum: bool,
    pub float32_gate_logits: bool,
    pub moe_dispatch_no_expert_sharding: bool,

    // Numerics and memory
    pub dtype: DType,
    pub weight_dtype: DType,
    pub scan_layers: bool,
    pub remat_policy: RematPolicy,
    pub init_weights_seed: i64,
    pub logits_dot_in_fp32: bool,
    pub use_iota_embed: bool,

    // Data
    pub dataset_type: DatasetType,
    pub dataset_path: String,
    pub hf_train_files: String,
    pub hf_eval_files: String,
    pub train_data_columns: Vec<String>,
    pub eval_data_columns: Vec<String>,
    pub tokenizer_path: String,
    pub tokenizer_type: TokenizerType,
    pub add_bos: bool,
    pub add_eos: bool,
    pub packing: bool,
    pub enable_data_shuffling: bool,
    pub data_shuffle_seed: i64,
    pub per_device_batch_size: f64,
    pub max_target_length: i64,

    // Eval
    pub eval_interval: i64,
    pub eval_steps: i64,
    pub eval_start_step: i64,
    pub eval_per_device_batch_size: f64,

    // Training loop and optimizer
    pub steps: i64,
    pub gradient_accumulation_steps: i64,
    pub learning_rate: f64,
    pub learning_rate_schedule_steps: i64,
    pub lr_schedule_type: LrScheduleType,
    pub warmup_steps_fraction: f64,
    pub learning_rate_final_fraction: f64,
    pub wsd_decay_steps_fraction: f64,
    pub wsd_decay_style: WsdDecayStyle,
    pub adam_b1: f64,
    pub adam_b2: f64,
    pub adam_eps: f64,
    pub adam_eps_root: f64,
    pub adam_weight_decay: f64,
    pub gradient_clipping_threshold: f64,
    pub z_loss_multiplier: f64,
    pub abort_on_nan_loss: bool,
    pub abort_on_inf_loss: bool,

    // Decoding (maxrs decode)
    pub prompt: Vec<String>,
    pub max_prefill_predict_length: i64,
    pub autoregressive_decode_assert: String,
    pub decode_sampling_strategy: SamplingStrategy,
    pub decode_sampling_nucleus_p: f64,
    pub decode_sampling_top_k: i64,
    pub decode_sampling_temperature: f64,
    pub decode_seed: i64,

    // Ahead-of-time compilation
    pub compiled_trainstep_file: String,
    pub compile_topology: String,
    pub compile_topology_num_slices: i64,

    // Hardware
    pub hardware: Hardware,
    pub plugin: String,
    pub cpu_device_count: i64,
    pub xla_flags_file: String,
    pub peak_tflops_per_device: f64,

    // Multi-process jobs (src/cluster)
    pub coordinator_address: String,
    pub num_processes: i64,
    pub process_id: i64,
    pub external_coordinator: bool,
    pub jax_distributed_initialization_timeout: i64,
    pub skip_jax_distributed_system: bool,
    pub heartbeat_timeout_seconds: i64,
    pub shutdown_timeout_seconds: i64,

    // Hang diagnostics
    pub collect_stack_trace: bool,
    pub stack_trace_to_cloud: bool,
    pub stack_trace_interval_seconds: i64,
    pub slow_step_stack_trace_factor: f64,

    // Parallelism
    pub mesh_axes: Vec<String>,
    pub logical_axis_rules: Vec<LogicalAxisRule>,
    pub data_sharding: Vec<Vec<String>>,
    pub dcn_data_parallelism: i64,
    pub dcn_pipeline_parallelism: i64,
    pub dcn_fsdp_parallelism: i64,
    pub dcn_fsdp_transpose_parallelism: i64,
    pub dcn_context_parallelism: i64,
    pub dcn_tensor_parallelism: i64,
    pub dcn_tensor_sequence_parallelism: i64,
    pub dcn_expert_parallelism: i64,
    pub dcn_autoregressive_parallelism: i64,
    pub ici_data_parallelism: i64,
    pub ici_pipeline_parallelism: i64,
    pub ici_fsdp_parallelism: i64,
    pub ici_fsdp_transpose_parallelism: i64,
    pub ici_context_parallelism: i64,
    pub ici_tensor_parallelism: i64,
    pub ici_tensor_sequence_parallelism: i64,
    pub ici_expert_parallelism: i64,
    pub ici_autoregressive_parallelism: i64,

    // Pipeline parallelism (the `stage` axis; src/config/pipeline.rs)
    pub num_layers_per_pipeline_stage: i64,
    pub num_pipeline_repeats: i64,
    pub pipeline_parallel_layers: i64,
    pub num_pipeline_microbatches: i64,
    pub pipeline_schedule: PipelineSchedule,
    pub pipeline_delay_activation_forwarding: bool,
    pub pipeline_fsdp_ag_once: bool,
    pub pipeline_fsdp_ag_per_repeat: bool,
    pub scan_pipeline_iterations: bool,
    pub scan_pipeline_repeats: bool,
    pub scan_layers_per_stage: bool,
    pub set_remat_policy_on_pipeline_iterations: bool,
    pub set_remat_policy_on_layers_per_stage: bool,
}
