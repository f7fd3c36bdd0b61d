//! `manifest.json`: what a checkpoint directory holds, written last, by process 0 once every
//! process has written its files (its presence commits the checkpoint on GCS). Example (two
//! processes; `params.0-of-2.safetensors` holds the blocks process 0 wrote):
//!
//! ```json
//! {
//!   "format": "maxrs-checkpoint", "version": 2, "maxrs_version": "0.1.0",
//!   "step": 199,
//!   "model": {"base_emb_dim": 256, "base_num_query_heads": 4, ..., "weight_dtype": "float32"},
//!   "data": {"kind": "input_pipeline", "next_step": 200, ...},
//!   "processes": 2,
//!   "data_per_process": [{"kind": "input_pipeline", "next_step": 200, ...}, {...}],
//!   "files": [{"name": "params.0-of-2.safetensors", "bytes": 2098248, "crc32c": "9b1c0f3e", "process": 0}, ...],
//!   "arrays": [{"name": "params.token_embedder.embedding", "dtype": "F32", "shape": [512, 256],
//!               "slices": [{"file": "params.0-of-2.safetensors", "key": "token_embedder.embedding[0:256,0:256]",
//!                           "start": [0, 0], "shape": [256, 256], "offset": 4096, "crc32c": "1f2e3d4c"}, ...]}, ...]
//! }
//! ```
//!
//! - `step`: the last completed step (0-based), MaxText's numbering: the checkpoint of step `s`
//!   holds the state after step `s`'s update, and a run resumed from it starts at step `s + 1`
//!   (maxtext `src/maxtext/common/checkpointing.py` `maybe_save_checkpoint` and
//!   `trainers/pre_train/train.py` `get_first_step`, commit e591f30). `null` in a
//!   parameters-only checkpoint made by `maxrs convert`.
//! - `model`: the configuration keys that decide the model ([`model_keys`]), to say which key
//!   differs when a checkpoint does not fit a run; with `model_name` where the name decides too
//!   (DeepSeek's routing, Gemma 3's query scale).
//! - `data`: the data pipeline's position ([`crate::checkpoint::DataState`]) on process 0; its
//!   `next_step`, when it records one, is `step + 1`. `data_per_process`: every process's, in
//!   process order, when the job had several (`processes`).
//! - `files`: every data file with its size, its CRC32C (hex) and the process that wrote it.
//! - `arrays`: every state array (the train step's input names), global dtype and shape, and
//!   its slices: which file holds which block (`start`, `shape`), under which safetensors key,
//!   at which byte `offset` of the file, with the CRC32C of its bytes. The slices of an array
//!   cover it exactly once (each distinct block of the saving mesh, replicas left out), so a
//!   restoring process reads the slices its devices need with ranged reads and checks each
//!   (`dir::read_manifest` refuses a manifest whose slices do not tile an array exactly, or that
//!   names a file outside its folder).
//!   Version 1 (one process, whole arrays) named one `file` and `key` per array instead; it is
//!   still read.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::shards::Bounds;
use crate::config::registry::{self, Role};
use crate::config::{parameter_scales, Config, RopeType};
use crate::model::config::Rope;
use crate::model::{gemma3, moe, Model};

pub const MANIFEST_FILE: &str = "manifest.json";
pub const FORMAT: &str = "maxrs-checkpoint";
pub const VERSION: u32 = 2;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FileEntry {
    pub name: String,
    pub bytes: u64,
    /// CRC32C of the whole file, 8 hex digits.
    pub crc32c: String,
    /// The process that wrote it (version 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<usize>,
}

/// Where one block of an array lies (version 2).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SliceEntry {
    pub file: String,
    /// The tensor's name inside `file`.
    pub key: String,
    pub start: Vec<i64>,
    pub shape: Vec<i64>,
    /// Where the block's bytes begin in `file`.
    pub offset: u64,
    /// CRC32C of the block's bytes, 8 hex digits.
    pub crc32c: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ArrayEntry {
    /// The train step's name (`params.…`, `opt_state.mu.…`, `opt_state.count`).
    pub name: String,
    /// safetensors dtype name (`F32`, `BF16`, `I32`, ...).
    pub dtype: String,
    pub shape: Vec<i64>,
    /// Version 1: the file holding the whole array, and its tensor's name there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slices: Vec<SliceEntry>,
}

/// A slice of an array as a reader sees it, of either version.
#[derive(Clone, Debug, PartialEq)]
pub struct Slice {
    pub file: String,
    pub key: String,
    pub bounds: Bounds,
    /// The byte offset and CRC32C of the block (version 2); version 1 files are read whole and
    /// checked by their own CRC32C.
    pub located: Option<(u64, String)>,
}

impl ArrayEntry {
    /// The array's slices (one covering it, for version 1).
    pub fn slices(&self) -> Vec<Slice> {
        match (&self.file, &self.key) {
            (Some(file), Some(key)) if self.slices.is_empty() => vec![Slice {
                file: file.clone(),
                key: key.clone(),
                bounds: self.shape.iter().map(|&d| (0, d)).collect(),
                located: None,
            }],
            _ => self
                .slices
                .iter()
                .map(|s| Slice {
                    file: s.file.clone(),
                    key: s.key.clone(),
                    bounds: s.start.iter().zip(&s.shape).map(|(&a, &n)| (a, n)).collect(),
                    located: Some((s.offset, s.crc32c.clone())),
                })
                .collect(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    pub maxrs_version: String,
    pub step: Option<u64>,
    pub model: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    pub data: Option<serde_json::Value>,
    /// The processes of the job that saved it, when several.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes: Option<usize>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub data_per_process: Vec<serde_json::Value>,
    pub files: Vec<FileEntry>,
    pub arrays: Vec<ArrayEntry>,
}

impl Manifest {
    /// Checks that this manifest belongs in the folder of step `step` (a run's
    /// `checkpoints/<step>/`): it records that step, and the data position it carries goes on at
    /// the next one. A manifest edited or copied into another step's folder would otherwise
    /// resume at its own step with the folder's state, and then stop on the data position
    /// instead of falling back to an earlier checkpoint. The reason is one line.
    pub fn check_step(&self, step: u64) -> Result<(), String> {
        match self.step {
            Some(s) if s == step => {}
            Some(s) => return Err(format!("its {MANIFEST_FILE} says step {s}, but the folder is step {step}")),
            None => return Err(format!("its {MANIFEST_FILE} has no step (a parameters-only checkpoint)")),
        }
        for data in self.data.iter().chain(&self.data_per_process) {
            match data.get("next_step") {
                Some(next) if next.as_u64() != Some(step + 1) => {
                    return Err(format!(
                        "its data position goes on at step {next}, but after step {step} the run goes on at step {}",
                        step + 1
                    ))
                }
                _ => {}
            }
        }
        Ok(())
    }
}

impl Manifest {
    /// The data position process `process` of a job of `processes` resumes from: its own when
    /// the saving job had as many processes; the one position when every saving process
    /// recorded the same (a position that is a function of the step); otherwise an error, as
    /// each process's position in its share of the data cannot be split into another count.
    pub fn data_for(&self, process: usize, processes: usize) -> Result<Option<serde_json::Value>, String> {
        let saved = self.processes.unwrap_or(1);
        if saved == processes {
            return Ok(if saved == 1 { self.data.clone() } else { self.data_per_process.get(process).cloned() });
        }
        if self.data_per_process.iter().all(|d| Some(d) == self.data.as_ref()) {
            return Ok(self.data.clone());
        }
        Err(format!(
            "its data position is that of each of the {saved} processes that saved it, which a job of {processes} \
             processes cannot continue: resume on {saved} processes, or start the data over with \
             load_full_state_path"
        ))
    }
}

/// The values of the keys that decide `model` in `config`: its `config_keys` of the model-shape
/// role. The others (activation numerics and sharding, expert capacity and dispatch) may change
/// between a checkpoint and the run restoring it.
///
/// Where the model name decides what the model computes beyond its keys ([`decided_by_name`]),
/// `model_name` is recorded too, with `override_model_config: true`: these keys then load over
/// the named model's file as they are (the arguments `maxrs convert` prints and reads back), and
/// [`model_differences`] compares two names by what they decide.
pub fn model_keys(config: &Config, model: &Model) -> BTreeMap<String, serde_json::Value> {
    let all = serde_json::to_value(config).expect("Config serializes");
    let mut keys: BTreeMap<String, serde_json::Value> = model
        .config_keys()
        .into_iter()
        .filter(|k| registry::key(k).is_some_and(|k| k.role == Role::Model))
        .map(|k| (k.to_string(), effective(config, k, &all[k])))
        .collect();
    if decided_by_name(&config.model_name, &keys).is_some() {
        keys.insert(MODEL_NAME.into(), serde_json::Value::from(config.model_name.as_str()));
        keys.insert("override_model_config".into(), serde_json::Value::from(true));
    }
    keys
}

/// What model name `name` decides of the model whose model keys are `keys`, beyond them, in
/// words, where MaxText's model code reads the name: a DeepSeek model's routing
/// ([`moe::routing_by_name`]), Gemma 3's query scale ([`gemma3::scalar_of_name`]), OLMo 3's
/// QK-norm, Gemma 4's partial RoPE. None where
/// the name decides nothing, or `keys` (an older manifest's) lack what it depends on. Read from
/// the recorded keys alone, so that a checkpoint's name and a run's compare alike.
fn decided_by_name(name: &str, keys: &BTreeMap<String, serde_json::Value>) -> Option<String> {
    let int = |k: &str| keys.get(k).and_then(serde_json::Value::as_i64);
    let flag = |k: &str| keys.get(k).and_then(serde_json::Value::as_bool);
    let block = keys.get("decoder_block")?.as_str()?;
    match block {
        "deepseek" => {
            let layers = int("base_num_decoder_layers")? << parameter_scales(int("global_parameter_scale")?).3;
            let routed = int("first_num_dense_layers")? < layers;
            moe::routing_by_name(name, routed, flag("routed_bias")?, int("n_routing_groups")? != -1)
        }
        "gemma3" => {
            let s = gemma3::scalar_of_name(name, int("base_emb_dim")?, int("base_num_query_heads")?, int("head_dim")?)?;
            Some(format!("queries scaled by {s}^-1/2"))
        }
        // `Attention.__init__` (layers/attentions.py at MaxText e591f30): `GlobalRMSNorm` for a
        // model_name starting with olmo3 (maxrs's olmo3 refuses another name).
        "olmo3" => {
            Some(format!("a QK-norm over {}", if name.starts_with("olmo3") { "all heads" } else { "each head" }))
        }
        // `Attention.init_rotary_embedding` (layers/attentions.py at MaxText e591f30): Gemma 4's
        // partial RoPE for a model_name starting with gemma4 (maxrs's gemma4 refuses another);
        // gemma4_small's local and global layers in periods of 5 under gemma4-e2b, else of 6
        // (`get_attention_pattern`, models/gemma4_small.py at MaxText e591f30).
        "gemma4" | "gemma4_small" => {
            let proportion = |k: &str| keys.get(k).and_then(serde_json::Value::as_f64);
            let partial = proportion("global_rope_proportion")? < 1.0 || proportion("local_rope_proportion")? < 1.0;
            let layout = if name.starts_with("gemma4") { "Gemma 4's" } else { "PartialRotaryEmbedding's" };
            let rope = partial.then(|| format!("partial RoPE in {layout} layout"));
            match block {
                "gemma4" => rope,
                _ => Some(format!(
                    "local and global layers in periods of {}{}",
                    crate::model::gemma4_small::period(name),
                    rope.map(|r| format!(", {r}")).unwrap_or_default()
                )),
            }
        }
        _ => None,
    }
}

const MODEL_NAME: &str = "model_name";

/// The value of model key `key` as the run computes it, where the model name decides too: a
/// `llama3.1-*` model computes Llama 3.1's RoPE whatever `rope_type` says (`Rope::from_config`,
/// as MaxText), so it records `llama3.1`, as a converted Llama 3.1 checkpoint does.
fn effective(config: &Config, key: &str, value: &serde_json::Value) -> serde_json::Value {
    match key {
        "rope_type" if matches!(Rope::from_config(config), Rope::Llama31 { .. }) => {
            serde_json::Value::from(RopeType::Llama31.as_str())
        }
        _ => value.clone(),
    }
}

/// `key: checkpoint A, this run B` for each model key whose values differ (keys one side lacks
/// are left out: older or converted checkpoints may record fewer). Two model names differ when
/// they decide different computations ([`decided_by_name`]).
pub fn model_differences(
    saved: &BTreeMap<String, serde_json::Value>,
    current: &BTreeMap<String, serde_json::Value>,
) -> Vec<String> {
    let decided = |keys: &BTreeMap<String, serde_json::Value>, name: &serde_json::Value| {
        name.as_str().and_then(|name| decided_by_name(name, keys))
    };
    saved
        .iter()
        .filter_map(|(key, value)| match current.get(key) {
            Some(now) if key == MODEL_NAME => {
                let (then, here) = (decided(saved, value), decided(current, now));
                (then != here).then(|| {
                    let says = |d: Option<String>| d.unwrap_or_else(|| "nothing".into());
                    format!(
                        "{key}: checkpoint {value}, this run {now}; the checkpoint's name gives {}, this run's {}",
                        says(then),
                        says(here)
                    )
                })
            }
            Some(now) if !same_value(now, value) => Some(format!("{key}: checkpoint {value}, this run {now}")),
            _ => None,
        })
        .collect()
}

/// Numbers compare by value (YAML may give `10000` where JSON gave `10000.0`).
fn same_value(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

pub fn crc_hex(crc: u32) -> String {
    format!("{crc:08x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The model keys a run of `args` records.
    fn keys(args: &[&str]) -> BTreeMap<String, serde_json::Value> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let c = crate::config::load(None, &args).unwrap();
        model_keys(&c, &Model::from_config(&c).unwrap())
    }

    /// The issue's case: a Llama 3.1 checkpoint converted from Hugging Face records
    /// `rope_type: llama3.1`; `model_name=llama3.1-8b` leaves `rope_type` at its default but
    /// computes Llama 3.1's RoPE (attentions.py `init_rotary_embedding` at MaxText e591f30), so
    /// the two fit. A model named otherwise with the default RoPE does not.
    #[test]
    fn a_llama31_model_name_records_the_rope_it_computes() {
        let named = keys(&["model_name=llama3.1-8b"]);
        assert_eq!(named["rope_type"], "llama3.1");
        let mut converted = named.clone();
        converted.insert("rope_type".into(), serde_json::json!("llama3.1"));
        assert!(model_differences(&converted, &named).is_empty());
        let llama3 = keys(&["model_name=llama3-8b"]);
        assert_eq!(llama3["rope_type"], "default");
        assert_eq!(model_differences(&converted, &llama3).iter().filter(|d| d.starts_with("rope_type")).count(), 1);
    }

    /// A DeepSeek model with a routing bias records its model name, which decides its routing
    /// (`get_topk`, `layers/moe.py` at MaxText e591f30): two deepseek3 names fit, a name routing
    /// the other way (MaxText's kimi-k2-1t) is a difference naming model_name and the prefixes.
    #[test]
    fn a_deepseek_model_name_is_compared_by_the_routing_it_decides() {
        let name_differences = |a: &BTreeMap<_, _>, b: &BTreeMap<_, _>| {
            model_differences(a, b).into_iter().filter(|d| d.starts_with("model_name")).collect::<Vec<_>>()
        };
        let test = keys(&["model_name=deepseek3-test"]);
        assert_eq!((&test["model_name"], &test["override_model_config"]), (&"deepseek3-test".into(), &true.into()));
        assert!(name_differences(&test, &keys(&["model_name=deepseek3-671b"])).is_empty());
        let kimi = name_differences(&test, &keys(&["model_name=kimi-k2-1t"]));
        assert_eq!(
            kimi,
            ["model_name: checkpoint \"deepseek3-test\", this run \"kimi-k2-1t\"; the checkpoint's name gives \
              DeepSeek-V3's routing, the experts weighed by their unbiased scores (a name starting with deepseek3 or \
              deepseek4), this run's the experts weighed by their biased scores (a name not starting with deepseek3 or \
              deepseek4)"]
        );
        // Without a bias or groups both routings compute the same: the name is not recorded.
        let unbiased = keys(&["model_name=kimi-k2-1t", "override_model_config=true", "routed_bias=false"]);
        assert!(!unbiased.contains_key("model_name"));
        assert!(!keys(&[]).contains_key("model_name"));
    }

    /// Gemma 3 records its model name, which decides its query scale (`get_query_pre_attn_scalar`,
    /// `src/maxtext/models/gemma3.py:52-59` at MaxText e591f30): gemma3-27b's
    /// `(5376 // 32)^-1/2 = 168^-1/2` against gemma3-4b's `head_dim^-1/2 = 128^-1/2` on the same
    /// keys is a difference naming model_name; gemma3-4b and gemma3-12b (both `head_dim`) fit, as
    /// do gemma3-27b and gemma3-4b where `base_emb_dim // base_num_query_heads` is `head_dim`.
    #[test]
    fn a_gemma3_model_name_is_compared_by_the_query_scale_it_decides() {
        let keys = |name: &str, extra: &[&str]| {
            keys(&[&[name, "override_model_config=true"][..], &GEMMA3_27B_SIZES[..], extra].concat())
        };
        let big = keys("model_name=gemma3-27b", &[]);
        assert_eq!((&big["model_name"], &big["override_model_config"]), (&"gemma3-27b".into(), &true.into()));
        assert_eq!(
            model_differences(&big, &keys("model_name=gemma3-4b", &[])),
            ["model_name: checkpoint \"gemma3-27b\", this run \"gemma3-4b\"; the checkpoint's name gives queries \
              scaled by 168^-1/2, this run's queries scaled by 128^-1/2"]
        );
        assert!(model_differences(&keys("model_name=gemma3-4b", &[]), &keys("model_name=gemma3-12b", &[])).is_empty());
        let even = ["head_dim=168"];
        assert!(
            model_differences(&keys("model_name=gemma3-27b", &even), &keys("model_name=gemma3-4b", &even)).is_empty()
        );
    }

    /// gemma3-27b's sizes (`models/gemma3-27b.yml`) with 6 layers and a small vocabulary.
    const GEMMA3_27B_SIZES: [&str; 7] = [
        "base_num_decoder_layers=6",
        "base_emb_dim=5376",
        "base_num_query_heads=32",
        "base_num_kv_heads=16",
        "base_mlp_dim=21504",
        "head_dim=128",
        "vocab_size=256",
    ];
}
