//! Parameter declarations: a `ParamDef` per parameter (full dotted name, shape, logical axis
//! name per dimension, initializer), how they are drawn from a seed, and how they become
//! sharded program inputs, and how unscanned layers take their values from the stacked draws. The shared decoder
//! (`decoder.rs`) assembles the list from the
//! family's per-layer definitions; nothing else derives a model's layout.

use crate::ir::{DType, Signature};
use crate::sharding::LogicalRules;
use crate::tensor::{random, Tensor, Tree};

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
}

/// One parameter: full dotted name, shape, logical axis name per dimension, initializer.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamDef {
    pub name: String,
    pub shape: Vec<i64>,
    pub logical: Vec<&'static str>,
    pub init: ParamInit,
}

impl ParamDef {
    pub fn new(name: &str, shape: &[i64], logical: &[&'static str], init: ParamInit) -> ParamDef {
        assert_eq!(shape.len(), logical.len(), "parameter {name}: one logical axis name per dimension");
        ParamDef { name: name.to_string(), shape: shape.to_vec(), logical: logical.to_vec(), init }
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
/// parameter `i` uses `fold_in(key, i)`, in `dtype`.
pub fn init(defs: &[ParamDef], dtype: DType, key: &Tensor) -> Tree {
    defs.iter()
        .enumerate()
        .map(|(i, def)| {
            let k = random::fold_in(key, i as u32);
            let value = match def.init {
                ParamInit::Ones => key.trace().full(1.0, dtype, &def.shape),
                ParamInit::Zeros => key.trace().zeros(dtype, &def.shape),
                ParamInit::Normal(std) => random::normal(&k, &def.shape, DType::F32) * std,
                ParamInit::FanIn(fan_in) => fan_in_truncated(&k, fan_in, &def.shape),
                ParamInit::FanInOver { fan_in, depth_scaling } => {
                    fan_in_truncated(&k, fan_in, &def.shape) / depth_scaling
                }
                ParamInit::FanInNormal(fan_in) => {
                    random::normal(&k, &def.shape, DType::F32) * (1.0 / fan_in as f64).sqrt()
                }
            };
            (def.name.clone(), value.astype(dtype))
        })
        .collect()
}

/// `variance_scaling(1.0, "fan_in", "truncated_normal")` of `shape`, in f32, drawn from `key`.
fn fan_in_truncated(key: &Tensor, fan_in: i64, shape: &[i64]) -> Tensor {
    // The stddev of a standard normal truncated to (-2, 2) is 0.8796...
    let std = (1.0 / fan_in as f64).sqrt() / 0.879_625_661_034_239_8;
    random::truncated_normal(key, -2.0, 2.0, shape, DType::F32) * std
}
