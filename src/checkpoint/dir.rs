//! One checkpoint directory: writing a [`Snapshot`] into it atomically, and reading it back
//! with every check a restore needs (manifest, model, array names, shapes and dtypes, file sizes
//! and checksums), reporting all differences at once.
//!
//! Layout: arrays are grouped by the first component of their name into one safetensors file
//! per group, keyed by the rest of the name: `params.safetensors` holds the parameters under
//! the README's names (so it is a valid `load_parameters_path` file by itself),
//! `opt_state.safetensors` holds `mu.<param>`, `nu.<param>` and `count`. `manifest.json` is
//! written last.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};

use super::manifest::{self, ArrayEntry, FileEntry, Manifest, MANIFEST_FILE};
use super::tensor_file::{read_safetensors, write_safetensors};
use crate::files::Location;
use crate::host::params_io::{from_dtype, to_dtype};
use crate::host::{convert_float, is_float};
use crate::host::{shape_string, ElementType, HostTensor};
use crate::storage::{self, StagedDir};

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

/// `params.x.y` -> (`params.safetensors`, `x.y`).
fn file_and_key(name: &str) -> Result<(String, String)> {
    match name.split_once('.') {
        Some((group, key)) if !group.is_empty() && !key.is_empty() => Ok((format!("{group}.safetensors"), key.into())),
        _ => bail!("state array `{name}` has no group prefix (such as `params.`)"),
    }
}

/// Writes `snapshot` as the checkpoint directory `target`, which appears only when complete.
/// On failure nothing is left under `target` and the error says what failed.
pub fn save(target: &Location, snapshot: &Snapshot) -> Result<Saved> {
    let started = Instant::now();
    let (location, manifest_bytes) = StagedDir::write_whole(target, MANIFEST_FILE, |dir| write_into(dir, snapshot))?;
    Ok(Saved {
        location,
        step: snapshot.step,
        bytes: snapshot.bytes() + manifest_bytes,
        seconds: started.elapsed().as_secs_f64(),
    })
}

fn write_into(dir: &Location, snapshot: &Snapshot) -> Result<u64> {
    let mut groups: BTreeMap<String, Vec<(String, &HostTensor)>> = BTreeMap::new();
    let mut arrays = Vec::new();
    for (name, tensor) in &snapshot.arrays {
        let (file, key) = file_and_key(name)?;
        arrays.push(ArrayEntry {
            name: name.clone(),
            file: file.clone(),
            key: key.clone(),
            dtype: format!("{:?}", to_dtype(tensor.ty)),
            shape: tensor.dims.clone(),
        });
        groups.entry(file).or_default().push((key, tensor));
    }
    let pause = std::env::var(SLOW_WRITE_ENV).ok().and_then(|ms| ms.parse::<u64>().ok());
    let mut files = Vec::new();
    for (file, tensors) in &groups {
        let location = dir.join(file);
        let mut out = storage::create(&location)?;
        let list: Vec<(&str, &HostTensor)> = tensors.iter().map(|(k, t)| (k.as_str(), *t)).collect();
        let digest = write_safetensors(&mut out, &list, &BTreeMap::from([("format".into(), "pt".into())]))
            .map_err(|e| anyhow!("writing {location}: {e}"))?;
        out.finish()?;
        files.push(FileEntry { name: file.clone(), bytes: digest.bytes, crc32c: manifest::crc_hex(digest.crc32c) });
        if let Some(ms) = pause {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
    }
    let manifest = Manifest {
        format: manifest::FORMAT.into(),
        version: manifest::VERSION,
        maxrs_version: env!("CARGO_PKG_VERSION").into(),
        step: snapshot.step,
        model: snapshot.model.clone(),
        data: snapshot.data.clone(),
        files,
        arrays,
    };
    let text = serde_json::to_vec_pretty(&manifest).expect("the manifest serializes");
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
    Ok(manifest)
}

/// One array a run expects from a checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct Expected {
    pub name: String,
    pub ty: ElementType,
    pub dims: Vec<i64>,
}

/// A checkpoint read back and checked.
pub struct Loaded {
    pub location: Location,
    pub manifest: Manifest,
    /// Exactly the expected arrays, by name, in the expected dtypes.
    pub arrays: BTreeMap<String, HostTensor>,
}

/// Reads the checkpoint at `dir` and returns the `expected` arrays. The files read are those
/// holding them (a parameters-only restore reads `params.safetensors` alone). With
/// `convert_floats` a float array of another float dtype is converted (parameter loading);
/// otherwise dtypes must match (resuming). Every difference from the run is reported at once:
/// model keys, missing, unexpected and mis-shaped arrays; then each file's size and checksum.
pub fn load(
    dir: &Location,
    expected: &[Expected],
    model: &BTreeMap<String, serde_json::Value>,
    convert_floats: bool,
) -> Result<Loaded> {
    let manifest = read_manifest(dir)?;
    let by_name: BTreeMap<&str, &ArrayEntry> = manifest.arrays.iter().map(|a| (a.name.as_str(), a)).collect();
    let groups: BTreeSet<String> =
        expected.iter().map(|e| file_and_key(&e.name).map(|(f, _)| f)).collect::<Result<_>>()?;
    let expected_names: BTreeSet<&str> = expected.iter().map(|e| e.name.as_str()).collect();

    let mut problems = Vec::new();
    let mut differences = manifest::model_differences(&manifest.model, model);
    if convert_floats {
        // Loading parameters converts them to this run's weight_dtype.
        differences.retain(|d| !d.starts_with("weight_dtype:"));
    }
    if !differences.is_empty() {
        problems.push(format!("config keys that differ: {}", differences.join("; ")));
    }
    let mut missing = Vec::new();
    let mut wrong = Vec::new();
    for e in expected {
        let want = shape_string(e.ty, &e.dims);
        match by_name.get(e.name.as_str()) {
            None => missing.push(format!("{} ({want})", e.name)),
            Some(a) => {
                let ty = safetensors_type(&a.dtype);
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
        .filter(|a| groups.contains(&a.file) && !expected_names.contains(a.name.as_str()))
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

    let mut arrays = BTreeMap::new();
    for file in &groups {
        let entry =
            manifest.files.iter().find(|f| &f.name == file).ok_or_else(|| {
                anyhow!("checkpoint {dir}: the manifest lists arrays in {file} but not the file itself")
            })?;
        let location = dir.join(file);
        let mut input =
            storage::open_read(&location).with_context(|| format!("checkpoint {dir}: {file} is missing"))?;
        let read = read_safetensors(&mut input, &location.to_string())?;
        if read.digest.bytes != entry.bytes {
            bail!(
                "{location}: {} bytes, the manifest says {}: the file is truncated or was changed",
                read.digest.bytes,
                entry.bytes
            );
        }
        let crc = manifest::crc_hex(read.digest.crc32c);
        if crc != entry.crc32c {
            bail!("{location}: CRC32C {crc}, the manifest says {}: the file is corrupt", entry.crc32c);
        }
        let mut tensors = read.tensors;
        for a in manifest.arrays.iter().filter(|a| &a.file == file && expected_names.contains(a.name.as_str())) {
            let tensor = tensors.remove(&a.key).ok_or_else(|| {
                anyhow!("{location}: has no tensor `{}` (array {}) that the manifest lists", a.key, a.name)
            })?;
            if tensor.dims != a.shape || format!("{:?}", to_dtype(tensor.ty)) != a.dtype {
                bail!(
                    "{location}: tensor `{}` is {}, the manifest says {}{:?}",
                    a.key,
                    tensor.shape_string(),
                    a.dtype,
                    a.shape
                );
            }
            arrays.insert(a.name.clone(), tensor);
        }
    }
    for e in expected {
        let tensor = arrays.get_mut(&e.name).expect("every expected array was checked present");
        if tensor.ty != e.ty {
            *tensor = convert_float(tensor, e.ty);
        }
    }
    Ok(Loaded { location: dir.clone(), manifest, arrays })
}

/// The maxrs element type of a safetensors dtype name (`F32`, `BF16`, ...).
fn safetensors_type(name: &str) -> Option<ElementType> {
    let dtype: safetensors::Dtype = serde_json::from_value(serde_json::Value::String(name.into())).ok()?;
    from_dtype(dtype)
}
