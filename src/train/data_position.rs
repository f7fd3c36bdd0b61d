//! The data position of today's loaders ([`super::data::BatchLoader`]): their batches depend
//! only on the step index (and the dataset, seed and global batch), so the position a
//! checkpoint records is the next step, together with what identifies the stream; resuming with
//! a different stream is refused instead of silently reading other rows.

use anyhow::{bail, Result};
use serde_json::{json, Value};

use crate::checkpoint::DataState;

/// What makes the step-indexed batch stream of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct StepIndexed {
    pub dataset_type: String,
    pub dataset_path: String,
    pub data_shuffle_seed: i64,
    pub global_batch: usize,
}

const KIND: &str = "step_indexed";

impl DataState for StepIndexed {
    fn save_state(&self, next_step: u64) -> Value {
        json!({
            "kind": KIND,
            "next_step": next_step,
            "dataset_type": self.dataset_type,
            "dataset_path": self.dataset_path,
            "data_shuffle_seed": self.data_shuffle_seed,
            "global_batch": self.global_batch,
        })
    }

    fn restore_state(&mut self, state: &Value, next_step: u64) -> Result<()> {
        if state["kind"] != KIND {
            bail!("the checkpoint's data position is of kind {}, this run's loader reads {KIND}", state["kind"]);
        }
        let saved = self.save_state(next_step);
        let differences: Vec<String> =
            ["next_step", "dataset_type", "dataset_path", "data_shuffle_seed", "global_batch"]
                .iter()
                .filter(|k| state[**k] != saved[**k])
                .map(|k| format!("{k}: checkpoint {}, this run {}", state[*k], saved[*k]))
                .collect();
        if !differences.is_empty() {
            bail!(
                "the checkpoint's data stream differs from this run's ({}); resuming would read other rows than the \
                 checkpointed run: use the same dataset and global batch, or start a new run_name",
                differences.join("; ")
            );
        }
        Ok(())
    }
}
