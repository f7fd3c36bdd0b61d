//! The data position a checkpoint records: the input pipeline's [`data::DataState`] after the
//! last batch the run consumed, together with what identifies the stream (dataset, files,
//! tokenizer, seed, global batch, packing). Resuming with a different stream is refused instead
//! of silently reading other rows.

use anyhow::{anyhow, bail, Result};
use serde_json::{json, Value};

use crate::checkpoint::DataState;
use crate::config::{self, Config};
use crate::data;

/// The keys whose values make the stream; a resumed run must have the same ones.
const IDENTITY: &[&str] = &[
    "dataset_type",
    "dataset_path",
    "hf_train_files",
    "hf_path",
    "hf_name",
    "hf_data_dir",
    "train_split",
    "synthetic_progression",
    "max_segments_per_seq",
    "train_data_columns",
    "tokenizer_path",
    "add_bos",
    "add_eos",
    "packing",
    "enable_data_shuffling",
    "data_shuffle_seed",
    "max_target_length",
];

const KIND: &str = "input_pipeline";

/// The keys of [`IDENTITY`] added after checkpoints were first written: a checkpoint without
/// one was written with the key's default, which is what it matches.
const ADDED: &[&str] =
    &["hf_path", "hf_name", "hf_data_dir", "train_split", "synthetic_progression", "max_segments_per_seq"];

/// The identity of a run's stream and where it stands.
#[derive(Clone, Debug)]
pub struct DataPosition {
    identity: Value,
    /// The [`ADDED`] keys this run sets to other values than their defaults.
    changed: Vec<&'static str>,
    /// After the last delivered batch; `None` before the first.
    pub state: Option<data::DataState>,
}

impl DataPosition {
    pub fn new(c: &Config, global_batch: usize) -> Result<DataPosition> {
        let values = serde_json::to_value(c)?;
        let mut identity = serde_json::Map::new();
        for key in IDENTITY {
            identity.insert(key.to_string(), values.get(*key).cloned().unwrap_or(Value::Null));
        }
        identity.insert("global_batch".into(), json!(global_batch));
        let changed = ADDED.iter().copied().filter(|k| config::non_default_value(c, k).is_some()).collect();
        Ok(DataPosition { identity: Value::Object(identity), changed, state: None })
    }
}

impl DataState for DataPosition {
    fn save_state(&self, next_step: u64) -> Value {
        json!({ "kind": KIND, "next_step": next_step, "stream": self.identity, "state": self.state })
    }

    fn restore_state(&mut self, saved: &Value, next_step: u64) -> Result<()> {
        if saved["kind"] != KIND {
            bail!("the checkpoint's data position is of kind {}, this run's pipeline writes {KIND}", saved["kind"]);
        }
        if saved["next_step"] != json!(next_step) {
            bail!(
                "the checkpoint's data position is for step {}, the run resumes at step {next_step}",
                saved["next_step"]
            );
        }
        let keys = self.identity.as_object().expect("an object").keys();
        let differences: Vec<String> = keys
            .filter(|k| match saved["stream"].get(k.as_str()) {
                Some(value) => *value != self.identity[k.as_str()],
                None => !ADDED.contains(&k.as_str()) || self.changed.contains(&k.as_str()),
            })
            .map(|k| format!("{k}: checkpoint {}, this run {}", saved["stream"][k.as_str()], self.identity[k.as_str()]))
            .collect();
        if !differences.is_empty() {
            bail!(
                "the checkpoint's data stream differs from this run's ({}); resuming would read other rows than the \
                 checkpointed run: use the same data keys and global batch, or start a new run_name",
                differences.join("; ")
            );
        }
        self.state = serde_json::from_value(saved["state"].clone())
            .map_err(|e| anyhow!("the checkpoint's data position cannot be read: {e}"))?;
        Ok(())
    }
}
