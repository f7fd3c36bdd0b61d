//! Checkpoints: a run's state saved under `base_output_directory/run_name/checkpoints/<step>/`
//! and restored from there (or from `load_full_state_path` / `load_parameters_path`), on any
//! [`crate::storage`] location (local or `gs://`).
//!
//! - [`tensor_file`]: safetensors streamed with a CRC32C of every byte.
//! - [`manifest`]: `manifest.json`, what a checkpoint holds (step, model keys, data position,
//!   files with sizes and checksums, arrays).
//! - [`dir`]: writing one checkpoint directory atomically, reading one back with every check.
//! - [`manager`]: the checkpoints directory of a run: steps, restore with fallback, MaxText's
//!   save schedule, the background writer, retention, the error policy.
//! - [`hf`]: Hugging Face checkpoint directories (`config.json`, sharded safetensors, index).
//! - [`DataState`]: the data pipeline's position, which each checkpoint records.
//!
//! A checkpoint holds global arrays (every shard assembled), so it restores onto any mesh:
//! the run puts each array onto its devices with its own sharding.

pub mod dir;
pub mod hf;
pub mod manager;
pub mod manifest;
pub mod tensor_file;

pub use dir::{Expected, Loaded, Saved, Snapshot};
pub use manager::{CheckpointManager, Checkpoints, OnError, Policy};

/// A data pipeline whose position a checkpoint records, so that a resumed run reads on from
/// where the checkpointed one was. Loaders implement it; the state is any JSON they choose,
/// tagged with a `kind` of their own.
pub trait DataState {
    /// The position once `next_step - 1` has been fed, for the manifest's `data` field. A
    /// `next_step` field in it, if any, is `next_step`: restoring checks it against the step of
    /// the checkpoint's folder (`Manifest::check_step`).
    fn save_state(&self, next_step: u64) -> serde_json::Value;
    /// Continues from `state` (a manifest's `data`), the run resuming at `next_step`; an error
    /// when the state does not belong to this pipeline (another dataset, batch size, ...).
    fn restore_state(&mut self, state: &serde_json::Value, next_step: u64) -> anyhow::Result<()>;
}
