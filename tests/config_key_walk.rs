//! Every key of `configs/base.yml` does something, or is refused: no key is accepted and
//! ignored. Each key is classified below, and the class is proved:
//! - `Program(value)`: setting it changes the traced train step or init program (their StableHLO);
//! - `ProgramVs(value, other, with)`: `value` and `other` give different programs, both with the
//!   keys `with` set (where the default alone cannot vary: mesh axes that must multiply out);
//! - `Derives(value, other, with, slices)`: `value` and `other` give different derived settings
//!   (mesh, batch sizes) on 8 devices in `slices` slices;
//! - `Resolves(value)`: setting it changes other resolved keys (a model choice);
//! - `Allows(overrides)`: the overrides are refused without the key set to true, accepted with it;
//! - `Refused(value)`: that value is refused with an error naming the key;
//! - `KernelChoice(why)`: MaxText's choice between kernels of the same math; maxrs has one
//!   implementation, so both values load and compute the same (the reason says which);
//! - `Runtime(why)`: it steers the run itself (files, data, loop, cluster); the proof is that code
//!   outside `src/config/` reads the field, and the reason says what it does. These keys are
//!   exercised by their own tests (checkpoint, data, cluster, ...).
//!
//! A key of base.yml missing from the table fails the test, so a new key must be classified.

use std::collections::BTreeMap;
use std::path::Path;

use maxrs::config::{self, Config};
use maxrs::lower::to_stablehlo;
use maxrs::train::step::TrainStep;

enum Effect {
    Program(&'static str),
    ProgramVs(&'static str, &'static str, &'static [&'static str]),
    Derives(&'static str, &'static str, &'static [&'static str], usize),
    Resolves(&'static str),
    Allows(&'static [&'static str]),
    Refused(&'static str),
    KernelChoice(&'static str),
    Runtime(&'static str),
}

/// Preference pairs (`use_dpo`'s data: checked when the files are opened, not here), whose two
/// columns pre-training refuses.
const PREFERENCE_DATA: &[&str] = &[
    "dataset_type=hf",
    "hf_train_files=pairs.jsonl",
    "tokenizer_path=tokenizer.model",
    "packing=false",
    "train_data_columns=[chosen, rejected]",
];
/// A DPO run, and an ORPO one.
const DPO: &[&str] = &[
    "dataset_type=hf",
    "hf_train_files=pairs.jsonl",
    "tokenizer_path=tokenizer.model",
    "packing=false",
    "train_data_columns=[chosen, rejected]",
    "use_dpo=true",
];
const ORPO: &[&str] = &[
    "dataset_type=hf",
    "hf_train_files=pairs.jsonl",
    "tokenizer_path=tokenizer.model",
    "packing=false",
    "train_data_columns=[chosen, rejected]",
    "use_dpo=true",
    "dpo.algo=orpo",
];
/// A small Mixtral: the context of the MoE keys.
const MOE: &[&str] = &["decoder_block=mixtral", "num_experts=4", "num_experts_per_tok=2"];
/// The dropping path with experts split over the expert axis.
const MOE_EXPERT_PARALLEL: &[&str] = &[
    "decoder_block=mixtral",
    "num_experts=4",
    "num_experts_per_tok=2",
    "sparse_matmul=false",
    "capacity_factor=1.25",
    "ici_expert_parallelism=2",
];
/// A small DeepSeek layer (multi-head latent attention) with `extra` keys.
macro_rules! deepseek {
    ($($extra:literal),*) => {
        &[
            "decoder_block=deepseek",
            "attention_type=mla",
            "base_num_kv_heads=4",
            "kv_lora_rank=32",
            "qk_nope_head_dim=16",
            "qk_rope_head_dim=8",
            "v_head_dim=16",
            "first_num_dense_layers=2",
            $($extra),*
        ]
    };
}
const DEEPSEEK: &[&str] = deepseek!();
const DEEPSEEK_YARN: &[&str] = deepseek!("rope_type=yarn");
/// A small gpt-oss layer pair (a sliding and a global layer, 4 experts) with `extra` keys.
macro_rules! gpt_oss {
    ($($extra:literal),*) => {
        &[
            "decoder_block=gpt_oss",
            "inhomogeneous_layer_cycle_interval=2",
            "base_num_decoder_layers=2",
            "sliding_window_size=16",
            "num_experts=4",
            "num_experts_per_tok=2",
            "mlp_activations=[sigmoid, linear]",
            $($extra),*
        ]
    };
}
const GPT_OSS: &[&str] = gpt_oss!("mlp_activations_limit=7.0");
/// A small Llama 4 block of 2 layers: a chunked dense layer, then a NoPE MoE layer.
const LLAMA4: &[&str] = &[
    "decoder_block=llama4",
    "inhomogeneous_layer_cycle_interval=2",
    "base_num_decoder_layers=2",
    "nope_layer_interval=2",
    "interleave_moe_layer_step=2",
    "chunk_attn_window_size=16",
    "num_experts=4",
    "base_moe_mlp_dim=256",
];
/// A small Gemma 4 block (5 local layers and a global one) from gemma4-31b's file.
const GEMMA4: &[&str] = &[
    "model_name=gemma4-31b",
    "override_model_config=true",
    "base_num_decoder_layers=6",
    "base_emb_dim=64",
    "base_num_query_heads=4",
    "base_num_kv_heads=2",
    "head_dim=16",
    "base_mlp_dim=128",
    "vocab_size=256",
];
/// Gemma 4 small's 6 layers (4 local, a global one, a local one), unscanned, from gemma4-e2b's
/// file, with per-layer inputs 8 wide from a table of 256 rows, and `extra` keys.
macro_rules! gemma4_small {
    ($($extra:literal),*) => {
        &[
            "model_name=gemma4-e2b",
            "override_model_config=true",
            "scan_layers=false",
            "base_num_decoder_layers=6",
            "base_emb_dim=64",
            "base_num_query_heads=4",
            "base_num_kv_heads=2",
            "head_dim=16",
            "base_mlp_dim=128",
            "vocab_size=256",
            "hidden_size_per_layer_input=8",
            "vocab_size_per_layer_input=256",
            $($extra),*
        ]
    };
}
const GEMMA4_SMALL: &[&str] = gemma4_small!();
/// The same with its last layer reusing layer 3's keys and values.
const GEMMA4_SMALL_SHARED: &[&str] = gemma4_small!("num_kv_shared_layers=1");
/// With routed experts, and those in 2 groups, each token choosing from the best one.
const DEEPSEEK_MOE: &[&str] =
    deepseek!("first_num_dense_layers=1", "num_experts=4", "num_experts_per_tok=2", "base_moe_mlp_dim=256");
/// (Groups need a DeepSeek-V3 model name: MaxText groups only under deepseek3/deepseek4 names,
/// `get_topk` in `layers/moe.py` at e591f30; here deepseek3-test at the default model's sizes.)
const DEEPSEEK_GROUPED: &[&str] = deepseek!(
    "model_name=deepseek3-test",
    "override_model_config=true",
    "base_emb_dim=256",
    "base_num_query_heads=4",
    "base_mlp_dim=512",
    "base_num_decoder_layers=2",
    "vocab_size=512",
    "q_lora_rank=0",
    "first_num_dense_layers=1",
    "num_experts=4",
    "num_experts_per_tok=2",
    "base_moe_mlp_dim=256",
    "n_routing_groups=2",
    "topk_routing_group=1"
);
use Effect::*;

const KEYS: &[(&str, Effect)] = &[
    ("run_name", Runtime("names the run's directory under base_output_directory and the metrics' run_name")),
    ("model_name", Resolves("llama2-7b")),
    ("override_model_config", Allows(&["model_name=llama2-7b", "base_emb_dim=128"])),
    (
        "override_logical_axis_rules",
        ProgramVs("true", "false", &["logical_axis_rules=[[embed, [tensor]], [mlp, [tensor]]]"]),
    ),
    ("base_output_directory", Runtime("run directory: checkpoints, metrics chunks, TensorBoard events, config")),
    ("metrics_file", Runtime("one JSON line of metrics per step")),
    ("log_period", Runtime("how often metrics chunks and TensorBoard events are flushed")),
    ("enable_tensorboard", Runtime("writes TensorBoard event files")),
    ("gcs_metrics", Runtime("writes metrics chunks into the run directory")),
    ("save_config_to_gcs", Runtime("writes the resolved config into the run directory")),
    ("profiler", Runtime("profiles steps through the plugin's profiler (xplane) or for Nsight (nsys)")),
    ("skip_first_n_steps_for_profiler", Runtime("the first profiled step; earlier steps leave the perf summary")),
    ("profiler_steps", Runtime("how many steps are profiled")),
    ("enable_checkpointing", Runtime("saves checkpoints")),
    ("async_checkpointing", Runtime("writes checkpoints on a background thread")),
    ("checkpoint_period", Runtime("steps between checkpoints")),
    ("max_num_checkpoints_to_keep", Runtime("retention of old checkpoints")),
    ("save_checkpoint_on_start", Runtime("a checkpoint before the first step")),
    ("save_checkpoint_on_completion", Runtime("a checkpoint after the last step")),
    ("enable_autocheckpoint", Runtime("SIGTERM saves a checkpoint and stops")),
    ("on_checkpoint_error", Runtime("stop or continue when a save fails")),
    ("load_parameters_path", Runtime("initial parameters from a file or checkpoint")),
    ("load_full_state_path", Runtime("initial state (parameters, optimizer, step) from a checkpoint")),
    ("decoder_block", Refused("qwen3_next")),
    ("global_parameter_scale", Program("2")),
    ("base_emb_dim", Program("128")),
    ("base_num_query_heads", Program("8")),
    ("base_num_kv_heads", Program("4")),
    ("base_mlp_dim", Program("256")),
    ("base_num_decoder_layers", Program("3")),
    ("head_dim", Program("32")),
    ("vocab_size", Program("1024")),
    ("mlp_activations", Program("[gelu, linear]")),
    ("normalization_layer_epsilon", Program("1.0e-6")),
    ("rope_max_timescale", Program("500000")),
    ("rope_type", Program("llama3.1")),
    ("rope_use_scale", ProgramVs("false", "true", &["rope_type=llama3.1"])),
    ("logits_via_embedding", Program("true")),
    ("normalize_embedding_logits", ProgramVs("false", "true", &["logits_via_embedding=true"])),
    ("final_logits_soft_cap", ProgramVs("30.0", "0.0", &["logits_via_embedding=true"])),
    ("trainable_position_size", Program("2048")),
    ("sliding_window_size", ProgramVs("16", "0", &["decoder_block=mistral"])),
    ("attn_logits_soft_cap", ProgramVs("50.0", "0.0", GEMMA2)),
    ("use_post_attn_norm", ProgramVs("true", "false", GEMMA2)),
    ("use_qk_norm", ProgramVs("true", "false", &["decoder_block=qwen3"])),
    ("attention_bias", ProgramVs("true", "false", &["decoder_block=qwen2"])),
    ("attention_sink", ProgramVs("true", "false", GPT_OSS)),
    ("mlp_bias", ProgramVs("true", "false", GPT_OSS)),
    ("mlp_activations_limit", ProgramVs("3.0", "7.0", gpt_oss!())),
    ("nope_layer_interval", ProgramVs("1", "2", LLAMA4)),
    ("chunk_attn_window_size", ProgramVs("8", "16", LLAMA4)),
    ("temperature_tuning", ProgramVs("true", "false", LLAMA4)),
    ("interleave_moe_layer_step", ProgramVs("1", "2", LLAMA4)),
    // qwen3_custom_moe requires attention_output_dim = moe_expert_input_dim, so neither can vary
    // alone there; their effect is tests/qwen3_custom.rs's. Other families refuse them by name.
    ("attention_output_dim", Refused("768")),
    ("use_post_ffw_norm", ProgramVs("true", "false", GEMMA2)),
    ("local_rope_max_timescale", ProgramVs("100", "-1", GEMMA3)),
    ("global_rope_max_timescale", ProgramVs("100", "-1", GEMMA4)),
    ("global_rope_proportion", ProgramVs("0.5", "0.25", GEMMA4)),
    ("local_rope_proportion", ProgramVs("0.5", "1.0", GEMMA4)),
    ("global_head_dim", ProgramVs("32", "0", GEMMA4)),
    ("global_num_kv_heads", ProgramVs("1", "0", GEMMA4)),
    ("share_kv_projections", ProgramVs("true", "false", GEMMA4)),
    ("v_norm_with_scale", ProgramVs("true", "false", GEMMA4)),
    ("hidden_size_per_layer_input", ProgramVs("16", "8", GEMMA4_SMALL)),
    ("vocab_size_per_layer_input", ProgramVs("128", "256", GEMMA4_SMALL)),
    ("num_kv_shared_layers", ProgramVs("1", "0", GEMMA4_SMALL)),
    ("use_double_wide_mlp", ProgramVs("true", "false", GEMMA4_SMALL_SHARED)),
    ("rope_linear_scaling_factor", ProgramVs("8.0", "1.0", GEMMA3)),
    ("fused_qkv", ProgramVs("true", "false", &["decoder_block=gpt3", "base_num_kv_heads=4"])),
    ("enable_dropout", KernelChoice("dropout at dropout_rate 0, the only rate maxrs takes, is the identity in MaxText (flax's Dropout) as in maxrs")),
    ("attention", Program("flash")),
    ("attention_type", Refused("local_sliding")),
    ("q_lora_rank", ProgramVs("16", "0", DEEPSEEK)),
    ("kv_lora_rank", ProgramVs("16", "32", DEEPSEEK)),
    ("qk_nope_head_dim", ProgramVs("8", "16", DEEPSEEK)),
    ("qk_rope_head_dim", ProgramVs("4", "8", DEEPSEEK)),
    ("v_head_dim", ProgramVs("8", "16", DEEPSEEK)),
    ("max_position_embeddings", ProgramVs("4096", "163840", DEEPSEEK)),
    ("original_max_position_embeddings", ProgramVs("8192", "4096", DEEPSEEK_YARN)),
    ("rope_factor", ProgramVs("8", "40", DEEPSEEK_YARN)),
    ("beta_fast", ProgramVs("1000", "32", DEEPSEEK_YARN)),
    ("beta_slow", ProgramVs("0.1", "1", DEEPSEEK_YARN)),
    ("mscale", ProgramVs("0.5", "1.0", DEEPSEEK)),
    ("rope_interleave", ProgramVs("false", "true", DEEPSEEK_YARN)),
    ("rope_truncate", ProgramVs("false", "true", DEEPSEEK_YARN)),
    ("rope_attention_scaling", ProgramVs("true", "false", DEEPSEEK_YARN)),
    ("mtp_num_layers", Refused("1")),
    ("dtype", Program("float32")),
    ("weight_dtype", Program("bfloat16")),
    ("quantization", Program("fp8")),
    ("scan_layers", Program("false")),
    ("remat_policy", Program("minimal")),
    ("init_weights_seed", Program("7")),
    ("num_experts", ProgramVs("4", "2", &["decoder_block=mixtral", "num_experts_per_tok=2"])),
    ("num_experts_per_tok", ProgramVs("2", "1", &["decoder_block=mixtral", "num_experts=4"])),
    ("capacity_factor", ProgramVs("1.25", "2.0", &["decoder_block=mixtral", "num_experts=4", "sparse_matmul=false"])),
    ("norm_topk_prob", ProgramVs("true", "false", MOE)),
    ("moe_expert_input_dim", Refused("768")),
    ("sparse_matmul", ProgramVs("false", "true", MOE)),
    ("megablox", KernelChoice("MaxText's Pallas grouped matmul (true) or jax.lax.ragged_dot (false); maxrs lowers ragged_dot to tiled dense products either way")),
    ("load_balance_loss_weight", ProgramVs("0.01", "0.0", MOE)),
    ("float32_weight_sum", ProgramVs("false", "true", MOE)),
    ("float32_gate_logits", ProgramVs("true", "false", MOE)),
    ("moe_dispatch_no_expert_sharding", ProgramVs("true", "false", MOE_EXPERT_PARALLEL)),
    // DeepSeek's routing: no family reads these until decoder_block=deepseek exists (its routing
    // is tests/moe_deepseek.rs's).
    ("shared_experts", ProgramVs("1", "0", DEEPSEEK_MOE)),
    ("routed_score_func", ProgramVs("sigmoid", "softmax", DEEPSEEK_MOE)),
    ("routed_bias", ProgramVs("true", "false", DEEPSEEK_MOE)),
    ("routed_bias_update_rate", Refused("0.001")),
    ("n_routing_groups", ProgramVs("1", "2", DEEPSEEK_GROUPED)),
    ("topk_routing_group", ProgramVs("2", "1", DEEPSEEK_GROUPED)),
    ("routed_scaling_factor", ProgramVs("2.5", "1.0", DEEPSEEK_MOE)),
    ("first_num_dense_layers", ProgramVs("1", "2", DEEPSEEK_MOE)),
    ("base_moe_mlp_dim", ProgramVs("128", "256", DEEPSEEK_MOE)),
    ("logits_dot_in_fp32", Program("true")),
    ("use_iota_embed", Program("true")),
    ("num_vocab_tiling", Program("2")),
    ("vocab_tiling_ag_once", ProgramVs("true", "false", &["num_vocab_tiling=2"])),
    ("dataset_type", Refused("tfds")),
    ("synthetic_progression", Runtime("maxrs's learnable synthetic rows instead of MaxText's fixed batch")),
    ("dataset_path", Runtime("the token file of dataset_type=tokens")),
    ("hf_train_files", Runtime("the text files of dataset_type=hf")),
    ("grain_train_mixture_config_path", Runtime("the training mixture of dataset_type=hf, from a JSON file")),
    ("hf_eval_files", Runtime("the eval files")),
    ("hf_path", Runtime("how dataset_type=hf finds and reads its files: by extension, a builder, or a Hub dataset")),
    ("hf_name", Runtime("the config of a Hub dataset")),
    ("hf_data_dir", Runtime("the folder of a Hub dataset, or of local files with a builder hf_path")),
    ("train_split", Runtime("the split of hf_path's dataset that training reads")),
    ("hf_eval_split", Runtime("the split of hf_path's dataset that eval reads")),
    ("hf_access_token", Runtime("the token sent to the Hub for private or gated datasets")),
    ("train_data_columns", Runtime("the text column read from Parquet/JSONL")),
    ("eval_data_columns", Runtime("the eval text column")),
    ("tokenizer_path", Runtime("the tokenizer")),
    ("tokenizer_type", Refused("tiktoken")),
    ("add_bos", Runtime("BOS added by the tokenizer")),
    ("add_eos", Runtime("EOS added by the tokenizer")),
    ("packing", Runtime("packs documents into rows (and feeds segment ids to the step)")),
    (
        "max_segments_per_seq",
        Runtime("caps the documents a packed row takes (data::packing) and sizes cuDNN's packed layout (cudnn_model)"),
    ),
    ("use_sft", Runtime("rows are conversations rendered with the chat template (data_sft)")),
    ("sft_train_on_completion_only", Runtime("prompt targets get no loss (data_sft)")),
    ("chat_template", Runtime("the SFT chat template itself (data_sft)")),
    ("chat_template_path", Runtime("the file of the SFT chat template (data_sft)")),
    ("enable_data_shuffling", Runtime("shuffles files and documents")),
    ("reuse_example_batch", Runtime("feeds the first batch a process reads at every step")),
    ("data_shuffle_seed", Runtime("the shuffle's and synthetic_progression's seed")),
    ("per_device_batch_size", Program("4")),
    ("max_target_length", Program("64")),
    ("eval_interval", Runtime("steps between evals")),
    ("eval_steps", Runtime("batches per eval")),
    ("eval_start_step", Runtime("first step followed by an eval")),
    ("eval_per_device_batch_size", Derives("2", "0", &[], 1)),
    ("steps", Program("50")),
    ("gradient_accumulation_steps", Program("2")),
    (
        "use_tunix_gradient_accumulation",
        KernelChoice("Tunix's accumulation and MaxText's compute the same step with one microbatch, the only case maxrs takes true in (more is refused)"),
    ),
    ("learning_rate", Program("3e-4")),
    ("learning_rate_schedule_steps", Program("500")),
    ("lr_schedule_type", Program("wsd")),
    ("warmup_steps_fraction", Program("0.3")),
    ("learning_rate_final_fraction", Program("0.5")),
    ("wsd_decay_steps_fraction", Runtime("the WSD schedule's decay share (with lr_schedule_type=wsd)")),
    ("wsd_decay_style", Runtime("the WSD schedule's decay shape (with lr_schedule_type=wsd)")),
    ("adam_b1", Program("0.8")),
    ("adam_b2", Program("0.9")),
    ("adam_eps", Program("1e-6")),
    ("adam_eps_root", Program("1e-9")),
    ("adam_weight_decay", Program("0.5")),
    ("gradient_clipping_threshold", Program("0.5")),
    ("z_loss_multiplier", Program("1e-4")),
    ("abort_on_nan_loss", Runtime("stops the run on a NaN loss")),
    ("abort_on_inf_loss", Runtime("stops the run on an infinite loss")),
    ("lora.enable_lora", ProgramVs("true", "false", &["lora.lora_rank=2", "lora.lora_alpha=4"])),
    ("lora.lora_rank", ProgramVs("4", "2", &["lora.enable_lora=true", "lora.lora_alpha=4"])),
    ("lora.lora_alpha", ProgramVs("8", "2", &["lora.enable_lora=true", "lora.lora_rank=2"])),
    ("inhomogeneous_layer_cycle_interval", Refused("2")),
    ("lora.lora_restore_path", Runtime("a LoRA run starts from the adapters of that checkpoint (tests/lora.rs)")),
    ("lora.lora_module_path", ProgramVs(".*query", ".*key", &["lora.enable_lora=true", "lora.lora_rank=2", "lora.lora_alpha=4"])),
    ("use_dpo", Allows(PREFERENCE_DATA)),
    ("dpo.algo", ProgramVs("orpo", "dpo", DPO)),
    ("dpo.dpo_beta", ProgramVs("0.5", "0.1", DPO)),
    ("dpo.orpo_lambda", ProgramVs("0.5", "0.1", ORPO)),
    ("dpo.dpo_label_smoothing", ProgramVs("0.2", "0", DPO)),
    ("dpo.max_prompt_length", Runtime("the prompt ids each preference pair keeps (data::preference, tests/dpo.rs)")),
    ("prompt", Runtime("maxrs decode's prompts")),
    ("max_prefill_predict_length", Runtime("maxrs decode's prefill length (prompts padded to it)")),
    ("autoregressive_decode_assert", Runtime("maxrs decode checks the first prompt's output")),
    ("decode_sampling_strategy", Runtime("how maxrs decode picks each token")),
    ("decode_sampling_nucleus_p", Runtime("maxrs decode's nucleus")),
    ("decode_sampling_top_k", Runtime("maxrs decode's top k")),
    ("decode_sampling_temperature", Runtime("maxrs decode's temperature")),
    ("decode_seed", Runtime("maxrs decode's sampling key")),
    ("mla_naive_kvcache", Runtime("deepseek decoding's cache: every head's keys and values, or MLA's latents")),
    ("compiled_trainstep_file", Runtime("saves (train-compile) or loads (train) the compiled step")),
    ("compile_topology", Runtime("train-compile's target")),
    ("gpu_target_config", Runtime("train-compile: the GPU description the CUDA plugin compiles against")),
    ("jax_cache_dir", Runtime("where compiled programs are kept and loaded from (tests/compile_cache.rs)")),
    ("compile_topology_num_slices", Runtime("train-compile's number of slices")),
    ("hardware", Refused("tpu_multislice")),
    ("plugin", Refused("nosuchplugin")),
    ("cpu_device_count", Runtime("devices of the CPU plugin")),
    ("xla_flags_file", Runtime("XLA flags for the compile")),
    ("peak_tflops_per_device", Runtime("MFU's denominator")),
    ("coordinator_address", Runtime("the coordination service's address")),
    ("num_processes", Runtime("processes of the job")),
    ("process_id", Runtime("this process's rank")),
    ("external_coordinator", Runtime("the coordination service runs outside process 0")),
    ("jax_distributed_initialization_timeout", Runtime("how long processes wait for each other")),
    ("skip_jax_distributed_system", Runtime("a one-process job ignores the launcher's environment")),
    ("heartbeat_timeout_seconds", Runtime("failure detection")),
    ("shutdown_timeout_seconds", Runtime("the shutdown barrier")),
    ("collect_stack_trace", Runtime("periodic stack traces")),
    ("stack_trace_to_cloud", Refused("true")),
    ("stack_trace_interval_seconds", Runtime("period of the stack traces")),
    ("slow_step_stack_trace_factor", Runtime("stack traces of a slow step")),
    ("mesh_axes", Program("[data, stage, fsdp, fsdp_transpose, context, tensor, tensor_sequence, expert]")),
    ("logical_axis_rules", Program("[[embed, [tensor]]]")),
    ("data_sharding", Refused("[[data, fsdp]]")),
    ("dcn_data_parallelism", Derives("1", "2", &["dcn_fsdp_parallelism=-1"], 2)),
    ("dcn_pipeline_parallelism", Derives("2", "1", &["base_num_decoder_layers=4"], 2)),
    ("dcn_fsdp_parallelism", Derives("2", "1", &[], 2)),
    ("dcn_fsdp_transpose_parallelism", Derives("2", "1", &[], 2)),
    ("dcn_context_parallelism", Derives("2", "1", &[], 2)),
    // Only 1 is accepted: usp refuses a DCN split, as MaxText (configs/types.py:3079 at e591f30).
    ("dcn_context_usp_ulysses_parallelism", Refused("2")),
    ("dcn_tensor_parallelism", Derives("2", "1", &[], 2)),
    ("dcn_tensor_sequence_parallelism", Derives("2", "1", &[], 2)),
    ("dcn_expert_parallelism", Derives("2", "1", &[], 2)),
    ("dcn_autoregressive_parallelism", Derives("2", "1", &[], 2)),
    ("ici_data_parallelism", Program("2")),
    ("ici_pipeline_parallelism", Derives("2", "1", &[], 1)),
    ("num_layers_per_pipeline_stage", Derives("2", "1", &["ici_pipeline_parallelism=2", "base_num_decoder_layers=4"], 1)),
    ("num_pipeline_repeats", Refused("3")),
    ("pipeline_parallel_layers", Refused("2")),
    ("num_pipeline_microbatches", Derives("4", "2", &["ici_pipeline_parallelism=2"], 1)),
    ("pipeline_schedule", Derives("gpipe", "1f1b", &["ici_pipeline_parallelism=2"], 1)),
    ("pipeline_delay_activation_forwarding", Refused("true")),
    ("pipeline_fsdp_ag_once", Refused("true")),
    ("pipeline_fsdp_ag_per_repeat", Refused("true")),
    ("scan_pipeline_iterations", Refused("false")),
    ("scan_pipeline_repeats", Refused("true")),
    ("scan_layers_per_stage", Refused("true")),
    ("set_remat_policy_on_pipeline_iterations", Refused("false")),
    ("set_remat_policy_on_layers_per_stage", Refused("true")),
    ("ici_fsdp_parallelism", ProgramVs("2", "1", &["ici_data_parallelism=-1"])),
    ("ici_fsdp_transpose_parallelism", Program("2")),
    ("ici_context_parallelism", Program("2")),
    (
        "ici_context_usp_ulysses_parallelism",
        ProgramVs(
            "4",
            "2",
            &["context_parallel_strategy=usp", "ici_context_parallelism=2", "attention=flash", "base_num_kv_heads=4"],
        ),
    ),
    ("ici_tensor_parallelism", Program("2")),
    ("ici_tensor_sequence_parallelism", Program("2")),
    ("ici_expert_parallelism", Program("2")),
    ("ici_autoregressive_parallelism", Program("2")),
    ("context_parallel_strategy", ProgramVs("ring", "all_gather", &["ici_context_parallelism=2", "attention=dot_product"])),
    ("context_parallel_load_balance", ProgramVs("false", "true", &["ici_context_parallelism=2"])),
    (
        "context_parallel_reorder_strategy",
        ProgramVs("striped", "dual_chunk_swap", &["ici_context_parallelism=2", "hardware=gpu", "plugin=cuda12"]),
    ),
];

/// The gemma2 family on the default model's sizes (its local layers need a window).
const GEMMA2: &[&str] = &["decoder_block=gemma2", "sliding_window_size=16"];
/// The gemma3 family on the default model's sizes (one block of 6 layers), under a name MaxText's
/// gemma3 knows (`get_query_pre_attn_scalar`, `models/gemma3.py:52-59` at MaxText e591f30).
const GEMMA3: &[&str] = &[
    "model_name=gemma3-4b",
    "override_model_config=true",
    "base_num_decoder_layers=6",
    "sliding_window_size=16",
    "base_emb_dim=256",
    "base_num_query_heads=4",
    "base_num_kv_heads=2",
    "base_mlp_dim=512",
    "head_dim=64",
    "vocab_size=512",
];

/// Devices the mesh keys are checked on: the default mesh puts them all on fsdp.
const DEVICES: usize = 8;

fn base_keys() -> Vec<String> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/base.yml")).unwrap();
    let yaml: serde_yaml::Mapping = serde_yaml::from_str(&text).unwrap();
    yaml.keys().map(|k| k.as_str().expect("keys are strings").to_string()).collect()
}

fn load(overrides: &[String]) -> Result<Config, String> {
    let c = config::load(None, overrides).map_err(|e| e.to_string())?;
    config::check(&c).map_err(|e| e.to_string())?;
    Ok(c)
}

/// The StableHLO of the train step and init program of `overrides` on [`DEVICES`] devices.
fn programs(overrides: &[String]) -> Result<String, String> {
    let c = load(overrides)?;
    let derived = config::validate(&c, DEVICES, 1).map_err(|e| e.to_string())?;
    let ids: Vec<i64> = (0..DEVICES as i64).collect();
    let mesh = derived.mesh.step_mesh(&[ids]).map_err(|e| e.to_string())?;
    let step = TrainStep::new(&c, &derived, mesh).map_err(|e| e.to_string())?;
    let train = step.train_step().map_err(|e| e.to_string())?;
    let init = step.init(&Default::default()).map_err(|e| e.to_string())?;
    Ok(format!("{}\n{}", to_stablehlo(&train), to_stablehlo(&init)))
}

/// The derived settings of `overrides` on [`DEVICES`] devices in `slices` slices.
fn derived(overrides: &[String], slices: usize) -> Result<String, String> {
    let c = load(overrides)?;
    config::validate(&c, DEVICES, slices).map(|d| format!("{d:?}")).map_err(|e| e.to_string())
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push((path.display().to_string(), std::fs::read_to_string(&path).unwrap()));
        }
    }
}

#[test]
fn every_key_of_base_yml_does_something_or_is_refused() {
    let table: BTreeMap<&str, &Effect> = KEYS.iter().map(|(k, e)| (*k, e)).collect();
    let keys = base_keys();
    let unclassified: Vec<&String> = keys.iter().filter(|k| !table.contains_key(k.as_str())).collect();
    assert!(unclassified.is_empty(), "keys of configs/base.yml without a row in this test's KEYS: {unclassified:?}");
    let stale: Vec<&&str> = table.keys().filter(|k| !keys.iter().any(|b| b == *k)).collect();
    assert!(stale.is_empty(), "KEYS rows for keys that are not in configs/base.yml: {stale:?}");

    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    let outside_config: Vec<&(String, String)> =
        files.iter().filter(|(path, _)| !path.contains("/src/config/")).collect();
    let baseline = programs(&[]).expect("the default config traces");
    let default_config = load(&[]).unwrap();
    let mut failures = Vec::new();
    for (key, effect) in KEYS {
        let set = |value: &str| vec![format!("{key}={value}")];
        let failure = match effect {
            Program(value) => match programs(&set(value)) {
                Ok(text) if text != baseline => None,
                Ok(_) => Some(format!("{key}={value} leaves the train step and init program unchanged")),
                Err(e) => Some(format!("{key}={value} should trace: {e}")),
            },
            ProgramVs(value, other, with) => {
                let with: Vec<String> = with.iter().map(|s| s.to_string()).collect();
                let both = programs(&[&with[..], &set(value)].concat())
                    .and_then(|a| programs(&[&with[..], &set(other)].concat()).map(|b| (a, b)));
                match both {
                    Ok((a, b)) if a != b => None,
                    Ok(_) => Some(format!("{key}={value} and {key}={other} (with {with:?}) give the same programs")),
                    Err(e) => Some(format!("{key}={value} / {other} with {with:?} should trace: {e}")),
                }
            }
            Derives(value, other, with, slices) => {
                let with: Vec<String> = with.iter().map(|s| s.to_string()).collect();
                let both = derived(&[&with[..], &set(value)].concat(), *slices)
                    .and_then(|a| derived(&[&with[..], &set(other)].concat(), *slices).map(|b| (a, b)));
                match both {
                    Ok((a, b)) if a != b => None,
                    Ok(_) => Some(format!("{key}={value} and {key}={other} (with {with:?}) derive the same settings")),
                    Err(e) => Some(format!("{key}={value} / {other} with {with:?} should validate: {e}")),
                }
            }
            Allows(overrides) => {
                let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
                match (load(&overrides), load(&[&set("true")[..], &overrides].concat())) {
                    (Err(_), Ok(_)) => None,
                    (without, with) => Some(format!(
                        "{key}: {overrides:?} should be refused without it and accepted with it; got {:?} / {:?}",
                        without.err(),
                        with.err()
                    )),
                }
            }
            Resolves(value) => match load(&set(value)) {
                Ok(c) => {
                    let (mut got, mut default) =
                        (serde_json::to_value(&c).unwrap(), serde_json::to_value(&default_config).unwrap());
                    got.as_object_mut().unwrap().remove(*key);
                    default.as_object_mut().unwrap().remove(*key);
                    (got == default).then(|| format!("{key}={value} changes no other key"))
                }
                Err(e) => Some(format!("{key}={value} should load: {e}")),
            },
            Refused(value) => {
                // Refused by the config's checks, or by the model's (a key no family reads).
                let result = load(&set(value)).and_then(|c| {
                    config::validate(&c, DEVICES, 1).map_err(|e| e.to_string())?;
                    maxrs::model::Model::from_config(&c).map(|_| ()).map_err(|e| e.to_string())
                });
                match result {
                    Err(e) if e.contains(key) => None,
                    Err(e) => Some(format!("{key}={value} is refused, but the error does not name the key: {e}")),
                    Ok(()) => Some(format!("{key}={value} is accepted; the table says it is refused")),
                }
            }
            KernelChoice(why) => {
                let both = load(&set("true")).and_then(|_| load(&set("false")));
                both.err().map(|e| format!("{key} ({why}): both values should load: {e}"))
            }
            Runtime(why) => {
                let field = format!(".{}", config::registry::key(key).map_or(&key[..], |k| k.field));
                let read = outside_config.iter().any(|(_, text)| {
                    text.match_indices(&field).any(|(i, _)| {
                        let next = text[i + field.len()..].chars().next();
                        !next.is_some_and(|ch| ch.is_alphanumeric() || ch == '_')
                    })
                });
                (!read).then(|| format!("{key} ({why}): no code outside src/config reads the field"))
            }
        };
        failures.extend(failure);
    }
    assert!(failures.is_empty(), "{} keys fail:\n{}", failures.len(), failures.join("\n"));
}
