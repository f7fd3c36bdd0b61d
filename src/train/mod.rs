//! The host side of training: what the loop needs around the compiled train step.
//!
//! - [`flops`]: MaxText's TFLOPs-per-step formula, peak TFLOP/s by device kind, MFU.
//! - [`schedule`]: MaxText's learning-rate schedule (the reference the in-graph one must match).
//! - [`metrics`]: per-step metrics, MaxText's log line, the `metrics_file` JSON-lines writer.
//! - [`data`]: batches of token ids: the learnable synthetic sequence and the flat tokens file.
//! - [`params_io`]: initial parameters from, and to, safetensors files.
//! - [`pipeline`]: pipeline parallelism: per-stage programs, schedules, and the host that drives them.

pub mod data;
pub mod flops;
pub mod metrics;
pub mod optimizer;
pub mod params_io;
pub mod pipeline;
pub mod run;
pub mod schedule;
pub mod step;
