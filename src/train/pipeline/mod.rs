//! Pipeline parallelism (`ici_pipeline_parallelism > 1`, the `stage` mesh axis) as separate
//! programs per stage (MPMD, as the JaxPP fork of MaxText runs it), driven by the host.
//!
//! The step is split at layer-group boundaries ([`layout`]): each chunk (virtual stage) has a
//! forward and a backward program compiled for its stage's devices, which keep their own
//! data / fsdp / tensor axes ([`programs`]). The host runs each stage's tasks in the order a
//! [`schedule`] gives (gpipe, 1f1b, interleaved 1f1b), one thread per stage, handing
//! activations and their gradients between stages as device buffers ([`executor`]); after the
//! last microbatch every stage updates its own parameters with the unpipelined step's AdamW,
//! clipped by the gradient norm over all stages; `state` moves the whole training state between
//! the stages and the host in the model's full layout (checkpoints); [`eval`] runs the forward
//! tasks alone over eval batches. [`run`] makes it a step executor of
//! `maxrs train`'s one loop (`train::step_loop`), and [`aot`] compiles the stage programs for a
//! target and saves them with the schedule in one file.
//!
//! The same global batch gives the same losses and parameters as the unpipelined step (up to
//! rounding: tests/pipeline.rs checks 1e-5 in f32).

pub mod aot;
pub mod eval;
pub mod executor;
pub mod layout;
pub mod programs;
pub mod relay;
pub mod run;
pub mod schedule;
mod state;

pub use executor::{Pipeline, Placement, StageExecutables, StepResult};
pub use layout::StageLayout;
pub use programs::{PipelineStep, StagePrograms};
pub use schedule::{Pass, Schedule, Task, Timeline};
