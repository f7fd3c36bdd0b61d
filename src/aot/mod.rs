//! Ahead-of-time compilation: compiling the train step for hardware this machine does not have,
//! and the file that carries the result to the target.

pub mod artifact;
