//! The host side of training: what the loop needs around the compiled train step.
//!
//! - [`flops`]: MaxText's TFLOPs-per-step formula, peak TFLOP/s by device kind, MFU.
//! - [`schedule`]: MaxText's learning-rate schedule (the reference the in-graph one must match).
//! - [`metrics`]: per-step metrics, MaxText's log line, the `metrics_file` JSON-lines writer.
//! - the batches come from `crate::data` (the input pipeline).
//! - [`params_io`]: initial parameters from, and to, safetensors files.

pub mod flops;
pub mod metrics;
pub mod optimizer;
pub mod params_io;
pub mod run;
pub mod schedule;
pub mod step;
