//! Parameter declarations: a `ParamDef` per parameter (full dotted name, shape, logical axis
//! name per dimension, initializer), how they are drawn from a seed, and how they become
//! sharded program inputs, and how unscanned layers take their values from the stacked draws. The shared decoder
//! (`decoder.rs`) assembles the list from the
//! family's per-layer definitions; nothing else derives a model's layout.

use crate::ir::{DType, Signature};
use crate::sharding::LogicalRules;
use crate::tensor::{concatenate, random, Tensor, Tree};

/// How a parameter is initialized.
#[derive(Clone, Debug, PartialEq)]
pub enum ParamInit {
    Ones,
    /// Zeros (biases; GPT-3's LayerNorm scale, applied as `scale + 1`).
    Zeros,
    /// `normal(stddev)`.
    Normal(f64),
    /// `variance_scaling(1.0, "fan_in", "truncated_normal")` with this fan-in: a normal truncated
    /// to ±2 with stddev `sqrt(1 / fan_in) / 0.8796` (MaxText's kernel initializer).
    FanIn(i64),
    /// `variance_scaling(1.0, "fan_in", "normal")`: an untruncated normal with stddev
    /// `sqrt(1 / fan_in)` (MaxText's GPT-3 attention kernels).
    FanInNormal(i64),
    /// `FanIn(fan_in)` divided by `depth_scaling`: a query kernel whose attention has its
    /// `1 / sqrt(head_dim)` folded into the initializer (`blocks::QueryScale::Folded`).
    FanInOver {
        fan_in: i64,
        depth_scaling: f64,
    },
    /// `he_uniform()` (`variance_scaling(2.0, "fan_in", "uniform")`): uniform in `±sqrt(6 /
    /// fan_in)` (a LoRA adapter's `lora_a`, Qwix's `LoraRule.lora_a_initializer`).
    HeUniform(i64),
}

/// A MaxText `DenseGeneral` kernel's dimensions (`blocks::dense`): after any stacking axes, its
/// first `contract` axes are contracted with the input, its last `out` axes are the output's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DenseDims {
    pub contract: usize,
    pub out: usize,
}

/// One parameter: full dotted name, shape, logical axis name per dimension, initializer.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamDef {
    pub name: String,
    pub shape: Vec<i64>,
    pub logical: Vec<&'static str>,
    pub init: ParamInit,
    /// Set for the kernel of a `DenseGeneral` product (`blocks::dense`): what LoRA adapts.
    pub dense: Option<DenseDims>,
    /// Not trained: no gradient, no optimizer state (the base weights under LoRA).
    pub frozen: bool,
}

impl ParamDef {
    pub fn new(name: &str, shape: &[i64], logical: &[&'static str], init: ParamInit) -> ParamDef {
        assert_eq!(shape.len(), logical.len(), "parameter {name}: one logical axis name per dimension");
        ParamDef {
            name: name.to_string(),
            shape: shape.to_vec(),
            logical: logical.to_vec(),
            init,
            dense: None,
            frozen: false,
        }
    }

    /// The kernel of a `DenseGeneral` product that contracts its first `contract` axes
    /// (`blocks::dense` with `axes = contract`).
    pub fn dense_kernel(
        name: &str,
        shape: &[i64],
        logical: &[&'static str],
        init: ParamInit,
        contract: usize,
    ) -> ParamDef {
        let dense = Some(DenseDims { contract, out: shape.len() - contract });
        ParamDef { dense, ..ParamDef::new(name, shape, logical, init) }
    }

    /// Number of elements.
    pub fn size(&self) -> u64 {
        self.shape.iter().map(|&d| d.max(0) as u64).product()
    }
}

/// Declares every parameter of `defs` as an input `{prefix}.{name}` of `sig` (in `dtype`),
/// sharded by `rules` when the signature has a mesh.
pub fn declare(sig: &mut Signature, defs: &[ParamDef], dtype: DType, rules: &LogicalRules, prefix: &str) {
    let mesh = sig.mesh.clone();
    for def in defs {
        let input = sig.input(&format!("{prefix}.{}", def.name), dtype, &def.shape);
        if let Some(mesh) = &mesh {
            input.sharded(rules.spec(&def.logical, mesh));
        }
    }
}

/// Draws every parameter of `defs` from `key` (a `u32[2]` key, e.g. `random::key(ctx, seed)`):
/// parameter `i` uses `fold_in(key, i)`, in `dtype`. Parameters of one shape and initializer
/// (a layer's query, key and value kernels; each of Gemma 3's six sub-layers' kernels) are drawn
/// by one batched draw and sliced apart: the same values, and an init program that does not
/// grow with their number (XLA's compile time follows the program's size: an unscanned Gemma 3's
/// init program compiled in 12 s, one draw per parameter).
pub fn init(defs: &[ParamDef], dtype: DType, key: &Tensor) -> Tree {
    if defs.is_empty() {
        return Tree::default();
    }
    let keys = random::fold_in_each(key, defs.len() as i64);
    let mut values: Vec<Option<Tensor>> = vec![None; defs.len()];
    for (first, members) in same_draws(defs) {
        let def = &defs[first];
        let rows: Vec<Tensor> = members.iter().map(|&i| keys.slice_axis(0, i as i64, i as i64 + 1)).collect();
        let group_keys = concatenate(&rows.iter().collect::<Vec<_>>(), 0);
        let drawn = draw(&def.init, &group_keys, &def.shape).astype(dtype);
        for (row, &i) in members.iter().enumerate() {
            values[i] = Some(drawn.slice_axis(0, row as i64, row as i64 + 1).reshape(&def.shape));
        }
    }
    defs.iter().zip(values).map(|(def, value)| (def.name.clone(), value.expect("every parameter is drawn"))).collect()
}

/// The indices of `defs` grouped by what they are drawn from (shape and initializer), each group
/// with its first index, in the order of first appearance.
fn same_draws(defs: &[ParamDef]) -> Vec<(usize, Vec<usize>)> {
    let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
    for (i, def) in defs.iter().enumerate() {
        match groups.iter_mut().find(|(first, _)| defs[*first].shape == def.shape && defs[*first].init == def.init) {
            Some((_, members)) => members.push(i),
            None => groups.push((i, vec![i])),
        }
    }
    groups
}

/// `init` drawn for each row of `keys: u32[k, 2]`, stacked `[k, ...shape]`, in f32 (or as
/// constants for `Ones` and `Zeros`).
fn draw(init: &ParamInit, keys: &Tensor, shape: &[i64]) -> Tensor {
    let ctx = keys.trace();
    let batched: Vec<i64> = std::iter::once(keys.shape()[0]).chain(shape.iter().copied()).collect();
    match *init {
        ParamInit::Ones => ctx.full(1.0, DType::F32, &batched),
        ParamInit::Zeros => ctx.zeros(DType::F32, &batched),
        ParamInit::Normal(std) => random::normal_each(keys, shape, DType::F32) * std,
        ParamInit::FanIn(fan_in) => fan_in_truncated(keys, fan_in, shape),
        ParamInit::FanInOver { fan_in, depth_scaling } => fan_in_truncated(keys, fan_in, shape) / depth_scaling,
        ParamInit::FanInNormal(fan_in) => random::normal_each(keys, shape, DType::F32) * (1.0 / fan_in as f64).sqrt(),
        ParamInit::HeUniform(fan_in) => {
            let limit = (6.0 / fan_in as f64).sqrt();
            random::uniform_each(keys, shape, DType::F32, -limit, limit)
        }
    }
}

/// `variance_scaling(1.0, "fan_in", "truncated_normal")` of `shape`, in f32, drawn for each row
/// of `keys` (stacked).
fn fan_in_truncated(keys: &Tensor, fan_in: i64, shape: &[i64]) -> Tensor {
    // The stddev of a standard normal truncated to (-2, 2) is 0.8796...
    let std = (1.0 / fan_in as f64).sqrt() / 0.879_625_661_034_239_8;
    random::truncated_normal_each(keys, -2.0, 2.0, shape, DType::F32) * std
}
