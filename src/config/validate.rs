//! Checks that the values fit together and with the devices, and computes what follows from them
//! (`Derived`: mesh, batch sizes, schedule, parameter count), printed when a run starts.

use std::fmt;

use super::choices::{
    AttentionKernel, ContextParallelStrategy, DatasetType, DecoderBlock, Hardware, ProfilerKind, SamplingStrategy,
    TokenizerType, MLP_ACTIVATIONS,
};
use super::error::{closest, escape, quote, ConfigError};
use super::keys::Config;
use super::mesh::{self, Mesh};
use super::mla;
use super::pipeline::{self, PipelinePlan};
use super::quantization;
use super::ranges;
use super::registry::{self, Role};
use super::rules;

/// The PJRT plugins maxrs can fetch by name; anything else must be a path to a plugin `.so`.
pub const PLUGINS: &[&str] = &["cpu", "cuda12", "cuda13", "tpu"];

/// What a valid config implies for a given set of devices.
#[derive(Clone, Debug, PartialEq)]
pub struct Derived {
    pub model_name: String,
    pub num_devices: usize,
    /// Slices on TPU, hosts on GPU: the DCN groups.
    pub num_slices: usize,
    pub mesh: Mesh,
    /// Mesh axes that shard the batch dimension (the first `activation_batch` rule).
    pub batch_axes: Vec<String>,
    pub per_device_batch_size: f64,
    /// Sequences per forward and backward pass: int(num_devices x per_device_batch_size).
    pub micro_batch_size: usize,
    /// The pipeline, when the `stage` axis is larger than 1.
    pub pipeline: Option<PipelinePlan>,
    pub gradient_accumulation_steps: usize,
    /// Sequences per optimizer step: micro_batch_size x gradient_accumulation_steps.
    pub global_batch_size: usize,
    /// Sequences per eval step: int(num_devices x eval_per_device_batch_size), or the micro
    /// batch when that key is 0.
    pub eval_batch_size: usize,
    pub max_target_length: usize,
    /// `use_dpo`: each example of the batch is a preference pair, two sequences (chosen and
    /// rejected) of max_target_length each.
    pub preference_pairs: bool,
    /// global_batch_size x max_target_length (x 2 with preference pairs: the tokens a step
    /// runs through the model).
    pub tokens_per_step: usize,
    pub steps: usize,
    /// Length of the learning-rate schedule (`learning_rate_schedule_steps`, -1 filled with `steps`).
    pub schedule_steps: usize,
    /// int(schedule_steps x warmup_steps_fraction), as MaxText rounds it.
    pub warmup_steps: usize,
}

impl Derived {
    /// Prints the summary `maxrs train` shows at start; the parameter count is the model's.
    pub fn print_summary(&self, num_params: u64) {
        println!("model: {} ({} parameters)", self.model_name, human(num_params));
        println!("{self}");
    }
}

impl fmt::Display for Derived {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let batch_shards: usize = self.batch_axes.iter().map(|a| self.mesh.size(a)).product();
        writeln!(f, "devices: {} in {}", self.num_devices, mesh::plural(self.num_slices, "slice"))?;
        writeln!(f, "mesh: {}", self.mesh)?;
        writeln!(
            f,
            "batch: int({} devices x per_device_batch_size {}) = {} x gradient_accumulation_steps {} = global batch {}{}, split {} ways over [{}]",
            self.num_devices,
            self.per_device_batch_size,
            self.micro_batch_size,
            self.gradient_accumulation_steps,
            self.global_batch_size,
            // Under DPO a batch row is a preference pair (its chosen and rejected sequences).
            if self.preference_pairs { " pairs" } else { "" },
            batch_shards,
            self.batch_axes.join(", ")
        )?;
        match self.preference_pairs {
            true => writeln!(
                f,
                "tokens per step: {} pairs x 2 sequences (chosen, rejected) x {} = {}",
                self.global_batch_size, self.max_target_length, self.tokens_per_step
            )?,
            false => writeln!(
                f,
                "tokens per step: {} x {} = {}",
                self.global_batch_size, self.max_target_length, self.tokens_per_step
            )?,
        }
        if let Some(pipeline) = &self.pipeline {
            writeln!(f, "{pipeline}")?;
        }
        write!(f, "steps: {} (schedule {}, warmup {})", self.steps, self.schedule_steps, self.warmup_steps)
    }
}

/// The checks that need no devices: every numeric key in its range, the model's shape, training
/// and hardware keys, the axis rules. Run before a plugin is loaded (a huge `cpu_device_count`
/// would crash it) and again by [`validate`].
pub fn check(config: &Config) -> Result<(), ConfigError> {
    ranges::check(config)?;
    check_model(config)?;
    check_moe(config)?;
    check_training(config)?;
    check_hardware(config)?;
    check_cluster(config)?;
    quantization::check(config)?;
    rules::check(config)
}

/// The configuration keys that lower a train step's memory per device, with how (the advice of
/// every out-of-memory verdict: `train-compile`'s and `maxrs train`'s).
pub const MEMORY_REMEDIES: &str = "lower per_device_batch_size or max_target_length, recompute more in the backward \
                                   pass (remat_policy=full), compute the loss's logits in tiles (num_vocab_tiling), \
                                   shard the weights over more devices \
                                   (ici_fsdp_parallelism, or dcn_fsdp_parallelism across hosts/slices instead of \
                                   dcn_data_parallelism), or keep the weights in half precision (weight_dtype=bfloat16)";

/// Checks that this machine's memory (`host_bytes`) holds what a run keeps on the host: the
/// global batch's five `int32` arrays and, when the devices are the host's own (`state_on_host`,
/// the CPU plugin), the model's `num_params` parameters with their two AdamW moments. A run that
/// does not fit would be killed (or abort) after its compile; this names the keys instead.
pub fn check_host_memory(
    c: &Config,
    d: &Derived,
    num_params: u64,
    host_bytes: u64,
    state_on_host: bool,
) -> Result<(), ConfigError> {
    let gib = |b: u128| b as f64 / (1u64 << 30) as f64;
    // A preference pair is two sequences (use_dpo).
    let sequences = if c.use_dpo { 2 } else { 1 };
    let batch = d.global_batch_size as u128 * sequences * (d.max_target_length as u128 + 1) * 5 * 4;
    if batch > host_bytes as u128 {
        return Err(ConfigError::invalid(
            "per_device_batch_size, max_target_length, gradient_accumulation_steps",
            format!(
                "the host batch of {} x {} tokens needs {:.1} GiB, more than this machine's {:.1} GiB; reduce them",
                d.global_batch_size,
                d.max_target_length,
                gib(batch),
                gib(host_bytes as u128)
            ),
        ));
    }
    let weight_bytes: u128 = match c.weight_dtype {
        super::choices::DType::Float32 => 4,
        _ => 2,
    };
    // DPO without LoRA keeps a frozen copy of the parameters as its reference model.
    let copies = 3 + u128::from(c.use_dpo && c.dpo_algo == super::choices::DpoAlgo::Dpo && !c.lora_enable_lora);
    let state = num_params as u128 * weight_bytes * copies;
    if state_on_host && batch + state > host_bytes as u128 {
        return Err(ConfigError::invalid(
            "model size (base_emb_dim, base_num_decoder_layers, vocab_size, ...)",
            format!(
                "{} parameters and their AdamW moments need {:.1} GiB on the CPU devices, more than this machine's \
                 {:.1} GiB; choose a smaller model",
                human(num_params),
                gib(state),
                gib(host_bytes as u128)
            ),
        ));
    }
    Ok(())
}

/// Validates `config` for `num_devices` devices in `num_slices` slices (hosts, on GPU) and derives
/// the run's shapes. Each error names the keys involved and what would be valid.
pub fn validate(config: &Config, num_devices: usize, num_slices: usize) -> Result<Derived, ConfigError> {
    check(config)?;
    let mesh = mesh::build(config, num_devices, num_slices)?;
    let (_, head_scale, _, _) = parameter_scales(config.global_parameter_scale);
    let heads = (config.base_num_query_heads << head_scale, config.base_num_kv_heads << head_scale);
    super::context_parallel::check(config, (mesh.size("context"), mesh.size("context_usp_ulysses")), heads)?;

    let experts = mesh.size("expert");
    if config.decoder_block.has_experts() && config.num_experts % experts as i64 != 0 {
        return Err(ConfigError::invalid(
            "num_experts",
            format!(
                "{} experts do not split over the {experts} shards of the expert mesh axis \
                 (ici_expert_parallelism x dcn_expert_parallelism); use an expert parallelism that divides {}",
                config.num_experts, config.num_experts
            ),
        ));
    }

    let micro = (num_devices as f64 * config.per_device_batch_size) as usize;
    if micro < 1 {
        return Err(ConfigError::invalid(
            "per_device_batch_size",
            format!(
                "int({num_devices} devices x per_device_batch_size {}) = 0 sequences; use at least {}",
                config.per_device_batch_size,
                1.0 / num_devices as f64
            ),
        ));
    }
    let batch_axes: Vec<String> =
        rules::first_rule(config, "activation_batch").into_iter().filter(|a| config.mesh_axes.contains(a)).collect();
    let shards: usize = batch_axes.iter().map(|a| mesh.size(a)).product();
    if !micro.is_multiple_of(shards) {
        return Err(ConfigError::invalid(
            "per_device_batch_size",
            format!(
                "the batch of int({num_devices} devices x {}) = {micro} sequences does not split over the {shards} shards of [{}] \
                 (the activation_batch rule); use a per_device_batch_size that makes it a multiple of {shards}",
                config.per_device_batch_size,
                batch_axes.join(", ")
            ),
        ));
    }

    let eval_batch = if config.eval_per_device_batch_size > 0.0 {
        let rows = (num_devices as f64 * config.eval_per_device_batch_size) as usize;
        if rows < 1 || !rows.is_multiple_of(shards) {
            return Err(ConfigError::invalid(
                "eval_per_device_batch_size",
                format!(
                    "int({num_devices} devices x {}) = {rows} sequences; an eval batch needs a positive multiple of the {shards} batch shards",
                    config.eval_per_device_batch_size
                ),
            ));
        }
        rows
    } else {
        micro
    };
    let pipeline = pipeline::plan(config, &mesh, num_slices, micro, shards)?;
    if let Some(plan) = &pipeline {
        pipeline::check_eval(config, plan, eval_batch)?;
    }

    let accumulation = config.gradient_accumulation_steps as usize;
    check_products(config, micro, accumulation)?;
    let global = micro * accumulation;
    let steps = config.steps as usize;
    let schedule_steps =
        if config.learning_rate_schedule_steps == -1 { steps } else { config.learning_rate_schedule_steps as usize };
    Ok(Derived {
        model_name: config.model_name.clone(),
        num_devices,
        num_slices,
        mesh,
        batch_axes,
        per_device_batch_size: config.per_device_batch_size,
        micro_batch_size: micro,
        pipeline,
        gradient_accumulation_steps: accumulation,
        global_batch_size: global,
        eval_batch_size: eval_batch,
        max_target_length: config.max_target_length as usize,
        preference_pairs: config.use_dpo,
        tokens_per_step: global * config.max_target_length as usize * if config.use_dpo { 2 } else { 1 },
        steps,
        schedule_steps,
        warmup_steps: (schedule_steps as f64 * config.warmup_steps_fraction) as usize,
    })
}

/// Checks the keys only `maxrs decode` reads (MaxText's `decode.py` / `inference_utils.sampling`
/// checks, main at e591f30, plus the ones that keep a sample well defined), for a model whose
/// config is otherwise valid.
pub fn validate_decode(config: &Config) -> Result<(), ConfigError> {
    quantization::check_decode(config)?;
    // MaxText's usp attention runs in train mode only (`validate_usp_runtime`,
    // src/maxtext/kernels/attention/usp_attention.py at e591f30).
    if config.context_parallel_strategy == ContextParallelStrategy::Usp {
        return Err(ConfigError::invalid(
            "context_parallel_strategy",
            "context_parallel_strategy=usp is for training (as in MaxText); decoding with it is not supported, \
             use all_gather",
        ));
    }
    let (prefill, target) = (config.max_prefill_predict_length, config.max_target_length);
    if prefill < 1 || prefill > target {
        return Err(ConfigError::invalid(
            "max_prefill_predict_length",
            format!(
                "max_prefill_predict_length={prefill}: the prompts are padded to it, and the cache has max_target_length={target} \
                 positions; set it to 1..={target}"
            ),
        ));
    }
    let strategy = config.decode_sampling_strategy;
    let (temperature, p, k) =
        (config.decode_sampling_temperature, config.decode_sampling_nucleus_p, config.decode_sampling_top_k);
    let divides = matches!(strategy, SamplingStrategy::Weighted | SamplingStrategy::Nucleus | SamplingStrategy::Topk);
    if divides && (temperature <= 0.0 || temperature.is_nan()) {
        return Err(ConfigError::invalid(
            "decode_sampling_temperature",
            format!(
                "decode_sampling_temperature={temperature}: decode_sampling_strategy={strategy} divides the logits by it, \
                 so it must be positive (decode_sampling_strategy=greedy takes the most likely token)"
            ),
        ));
    }
    if matches!(strategy, SamplingStrategy::Topk | SamplingStrategy::Composite) && !(1..=config.vocab_size).contains(&k)
    {
        return Err(ConfigError::invalid(
            "decode_sampling_top_k",
            format!(
                "decode_sampling_top_k={k}: decode_sampling_strategy={strategy} samples from that many most likely tokens; \
                 set it to 1..={} (vocab_size)",
                config.vocab_size
            ),
        ));
    }
    if strategy == SamplingStrategy::Nucleus && p < 0.0 {
        return Err(ConfigError::invalid(
            "decode_sampling_nucleus_p",
            format!(
                "decode_sampling_nucleus_p={p}: decode_sampling_strategy=nucleus keeps the most likely tokens up to that \
                 cumulative probability; set it to a value in [0, 1]"
            ),
        ));
    }
    if strategy == SamplingStrategy::Composite && !(p > 0.0 && p <= 1.0) {
        return Err(ConfigError::invalid(
            "decode_sampling_nucleus_p",
            format!("decode_sampling_nucleus_p={p}: decode_sampling_strategy=composite needs it in (0, 1]"),
        ));
    }
    Ok(())
}

/// Most `mlp_activations` entries: each adds an MLP input kernel (MaxText's `wi_<i>`), and
/// together with the output kernel they are the bulk of the parameters.
const MAX_MLP_ACTIVATIONS: usize = 8;

/// Largest number of elements maxrs lets one array have: XLA sizes arrays in 64-bit bytes, so
/// 2^60 elements of up to 8 bytes stay representable.
const MAX_ELEMENTS: u128 = 1 << 60;

/// The sizes that grow as products of keys: the global batch and tokens per step, the largest
/// activations of one micro-batch (logits: batch x sequence x vocabulary; attention scores:
/// batch x heads x sequence^2) and the largest weight (the MLP kernels of every layer and
/// expert). Each must stay within [`MAX_ELEMENTS`]; with at most [`MAX_MLP_ACTIVATIONS`] such
/// kernels the parameter count stays within a `u64`.
fn check_products(c: &Config, micro: usize, accumulation: usize) -> Result<(), ConfigError> {
    let global = micro as u128 * accumulation as u128;
    // The sizes as global_parameter_scale scales them (a range-checked power of two).
    let (emb, heads, mlp, layers) = parameter_scales(c.global_parameter_scale);
    let heads = (c.base_num_query_heads as u128) << heads;
    let mlp_kernel = ((c.base_num_decoder_layers as u128) << layers)
        * c.num_experts as u128
        * ((c.base_emb_dim as u128) << emb)
        * ((c.base_mlp_dim.max(c.base_moe_mlp_dim) as u128) << mlp);
    let (seq, vocab) = (c.max_target_length as u128, c.vocab_size as u128);
    let products: [(&str, &str, u128); 5] = [
        ("per_device_batch_size, gradient_accumulation_steps", "sequences per step (global batch)", global),
        (
            "per_device_batch_size, gradient_accumulation_steps, max_target_length",
            "tokens per step (global batch x max_target_length)",
            global * seq,
        ),
        (
            "per_device_batch_size, max_target_length, vocab_size",
            "logits of one micro-batch (batch x max_target_length x vocab_size)",
            micro as u128 * seq * vocab,
        ),
        (
            "per_device_batch_size, max_target_length, base_num_query_heads",
            "attention scores of one micro-batch (batch x heads x max_target_length^2)",
            micro as u128 * heads * seq * seq,
        ),
        (
            "base_num_decoder_layers, num_experts, base_emb_dim, base_mlp_dim, base_moe_mlp_dim",
            "MLP weights of one kernel (layers x num_experts x emb x the wider of the two MLP widths)",
            mlp_kernel,
        ),
    ];
    for (keys, what, value) in products {
        if value > MAX_ELEMENTS {
            return Err(ConfigError::invalid(
                keys,
                format!("the {what} come to {value} values, more than the 2^60 one array can hold; reduce them"),
            ));
        }
    }
    Ok(())
}

fn check_model(c: &Config) -> Result<(), ConfigError> {
    if c.base_num_query_heads % c.base_num_kv_heads != 0 {
        let divisors: Vec<String> =
            (1..=c.base_num_query_heads).filter(|d| c.base_num_query_heads % d == 0).map(|d| d.to_string()).collect();
        return Err(ConfigError::invalid(
            "base_num_query_heads, base_num_kv_heads",
            format!(
                "{} query heads cannot be grouped over {} kv heads; base_num_kv_heads must divide base_num_query_heads (one of {})",
                c.base_num_query_heads,
                c.base_num_kv_heads,
                divisors.join(", ")
            ),
        ));
    }
    if c.mlp_activations.len() > MAX_MLP_ACTIVATIONS {
        return Err(ConfigError::invalid(
            "mlp_activations",
            format!(
                "{} activations, each with its own MLP input kernel; list at most {MAX_MLP_ACTIVATIONS} (real models use \
                 1 or 2, e.g. [silu, linear] for SwiGLU)",
                c.mlp_activations.len()
            ),
        ));
    }
    let unknown = c.mlp_activations.iter().find(|a| !MLP_ACTIVATIONS.contains(&a.as_str()));
    if c.mlp_activations.is_empty() || unknown.is_some() {
        let what = unknown.map_or("no activation".to_string(), |a| format!("{} is not supported yet", quote(a)));
        return Err(ConfigError::invalid(
            "mlp_activations",
            format!(
                "[{}]: {what}; list one or more of {} (e.g. [silu, linear] for SwiGLU)",
                escape(&c.mlp_activations.join(", ")),
                MLP_ACTIVATIONS.join(", ")
            ),
        ));
    }
    check_model_variants(c)?;
    Ok(())
}

/// The powers of two `global_parameter_scale` multiplies `(emb, heads, mlp, layers)` by: with
/// `log2(scale) = 3q + r`, emb gets `q + [r > 1]`, heads and mlp `q + [r > 0]`, layers `q`
/// (MaxText's `get_individual_scales` in `src/maxtext/configs/types.py`, e591f30). `scale` is a
/// positive power of two (validation checks).
pub fn parameter_scales(scale: i64) -> (u32, u32, u32, u32) {
    let log2 = scale.max(1).ilog2();
    let (q, r) = (log2 / 3, log2 % 3);
    (q + u32::from(r > 1), q + u32::from(r > 0), q + u32::from(r > 0), q)
}

/// The keys that select model variants (sizes scaled, RoPE type, soft caps, windows, position
/// embeddings). Whether a family reads a key at all is the model's check (`Model::from_config`).
fn check_model_variants(c: &Config) -> Result<(), ConfigError> {
    // MaxText's `get_individual_scales` (src/maxtext/configs/types.py, e591f30) rejects zero and
    // non-powers of two; a negative scale fails its log2.
    let scale = c.global_parameter_scale;
    if scale < 1 || scale & (scale - 1) != 0 {
        return Err(ConfigError::invalid(
            "global_parameter_scale",
            format!("global_parameter_scale={scale}; it must be a power of two (1, 2, 4, 8, ...), or set the base_* sizes directly"),
        ));
    }
    // The scaled sizes stay within the base_* keys' ranges, so no size computed from them overflows.
    let (emb, heads, mlp, layers) = parameter_scales(scale);
    for (key, value, shift) in [
        ("base_emb_dim", c.base_emb_dim, emb),
        ("base_num_query_heads", c.base_num_query_heads, heads),
        ("base_num_kv_heads", c.base_num_kv_heads, heads),
        ("base_mlp_dim", c.base_mlp_dim, mlp),
        ("base_num_decoder_layers", c.base_num_decoder_layers, layers),
    ] {
        let range = ranges::range(key).expect("a numeric key");
        let scaled = value << shift;
        if !range.contains(scaled as f64) {
            return Err(ConfigError::invalid(
                "global_parameter_scale",
                format!("global_parameter_scale={scale} scales {key}={value} to {scaled}, beyond its range ({range}); use a smaller scale"),
            ));
        }
    }
    mla::check(c)?;
    if c.head_dim % 2 != 0 && c.decoder_block != DecoderBlock::Gpt3 {
        return Err(ConfigError::invalid(
            "head_dim",
            format!("head_dim={}; rotary embeddings rotate pairs of dimensions, so it must be even", c.head_dim),
        ));
    }
    if c.trainable_position_size > 0 && c.max_target_length > c.trainable_position_size {
        return Err(ConfigError::invalid(
            "trainable_position_size, max_target_length",
            format!(
                "max_target_length={} has positions beyond the {} learned position embeddings; use a max_target_length of at most {} or a larger trainable_position_size",
                c.max_target_length, c.trainable_position_size, c.trainable_position_size
            ),
        ));
    }
    Ok(())
}

/// The mixture-of-experts keys: experts only in the MoE blocks, top-k within the experts,
/// and token dropping only where MaxText drops (the dispatch path, `sparse_matmul=false`).
fn check_moe(c: &Config) -> Result<(), ConfigError> {
    if c.num_experts > 1 && !c.decoder_block.has_experts() {
        return Err(ConfigError::invalid(
            "num_experts",
            format!(
                "num_experts={} needs a block with experts: decoder_block=mixtral, qwen3_moe, qwen3_custom_moe or deepseek (decoder_block={} has one MLP)",
                c.num_experts, c.decoder_block
            ),
        ));
    }
    if c.num_experts_per_tok > c.num_experts {
        return Err(ConfigError::invalid(
            "num_experts_per_tok",
            format!(
                "num_experts_per_tok={} routes each token to more experts than there are (num_experts={})",
                c.num_experts_per_tok, c.num_experts
            ),
        ));
    }
    // MaxText's types.py (e591f30): a fully routed model's base_mlp_dim must equal
    // base_moe_mlp_dim; mixtral.py sizes the experts with mlp_dim, qwen3_custom.py with
    // moe_mlp_dim (the same then), gpt_oss.py with mlp_dim. (qwen3_moe takes base_moe_mlp_dim
    // instead, deepseek checks its own layers.)
    if matches!(c.decoder_block, DecoderBlock::Mixtral | DecoderBlock::Qwen3CustomMoe | DecoderBlock::GptOss)
        && c.num_experts > 1
        && c.base_moe_mlp_dim > 0
        && c.base_moe_mlp_dim != c.base_mlp_dim
    {
        return Err(ConfigError::invalid(
            "base_moe_mlp_dim",
            format!(
                "base_moe_mlp_dim={}: decoder_block={}'s experts are base_mlp_dim wide, and MaxText requires the two equal in a fully routed model; set it to base_mlp_dim={} (or leave it unset)",
                c.base_moe_mlp_dim, c.decoder_block, c.base_mlp_dim
            ),
        ));
    }
    if c.capacity_factor > 0.0 && c.sparse_matmul {
        return Err(ConfigError::invalid(
            "capacity_factor",
            format!(
                "capacity_factor={} drops tokens only with sparse_matmul=false (MaxText's sparse_matmul path is \
                 dropless and ignores it); set sparse_matmul=false, or capacity_factor=-1",
                c.capacity_factor
            ),
        ));
    }
    Ok(())
}

fn check_training(c: &Config) -> Result<(), ConfigError> {
    // MaxText's Tunix accumulation differs from its own only across microbatches (`trainers/
    // pre_train/train.py`, `input_pipeline/hf_data_processing.py` at main e591f30): with one, the
    // loss and the batch are the same, as post_train/sft.yml runs it.
    if c.use_tunix_gradient_accumulation && c.gradient_accumulation_steps > 1 {
        return Err(ConfigError::invalid(
            "use_tunix_gradient_accumulation",
            format!(
                "true with gradient_accumulation_steps={} is not supported yet (Tunix averages the microbatch means); \
                 maxrs accumulates as MaxText's own accumulation (use_tunix_gradient_accumulation=false)",
                c.gradient_accumulation_steps
            ),
        ));
    }
    if c.profiler != ProfilerKind::None && c.skip_first_n_steps_for_profiler >= c.steps {
        return Err(ConfigError::invalid(
            "skip_first_n_steps_for_profiler, steps",
            format!(
                "profiler={} would start at step {}, but the run has {} steps; lower skip_first_n_steps_for_profiler",
                c.profiler, c.skip_first_n_steps_for_profiler, c.steps
            ),
        ));
    }
    if c.profiler == ProfilerKind::Xplane && c.base_output_directory.is_empty() {
        return Err(ConfigError::invalid(
            "base_output_directory",
            "empty, but profiler=xplane writes its trace under base_output_directory/run_name/tensorboard; name a directory",
        ));
    }
    if c.dataset_type == DatasetType::Tokens && c.dataset_path.is_empty() {
        return Err(ConfigError::invalid(
            "dataset_path",
            "empty, but dataset_type=tokens reads batches from it; name a token file",
        ));
    }
    check_vocab_tiling(c)?;
    check_data(c)?;
    check_outputs(c)
}

/// `num_vocab_tiling`'s conditions: MaxText's (`configs/types.py` at e591f30: each device's
/// `per_device_batch_size x max_target_length` tokens split into the tiles; DPO refuses it,
/// `trainers/post_train/dpo/train_dpo.py`), and what maxrs's tiles need (`Model::head_loss`:
/// every `num_vocab_tiling`-th token of a row, so whole rows) or do not do yet.
fn check_vocab_tiling(c: &Config) -> Result<(), ConfigError> {
    let (tiles, seq) = (c.num_vocab_tiling, c.max_target_length);
    if tiles == 1 {
        return Ok(());
    }
    let tokens = c.per_device_batch_size * seq as f64;
    if c.per_device_batch_size > 0.0 && tokens % tiles as f64 != 0.0 {
        return Err(ConfigError::invalid(
            "num_vocab_tiling, per_device_batch_size, max_target_length",
            format!(
                "per_device_batch_size x max_target_length = {tokens} tokens do not split into \
                 num_vocab_tiling={tiles} tiles; as in MaxText, use a number of tiles that divides them"
            ),
        ));
    }
    if seq % tiles != 0 {
        return Err(ConfigError::invalid(
            "num_vocab_tiling, max_target_length",
            format!(
                "{tiles} tiles of rows of max_target_length={seq} tokens is not supported yet: maxrs's tiles take \
                 every {tiles}-th token of each row; use a num_vocab_tiling that divides max_target_length"
            ),
        ));
    }
    if c.use_dpo {
        return Err(ConfigError::invalid(
            "num_vocab_tiling, use_dpo",
            format!(
                "{tiles} with use_dpo=true: as in MaxText, vocabulary tiling is not supported with DPO; \
                 set num_vocab_tiling=1"
            ),
        ));
    }
    if c.ici_pipeline_parallelism != 1 || c.dcn_pipeline_parallelism != 1 {
        return Err(ConfigError::invalid(
            "num_vocab_tiling, ici_pipeline_parallelism, dcn_pipeline_parallelism",
            format!("{tiles} on pipeline stages (a pipeline parallelism above 1) is not supported yet"),
        ));
    }
    Ok(())
}

/// Checkpointing and run outputs: MaxText's rules plus what maxrs needs to write anything.
fn check_outputs(c: &Config) -> Result<(), ConfigError> {
    if c.enable_checkpointing && c.base_output_directory.is_empty() {
        return Err(ConfigError::invalid(
            "enable_checkpointing, base_output_directory",
            "checkpoints go to base_output_directory/run_name/checkpoints/, but base_output_directory is empty; \
             set it (a local path or gs://bucket/path) or set enable_checkpointing=false",
        ));
    }
    if c.enable_autocheckpoint && !c.enable_checkpointing {
        return Err(ConfigError::invalid(
            "enable_autocheckpoint, enable_checkpointing",
            "enable_autocheckpoint saves a checkpoint on SIGTERM, which needs enable_checkpointing=true",
        ));
    }
    if !c.load_parameters_path.is_empty() && !c.load_full_state_path.is_empty() {
        return Err(ConfigError::invalid(
            "load_parameters_path, load_full_state_path",
            "both are set; as in MaxText, give at most one (parameters only, or the full training state)",
        ));
    }
    // The path keys that may name a gs:// location must name a valid one.
    let values = serde_json::to_value(c).map_err(|e| ConfigError::invalid("config", e.to_string()))?;
    for key in registry::keys_with(Role::Path).filter(|k| k.path.is_some_and(|p| p.remote)) {
        let value = values[key.name].as_str().unwrap_or_default();
        if !value.is_empty() {
            crate::files::Location::parse(value).map_err(|e| ConfigError::invalid(key.name, e.to_string()))?;
        }
    }
    Ok(())
}

/// The data and eval keys that must agree before any file is opened (files, columns and the
/// tokenizer itself are checked by `data` when the run opens them).
fn check_data(c: &Config) -> Result<(), ConfigError> {
    if matches!(c.dataset_type, DatasetType::Tfds | DatasetType::Grain) {
        return Err(ConfigError::invalid(
            "dataset_type",
            format!(
                "{} is not supported yet: maxrs has no TFDS or Grain pipeline; use synthetic, tokens (a token file) or hf \
                 (Parquet, JSON Lines, CSV, Arrow, text, Hub datasets)",
                c.dataset_type
            ),
        ));
    }
    if c.tokenizer_type == TokenizerType::Tiktoken {
        return Err(ConfigError::invalid(
            "tokenizer_type",
            "tiktoken is not supported yet; use the model's tokenizer.json with tokenizer_type=huggingface",
        ));
    }
    let needs_text = |what: &str| -> Result<(), ConfigError> {
        if c.tokenizer_path.is_empty() {
            return Err(ConfigError::invalid(
                "tokenizer_path",
                format!("empty, but {what} tokenizes text; name a SentencePiece .model or a tokenizer.json"),
            ));
        }
        Ok(())
    };
    if c.use_sft && c.dataset_type != DatasetType::Hf {
        return Err(ConfigError::invalid(
            "use_sft",
            format!("true reads conversations with dataset_type=hf, not dataset_type={}", c.dataset_type),
        ));
    }
    check_dpo(c)?;
    if c.sft_train_on_completion_only && !c.use_sft {
        // MaxText reads it only under `if use_sft:` (maxtext src/maxtext/input_pipeline/
        // hf_data_processing.py, e591f30): without SFT it would be ignored.
        return Err(ConfigError::invalid(
            "sft_train_on_completion_only",
            "true, but use_sft=false: only SFT conversations have completions to train on (MaxText ignores it \
             without SFT); set use_sft=true or drop it",
        ));
    }
    let mixture_file = !c.grain_train_mixture_config_path.is_empty();
    if mixture_file && c.dataset_type != DatasetType::Hf {
        return Err(ConfigError::invalid(
            "grain_train_mixture_config_path, dataset_type",
            format!(
                "a mixture of text datasets is read by dataset_type=hf, not dataset_type={} (maxrs has no grain \
                 pipeline)",
                c.dataset_type
            ),
        ));
    }
    // hf_path naming a Hub dataset, or a builder with hf_data_dir, has splits of its own: no
    // hf_train_files / hf_eval_files needed (data::split_files).
    let has_splits = !c.hf_path.is_empty()
        && (!matches!(c.hf_path.as_str(), "json" | "parquet" | "csv" | "text" | "arrow") || !c.hf_data_dir.is_empty());
    if c.dataset_type == DatasetType::Hf {
        if mixture_file && !c.hf_train_files.is_empty() {
            return Err(ConfigError::invalid(
                "grain_train_mixture_config_path, hf_train_files",
                "both name the training data; give the mixture file or hf_train_files, not both",
            ));
        }
        if c.hf_train_files.is_empty() && !mixture_file && !has_splits {
            return Err(ConfigError::invalid(
                "hf_train_files",
                "empty, but dataset_type=hf reads it; give a file or glob of .parquet, .jsonl or .txt files",
            ));
        }
        needs_text("dataset_type=hf")?;
        one_column(c, "train_data_columns", &c.train_data_columns)?;
    }
    if c.eval_interval > 0 {
        if c.hf_eval_files.is_empty() && !(has_splits && c.dataset_type == DatasetType::Hf) {
            return Err(ConfigError::invalid(
                "hf_eval_files",
                format!("empty, but eval_interval={} evaluates on it; give a file or glob", c.eval_interval),
            ));
        }
        // configs/types.py at MaxText e591f30: "Please specify hf_eval_split or set eval_interval to <=0."
        if c.hf_eval_files.is_empty() && c.hf_eval_split.is_empty() {
            return Err(ConfigError::invalid(
                "hf_eval_split",
                format!(
                    "empty, but eval_interval={} evaluates hf_path={}'s split of that name",
                    c.eval_interval, c.hf_path
                ),
            ));
        }
        needs_text("eval")?;
        one_column(c, "eval_data_columns", &c.eval_data_columns)?;
    }
    Ok(())
}

/// `use_dpo`'s conditions, MaxText's (`configs/types.py` at e591f30: one of use_sft and use_dpo,
/// no packing, the prompt shorter than a row; `trainers/post_train/dpo/train_dpo.py`'s
/// `validate_config`) and what maxrs does not run with DPO yet.
fn check_dpo(c: &Config) -> Result<(), ConfigError> {
    if !c.use_dpo {
        return Ok(());
    }
    let refuse = |key: &str, why: String| Err(ConfigError::invalid(key, why));
    if c.use_sft {
        return refuse("use_sft, use_dpo", "both true: only one of use_sft or use_dpo can be true (as MaxText)".into());
    }
    if c.packing {
        return refuse("packing", "true with use_dpo=true: DPO does not support packing; set packing=false".into());
    }
    if c.dataset_type != DatasetType::Hf {
        return refuse(
            "use_dpo",
            format!("true reads preference pairs with dataset_type=hf, not dataset_type={}", c.dataset_type),
        );
    }
    if !matches!(c.train_data_columns.len(), 2 | 3) {
        return refuse(
            "train_data_columns",
            format!("{:?}: use_dpo reads [chosen, rejected] or [prompt, chosen, rejected]", c.train_data_columns),
        );
    }
    if c.eval_interval > 0 && !matches!(c.eval_data_columns.len(), 2 | 3) {
        return refuse(
            "eval_data_columns",
            format!("{:?}: use_dpo reads [chosen, rejected] or [prompt, chosen, rejected]", c.eval_data_columns),
        );
    }
    if let Some(prompt) = c.dpo_max_prompt_length.filter(|&p| p >= c.max_target_length) {
        return refuse(
            "dpo.max_prompt_length",
            format!("{prompt} must be less than max_target_length ({}): the responses need room", c.max_target_length),
        );
    }
    let unsupported = [
        (
            c.ici_pipeline_parallelism != 1 || c.dcn_pipeline_parallelism != 1,
            "ici_pipeline_parallelism, dcn_pipeline_parallelism",
            "above 1 with use_dpo=true: DPO on pipeline stages".into(),
        ),
        (
            c.quantization != crate::config::Quantization::None,
            "quantization",
            format!("{} with use_dpo=true: DPO on quantized products", c.quantization),
        ),
    ];
    match unsupported.into_iter().find(|(refused, _, _)| *refused) {
        Some((_, key, what)) => refuse(key, format!("{what} is not supported yet")),
        None => Ok(()),
    }
}

/// Pre-training's one text column (SFT's column layouts are checked when the files are opened).
fn one_column(c: &Config, key: &str, columns: &[String]) -> Result<(), ConfigError> {
    if columns.len() != 1 && !c.use_sft && !c.use_dpo {
        return Err(ConfigError::invalid(
            key,
            format!("{columns:?}: pre-training reads exactly one text column, e.g. {key}=[text]"),
        ));
    }
    Ok(())
}

fn check_hardware(c: &Config) -> Result<(), ConfigError> {
    if !c.compile_topology.is_empty() && c.compile_topology_num_slices < 1 {
        return Err(ConfigError::invalid(
            "compile_topology_num_slices",
            format!(
                "{} with compile_topology={}; set it to the number of target slices (1 or more)",
                c.compile_topology_num_slices,
                escape(&c.compile_topology)
            ),
        ));
    }
    let plugin = c.plugin.as_str();
    let is_path = plugin.contains('/') || plugin.ends_with(".so");
    if !is_path && !PLUGINS.contains(&plugin) {
        let hint =
            closest(plugin, PLUGINS.iter().copied()).map(|s| format!("; did you mean `{s}`?")).unwrap_or_default();
        return Err(ConfigError::invalid(
            "plugin",
            format!("{} is not one of {} nor a path to a PJRT plugin .so{hint}", quote(plugin), PLUGINS.join(", ")),
        ));
    }
    let fits = match c.hardware {
        Hardware::Cpu => ["cpu"].as_slice(),
        Hardware::Gpu | Hardware::GpuMultiprocess => &["cuda12", "cuda13"],
        Hardware::Tpu => &["tpu"],
    };
    if !is_path && !fits.contains(&plugin) {
        return Err(ConfigError::invalid(
            "hardware, plugin",
            format!(
                "hardware={} does not run on plugin={}; use plugin={} (or a plugin path)",
                c.hardware,
                escape(plugin),
                fits.join(" or plugin=")
            ),
        ));
    }
    // MaxText's own rule (`src/maxtext/configs/types.py` at e591f30), for the runs whose batches
    // maxrs packs: cuDNN's packed layout has a fixed number of documents a row.
    if c.hardware.is_gpu()
        && c.packed_batches()
        && c.attention == AttentionKernel::CudnnFlashTe
        && c.max_documents_per_row().is_none()
    {
        return Err(ConfigError::invalid(
            "max_segments_per_seq",
            "must be set (> 0; MaxText's GPU configs use 32) when attention=cudnn_flash_te trains on packed documents \
             (dataset_type=hf with packing=true)",
        ));
    }
    Ok(())
}

/// The cluster keys' ranges are in `ranges.rs`; what a range cannot say is here.
fn check_cluster(c: &Config) -> Result<(), ConfigError> {
    if c.stack_trace_to_cloud {
        return Err(ConfigError::invalid(
            "stack_trace_to_cloud",
            "true is not supported yet: maxrs logs stack traces to stderr; set stack_trace_to_cloud=false",
        ));
    }
    let f = c.slow_step_stack_trace_factor;
    if !(f == 0.0 || f > 1.0) {
        return Err(ConfigError::invalid(
            "slow_step_stack_trace_factor",
            format!("slow_step_stack_trace_factor={f}; it must be 0 (off) or above 1"),
        ));
    }
    Ok(())
}

fn human(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.2}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.2}M", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.1}K", n as f64 / 1e3),
        n => n.to_string(),
    }
}
