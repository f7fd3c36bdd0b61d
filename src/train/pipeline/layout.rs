//! Where everything of a pipelined model lives: which layers each stage runs, in which chunk
//! (virtual stage), and which parameters each stage holds, on which devices.
//!
//! MaxText's layout (`src/maxtext/configs/base.yml`, pipeline comments, at e591f30): the layers
//! form `stages x repeats` groups of `layers_per_stage` consecutive layers; group `g` is chunk
//! `g`, run by stage `g mod stages`, so with several repeats the groups go round the stages.
//! The embedding belongs to the first chunk's stage (stage 0), the final norm and output
//! projection to the last chunk's (stage `stages - 1`).
//!
//! A stage holds each stacked layer parameter (`decoder.layers.*`, `scan_layers`) as one array
//! of its layers in chunk order, `[repeats x layers_per_stage, ...]`: the rows of the full
//! array in "stage-major" order ([`StageLayout::stage_major_order`]). Unscanned layers keep
//! their own names (`decoder.layers_{i}.*`). On the host, [`StageLayout::stage_part`] and
//! [`StageLayout::join`] convert between a stage's arrays and the model's full layout, and
//! [`StageLayout::stage_blocks`] says which blocks of the full layout a stage holds.

use std::ops::Range;

use anyhow::{anyhow, bail, Result};

use crate::checkpoint::shards::{Bounds, HostArray};
use crate::config::PipelinePlan;
use crate::host::{whole, HostTensor};
use crate::model::{Model, ParamDef, ParamRole};
use crate::sharding::Mesh;
use crate::tensor::Tree;

/// The stages and chunks of a pipeline over a model's layers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StageLayout {
    pub stages: usize,
    pub repeats: usize,
    pub layers_per_stage: usize,
}

impl StageLayout {
    pub fn new(plan: &PipelinePlan) -> StageLayout {
        StageLayout { stages: plan.stages, repeats: plan.repeats, layers_per_stage: plan.layers_per_stage }
    }

    /// Chunks (virtual stages) in pipeline order.
    pub fn chunks(&self) -> usize {
        self.stages * self.repeats
    }

    /// The stage that runs chunk `chunk`.
    pub fn stage_of(&self, chunk: usize) -> usize {
        chunk % self.stages
    }

    /// Which of its stage's chunks `chunk` is (its repeat).
    pub fn repeat_of(&self, chunk: usize) -> usize {
        chunk / self.stages
    }

    /// The chunks stage `stage` runs, in order.
    pub fn stage_chunks(&self, stage: usize) -> Vec<usize> {
        (0..self.repeats).map(|r| r * self.stages + stage).collect()
    }

    /// The decoder layers of chunk `chunk`.
    pub fn chunk_layers(&self, chunk: usize) -> Range<i64> {
        let n = self.layers_per_stage as i64;
        chunk as i64 * n..(chunk as i64 + 1) * n
    }

    pub fn is_first(&self, chunk: usize) -> bool {
        chunk == 0
    }

    pub fn is_last(&self, chunk: usize) -> bool {
        chunk + 1 == self.chunks()
    }

    /// The layers in the order the stages hold them: stage 0's layers in chunk order, then
    /// stage 1's, ... (the identity with one repeat).
    pub fn stage_major_order(&self) -> Vec<i64> {
        (0..self.stages).flat_map(|s| self.stage_chunks(s)).flat_map(|chunk| self.chunk_layers(chunk)).collect()
    }

    /// The stage holding layer `layer`, and its row in that stage's stacked arrays.
    fn place_of_layer(&self, layer: i64) -> (usize, i64) {
        let n = self.layers_per_stage as i64;
        let chunk = (layer / n) as usize;
        (self.stage_of(chunk), self.repeat_of(chunk) as i64 * n + layer % n)
    }

    /// The stage that holds parameter `def`, or `None` for stacked layer parameters (every
    /// stage holds its rows).
    fn owner(&self, model: &Model, def: &ParamDef) -> Option<usize> {
        match model.param_role(&def.name) {
            ParamRole::Embedding => Some(0),
            ParamRole::Head => Some(self.stages - 1),
            ParamRole::Layer(i) => Some(self.place_of_layer(i).0),
            ParamRole::StackedLayers => None,
        }
    }

    /// The parameters stage `stage` holds: the model's definitions, stacked ones cut to the
    /// stage's `repeats x layers_per_stage` rows.
    pub fn stage_params(&self, model: &Model, stage: usize) -> Vec<ParamDef> {
        self.stage_defs(model, &model.param_defs(), stage)
    }

    /// The part of `defs` (arrays named and laid out as the model's parameters are: the
    /// parameters, or the fp8 state of their products) stage `stage` holds.
    pub fn stage_defs(&self, model: &Model, defs: &[ParamDef], stage: usize) -> Vec<ParamDef> {
        let rows = (self.repeats * self.layers_per_stage) as i64;
        defs.iter()
            .cloned()
            .filter_map(|def| match self.owner(model, &def) {
                Some(owner) if owner != stage => None,
                Some(_) => Some(def),
                None => {
                    let mut def = def;
                    def.shape[0] = rows;
                    Some(def)
                }
            })
            .collect()
    }

    /// The names of the parameters chunk `chunk` reads: its layers', plus the embedding (first
    /// chunk) or the final norm and output projection (last chunk).
    pub fn chunk_params(&self, model: &Model, chunk: usize) -> Vec<ParamDef> {
        self.chunk_defs(model, &model.param_defs(), chunk)
    }

    /// The part of `defs` (as for [`StageLayout::stage_defs`]) chunk `chunk` reads.
    pub fn chunk_defs(&self, model: &Model, defs: &[ParamDef], chunk: usize) -> Vec<ParamDef> {
        let layers = self.chunk_layers(chunk);
        self.stage_defs(model, defs, self.stage_of(chunk))
            .into_iter()
            .filter(|def| match model.param_role(&def.name) {
                ParamRole::Embedding => self.is_first(chunk),
                ParamRole::Head => self.is_last(chunk),
                ParamRole::Layer(i) => layers.contains(&i),
                ParamRole::StackedLayers => true,
            })
            .collect()
    }

    /// Rows of a stage's stacked arrays that chunk `chunk` uses.
    pub fn chunk_rows(&self, chunk: usize) -> Range<i64> {
        let n = self.layers_per_stage as i64;
        let r = self.repeat_of(chunk) as i64;
        r * n..(r + 1) * n
    }

    /// The devices of stage `stage`: the mesh at that index of its `stage` axis.
    pub fn stage_mesh(&self, mesh: &Mesh, stage: usize) -> Result<Mesh> {
        mesh.slice("stage", stage)
    }

    /// Where stage `stage`'s array of `def` lies in the model's full layout: the whole array on
    /// the stage that owns it (nothing on the others), or for stacked layers one block of rows
    /// per chunk of the stage, in the order of the stage's rows. A stage's array is these blocks
    /// stacked; in a checkpoint they are the blocks its process holds.
    pub fn stage_blocks(&self, model: &Model, def: &ParamDef, stage: usize) -> Vec<Bounds> {
        let all = whole(&def.shape);
        match self.owner(model, def) {
            Some(owner) if owner == stage => vec![all],
            Some(_) => Vec::new(),
            None => self
                .stage_chunks(stage)
                .into_iter()
                .map(|chunk| {
                    let rows = self.chunk_layers(chunk);
                    let mut block = all.clone();
                    block[0] = (rows.start, rows.end - rows.start);
                    block
                })
                .collect(),
        }
    }

    /// Stage `stage`'s arrays of `defs` (as for [`StageLayout::stage_defs`]), cut from the arrays
    /// in the model's full layout that `find` gives (whole, or the blocks a process holds).
    pub fn stage_part<'a>(
        &self,
        model: &Model,
        defs: &[ParamDef],
        stage: usize,
        find: impl Fn(&ParamDef) -> Result<&'a HostArray>,
    ) -> Result<Tree<HostTensor>> {
        let mut out = Tree::new();
        for def in defs {
            let blocks = self.stage_blocks(model, def, stage);
            let array = match blocks.as_slice() {
                [] => continue,
                [only] => find(def)?.block(only)?,
                _ => {
                    let full = find(def)?;
                    concat_rows(&blocks.iter().map(|b| full.block(b)).collect::<Result<Vec<_>>>()?)?
                }
            };
            out.insert(def.name.clone(), array);
        }
        Ok(out)
    }

    /// The model's full layout of `defs` from every stage's arrays (`stages[s]` as
    /// [`StageLayout::split`] gives them).
    pub fn join(&self, model: &Model, defs: &[ParamDef], stages: &[Tree<HostTensor>]) -> Result<Tree<HostTensor>> {
        if stages.len() != self.stages {
            bail!("{} stages' arrays for a pipeline of {}", stages.len(), self.stages);
        }
        let mut out = Tree::new();
        for def in defs {
            let find = |stage: usize| {
                stages[stage].get(&def.name).ok_or_else(|| anyhow!("stage {stage} has no array {}", def.name))
            };
            match self.owner(model, def) {
                Some(owner) => {
                    out.insert(def.name.clone(), find(owner)?.clone());
                }
                None => {
                    let layers = def.shape[0];
                    let rows: Vec<HostTensor> = (0..layers)
                        .map(|layer| {
                            let (stage, row) = self.place_of_layer(layer);
                            slice_rows(find(stage)?, row..row + 1)
                        })
                        .collect::<Result<_>>()?;
                    out.insert(def.name.clone(), concat_rows(&rows)?);
                }
            }
        }
        Ok(out)
    }
}

/// Rows `rows` (of the first dimension) of `t`.
pub fn slice_rows(t: &HostTensor, rows: Range<i64>) -> Result<HostTensor> {
    let total = *t.dims.first().ok_or_else(|| anyhow!("a scalar has no rows"))?;
    if rows.start < 0 || rows.end > total || rows.start > rows.end {
        bail!("rows {rows:?} of {}", t.shape_string());
    }
    let row_bytes = t.data.len() / total.max(1) as usize;
    let mut dims = t.dims.clone();
    dims[0] = rows.end - rows.start;
    let data = t.data[rows.start as usize * row_bytes..rows.end as usize * row_bytes].to_vec();
    Ok(HostTensor::new(t.ty, &dims, data))
}

/// The tensors stacked along their first dimension (same type and trailing dimensions).
pub fn concat_rows(parts: &[HostTensor]) -> Result<HostTensor> {
    let first = parts.first().ok_or_else(|| anyhow!("nothing to concatenate"))?;
    let mut dims = first.dims.clone();
    dims[0] = 0;
    let mut data = Vec::new();
    for p in parts {
        if p.ty != first.ty || p.dims[1..] != first.dims[1..] {
            bail!("cannot stack {} with {}", p.shape_string(), first.shape_string());
        }
        dims[0] += p.dims[0];
        data.extend_from_slice(&p.data);
    }
    Ok(HostTensor::new(first.ty, &dims, data))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(stages: usize, repeats: usize, layers_per_stage: usize) -> StageLayout {
        StageLayout { stages, repeats, layers_per_stage }
    }

    #[test]
    fn chunks_go_round_the_stages() {
        // 8 layers, 4 stages, 2 repeats, 1 layer per stage: MaxText's circular layout.
        let l = layout(4, 2, 1);
        assert_eq!(l.stage_chunks(1), [1, 5]);
        assert_eq!(l.chunk_layers(5), 5..6);
        assert_eq!(l.stage_major_order(), [0, 4, 1, 5, 2, 6, 3, 7]);
        assert_eq!(l.chunk_rows(5), 1..2);
        assert_eq!(l.place_of_layer(6), (2, 1));
        // One repeat: contiguous blocks.
        let l = layout(2, 1, 3);
        assert_eq!(l.stage_major_order(), [0, 1, 2, 3, 4, 5]);
        assert_eq!(l.chunk_layers(1), 3..6);
        assert_eq!(l.place_of_layer(4), (1, 1));
    }

    #[test]
    fn rows_split_and_join() {
        let t = HostTensor::from_i32(&[4, 2], &[0, 1, 2, 3, 4, 5, 6, 7]);
        let parts = [slice_rows(&t, 2..4).unwrap(), slice_rows(&t, 0..2).unwrap()];
        assert_eq!(concat_rows(&parts).unwrap().to_i32(), [4, 5, 6, 7, 0, 1, 2, 3]);
        assert!(slice_rows(&t, 3..5).is_err());
    }
}
