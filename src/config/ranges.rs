//! The valid range of every numeric key, checked before anything is traced. Each key of
//! `Config` that holds a number has a row here (a test walks `Config` and fails on a numeric key
//! without one), so a new key gets a range when it is added; the integer keys that may also be
//! `None` have theirs in [`OPTIONAL_KEYS`].
//!
//! The bounds are sanity limits, far beyond any real model, chosen so that no size computed from
//! them (parameter counts, batch x sequence x vocabulary, mesh products) can overflow a 64-bit
//! integer; what must hold between keys (heads that group, a batch that splits) is checked in
//! `validate.rs`.

use serde_json::Value;

use super::error::ConfigError;
use super::keys::Config;

/// The values a numeric key accepts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Range {
    pub min: f64,
    /// `min` itself is excluded.
    pub min_open: bool,
    pub max: f64,
    /// `max` itself is excluded.
    pub max_open: bool,
    /// `-1` is accepted too (MaxText's "fill in" / "unset" value).
    pub minus_one: bool,
    pub integer: bool,
}

const fn int(min: i64, max: i64) -> Range {
    Range { min: min as f64, min_open: false, max: max as f64, max_open: false, minus_one: false, integer: true }
}

const fn int_or_fill(min: i64, max: i64) -> Range {
    Range { minus_one: true, ..int(min, max) }
}

const fn closed(min: f64, max: f64) -> Range {
    Range { min, min_open: false, max, max_open: false, minus_one: false, integer: false }
}

const fn open_min(min: f64, max: f64) -> Range {
    Range { min_open: true, ..closed(min, max) }
}

const fn open_max(min: f64, max: f64) -> Range {
    Range { max_open: true, ..closed(min, max) }
}

const fn open(min: f64, max: f64) -> Range {
    Range { min_open: true, max_open: true, ..closed(min, max) }
}

/// Largest model width: 2^20 (real models stay below 2^15).
const MAX_EMB: i64 = 1 << 20;
/// Largest head count, head size and layer count: 2^12.
const MAX_HEADS: i64 = 1 << 12;
/// Largest mesh axis: 2^20 devices.
const MAX_AXIS: i64 = 1 << 20;
/// Largest step count: 2^40.
const MAX_STEPS: i64 = 1 << 40;
/// Longest timeout: a year, in seconds.
const MAX_SECONDS: i64 = 365 * 24 * 3600;

/// Every numeric key and its range. Token ids are `int32`, so `vocab_size` stops at 2^31 - 1;
/// the init seed is a `u32` key (`random::key`).
pub const NUMERIC_KEYS: &[(&str, Range)] = &[
    ("log_period", int(1, MAX_STEPS)),
    ("checkpoint_period", int(1, MAX_STEPS)),
    // MaxText's profiler window: profile steps skip .. skip + profiler_steps - 1.
    ("skip_first_n_steps_for_profiler", int(0, MAX_STEPS)),
    ("profiler_steps", int(1, MAX_STEPS)),
    ("base_emb_dim", int(1, MAX_EMB)),
    ("base_num_query_heads", int(1, MAX_HEADS)),
    ("base_num_kv_heads", int(1, MAX_HEADS)),
    ("base_mlp_dim", int(1, 4 * MAX_EMB)),
    ("base_num_decoder_layers", int(1, MAX_HEADS)),
    ("head_dim", int(1, MAX_HEADS)),
    ("vocab_size", int(2, i32::MAX as i64)),
    ("normalization_layer_epsilon", open(0.0, 1.0)),
    ("rope_max_timescale", int(1, 1 << 53)),
    // A power of two (checked in validate.rs), and the scaled sizes stay within the base_* ranges.
    ("global_parameter_scale", int(1, 1 << 12)),
    // 0 (or -1, MaxText's default) disables learned position embeddings.
    ("trainable_position_size", int_or_fill(0, 1 << 24)),
    ("sliding_window_size", int(0, 1 << 24)),
    // 0 disables a soft cap.
    ("attn_logits_soft_cap", closed(0.0, 1e9)),
    ("final_logits_soft_cap", closed(0.0, 1e9)),
    ("num_experts", int(1, MAX_HEADS)),
    ("num_experts_per_tok", int(1, MAX_HEADS)),
    // <= 0: no capacity limit (MaxText's default -1); above, a multiple of the even share.
    ("capacity_factor", closed(-1.0, 1e3)),
    ("load_balance_loss_weight", closed(0.0, 1e3)),
    ("init_weights_seed", int(0, u32::MAX as i64)),
    ("data_shuffle_seed", int(0, i64::MAX)),
    ("per_device_batch_size", open_min(0.0, (1 << 24) as f64)),
    ("max_target_length", int(1, 1 << 24)),
    ("steps", int(1, MAX_STEPS)),
    // Eval: -1 (or 0) turns eval off / reads the eval files to their end.
    ("eval_interval", int_or_fill(0, MAX_STEPS)),
    ("eval_steps", int_or_fill(0, MAX_STEPS)),
    ("eval_start_step", int(0, MAX_STEPS)),
    // 0: per_device_batch_size.
    ("eval_per_device_batch_size", closed(0.0, (1 << 24) as f64)),
    ("gradient_accumulation_steps", int(1, 1 << 20)),
    ("num_layers_per_pipeline_stage", int(1, MAX_HEADS)),
    ("num_pipeline_repeats", int_or_fill(1, MAX_HEADS)),
    ("pipeline_parallel_layers", int_or_fill(1, MAX_HEADS)),
    ("num_pipeline_microbatches", int_or_fill(1, 1 << 20)),
    ("learning_rate", closed(0.0, 1e3)),
    ("learning_rate_schedule_steps", int_or_fill(1, MAX_STEPS)),
    // MaxText allows 1: warmup over the whole schedule, no cosine phase.
    ("warmup_steps_fraction", closed(0.0, 1.0)),
    ("learning_rate_final_fraction", closed(0.0, 1.0)),
    // With warmup_steps_fraction it must not exceed 1 either (checked by train::schedule).
    ("wsd_decay_steps_fraction", closed(0.0, 1.0)),
    ("adam_b1", open_max(0.0, 1.0)),
    ("adam_b2", open_max(0.0, 1.0)),
    ("adam_eps", closed(0.0, 1.0)),
    ("adam_eps_root", closed(0.0, 1.0)),
    ("adam_weight_decay", closed(0.0, 1e3)),
    ("gradient_clipping_threshold", closed(0.0, 1e9)),
    ("z_loss_multiplier", closed(0.0, 1e3)),
    // Decoding; what each sampling strategy needs of them is checked in validate_decode.
    ("max_prefill_predict_length", int(1, 1 << 24)),
    ("decode_sampling_nucleus_p", closed(-1.0, 1.0)),
    ("decode_sampling_top_k", int(0, i32::MAX as i64)),
    ("decode_sampling_temperature", closed(0.0, 1e6)),
    // A u32 PRNG key, like init_weights_seed.
    ("decode_seed", int(0, u32::MAX as i64)),
    ("compile_topology_num_slices", int_or_fill(1, 1 << 12)),
    // Start-up time of the CPU plugin grows with the square of this (1024: ~3 s, 4096: ~12 s).
    ("cpu_device_count", int(1, 1024)),
    ("peak_tflops_per_device", closed(0.0, 1e6)),
    // Cluster: -1 takes the value from the launcher's environment.
    ("num_processes", int_or_fill(0, MAX_AXIS)),
    ("process_id", int_or_fill(0, MAX_AXIS)),
    ("jax_distributed_initialization_timeout", int(1, MAX_SECONDS)),
    ("heartbeat_timeout_seconds", int(1, MAX_SECONDS)),
    ("shutdown_timeout_seconds", int(1, MAX_SECONDS)),
    ("stack_trace_interval_seconds", int(1, MAX_SECONDS)),
    // 0 (off) or above 1; the gap is checked in validate.rs.
    ("slow_step_stack_trace_factor", closed(0.0, 1e6)),
    ("dcn_data_parallelism", int_or_fill(1, MAX_AXIS)),
    ("dcn_pipeline_parallelism", int_or_fill(1, MAX_AXIS)),
    ("dcn_fsdp_parallelism", int_or_fill(1, MAX_AXIS)),
    ("dcn_fsdp_transpose_parallelism", int_or_fill(1, MAX_AXIS)),
    ("dcn_context_parallelism", int_or_fill(1, MAX_AXIS)),
    ("dcn_tensor_parallelism", int_or_fill(1, MAX_AXIS)),
    ("dcn_tensor_sequence_parallelism", int_or_fill(1, MAX_AXIS)),
    ("dcn_expert_parallelism", int_or_fill(1, MAX_AXIS)),
    ("dcn_autoregressive_parallelism", int_or_fill(1, MAX_AXIS)),
    ("ici_data_parallelism", int_or_fill(1, MAX_AXIS)),
    ("ici_pipeline_parallelism", int_or_fill(1, MAX_AXIS)),
    ("ici_fsdp_parallelism", int_or_fill(1, MAX_AXIS)),
    ("ici_fsdp_transpose_parallelism", int_or_fill(1, MAX_AXIS)),
    ("ici_context_parallelism", int_or_fill(1, MAX_AXIS)),
    ("ici_tensor_parallelism", int_or_fill(1, MAX_AXIS)),
    ("ici_tensor_sequence_parallelism", int_or_fill(1, MAX_AXIS)),
    ("ici_expert_parallelism", int_or_fill(1, MAX_AXIS)),
    ("ici_autoregressive_parallelism", int_or_fill(1, MAX_AXIS)),
];

/// The integer keys that may also be `None` (MaxText's spelling; `null` in YAML), which is
/// always accepted, and the range of their numbers.
pub const OPTIONAL_KEYS: &[(&str, Range)] = &[
    // None keeps every checkpoint; there is at most one per step.
    ("max_num_checkpoints_to_keep", int(1, MAX_STEPS)),
];

impl Range {
    pub fn contains(&self, x: f64) -> bool {
        if self.minus_one && x == -1.0 {
            return true;
        }
        let above = if self.min_open { x > self.min } else { x >= self.min };
        let below = if self.max_open { x < self.max } else { x <= self.max };
        x.is_finite() && above && below && (!self.integer || x.fract() == 0.0)
    }
}

impl std::fmt::Display for Range {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bound = |x: f64| if self.integer { format!("{}", x as i64) } else { format!("{x}") };
        write!(
            f,
            "{}{} in {}{}, {}{}",
            if self.minus_one { "-1 or " } else { "" },
            if self.integer { "an integer" } else { "a number" },
            if self.min_open { "(" } else { "[" },
            bound(self.min),
            bound(self.max),
            if self.max_open { ")" } else { "]" },
        )
    }
}

/// The range of numeric key `key`, if it is one.
pub fn range(key: &str) -> Option<Range> {
    NUMERIC_KEYS.iter().find(|(k, _)| *k == key).map(|(_, r)| *r)
}

/// Checks every numeric key against its range; the error names the key, its value and the range.
pub(crate) fn check(config: &Config) -> Result<(), ConfigError> {
    let values = serde_json::to_value(config).map_err(|e| ConfigError::invalid("config", e.to_string()))?;
    let optional = OPTIONAL_KEYS.iter().map(|(key, range)| (key, range, ", or None"));
    for (key, range, or_none) in NUMERIC_KEYS.iter().map(|(key, range)| (key, range, "")).chain(optional) {
        let value = values.get(key).unwrap_or(&Value::Null);
        if value.is_null() && !or_none.is_empty() {
            continue;
        }
        let Some(x) = value.as_f64() else {
            return Err(ConfigError::invalid(
                *key,
                format!("{key} is not a finite number; it must be {range}{or_none}"),
            ));
        };
        if !range.contains(x) {
            return Err(ConfigError::invalid(*key, format!("{key}={value}; it must be {range}{or_none}")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_read_as_written() {
        assert_eq!(int_or_fill(1, 8).to_string(), "-1 or an integer in [1, 8]");
        assert_eq!(open_max(0.0, 1.0).to_string(), "a number in [0, 1)");
        assert!(int_or_fill(1, 8).contains(-1.0) && !int_or_fill(1, 8).contains(0.0));
        assert!(!int(1, 8).contains(2.5) && !closed(0.0, 1.0).contains(f64::NAN));
        assert!(open(0.0, 1.0).contains(1e-5) && !open(0.0, 1.0).contains(0.0) && !open(0.0, 1.0).contains(1.0));
    }
}
