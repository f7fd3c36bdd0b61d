//! The host side of training: what the loop needs around the compiled train step.
//!
//! - [`flops`]: peak TFLOP/s by device kind, MFU (the TFLOPs per step are the model's).
//! - [`schedule`]: MaxText's learning-rate schedule (the reference the in-graph one must match).
//! - [`metrics`]: per-step metrics, MaxText's log line, the `metrics_file` JSON-lines writer.
//! - [`dpo`]: the DPO and ORPO losses and their metrics (`use_dpo`).
//! - [`data_position`]: the data position a checkpoint records (the input pipeline of
//!   `crate::data` makes the batches).
//! - [`outputs`], [`tensorboard`]: the run directory's config, metrics and TensorBoard events.
//! - [`profiler`]: MaxText's `profiler` key (an XPlane trace through the plugin, or Nsight's
//!   capture range) over the profiled steps.
//! - [`pipeline`]: pipeline parallelism: per-stage programs, schedules, and the host that drives them.
//! - [`run`]: `maxrs train`'s job: start-up, then the one step loop (`step_loop`) over a step
//!   executor (`executor`): the SPMD step (`spmd`, with its `eval`) or the pipelined one
//!   (`pipeline::run`). Around it: where the state comes from (`restore`), what each step's
//!   metrics go to (`recorder`), `signals`, `timing`, whether the host's memory holds a CPU run
//!   (`host_memory`), and the report a run returns (`report`).

pub mod data_position;
pub mod dpo;
mod eval;
mod executor;
pub mod flops;
pub mod health;
mod host_memory;
pub mod metrics;
pub mod optimizer;
pub mod outputs;
pub mod pipeline;
pub mod profiler;
mod recorder;
mod report;
mod restore;
pub mod run;
pub mod schedule;
mod signals;
mod spmd;
pub mod step;
mod step_loop;
pub mod tensorboard;
mod timing;
