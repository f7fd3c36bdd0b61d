//! A pipeline's training state between the stages and the host, in the model's full layout and
//! under the unpipelined step's names (`params.*`, `opt_state.mu.*`, `opt_state.nu.*`,
//! `opt_state.count`), so that a pipelined run's checkpoint restores into an unpipelined run
//! and back: [`Pipeline::state`] copies every stage's part off its devices and joins the
//! stacked layers' rows ([`super::StageLayout::join`]); [`Pipeline::restore`] splits a full
//! state by the layout and puts each stage's part onto its devices.

use std::collections::BTreeMap;

use anyhow::{anyhow, Result};

use super::executor::Pipeline;
use super::programs::{MU, NU, PARAMS};
use crate::host::HostTensor;
use crate::tensor::Tree;
use crate::train::optimizer::COUNT;

/// The groups of the state that follow the parameters' layout.
const GROUPS: [&str; 3] = [PARAMS, MU, NU];

impl Pipeline {
    /// The parameters in the model's full layout, copied from every stage.
    pub fn parameters(&self) -> Result<Tree<HostTensor>> {
        self.joined(PARAMS)
    }

    /// The whole state, copied from every stage (the step count from the first: every stage
    /// counts the same steps).
    pub fn state(&self) -> Result<Vec<(String, HostTensor)>> {
        let mut out = Vec::new();
        for group in GROUPS {
            let mut full = self.joined(group)?;
            for def in self.step.model.param_defs() {
                let array = full.remove(&def.name).ok_or_else(|| anyhow!("no {group}.{} after joining", def.name))?;
                out.push((format!("{group}.{}", def.name), array));
            }
        }
        let stage = &self.stages[0];
        let update = &stage.programs.update;
        let name = format!("opt_state.{COUNT}");
        let count = stage.state.get(&name).ok_or_else(|| anyhow!("no {name} on stage 0"))?;
        out.push((name.clone(), update.fetch(update.output_index(&name)?, count)?));
        Ok(out)
    }

    /// Initializes the state from a whole one (every array [`Pipeline::state`] gives, by name).
    pub fn restore(&mut self, state: &BTreeMap<String, HostTensor>) -> Result<()> {
        let group = |prefix: &str| -> Result<Tree<HostTensor>> {
            self.step
                .model
                .param_defs()
                .into_iter()
                .map(|def| {
                    let name = format!("{prefix}.{}", def.name);
                    let host = state.get(&name).ok_or_else(|| anyhow!("the state has no {name}"))?;
                    Ok((def.name, host.clone()))
                })
                .collect()
        };
        let full: Vec<(&str, Tree<HostTensor>)> =
            GROUPS.iter().map(|&prefix| Ok((prefix, group(prefix)?))).collect::<Result<_>>()?;
        self.initialize(Some(&full[0].1))?;
        let count_name = format!("opt_state.{COUNT}");
        let count = state.get(&count_name).ok_or_else(|| anyhow!("the state has no {count_name}"))?;
        for stage in &mut self.stages {
            let update = &stage.programs.update;
            for (prefix, tree) in &full[1..] {
                for (name, host) in self.step.layout.split(&self.step.model, tree, stage.index)?.iter() {
                    let name = format!("{prefix}.{name}");
                    let array = update.put(&self.client, update.input_index(&name)?, host)?;
                    stage.state.insert(name, array);
                }
            }
            let array = update.put(&self.client, update.input_index(&count_name)?, count)?;
            stage.state.insert(count_name.clone(), array);
        }
        Ok(())
    }

    /// The arrays of `group` (`params`, `opt_state.mu`, `opt_state.nu`) in the model's full
    /// layout, copied from every stage.
    fn joined(&self, group: &str) -> Result<Tree<HostTensor>> {
        let per_stage = self
            .stages
            .iter()
            .map(|stage| {
                let update = &stage.programs.update;
                let mut tree = Tree::new();
                for def in self.step.layout.stage_params(&self.step.model, stage.index) {
                    let name = format!("{group}.{}", def.name);
                    let array = stage.state.get(&name).ok_or_else(|| anyhow!("no {name} on stage {}", stage.index))?;
                    tree.insert(def.name, update.fetch(update.output_index(&name)?, array)?);
                }
                Ok(tree)
            })
            .collect::<Result<Vec<_>>>()?;
        self.step.layout.join(&self.step.model, &per_stage)
    }
}
