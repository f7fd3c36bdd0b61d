//! A pipeline's training state between the stages and the host, in the model's full layout and
//! under the unpipelined step's names (`train_state`: parameters, optimizer state and fp8
//! state), so that a pipelined run's checkpoint restores into an unpipelined run and back:
//! [`Pipeline::state`] copies every stage's part off its devices and joins the stacked layers'
//! rows ([`super::StageLayout::join`]); [`Pipeline::restore`] splits a full state by the layout
//! and puts each stage's part onto its devices.

use std::collections::BTreeMap;

use anyhow::{anyhow, Result};

use super::executor::Pipeline;
use crate::host::HostTensor;
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
        let stage = &self.stages[0];
        let update = &stage.programs.update;
        let name = Group::Count.prefix();
        let count = stage.state.get(name).ok_or_else(|| anyhow!("no {name} on stage 0"))?;
        out.push((name.to_string(), update.fetch(update.output_index(name)?, count)?));
        Ok(out)
    }

    /// Initializes the state from a whole one (every array [`Pipeline::state`] gives, by name).
    pub fn restore(&mut self, state: &BTreeMap<String, HostTensor>) -> Result<()> {
        let group = |group: Group| -> Result<Tree<HostTensor>> {
            self.full_defs(group)
                .into_iter()
                .map(|def| {
                    let name = group.name(&def.name);
                    let host = state.get(&name).ok_or_else(|| anyhow!("the state has no {name}"))?;
                    Ok((def.name, host.clone()))
                })
                .collect()
        };
        let full: Vec<(Group, Tree<HostTensor>)> =
            LAID_OUT.iter().map(|&g| Ok((g, group(g)?))).collect::<Result<_>>()?;
        self.initialize(Some(&full[0].1))?;
        let count_name = Group::Count.prefix();
        let count = state.get(count_name).ok_or_else(|| anyhow!("the state has no {count_name}"))?;
        for stage in &mut self.stages {
            let update = &stage.programs.update;
            for (group, tree) in &full[1..] {
                let defs = self.step.full_defs(*group);
                for (name, host) in self.step.layout.split(&self.step.model, &defs, tree, stage.index)?.iter() {
                    let name = group.name(name);
                    let array = update.put(&self.client, update.input_index(&name)?, host)?;
                    stage.state.insert(name, array);
                }
            }
            let array = update.put(&self.client, update.input_index(count_name)?, count)?;
            stage.state.insert(count_name.to_string(), array);
        }
        Ok(())
    }

    /// The model's definitions of a group laid out as the parameters.
    fn full_defs(&self, group: Group) -> Vec<ParamDef> {
        self.step.full_defs(group)
    }

    /// The arrays of `group` in the model's full layout, copied from every stage.
    fn joined(&self, group: Group) -> Result<Tree<HostTensor>> {
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
