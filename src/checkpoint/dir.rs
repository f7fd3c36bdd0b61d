//! One checkpoint directory: writing a [`Snapshot`] into it atomically, or one process's
//! [`Share`] of it ([`write_part`]; `checkpoint::job` commits a job's parts), and reading it
//! back, whole or the blocks one process needs, with every check a restore needs (manifest,
//! model, array names, shapes and dtypes, file sizes and checksums), reporting all differences
//! at once.
//!
//! Layout: arrays are grouped by the first component of their name into one safetensors file
//! per group and process, keyed by the rest of the name: a one-process job's
//! `params.safetensors` holds the parameters whole under the parameter layout's names (so it is a valid
//! `load_parameters_path` file by itself), `opt_state.safetensors` holds `mu.<param>`,
//! `nu.<param>` and `count`; in a job of N processes, process p writes the blocks it owns to
//! `params.p-of-N.safetensors` and `opt_state.p-of-N.safetensors`, keyed `<key>[ranges]`.
//! `manifest.json` is written last.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use anyhow::{anyhow, bail, Result};

use serde::{Deserialize, Serialize};

use super::manifest::{self, ArrayEntry, FileEntry, Manifest, SliceEntry, MANIFEST_FILE};
use super::shards::{check_tiling, ranges, Bounds, HostArray};
use super::tensor_file::{element_type, write_safetensors};
use super::{folder, read};
use crate::files::Location;
use crate::host::params_io::to_dtype;
use crate::host::{convert_float, is_float, whole};
use crate::host::{shape_string, DType, HostTensor};
use crate::storage::{self, StagedDir};
use crate::train_state::{Group, StateArray, TrainState};

/// Test hook: milliseconds to pause after writing each data file of a checkpoint, so a test can
/// kill a run in the middle of a write. Never set in normal use.
pub const SLOW_WRITE_ENV: &str = "MAXRS_TEST_SLOW_CHECKPOINT_MS";

/// Host copies of a run's state at one step, ready to be written.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// The last completed step; `None` for a parameters-only checkpoint (`maxrs convert`).
    pub step: Option<u64>,
    /// `(train step name, value)`, e.g. `("params.decoder.decoder_norm.scale", ...)`.
    pub arrays: Vec<(String, HostTensor)>,
    pub model: BTreeMap<String, serde_json::Value>,
    pub data: Option<serde_json::Value>,
}

impl Snapshot {
    pub fn bytes(&self) -> u64 {
        self.arrays.iter().map(|(_, t)| t.data.len() as u64).sum()
    }
}

/// A finished save.
#[derive(Clone, Debug)]
pub struct Saved {
    pub location: Location,
    pub step: Option<u64>,
    pub bytes: u64,
    pub seconds: f64,
}

/// `params.x.y` -> (`params`, `x.y`).
fn group_and_key(name: &str) -> Result<(&str, &str)> {
    match name.split_once('.') {
        Some((group, key)) if !group.is_empty() && !key.is_empty() => Ok((group, key)),
        _ => bail!("state array `{name}` has no group prefix (such as `params.`)"),
    }
}

/// The file process `process` of `processes` writes a group's blocks to: `params.safetensors`
/// for a job of one process (a valid `load_parameters_path` file by itself),
/// `params.1-of-2.safetensors` otherwise.
pub fn file_name(group: &str, process: usize, processes: usize) -> String {
    if processes == 1 {
        format!("{group}.safetensors")
    } else {
        format!("{group}.{process}-of-{processes}.safetensors")
    }
}

/// What one process of a job writes of a checkpoint: every array of the state (global dtype and
/// shape) with the blocks the write plan gives this process (none for some).
#[derive(Clone, Debug)]
pub struct Share {
    pub step: Option<u64>,
    pub arrays: Vec<HostArray>,
    pub model: BTreeMap<String, serde_json::Value>,
    /// This process's data position.
    pub data: Option<serde_json::Value>,
}

impl Share {
    pub fn bytes(&self) -> u64 {
        self.arrays.iter().map(HostArray::bytes).sum()
    }
}

impl Snapshot {
    /// The snapshot as the share of the only process: every array one whole block.
    pub fn share(&self) -> Share {
        Share {
            step: self.step,
            arrays: self.arrays.iter().map(|(name, t)| HostArray::whole(name, t.clone())).collect(),
            model: self.model.clone(),
            data: self.data.clone(),
        }
    }
}

/// What a process wrote into a checkpoint directory, for process 0's manifest.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Part {
    pub process: usize,
    pub files: Vec<FileEntry>,
    /// `(array name, slice)` for every block written.
    pub slices: Vec<(String, SliceEntry)>,
    pub data: Option<serde_json::Value>,
}

/// Writes `snapshot` as the checkpoint directory `target`, which appears only when complete.
/// On failure nothing is left under `target` and the error says what failed.
pub fn save(target: &Location, snapshot: &Snapshot) -> Result<Saved> {
    let started = Instant::now();
    let share = snapshot.share();
    let (location, manifest_bytes) = StagedDir::write_whole(target, MANIFEST_FILE, |dir| {
        let part = write_part(dir, &share, 0, 1)?;
        write_manifest(dir, &manifest_of(&share, 1, vec![part])?)
    })?;
    Ok(Saved {
        location,
        step: snapshot.step,
        bytes: snapshot.bytes() + manifest_bytes,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Writes the blocks of `share` (process `process` of `processes`) into `dir`: one safetensors
/// file per group of arrays, each block under its array's key (with its ranges,
/// `key[0:256,0:512]`, when it is not the whole array).
pub fn write_part(dir: &Location, share: &Share, process: usize, processes: usize) -> Result<Part> {
    let mut groups: BTreeMap<&str, Vec<(String, &str, &Bounds, &HostTensor)>> = BTreeMap::new();
    for array in &share.arrays {
        let (group, key) = group_and_key(&array.name)?;
        for (bounds, block) in &array.blocks {
            let key = if *bounds == whole(&array.dims) { key.to_string() } else { format!("{key}{}", ranges(bounds)) };
            groups.entry(group).or_default().push((key, &array.name, bounds, block));
        }
    }
    let pause = std::env::var(SLOW_WRITE_ENV).ok().and_then(|ms| ms.parse::<u64>().ok());
    let mut part = Part { process, files: Vec::new(), slices: Vec::new(), data: share.data.clone() };
    for (group, blocks) in &groups {
        let file = file_name(group, process, processes);
        let location = dir.join(&file);
        let mut out = storage::create(&location)?;
        let list: Vec<(&str, &HostTensor)> = blocks.iter().map(|(k, _, _, t)| (k.as_str(), *t)).collect();
        let written = write_safetensors(&mut out, &list, &BTreeMap::from([("format".into(), "pt".into())]))
            .map_err(|e| anyhow!("writing {location}: {e}"))?;
        out.finish()?;
        for ((key, name, bounds, _), (offset, crc)) in blocks.iter().zip(written.tensors) {
            part.slices.push((
                name.to_string(),
                SliceEntry {
                    file: file.clone(),
                    key: key.clone(),
                    start: bounds.iter().map(|b| b.0).collect(),
                    shape: bounds.iter().map(|b| b.1).collect(),
                    offset,
                    crc32c: manifest::crc_hex(crc),
                },
            ));
        }
        part.files.push(FileEntry {
            name: file,
            bytes: written.digest.bytes,
            crc32c: manifest::crc_hex(written.digest.crc32c),
            process: (processes > 1).then_some(process),
        });
        if let Some(ms) = pause {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
    }
    Ok(part)
}

/// The manifest of a checkpoint from the parts of its `processes` processes (`share`: process
/// 0's, for the step, model and arrays). An error unless the slices of every array cover it
/// exactly once.
pub fn manifest_of(share: &Share, processes: usize, mut parts: Vec<Part>) -> Result<Manifest> {
    parts.sort_by_key(|p| p.process);
    if parts.iter().map(|p| p.process).ne(0..processes) {
        bail!(
            "the checkpoint has parts of processes {:?}, not of all {processes}",
            parts.iter().map(|p| p.process).collect::<Vec<_>>()
        );
    }
    let mut slices: BTreeMap<&str, Vec<SliceEntry>> = BTreeMap::new();
    for (name, slice) in parts.iter().flat_map(|p| &p.slices) {
        slices.entry(name.as_str()).or_default().push(slice.clone());
    }
    let mut arrays = Vec::new();
    for array in &share.arrays {
        let mut mine = slices.remove(array.name.as_str()).unwrap_or_default();
        mine.sort_by(|a, b| a.start.cmp(&b.start));
        let blocks: Vec<Bounds> =
            mine.iter().map(|s| s.start.iter().zip(&s.shape).map(|(&a, &n)| (a, n)).collect()).collect();
        check_tiling(&array.dims, &blocks).map_err(|why| anyhow!("`{}` {:?}: {why}", array.name, array.dims))?;
        arrays.push(ArrayEntry {
            name: array.name.clone(),
            dtype: format!("{:?}", to_dtype(array.ty)),
            shape: array.dims.clone(),
            file: None,
            key: None,
            slices: mine,
        });
    }
    if let Some(name) = slices.keys().next() {
        bail!("a process wrote blocks of `{name}`, which is not an array of the state");
    }
    let multi = processes > 1;
    Ok(Manifest {
        format: manifest::FORMAT.into(),
        version: manifest::VERSION,
        maxrs_version: env!("CARGO_PKG_VERSION").into(),
        step: share.step,
        model: share.model.clone(),
        data: parts[0].data.clone(),
        processes: multi.then_some(processes),
        data_per_process: if multi {
            parts.iter().map(|p| p.data.clone().unwrap_or_default()).collect()
        } else {
            vec![]
        },
        files: parts.into_iter().flat_map(|p| p.files).collect(),
        arrays,
    })
}

/// Writes `manifest` into `dir`; returns its size.
pub fn write_manifest(dir: &Location, manifest: &Manifest) -> Result<u64> {
    let text = serde_json::to_vec_pretty(manifest).expect("the manifest serializes");
    storage::write(&dir.join(MANIFEST_FILE), &text)?;
    Ok(text.len() as u64)
}

/// The manifest of the checkpoint at `dir`.
pub fn read_manifest(dir: &Location) -> Result<Manifest> {
    let location = dir.join(MANIFEST_FILE);
    let bytes = storage::read(&location, crate::input::SETTINGS)
        .map_err(|e| anyhow!("{e:#} (a checkpoint directory has {MANIFEST_FILE})"))?;
    let manifest: Manifest =
        serde_json::from_slice(&bytes).map_err(|e| anyhow!("{location}: not a maxrs checkpoint manifest: {e}"))?;
    if manifest.format != manifest::FORMAT || manifest.version > manifest::VERSION {
        bail!(
            "{location}: format {} version {}; this maxrs reads {} up to version {}",
            manifest.format,
            manifest.version,
            manifest::FORMAT,
            manifest::VERSION
        );
    }
    check_manifest(dir, &manifest).map_err(|why| anyhow!("{location}: {why}"))?;
    Ok(manifest)
}

/// Checks what a manifest says before anything is read or allocated by it: every file it names
/// is a file of the checkpoint folder `dir` ([`folder::outside`]) listed once, every array is
/// listed once under a group (`params.…`), its slices name listed files and tile it exactly
/// (no overlap, no gap, whatever their numbers: [`check_tiling`]), and a job's data positions
/// are one per process. The reason names the entry.
fn check_manifest(dir: &Location, manifest: &Manifest) -> Result<(), String> {
    let plain = "a manifest names its files by plain file names such as params.safetensors";
    let mut files = BTreeSet::new();
    for (i, file) in manifest.files.iter().enumerate() {
        let entry = format!("files[{i}].name = {:?}", file.name);
        if let Some(why) = folder::outside(dir, &file.name, plain) {
            return Err(format!("{entry}: {why}"));
        }
        if !files.insert(file.name.as_str()) {
            return Err(format!("{entry} is listed twice"));
        }
    }
    let mut arrays = BTreeSet::new();
    for (i, array) in manifest.arrays.iter().enumerate() {
        if !arrays.insert(array.name.as_str()) {
            return Err(format!("arrays[{i}]: {} is listed twice", array.name));
        }
        group_and_key(&array.name).map_err(|e| format!("arrays[{i}]: {e}"))?;
        let what = format!("{} {:?}", array.name, array.shape);
        let slices = array.slices();
        if let Some((j, slice)) = slices.iter().enumerate().find(|(_, s)| !files.contains(s.file.as_str())) {
            return Err(format!("{what}: slices[{j}].file = {:?} is not one of the manifest's files", slice.file));
        }
        let blocks: Vec<Bounds> = slices.into_iter().map(|s| s.bounds).collect();
        check_tiling(&array.shape, &blocks).map_err(|why| format!("{what}: {why}"))?;
    }
    let processes = manifest.processes.unwrap_or(1);
    let positions = manifest.data_per_process.len();
    if processes == 0 || (processes > 1 && positions != processes) {
        return Err(format!("processes is {processes}, with {positions} data positions (data_per_process)"));
    }
    Ok(())
}

/// One array a run expects from a checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct Expected {
    pub name: String,
    pub ty: DType,
    pub dims: Vec<i64>,
}

impl Expected {
    /// Every array of a train state (what a training run's checkpoint holds).
    pub fn of_state(state: &TrainState) -> Vec<Expected> {
        let array = |a: &StateArray| Expected { name: a.name(), ty: a.dtype, dims: a.def.shape.clone() };
        state.arrays.iter().map(array).collect()
    }
}

/// A checkpoint read back and checked.
pub struct Loaded {
    pub location: Location,
    pub manifest: Manifest,
    /// Exactly the expected arrays, by name, in the expected dtypes.
    pub arrays: BTreeMap<String, HostTensor>,
}

/// Reads the checkpoint at `dir` and returns the `expected` arrays whole. The files read are
/// those holding them (a parameters-only restore reads the `params` files alone). With
/// `convert_floats` a float array of another float dtype is converted (parameter loading);
/// otherwise dtypes must match (resuming). Every difference from the run is reported at once
/// ([`check_fits`]); then each slice's (or file's) size and checksum.
pub fn load(
    dir: &Location,
    expected: &[Expected],
    model: &BTreeMap<String, serde_json::Value>,
    convert_floats: bool,
) -> Result<Loaded> {
    load_whole(dir, expected, model, if convert_floats { Fit::Parameters } else { Fit::Resume })
}

/// The `expected` arrays of the checkpoint at `dir` whole, fitting as `fit` asks.
fn load_whole(
    dir: &Location,
    expected: &[Expected],
    model: &BTreeMap<String, serde_json::Value>,
    fit: Fit,
) -> Result<Loaded> {
    let wanted: BTreeMap<String, Vec<Bounds>> =
        expected.iter().map(|e| (e.name.clone(), vec![whole(&e.dims)])).collect();
    let share = load_fitting(dir, expected, model, fit, &wanted)?;
    let arrays = share.arrays.into_iter().map(|(name, array)| Ok((name, array.assemble()?))).collect::<Result<_>>()?;
    Ok(Loaded { location: share.location, manifest: share.manifest, arrays })
}

/// Blocks of a checkpoint's arrays read back and checked: what one process of a restoring job
/// needs.
pub struct LoadedBlocks {
    pub location: Location,
    pub manifest: Manifest,
    /// The wanted blocks of each expected array, in the expected dtypes.
    pub arrays: BTreeMap<String, HostArray>,
    /// Bytes read from the checkpoint's files.
    pub bytes_read: u64,
}

/// Reads the blocks `wanted` (by array name; every expected array must be named) of the
/// checkpoint at `dir`, each from the slices that hold it: only the slices that meet a wanted
/// block are read (ranged reads), each checked against its CRC32C. `expected`,
/// `convert_floats`: as for [`load`].
pub fn load_blocks(
    dir: &Location,
    expected: &[Expected],
    model: &BTreeMap<String, serde_json::Value>,
    convert_floats: bool,
    wanted: &BTreeMap<String, Vec<Bounds>>,
) -> Result<LoadedBlocks> {
    let fit = if convert_floats { Fit::Parameters } else { Fit::Resume };
    load_fitting(dir, expected, model, fit, wanted)
}

/// Reads a LoRA run's adapters `expected` (`params.…_lora_a`, `…_lora_b`) whole from its
/// checkpoint at `dir` (`lora.lora_restore_path`), and nothing else of it: the checkpoint's model
/// keys must be the run's (its base model, LoRA rank and alpha) but for the dtypes and the
/// module path; float dtypes are converted.
pub fn load_adapters(
    dir: &Location,
    expected: &[Expected],
    model: &BTreeMap<String, serde_json::Value>,
) -> Result<Loaded> {
    load_whole(dir, expected, model, Fit::Adapters)
}

/// What a run takes of a checkpoint, which decides how it must fit ([`check_fits`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fit {
    /// Everything, as saved: resuming.
    Resume,
    /// Its parameters, converted to the run's dtypes (`load_parameters_path`).
    Parameters,
    /// Its LoRA adapters only, converted (`lora.lora_restore_path`).
    Adapters,
}

fn load_fitting(
    dir: &Location,
    expected: &[Expected],
    model: &BTreeMap<String, serde_json::Value>,
    fit: Fit,
    wanted: &BTreeMap<String, Vec<Bounds>>,
) -> Result<LoadedBlocks> {
    let manifest = read_manifest(dir)?;
    check_fits(dir, &manifest, expected, model, fit)?;
    let mut reader = read::SliceReader::new(dir, &manifest);
    let mut arrays = BTreeMap::new();
    for e in expected {
        let entry = manifest.arrays.iter().find(|a| a.name == e.name).expect("check_fits found every expected array");
        let blocks = wanted.get(&e.name).ok_or_else(|| anyhow!("no blocks of `{}` were asked for", e.name))?;
        let mut array = reader.read(entry, blocks)?;
        if array.ty != e.ty {
            array = HostArray {
                ty: e.ty,
                blocks: array.blocks.into_iter().map(|(b, t)| (b, convert_float(&t, e.ty))).collect(),
                ..array
            };
        }
        arrays.insert(e.name.clone(), array);
    }
    Ok(LoadedBlocks { location: dir.clone(), bytes_read: reader.bytes_read, manifest, arrays })
}

/// Checks that the checkpoint `manifest` (at `dir`) fits a run expecting `expected`, reporting
/// every difference at once: model keys, missing, unexpected (in the groups the run reads) and
/// mis-shaped arrays, and whole groups of state one side lacks. Resuming (not `convert_floats`)
/// takes every group of the checkpoint: one the run lacks (an fp8 run's scaling state resumed
/// without fp8) would be dropped.
fn check_fits(
    dir: &Location,
    manifest: &Manifest,
    expected: &[Expected],
    model: &BTreeMap<String, serde_json::Value>,
    fit: Fit,
) -> Result<()> {
    let convert_floats = fit != Fit::Resume;
    let by_name: BTreeMap<&str, &ArrayEntry> = manifest.arrays.iter().map(|a| (a.name.as_str(), a)).collect();
    let groups: BTreeMap<&str, usize> = group_counts(expected.iter().map(|e| e.name.as_str()))?;
    let saved_groups = group_counts(manifest.arrays.iter().map(|a| a.name.as_str()))?;
    let expected_names: BTreeSet<&str> = expected.iter().map(|e| e.name.as_str()).collect();

    let mut problems = Vec::new();
    let mut differences = manifest::model_differences(&manifest.model, model);
    // Loading parameters converts them to this run's weight_dtype; it loads the base model under
    // this run's LoRA adapters, whatever adapters the checkpoint's run had; adapters fit wherever
    // their module path matched them.
    let free: &[&str] = match fit {
        Fit::Resume => &[],
        Fit::Parameters => &["weight_dtype:", "lora."],
        Fit::Adapters => &["weight_dtype:", "lora.lora_module_path:"],
    };
    differences.retain(|d| !free.iter().any(|f| d.starts_with(f)));
    if !differences.is_empty() {
        problems.push(format!("config keys that differ: {}", differences.join("; ")));
    }
    for (group, &n) in &saved_groups {
        if !convert_floats && !groups.contains_key(group) {
            problems.push(dropped_group(group, n));
        }
    }
    for (group, &n) in &groups {
        if !saved_groups.contains_key(group) {
            problems.push(missing_group(group, n));
        }
    }
    let mut missing = Vec::new();
    let mut wrong = Vec::new();
    for e in expected {
        let want = shape_string(e.ty, &e.dims);
        match by_name.get(e.name.as_str()) {
            None if !saved_groups.contains_key(group_and_key(&e.name)?.0) => {}
            None => missing.push(format!("{} ({want})", e.name)),
            Some(a) => {
                let ty = element_type(&a.dtype);
                let dtype_ok = ty == Some(e.ty) || (convert_floats && ty.is_some_and(is_float) && is_float(e.ty));
                if a.shape != e.dims || !dtype_ok {
                    wrong.push(format!("{}: checkpoint {}{:?}, this run {want}", e.name, a.dtype, a.shape));
                }
            }
        }
    }
    let unexpected: Vec<&str> = manifest
        .arrays
        .iter()
        .filter(|a| {
            fit != Fit::Adapters
                && group_and_key(&a.name).is_ok_and(|(g, _)| groups.contains_key(g))
                && !expected_names.contains(a.name.as_str())
        })
        .map(|a| a.name.as_str())
        .collect();
    if !missing.is_empty() {
        problems.push(format!("missing arrays ({}): {}", missing.len(), missing.join(", ")));
    }
    if !unexpected.is_empty() {
        problems.push(format!("arrays this run does not have ({}): {}", unexpected.len(), unexpected.join(", ")));
    }
    if !wrong.is_empty() {
        problems.push(format!("wrong shape or dtype ({}): {}", wrong.len(), wrong.join("; ")));
    }
    if !problems.is_empty() {
        bail!("checkpoint {dir} does not fit this run: {}", problems.join("; "));
    }
    Ok(())
}

/// The number of arrays of each group (`params`, `opt_state`, `fp8`) among `names`.
fn group_counts<'a>(names: impl Iterator<Item = &'a str>) -> Result<BTreeMap<&'a str, usize>> {
    let mut counts = BTreeMap::new();
    for name in names {
        *counts.entry(group_and_key(name)?.0).or_insert(0) += 1;
    }
    Ok(counts)
}

/// A checkpoint's group of `n` arrays that a resuming run does not have.
fn dropped_group(group: &str, n: usize) -> String {
    if group == Group::Fp8.file_group() {
        format!(
            "it holds quantization=fp8's scaling state ({n} arrays fp8.…), which this run (quantization is not fp8) \
             would drop: resume with quantization=fp8, or start another run_name from its parameters \
             (load_parameters_path)"
        )
    } else {
        format!("it holds {n} arrays {group}.… that this run does not have")
    }
}

/// A run's group of `n` arrays that a checkpoint has none of.
fn missing_group(group: &str, n: usize) -> String {
    if group == Group::Fp8.file_group() {
        format!(
            "it holds no fp8 scaling state (it was saved without quantization=fp8), which this run \
             (quantization=fp8) needs ({n} arrays fp8.…): resume without quantization=fp8 (or with \
             te_fp8_currentscaling, which keeps no state), or start another run_name from its parameters \
             (load_parameters_path)"
        )
    } else {
        format!("it has none of this run's {n} arrays {group}.…")
    }
}
