//! MaxText's Orbax checkpoints, read: a `CheckpointManager` step (`<step>/items/`) or an item
//! folder itself, as MaxText writes them with its defaults (`checkpoint_storage_use_ocdbt` and
//! `checkpoint_storage_use_zarr3` true, the item `items`: `src/maxtext/common/checkpointing.py`
//! at MaxText e591f30, `create_orbax_checkpoint_manager`) and with either turned off.
//!
//! - [`ocdbt`]: TensorStore's OCDBT key-value store (`manifest.ocdbt`, B+tree nodes, data files);
//!   without it, each array is a folder of files in the item folder (`Arrays`).
//! - [`zarr`]: zarr v3 arrays in it (`zarr.json`, `sharding_indexed` chunks), or zarr v2 ones
//!   (`.zarray`).
//! - here: the item's `_METADATA` (orbax-checkpoint 0.12.8's PyTree metadata: each leaf's tree
//!   path as `key_metadata`, its `value_type`), which names the arrays; an array's OCDBT key is
//!   its path joined with `.` (orbax `_src/tree/utils.py`, `param_name_from_keypath`), its
//!   maxrs name the path joined with `/`: `params/params/decoder/decoder_norm/scale`.
//! - [`params`]: which of those arrays are a model's parameters, under maxrs's names.
//! - [`state`]: a whole train state (parameters, AdamW's moments and count, the step).
//! - [`write`]: the other way, a maxrs train state as MaxText's checkpoint (`maxrs convert to-maxtext`).
//!
//! Every array is read through [`crate::storage`] by ranges (local or `gs://`): the B+tree nodes,
//! each shard's index, each inner chunk, never a data file whole.
//!
//! A MaxText run's `checkpoints/` folder holds one step folder per save; which are complete
//! follows orbax-checkpoint 0.12.8's `CheckpointManager` (`_src/path/step.py`,
//! `checkpoint_steps_paths` and `_is_legacy_step_checkpoint`; `_src/path/temporary_paths.py`,
//! `is_path_finalized`): a folder named by its step number, finished when its name has no
//! `.orbax-checkpoint-tmp` (written under that name, then renamed: local disks) and, on GCS
//! (where Orbax writes in place), once `commit_success.txt` is in it. [`incomplete_steps`] names
//! the others; `checkpoint::manager` makes the complete ones candidates next to maxrs's own.

/// What a run loaded from a MaxText checkpoint says (issue 47): the arrays are MaxText's as they
/// are (maxrs keeps the queries' `1 / sqrt(head_dim)` where MaxText does, in the query kernel for
/// Llama, Mistral, Mixtral, Gemma and Gemma 2: `model::blocks::QueryScale`), but MaxText's trainer
/// draws its synthetic batches with `unsafe_rbg` (`trainers/pre_train/train.py` at MaxText e591f30 sets
/// `jax_default_prng_impl`), maxrs with threefry.
pub const NOT_YET_EQUAL: &str =
    "warning: with dataset_type=synthetic, maxrs's batches are not MaxText's (MaxText draws them with unsafe_rbg, \
     maxrs with threefry; issue 47)";

pub mod ocdbt;
pub mod params;
pub mod state;
pub mod write;
pub mod zarr;

pub use write::to_maxtext;

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, ensure, Context, Result};
use serde_json::Value as Json;

use crate::files::Location;
use crate::host::HostTensor;
use crate::input::SETTINGS;
use crate::storage;

use ocdbt::Ocdbt;
use zarr::Array;

/// The PyTree metadata file of an Orbax item.
const METADATA_FILE: &str = "_METADATA";
/// The item MaxText's checkpoint manager saves the train state as (`checkpointing.py` at MaxText
/// e591f30: `item_names = ("items",)`).
const ITEM: &str = "items";
/// What `CheckpointManager` writes into each step folder (orbax-checkpoint 0.12.8
/// `_src/metadata/checkpoint.py`, `_STEP_METADATA_FILENAME`): it marks an Orbax step folder.
const STEP_METADATA_FILE: &str = "_CHECKPOINT_METADATA";
/// What Orbax writes last into a finished step or item folder where renames are not atomic
/// (GCS): orbax-checkpoint 0.12.8 `_src/path/atomicity.py`, `CommitFileTemporaryPath`.
const COMMIT_FILE: &str = "commit_success.txt";
/// What Orbax appends to a step or item folder while it is being written
/// (orbax-checkpoint 0.12.8 `_src/path/atomicity_types.py`, `TMP_DIR_SUFFIX`).
const TMP_SUFFIX: &str = ".orbax-checkpoint-tmp";

/// One Orbax PyTree item: its arrays by name and the store holding them.
pub struct Checkpoint {
    items: Location,
    db: Arrays,
    /// maxrs name (`params/params/decoder/...`) -> OCDBT array path (`params.params.decoder...`).
    arrays: BTreeMap<String, String>,
}

impl Checkpoint {
    /// Whether `location` is an Orbax step (with `_CHECKPOINT_METADATA` or `items/_METADATA`)
    /// or item (with `_METADATA`).
    pub fn is_orbax(location: &Location) -> Result<bool> {
        Ok(storage::is_file(&location.join(METADATA_FILE))?
            || storage::is_file(&location.join(ITEM).join(METADATA_FILE))?
            || storage::is_file(&location.join(STEP_METADATA_FILE))?)
    }

    /// Opens the item at `location`: a step folder (its `items/`) or the item folder itself.
    pub fn open(location: &Location) -> Result<Checkpoint> {
        let items = match storage::is_file(&location.join(METADATA_FILE))? {
            true => location.clone(),
            false => location.join(ITEM),
        };
        for folder in [location, &items] {
            ensure!(
                !folder.file_name().contains(TMP_SUFFIX),
                "{folder}: an Orbax checkpoint still being written (its name ends in {TMP_SUFFIX}; an incomplete step)"
            );
        }
        if !items.is_local() && !storage::is_file(&items.join(COMMIT_FILE))? {
            bail!("{items}: an incomplete Orbax checkpoint (no {COMMIT_FILE}, which Orbax writes last on GCS)");
        }
        let metadata_at = items.join(METADATA_FILE);
        if !storage::is_file(&metadata_at)? && storage::is_file(&location.join(STEP_METADATA_FILE))? {
            bail!("{location}: an Orbax step without its item {ITEM}/ (no {ITEM}/{METADATA_FILE}); MaxText saves the train state there");
        }
        if !storage::is_file(&metadata_at)? {
            bail!("{location}: not an Orbax checkpoint (no {METADATA_FILE}, nor {ITEM}/{METADATA_FILE})");
        }
        let text = storage::read(&metadata_at, SETTINGS)?;
        let metadata: Json = serde_json::from_slice(&text).with_context(|| format!("{metadata_at}: not JSON"))?;
        let arrays = array_names(&metadata).with_context(|| format!("{metadata_at}"))?;
        let db = match metadata.get("use_ocdbt") == Some(&Json::Bool(true)) {
            true => {
                ensure!(
                    Ocdbt::is_database(&items)?,
                    "{items}: no manifest.ocdbt, though {METADATA_FILE} says use_ocdbt"
                );
                Arrays::Ocdbt(Ocdbt::open(&items)?)
            }
            false => Arrays::Folders(items.clone()),
        };
        Ok(Checkpoint { items, db, arrays })
    }

    /// The item folder.
    pub fn location(&self) -> &Location {
        &self.items
    }

    /// Every array's name (its tree path joined with `/`), in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.arrays.keys().map(String::as_str)
    }

    /// The metadata of the array `name` (type, shape, codecs).
    pub fn array(&self, name: &str) -> Result<Array> {
        let path = self.arrays.get(name).ok_or_else(|| anyhow!("{}: no array {name:?}", self.items))?;
        Array::open(&self.db, path).with_context(|| format!("{}: array {name:?}", self.items))
    }

    /// The whole array `name`.
    pub fn read(&self, name: &str) -> Result<HostTensor> {
        self.array(name)?.read(&self.db).with_context(|| format!("{}: array {name:?}", self.items))
    }

    /// The block of `shape` at `start` of the array `name`, reading only the chunks it overlaps.
    pub fn read_block(&self, name: &str, start: &[u64], shape: &[u64]) -> Result<HostTensor> {
        let array = self.array(name)?;
        array.read_block(&self.db, start, shape).with_context(|| format!("{}: array {name:?}", self.items))
    }

    /// The blocks `(start, shape)` of the array `name`, decoding each chunk they overlap once.
    pub fn read_blocks(&self, name: &str, blocks: &[(Vec<u64>, Vec<u64>)]) -> Result<Vec<HostTensor>> {
        let array = self.array(name)?;
        array.read_blocks(&self.db, blocks).with_context(|| format!("{}: array {name:?}", self.items))
    }
}

/// `read` of each of `items`, in order, on as many threads as the machine has cores (at most 8):
/// decompressing one array at a time left all but one core idle, and Orbax's restore
/// (TensorStore) reads arrays concurrently (measured on 2 cores, 3.2 GiB: 10.2 s on one thread,
/// 5.8 s on two, Orbax 6.7 s; `benches/orbax_read.rs`). The first error is returned.
pub fn read_in_parallel<T: Sync, R: Send>(items: &[T], read: impl Fn(&T) -> Result<R> + Sync) -> Result<Vec<R>> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 8).min(items.len().max(1));
    let next = AtomicUsize::new(0);
    let mut done: Vec<(usize, Result<R>)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(item) = items.get(i) else { break };
                        let result = read(item);
                        let failed = result.is_err();
                        mine.push((i, result));
                        if failed {
                            // The others stop at their next item.
                            next.store(items.len(), Ordering::Relaxed);
                            break;
                        }
                    }
                    mine
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().expect("a reader thread panicked")).collect()
    });
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, result)| result).collect()
}

/// Whether the numbered folder `step` of a run's checkpoints folder is an Orbax step Orbax
/// counts as finished on GCS (its commit file); a local one is finished by its name alone.
pub fn is_committed_step(step: &Location) -> Result<bool> {
    storage::is_file(&step.join(COMMIT_FILE))
}

/// Whether the folder `step` looks like an Orbax step, finished or not (its step metadata or
/// its item folder is there).
pub fn is_step_folder(step: &Location) -> Result<bool> {
    Ok(storage::list_dir(step)?.iter().any(|e| e.name == STEP_METADATA_FILE || (e.name == ITEM && e.is_dir)))
}

/// The Orbax step folders of the run's checkpoints folder `dir` that Orbax would not restore:
/// `<step>.orbax-checkpoint-tmp-<time>` (still being written, or interrupted) and, on GCS, step
/// folders without their commit file.
pub fn incomplete_steps(dir: &Location) -> Result<Vec<String>> {
    let mut incomplete = Vec::new();
    for entry in storage::list_dir(dir)?.into_iter().filter(|e| e.is_dir) {
        let named_tmp = entry.name.split_once(TMP_SUFFIX).is_some_and(|(step, _)| step.parse::<u64>().is_ok());
        let uncommitted = !dir.is_local()
            && entry.name.parse::<u64>().is_ok()
            && is_step_folder(&dir.join(&entry.name))?
            && !is_committed_step(&dir.join(&entry.name))?;
        if named_tmp || uncommitted {
            incomplete.push(entry.name);
        }
    }
    Ok(incomplete)
}

/// Where an item's arrays are: its OCDBT database (`use_ocdbt`, MaxText's default), or without
/// one (`checkpoint_storage_use_ocdbt=false`) a folder per array in the item's folder, each
/// key a file (`params.params.decoder.decoder_norm.scale/.zarray`, `.../0`).
enum Arrays {
    Ocdbt(Ocdbt),
    Folders(Location),
}

impl zarr::Store for Ocdbt {
    fn value_len(&self, key: &str) -> Result<Option<u64>> {
        Ok(self.get(key.as_bytes()).map(ocdbt::Value::size))
    }

    fn read_range(&self, key: &str, start: u64, len: u64) -> Result<Vec<u8>> {
        Ocdbt::read_range(self, key.as_bytes(), start, len)
    }
}

impl zarr::Store for Arrays {
    fn value_len(&self, key: &str) -> Result<Option<u64>> {
        match self {
            Arrays::Ocdbt(db) => zarr::Store::value_len(db, key),
            Arrays::Folders(items) => storage::size(&file_of(items, key)?),
        }
    }

    fn read_range(&self, key: &str, start: u64, len: u64) -> Result<Vec<u8>> {
        match self {
            Arrays::Ocdbt(db) => db.read_range(key.as_bytes(), start, len),
            Arrays::Folders(items) => storage::read_range(&file_of(items, key)?, start, len),
        }
    }
}

/// The file of `key` in the item folder `items`: a key (made of `_METADATA`'s tree paths) that
/// would name a file outside it is refused.
fn file_of(items: &Location, key: &str) -> Result<Location> {
    ensure!(
        key.split('/').all(|part| !part.is_empty() && part != "." && part != ".."),
        "{items}: the array key {key:?} names no file inside the checkpoint"
    );
    Ok(items.join(key))
}

/// The arrays `_METADATA` lists: maxrs name -> OCDBT array path. Leaves Orbax skipped
/// (`skip_deserialize`) and empty subtrees (value types other than arrays) are not arrays.
fn array_names(metadata: &Json) -> Result<BTreeMap<String, String>> {
    // Written with MaxText's `checkpoint_storage_use_ocdbt` and `checkpoint_storage_use_zarr3`:
    // either way is read (`Arrays`, `zarr`).
    for flag in ["use_ocdbt", "use_zarr3"] {
        ensure!(
            matches!(metadata.get(flag), Some(Json::Bool(_))),
            "{flag} is {}, not true or false",
            metadata.get(flag).unwrap_or(&Json::Null)
        );
    }
    let tree = metadata["tree_metadata"].as_object().ok_or_else(|| anyhow!("no \"tree_metadata\" object"))?;
    let mut arrays = BTreeMap::new();
    for (leaf, entry) in tree {
        let value = &entry["value_metadata"];
        let is_array = matches!(value["value_type"].as_str(), Some("jax.Array" | "np.ndarray"));
        if !is_array || value["skip_deserialize"] == true {
            continue;
        }
        let keys = entry["key_metadata"].as_array().ok_or_else(|| anyhow!("leaf {leaf}: no \"key_metadata\" list"))?;
        let parts: Vec<String> = keys
            .iter()
            .map(|k| match &k["key"] {
                Json::String(s) => Ok(s.clone()),
                Json::Number(n) => Ok(n.to_string()),
                other => Err(anyhow!("leaf {leaf}: key {other}")),
            })
            .collect::<Result<_>>()?;
        ensure!(
            !parts.is_empty() && parts.iter().all(|p| !p.is_empty() && !p.contains('/')),
            "leaf {leaf}: a tree path maxrs cannot name"
        );
        arrays.insert(parts.join("/"), parts.join("."));
    }
    Ok(arrays)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Results come back in the items' order; a failure is the run's error, the first in order.
    #[test]
    fn parallel_reads_keep_the_order_and_fail_on_the_first_error() {
        let items: Vec<u64> = (0..100).collect();
        let squares = read_in_parallel(&items, |&i| Ok(i * i)).unwrap();
        assert_eq!(squares, items.iter().map(|i| i * i).collect::<Vec<_>>());
        let e = read_in_parallel(&items, |&i| if i % 40 == 39 { bail!("item {i}") } else { Ok(i) }).unwrap_err();
        assert_eq!(e.to_string(), "item 39");
        assert!(read_in_parallel(&[] as &[u64], |&i| Ok(i)).unwrap().is_empty());
    }

    /// The fixture folder `tests/data/orbax/<rel>` (see its README: written by MaxText e591f30).
    pub(crate) fn fixture(rel: &str) -> Location {
        Location::Local(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/orbax").join(rel))
    }

    #[test]
    fn a_step_lists_the_arrays_of_the_train_state() {
        let ckpt = Checkpoint::open(&fixture("nnx/checkpoints/1")).unwrap();
        assert_eq!(ckpt.location(), &fixture("nnx/checkpoints/1/items"));
        let names: Vec<&str> = ckpt.names().collect();
        assert!(names.contains(&"params/params/decoder/layers/mlp/wi_0/kernel"), "{names:?}");
        assert!(names.contains(&"opt_state/0/mu/params/token_embedder/embedding"), "{names:?}");
        assert!(names.contains(&"step"), "{names:?}");
        let kernel = ckpt.array("params/params/decoder/layers/mlp/wi_0/kernel").unwrap();
        assert_eq!((kernel.ty, kernel.shape.clone()), (crate::host::DType::F32, vec![16, 3, 32]));
        // Folder 1 holds the state after steps 0 and 1: two updates, `step` 2 (as Orbax's own
        // restore reads it, tests/data/orbax/values/nnx_step1.safetensors).
        assert_eq!(ckpt.read("step").unwrap().data, 2i32.to_le_bytes());
    }

    use crate::host::DType;

    /// The storage choices besides MaxText's default (tests/data/orbax/storage, written by
    /// `tools/orbax_storage_fixture.py` with Orbax): without OCDBT (a folder per array) and
    /// zarr v2 (`.zarray`, `0.1` chunk keys), each way, read to the values written.
    #[test]
    fn items_without_ocdbt_or_with_zarr_v2_read_as_written() {
        let f32s = |values: Vec<f32>| values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
        let wi_0 = f32s((0..24).map(|i| i as f32 / 7.0).collect());
        let scale: Vec<u8> =
            [-1.0f32, -0.5, 0.0, 0.5, 1.0].iter().flat_map(|&v| half::bf16::from_f32(v).to_le_bytes()).collect();
        let embedding = f32s((0..24).map(|i| i as f32).collect());
        for folder in ["storage/ocdbt0_zarr2", "storage/ocdbt0_zarr3", "storage/ocdbt1_zarr2"] {
            let ckpt = Checkpoint::open(&fixture(folder)).unwrap();
            assert_eq!(ckpt.names().count(), 4, "{folder}");
            let kernel = ckpt.read("params/params/decoder/layers/mlp/wi_0/kernel").unwrap();
            assert_eq!(
                (kernel.ty, kernel.dims.as_slice(), &kernel.data),
                (DType::F32, &[2, 3, 4][..], &wi_0),
                "{folder}"
            );
            let norm = ckpt.read("params/params/decoder/decoder_norm/scale").unwrap();
            assert_eq!((norm.ty, &norm.data), (DType::BF16, &scale), "{folder}");
            let table = ckpt.read("params/params/token_embedder/embedding").unwrap();
            assert_eq!(table.data, embedding, "{folder}");
            assert_eq!(ckpt.read("step").unwrap().data, 3i32.to_le_bytes(), "{folder}");
            // A block: row 1 of the second layer.
            let block =
                ckpt.read_block("params/params/decoder/layers/mlp/wi_0/kernel", &[1, 1, 0], &[1, 1, 4]).unwrap();
            assert_eq!(block.data, wi_0[16 * 4..20 * 4], "{folder}");
        }
    }

    /// An array key of `_METADATA` cannot name a file outside an item folder without OCDBT.
    #[test]
    fn a_folder_items_keys_stay_inside_it() {
        let items = fixture("storage/ocdbt0_zarr2");
        for key in ["../nnx/x/.zarray", "a//b", "/etc/passwd", "a/./b"] {
            let e = file_of(&items, key).unwrap_err().to_string();
            assert!(e.contains("names no file inside the checkpoint"), "{key}: {e}");
        }
        assert_eq!(file_of(&items, "step/0").unwrap(), items.join("step/0"));
    }

    #[test]
    fn refusals_name_the_culprit() {
        let e = Checkpoint::open(&fixture("nnx")).err().unwrap();
        assert!(format!("{e:#}").contains("not an Orbax checkpoint"), "{e:#}");
        let ckpt = Checkpoint::open(&fixture("nnx_params/0/items")).unwrap();
        let e = ckpt.read("params/params/decoder/absent").unwrap_err();
        assert!(format!("{e:#}").contains("no array \"params/params/decoder/absent\""), "{e:#}");
        let odd = serde_json::json!({"use_ocdbt": "yes", "use_zarr3": true, "tree_metadata": {}});
        let e = array_names(&odd).unwrap_err();
        assert!(e.to_string().contains("use_ocdbt is \"yes\", not true or false"), "{e}");
    }
}
