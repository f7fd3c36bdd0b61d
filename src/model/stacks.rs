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
//! | blocks of sub-layers (`LayerNames::PerSubLayer`), either of the above | as above | `layers_{first + size*i + j}.q` for `p = layers_{j}.q` |
//!
//! The last row is Gemma 3's: scanned, MaxText stacks blocks whose sub-layer `j` is the module
//! `layers_<j>` (`Gemma3ScannableBlock`, `src/maxtext/models/gemma3.py:305` at MaxText e591f30);
//! unscanned, it builds one module per layer, `layers_<n>` for `n` in `0..num_decoder_layers`
//! (`src/maxtext/layers/decoders.py:1205,1246` at MaxText e591f30), so no block nor remainder
//! appears in the names.

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
    /// How its layers' parameters are named when they are not stacked.
    pub names: LayerNames,
}

/// How the parameters of a stack's layer are named when the stack is not stacked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerNames {
    /// Layer `i` is the module `decoder.<name>_<i>` (a single stack's one layer: `decoder.<name>`).
    Layer,
    /// Each layer is a block of `size` sub-layers, sub-layer `j`'s parameters named `layers_<j>.*`
    /// in the block; with `scan_layers=false` sub-layer `j` of layer `i` is the module
    /// `decoder.layers_<first + size * i + j>` (MaxText's unscanned per-layer modules; a single
    /// stack keeps `decoder.<name>.layers_<j>.*` when layers are scanned).
    PerSubLayer { size: i64, first: i64 },
}

impl Stack {
    /// `count` layers of `kind` named `name`.
    pub fn new(name: &'static str, count: i64, kind: usize) -> Stack {
        Stack { name, count, kind, single: false, names: LayerNames::Layer }
    }

    /// One module of `kind` named `name`, never stacked.
    pub fn single(name: &'static str, kind: usize) -> Stack {
        Stack { name, count: 1, kind, single: true, names: LayerNames::Layer }
    }

    /// This stack with its layers named per sub-layer when not stacked
    /// (`LayerNames::PerSubLayer`).
    pub fn per_sub_layer(self, size: i64, first: i64) -> Stack {
        Stack { names: LayerNames::PerSubLayer { size, first }, ..self }
    }

    /// Whether its parameters are stacked on a leading `layers` axis.
    pub fn scanned(&self, scan_layers: bool) -> bool {
        scan_layers && !self.single
    }

    /// The prefix of its parameters when stacked (`decoder.<name>`).
    pub fn prefix(&self) -> String {
        format!("decoder.{}", self.name)
    }

    /// The prefix of layer `i`'s parameters when not stacked and named by layer.
    fn layer_prefix(&self, i: i64) -> String {
        match self.single {
            true => self.prefix(),
            false => format!("decoder.{}_{i}", self.name),
        }
    }

    /// The sub-layers' size and first index when the layers are named per sub-layer under
    /// `scan_layers` (`LayerNames::PerSubLayer` and not scanned).
    fn sub_layers(&self, scan_layers: bool) -> Option<(i64, i64)> {
        match self.names {
            LayerNames::PerSubLayer { size, first } if !scan_layers => Some((size, first)),
            _ => None,
        }
    }

    /// The full name of the parameter `own` (one layer's name, as `Family::layer_params` gives
    /// it) of layer `i`, when the stack is not stacked (`!self.scanned(scan_layers)`).
    pub fn layer_param_name(&self, i: i64, own: &str, scan_layers: bool) -> String {
        if let Some((size, first)) = self.sub_layers(scan_layers) {
            let (j, rest) = sub_layer(own)
                .filter(|(j, _)| (0..size).contains(j))
                .unwrap_or_else(|| panic!("{own} is not a parameter of one of {size} sub-layers `layers_<j>.`"));
            return format!("decoder.layers_{}.{rest}", first + size * i + j);
        }
        format!("{}.{own}", self.layer_prefix(i))
    }

    /// Layer `i`'s parameters taken from the model's `params` under the layer's own names, when
    /// the stack is not stacked: what `Family::layer` reads.
    pub fn layer_params(&self, params: &Tree, i: i64, scan_layers: bool) -> Tree {
        let Some((size, first)) = self.sub_layers(scan_layers) else {
            return params.subtree(&self.layer_prefix(i));
        };
        let mut layer = Tree::new();
        for j in 0..size {
            layer.extend(
                params.subtree(&format!("decoder.layers_{}", first + size * i + j)).prefixed(&format!("layers_{j}")),
            );
        }
        layer
    }

    /// The model's parameters `own` (one layer's, under its own names) of layer `i` under their
    /// full names (the inverse of [`Stack::layer_params`]).
    pub fn named_layer_params(&self, own: &Tree, i: i64, scan_layers: bool) -> Tree {
        own.iter().map(|(name, value)| (self.layer_param_name(i, name, scan_layers), value.clone())).collect()
    }

    /// The layer index and the layer's own name of `name` when it is the parameter of one of
    /// this stack's layers not stacked under `scan_layers` (the inverse of
    /// [`Stack::layer_param_name`]).
    pub fn unstacked_layer(&self, name: &str, scan_layers: bool) -> Option<(i64, String)> {
        if self.scanned(scan_layers) {
            return None;
        }
        if let Some((size, first)) = self.sub_layers(scan_layers) {
            let (n, rest) = name.strip_prefix("decoder.layers_")?.split_once('.')?;
            let k = n.parse::<i64>().ok()? - first;
            return (0..size * self.count).contains(&k).then(|| (k / size, format!("layers_{}.{rest}", k % size)));
        }
        if self.single {
            return Some((0, name.strip_prefix(&self.prefix())?.strip_prefix('.')?.to_string()));
        }
        let rest = name.strip_prefix("decoder.")?.strip_prefix(self.name)?.strip_prefix('_')?;
        let (i, rest) = rest.split_once('.')?;
        Some((i.parse().ok()?, rest.to_string()))
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
                    .map(move |i| ParamDef { name: self.layer_param_name(i, &d.name, scan_layers), ..d.clone() })
            })
            .collect()
    }

    /// `d` (one layer's) stacked over this stack's layers, on a leading axis whose logical name
    /// is the stack's (`layers`, DeepSeek's `dense_layers` and `moe_layers`), as MaxText's
    /// `scan_decoder_layers` names it (`metadata_axis_name`, `src/maxtext/layers/decoders.py` at
    /// e591f30); `logical_axis_rules` shard each of them on its own.
    fn stacked(&self, d: &ParamDef) -> ParamDef {
        ParamDef {
            name: format!("{}.{}", self.prefix(), d.name),
            shape: [&[self.count][..], &d.shape].concat(),
            logical: [&[self.name][..], &d.logical].concat(),
            ..d.clone()
        }
    }
}

/// The name of sub-layer `j`'s parameter `rest` within a block, `layers_<j>.<rest>` (how a
/// family names a block's sub-layers; `sub_layer` reads it back).
pub fn sub_layer_name(j: i64) -> impl Fn(&str) -> String {
    move |rest| format!("layers_{j}.{rest}")
}

/// The sub-layer and its own parameter name of a block's parameter `layers_<j>.<rest>`.
fn sub_layer(own: &str) -> Option<(i64, &str)> {
    let (j, rest) = own.strip_prefix("layers_")?.split_once('.')?;
    Some((j.parse().ok()?, rest))
}

/// The parameters `defs` (an unscanned model's) taken from `stacked`, the same model's scanned
/// parameters: layer `i` of a stack is slice `i` of its stacked parameter (a single stack's one
/// layer is its parameter), every other parameter is the same. Behind an optimization barrier
/// the stacked values are computed once; without it XLA fuses the random computation into every
/// layer's slice and compiles it once per layer again.
pub fn unstack_layers(stacked: &Tree, defs: Vec<ParamDef>, stacks: &[Stack]) -> Tree {
    let Some(first) = stacked.values().next() else { return Tree::new() };
    let names: Vec<&str> = stacked.names().collect();
    let fenced = first.trace().bind(Prim::OptimizationBarrier, &stacked.values().collect::<Vec<_>>());
    let stacked: Tree = names.into_iter().zip(fenced).collect();
    defs.into_iter()
        .map(|def| {
            let layer = stacks.iter().find_map(|s| s.unstacked_layer(&def.name, false).map(|(i, own)| (s, i, own)));
            let value = match layer {
                Some((s, _, own)) if s.single => stacked[format!("{}.{own}", s.prefix()).as_str()].clone(),
                Some((s, i, own)) => {
                    stacked[format!("{}.{own}", s.prefix()).as_str()].slice_axis(0, i, i + 1).reshape(&def.shape)
                }
                None => stacked[def.name.as_str()].clone(),
            };
            (def.name, value)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks of 3 sub-layers named per sub-layer unscanned: 2 whole blocks (layers 0..6), then a
    /// single remainder block of 2 (layers 6 and 7); by hand, sub-layer `j` of block `b` is
    /// `layers_<3b+j>`, the remainder's `layers_<6+j>`, and each name reads back to its block.
    #[test]
    fn per_sub_layer_names_invert() {
        let blocks = Stack::new("layers", 2, 0).per_sub_layer(3, 0);
        let remainder = Stack::single("layers_remainder", 1).per_sub_layer(2, 6);
        assert_eq!(blocks.layer_param_name(1, "layers_2.mlp.wo.kernel", false), "decoder.layers_5.mlp.wo.kernel");
        assert_eq!(remainder.layer_param_name(0, "layers_1.mlp.wo.kernel", false), "decoder.layers_7.mlp.wo.kernel");
        // Scanned, the remainder is the one module `layers_remainder`.
        let scanned = remainder.layer_param_name(0, "layers_1.mlp.wo.kernel", true);
        assert_eq!(scanned, "decoder.layers_remainder.layers_1.mlp.wo.kernel");
        assert_eq!(remainder.unstacked_layer(&scanned, true), Some((0, "layers_1.mlp.wo.kernel".into())));
        let read = |s: &Stack, n: &str| s.unstacked_layer(n, false);
        assert_eq!(read(&blocks, "decoder.layers_5.mlp.wo.kernel"), Some((1, "layers_2.mlp.wo.kernel".into())));
        assert_eq!(read(&blocks, "decoder.layers_6.mlp.wo.kernel"), None);
        assert_eq!(read(&remainder, "decoder.layers_6.mlp.wo.kernel"), Some((0, "layers_0.mlp.wo.kernel".into())));
        assert_eq!(read(&remainder, "decoder.layers_5.mlp.wo.kernel"), None);
        assert_eq!(blocks.unstacked_layer("decoder.layers.layers_2.mlp.wo.kernel", true), None);
    }
}
