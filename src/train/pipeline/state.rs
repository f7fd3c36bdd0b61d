//! A pipeline's training state between the stages and the host, in the model's full layout and
//! under the unpipelined step's names (`train_state`: parameters, optimizer state and fp8
//! state), so that a pipelined run's checkpoint restores into an unpipelined run and back.
//!
//! Each stage holds blocks of the full layout ([`super::StageLayout::stage_blocks`]: whole
//! arrays it owns, rows of the stacked layers), so a checkpoint is written as those blocks by
//! the processes that run the stages ([`Pipeline::state_layouts`], [`Pipeline::state_blocks`])
//! and read back as the blocks each process's stages need ([`Pipeline::restore`]), whatever
//! mesh or process count saved it. In one process, [`Pipeline::state`] also joins every stage's
//! part into whole arrays ([`super::StageLayout::join`]).

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Result};

use super::executor::Pipeline;
use crate::checkpoint::dir::Expected;
use crate::checkpoint::shards::{ArrayLayout, Bounds, HostArray};
use crate::host::{whole, HostTensor};
use crate::model::ParamDef;
use crate::tensor::Tree;
use crate::train_state::Group;

/// The groups of the state that every stage holds its part of, laid out as the parameters
/// are; the count is the only other array, the same on every stage.
const LAID_OUT: [Group; 4] = [Group::Params, Group::Mu, Group::Nu, Group::Fp8];

impl Pipeline {
    /// The parameters in the model's full layout, copied from every stage.
    pub fn parameters(&self) -> Result<Tree<HostTensor>> {
        self.joined(Group::Params)
    }

    /// The whole state, copied from every stage (the step count from the first: every stage
    /// counts the same steps).
    pub fn state(&self) -> Result<Vec<(String, HostTensor)>> {
        let mut out = Vec::new();
        for group in LAID_OUT {
            let mut full = self.joined(group)?;
            for def in self.full_defs(group) {
                let name = group.name(&def.name);
                let array = full.remove(&def.name).ok_or_else(|| anyhow!("no {name} after joining"))?;
                out.push((name, array));
            }
        }
        let (name, count) = self.count(0)?;
        out.push((name, count));
        Ok(out)
    }

    /// Where every array of `specs` (the state's, by full name) lies on the job's processes:
    /// the blocks of the full layout each stage holds, on the process that runs it; the count
    /// whole on every process.
    pub fn state_layouts(&self, specs: &[Expected]) -> Result<Vec<ArrayLayout>> {
        let mut holders: BTreeMap<String, Vec<(usize, Bounds)>> = BTreeMap::new();
        for group in LAID_OUT {
            for def in self.full_defs(group) {
                let blocks = (0..self.step.layout.stages).flat_map(|stage| {
                    let process = self.placement.process_of(stage);
                    self.step.layout.stage_blocks(&self.step.model, &def, stage).into_iter().map(move |b| (process, b))
                });
                holders.insert(group.name(&def.name), blocks.collect());
            }
        }
        let processes = self.placement.process_of(self.step.layout.stages - 1) + 1;
        specs
            .iter()
            .map(|e| {
                let blocks = match holders.remove(&e.name) {
                    Some(blocks) => blocks,
                    None if e.name == Group::Count.prefix() => (0..processes).map(|p| (p, whole(&e.dims))).collect(),
                    None => bail!("the pipeline holds no array {}", e.name),
                };
                Ok(ArrayLayout { name: e.name.clone(), ty: e.ty, dims: e.dims.clone(), blocks })
            })
            .collect()
    }

    /// The blocks of the state `specs` (by full name) that this process's stages hold (as
    /// [`Pipeline::state_layouts`] says), copied off the devices.
    pub fn state_blocks(&self, specs: &[Expected]) -> Result<Vec<HostArray>> {
        let defs: BTreeMap<String, ParamDef> =
            LAID_OUT.iter().flat_map(|&g| self.full_defs(g).into_iter().map(move |d| (g.name(&d.name), d))).collect();
        specs
            .iter()
            .map(|e| {
                let mut array = HostArray { name: e.name.clone(), ty: e.ty, dims: e.dims.clone(), blocks: Vec::new() };
                let Some(def) = defs.get(&e.name) else {
                    let (name, count) = self.count(self.stages[0].index)?;
                    return match name == e.name {
                        true => Ok(HostArray::whole(&name, count)),
                        false => Err(anyhow!("the pipeline holds no array {}", e.name)),
                    };
                };
                for stage in &self.stages {
                    let blocks = self.step.layout.stage_blocks(&self.step.model, def, stage.index);
                    if blocks.is_empty() {
                        continue;
                    }
                    let update = &stage.programs.update;
                    let held =
                        stage.state.get(&e.name).ok_or_else(|| anyhow!("no {} on stage {}", e.name, stage.index))?;
                    let held = update.fetch(update.output_index(&e.name)?, held)?;
                    // The stage's array is its blocks stacked in order (`StageLayout::stage_blocks`).
                    let mut row = 0;
                    for bounds in blocks {
                        let block = match bounds == whole(&e.dims) {
                            true => held.clone(),
                            false => super::layout::slice_rows(&held, row..row + bounds[0].1)?,
                        };
                        row += bounds[0].1;
                        array.blocks.push((bounds, block));
                    }
                }
                Ok(array)
            })
            .collect()
    }

    /// Initializes the state from a saved one: every array [`Pipeline::state`] names, whole or
    /// as the blocks this process's stages hold.
    pub fn restore(&mut self, state: &BTreeMap<String, HostArray>) -> Result<()> {
        self.initialize(Some(state))?;
        for group in &LAID_OUT[1..] {
            self.put_group(*group, state)?;
        }
        let name = Group::Count.prefix();
        let count = state.get(name).ok_or_else(|| anyhow!("the state has no {name}"))?.assemble()?;
        for stage in &mut self.stages {
            let update = &stage.programs.update;
            let array = update.put(&self.client, update.input_index(name)?, &count)?;
            stage.state.insert(name.to_string(), array);
        }
        Ok(())
    }

    /// Puts each of this process's stages' part of `group` onto its devices, cut from `arrays`
    /// (the group's arrays by full name, in the model's full layout).
    pub(super) fn put_group(&mut self, group: Group, arrays: &BTreeMap<String, HostArray>) -> Result<()> {
        let defs = self.full_defs(group);
        for stage in &mut self.stages {
            let find = |def: &ParamDef| {
                let name = group.name(&def.name);
                arrays.get(&name).ok_or_else(|| anyhow!("the state has no {name}"))
            };
            let part = self.step.layout.stage_part(&self.step.model, &defs, stage.index, find)?;
            let update = &stage.programs.update;
            for (name, host) in part.iter() {
                let name = group.name(name);
                let array = update.put(&self.client, update.input_index(&name)?, host)?;
                stage.state.insert(name, array);
            }
        }
        Ok(())
    }

    /// The step count of stage `stage` (one of this process's), with its name.
    fn count(&self, stage: usize) -> Result<(String, HostTensor)> {
        let stage =
            self.stages.iter().find(|s| s.index == stage).ok_or_else(|| anyhow!("stage {stage} is not here"))?;
        let update = &stage.programs.update;
        let name = Group::Count.prefix();
        let count = stage.state.get(name).ok_or_else(|| anyhow!("no {name} on stage {}", stage.index))?;
        Ok((name.to_string(), update.fetch(update.output_index(name)?, count)?))
    }

    /// The model's definitions of a group laid out as the parameters.
    fn full_defs(&self, group: Group) -> Vec<ParamDef> {
        self.step.full_defs(group)
    }

    /// The arrays of `group` in the model's full layout, copied from every stage.
    fn joined(&self, group: Group) -> Result<Tree<HostTensor>> {
        if !self.is_whole() {
            bail!("this process runs only some of the pipeline's stages, so it has no whole training state");
        }
        let defs = self.full_defs(group);
        let per_stage = self
            .stages
            .iter()
            .map(|stage| {
                let update = &stage.programs.update;
                let mut tree = Tree::new();
                for def in self.step.layout.stage_defs(&self.step.model, &defs, stage.index) {
                    let name = group.name(&def.name);
                    let array = stage.state.get(&name).ok_or_else(|| anyhow!("no {name} on stage {}", stage.index))?;
                    tree.insert(def.name, update.fetch(update.output_index(&name)?, array)?);
                }
                Ok(tree)
            })
            .collect::<Result<Vec<_>>>()?;
        self.step.layout.join(&self.step.model, &defs, &per_stage)
    }
}
