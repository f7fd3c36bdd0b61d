//! Hugging Face checkpoint directories, as `transformers`' `save_pretrained` writes them:
//! `config.json`, and the weights as one `model.safetensors` or as shards
//! `model-00001-of-0000N.safetensors` with `model.safetensors.index.json`
//! (`{"metadata": {"total_size": bytes}, "weight_map": {tensor: shard}}`). Every safetensors
//! header carries `{"format": "pt"}`, which `transformers` requires. Local or gs://.
//!
//! [`from_hf`] and [`to_hf`] are `maxrs convert`: the tensor mapping is the family's
//! (`model::hf`), the files are read and written here. Both write a new directory whole
//! (`StagedDir::write_whole`): it appears complete or not at all, and never over an existing one.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

use super::dir::{self, Expected, Snapshot};
use super::manifest::{self, MANIFEST_FILE};
use super::tensor_file::{read_safetensors, write_safetensors};
use crate::config::{self, Config};
use crate::files::Location;
use crate::host::convert_float;
use crate::host::{shape_string, ElementType, HostTensor};
use crate::input;
use crate::model::{hf as layout, Model};
use crate::storage::{self, StagedDir};

pub const CONFIG_FILE: &str = "config.json";
pub const INDEX_FILE: &str = "model.safetensors.index.json";
pub const SINGLE_FILE: &str = "model.safetensors";
/// `save_pretrained`'s default `max_shard_size`.
pub const DEFAULT_SHARD_BYTES: u64 = 5_000_000_000;

/// `config.json` of the checkpoint at `dir`.
fn read_config(dir: &Location) -> Result<Value> {
    let location = dir.join(CONFIG_FILE);
    serde_json::from_slice(&storage::read(&location, input::SETTINGS)?)
        .map_err(|e| anyhow!("{location}: not JSON: {e}"))
}

/// Every tensor of the weight files the index names (or of `model.safetensors`).
fn read_tensors(dir: &Location) -> Result<BTreeMap<String, HostTensor>> {
    let files: Vec<String> = if storage::is_file(&dir.join(INDEX_FILE))? {
        shard_files(dir)?
    } else if storage::is_file(&dir.join(SINGLE_FILE))? {
        vec![SINGLE_FILE.to_string()]
    } else {
        bail!("{dir}: no {SINGLE_FILE} or {INDEX_FILE} (maxrs reads safetensors weights, not pytorch_model.bin)");
    };
    let mut tensors = BTreeMap::new();
    for file in files {
        let location = dir.join(&file);
        let mut input = storage::open_read(&location)?;
        for (name, tensor) in read_safetensors(&mut input, &location.to_string())?.tensors {
            if tensors.insert(name.clone(), tensor).is_some() {
                bail!("{location}: tensor {name} is also in another shard");
            }
        }
    }
    Ok(tensors)
}

/// The shard files `model.safetensors.index.json` names, each checked to be a file of the
/// checkpoint folder: a plain file name (no `/`, `..` or absolute path), and locally not a
/// symlink leading out of the folder, so that an index cannot make maxrs read
/// `../../../../etc/passwd`. The one link out that is allowed is Hugging Face's own cache
/// layout, where `snapshots/<revision>/<file>` links to `../../blobs/<hash>` (huggingface_hub
/// `docs/source/en/guides/manage-cache.md`).
fn shard_files(dir: &Location) -> Result<Vec<String>> {
    let index_location = dir.join(INDEX_FILE);
    let index: Value = serde_json::from_slice(&storage::read(&index_location, input::SETTINGS)?)
        .map_err(|e| anyhow!("{index_location}: not JSON: {e}"))?;
    let map = index["weight_map"]
        .as_object()
        .ok_or_else(|| anyhow!("{index_location}: no weight_map object (tensor name -> shard file name)"))?;
    let mut files: Vec<String> = Vec::new();
    for (tensor, file) in map {
        let bad = |why: &str| anyhow!("{index_location}: weight_map[{tensor:?}] = {file}: {why}");
        let Some(name) = file.as_str() else {
            return Err(bad("not a file name"));
        };
        let plain = !name.is_empty()
            && name != "."
            && name != ".."
            && !name.contains(['/', '\\', '\0'])
            && std::path::Path::new(name).is_relative();
        if !plain {
            return Err(bad(
                "not a file of the checkpoint folder; the index names shards by plain file names such as \
                 model-00001-of-00002.safetensors",
            ));
        }
        if let Location::Local(folder) = dir {
            if let Some(target) = link_out_of(folder, name) {
                return Err(bad(&format!(
                    "a symlink to {target:?}, outside the checkpoint folder; copy the shard into the folder"
                )));
            }
        }
        files.push(name.to_string());
    }
    files.sort();
    files.dedup();
    Ok(files)
}

/// Where `folder/name` leads when it is a symlink whose target lies outside `folder` (and
/// outside the `blobs` folder of a Hugging Face cache snapshot).
fn link_out_of(folder: &std::path::Path, name: &str) -> Option<std::path::PathBuf> {
    let path = folder.join(name);
    if !std::fs::symlink_metadata(&path).ok()?.file_type().is_symlink() {
        return None;
    }
    // An unresolvable link is reported by the reader with what it is (missing, a loop).
    let target = std::fs::canonicalize(&path).ok()?;
    let root = std::fs::canonicalize(folder).ok()?;
    let cache_blobs = root
        .parent()
        .filter(|snapshots| snapshots.file_name().is_some_and(|n| n == "snapshots"))
        .and_then(|snapshots| snapshots.parent())
        .map(|repo| repo.join("blobs"));
    let inside = target.starts_with(&root) || cache_blobs.is_some_and(|blobs| target.starts_with(blobs));
    (!inside).then_some(target)
}

/// Writes `config` and `tensors` to `dir`: one `model.safetensors`, or shards of at most
/// `max_shard_bytes` (a tensor larger than that gets a shard of its own) with an index.
/// Returns the files written.
pub fn write(
    dir: &Location,
    config: &Value,
    tensors: &BTreeMap<String, HostTensor>,
    max_shard_bytes: u64,
) -> Result<Vec<String>> {
    let mut shards: Vec<Vec<(&str, &HostTensor)>> = vec![vec![]];
    let mut current = 0u64;
    for (name, tensor) in tensors {
        let size = tensor.data.len() as u64;
        if current > 0 && current + size > max_shard_bytes {
            shards.push(vec![]);
            current = 0;
        }
        shards.last_mut().expect("one shard at least").push((name, tensor));
        current += size;
    }
    let metadata = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    let n = shards.len();
    let mut files = Vec::new();
    let mut weight_map = serde_json::Map::new();
    for (i, shard) in shards.iter().enumerate() {
        let file = if n == 1 { SINGLE_FILE.to_string() } else { format!("model-{:05}-of-{n:05}.safetensors", i + 1) };
        let location = dir.join(&file);
        let mut out = storage::create(&location)?;
        write_safetensors(&mut out, shard, &metadata).with_context(|| format!("writing {location}"))?;
        out.finish()?;
        for (name, _) in shard {
            weight_map.insert(name.to_string(), Value::String(file.clone()));
        }
        files.push(file);
    }
    if n > 1 {
        let total: u64 = tensors.values().map(|t| t.data.len() as u64).sum();
        let index = json!({ "metadata": { "total_size": total }, "weight_map": weight_map });
        storage::write(&dir.join(INDEX_FILE), serde_json::to_string_pretty(&index)?.as_bytes())?;
        files.push(INDEX_FILE.to_string());
    }
    storage::write(&dir.join(CONFIG_FILE), serde_json::to_string_pretty(config)?.as_bytes())?;
    files.push(CONFIG_FILE.to_string());
    Ok(files)
}

/// What a conversion did.
pub struct Converted {
    /// The maxrs configuration keys of the model (`key=value`).
    pub model_args: Vec<String>,
    pub tensors: usize,
    pub bytes: u64,
    pub files: Vec<String>,
}

fn element_type(dtype: &str) -> Result<ElementType> {
    match dtype {
        "float32" => Ok(ElementType::F32),
        "bfloat16" => Ok(ElementType::BF16),
        "float16" => Ok(ElementType::F16),
        other => bail!("--dtype {other}: expected float32, bfloat16 or float16"),
    }
}

fn dtype_name(ty: ElementType) -> &'static str {
    match ty {
        ElementType::BF16 => "bfloat16",
        ElementType::F16 => "float16",
        _ => "float32",
    }
}

fn cast(tensors: BTreeMap<String, HostTensor>, ty: ElementType) -> BTreeMap<String, HostTensor> {
    tensors.into_iter().map(|(n, t)| if t.ty == ty { (n, t) } else { (n.clone(), convert_float(&t, ty)) }).collect()
}

/// The maxrs config of a model: the user's arguments `user` (a config file first, if any) over
/// the model keys `derived` from the source checkpoint, and the decoder it describes.
fn model_config(derived: &[String], user: &[String]) -> Result<(Config, Model)> {
    // A config file may stand anywhere among the arguments; a second one is left to the loader,
    // which names it as an argument that is not `key=value`.
    let file = user.iter().position(|a| !a.contains('='));
    let rest: Vec<String> = user.iter().enumerate().filter(|(i, _)| Some(*i) != file).map(|(_, a)| a.clone()).collect();
    let c = config::load_over(file.map(|i| Path::new(user[i].as_str())), derived, &rest)?;
    let model = Model::from_config(&c).map_err(|e| anyhow!(e))?;
    Ok((c, model))
}

/// A Hugging Face checkpoint at `src` -> a maxrs parameters-only checkpoint
/// directory at `dst` (`load_parameters_path=dst`), in `dtype` (default: the source's).
/// `overrides` are maxrs keys such as `scan_layers=false`.
pub fn from_hf(src: &Location, dst: &Location, dtype: Option<&str>, overrides: &[String]) -> Result<Converted> {
    // The config is checked before gigabytes of weights are read.
    let hf_config = read_config(src)?;
    let model_keys = layout::config_from_hf(&hf_config).with_context(|| src.join(CONFIG_FILE).to_string())?;
    let tensors = read_tensors(src)?;
    let ty = match dtype {
        Some(d) => element_type(d)?,
        None => tensors.values().next().map(|t| t.ty).ok_or_else(|| anyhow!("{src}: no tensors"))?,
    };
    let mut derived: Vec<String> = model_keys.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
    derived.push(format!("weight_dtype={}", dtype_name(ty)));
    let (c, model) = model_config(&derived, overrides)?;
    let params = cast(layout::from_hf(&c, &model, &hf_config, &tensors)?, ty);
    let snapshot = Snapshot {
        step: None,
        arrays: params.into_iter().map(|(n, t)| (format!("params.{n}"), t)).collect(),
        model: manifest::model_keys(&c, &model),
        data: None,
    };
    let saved = dir::save(dst, &snapshot)?;
    let model_args = snapshot.model.iter().map(|(k, v)| format!("{k}={}", plain(v))).collect();
    Ok(Converted {
        model_args,
        tensors: snapshot.arrays.len(),
        bytes: saved.bytes,
        files: vec![MANIFEST_FILE.into(), "params.safetensors".into()],
    })
}

/// A config value as `key=value` text takes it.
fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(items) => format!("[{}]", items.iter().map(plain).collect::<Vec<_>>().join(", ")),
        other => other.to_string(),
    }
}

/// maxrs parameters -> a Hugging Face checkpoint directory at `dst`. `src` is a maxrs
/// checkpoint directory (its manifest gives the model) or a parameters safetensors file (then
/// `args`, a config file and/or `key=value`, give the model).
pub fn to_hf(
    src: &Location,
    dst: &Location,
    dtype: Option<&str>,
    max_shard_bytes: u64,
    args: &[String],
) -> Result<Converted> {
    let is_checkpoint = storage::is_file(&src.join(MANIFEST_FILE))?;
    let derived: Vec<String> = if is_checkpoint {
        dir::read_manifest(src)?.model.iter().map(|(k, v)| format!("{k}={}", plain(v))).collect()
    } else {
        Vec::new()
    };
    let (c, model) = model_config(&derived, args)?;
    layout::check_model(&c)?;
    let weight = crate::runtime::element_type(model.config.weight_dtype);
    let ty = dtype.map(element_type).transpose()?.unwrap_or(weight);
    let expected: Vec<Expected> = model
        .param_defs()
        .into_iter()
        .map(|d| Expected { name: format!("params.{}", d.name), ty, dims: d.shape })
        .collect();
    let params: BTreeMap<String, HostTensor> = if is_checkpoint {
        let loaded = dir::load(src, &expected, &manifest::model_keys(&c, &model), true)?;
        loaded.arrays.into_iter().map(|(n, t)| (n["params.".len()..].to_string(), t)).collect()
    } else {
        let mut input = storage::open_read(src)?;
        let file = read_safetensors(&mut input, &src.to_string())?;
        let mut tensors = file.tensors;
        let mut params = BTreeMap::new();
        for e in &expected {
            let name = &e.name["params.".len()..];
            let t = tensors
                .remove(name)
                .ok_or_else(|| anyhow!("{src}: no tensor {name} ({})", shape_string(e.ty, &e.dims)))?;
            if t.dims != e.dims {
                bail!("{src}: tensor {name} is {}, the model has {}", t.shape_string(), shape_string(e.ty, &e.dims));
            }
            params.insert(name.to_string(), t);
        }
        if let Some(extra) = tensors.keys().next() {
            bail!("{src}: tensor {extra} is not a parameter of the model ({} such)", tensors.len());
        }
        cast(params, ty)
    };
    let tensors = layout::to_hf(&c, &model, &params, ty)?;
    let hf_config = layout::hf_config(&c, &model, dtype_name(ty));
    // config.json, written last, is what marks a gs:// directory complete.
    let (_, files) = StagedDir::write_whole(dst, CONFIG_FILE, |dir| write(dir, &hf_config, &tensors, max_shard_bytes))?;
    let bytes = tensors.values().map(|t| t.data.len() as u64).sum();
    let model_args = manifest::model_keys(&c, &model).iter().map(|(k, v)| format!("{k}={}", plain(v))).collect();
    Ok(Converted { model_args, tensors: tensors.len(), bytes, files })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_may_stay_in_the_folder_or_lead_into_a_hub_cache_blob() {
        let root = tempfile::tempdir().unwrap();
        let repo = root.path().join("models--org--name");
        let snapshot = repo.join("snapshots").join("0123abc");
        std::fs::create_dir_all(&snapshot).unwrap();
        std::fs::create_dir_all(repo.join("blobs")).unwrap();
        std::fs::write(repo.join("blobs").join("f00d"), b"weights").unwrap();
        std::fs::write(snapshot.join("plain.safetensors"), b"weights").unwrap();
        std::fs::write(root.path().join("outside.safetensors"), b"weights").unwrap();
        let link = |name: &str, target: &str| std::os::unix::fs::symlink(target, snapshot.join(name)).unwrap();
        link("cached.safetensors", "../../blobs/f00d");
        link("sibling.safetensors", "plain.safetensors");
        link("out.safetensors", "../../../outside.safetensors");
        link("dangling.safetensors", "missing");
        for inside in ["plain.safetensors", "cached.safetensors", "sibling.safetensors", "dangling.safetensors"] {
            assert_eq!(link_out_of(&snapshot, inside), None, "{inside}");
        }
        let out = link_out_of(&snapshot, "out.safetensors");
        assert_eq!(out, Some(root.path().join("outside.safetensors").canonicalize().unwrap()));
        // Outside a snapshot folder, a cache-like `blobs` link is a link out like any other.
        let plain_dir = root.path().join("ckpt");
        std::fs::create_dir_all(&plain_dir).unwrap();
        std::os::unix::fs::symlink("../models--org--name/blobs/f00d", plain_dir.join("m.safetensors")).unwrap();
        assert!(link_out_of(&plain_dir, "m.safetensors").is_some());
    }
}
