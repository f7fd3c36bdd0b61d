//! Hugging Face checkpoint layouts (`maxrs convert`): for each family maxrs trains, its
//! `config.json` fields <-> maxrs keys, and its tensors <-> maxrs parameters. The files are read
//! and written by `checkpoint::hf`; this module owns the mapping.
//!
//! A family file ([`llama`]: Llama 2/3/3.1/3.3, Mistral, Mixtral, Qwen2, Qwen3, Qwen3 MoE; [`gemma`]:
//! Gemma, Gemma 2; [`gemma3`]: Gemma 3; [`gemma4`]: Gemma 4's text model; [`deepseek`]: DeepSeek-V3;
//! [`olmo3`]: OLMo 3; [`gpt_oss`]: gpt-oss; [`llama4`]: Llama 4's text model)
//! lists one [`Entry`] per Hugging Face tensor: the maxrs parameter it becomes, its index on the
//! parameter's stacked leading axes (`[layer]` with `scan_layers=true`, `[expert]` in a Mixtral
//! layer, both), and the [`Map`] between the two. Every map is exact in both directions except
//! the value maps (Gemma's `1 + scale` norms, a folded scale), which are computed in f64 and
//! rounded once to the weight dtype.

pub mod deepseek;
pub mod gemma;
pub mod gemma3;
pub mod gemma4;
pub mod gpt_oss;
pub mod llama;
pub mod llama4;
pub mod olmo3;
pub mod peft;

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Result};
use serde_json::Value;

use super::Model;
use crate::config::{self, Config, DecoderBlock};
use crate::host::{DType, HostTensor};

/// How a Hugging Face tensor becomes a maxrs parameter (read `from_hf`; `to_hf` inverts it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Map {
    /// A Hugging Face linear weight `[out, in]`: maxrs's kernel is `[in..., out...]` with this
    /// many leading `in` dimensions (a transpose plus a reshape). `None`: same layout.
    pub linear_in_dims: Option<usize>,
    /// Reorders the `out` rows of each `head_dim`-sized head from Hugging Face's `rotate_half`
    /// RoPE order (element `i` pairs with `i + D/2`) to interleaved pairs `(2i, 2i + 1)` (maxrs's
    /// Llama 3.1 RoPE), as `permute` in `transformers`' `convert_llama_weights_to_hf.py` undone.
    pub interleave_heads: Option<i64>,
    /// maxrs's value from Hugging Face's.
    pub value: Revalue,
    /// Hugging Face's tensor is maxrs's flattened to one dimension (a linear's bias `[H*D]`,
    /// maxrs's `[H, D]`): the same elements in the same order.
    pub flat: bool,
    /// maxrs's tensor is every other element of Hugging Face's last dimension, from this one (0
    /// or 1): two maxrs parameters interleaved in one tensor (gpt-oss's `gate_up_proj`).
    pub pair: Option<usize>,
    /// With `pair`: the two parameters are the first and second halves of Hugging Face's last
    /// dimension (Llama 4's `gate_up_proj`) instead of its even and odd elements.
    pub halves: bool,
}

/// An elementwise change of value between the two layouts (`Map::value`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Revalue {
    Same,
    /// maxrs = hf + 1 (Gemma's RMSNorms multiply by `1 + weight` in Hugging Face's layout).
    PlusOne,
    /// maxrs = hf * factor.
    Scale(f64),
    /// maxrs = (hf + 1) * factor (a Gemma norm gain with a scale folded in).
    PlusOneTimes(f64),
}

impl Map {
    pub const COPY: Map = Map {
        linear_in_dims: None,
        interleave_heads: None,
        value: Revalue::Same,
        flat: false,
        pair: None,
        halves: false,
    };

    /// Elements `half, half + 2, ...` of Hugging Face's last dimension.
    pub const fn pair(half: usize) -> Map {
        Map { pair: Some(half), ..Map::COPY }
    }

    /// The first (0) or second (1) half of Hugging Face's last dimension.
    pub const fn half(half: usize) -> Map {
        Map { pair: Some(half), halves: true, ..Map::COPY }
    }

    /// A bias `[out]` in Hugging Face's layout for maxrs's `[out...]` (Qwen2's q/k/v biases).
    pub const FLAT: Map = Map { flat: true, ..Map::COPY };

    pub const fn linear(in_dims: usize) -> Map {
        Map { linear_in_dims: Some(in_dims), ..Map::COPY }
    }

    pub const fn value(value: Revalue) -> Map {
        Map { value, ..Map::COPY }
    }
}

/// One Hugging Face tensor and the maxrs parameter (slice) it is.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The maxrs parameter's full name (as `Model::param_defs`).
    pub maxrs: String,
    /// Index on the parameter's leading stacked axes (empty: the whole parameter).
    pub slot: Vec<i64>,
    pub hf: String,
    pub map: Map,
}

/// The name of a layer parameter `name` of layer `layer` (counted over the model's stacks, as
/// `Model::stacks` orders them), and its slot, as `scan_layers` lays it out; `inner` is a further
/// slot (the expert) after the layer's.
pub fn layer_entry(model: &Model, layer: i64, name: &str, inner: &[i64], hf: String, map: Map) -> Entry {
    let mut first = 0;
    for s in model.stacks() {
        let i = layer - first;
        first += s.count;
        if i >= s.count {
            continue;
        }
        return match s.scanned(model.config.scan_layers) {
            true => Entry { maxrs: format!("{}.{name}", s.prefix()), slot: [&[i][..], inner].concat(), hf, map },
            false => {
                Entry { maxrs: s.layer_param_name(i, name, model.config.scan_layers), slot: inner.to_vec(), hf, map }
            }
        };
    }
    panic!("layer {layer} of a model of {first} layers")
}

/// maxrs configuration keys (`key=value` text) for a Hugging Face `config.json`: the family is
/// `model_type`'s; refuses what maxrs does not model, naming the field (the caller names the file).
pub fn config_from_hf(hf: &Value) -> Result<Vec<(String, String)>> {
    match hf["model_type"].as_str() {
        Some("llama" | "mistral" | "mixtral" | "qwen2" | "qwen3" | "qwen3_moe") => llama::config_from_hf(hf),
        Some("gemma" | "gemma2") => gemma::config_from_hf(hf),
        Some("gemma3_text") => gemma3::config_from_hf(hf),
        Some("gemma4_text" | "gemma4") => gemma4::config_from_hf(hf),
        Some("deepseek_v3") => deepseek::config_from_hf(hf),
        Some("olmo3") => olmo3::config_from_hf(hf),
        Some("gpt_oss") => gpt_oss::config_from_hf(hf),
        Some("llama4_text") => llama4::config_from_hf(hf),
        Some("llama4") => bail!(
            "`model_type` is \"llama4\" (Llama4ForConditionalGeneration, text and vision): not supported yet; maxrs converts Llama 4's text model, \"llama4_text\" (Llama4ForCausalLM)"
        ),
        _ => bail!(
            "`model_type` is {}; maxrs converts \"llama\" (Llama 2, 3, 3.1, 3.3), \"mistral\", \"mixtral\", \"qwen2\", \"qwen3\", \"qwen3_moe\", \"gemma\", \"gemma2\", \"gemma3_text\", \"gemma4_text\" (or \"gemma4\"'s language model), \"deepseek_v3\", \"olmo3\", \"gpt_oss\", \"llama4_text\"",
            hf["model_type"]
        ),
    }
}

/// Refuses a model that Hugging Face's classes cannot express.
pub fn check_model(c: &Config) -> Result<()> {
    let gemma = matches!(c.decoder_block, DecoderBlock::Gemma | DecoderBlock::Gemma2 | DecoderBlock::Gemma3);
    match c.decoder_block {
        DecoderBlock::Gpt3 => bail!(
            "decoder_block=gpt3: converting gpt3 to Hugging Face's layout is not supported yet (maxrs converts \
             llama2, mistral, mixtral, qwen2, qwen3, qwen3_moe, gemma, gemma2, gemma3, deepseek, olmo3, gpt_oss, llama4)"
        ),
        // MaxText's qwen3_custom_moe (`models/qwen3_custom.py` at MaxText e591f30) has no
        // Hugging Face model: no transformers class narrows attention's output to a latent.
        DecoderBlock::Qwen3CustomMoe => bail!(
            "decoder_block=qwen3_custom_moe: converting qwen3_custom_moe to Hugging Face's layout is not supported yet \
             (Hugging Face has no such model; maxrs converts llama2, mistral, mixtral, qwen2, qwen3, qwen3_moe, gemma, gemma2, \
             gemma3, deepseek, olmo3, gpt_oss, llama4)"
        ),
        DecoderBlock::Deepseek => deepseek::check_model(c),
        DecoderBlock::Olmo3 => olmo3::check_model(c),
        DecoderBlock::GptOss => gpt_oss::check_model(c),
        DecoderBlock::Llama4 => llama4::check_model(c),
        DecoderBlock::Gemma4 | DecoderBlock::Gemma4Small => gemma4::check_model(c),
        DecoderBlock::Qwen2 if !c.attention_bias => {
            bail!("attention_bias=false: Hugging Face's Qwen2 always has query, key and value biases")
        }
        DecoderBlock::Qwen2 if c.use_qk_norm => bail!("use_qk_norm=true: Hugging Face's Qwen2 has no QK-norm"),
        DecoderBlock::Qwen3 | DecoderBlock::Qwen3Moe if !c.use_qk_norm => {
            bail!("use_qk_norm=false: Hugging Face's Qwen3 always normalizes queries and keys")
        }
        _ if c.logits_via_embedding && c.normalize_embedding_logits != gemma => bail!(
            "normalize_embedding_logits={}: Hugging Face's {} tied logits {} divided by sqrt(emb)",
            c.normalize_embedding_logits,
            c.decoder_block,
            if gemma { "are" } else { "are not" }
        ),
        _ => Ok(()),
    }
}

/// The Hugging Face `config.json` of the model `c` describes, with weights of `torch_dtype`.
pub fn hf_config(c: &Config, model: &Model, torch_dtype: &str) -> Value {
    match c.decoder_block {
        DecoderBlock::Gemma | DecoderBlock::Gemma2 => gemma::hf_config(c, model, torch_dtype),
        DecoderBlock::Gemma3 => gemma3::hf_config(c, model, torch_dtype),
        DecoderBlock::Gemma4 | DecoderBlock::Gemma4Small => gemma4::hf_config(c, model, torch_dtype),
        DecoderBlock::Deepseek => deepseek::hf_config(c, model, torch_dtype),
        DecoderBlock::Olmo3 => olmo3::hf_config(c, model, torch_dtype),
        DecoderBlock::GptOss => gpt_oss::hf_config(c, model, torch_dtype),
        DecoderBlock::Llama4 => llama4::hf_config(c, model, torch_dtype),
        _ => llama::hf_config(c, model, torch_dtype),
    }
}

/// The model's tensors; `hf` is the `config.json` of a checkpoint being read (`from-hf`).
fn entries(c: &Config, model: &Model, hf: Option<&Value>) -> Result<Vec<Entry>> {
    match c.decoder_block {
        DecoderBlock::Gemma | DecoderBlock::Gemma2 => gemma::entries(c, model, hf),
        DecoderBlock::Gemma3 => gemma3::entries(c, model, hf),
        DecoderBlock::Deepseek => Ok(deepseek::entries(c, model)),
        DecoderBlock::Olmo3 => Ok(olmo3::entries(c, model)),
        DecoderBlock::GptOss => Ok(gpt_oss::entries(c, model)),
        DecoderBlock::Llama4 => Ok(llama4::entries(c, model)),
        // Its experts and its scanned layout need more than entries (`gemma4::from_hf`, `to_hf`).
        DecoderBlock::Gemma4 | DecoderBlock::Gemma4Small => {
            bail!("decoder_block={}: its tensors convert through model::hf::gemma4 only", c.decoder_block)
        }
        _ => Ok(llama::entries(c, model)),
    }
}

/// The fields of a Hugging Face `config.json`, each checked as it is read. A missing field and
/// `null` are the same to `transformers` (its config classes default both).
pub struct Fields<'a>(pub &'a Value);

impl Fields<'_> {
    /// Field `name` as a number in the range of the maxrs key `key` it becomes; `absent` when it
    /// is missing or null (`None`: required).
    pub fn value(&self, name: &str, key: &str, absent: Option<f64>) -> Result<f64> {
        let range = config::range(key).expect("a numeric maxrs key");
        let x = match &self.0[name] {
            Value::Null => absent.ok_or_else(|| anyhow!("`{name}` is missing; it must be {range}"))?,
            Value::Number(n) => n.as_f64().unwrap_or(f64::NAN),
            other => bail!("`{name}` is {other}; it must be {range}"),
        };
        if !range.contains(x) || (range.minus_one && x == -1.0) {
            bail!("`{name}` is {}; it must be {range} (maxrs's {key})", self.0[name]);
        }
        Ok(x)
    }

    pub fn number(&self, name: &str, key: &str, absent: Option<i64>) -> Result<i64> {
        Ok(self.value(name, key, absent.map(|a| a as f64))? as i64)
    }

    /// `sliding_window`: null (no window, maxrs's 0) or a positive size.
    pub fn window(&self) -> Result<i64> {
        let value = &self.0["sliding_window"];
        let range = config::Range { min: 1.0, ..config::range("sliding_window_size").expect("a numeric maxrs key") };
        match value.as_f64() {
            _ if value.is_null() => Ok(0),
            Some(x) if range.contains(x) => Ok(x as i64),
            _ => bail!(
                "`sliding_window` is {value}; it must be null (no window) or {range} (maxrs's sliding_window_size)"
            ),
        }
    }

    /// A boolean field; `None` when missing.
    pub fn flag(&self, name: &str) -> Result<Option<bool>> {
        match &self.0[name] {
            Value::Null => Ok(None),
            Value::Bool(b) => Ok(Some(*b)),
            other => bail!("`{name}` is {other}; it must be true or false"),
        }
    }

    /// A string field; `None` when missing.
    pub fn text(&self, name: &str) -> Result<Option<&str>> {
        match &self.0[name] {
            Value::Null => Ok(None),
            Value::String(s) => Ok(Some(s)),
            other => bail!("`{name}` is {other}; it must be a string"),
        }
    }

    /// Refuses a field that must be absent, null, false or 0 (a feature maxrs does not model).
    pub fn absent(&self, name: &str, what: &str) -> Result<()> {
        match &self.0[name] {
            Value::Null | Value::Bool(false) => Ok(()),
            Value::Number(n) if n.as_f64() == Some(0.0) => Ok(()),
            other => bail!("`{name}` is {other} ({what}): not supported yet"),
        }
    }
}

/// `[rows, cols]` row-major -> `[cols, rows]`, any element size.
fn transpose(t: &HostTensor, rows: i64, cols: i64, dims: &[i64]) -> HostTensor {
    let size = t.ty.byte_size();
    let (rows, cols) = (rows as usize, cols as usize);
    let mut data = vec![0u8; t.data.len()];
    for r in 0..rows {
        for c in 0..cols {
            let (from, to) = ((r * cols + c) * size, (c * rows + r) * size);
            data[to..to + size].copy_from_slice(&t.data[from..from + size]);
        }
    }
    HostTensor::new(t.ty, dims, data)
}

/// The rows of `t` (`[rows, ...]`) reordered per head of `d` rows: `to_interleaved` moves row
/// `a * d/2 + i` of a head to `2i + a`; otherwise the inverse.
fn interleave_rows(t: &HostTensor, d: i64, to_interleaved: bool) -> HostTensor {
    let rows = t.dims[0] as usize;
    let row_bytes = t.data.len() / rows;
    let (d, half) = (d as usize, d as usize / 2);
    let mut data = vec![0u8; t.data.len()];
    for r in 0..rows {
        let (head, j) = (r / d, r % d);
        let (a, i) = (j / half, j % half);
        let (split, paired) = (head * d + j, head * d + 2 * i + a);
        let (from, to) = if to_interleaved { (split, paired) } else { (paired, split) };
        data[to * row_bytes..(to + 1) * row_bytes].copy_from_slice(&t.data[from * row_bytes..(from + 1) * row_bytes]);
    }
    HostTensor::new(t.ty, &t.dims, data)
}

/// `value` applied elementwise (`inverse`: undone), in f64, as an f32 tensor.
fn revalue(t: &HostTensor, value: Revalue, inverse: bool) -> HostTensor {
    let f = |x: f64| match (value, inverse) {
        (Revalue::Same, _) => x,
        (Revalue::PlusOne, false) => x + 1.0,
        (Revalue::PlusOne, true) => x - 1.0,
        (Revalue::Scale(s), false) => x * s,
        (Revalue::Scale(s), true) => x / s,
        (Revalue::PlusOneTimes(s), false) => (x + 1.0) * s,
        (Revalue::PlusOneTimes(s), true) => x / s - 1.0,
    };
    let values: Vec<f32> = t.to_f64().into_iter().map(|x| f(x) as f32).collect();
    HostTensor::from_f32(&t.dims, &values)
}

/// One Hugging Face tensor as the maxrs slice of `shape` (`None`: its shape does not fit).
fn to_maxrs(t: &HostTensor, map: Map, shape: &[i64]) -> Option<HostTensor> {
    let mut t = match map.value {
        Revalue::Same => t.clone(),
        value => revalue(t, value, false),
    };
    if let Some(half) = map.pair {
        let (last, lead) = (shape.len() - 1, &shape[..shape.len() - 1]);
        if t.dims[..t.dims.len() - 1] != *lead || t.dims[last] != 2 * shape[last] {
            return None;
        }
        return Some(unpair(&t, half, map.halves, shape));
    }
    match map.linear_in_dims {
        None if map.flat => (t.dims == [shape.iter().product::<i64>()]).then(|| HostTensor::new(t.ty, shape, t.data)),
        None => (t.dims == shape).then_some(t),
        Some(k) => {
            let (inner, outer): (i64, i64) = (shape[..k].iter().product(), shape[k..].iter().product());
            if t.dims != [outer, inner] {
                return None;
            }
            if let Some(d) = map.interleave_heads {
                t = interleave_rows(&t, d, true);
            }
            Some(transpose(&t, outer, inner, shape))
        }
    }
}

/// Elements `half, half + 2, ...` of the last dimension of `t` (with `halves`: its half `half`), as
/// `shape`.
fn unpair(t: &HostTensor, half: usize, halves: bool, shape: &[i64]) -> HostTensor {
    let size = t.ty.byte_size();
    let n = *shape.last().expect("a tensor with dimensions") as usize;
    let rows = t.data.len() / (2 * n * size);
    let mut data = Vec::with_capacity(rows * n * size);
    for r in 0..rows {
        for i in 0..n {
            let at = (r * 2 * n + paired(n, i, half, halves)) * size;
            data.extend_from_slice(&t.data[at..at + size]);
        }
    }
    HostTensor::new(t.ty, shape, data)
}

/// Where element `i` of half `half` is in a row of `2 n`: interleaved, or the halves one after the other.
fn paired(n: usize, i: usize, half: usize, halves: bool) -> usize {
    match halves {
        true => half * n + i,
        false => 2 * i + half,
    }
}

/// `into` (Hugging Face's tensor of two interleaved halves, or none yet) with `t` written as its
/// elements `half, half + 2, ...` of the last dimension (with `halves`: its half `half`): the
/// inverse of `unpair`.
fn pair_into(into: Option<HostTensor>, t: &HostTensor, half: usize, halves: bool) -> HostTensor {
    let size = t.ty.byte_size();
    let mut dims = t.dims.clone();
    let n = *dims.last().expect("a tensor with dimensions") as usize;
    *dims.last_mut().expect("a tensor with dimensions") *= 2;
    let mut out = into.unwrap_or_else(|| HostTensor::zeros(t.ty, &dims));
    for r in 0..t.data.len() / (n * size) {
        for i in 0..n {
            let (from, to) = ((r * n + i) * size, (r * 2 * n + paired(n, i, half, halves)) * size);
            out.data[to..to + size].copy_from_slice(&t.data[from..from + size]);
        }
    }
    out
}

/// One maxrs slice as the Hugging Face tensor (the inverse of `to_maxrs`; for a `pair` map, its
/// half, which `to_hf` interleaves with the other).
fn to_hf_tensor(t: &HostTensor, map: Map) -> HostTensor {
    let mut t = match map.linear_in_dims {
        None if map.flat => HostTensor::new(t.ty, &[t.dims.iter().product::<i64>()], t.data.clone()),
        None => t.clone(),
        Some(k) => {
            let (inner, outer): (i64, i64) = (t.dims[..k].iter().product(), t.dims[k..].iter().product());
            transpose(t, inner, outer, &[outer, inner])
        }
    };
    if let Some(d) = map.interleave_heads {
        t = interleave_rows(&t, d, false);
    }
    match map.value {
        Revalue::Same => t,
        value => revalue(&t, value, true),
    }
}

/// Byte offset and length of `slot` in a tensor of `dims` and element size `size`.
fn slot_range(dims: &[i64], slot: &[i64], size: usize) -> (usize, usize) {
    let inner: i64 = dims[slot.len()..].iter().product();
    let mut index = 0;
    for (i, s) in slot.iter().enumerate() {
        index = index * dims[i] + s;
    }
    let len = inner as usize * size;
    (index as usize * len, len)
}

/// `t`'s `[dims[slot.len()..]]` at `slot` (the whole tensor for an empty slot).
fn slot_slice(t: &HostTensor, slot: &[i64]) -> HostTensor {
    if slot.is_empty() {
        return t.clone();
    }
    let (at, len) = slot_range(&t.dims, slot, t.ty.byte_size());
    HostTensor::new(t.ty, &t.dims[slot.len()..], t.data[at..at + len].to_vec())
}

/// maxrs parameters (names as `Model::param_defs`, no `params.` prefix) from Hugging Face
/// tensors; every expected tensor must be there with its shape, and none may be left over.
/// Tensors a value map changed are f32; the caller casts to the weight dtype.
pub fn from_hf(
    c: &Config,
    model: &Model,
    hf_config: &Value,
    hf: &BTreeMap<String, HostTensor>,
) -> Result<BTreeMap<String, HostTensor>> {
    if matches!(c.decoder_block, DecoderBlock::Gemma4 | DecoderBlock::Gemma4Small) {
        return gemma4::from_hf(c, model, hf);
    }
    convert_from_hf(model, hf, entries(c, model, Some(hf_config))?)
}

/// [`from_hf`] with the model's tensors `entries`.
fn convert_from_hf(
    model: &Model,
    hf: &BTreeMap<String, HostTensor>,
    entries: Vec<Entry>,
) -> Result<BTreeMap<String, HostTensor>> {
    let defs: BTreeMap<String, Vec<i64>> = model.param_defs().into_iter().map(|d| (d.name, d.shape)).collect();
    let mut out: BTreeMap<String, HostTensor> = BTreeMap::new();
    let mut problems = Vec::new();
    for e in &entries {
        let full = &defs[&e.maxrs];
        let shape = &full[e.slot.len()..];
        let Some(t) = hf.get(&e.hf) else {
            problems.push(format!("missing {}", e.hf));
            continue;
        };
        let Some(converted) = to_maxrs(t, e.map, shape) else {
            problems.push(format!(
                "{} is {}, expected {} elements for {} {shape:?}",
                e.hf,
                t.shape_string(),
                shape.iter().product::<i64>(),
                e.maxrs
            ));
            continue;
        };
        if e.slot.is_empty() {
            out.insert(e.maxrs.clone(), converted);
            continue;
        }
        let whole = out.entry(e.maxrs.clone()).or_insert_with(|| HostTensor::zeros(converted.ty, full));
        let (at, len) = slot_range(full, &e.slot, whole.ty.byte_size());
        whole.data[at..at + len].copy_from_slice(&converted.data);
    }
    let known: std::collections::BTreeSet<&str> = entries.iter().map(|e| e.hf.as_str()).collect();
    let extra: Vec<&str> = hf.keys().map(|k| k.as_str()).filter(|k| !known.contains(k)).collect();
    if !extra.is_empty() {
        problems.push(format!("tensors the model does not have: {}", extra.join(", ")));
    }
    if !problems.is_empty() {
        bail!("the Hugging Face checkpoint does not match the model:\n  {}", problems.join("\n  "));
    }
    Ok(out)
}

/// Hugging Face tensors from maxrs parameters (names as `Model::param_defs`), in `ty`.
pub fn to_hf(
    c: &Config,
    model: &Model,
    params: &BTreeMap<String, HostTensor>,
    ty: DType,
) -> Result<BTreeMap<String, HostTensor>> {
    if matches!(c.decoder_block, DecoderBlock::Gemma4 | DecoderBlock::Gemma4Small) {
        return gemma4::to_hf(c, model, params, ty);
    }
    convert_to_hf(params, ty, entries(c, model, None)?)
}

/// [`to_hf`] with the model's tensors `entries`.
fn convert_to_hf(
    params: &BTreeMap<String, HostTensor>,
    ty: DType,
    entries: Vec<Entry>,
) -> Result<BTreeMap<String, HostTensor>> {
    let mut out = BTreeMap::new();
    for e in entries {
        let t = params.get(&e.maxrs).ok_or_else(|| anyhow!("the maxrs parameters have no {}", e.maxrs))?;
        let converted = to_hf_tensor(&slot_slice(t, &e.slot), e.map);
        let converted = if converted.ty == ty { converted } else { crate::host::convert_float(&converted, ty) };
        let converted = match e.map.pair {
            Some(half) => pair_into(out.remove(&e.hf), &converted, half, e.map.halves),
            None => converted,
        };
        out.insert(e.hf, converted);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaving_reorders_each_heads_rows_and_back() {
        // Two heads of 4 rows, one column: Hugging Face's order [x0, x1, y0, y1] per head
        // (x_i pairs with y_i) becomes [x0, y0, x1, y1].
        let t = HostTensor::from_f32(&[8, 1], &[0., 1., 10., 11., 20., 21., 30., 31.]);
        let paired = interleave_rows(&t, 4, true);
        assert_eq!(paired.to_f32(), vec![0., 10., 1., 11., 20., 30., 21., 31.]);
        assert_eq!(interleave_rows(&paired, 4, false).to_f32(), t.to_f32());
    }

    #[test]
    fn slots_index_the_stacked_axes_row_major() {
        // [layers 2, experts 3, 4 elements] of f32: layer 1, expert 2 is the last block.
        assert_eq!(slot_range(&[2, 3, 4], &[1, 2], 4), (5 * 16, 16));
        assert_eq!(slot_range(&[2, 3, 4], &[1], 4), (48, 48));
        assert_eq!(slot_range(&[2, 3, 4], &[], 4), (0, 96));
    }

    /// What a checkpoint has that maxrs does not model is refused naming the field.
    #[test]
    fn unsupported_fields_are_named() {
        let llama = serde_json::json!({
            "model_type": "llama", "hidden_size": 8, "num_attention_heads": 2, "intermediate_size": 16,
            "num_hidden_layers": 2, "vocab_size": 32, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        });
        let keys = config_from_hf(&llama).unwrap();
        assert!(keys.contains(&("rope_type".into(), "llama3.1".into())), "{keys:?}");
        let with = |base: &serde_json::Value, path: &[&str], value: serde_json::Value| {
            let mut c = base.clone();
            let mut at = &mut c;
            for p in &path[..path.len() - 1] {
                at = &mut at[*p];
            }
            at[path[path.len() - 1]] = value;
            config_from_hf(&c).unwrap_err().to_string()
        };
        // Llama 3.2's factor 32, YaRN, a Mixtral with router noise, Gemma 2 with an odd layer count.
        let err = with(&llama, &["rope_scaling", "factor"], serde_json::json!(32.0));
        assert!(err.starts_with("`rope_scaling.factor` is 32.0") && err.contains("not supported yet"), "{err}");
        let err = with(&llama, &["rope_scaling", "rope_type"], serde_json::json!("yarn"));
        assert!(err.starts_with("`rope_scaling.rope_type` is \"yarn\""), "{err}");
        // transformers 5 writes the RoPE settings into `rope_parameters`.
        let mut v5 = llama.clone();
        v5["rope_parameters"] = v5["rope_scaling"].clone();
        v5["rope_parameters"]["rope_theta"] = serde_json::json!(500000.0);
        v5["rope_parameters"]["factor"] = serde_json::json!(16.0);
        assert!(config_from_hf(&v5).unwrap_err().to_string().starts_with("`rope_parameters.factor` is 16.0"));
        let mut mixtral = llama.clone();
        mixtral["model_type"] = "mixtral".into();
        mixtral["num_local_experts"] = 4.into();
        mixtral["num_experts_per_tok"] = 2.into();
        let err = with(&mixtral, &["router_jitter_noise"], serde_json::json!(0.01));
        assert!(err.starts_with("`router_jitter_noise` is 0.01") && err.contains("not supported yet"), "{err}");
        let mut qwen3_moe = mixtral.clone();
        qwen3_moe["model_type"] = "qwen3_moe".into();
        qwen3_moe["rope_scaling"] = serde_json::Value::Null;
        qwen3_moe["num_experts"] = 4.into();
        qwen3_moe["moe_intermediate_size"] = 8.into();
        let keys = config_from_hf(&qwen3_moe).unwrap();
        assert!(keys.contains(&("base_mlp_dim".into(), "8".into())), "experts' width: {keys:?}");
        for (field, value, want) in [
            ("norm_topk_prob", serde_json::json!(false), "`norm_topk_prob` is false"),
            ("mlp_only_layers", serde_json::json!([0]), "`mlp_only_layers` is [0]"),
            ("decoder_sparse_step", serde_json::json!(2), "`decoder_sparse_step` is 2"),
            ("use_sliding_window", serde_json::json!(true), "`use_sliding_window` is true"),
        ] {
            let err = with(&qwen3_moe, &[field], value);
            assert!(err.starts_with(want) && err.contains("not supported yet"), "{err}");
        }
        let mut gemma2 = llama.clone();
        gemma2["model_type"] = "gemma2".into();
        gemma2["rms_norm_eps"] = serde_json::json!(1e-6);
        gemma2["rope_scaling"] = serde_json::Value::Null;
        gemma2["sliding_window"] = 4.into();
        assert!(config_from_hf(&gemma2).is_ok());
        let err = with(&gemma2, &["num_hidden_layers"], serde_json::json!(3));
        assert!(err.starts_with("`num_hidden_layers` is 3"), "{err}");
        let err = with(&gemma2, &["hidden_activation"], serde_json::json!("relu"));
        assert!(err.starts_with("`hidden_activation` is \"relu\""), "{err}");
    }

    #[test]
    fn maps_invert() {
        let t = HostTensor::from_f32(&[4, 2], &[0.5, -1.0, 2.0, 0.25, 3.0, -0.5, 1.5, 0.125]);
        for map in [
            Map { interleave_heads: Some(4), ..Map::linear(1) },
            Map { value: Revalue::Scale(2.0), ..Map::linear(1) },
            Map::value(Revalue::PlusOne),
            Map::value(Revalue::PlusOneTimes(0.5)),
        ] {
            let shape: Vec<i64> = if map.linear_in_dims.is_some() { vec![2, 4] } else { vec![4, 2] };
            let maxrs = to_maxrs(&t, map, &shape).unwrap();
            assert_eq!(to_hf_tensor(&maxrs, map).to_f32(), t.to_f32(), "{map:?}");
        }
        // A linear's maxrs kernel is its transpose.
        let k = to_maxrs(&t, Map::linear(1), &[2, 4]).unwrap();
        assert_eq!(k.to_f32(), vec![0.5, 2.0, 3.0, 1.5, -1.0, 0.25, -0.5, 0.125]);
        // A flat bias is maxrs's [heads, head_dim] in the same order, and nothing else fits it.
        let bias = HostTensor::from_f32(&[8], &t.to_f32());
        let b = to_maxrs(&bias, Map::FLAT, &[4, 2]).unwrap();
        assert_eq!((b.dims.clone(), b.to_f32()), (vec![4, 2], t.to_f32()));
        assert_eq!(to_hf_tensor(&b, Map::FLAT).dims, [8]);
        assert!(to_maxrs(&t, Map::FLAT, &[4, 2]).is_none());
        // A pair takes every other element of the last dimension, and the two halves
        // interleave back into the one tensor.
        let (even, odd) = (to_maxrs(&t, Map::pair(0), &[4, 1]).unwrap(), to_maxrs(&t, Map::pair(1), &[4, 1]).unwrap());
        assert_eq!(even.to_f32(), vec![0.5, 2.0, 3.0, 1.5]);
        assert_eq!(odd.to_f32(), vec![-1.0, 0.25, -0.5, 0.125]);
        let both = pair_into(Some(pair_into(None, &odd, 1, false)), &even, 0, false);
        assert_eq!((both.dims.clone(), both.to_f32()), (t.dims.clone(), t.to_f32()));
        assert!(to_maxrs(&t, Map::pair(0), &[4, 2]).is_none());
        // Halves take the first and second half of the last dimension, and join back.
        let (first, second) =
            (to_maxrs(&t, Map::half(0), &[4, 1]).unwrap(), to_maxrs(&t, Map::half(1), &[4, 1]).unwrap());
        assert_eq!((first.to_f32(), second.to_f32()), (even.to_f32(), odd.to_f32()));
        let wide = HostTensor::from_f32(&[1, 4], &[1.0, 2.0, 3.0, 4.0]);
        let (first, second) =
            (to_maxrs(&wide, Map::half(0), &[1, 2]).unwrap(), to_maxrs(&wide, Map::half(1), &[1, 2]).unwrap());
        assert_eq!((first.to_f32(), second.to_f32()), (vec![1.0, 2.0], vec![3.0, 4.0]));
        let both = pair_into(Some(pair_into(None, &second, 1, true)), &first, 0, true);
        assert_eq!(both.to_f32(), wide.to_f32());
    }
}
