//! The decoder's stacks of layers: a model's layers are an ordered list of stacks (`Stack`),
//! each a run of layers of one kind the family defines, named as MaxText names its parameter
//! trees (`Decoder` in `src/maxtext/layers/decoders.py`, e591f30): `layers` (every family's main
//! stack), `layers_remainder` (Gemma 3's layers after the last whole block of 6, one module
//! without a `layers` axis), `dense_layers` and `moe_layers` (DeepSeek's first dense layers, then
//! the MoE ones). This file owns how a stack's parameters are named and stacked; `run_stacks.rs`
//! runs them.
//!
//! Parameter names of a stack `s` (`decoder.` then, for a layer parameter `p`):
//!
//! | stack | `scan_layers=true` | `scan_layers=false` |
//! |---|---|---|
//! | a stack of layers | `s.p`, `[count, ...]`, logical axes `s, ...` | `s_{i}.p` for layer `i` of the stack |
//! | a single module (`Stack::single`) | `s.p` | `s.p` |

use crate::ir::Prim;
use crate::tensor::Tree;

use super::params::ParamDef;

/// One stack of a decoder's layers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stack {
    /// MaxText's name of its parameter tree under `decoder.`.
    pub name: &'static str,
    /// Its layers (the family's layers: Gemma 2's pairs, Gemma 3's blocks).
    pub count: i64,
    /// The family's kind of layer in it: the argument of `Family::layer_params`, `layer` and
    /// `layer_flops` (a family with one kind of layer has only 0).
    pub kind: usize,
    /// One module whose parameters never have a `layers` axis (MaxText's `layers_remainder`,
    /// applied once outside the scan).
    pub single: bool,
}

impl Stack {
    /// `count` layers of `kind` named `name`.
    pub fn new(name: &'static str, count: i64, kind: usize) -> Stack {
        Stack { name, count, kind, single: false }
    }

    /// One module of `kind` named `name`, never stacked.
    pub fn single(name: &'static str, kind: usize) -> Stack {
        Stack { name, count: 1, kind, single: true }
    }

    /// Whether its parameters are stacked on a leading `layers` axis.
    pub fn scanned(&self, scan_layers: bool) -> bool {
        scan_layers && !self.single
    }

    /// The prefix of its parameters when stacked (`decoder.<name>`).
    pub fn prefix(&self) -> String {
        format!("decoder.{}", self.name)
    }

    /// The prefix of layer `i`'s parameters when not stacked.
    pub fn layer_prefix(&self, i: i64) -> String {
        match self.single {
            true => self.prefix(),
            false => format!("decoder.{}_{i}", self.name),
        }
    }

    /// The model's parameters of this stack, given one layer's `per_layer`: each stacked, or
    /// one per layer (parameter by parameter, layer by layer).
    pub fn param_defs(&self, per_layer: &[ParamDef], scan_layers: bool) -> Vec<ParamDef> {
        if self.scanned(scan_layers) {
            return per_layer.iter().map(|d| self.stacked(d)).collect();
        }
        per_layer
            .iter()
            .flat_map(|d| {
                (0..self.count)
                    .map(move |i| ParamDef { name: format!("{}.{}", self.layer_prefix(i), d.name), ..d.clone() })
            })
            .collect()
    }

    /// `d` (one layer's) stacked over this stack's layers, on a leading axis whose logical name
    /// is the stack's (`layers`, DeepSeek's `dense_layers` and `moe_layers`), as MaxText's
    /// `scan_decoder_layers` names it (`metadata_axis_name`, `src/maxtext/layers/decoders.py` at
    /// e591f30); `logical_axis_rules` shard each of them on its own.
    pub fn stacked(&self, d: &ParamDef) -> ParamDef {
        ParamDef {
            name: format!("{}.{}", self.prefix(), d.name),
            shape: [&[self.count][..], &d.shape].concat(),
            logical: [&[self.name][..], &d.logical].concat(),
            init: d.init.clone(),
        }
    }

    /// The layer index and the layer's own name of `name` when it is an unstacked layer's
    /// parameter (`decoder.<name>_<i>.<rest>`).
    pub(super) fn unstacked_layer<'a>(&self, name: &'a str) -> Option<(i64, &'a str)> {
        if self.single {
            return None;
        }
        let rest = name.strip_prefix("decoder.")?.strip_prefix(self.name)?.strip_prefix('_')?;
        let (i, rest) = rest.split_once('.')?;
        Some((i.parse().ok()?, rest))
    }
}

/// The parameters `defs` (an unscanned model's) taken from `stacked`, the same model's scanned
/// parameters: layer `i` of a stack is slice `i` of its stacked parameter, every other parameter
/// is the same. Behind an optimization barrier the stacked values are computed once; without it
/// XLA fuses the random computation into every layer's slice and compiles it once per layer
/// again.
pub fn unstack_layers(stacked: &Tree, defs: Vec<ParamDef>, stacks: &[Stack]) -> Tree {
    let Some(first) = stacked.values().next() else { return Tree::new() };
    let names: Vec<&str> = stacked.names().collect();
    let fenced = first.trace().bind(Prim::OptimizationBarrier, &stacked.values().collect::<Vec<_>>());
    let stacked: Tree = names.into_iter().zip(fenced).collect();
    defs.into_iter()
        .map(|def| {
            let layer = stacks.iter().find_map(|s| s.unstacked_layer(&def.name).map(|(i, rest)| (s, i, rest)));
            let value = match layer {
                Some((s, i, rest)) => {
                    stacked[format!("{}.{rest}", s.prefix()).as_str()].slice_axis(0, i, i + 1).reshape(&def.shape)
                }
                None => stacked[def.name.as_str()].clone(),
            };
            (def.name, value)
        })
        .collect()
}
