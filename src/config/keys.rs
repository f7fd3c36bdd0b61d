//! The typed configuration: one field per key of `configs/base.yml`, with MaxText's names.
//!
//! The field list is the list of valid keys: loading checks every key against it (see `value.rs`),
//! so adding a key here and a default in `configs/base.yml` is all a new key needs.

use serde::{Deserialize, Serialize};

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
    DatasetType { Synthetic = "synthetic", Tokens = "tokens" }
);

string_enum!(
    /// The order in which each pipeline stage runs its forward and backward work (`pipeline_schedule`,
    /// the JaxPP fork's `schedule`): all forwards then all backwards, or one forward one backward
    /// after a warm-up (interleaved over the repeats when `num_pipeline_repeats` > 1).
    PipelineSchedule { Gpipe = "gpipe", OneFOneB = "1f1b", Interleaved1F1B = "interleaved_1f1b" }
);

string_enum!(
    /// MaxText's decoder block styles that maxrs implements; mistral is llama2's block (MaxText's
    /// mistral layer has no sliding window either).
    DecoderBlock { Llama2 = "llama2", Mistral = "mistral" }
);

/// The closed set of values of a string key, if it has one.
pub(crate) fn choices(key: &str) -> Option<&'static [&'static str]> {
    match key {
        "dtype" | "weight_dtype" => Some(DType::VALUES),
        "remat_policy" => Some(RematPolicy::VALUES),
        "lr_schedule_type" => Some(LrScheduleType::VALUES),
        "wsd_decay_style" => Some(WsdDecayStyle::VALUES),
        "hardware" => Some(Hardware::VALUES),
        "dataset_type" => Some(DatasetType::VALUES),
        "decoder_block" => Some(DecoderBlock::VALUES),
        "pipeline_schedule" => Some(PipelineSchedule::VALUES),
        _ => None,
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
    pub enable_checkpointing: bool,
    pub load_parameters_path: String,

    // Model
    pub decoder_block: DecoderBlock,
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
    pub logits_via_embedding: bool,
    pub enable_dropout: bool,

    // Numerics and memory
    pub dtype: DType,
    pub weight_dtype: DType,
    pub scan_layers: bool,
    pub remat_policy: RematPolicy,
    pub init_weights_seed: i64,

    // Data
    pub dataset_type: DatasetType,
    pub dataset_path: String,
    pub data_shuffle_seed: i64,
    pub per_device_batch_size: f64,
    pub max_target_length: i64,

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
