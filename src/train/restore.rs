//! Where a run's state comes from, in MaxText's order: the run's own checkpoints, else
//! `load_full_state_path` or `load_parameters_path`, else the init program; and where the run's
//! checkpoints go (`enable_checkpointing`) and by which policy.

use std::collections::BTreeMap;

use anyhow::{anyhow, Context, Result};

use crate::checkpoint::shards::{ArrayLayout, Bounds, HostArray};
use crate::checkpoint::{self, Checkpoints, Expected, LoadedBlocks, OnError, Policy, Writer};
use crate::config::{Config, OnCheckpointError};
use crate::files::Location;
use crate::host::HostTensor;
use crate::model::Model;
use crate::storage;
use crate::train_state::Group;

use super::executor::Initial;
use super::outputs;
use crate::host::params_io::{load_parameters, ParamSpec};

/// The state a run starts from.
pub(super) struct Start {
    pub initial: Initial,
    pub first_step: u64,
    /// The data position to continue from (a resumed run only).
    pub data: Option<serde_json::Value>,
}

/// Which process of how many restores, and the blocks its devices need of each array.
pub(super) struct Restoring<'a> {
    pub process: usize,
    pub processes: usize,
    pub layouts: &'a [ArrayLayout],
}

impl Restoring<'_> {
    fn wanted(&self) -> BTreeMap<String, Vec<Bounds>> {
        self.layouts.iter().map(|l| (l.name.clone(), l.blocks_of(self.process))).collect()
    }

    /// The blocks this process needs of the checkpoint at `dir`.
    fn load(
        &self,
        dir: &Location,
        expected: &[Expected],
        model_keys: &BTreeMap<String, serde_json::Value>,
    ) -> Result<LoadedBlocks> {
        checkpoint::dir::load_blocks(dir, expected, model_keys, false, &self.wanted())
    }
}

/// MaxText's order (maxtext `src/maxtext/configs/base.yml`, checkpointing section, commit
/// e591f30): the run's own newest good checkpoint; else `load_full_state_path` (parameters,
/// optimizer state and step; the data starts over) or `load_parameters_path` (parameters; the
/// optimizer state is fresh); else the init program. `expected` are the arrays of the step's
/// state (`StepExecutor::state_specs`); a whole state is read as the blocks `restoring`'s
/// devices need (on any mesh and process count that saved it), with this process's data
/// position.
pub(super) fn initial_state(
    c: &Config,
    expected: &[Expected],
    restoring: &Restoring,
    model: &Model,
    checkpoints: Option<&Checkpoints>,
) -> Result<Start> {
    let model_keys = checkpoint::manifest::model_keys(c, model);
    if let Some(checkpoints) = checkpoints {
        if restoring.process == 0 {
            checkpoints.remove_incomplete()?;
        }
        // A MaxText run's unfinished Orbax steps are skipped, as Orbax's CheckpointManager skips them.
        let incomplete = checkpoint::orbax::incomplete_steps(&checkpoints.dir)?;
        let skipped = match incomplete.is_empty() {
            true => String::new(),
            false => format!("; skipped the incomplete MaxText checkpoints {}", incomplete.join(", ")),
        };
        let resumed = checkpoints.restore_latest_by(|dir, writer| match writer {
            Writer::MaxText => {
                // MaxText saves folder `s` after its step `s`, holding `step` s + 1 (the updates applied).
                let folder: u64 = dir.file_name().parse()?;
                let start = maxtext_state(dir, expected, restoring, model)?;
                anyhow::ensure!(
                    start.first_step == folder + 1,
                    "{dir}: MaxText's step folder {folder} holds step {} (the state after step {folder} holds {})",
                    start.first_step,
                    folder + 1
                );
                Ok((start, format!("MaxText's checkpoint of step {folder} ({dir})")))
            }
            Writer::Maxrs => {
                let loaded = restoring.load(dir, expected, &model_keys)?;
                let step_done = loaded.manifest.step.ok_or_else(|| anyhow!("{dir}: the checkpoint has no step"))?;
                let data = loaded
                    .manifest
                    .data_for(restoring.process, restoring.processes)
                    .map_err(|why| anyhow!("{dir}: {why}"))?;
                let start = Start { initial: Initial::State(loaded.arrays), first_step: step_done + 1, data };
                Ok((start, format!("the checkpoint of step {step_done} ({dir})")))
            }
        })?;
        if let Some((start, what)) = resumed {
            println!("resuming from {what}{skipped}");
            ignored_adapters(c);
            return Ok(start);
        }
        if !incomplete.is_empty() {
            println!("no checkpoint to resume from in {}{skipped}", checkpoints.dir);
        }
    }
    if !c.load_full_state_path.is_empty() {
        ignored_adapters(c);
        let dir = Location::parse(&c.load_full_state_path)?;
        let is_maxrs = storage::is_file(&dir.join(checkpoint::manifest::MANIFEST_FILE))?;
        if !is_maxrs && checkpoint::orbax::Checkpoint::is_orbax(&dir)? {
            let start = maxtext_state(&dir, expected, restoring, model)
                .with_context(|| format!("load_full_state_path={dir}"))?;
            println!("loaded MaxText's train state from {dir}; training continues at step {}", start.first_step);
            return Ok(start);
        }
        refuse_steps_folder("load_full_state_path", &dir, is_maxrs)?;
        let loaded =
            restoring.load(&dir, expected, &model_keys).with_context(|| format!("load_full_state_path={dir}"))?;
        let step_done = loaded.manifest.step.ok_or_else(|| {
            anyhow!("load_full_state_path={dir}: a parameters-only checkpoint (no step); use load_parameters_path")
        })?;
        println!("loaded the full state of step {step_done} from {dir}; training continues at step {}", step_done + 1);
        return Ok(Start { initial: Initial::State(loaded.arrays), first_step: step_done + 1, data: None });
    }
    let mut initial = match c.load_parameters_path.as_str() {
        "" => Initial::Fresh,
        _ => Initial::Parameters(load_parameter_arrays(c, expected, restoring, model, &model_keys)?),
    };
    if !c.lora_restore_path.is_empty() {
        // Adapters are small: read whole, as one block each.
        let adapters = load_adapters(c, expected, model, &model_keys)?
            .into_iter()
            .map(|(name, tensor)| (name.clone(), HostArray::whole(&name, tensor)));
        initial = match initial {
            Initial::Parameters(mut arrays) => {
                arrays.extend(adapters);
                Initial::Parameters(arrays)
            }
            _ => Initial::Parameters(adapters.collect()),
        };
    }
    Ok(Start { initial, first_step: 0, data: None })
}

/// Says that `lora.lora_restore_path` is not read by a run that continues a whole state, which
/// holds its adapters (MaxText: "Ignored if the current run is resumed").
fn ignored_adapters(c: &Config) {
    if !c.lora_restore_path.is_empty() {
        println!(
            "lora.lora_restore_path={} is not read: the run continues a whole state, adapters included",
            c.lora_restore_path
        );
    }
}

/// The LoRA adapters `lora.lora_restore_path` names: a LoRA run's maxrs checkpoint, of which
/// only the adapters are read (MaxText's `restore_lora_from_path`, `utils/lora_utils.py` at
/// e591f30; as there, a resumed run ignores the key, and the checkpoint's LoRA rank and alpha
/// must be the run's, as its `sync_lora_metadata` requires).
fn load_adapters(
    c: &Config,
    expected: &[Expected],
    model: &Model,
    model_keys: &BTreeMap<String, serde_json::Value>,
) -> Result<BTreeMap<String, HostTensor>> {
    let location = Location::parse(&c.lora_restore_path)?;
    let key = format!("lora.lora_restore_path={location}");
    if !c.lora_enable_lora {
        anyhow::bail!(
            "{key}: LoRA is not enabled; set lora.enable_lora=true (and the adapters' lora.lora_rank, lora.lora_alpha)"
        );
    }
    if !storage::is_file(&location.join(checkpoint::manifest::MANIFEST_FILE)).with_context(|| key.clone())? {
        if checkpoint::orbax::Checkpoint::is_orbax(&location)? {
            anyhow::bail!("{key}: a MaxText (Orbax) LoRA checkpoint; reading MaxText's adapters is not supported yet (maxrs reads a maxrs LoRA run's checkpoint)");
        }
        anyhow::bail!(
            "{key}: no {} there: name a step of a maxrs LoRA run's checkpoints",
            checkpoint::manifest::MANIFEST_FILE
        );
    }
    let adapters: Vec<Expected> = expected
        .iter()
        .filter(|e| Group::of(&e.name).is_some_and(|(g, k)| g == Group::Params && model.is_adapter(k)))
        .cloned()
        .collect();
    let loaded = checkpoint::dir::load_adapters(&location, &adapters, model_keys).with_context(|| key.clone())?;
    println!("loaded {} LoRA adapter arrays from {location}", loaded.arrays.len());
    Ok(loaded.arrays)
}

/// The parameters `load_parameters_path` names: a checkpoint directory (its `params`, float
/// types converted to `weight_dtype`), a MaxText Orbax checkpoint (a step or its `items/`, the
/// same conversion) or a safetensors file, local or gs://. Keys are the train
/// step's names (`params.…`). Of a checkpoint only the blocks `restoring`'s devices hold are
/// read, by ranges (as MaxText's `load_params_from_path` restores each parameter sharded); a
/// safetensors file is read whole.
fn load_parameter_arrays(
    c: &Config,
    expected: &[Expected],
    restoring: &Restoring,
    model: &Model,
    model_keys: &BTreeMap<String, serde_json::Value>,
) -> Result<BTreeMap<String, HostArray>> {
    let location = Location::parse(&c.load_parameters_path)?;
    let is_checkpoint = storage::is_file(&location.join(checkpoint::manifest::MANIFEST_FILE))?;
    // The model's own parameters, and LoRA adapters only from a maxrs checkpoint that has them
    // (a LoRA run's): others start fresh, drawn by the init program, as MaxText's
    // `load_parameters_path` loads the base model under new adapters.
    let saved = match is_checkpoint {
        true => checkpoint::dir::read_manifest(&location)
            .with_context(|| format!("load_parameters_path={location}"))?
            .arrays
            .into_iter()
            .map(|a| a.name)
            .collect(),
        false => std::collections::BTreeSet::new(),
    };
    let params: Vec<Expected> = expected
        .iter()
        .filter(|e| {
            Group::of(&e.name)
                .is_some_and(|(g, key)| g == Group::Params && (!model.is_adapter(key) || saved.contains(&e.name)))
        })
        .cloned()
        .collect();
    refuse_steps_folder("load_parameters_path", &location, is_checkpoint)?;
    let blocks = restoring.wanted();
    let arrays = if !is_checkpoint && checkpoint::orbax::Checkpoint::is_orbax(&location)? {
        // A MaxText checkpoint: its parameters under maxrs's keys, floats as `weight_dtype`.
        let wanted: Vec<checkpoint::orbax::params::Wanted> = params
            .iter()
            .filter_map(|e| {
                Some(checkpoint::orbax::params::Wanted {
                    key: Group::of(&e.name)?.1,
                    ty: e.ty,
                    dims: &e.dims,
                    blocks: blocks.get(&e.name).map_or(&[][..], Vec::as_slice),
                })
            })
            .collect();
        let loaded = checkpoint::orbax::params::load(&location, &wanted, &checkpoint::orbax::params::stored(model))
            .with_context(|| format!("load_parameters_path={location}"))?;
        eprintln!("{}", checkpoint::orbax::NOT_YET_EQUAL);
        loaded
            .into_values()
            .map(|array| {
                let name = Group::Params.name(&array.name);
                (name.clone(), HostArray { name, ..array })
            })
            .collect()
    } else if is_checkpoint {
        checkpoint::dir::load_blocks(&location, &params, model_keys, true, &blocks)
            .with_context(|| format!("load_parameters_path={location}"))?
            .arrays
    } else {
        let specs: Vec<ParamSpec> = params
            .iter()
            .filter_map(|e| Some(ParamSpec { name: Group::of(&e.name)?.1.to_string(), ty: e.ty, dims: e.dims.clone() }))
            .collect();
        let local = match &location {
            Location::Local(path) => load_parameters(path, &specs)?,
            remote => load_parameters(&storage::download(remote)?, &specs)?,
        };
        local
            .into_iter()
            .map(|(name, tensor)| {
                let name = Group::Params.name(&name);
                (name.clone(), HostArray::whole(&name, tensor))
            })
            .collect()
    };
    println!("loaded {} parameters from {location}", arrays.len());
    Ok(arrays)
}

/// A MaxText train state (an Orbax step or item at `dir`) as the state a run starts from: only
/// the blocks this process's devices hold, read by ranges; the data starts over.
fn maxtext_state(dir: &Location, expected: &[Expected], restoring: &Restoring, model: &Model) -> Result<Start> {
    let stored = checkpoint::orbax::params::stored(model);
    let state = checkpoint::orbax::state::load(dir, expected, &stored, &restoring.wanted())?;
    eprintln!("{}", checkpoint::orbax::NOT_YET_EQUAL);
    Ok(Start { initial: Initial::State(state.arrays), first_step: state.next_step, data: None })
}

/// `key`'s `dir` when it is a run's `checkpoints/` folder rather than one checkpoint: refused,
/// naming its newest step, as MaxText restores `load_full_state_path` and
/// `load_parameters_path` as one checkpoint (`_load_full_state_path` and `load_params_from_path`
/// in `src/maxtext/common/checkpointing.py` at MaxText e591f30; only the run's own
/// `checkpoints/` is searched for its newest step).
fn refuse_steps_folder(key: &str, dir: &Location, is_checkpoint: bool) -> Result<()> {
    if is_checkpoint || checkpoint::orbax::Checkpoint::is_orbax(dir)? {
        return Ok(());
    }
    // A file (a safetensors one) lists as no folder, or fails to list: not a steps folder.
    let Ok(steps) = Checkpoints::new(dir.clone()).steps() else { return Ok(()) };
    match steps.last() {
        Some(newest) => anyhow::bail!(
            "{key}={dir}: a run's checkpoints folder, not one checkpoint; name one of its steps, e.g. the newest, \
             {key}={}",
            dir.join(&newest.to_string())
        ),
        None => Ok(()),
    }
}

/// The run's checkpoints directory, when `enable_checkpointing` (validation made sure
/// `base_output_directory` is set then).
pub(super) fn run_checkpoints(c: &Config) -> Result<Option<Checkpoints>> {
    if !c.enable_checkpointing {
        return Ok(None);
    }
    let dir = outputs::run_dir(c)?.expect("validated: checkpointing has base_output_directory");
    Ok(Some(Checkpoints::new(dir.join("checkpoints"))))
}

pub(super) fn checkpoint_policy(c: &Config) -> Policy {
    Policy {
        period: c.checkpoint_period as u64,
        on_start: c.save_checkpoint_on_start,
        on_completion: c.save_checkpoint_on_completion,
        asynchronous: c.async_checkpointing,
        keep: c.max_num_checkpoints_to_keep.map(|n| n as usize),
        on_error: match c.on_checkpoint_error {
            OnCheckpointError::Stop => OnError::Stop,
            OnCheckpointError::Continue => OnError::Continue,
        },
    }
}
