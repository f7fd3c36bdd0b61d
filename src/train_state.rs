//! The train state's schema: every array a training run carries from one step to the next,
//! declared once. The SPMD step, the pipelined step, eval, checkpoints, parameter loading and
//! decode all take their names, dtypes, shardings and roles from here, so a new piece of state
//! is one [`Group`] and one line in [`TrainState::of`].
//!
//! An array's name is its group's prefix and its key: `params.<parameter>`,
//! `opt_state.mu.<parameter>`, `opt_state.nu.<parameter>`, `opt_state.count`, `fp8.<product>.<name>`,
//! and with DPO's reference model `reference.<parameter>`.
//! These are also the names in checkpoints (`checkpoint::manifest`), AOT headers and the
//! programs' signatures.

use std::collections::BTreeSet;

use crate::ir::DType;
use crate::model::{Model, ParamDef, ParamInit};
use crate::sharding::{LogicalRules, Mesh, PartitionSpec};
use crate::tensor::{Tensor, Tree};

/// The kinds of train-state arrays.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Group {
    /// The model's parameters (`Model::param_defs`), in `weight_dtype`.
    Params,
    /// AdamW's first moments, one per parameter, like it.
    Mu,
    /// AdamW's second moments, one per parameter, like it.
    Nu,
    /// AdamW's step count: one s32 scalar.
    Count,
    /// The delayed-scaling state of `quantization=fp8` (`Model::fp8_state_defs`, f32): the
    /// step's new values are its "gradients" (`model::fp8`), which bypass the optimizer.
    Fp8,
    /// DPO's reference model (`train::dpo`): a frozen copy of the starting parameters, never
    /// updated and without optimizer state, saved with checkpoints so that a resumed run
    /// compares with the same model.
    Reference,
}

/// The prefix of the optimizer's groups: the first part of a name is what checkpoints keep in
/// one file group (`params`, `opt_state`, `fp8`).
const OPT_STATE: &str = "opt_state";

impl Group {
    /// Every group, in the order of [`TrainState::of`].
    pub const ALL: [Group; 6] = [Group::Params, Group::Mu, Group::Nu, Group::Count, Group::Fp8, Group::Reference];

    /// The groups that hold one array per parameter, with its shape and sharding.
    pub const PER_PARAMETER: [Group; 3] = [Group::Params, Group::Mu, Group::Nu];

    /// What names of this group start with (for [`Group::Count`], its whole name).
    pub fn prefix(self) -> &'static str {
        match self {
            Group::Params => "params",
            Group::Mu => "opt_state.mu",
            Group::Nu => "opt_state.nu",
            Group::Count => "opt_state.count",
            Group::Fp8 => "fp8",
            Group::Reference => "reference",
        }
    }

    /// The name of the array `key` of this group (`key` is empty for [`Group::Count`]).
    pub fn name(self, key: &str) -> String {
        match key {
            "" => self.prefix().to_string(),
            _ => format!("{}.{key}", self.prefix()),
        }
    }

    /// The group of a train-state name and its key, or `None` for a name that is no state.
    pub fn of(name: &str) -> Option<(Group, &str)> {
        if name == Group::Count.prefix() {
            return Some((Group::Count, ""));
        }
        [Group::Params, Group::Mu, Group::Nu, Group::Fp8, Group::Reference].into_iter().find_map(|g| {
            let key = name.strip_prefix(g.prefix())?.strip_prefix('.')?;
            Some((g, key))
        })
    }

    /// The checkpoint file group an array of this group is saved in (a name's first part).
    pub fn file_group(self) -> &'static str {
        match self {
            Group::Params => "params",
            Group::Mu | Group::Nu | Group::Count => OPT_STATE,
            Group::Fp8 => "fp8",
            Group::Reference => "reference",
        }
    }

    /// Whether the model's forward pass reads the group (eval and decode): the parameters, the
    /// fp8 scales the quantized products use, and DPO's reference model (its eval's loss).
    pub fn read_by_forward(self) -> bool {
        matches!(self, Group::Params | Group::Fp8 | Group::Reference)
    }

    /// This group's arrays of a tree of train-state names, under their keys.
    pub fn subtree<T: Clone>(self, tree: &Tree<T>) -> Tree<T> {
        tree.subtree(self.prefix())
    }

    /// `tree` (keys of this group) under its train-state names.
    pub fn prefixed<T>(self, tree: Tree<T>) -> Tree<T> {
        tree.prefixed(self.prefix())
    }
}

/// One array of the train state.
#[derive(Clone, Debug, PartialEq)]
pub struct StateArray {
    pub group: Group,
    /// Its key (the parameter's or fp8 product's name; empty for the count), shape and logical
    /// axes.
    pub def: ParamDef,
    pub dtype: DType,
}

impl StateArray {
    /// The train-state name.
    pub fn name(&self) -> String {
        self.group.name(&self.def.name)
    }

    /// Its sharding on `mesh`: the logical rules of its axes (the count is replicated).
    pub fn sharding(&self, rules: &LogicalRules, mesh: &Mesh) -> PartitionSpec {
        match self.group {
            Group::Count => PartitionSpec::replicated(),
            _ => rules.spec(&self.def.logical, mesh),
        }
    }
}

/// Every array of a model's train state. Each is donated to the step and comes back as its
/// output under the same name; every one is saved in checkpoints.
#[derive(Clone, Debug)]
pub struct TrainState {
    pub arrays: Vec<StateArray>,
}

impl TrainState {
    /// The state of training `model` with AdamW: parameters and moments in `weight_dtype`, the
    /// count, and the fp8 state the model's quantized products keep.
    pub fn of(model: &Model) -> TrainState {
        TrainState::from_defs(&model.param_defs(), &model.fp8_state_defs(), model.config.weight_dtype)
    }

    /// The state of parameters `params` (in `weight_dtype`) and fp8 state `fp8`: a pipeline
    /// stage's part of a model's, or the whole. Frozen parameters (`ParamDef::frozen`) have no
    /// moments.
    pub fn from_defs(params: &[ParamDef], fp8: &[ParamDef], weight_dtype: DType) -> TrainState {
        let mut arrays = Vec::new();
        for group in Group::PER_PARAMETER {
            let trained = params.iter().filter(|def| group == Group::Params || !def.frozen);
            arrays.extend(trained.map(|def| StateArray { group, def: def.clone(), dtype: weight_dtype }));
        }
        let count = ParamDef::new("", &[], &[], ParamInit::Zeros);
        arrays.push(StateArray { group: Group::Count, def: count, dtype: DType::S32 });
        arrays.extend(fp8.iter().map(|def| StateArray { group: Group::Fp8, def: def.clone(), dtype: DType::F32 }));
        TrainState { arrays }
    }

    /// This state with DPO's reference model: a frozen copy of every parameter
    /// (`reference.<name>`, in `weight_dtype`, sharded as the parameter).
    pub fn with_reference(mut self) -> TrainState {
        let params: Vec<StateArray> = self.group(Group::Params).cloned().collect();
        self.arrays.extend(params.into_iter().map(|a| StateArray { group: Group::Reference, ..a }));
        self
    }

    /// The arrays of `group`.
    pub fn group(&self, group: Group) -> impl Iterator<Item = &StateArray> {
        self.arrays.iter().filter(move |a| a.group == group)
    }

    /// Every train-state name.
    pub fn names(&self) -> Vec<String> {
        self.arrays.iter().map(StateArray::name).collect()
    }

    /// The parameters of `params` (keys of [`Group::Params`]) split into those trained and the
    /// frozen ones.
    pub fn split_frozen<T: Clone>(&self, params: &Tree<T>) -> (Tree<T>, Tree<T>) {
        let frozen: BTreeSet<&str> =
            self.group(Group::Params).filter(|a| a.def.frozen).map(|a| a.def.name.as_str()).collect();
        let (mut trained, mut kept) = (Tree::new(), Tree::new());
        for (name, value) in params.iter() {
            match frozen.contains(name) {
                true => kept.insert(name, value.clone()),
                false => trained.insert(name, value.clone()),
            };
        }
        (trained, kept)
    }
}

/// AdamW's state of a parameter tree: the moments under the parameters' names and the count.
#[derive(Clone, Debug)]
pub struct OptState<T = Tensor> {
    pub mu: Tree<T>,
    pub nu: Tree<T>,
    pub count: T,
}

impl<T: Clone> OptState<T> {
    /// The optimizer state among the arrays of `tree` (train-state names).
    pub fn from_names(tree: &Tree<T>) -> OptState<T> {
        OptState {
            mu: Group::Mu.subtree(tree),
            nu: Group::Nu.subtree(tree),
            count: tree[Group::Count.prefix()].clone(),
        }
    }

    /// The arrays under their train-state names.
    pub fn into_names(self) -> Tree<T> {
        let mut out = Group::Mu.prefixed(self.mu);
        out.extend(Group::Nu.prefixed(self.nu));
        out.with(Group::Count.prefix(), self.count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every group's names parse back to the group and key; names of no group do not parse.
    #[test]
    fn names_round_trip() {
        for group in Group::ALL {
            let key = if group == Group::Count { "" } else { "decoder.layers.mlp.wi_0.kernel" };
            let name = group.name(key);
            assert_eq!(Group::of(&name), Some((group, key)), "{name}");
        }
        assert_eq!(Group::of("opt_state.mu.x"), Some((Group::Mu, "x")));
        for other in ["batch.inputs", "paramsx.y", "opt_state.countx", "grad.w", "opt_state.other.w", "params"] {
            assert_eq!(Group::of(other), None, "{other}");
        }
        assert_eq!(Group::Mu.file_group(), "opt_state");
        assert_eq!(Group::Count.file_group(), "opt_state");
    }
}
