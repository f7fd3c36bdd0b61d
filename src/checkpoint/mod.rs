//! Checkpoints: a run's state saved under `base_output_directory/run_name/checkpoints/<step>/`
//! and restored from there (or from `load_full_state_path` / `load_parameters_path`), on any
//! [`crate::storage`] location (local or `gs://`).
//!
//! - [`tensor_file`]: safetensors streamed with a CRC32C of every byte.
//! - [`manifest`]: `manifest.json`, what a checkpoint holds (step, model keys, data position,
//!   files with sizes and checksums, arrays).
//! - [`shards`]: a state as the processes of a job hold it (blocks per device), which process
//!   writes each distinct block.
//! - [`dir`]: writing one checkpoint directory atomically (or one process's part of it),
//!   reading one back, whole or the blocks a process needs, with every check (the manifest's
//!   file names, its slices tiling each array, the model, sizes, checksums; `read`: the
//!   slices' ranged reads).
//! - [`job`]: a checkpoint written by every process of a job, committed by process 0 once all
//!   wrote their parts.
//! - [`manager`]: the checkpoints directory of a run: steps, restore with fallback, MaxText's
//!   save schedule, the background writer, retention, the error policy.
//! - [`drill`]: `maxrs checkpoint-check`'s synthetic sharded state, checked bit for bit.
//! - [`hf`]: Hugging Face checkpoint directories (`config.json`, sharded safetensors, index).
//! - [`orbax`]: MaxText's Orbax checkpoints (OCDBT, zarr v3, `_METADATA`), read.
//! - `folder`: the file names a checkpoint's own index gives (a manifest, a Hugging Face weight
//!   map), each checked to be a file of the checkpoint's folder.
//! - [`DataState`]: the data pipeline's position, which each checkpoint records.
//!
//! A checkpoint holds every array of the state as slices covering it (whole arrays from a job
//! of one process), so it restores onto any mesh and process count: each process reads the
//! slices its devices' blocks need and the run puts them onto its devices with its own sharding.

pub mod dir;
pub mod drill;
mod folder;
pub mod hf;
pub mod job;
pub mod manager;
pub mod manifest;
pub mod orbax;
mod read;
pub mod shards;
pub mod tensor_file;

pub use dir::{Expected, Loaded, LoadedBlocks, Part, Saved, Share, Snapshot};
pub use job::Job;
pub use manager::{CheckpointManager, Checkpoints, OnError, Policy, Writer};

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
