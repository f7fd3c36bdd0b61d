//! Ahead-of-time compilation for hardware this machine does not have: the catalog of targets
//! (`topology`), the GPU descriptions read from the CUDA plugin (`target_config`), compiling
//! for a target (`compile`), the per-device memory check (`memory`), and `maxrs train-compile`
//! (`train_compile`, with `pipeline` for a pipelined step), which writes the compiled step in
//! `runtime::artifact`'s format.

pub mod compile;
pub mod memory;
mod pipeline;
pub mod target_config;
pub mod topology;
pub mod train_compile;

pub use compile::CompileTarget;
pub use memory::MemoryReport;
