//! Checks that the values fit together and with the devices, and computes what follows from them
//! (`Derived`: mesh, batch sizes, schedule, parameter count), printed when a run starts.

use std::fmt;

use super::error::{closest, ConfigError};
use super::keys::{Config, DatasetType, Hardware};
use super::mesh::{self, Mesh};
use super::pipeline::{self, PipelinePlan};
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
    pub max_target_length: usize,
    /// global_batch_size x max_target_length.
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
            "batch: int({} devices x per_device_batch_size {}) = {} x gradient_accumulation_steps {} = global batch {}, split {} ways over [{}]",
            self.num_devices,
            self.per_device_batch_size,
            self.micro_batch_size,
            self.gradient_accumulation_steps,
            self.global_batch_size,
            batch_shards,
            self.batch_axes.join(", ")
        )?;
        writeln!(
            f,
            "tokens per step: {} x {} = {}",
            self.global_batch_size, self.max_target_length, self.tokens_per_step
        )?;
        if let Some(pipeline) = &self.pipeline {
            writeln!(f, "{pipeline}")?;
        }
        write!(f, "steps: {} (schedule {}, warmup {})", self.steps, self.schedule_steps, self.warmup_steps)
    }
}

/// Validates `config` for `num_devices` devices in `num_slices` slices (hosts, on GPU) and derives
/// the run's shapes. Each error names the keys involved and what would be valid.
pub fn validate(config: &Config, num_devices: usize, num_slices: usize) -> Result<Derived, ConfigError> {
    check_model(config)?;
    check_training(config)?;
    check_hardware(config)?;
    check_cluster(config)?;
    rules::check(config)?;
    let mesh = mesh::build(config, num_devices, num_slices)?;

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

    let pipeline = pipeline::plan(config, &mesh, num_slices, micro, shards)?;

    let accumulation = config.gradient_accumulation_steps as usize;
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
        max_target_length: config.max_target_length as usize,
        tokens_per_step: global * config.max_target_length as usize,
        steps,
        schedule_steps,
        warmup_steps: (schedule_steps as f64 * config.warmup_steps_fraction) as usize,
    })
}

fn positive(key: &str, value: i64) -> Result<(), ConfigError> {
    if value > 0 {
        Ok(())
    } else {
        Err(ConfigError::invalid(key, format!("{key}={value}; it must be a positive integer")))
    }
}

fn in_range(key: &str, value: f64, range: &str, ok: bool) -> Result<(), ConfigError> {
    if ok {
        Ok(())
    } else {
        Err(ConfigError::invalid(key, format!("{key}={value}; it must be in {range}")))
    }
}

fn check_model(c: &Config) -> Result<(), ConfigError> {
    for (key, value) in [
        ("base_emb_dim", c.base_emb_dim),
        ("base_num_query_heads", c.base_num_query_heads),
        ("base_num_kv_heads", c.base_num_kv_heads),
        ("base_mlp_dim", c.base_mlp_dim),
        ("base_num_decoder_layers", c.base_num_decoder_layers),
        ("head_dim", c.head_dim),
        ("vocab_size", c.vocab_size),
        ("rope_max_timescale", c.rope_max_timescale),
    ] {
        positive(key, value)?;
    }
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
    in_range(
        "normalization_layer_epsilon",
        c.normalization_layer_epsilon,
        "(0, 1)",
        c.normalization_layer_epsilon > 0.0 && c.normalization_layer_epsilon < 1.0,
    )?;
    if c.mlp_activations != ["silu", "linear"] {
        return Err(ConfigError::invalid(
            "mlp_activations",
            format!("[{}]; maxrs implements the SwiGLU MLP only: [silu, linear]", c.mlp_activations.join(", ")),
        ));
    }
    if c.enable_dropout {
        return Err(ConfigError::invalid("enable_dropout", "true, but maxrs has no dropout; set enable_dropout=false"));
    }
    Ok(())
}

fn check_training(c: &Config) -> Result<(), ConfigError> {
    positive("steps", c.steps)?;
    positive("gradient_accumulation_steps", c.gradient_accumulation_steps)?;
    positive("max_target_length", c.max_target_length)?;
    positive("log_period", c.log_period)?;
    if c.learning_rate_schedule_steps != -1 {
        positive("learning_rate_schedule_steps", c.learning_rate_schedule_steps)?;
    }
    let pdbs = c.per_device_batch_size;
    in_range("per_device_batch_size", pdbs, "(0, inf)", pdbs > 0.0)?;
    in_range("learning_rate", c.learning_rate, "[0, inf)", c.learning_rate >= 0.0)?;
    // MaxText allows 1: warmup over the whole schedule, no cosine phase.
    let w = c.warmup_steps_fraction;
    in_range("warmup_steps_fraction", w, "[0, 1]", (0.0..=1.0).contains(&w))?;
    let f = c.learning_rate_final_fraction;
    in_range("learning_rate_final_fraction", f, "[0, 1]", (0.0..=1.0).contains(&f))?;
    in_range("adam_b1", c.adam_b1, "[0, 1)", (0.0..1.0).contains(&c.adam_b1))?;
    in_range("adam_b2", c.adam_b2, "[0, 1)", (0.0..1.0).contains(&c.adam_b2))?;
    for (key, value) in [
        ("adam_eps", c.adam_eps),
        ("adam_eps_root", c.adam_eps_root),
        ("adam_weight_decay", c.adam_weight_decay),
        ("gradient_clipping_threshold", c.gradient_clipping_threshold),
        ("z_loss_multiplier", c.z_loss_multiplier),
        ("peak_tflops_per_device", c.peak_tflops_per_device),
    ] {
        in_range(key, value, "[0, inf)", value >= 0.0)?;
    }
    if c.dataset_type == DatasetType::Tokens && c.dataset_path.is_empty() {
        return Err(ConfigError::invalid(
            "dataset_path",
            "empty, but dataset_type=tokens reads batches from it; name a token file",
        ));
    }
    if c.enable_checkpointing {
        return Err(ConfigError::invalid(
            "enable_checkpointing",
            "true, but maxrs does not write checkpoints yet; set enable_checkpointing=false",
        ));
    }
    Ok(())
}

fn check_hardware(c: &Config) -> Result<(), ConfigError> {
    positive("cpu_device_count", c.cpu_device_count)?;
    if !c.compile_topology.is_empty() && c.compile_topology_num_slices < 1 {
        return Err(ConfigError::invalid(
            "compile_topology_num_slices",
            format!(
                "{} with compile_topology={}; set it to the number of target slices (1 or more)",
                c.compile_topology_num_slices, c.compile_topology
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
            format!("`{plugin}` is not one of {} nor a path to a PJRT plugin .so{hint}", PLUGINS.join(", ")),
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
                "hardware={} does not run on plugin={plugin}; use plugin={} (or a plugin path)",
                c.hardware,
                fits.join(" or plugin=")
            ),
        ));
    }
    Ok(())
}

fn check_cluster(c: &Config) -> Result<(), ConfigError> {
    for (key, value) in [
        ("jax_distributed_initialization_timeout", c.jax_distributed_initialization_timeout),
        ("heartbeat_timeout_seconds", c.heartbeat_timeout_seconds),
        ("shutdown_timeout_seconds", c.shutdown_timeout_seconds),
        ("stack_trace_interval_seconds", c.stack_trace_interval_seconds),
    ] {
        positive(key, value)?;
    }
    for (key, value) in [("num_processes", c.num_processes), ("process_id", c.process_id)] {
        if value < -1 {
            return Err(ConfigError::invalid(
                key,
                format!("{key}={value}; use -1 (from the environment) or a number >= 0"),
            ));
        }
    }
    if c.stack_trace_to_cloud {
        return Err(ConfigError::invalid(
            "stack_trace_to_cloud",
            "true is not supported yet: maxrs logs stack traces to stderr; set stack_trace_to_cloud=false",
        ));
    }
    let f = c.slow_step_stack_trace_factor;
    in_range("slow_step_stack_trace_factor", f, "0 (off) or (1, inf)", f == 0.0 || f > 1.0)?;
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
