//! LoRA adapters in Hugging Face PEFT's format (peft 0.21: `adapter_config.json` with
//! `peft_type: LORA`, `r`, `lora_alpha`, `target_modules`; `adapter_model.safetensors` with
//! `base_model.model.<module>.lora_A.weight: [r, in]` and `.lora_B.weight: [out, r]`, the
//! product scaled by `lora_alpha / r`, as maxrs's `lora_alpha / lora_rank`).
//!
//! An adapted maxrs kernel is a Hugging Face linear weight (an [`Entry`] with
//! `Map::linear_in_dims`), so its adapters follow the kernel's map: `lora_a` `[in, r]` is
//! `lora_A` transposed; `lora_b` `[r, out]` is `lora_B` mapped as the kernel's output side is
//! (transposed, its rows reordered per head and its values scaled as the kernel's are), since
//! the map is linear in the output rows: `map(B @ A) = map_out(B) @ A`.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{anyhow, bail, Result};
use regex::Regex;
use serde_json::{json, Value};

use super::{entries, slot_range, slot_slice, to_hf_tensor, to_maxrs, Entry, Map};
use crate::config::Config;
use crate::host::{DType, HostTensor};
use crate::model::Model;

pub const ADAPTER_CONFIG: &str = "adapter_config.json";
pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";
/// What PEFT's `save_pretrained` puts before a module's name (`PeftModel.base_model.model`).
const PREFIX: &str = "base_model.model.";

/// The Hugging Face module of a linear weight entry (`model.layers.0.self_attn.q_proj`).
fn module(e: &Entry) -> &str {
    e.hf.strip_suffix(".weight").unwrap_or(&e.hf)
}

/// Whether the entry is a linear weight that has adapters.
fn is_adapted(model: &Model, e: &Entry) -> bool {
    e.map.linear_in_dims.is_some() && model.is_adapter(&format!("{}_lora_a", e.maxrs))
}

/// The adapters among maxrs parameters `params` (names as `Model::param_defs`) as PEFT's
/// tensors in `ty`, and its `adapter_config.json` (`alpha` is `lora.lora_alpha`).
pub fn to_peft(
    c: &Config,
    model: &Model,
    params: &BTreeMap<String, HostTensor>,
    ty: DType,
) -> Result<(BTreeMap<String, HostTensor>, Value)> {
    let lora = model.config.lora.as_ref().ok_or_else(|| anyhow!("the model has no LoRA adapters"))?;
    let mut out = BTreeMap::new();
    let mut modules = Vec::new();
    let all = entries(c, model, None)?;
    for e in all.iter().filter(|e| is_adapted(model, e)) {
        let get = |suffix: &str| {
            let name = format!("{}_{suffix}", e.maxrs);
            params.get(&name).map(|t| slot_slice(t, &e.slot)).ok_or_else(|| anyhow!("the parameters have no {name}"))
        };
        let a = to_hf_tensor(&get("lora_a")?, Map::linear(1));
        let b = to_hf_tensor(&get("lora_b")?, Map { linear_in_dims: Some(1), ..e.map });
        let cast = |t: HostTensor| if t.ty == ty { t } else { crate::host::convert_float(&t, ty) };
        out.insert(format!("{PREFIX}{}.lora_A.weight", module(e)), cast(a));
        out.insert(format!("{PREFIX}{}.lora_B.weight", module(e)), cast(b));
        modules.push(module(e).to_string());
    }
    let config = json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "target_modules": target_modules(&all, &modules),
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": false,
        "use_rslora": false,
        "use_dora": false,
        "base_model_name_or_path": null,
    });
    Ok((out, config))
}

/// PEFT's `target_modules` for the adapted Hugging Face `modules`: their last names (`q_proj`,
/// ...) when those pick exactly them among the model's linear weights (`all`, its entries), else
/// the full names.
fn target_modules(all: &[Entry], modules: &[String]) -> Vec<String> {
    let short: BTreeSet<&str> = modules.iter().filter_map(|m| m.rsplit('.').next()).collect();
    let picked: BTreeSet<&str> = all
        .iter()
        .filter(|e| e.map.linear_in_dims.is_some() && short.contains(module(e).rsplit('.').next().unwrap_or("")))
        .map(module)
        .collect();
    let wanted: BTreeSet<&str> = modules.iter().map(String::as_str).collect();
    match picked == wanted {
        true => short.into_iter().map(str::to_string).collect(),
        false => modules.to_vec(),
    }
}

/// The maxrs keys (`lora.*`) of a PEFT adapter's `adapter_config.json` for `model` (the base
/// model, without adapters): its rank and alpha, and a `lora.lora_module_path` that matches
/// exactly the projections its `target_modules` name. Refuses what maxrs's LoRA does not model.
pub fn lora_keys(config: &Value, c: &Config, model: &Model) -> Result<Vec<(String, String)>> {
    let field = |name: &str| &config[name];
    if field("peft_type").as_str() != Some("LORA") {
        bail!("`peft_type` is {}: maxrs reads LoRA adapters (\"LORA\")", field("peft_type"));
    }
    let rank =
        field("r").as_i64().filter(|&r| r > 0).ok_or_else(|| anyhow!("`r` is {}: a positive rank", field("r")))?;
    let alpha = field("lora_alpha")
        .as_f64()
        .filter(|&a| a >= 0.0)
        .ok_or_else(|| anyhow!("`lora_alpha` is {}: a number >= 0", field("lora_alpha")))?;
    for (name, what) in [
        ("use_rslora", "rank-stabilized scaling alpha / sqrt(r)"),
        ("use_dora", "DoRA's magnitude vectors"),
        ("fan_in_fan_out", "Conv1D-style [in, out] weights"),
    ] {
        if field(name).as_bool() == Some(true) {
            bail!("`{name}` is true ({what}): not supported yet");
        }
    }
    for name in ["modules_to_save", "layers_to_transform", "layers_pattern"] {
        if !field(name).is_null() {
            bail!(
                "`{name}` is {}: not supported yet (maxrs adapts every layer's matched projections only)",
                field(name)
            );
        }
    }
    for name in ["rank_pattern", "alpha_pattern"] {
        if field(name).as_object().is_some_and(|o| !o.is_empty()) {
            bail!("`{name}` is {}: per-module ranks and alphas are not supported yet", field(name));
        }
    }
    if !matches!(field("bias").as_str(), None | Some("none")) {
        bail!("`bias` is {}: trained biases are not supported yet (\"none\")", field("bias"));
    }
    let matches: Box<dyn Fn(&str) -> bool> = match field("target_modules") {
        Value::String(pattern) => {
            let regex = Regex::new(&format!("^(?:{pattern})$"))
                .map_err(|e| anyhow!("`target_modules` {pattern:?} is not a regular expression: {e}"))?;
            Box::new(move |m| regex.is_match(m))
        }
        Value::Array(names) => {
            let names: Vec<String> = names.iter().filter_map(|n| n.as_str().map(str::to_string)).collect();
            Box::new(move |m| names.iter().any(|n| m == n || m.ends_with(&format!(".{n}"))))
        }
        other => bail!("`target_modules` is {other}: a list of module names or a regular expression"),
    };
    let dense: BTreeSet<String> =
        model.param_defs().into_iter().filter(|d| d.dense.is_some()).map(|d| d.name).collect();
    let mut paths: Vec<String> = Vec::new();
    for e in entries(c, model, None)? {
        if !matches(module(&e)) {
            continue;
        }
        let Some(kernel) = e.maxrs.strip_suffix(".kernel").filter(|_| e.map.linear_in_dims.is_some()) else {
            bail!("`target_modules` names {}: LoRA on it is not supported yet (only linear projections)", module(&e));
        };
        if !dense.contains(&e.maxrs) {
            bail!("`target_modules` names {} ({}): LoRA on it is not supported yet", module(&e), e.maxrs);
        }
        let path = regex::escape(&kernel.replace('.', "/"));
        if !paths.contains(&path) {
            paths.push(path);
        }
    }
    if paths.is_empty() {
        bail!("`target_modules` {} names no linear projection of this model", field("target_modules"));
    }
    Ok(vec![
        ("lora.enable_lora".into(), "true".into()),
        ("lora.lora_rank".into(), rank.to_string()),
        ("lora.lora_alpha".into(), alpha.to_string()),
        ("lora.lora_module_path".into(), paths.join("|")),
    ])
}

/// maxrs's adapter parameters (names as `Model::param_defs`) from PEFT's tensors; each adapter
/// must be there with its shape, and none may be left over.
pub fn from_peft(
    c: &Config,
    model: &Model,
    hf_config: &Value,
    tensors: &BTreeMap<String, HostTensor>,
) -> Result<BTreeMap<String, HostTensor>> {
    let defs: BTreeMap<String, Vec<i64>> = model.param_defs().into_iter().map(|d| (d.name, d.shape)).collect();
    let mut out: BTreeMap<String, HostTensor> = BTreeMap::new();
    let mut used = BTreeSet::new();
    let mut problems = Vec::new();
    for e in entries(c, model, Some(hf_config))?.into_iter().filter(|e| is_adapted(model, e)) {
        for (suffix, peft, map) in
            [("lora_a", "lora_A", Map::linear(1)), ("lora_b", "lora_B", Map { linear_in_dims: Some(1), ..e.map })]
        {
            let (name, key) = (format!("{}_{suffix}", e.maxrs), format!("{PREFIX}{}.{peft}.weight", module(&e)));
            let full = &defs[&name];
            let shape = &full[e.slot.len()..];
            let Some(t) = tensors.get(&key) else {
                problems.push(format!("missing {key}"));
                continue;
            };
            used.insert(key.clone());
            let Some(converted) = to_maxrs(t, map, shape) else {
                problems.push(format!("{key} is {}, expected the transpose of {name} {shape:?}", t.shape_string()));
                continue;
            };
            let whole = out.entry(name).or_insert_with(|| HostTensor::zeros(converted.ty, full));
            let (at, len) = slot_range(full, &e.slot, whole.ty.byte_size());
            whole.data[at..at + len].copy_from_slice(&converted.data);
        }
    }
    let extra: Vec<&str> = tensors.keys().map(String::as_str).filter(|k| !used.contains(*k)).collect();
    if !extra.is_empty() {
        problems.push(format!("tensors no adapted projection has: {}", extra.join(", ")));
    }
    if !problems.is_empty() {
        bail!("the PEFT adapter does not match the model:\n  {}", problems.join("\n  "));
    }
    Ok(out)
}

/// `params` with every adapter pair folded into its kernel, `W + A @ B * alpha / r` in f64
/// (per stacked slot), and the adapters removed: the parameters of the merged model.
pub fn merged(model: &Model, mut params: BTreeMap<String, HostTensor>) -> Result<BTreeMap<String, HostTensor>> {
    let lora = model.config.lora.as_ref().ok_or_else(|| anyhow!("the model has no LoRA adapters"))?;
    let kernels: Vec<String> = params.keys().filter_map(|n| n.strip_suffix("_lora_a")).map(str::to_string).collect();
    for kernel in kernels {
        let take = |params: &mut BTreeMap<String, HostTensor>, name: String| {
            params.remove(&name).ok_or_else(|| anyhow!("the parameters have no {name}"))
        };
        let a = take(&mut params, format!("{kernel}_lora_a"))?;
        let b = take(&mut params, format!("{kernel}_lora_b"))?;
        let w = params.get_mut(&kernel).ok_or_else(|| anyhow!("the parameters have no {kernel}"))?;
        // Per stacked slot: A is [n_in, r], B [r, n_out], the kernel [n_in, n_out] flattened.
        let dim = |t: &HostTensor, from_end: usize| t.dims[t.dims.len() - from_end] as usize;
        let (n_in, r, n_out) = (dim(&a, 2), dim(&a, 1), dim(&b, 1));
        let (av, bv, mut wv) = (a.to_f64(), b.to_f64(), w.to_f64());
        for (s, block) in wv.chunks_mut(n_in * n_out).enumerate() {
            let (a, b) = (&av[s * n_in * r..(s + 1) * n_in * r], &bv[s * r * n_out..(s + 1) * r * n_out]);
            for i in 0..n_in {
                for k in 0..r {
                    let aik = a[i * r + k] * lora.scale();
                    for j in 0..n_out {
                        block[i * n_out + j] += aik * b[k * n_out + j];
                    }
                }
            }
        }
        *w = crate::host::convert_float(&HostTensor::from_f64(&w.dims, &wv), w.ty);
    }
    Ok(params)
}
