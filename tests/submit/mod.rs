//! `maxrs submit`: the Vertex AI REST client against a loopback server, the Slurm script run
//! under stand-in Slurm commands, the GKE JobSet checked against Kubernetes' types, and the
//! `--dry-run` outputs as snapshots. No test reaches the network or needs a GPU.

mod cluster_meet;
pub(crate) mod common;
mod errors;
mod gke;
pub(crate) mod http;
mod readme;
mod slurm;
mod vertex;
