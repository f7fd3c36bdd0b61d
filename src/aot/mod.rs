//! Ahead-of-time compilation for hardware this machine does not have: the catalog of targets
//! (`topology`) and the file that carries a compiled train step to its target (`artifact`).

pub mod artifact;
pub mod topology;
