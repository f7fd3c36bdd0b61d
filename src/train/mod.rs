//! The host side of training: what the loop needs around the compiled train step.
//!
//! - [`flops`]: peak TFLOP/s by device kind, MFU (the TFLOPs per step are the model's).
//! - [`schedule`]: MaxText's learning-rate schedule (the reference the in-graph one must match).
//! - [`metrics`]: per-step metrics, MaxText's log line, the `metrics_file` JSON-lines writer.
//! - [`data_position`]: the data position a checkpoint records (the input pipeline of
//!   `crate::data` makes the batches).
//! - [`outputs`], [`tensorboard`]: the run directory's config, metrics and TensorBoard events.
//! - [`profiler`]: MaxText's `profiler` key (an XPlane trace through the plugin, or Nsight's
//!   capture range) over the profiled steps.
//! - [`pipeline`]: pipeline parallelism: per-stage programs, schedules, and the host that drives them.

pub mod data_position;
pub mod flops;
pub mod health;
pub mod metrics;
pub mod optimizer;
pub mod outputs;
pub mod pipeline;
pub mod profiler;
pub mod run;
pub mod schedule;
pub mod step;
pub mod tensorboard;
