//! A model's parameters in a MaxText Orbax checkpoint, under maxrs's names. MaxText's names are
//! maxrs's already below their root (`decoder/layers/mlp/wi_0/kernel` is maxrs's
//! `params.decoder.layers.mlp.wi_0.kernel`); only the root differs by what wrote the checkpoint
//! (MaxText e591f30):
//! - a train state's item (`load_full_state_path`'s `<step>/items`) and a Linen parameter-only
//!   checkpoint hold them under `params/params/` (`load_params_from_path` in
//!   `src/maxtext/common/checkpointing.py`: the item `params`, Flax's `params` collection in it);
//! - `generate_param_only_checkpoint` with `pure_nnx=true` (MaxText's default) writes NNX state:
//!   each parameter at its bare path with a `value` leaf (`decoder/.../kernel/value`).
//!
//! The one difference in the arrays: a scanned stack's parameters (`decoder.layers.…`,
//! `decoder.dense_layers.…`, `decoder.moe_layers.…`) have their layer axis at MaxText's
//! `param_scan_axis`, 1 by default (`src/maxtext/configs/base.yml` at MaxText e591f30), so
//! `wi_0` is `[emb, layers, mlp]` there; maxrs stacks layers on axis 0 (`model::stacks`,
//! `[layers, emb, mlp]`). [`to_maxrs`] moves the axis; a checkpoint written with another
//! `param_scan_axis` fails the shape check, naming the array and both shapes. Which parameters
//! are stacked the model says ([`stored`]). The values are maxrs's as they are: both keep the
//! queries' `1 / sqrt(head_dim)` where MaxText's family does (`model::blocks::QueryScale`).

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Context, Result};

use super::Checkpoint;
use crate::checkpoint::shards::{Bounds, HostArray};
use crate::files::Location;
use crate::host::{convert_float, shape_string, DType, HostTensor};
use crate::model::{Model, ParamRole};

/// The root of the parameters in a train state or Linen parameter checkpoint.
const LINEN_ROOT: &str = "params/params/";
/// The leaf of each parameter in NNX state.
const NNX_LEAF: &str = "/value";

/// A parameter the model expects: its maxrs key (`decoder.layers.mlp.wi_0.kernel`), type and
/// dimensions, and the blocks of it (in maxrs's layout) this process reads.
pub struct Wanted<'a> {
    pub key: &'a str,
    pub ty: DType,
    pub dims: &'a [i64],
    pub blocks: &'a [Bounds],
}

/// How MaxText stores one of the model's parameters, relative to maxrs's array of it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stored {
    /// Stacked over a stack's layers (`ParamRole::StackedLayers`): MaxText keeps that axis at
    /// its `param_scan_axis`.
    pub stacked: bool,
}

impl Stored {
    /// A parameter stored as maxrs holds it.
    pub const SAME: Stored = Stored { stacked: false };
}

/// Each of `model`'s parameters, by maxrs key, as MaxText stores it.
pub fn stored(model: &Model) -> BTreeMap<String, Stored> {
    let defs = model.param_defs().into_iter();
    defs.map(|d| {
        let stacked = model.param_role(&d.name) == ParamRole::StackedLayers;
        (d.name, Stored { stacked })
    })
    .collect()
}

/// The checkpoint's parameters: maxrs key -> the checkpoint's array name.
pub fn parameter_names(ckpt: &Checkpoint) -> Result<BTreeMap<String, String>> {
    let names: Vec<&str> = ckpt.names().collect();
    let linen: BTreeMap<String, String> =
        names.iter().filter_map(|n| Some((n.strip_prefix(LINEN_ROOT)?.replace('/', "."), n.to_string()))).collect();
    if !linen.is_empty() {
        return Ok(linen);
    }
    let nnx: BTreeMap<String, String> =
        names.iter().filter_map(|n| Some((n.strip_suffix(NNX_LEAF)?.replace('/', "."), n.to_string()))).collect();
    if !nnx.is_empty() && nnx.len() == names.len() {
        return Ok(nnx);
    }
    bail!(
        "{}: no parameters (neither {LINEN_ROOT}... arrays, as a MaxText train state or Linen parameter checkpoint \
         holds them, nor NNX parameters .../value); it holds {}",
        ckpt.location(),
        names.iter().take(4).copied().collect::<Vec<_>>().join(", ")
    )
}

/// The dims maxrs gives the checkpoint's array of `dims` (of a `stacked` parameter or not).
pub(super) fn maxrs_dims(stacked: bool, dims: &[i64]) -> Vec<i64> {
    let mut dims = dims.to_vec();
    if stacked && dims.len() >= 2 {
        dims.swap(0, 1);
    }
    dims
}

/// The checkpoint's array of `stored` dims for an error: with maxrs's `dims` when they differ.
pub(super) fn describe(ty: DType, stored: &[i64], dims: &[i64]) -> String {
    match stored == dims {
        true => shape_string(ty, stored),
        false => format!("{} ({} with the layers first)", shape_string(ty, stored), shape_string(ty, dims)),
    }
}

/// The checkpoint's array of a parameter in maxrs's layout: a `stacked` parameter's layer axis
/// moved from 1 to 0 (`[a, layers, ...]` -> `[layers, a, ...]`).
pub(super) fn to_maxrs(stacked: bool, tensor: HostTensor) -> HostTensor {
    if !stacked || tensor.dims.len() < 2 {
        return tensor;
    }
    let (a, layers) = (tensor.dims[0] as usize, tensor.dims[1] as usize);
    let row = tensor.data.len() / (a * layers).max(1);
    let mut data = vec![0u8; tensor.data.len()];
    for l in 0..layers {
        for i in 0..a {
            let (src, dst) = ((i * layers + l) * row, (l * a + i) * row);
            data[dst..dst + row].copy_from_slice(&tensor.data[src..src + row]);
        }
    }
    HostTensor::new(tensor.ty, &maxrs_dims(true, &tensor.dims), data)
}

/// The blocks `bounds` (in maxrs's layout) of the checkpoint's array `name`, stored as `how`
/// says, read by ranges, each chunk they overlap decoded once: maxrs's block of a stacked array
/// is `[layers, a, ...]`, the checkpoint's `[a, layers, ...]`.
pub(super) fn read_blocks(
    ckpt: &Checkpoint,
    name: &str,
    how: Stored,
    bounds: &[Bounds],
) -> Result<Vec<(Bounds, HostTensor)>> {
    let stored: Vec<(Vec<u64>, Vec<u64>)> = bounds
        .iter()
        .map(|b| {
            let mut start: Vec<u64> = b.iter().map(|r| r.0 as u64).collect();
            let mut shape: Vec<u64> = b.iter().map(|r| r.1 as u64).collect();
            if how.stacked && start.len() >= 2 {
                start.swap(0, 1);
                shape.swap(0, 1);
            }
            (start, shape)
        })
        .collect();
    let read = ckpt.read_blocks(name, &stored)?;
    Ok(bounds.iter().cloned().zip(read.into_iter().map(|block| to_maxrs(how.stacked, block))).collect())
}

/// Reads `wanted` from the Orbax checkpoint at `location` (a step folder or its `items/`): each
/// of the expected shape, float types converted to the expected one (a parameter-only checkpoint
/// is bfloat16), as `stored` says MaxText holds it, keyed by maxrs key. Of each parameter only
/// its wanted blocks are read, by ranges (as `load_full_state_path` reads a state,
/// [`super::state::load`]).
pub fn load(
    location: &Location,
    wanted: &[Wanted],
    stored: &BTreeMap<String, Stored>,
) -> Result<BTreeMap<String, HostArray>> {
    let ckpt = Checkpoint::open(location)?;
    let names = parameter_names(&ckpt)?;
    // Every parameter is checked before any is read.
    let mut reads = Vec::new();
    for w in wanted {
        let name = names.get(w.key).ok_or_else(|| {
            anyhow!(
                "{}: no array for the model's parameter {} (a checkpoint of another model? it has {} parameters)",
                ckpt.location(),
                w.key,
                names.len()
            )
        })?;
        let array = ckpt.array(name)?;
        let how = stored.get(w.key).copied().unwrap_or(Stored::SAME);
        let stored: Vec<i64> = array.shape.iter().map(|&d| d as i64).collect();
        let dims = maxrs_dims(how.stacked, &stored);
        if dims != w.dims || !(array.ty == w.ty || (array.ty.is_float() && w.ty.is_float())) {
            bail!(
                "{}: {name} is {} but the model's {} is {}",
                ckpt.location(),
                describe(array.ty, &stored, &dims),
                w.key,
                shape_string(w.ty, w.dims)
            );
        }
        reads.push((w, name, how));
    }
    let read = super::read_in_parallel(&reads, |(w, name, how)| {
        let blocks =
            read_blocks(&ckpt, name, *how, w.blocks).with_context(|| format!("{}: {name}", ckpt.location()))?;
        let blocks = blocks
            .into_iter()
            .map(|(at, block)| (at, if block.ty == w.ty { block } else { convert_float(&block, w.ty) }))
            .collect();
        Ok(HostArray { name: w.key.to_string(), ty: w.ty, dims: w.dims.to_vec(), blocks })
    })?;
    let out: BTreeMap<String, HostArray> = read.into_iter().map(|array| (array.name.clone(), array)).collect();
    let unused: Vec<&String> = names.keys().filter(|k| !wanted.iter().any(|w| w.key == k.as_str())).collect();
    if let Some(first) = unused.first() {
        bail!(
            "{}: {} parameters the model does not have, e.g. {first} (a checkpoint of another model?)",
            ckpt.location(),
            unused.len()
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::tests::fixture;
    use super::*;

    #[test]
    fn the_three_layouts_name_the_same_parameters() {
        for (folder, root) in [
            ("nnx/checkpoints/1", "params/params/"),
            ("linen_params/0/items", "params/params/"),
            ("nnx_params/0/items", ""),
        ] {
            let names = parameter_names(&Checkpoint::open(&fixture(folder)).unwrap()).unwrap();
            assert_eq!(names.len(), 12, "{folder}: {names:?}");
            let leaf = if root.is_empty() { "/value" } else { "" };
            assert_eq!(
                names["decoder.layers.mlp.wi_0.kernel"],
                format!("{root}decoder/layers/mlp/wi_0/kernel{leaf}"),
                "{folder}"
            );
        }
    }

    /// `[a=2, layers=3, 2]` with element value 100 a + 10 layer + last: maxrs's `[3, 2, 2]` has
    /// the same value at `[layer, a, last]`.
    #[test]
    fn the_layer_axis_moves_first() {
        let values: Vec<f32> = (0..12).map(|i| (100 * (i / 6) + 10 * (i / 2 % 3) + i % 2) as f32).collect();
        let moved = to_maxrs(true, HostTensor::from_f32(&[2, 3, 2], &values));
        assert_eq!(moved.dims, [3, 2, 2]);
        let want: Vec<f32> = (0..12).map(|i| (10 * (i / 4) + 100 * (i / 2 % 2) + i % 2) as f32).collect();
        assert_eq!(moved, HostTensor::from_f32(&[3, 2, 2], &want));
        let unstacked = HostTensor::from_f32(&[2, 3, 2], &values);
        assert_eq!(to_maxrs(false, unstacked.clone()), unstacked);
    }

    /// The model says which parameters are stacked (Gemma 3's whole blocks, not its single
    /// remainder module, nor any unscanned layer; Llama's layers).
    #[test]
    fn the_model_says_how_maxtext_stores_each_parameter() {
        let model = |args: &[&str]| {
            let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            Model::from_config(&crate::config::load(None, &args).unwrap()).unwrap()
        };
        let gemma3 = ["model_name=gemma3-4b", "override_model_config=true", "base_num_decoder_layers=8"];
        let scanned = stored(&model(&gemma3));
        let stacked = Stored { stacked: true };
        assert_eq!(scanned["decoder.layers.layers_5.mlp.wo.kernel"], stacked);
        assert_eq!(scanned["decoder.layers_remainder.layers_1.mlp.wo.kernel"], Stored::SAME);
        let unscanned = stored(&model(&[&gemma3[..], &["scan_layers=false"]].concat()));
        assert!(unscanned.values().all(|s| *s == Stored::SAME));
        let llama = stored(&model(&["head_dim=16"]));
        assert_eq!(llama["decoder.layers.self_attention.query.kernel"], stacked);
        assert_eq!(llama["decoder.layers.self_attention.key.kernel"], stacked);
        assert_eq!(llama["token_embedder.embedding"], Stored::SAME);
    }

    /// A process reads only its blocks of a parameter, and each is that part of the whole one:
    /// split over a stacked parameter's layers (axis 1 in the checkpoint) and over its rows.
    #[test]
    fn blocks_read_by_ranges_are_parts_of_the_whole_parameter() {
        let ckpt = Checkpoint::open(&fixture("nnx_params/0/items")).unwrap();
        let name = "decoder/layers/mlp/wi_0/kernel/value";
        let how = Stored { stacked: true };
        let whole = HostArray::whole(name, to_maxrs(true, ckpt.read(name).unwrap()));
        assert_eq!(whole.dims, [3, 16, 32]);
        let parts: Vec<Bounds> =
            vec![vec![(0, 1), (0, 16), (0, 32)], vec![(1, 2), (0, 8), (0, 32)], vec![(1, 2), (8, 8), (0, 32)]];
        let split = read_blocks(&ckpt, name, how, &parts).unwrap();
        assert_eq!(split.iter().map(|(at, _)| at.clone()).collect::<Vec<_>>(), parts);
        for (at, block) in &split {
            assert_eq!(block, &whole.block(at).unwrap(), "{at:?}");
        }
        assert_ne!(split[1].1, split[2].1, "the parts differ");
    }

    #[test]
    fn a_mismatch_names_the_parameter_and_both_shapes() {
        let dims = [3, 16, 33];
        let key = "decoder.layers.mlp.wi_0.kernel";
        let stored = BTreeMap::from([(key.to_string(), Stored { stacked: true })]);
        let whole = [crate::host::whole(&dims)];
        let wanted = [Wanted { key, ty: DType::F32, dims: &dims, blocks: &whole }];
        let e = load(&fixture("nnx_params/0/items"), &wanted, &stored).unwrap_err().to_string();
        assert!(
            e.contains("decoder/layers/mlp/wi_0/kernel/value is bf16[16,3,32] (bf16[3,16,32] with the layers first)"),
            "{e}"
        );
        assert!(e.contains("decoder.layers.mlp.wi_0.kernel is f32[3,16,33]"), "{e}");
        let wanted = [Wanted { key: "decoder.absent", ty: DType::F32, dims: &dims, blocks: &whole }];
        let e = load(&fixture("nnx_params/0/items"), &wanted, &stored).unwrap_err().to_string();
        assert!(e.contains("no array for the model's parameter decoder.absent"), "{e}");
    }
}
