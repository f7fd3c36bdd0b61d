//! A maxrs train state written as MaxText's `CheckpointManager` writes one (`maxrs convert
//! to-maxtext`, issue 47): `<out>/<step>/items/` with MaxText e591f30's defaults
//! (`checkpoint_storage_use_ocdbt` and `checkpoint_storage_use_zarr3` true, `pure_nnx`), so that
//! MaxText resumes from it (`load_full_state_path=<out>/<step>/items`, or `<out>` copied as a
//! run's `checkpoints/` folder). What the reader in this module reads, the writer writes:
//! - `Database`: one OCDBT database (`manifest.ocdbt`, one data file `d/<id>` holding the
//!   out-of-line values and one leaf B+tree node after them), the single-file manifest and the
//!   configuration orbax-checkpoint 0.12.8 writes with (`_src/serialization/tensorstore_utils.py`,
//!   `_add_ocdbt_write_options`: values up to 1024 bytes inline, nodes up to 100 MB). Orbax's own
//!   writer puts each process's arrays in `ocdbt.process_<i>/` and merges them into the root
//!   database; one process writes here, so the root database holds the values itself.
//! - `zarr_array`: each array as TensorStore writes it for Orbax (the fixture
//!   tests/data/orbax/nnx/checkpoints/1 holds them so): one `sharding_indexed` shard of one inner
//!   chunk, `bytes` + `zstd` (level 3), its index `bytes` + `crc32c` at the end.
//! - the item's `_METADATA` (each leaf's tree path and value type), `array_metadatas/process_0`
//!   (which arrays are PRNG keys, and of which implementation: orbax `jax_array_handlers.py`
//!   rebuilds typed keys from it), the step's `_CHECKPOINT_METADATA`, and the commit files
//!   Orbax writes last on GCS (harmless locally).
//!
//! The tree (`state::maxtext_name` names each array): `params/params/...`, `opt_state/0/{mu,nu}/
//! params/...` and `opt_state/0/count` (optax `adamw`'s `scale_by_adam`), `opt_state/1` (the
//! weight decay's empty state), `opt_state/2/count` (`scale_by_schedule`), `step`, the stacked
//! layers' axis moved to MaxText's `param_scan_axis` 1, and `nnx_aux/model/...`: the NNX random
//! streams of MaxText's model tree, where the model says MaxText keeps them
//! (`model::rng_streams`: the decoder's, its dropouts', a layer's attention op's or MoE block's,
//! per family and layout, as tests/data/orbax/nnx_streams.json lists MaxText's own); a family
//! that does not say converts with `--params-only` alone. maxrs holds no such streams: they are
//! written fresh, each stream's key `jax.random.key(init_weights_seed, impl="unsafe_rbg")`
//! (whose data is `[0, seed, 0, seed]`: jax `_src/prng.py`, `_rbg_seed` doubles
//! `threefry_seed`, which is `[0, seed]` for a 32-bit seed) and its count 0. They feed dropout only, whose rate is 0 in
//! any maxrs run, so MaxText's steps from the checkpoint are what maxrs's own would be.
//!
//! With `--params-only` the item holds `params/params/...` alone, at step 0, as MaxText's
//! `generate_param_only_checkpoint` leaves it for `load_parameters_path`.

use std::collections::BTreeMap;
use std::io::Write;

use anyhow::{anyhow, bail, ensure, Context, Result};
use serde_json::{json, Value as Json};

use super::{params, state, COMMIT_FILE, ITEM, METADATA_FILE, STEP_METADATA_FILE};
use crate::checkpoint::dir::{self, Expected};
use crate::checkpoint::manifest::{Manifest, MANIFEST_FILE};
use crate::config;
use crate::files::Location;
use crate::host::{DType, HostTensor};
use crate::model::Model;
use crate::storage::{self, ObjectWriter, StagedDir};
use crate::train_state::Group;

use super::ocdbt::{BTREE_MAGIC, MANIFEST_FILE as OCDBT_MANIFEST, MANIFEST_MAGIC};
use super::zarr::data_type_name;

/// orbax-checkpoint 0.12.8's OCDBT configuration (`tensorstore_utils.py`, see the module header).
const MAX_INLINE_VALUE_BYTES: u64 = 1024;
const MAX_DECODED_NODE_BYTES: u64 = 100_000_000;
/// TensorStore's default version tree arity (`tensorstore/kvstore/ocdbt/config.h`: 16).
const VERSION_TREE_ARITY_LOG2: u8 = 4;
/// The zstd level TensorStore's zarr3 driver writes Orbax's chunks with (the fixture's zarr.json).
const ZSTD_LEVEL: i32 = 3;
/// The handler `CheckpointManager` records for MaxText's item (the fixture's `_CHECKPOINT_METADATA`).
const PYTREE_HANDLER: &str = "orbax.checkpoint._src.handlers.pytree_checkpoint_handler.PyTreeCheckpointHandler";
/// The PRNG implementation of MaxText's keys (`trainers/pre_train/train.py` at MaxText e591f30
/// sets `jax_default_prng_impl`).
const KEY_IMPL: &str = "unsafe_rbg";

/// What `to_maxtext` wrote.
pub struct Written {
    /// The step folder (`<out>/<step>`).
    pub step_dir: Location,
    /// MaxText's `step` of a train state: the updates applied, the step MaxText runs next.
    pub next_step: Option<u64>,
    pub arrays: usize,
    pub bytes: u64,
}

/// The maxrs checkpoint `src` names: a step folder (its `manifest.json`), or a run's output
/// folder or `checkpoints/` folder (its newest committed step).
fn step_folder(src: &Location) -> Result<Location> {
    if storage::is_file(&src.join(MANIFEST_FILE))? {
        return Ok(src.clone());
    }
    let entries = storage::list_dir(src)?;
    let dir = match entries.iter().any(|e| e.name == "checkpoints" && e.is_dir) {
        true => src.join("checkpoints"),
        false => src.clone(),
    };
    // The newest step folder with a manifest (as `manager::Checkpoints` finds maxrs's steps;
    // not used here, which would make `manager` and `orbax` import each other).
    let mut steps: Vec<u64> =
        storage::list_dir(&dir)?.iter().filter(|e| e.is_dir).filter_map(|e| e.name.parse().ok()).collect();
    steps.sort_unstable();
    for step in steps.into_iter().rev() {
        let folder = dir.join(&step.to_string());
        if storage::is_file(&folder.join(MANIFEST_FILE))? {
            return Ok(folder);
        }
    }
    bail!("{src}: not a maxrs checkpoint (no {MANIFEST_FILE}), nor a run or checkpoints folder holding one")
}

/// Converts the maxrs train state at `src` (a step folder, or a run's folder: its newest step)
/// into a MaxText checkpoint folder at `dst` (a new folder): `dst/<step>/items/`. With
/// `params_only`, its parameters alone (of any maxrs checkpoint, a parameters-only one too) as
/// `generate_param_only_checkpoint` leaves them for `load_parameters_path`: `dst/0/items/` with
/// `params/params/...` (what `load_params_from_path` in `src/maxtext/common/checkpointing.py` at
/// MaxText e591f30 restores), in the checkpoint's own dtype (MaxText casts them as it restores).
pub fn to_maxtext(src: &Location, dst: &Location, params_only: bool) -> Result<Written> {
    let src = step_folder(src)?;
    let manifest = dir::read_manifest(&src)?;
    let derived: Vec<String> = manifest.model.iter().map(|(k, v)| format!("{k}={}", plain(v))).collect();
    let c = config::load_over(None, &derived, &[]).with_context(|| format!("{src}: the model its manifest records"))?;
    let model = Model::from_config(&c)?;
    // MaxText's NNX random streams, where the model says which modules hold them.
    let streams = match params_only {
        true => vec![],
        false => nnx_aux(&model, c.init_weights_seed as u32).ok_or_else(|| {
            anyhow!(
                "{src}: convert to-maxtext of a decoder_block={} scan_layers={} train state is not supported yet \
                 (where MaxText's model keeps its NNX random streams is not known to maxrs); --params-only writes \
                 its parameters",
                c.decoder_block,
                c.scan_layers
            )
        })?,
    };
    ensure!(
        model.config.lora.is_none(),
        "{src}: a LoRA run's state: convert to-maxtext of LoRA adapters is not supported yet (convert to-hf \
         --merge-lora gives the merged model)"
    );
    let stored = params::stored(&model);
    let mut expected = expected_arrays(&src, &manifest)?;
    if params_only {
        expected.retain(|e| matches!(Group::of(&e.name), Some((Group::Params, _))));
    }
    if let Some(fp8) = expected.iter().find(|e| matches!(Group::of(&e.name), Some((Group::Fp8, _)))) {
        bail!("{src}: {} is quantization=fp8 state: convert to-maxtext of it is not supported yet", fp8.name);
    }
    // Parameters alone are read from a full state as `load_parameters_path` reads them.
    let loaded = dir::load(&src, &expected, &manifest.model, params_only)?;
    let mut leaves: Vec<(Vec<String>, HostTensor, bool)> = Vec::new();
    for (name, tensor) in loaded.arrays {
        let path = state::maxtext_name(&name)?;
        let key = Group::of(&name).map_or("", |(_, key)| key);
        let stacked = stored.get(key).is_some_and(|s| s.stacked);
        // Swapping the first two axes is its own inverse: maxrs's [layers, a, ...] -> [a, layers, ...].
        leaves.push((split(&path), params::to_maxrs(stacked, tensor), false));
    }

    let (folder, next_step) = match params_only {
        true => (0, None),
        false => {
            let count = leaves.iter().find(|(path, ..)| path.join("/") == "opt_state/0/count").map(|(_, t, _)| t);
            let count = match count {
                Some(t) if t.ty == DType::S32 && t.dims.is_empty() => {
                    i32::from_le_bytes(t.data[..].try_into().expect("4 bytes"))
                }
                _ => bail!(
                    "{src}: no s32 {} (a parameters-only checkpoint has no optimizer state: --params-only writes \
                     its parameters)",
                    Group::Count.prefix()
                ),
            };
            let folder = manifest.step.ok_or_else(|| anyhow!("{src}: its {MANIFEST_FILE} has no step"))?;
            // maxrs's folder N holds the state after step N; MaxText's `step` counts the updates.
            ensure!(
                u64::try_from(count).ok() == Some(folder + 1),
                "{src}: {} is {count} but the checkpoint is step {folder} (one update per step expected)",
                Group::Count.prefix()
            );
            let scalar = |v: i32| HostTensor::new(DType::S32, &[], v.to_le_bytes().to_vec());
            leaves.push((split("opt_state/2/count"), scalar(count), false));
            leaves.push((split("step"), scalar(count), false));
            leaves.extend(streams);
            (folder, Some(count as u64))
        }
    };
    leaves.sort_by(|a, b| a.0.cmp(&b.0));

    let step_name = folder.to_string();
    let commit = format!("{step_name}/{COMMIT_FILE}");
    let (_, bytes) = StagedDir::write_whole(dst, &commit, |out| {
        let step_dir = out.join(&step_name);
        let items = step_dir.join(ITEM);
        let bytes = write_item(&items, &leaves, !params_only)?;
        storage::write(&items.join(COMMIT_FILE), format!("Checkpoint commit was successful to {items}").as_bytes())?;
        let now = now_nsecs();
        // MaxText's trainer records `scan_layers`; `generate_param_only_checkpoint` nothing.
        let custom = match params_only {
            true => json!({}),
            false => json!({"scan_layers": c.scan_layers}),
        };
        let step_metadata = json!({
            "item_handlers": {ITEM: PYTREE_HANDLER},
            "metrics": {},
            "performance_metrics": {},
            "init_timestamp_nsecs": now,
            "commit_timestamp_nsecs": now,
            "custom_metadata": custom,
        });
        storage::write(&step_dir.join(STEP_METADATA_FILE), step_metadata.to_string().as_bytes())?;
        storage::write(&out.join(&commit), format!("Checkpoint commit was successful to {step_dir}").as_bytes())?;
        Ok(bytes)
    })?;
    Ok(Written { step_dir: dst.join(&step_name), next_step, arrays: leaves.len(), bytes })
}

/// Every array the checkpoint's manifest lists, as it lists it (a train state's).
fn expected_arrays(src: &Location, manifest: &Manifest) -> Result<Vec<Expected>> {
    manifest
        .arrays
        .iter()
        .map(|a| {
            let ty = crate::checkpoint::tensor_file::element_type(&a.dtype)
                .ok_or_else(|| anyhow!("{src}: array {} of dtype {}", a.name, a.dtype))?;
            Ok(Expected { name: a.name.clone(), ty, dims: a.shape.clone() })
        })
        .collect()
}

/// A config value as `key=value` text takes it.
fn plain(v: &Json) -> String {
    match v {
        Json::String(s) => s.clone(),
        Json::Array(items) => format!("[{}]", items.iter().map(plain).collect::<Vec<_>>().join(", ")),
        other => other.to_string(),
    }
}

fn split(path: &str) -> Vec<String> {
    path.split('/').map(str::to_string).collect()
}

/// The `nnx_aux/model/...` leaves of `model`'s MaxText train state (see the module header): for
/// each `Rngs` of its model tree (`Model::rng_modules`), its `aqt`, `dropout` and `params`
/// streams, each a key and a count, stacked over a scanned stack's layers. The `bool` marks a
/// PRNG key. `None` where the model's family does not say where MaxText keeps them.
pub fn nnx_aux(model: &Model, seed: u32) -> Option<Vec<(Vec<String>, HostTensor, bool)>> {
    let key_data: Vec<u8> = [0, seed, 0, seed].iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut out = Vec::new();
    for module in model.rng_modules()? {
        let copies = module.layers.unwrap_or(1) as usize;
        let lead: Vec<i64> = module.layers.into_iter().collect();
        for stream in ["aqt", "dropout", "params"] {
            let path = |leaf: &str| {
                let head = ["nnx_aux", "model"].map(str::to_string);
                head.into_iter().chain(module.path.iter().cloned()).chain([stream, leaf].map(str::to_string)).collect()
            };
            let count = HostTensor::new(DType::U32, &lead, vec![0; 4 * copies]);
            let key = HostTensor::new(DType::U32, &[&lead[..], &[4]].concat(), key_data.repeat(copies));
            out.push((path("count"), count, false));
            out.push((path("key"), key, true));
        }
    }
    Some(out)
}

/// Writes the item folder `items`: the arrays in one OCDBT database, `_METADATA` and
/// `array_metadatas/process_0` (with `optimizer`, the optimizer chain's empty state's entry).
/// Returns the bytes of array data written.
fn write_item(items: &Location, leaves: &[(Vec<String>, HostTensor, bool)], optimizer: bool) -> Result<u64> {
    let mut db = Database::create(items)?;
    let mut tree = serde_json::Map::new();
    let mut array_metadatas = Vec::new();
    let mut bytes = 0;
    for (path, tensor, is_key) in leaves {
        let param_name = path.join(".");
        let (metadata, chunk) = zarr_array(tensor)?;
        db.put(&format!("{param_name}/zarr.json"), metadata.as_bytes())?;
        db.put(&format!("{param_name}/{}", chunk_key(tensor.dims.len())), &chunk)?;
        bytes += tensor.data.len() as u64;
        let shape = &tensor.dims;
        tree.insert(
            tree_key(path),
            leaf_metadata(path, json!({"value_type": "jax.Array", "skip_deserialize": false, "write_shape": shape})),
        );
        let ext = if *is_key { json!({"random_key_impl": KEY_IMPL}) } else { Json::Null };
        array_metadatas.push(json!({"array_metadata": {
            "param_name": param_name, "write_shape": shape, "chunk_shape": shape, "ext_metadata": ext}}));
    }
    // optax's `add_decayed_weights` keeps no state (an empty `EmptyState` Orbax saves as None).
    if optimizer {
        let empty = split("opt_state/1");
        let none = json!({"value_type": "None", "skip_deserialize": true});
        tree.insert(tree_key(&empty), leaf_metadata(&empty, none));
    }
    db.finish()?;
    let metadata = json!({
        "tree_metadata": tree,
        "use_ocdbt": true,
        "use_zarr3": true,
        "store_array_data_equal_to_fill_value": true,
        "custom_metadata": null,
    });
    storage::write(&items.join(METADATA_FILE), metadata.to_string().as_bytes())?;
    let array_metadatas = json!({"array_metadatas": array_metadatas});
    storage::write(&items.join("array_metadatas/process_0"), array_metadatas.to_string().as_bytes())?;
    Ok(bytes)
}

/// `_METADATA`'s key of a leaf: its tree path as Python writes the tuple (`('step',)`).
fn tree_key(path: &[String]) -> String {
    let quoted: Vec<String> = path.iter().map(|p| format!("'{p}'")).collect();
    match quoted.len() {
        1 => format!("({},)", quoted[0]),
        _ => format!("({})", quoted.join(", ")),
    }
}

/// A leaf's `_METADATA` entry: each path part a dict key (2), or a sequence index (1: the
/// optimizer chain's positions under `opt_state`).
fn leaf_metadata(path: &[String], value: Json) -> Json {
    let keys: Vec<Json> = path
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let index = i == 1 && path[0] == "opt_state" && p.parse::<u64>().is_ok();
            json!({"key": p, "key_type": if index { 1 } else { 2 }})
        })
        .collect();
    json!({"key_metadata": keys, "value_metadata": value})
}

/// The chunk key of an array's one shard: `c/0/0/...`, `c` for a 0-d array.
fn chunk_key(rank: usize) -> String {
    std::iter::once("c").chain(std::iter::repeat_n("0", rank)).collect::<Vec<_>>().join("/")
}

/// An array's `zarr.json` and its one shard: the whole array one `zstd` inner chunk, the shard
/// index (offset, length) and its CRC32C after it.
pub(super) fn zarr_array(tensor: &HostTensor) -> Result<(String, Vec<u8>)> {
    let shape: Vec<u64> = tensor.dims.iter().map(|&d| d as u64).collect();
    ensure!(shape.iter().all(|&d| d > 0), "an array of shape {shape:?}: empty arrays are not written");
    let fill = if tensor.ty.is_float() { json!(0.0) } else { json!(0) };
    let metadata = json!({
        "chunk_grid": {"configuration": {"chunk_shape": shape}, "name": "regular"},
        "chunk_key_encoding": {"name": "default"},
        "codecs": [{"configuration": {
            "chunk_shape": shape,
            "codecs": [{"configuration": {"endian": "little"}, "name": "bytes"},
                       {"configuration": {"checksum": false, "level": ZSTD_LEVEL}, "name": "zstd"}],
            "index_codecs": [{"configuration": {"endian": "little"}, "name": "bytes"}, {"name": "crc32c"}]},
            "name": "sharding_indexed"}],
        "data_type": data_type_name(tensor.ty)?,
        "fill_value": fill,
        "node_type": "array",
        "shape": shape,
        "zarr_format": 3,
    });
    let mut shard = zstd::bulk::compress(&tensor.data, ZSTD_LEVEL).context("zstd")?;
    let index = [0u64.to_le_bytes(), (shard.len() as u64).to_le_bytes()].concat();
    shard.extend_from_slice(&index);
    shard.extend_from_slice(&crc32c::crc32c(&index).to_le_bytes());
    Ok((metadata.to_string(), shard))
}

fn now_nsecs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// Where a value of the database lies.
enum Stored {
    Inline(Vec<u8>),
    /// At `offset` of the data file, `length` bytes.
    Indirect {
        offset: u64,
        length: u64,
    },
}

/// An OCDBT database being written (TensorStore's `kvstore/ocdbt/index.rst`, the reader's
/// `ocdbt` module): values appended to one data file as they come, then one leaf node of every
/// key after them, then the manifest naming it as generation 1.
pub(super) struct Database {
    root: Location,
    data_path: String,
    data: ObjectWriter,
    written: u64,
    entries: BTreeMap<Vec<u8>, Stored>,
}

impl Database {
    pub(super) fn create(root: &Location) -> Result<Database> {
        // TensorStore names data files by a random 128-bit id in hex.
        let data_path = format!("d/{:032x}", rand::random::<u128>());
        let data = storage::create(&root.join(&data_path))?;
        Ok(Database { root: root.clone(), data_path, data, written: 0, entries: BTreeMap::new() })
    }

    pub(super) fn put(&mut self, key: &str, value: &[u8]) -> Result<()> {
        ensure!(!self.entries.contains_key(key.as_bytes()), "the key {key:?} is written twice");
        let stored = if value.len() as u64 <= MAX_INLINE_VALUE_BYTES {
            Stored::Inline(value.to_vec())
        } else {
            self.data.write_all(value).with_context(|| format!("writing {}", self.root.join(&self.data_path)))?;
            let stored = Stored::Indirect { offset: self.written, length: value.len() as u64 };
            self.written += value.len() as u64;
            stored
        };
        self.entries.insert(key.as_bytes().to_vec(), stored);
        Ok(())
    }

    /// Writes the leaf node and the manifest.
    pub(super) fn finish(self) -> Result<()> {
        let node = frame(BTREE_MAGIC, &self.leaf_node())?;
        let node_offset = self.written;
        let mut data = self.data;
        data.write_all(&node).with_context(|| format!("writing {}", self.root.join(&self.data_path)))?;
        data.finish()?;
        let indirect_bytes: u64 = self
            .entries
            .values()
            .map(|v| match v {
                Stored::Indirect { length, .. } => *length,
                Stored::Inline(_) => 0,
            })
            .sum();
        let mut body = Vec::new();
        body.extend_from_slice(&rand::random::<u128>().to_le_bytes()); // the database's uuid
        varint(&mut body, 0); // manifest kind: single
        varint(&mut body, MAX_INLINE_VALUE_BYTES);
        varint(&mut body, MAX_DECODED_NODE_BYTES);
        body.push(VERSION_TREE_ARITY_LOG2);
        varint(&mut body, 0); // no compression of new nodes
        data_file_table(&self.data_path, &mut body);
        // One inline version: generation 1, its root the leaf node.
        varint(&mut body, 1);
        varint(&mut body, 1);
        body.push(0); // root height
        varint(&mut body, 0); // data file id
        varint(&mut body, node_offset);
        varint(&mut body, node.len() as u64);
        varint(&mut body, self.entries.len() as u64);
        varint(&mut body, node.len() as u64); // num_tree_bytes
        varint(&mut body, indirect_bytes);
        body.extend_from_slice(&now_nsecs().to_le_bytes());
        varint(&mut body, 0); // no version tree nodes
        storage::write(&self.root.join(OCDBT_MANIFEST), &frame(MANIFEST_MAGIC, &body)?)
    }

    /// A leaf node (height 0) of every key: prefix-compressed keys, value lengths and kinds, the
    /// out-of-line values' file ids and offsets, then the inline values.
    fn leaf_node(&self) -> Vec<u8> {
        let mut out = vec![0u8];
        data_file_table(&self.data_path, &mut out);
        varint(&mut out, self.entries.len() as u64);
        let keys: Vec<&Vec<u8>> = self.entries.keys().collect();
        let common: Vec<usize> =
            keys.windows(2).map(|w| w[0].iter().zip(w[1].iter()).take_while(|(a, b)| a == b).count()).collect();
        for &c in &common {
            varint(&mut out, c as u64);
        }
        let prefix = |i: usize| if i == 0 { 0 } else { common[i - 1] };
        for (i, key) in keys.iter().enumerate() {
            varint(&mut out, (key.len() - prefix(i)) as u64);
        }
        for (i, key) in keys.iter().enumerate() {
            out.extend_from_slice(&key[prefix(i)..]);
        }
        for value in self.entries.values() {
            varint(
                &mut out,
                match value {
                    Stored::Inline(bytes) => bytes.len() as u64,
                    Stored::Indirect { length, .. } => *length,
                },
            );
        }
        for value in self.entries.values() {
            varint(&mut out, matches!(value, Stored::Indirect { .. }) as u64);
        }
        let offsets: Vec<u64> = self
            .entries
            .values()
            .filter_map(|v| match v {
                Stored::Indirect { offset, .. } => Some(*offset),
                Stored::Inline(_) => None,
            })
            .collect();
        for _ in &offsets {
            varint(&mut out, 0);
        }
        for offset in offsets {
            varint(&mut out, offset);
        }
        for value in self.entries.values() {
            if let Stored::Inline(bytes) = value {
                out.extend_from_slice(bytes);
            }
        }
        out
    }
}

/// A data file table of the one data file `path` (relative to the database root), with an empty
/// base path.
fn data_file_table(path: &str, out: &mut Vec<u8>) {
    varint(out, 1);
    varint(out, path.len() as u64);
    varint(out, 0);
    out.extend_from_slice(path.as_bytes());
}

/// A manifest or node: magic, total length, version 0, uncompressed body, CRC32C.
fn frame(magic: u32, body: &[u8]) -> Result<Vec<u8>> {
    let length = 4 + 8 + 1 + 1 + body.len() as u64 + 4;
    ensure!(length <= MAX_DECODED_NODE_BYTES, "an OCDBT node of {length} bytes (at most {MAX_DECODED_NODE_BYTES})");
    let mut out = Vec::with_capacity(length as usize);
    out.extend_from_slice(&magic.to_be_bytes());
    out.extend_from_slice(&length.to_le_bytes());
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(body);
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    Ok(out)
}

/// Unsigned LEB128.
fn varint(out: &mut Vec<u8>, mut value: u64) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

#[cfg(test)]
mod tests {
    use super::super::ocdbt::Ocdbt;
    use super::super::zarr::Array;
    use super::*;

    /// What the writer writes, the reader reads: inline and out-of-line values, keys sharing
    /// prefixes, a 0-d and a 2-d array through zarr.
    #[test]
    fn the_reader_reads_what_the_writer_wrote() {
        let dir = tempfile::tempdir().unwrap();
        let root = Location::Local(dir.path().to_path_buf());
        let big: Vec<f32> = (0..600).map(|i| i as f32 * 0.5).collect();
        let arrays = [
            ("a.b", HostTensor::from_f32(&[20, 30], &big)),
            ("a", HostTensor::new(DType::S32, &[], 7i32.to_le_bytes().to_vec())),
        ];
        let mut db = Database::create(&root).unwrap();
        for (name, tensor) in &arrays {
            let (meta, chunk) = zarr_array(tensor).unwrap();
            db.put(&format!("{name}/zarr.json"), meta.as_bytes()).unwrap();
            db.put(&format!("{name}/{}", chunk_key(tensor.dims.len())), &chunk).unwrap();
        }
        db.put("x", &[9; 2000]).unwrap();
        db.finish().unwrap();
        let read = Ocdbt::open(&root).unwrap();
        let keys: Vec<&[u8]> = read.keys().collect();
        assert_eq!(keys, [&b"a.b/c/0/0"[..], b"a.b/zarr.json", b"a/c", b"a/zarr.json", b"x"]);
        assert_eq!(read.read(b"x").unwrap(), [9; 2000]);
        for (name, tensor) in &arrays {
            assert_eq!(&Array::open(&read, name).unwrap().read(&read).unwrap(), tensor, "{name}");
        }
    }

    #[test]
    fn tree_keys_are_pythons_tuples() {
        assert_eq!(tree_key(&split("step")), "('step',)");
        assert_eq!(tree_key(&split("opt_state/0/count")), "('opt_state', '0', 'count')");
        let meta = leaf_metadata(&split("opt_state/0/count"), Json::Null);
        assert_eq!(meta["key_metadata"][1], json!({"key": "0", "key_type": 1}));
        assert_eq!(meta["key_metadata"][2], json!({"key": "count", "key_type": 2}));
    }
}
