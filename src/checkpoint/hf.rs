//! Hugging Face checkpoint directories, as `transformers`' `save_pretrained` writes them:
//! `config.json`, and the weights as one `model.safetensors` or as shards
//! `model-00001-of-0000N.safetensors` with `model.safetensors.index.json`
//! (`{"metadata": {"total_size": bytes}, "weight_map": {tensor: shard}}`). Every safetensors
//! header carries `{"format": "pt"}`, which `transformers` requires. Local or gs://.
//!
//! [`from_hf`] and [`to_hf`] are `maxrs convert`: the tensor mapping is the family's
//! (`model::hf`), the files are read and written here, with the checks on values: weights are
//! F16, BF16 or F32 (an integer tensor is refused by name), a value the target dtype cannot
//! hold is refused, NaN and infinite values are converted with a warning. Both write a new
//! directory whole (`StagedDir::write_whole`): it appears complete or not at all, and never over
//! an existing one.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

use super::dir::{self, Expected, Snapshot};
use super::folder;
use super::manifest::{self, MANIFEST_FILE};
use super::tensor_file::{self, read_safetensors, write_safetensors};
use crate::config::{self, Config};
use crate::files::Location;
use crate::host::convert_float;
use crate::host::params_io::to_dtype;
use crate::host::{shape_string, DType, HostTensor};
use crate::input;
use crate::model::hf::{self as layout, peft};
use crate::model::Model;
use crate::storage::{self, StagedDir};
use crate::train_state::Group;

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
    // Each tensor's shard, which a refusal names.
    let mut shard_of = BTreeMap::new();
    for file in files {
        let location = dir.join(&file);
        let mut input = storage::open_read(&location)?;
        for (name, tensor) in read_safetensors(&mut input, &location.to_string())?.tensors {
            if tensors.insert(name.clone(), tensor).is_some() {
                bail!("{location}: tensor {name} is also in another shard");
            }
            shard_of.insert(name, location.clone());
        }
    }
    // gpt-oss's published experts are MXFP4 (u8 blocks and scales): dequantized here, exactly,
    // before the weights' types are checked.
    crate::model::hf::gpt_oss::dequantize_mxfp4(&mut tensors).with_context(|| dir.to_string())?;
    for (name, tensor) in &tensors {
        check_weight(shard_of.get(name).unwrap_or(dir), name, tensor)?;
    }
    Ok(tensors)
}

/// The shard files `model.safetensors.index.json` names, each checked to be a file of the
/// checkpoint folder (`folder::outside`).
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
        let plain = "the index names shards by plain file names such as model-00001-of-00002.safetensors";
        if let Some(why) = folder::outside(dir, name, plain) {
            return Err(bad(&why));
        }
        files.push(name.to_string());
    }
    files.sort();
    files.dedup();
    Ok(files)
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

fn element_type(dtype: &str) -> Result<DType> {
    match dtype {
        "float32" => Ok(DType::F32),
        "bfloat16" => Ok(DType::BF16),
        "float16" => Ok(DType::F16),
        other => bail!("--dtype {other}: expected float32, bfloat16 or float16"),
    }
}

fn dtype_name(ty: DType) -> &'static str {
    match ty {
        DType::BF16 => "bfloat16",
        DType::F16 => "float16",
        _ => "float32",
    }
}

/// The dtypes of the weights `maxrs convert` reads and writes (those of `--dtype`, narrowest
/// range first); an integer or boolean tensor (a position index, a mask) is no weight to convert
/// as floats.
const WEIGHT_TYPES: [DType; 3] = [DType::F16, DType::BF16, DType::F32];

/// Refuses the tensor `name` of the file at `location` unless it is of a weight dtype.
fn check_weight(location: &Location, name: &str, tensor: &HostTensor) -> Result<()> {
    if !WEIGHT_TYPES.contains(&tensor.ty) {
        bail!(
            "{location}: tensor {name} is {:?} {:?}: maxrs converts weights stored as F16, BF16 or F32",
            to_dtype(tensor.ty),
            tensor.dims
        );
    }
    Ok(())
}

/// Whether `ty` holds `x` as a finite value.
fn holds(ty: DType, x: f64) -> bool {
    convert_float(&HostTensor::from_f64(&[], &[x]), ty).to_f64()[0].is_finite()
}

/// `ty`'s largest finite value.
fn largest(ty: DType) -> f64 {
    match ty {
        DType::BF16 => half::bf16::MAX.to_f64(),
        DType::F16 => half::f16::MAX.to_f64(),
        _ => f32::MAX as f64,
    }
}

/// `tensors` in `ty`: a warning names each tensor holding NaN or infinite values, converted as
/// they are (a diverged run's weights may be converted to be looked at); finite values beyond
/// `ty`'s range are refused, naming the tensor (they would become inf, and the user asked for
/// `ty`: another dtype holds them). Each tensor is dropped once converted, so that the weights
/// are held about once.
fn cast(tensors: BTreeMap<String, HostTensor>, ty: DType) -> Result<BTreeMap<String, HostTensor>> {
    tensors
        .into_iter()
        .map(|(name, t)| {
            let (nan, inf, most) = value_stats(&t);
            if nan + inf > 0 {
                tracing::warn!("{name} holds {nan} NaN and {inf} infinite values, converted as they are");
            }
            if t.ty == ty {
                return Ok((name, t));
            }
            if !holds(ty, most) {
                let wider: Vec<&str> =
                    WEIGHT_TYPES.into_iter().filter(|&w| w != ty && holds(w, most)).map(dtype_name).collect();
                bail!(
                    "converting to {to}: {name} holds values up to {most} in magnitude, beyond {to}'s largest {} \
                     (they would become inf): convert with --dtype {}",
                    largest(ty),
                    wider.join(" or "),
                    to = dtype_name(ty)
                );
            }
            Ok((name, convert_float(&t, ty)))
        })
        .collect()
}

/// A tensor's NaN count, infinite count and largest finite magnitude.
fn value_stats(t: &HostTensor) -> (usize, usize, f64) {
    t.to_f64().into_iter().fold((0, 0, 0.0), |(nan, inf, most), v| match v {
        _ if v.is_nan() => (nan + 1, inf, most),
        _ if v.is_infinite() => (nan, inf + 1, most),
        _ => (nan, inf, most.max(v.abs())),
    })
}

/// The maxrs config of a model: the user's arguments `user` (a config file first, if any) over
/// the model keys `derived` from the source checkpoint, and the decoder it describes.
fn model_config(derived: &[String], user: &[String]) -> Result<(Config, Model)> {
    // A config file may stand anywhere among the arguments; a second one is left to the loader,
    // which names it as an argument that is not `key=value`.
    let file = user.iter().position(|a| !a.contains('='));
    let rest: Vec<String> = user.iter().enumerate().filter(|(i, _)| Some(*i) != file).map(|(_, a)| a.clone()).collect();
    let c = config::load_over(file.map(|i| Path::new(user[i].as_str())), derived, &rest)?;
    let model = Model::from_config(&c)?;
    Ok((c, model))
}

/// The value of `hf_lora_adapter_path=` among `args` (MaxText's key of its conversion script
/// `checkpoint_conversion/to_maxtext.py` at e591f30: a PEFT adapter directory), and the other
/// arguments.
fn adapter_path(args: &[String]) -> Result<(Option<Location>, Vec<String>)> {
    let (adapter, rest): (Vec<&String>, Vec<&String>) =
        args.iter().partition(|a| a.trim_start().starts_with("hf_lora_adapter_path="));
    let path = match adapter.as_slice() {
        [] => None,
        [one] => Some(Location::parse(one.split_once('=').map_or("", |(_, v)| v))?),
        _ => bail!("hf_lora_adapter_path is given {} times; give one PEFT adapter directory", adapter.len()),
    };
    Ok((path, rest.into_iter().cloned().collect()))
}

/// A PEFT adapter directory's `adapter_config.json` and tensors.
fn read_adapter(dir: &Location) -> Result<(Value, BTreeMap<String, HostTensor>)> {
    let location = dir.join(peft::ADAPTER_CONFIG);
    let config: Value = serde_json::from_slice(&storage::read(&location, input::SETTINGS)?)
        .map_err(|e| anyhow!("{location}: not JSON: {e}"))?;
    let weights = dir.join(peft::ADAPTER_WEIGHTS);
    let mut input = storage::open_read(&weights)?;
    let tensors = read_safetensors(&mut input, &weights.to_string())?.tensors;
    for (name, tensor) in &tensors {
        check_weight(&weights, name, tensor)?;
    }
    Ok((config, tensors))
}

/// A Hugging Face checkpoint at `src` -> a maxrs parameters-only checkpoint
/// directory at `dst` (`load_parameters_path=dst`), in `dtype` (default: the source's).
/// `overrides` are maxrs keys such as `scan_layers=false`, and `hf_lora_adapter_path=` a PEFT
/// LoRA adapter of the model, whose adapters the checkpoint then holds too (with the `lora.*`
/// keys that give them, for a LoRA run or decoding).
pub fn from_hf(src: &Location, dst: &Location, dtype: Option<&str>, overrides: &[String]) -> Result<Converted> {
    let (adapter, overrides) = adapter_path(overrides)?;
    let overrides = overrides.as_slice();
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
    let adapter = match adapter {
        Some(dir) => {
            let (adapter_config, adapter_tensors) = read_adapter(&dir)?;
            let (c, base) = model_config(&derived, overrides)?;
            let keys = peft::lora_keys(&adapter_config, &c, &base)
                .with_context(|| dir.join(peft::ADAPTER_CONFIG).to_string())?;
            derived.extend(keys.into_iter().map(|(k, v)| format!("{k}={v}")));
            Some((dir, adapter_tensors))
        }
        None => None,
    };
    let (c, model) = model_config(&derived, overrides)?;
    let mut params = layout::from_hf(&c, &model, &hf_config, &tensors)?;
    if let Some((dir, adapter_tensors)) = &adapter {
        let adapters = peft::from_peft(&c, &model, &hf_config, adapter_tensors).with_context(|| dir.to_string())?;
        params.extend(adapters);
    }
    let params = cast(params, ty)?;
    let snapshot = Snapshot {
        step: None,
        arrays: params.into_iter().map(|(n, t)| (Group::Params.name(&n), t)).collect(),
        model: manifest::model_keys(&c, &model),
        data: None,
    };
    let saved = dir::save(dst, &snapshot)?;
    let model_args = snapshot.model.iter().map(|(k, v)| format!("{k}={}", plain(v))).collect();
    Ok(Converted {
        model_args,
        tensors: snapshot.arrays.len(),
        bytes: saved.bytes,
        files: vec![MANIFEST_FILE.into(), dir::file_name(Group::Params.file_group(), 0, 1)],
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
/// `args`, a config file and/or `key=value`, give the model). A LoRA run's parameters become a
/// PEFT adapter directory (`adapter_config.json`, `adapter_model.safetensors`: the base model
/// is the one the run loaded, frozen), or with `merge_lora` the model with the adapters merged
/// into its weights.
pub fn to_hf(
    src: &Location,
    dst: &Location,
    dtype: Option<&str>,
    max_shard_bytes: u64,
    merge_lora: bool,
    args: &[String],
) -> Result<Converted> {
    let checkpoint = match storage::is_file(&src.join(MANIFEST_FILE))? {
        true => Some(dir::read_manifest(src)?),
        false => None,
    };
    let derived: Vec<String> =
        checkpoint.iter().flat_map(|m| m.model.iter().map(|(k, v)| format!("{k}={}", plain(v)))).collect();
    let (c, model) = model_config(&derived, args)?;
    layout::check_model(&c)?;
    let weight = model.config.weight_dtype;
    let ty = dtype.map(element_type).transpose()?.unwrap_or(weight);
    // Read in the dtypes stored, so that `cast` sees every value before it is narrowed (one
    // array at a time: the wide copy of the whole state is the one read).
    let stored = |name: &str| {
        let array = checkpoint.as_ref()?.arrays.iter().find(|a| a.name == name)?;
        tensor_file::element_type(&array.dtype).filter(|t| WEIGHT_TYPES.contains(t))
    };
    let expected: Vec<Expected> = model
        .param_defs()
        .into_iter()
        .map(|d| {
            let name = Group::Params.name(&d.name);
            Expected { ty: stored(&name).unwrap_or(weight), name, dims: d.shape }
        })
        .collect();
    let params: BTreeMap<String, HostTensor> = if checkpoint.is_some() {
        let loaded = dir::load(src, &expected, &manifest::model_keys(&c, &model), true)?;
        Group::Params.subtree(&loaded.arrays.into_iter().collect()).into_iter().collect()
    } else {
        let mut input = storage::open_read(src)?;
        let file = read_safetensors(&mut input, &src.to_string())?;
        let mut tensors = file.tensors;
        let mut params = BTreeMap::new();
        for (e, def) in expected.iter().zip(model.param_defs()) {
            let name = &def.name;
            let t = tensors
                .remove(name)
                .ok_or_else(|| anyhow!("{src}: no tensor {name} ({})", shape_string(e.ty, &e.dims)))?;
            if t.dims != e.dims {
                bail!("{src}: tensor {name} is {}, the model has {}", t.shape_string(), shape_string(e.ty, &e.dims));
            }
            check_weight(src, name, &t)?;
            params.insert(name.to_string(), t);
        }
        if let Some(extra) = tensors.keys().next() {
            bail!("{src}: tensor {extra} is not a parameter of the model ({} such)", tensors.len());
        }
        params
    };
    let model_args = manifest::model_keys(&c, &model).iter().map(|(k, v)| format!("{k}={}", plain(v))).collect();
    let params = match (model.config.lora.is_some(), merge_lora) {
        (true, false) => {
            let (tensors, config) = peft::to_peft(&c, &model, &params, ty)?;
            let files = [peft::ADAPTER_WEIGHTS.to_string(), peft::ADAPTER_CONFIG.to_string()];
            StagedDir::write_whole(dst, peft::ADAPTER_CONFIG, |dir| {
                let mut out = storage::create(&dir.join(peft::ADAPTER_WEIGHTS))?;
                let metadata = BTreeMap::from([("format".to_string(), "pt".to_string())]);
                let refs: Vec<(&str, &HostTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
                write_safetensors(&mut out, &refs, &metadata)?;
                out.finish()?;
                storage::write(&dir.join(peft::ADAPTER_CONFIG), serde_json::to_string_pretty(&config)?.as_bytes())
            })?;
            let bytes = tensors.values().map(|t| t.data.len() as u64).sum();
            return Ok(Converted { model_args, tensors: tensors.len(), bytes, files: files.to_vec() });
        }
        (true, true) => peft::merged(&model, params)?,
        (false, true) => bail!("--merge-lora: {src} holds no LoRA adapters (its run had no lora.enable_lora)"),
        (false, false) => params,
    };
    let params = cast(params, ty)?;
    let tensors = layout::to_hf(&c, &model, &params, ty)?;
    let hf_config = layout::hf_config(&c, &model, dtype_name(ty));
    // config.json, written last, is what marks a gs:// directory complete.
    let (_, files) = StagedDir::write_whole(dst, CONFIG_FILE, |dir| write(dir, &hf_config, &tensors, max_shard_bytes))?;
    let bytes = tensors.values().map(|t| t.data.len() as u64).sum();
    Ok(Converted { model_args, tensors: tensors.len(), bytes, files })
}
