//! Hugging Face checkpoint directories, as `transformers`' `save_pretrained` writes them:
//! `config.json`, and the weights as one `model.safetensors` or as shards
//! `model-00001-of-0000N.safetensors` with `model.safetensors.index.json`
//! (`{"metadata": {"total_size": bytes}, "weight_map": {tensor: shard}}`). Every safetensors
//! header carries `{"format": "pt"}`, which `transformers` requires. Local or gs://.
//!
//! [`from_hf`] and [`to_hf`] are `maxrs convert`: the tensor mapping is the family's
//! (`model::llama_hf`), the files are read and written here. Both write a new directory whole
//! (`StagedDir::write_whole`): it appears complete or not at all, and never over an existing one.

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

use super::dir::{self, Expected, Snapshot};
use super::manifest::{self, MANIFEST_FILE};
use super::tensor_file::{read_safetensors, write_safetensors};
use crate::config::{self, Config};
use crate::model::{llama_hf, Model};
use crate::pjrt::{shape_string, ElementType, HostTensor};
use crate::storage::{self, Location, StagedDir};
use crate::train::params_io::convert_float;

pub const CONFIG_FILE: &str = "config.json";
pub const INDEX_FILE: &str = "model.safetensors.index.json";
pub const SINGLE_FILE: &str = "model.safetensors";
/// `save_pretrained`'s default `max_shard_size`.
pub const DEFAULT_SHARD_BYTES: u64 = 5_000_000_000;

/// A checkpoint read into memory.
pub struct HfCheckpoint {
    pub config: Value,
    pub tensors: BTreeMap<String, HostTensor>,
}

/// Reads `config.json` and every weight file the index names (or `model.safetensors`).
pub fn read(dir: &Location) -> Result<HfCheckpoint> {
    let config: Value = serde_json::from_slice(&storage::read(&dir.join(CONFIG_FILE))?)
        .map_err(|e| anyhow!("{}: not JSON: {e}", dir.join(CONFIG_FILE)))?;
    let files: Vec<String> = if storage::is_file(&dir.join(INDEX_FILE))? {
        let index: Value = serde_json::from_slice(&storage::read(&dir.join(INDEX_FILE))?)
            .map_err(|e| anyhow!("{}: not JSON: {e}", dir.join(INDEX_FILE)))?;
        let map = index["weight_map"].as_object().ok_or_else(|| anyhow!("{}: no weight_map", dir.join(INDEX_FILE)))?;
        let mut files: Vec<String> = map.values().filter_map(|v| v.as_str().map(String::from)).collect();
        files.sort();
        files.dedup();
        files
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
    Ok(HfCheckpoint { config, tensors })
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

/// The maxrs config of a model given by `key=value` arguments (model keys first, the user's
/// after them), and the decoder it describes.
fn model_config(args: &[String]) -> Result<(Config, Model)> {
    let c = config::load_args(args)?;
    let model = Model::from_config(&c).map_err(|e| anyhow!(e))?;
    Ok((c, model))
}

/// A Hugging Face Llama-family checkpoint at `src` -> a maxrs parameters-only checkpoint
/// directory at `dst` (`load_parameters_path=dst`), in `dtype` (default: the source's).
/// `overrides` are maxrs keys such as `scan_layers=false`.
pub fn from_hf(src: &Location, dst: &Location, dtype: Option<&str>, overrides: &[String]) -> Result<Converted> {
    let hf = read(src)?;
    let ty = match dtype {
        Some(d) => element_type(d)?,
        None => hf.tensors.values().next().map(|t| t.ty).ok_or_else(|| anyhow!("{src}: no tensors"))?,
    };
    let mut args: Vec<String> =
        llama_hf::config_from_hf(&hf.config)?.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
    args.push(format!("weight_dtype={}", dtype_name(ty)));
    args.extend(overrides.iter().cloned());
    let (c, model) = model_config(&args)?;
    let params = cast(llama_hf::from_hf(&model, &hf.tensors)?, ty);
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
    let mut all_args = Vec::new();
    if is_checkpoint {
        let manifest = dir::read_manifest(src)?;
        // A config file, if given, must come first.
        let (file, rest): (Vec<&String>, Vec<&String>) = args.iter().partition(|a| !a.contains('='));
        all_args.extend(file.into_iter().cloned());
        all_args.extend(manifest.model.iter().map(|(k, v)| format!("{k}={}", plain(v))));
        all_args.extend(rest.into_iter().cloned());
    } else {
        all_args.extend(args.iter().cloned());
    }
    let (c, model) = model_config(&all_args)?;
    llama_hf::check_model(&c, &model)?;
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
    let tensors = llama_hf::to_hf(&model, &params)?;
    let hf_config = llama_hf::hf_config(&c, &model, dtype_name(ty));
    // config.json, written last, is what marks a gs:// directory complete.
    let (_, files) = StagedDir::write_whole(dst, CONFIG_FILE, |dir| write(dir, &hf_config, &tensors, max_shard_bytes))?;
    let bytes = tensors.values().map(|t| t.data.len() as u64).sum();
    let model_args = manifest::model_keys(&c, &model).iter().map(|(k, v)| format!("{k}={}", plain(v))).collect();
    Ok(Converted { model_args, tensors: tensors.len(), bytes, files })
}
