//! Ahead-of-time compilation for hardware this machine does not have: the catalog of targets
//! (`topology`), the GPU descriptions read from the CUDA plugin (`target_config`), compiling
//! for a target (`compile`), the per-device memory check (`memory`), the file that carries
//! a compiled train step to its target (`artifact`), and `maxrs train-compile` (`train_compile`).

pub mod artifact;
pub mod compile;
pub mod memory;
pub mod target_config;
pub mod topology;
pub mod train_compile;

pub use compile::CompileTarget;
pub use memory::MemoryReport;
