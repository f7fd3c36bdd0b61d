//! Ahead-of-time compilation for hardware maxrs does not run on: the target catalog.

pub mod topology;
