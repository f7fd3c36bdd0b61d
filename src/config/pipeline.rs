//! Pipeline parallelism's keys: when the `stage` mesh axis is larger than 1, how the decoder
//! layers are laid out over the stages, how a step's batch splits into microbatches, and which
//! schedule orders each stage's work ([`PipelinePlan`]), with MaxText's rules and errors that
//! name the keys.
//!
//! The layout and microbatch rules are MaxText main's (`src/maxtext/configs/types.py`, the
//! pipeline block of its config validation, and the comments of `src/maxtext/configs/base.yml`,
//! at e591f30): `num_pipeline_repeats = -1` is `layers / (stages x num_layers_per_pipeline_stage)`,
//! which must divide; `stages x repeats x layers per stage` must equal the layers;
//! `num_pipeline_microbatches = -1` is the number of stages, and must be a multiple of it; the
//! batch of one forward pass must divide into the microbatches. The schedule key is the JaxPP
//! fork's (NVIDIA/maxtext-jaxpp `MaxText/train.py` `load_schedule`, key `schedule`), named
//! `pipeline_schedule` here.

use std::fmt;

use super::choices::{PipelineSchedule, RematPolicy};
use super::error::ConfigError;
use super::keys::Config;
use super::mesh::Mesh;

/// How a pipelined step runs, derived from the config and the mesh.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PipelinePlan {
    /// Size of the `stage` mesh axis: programs on disjoint groups of devices.
    pub stages: usize,
    /// `num_pipeline_repeats`: how many layer groups each stage holds (circular layout).
    pub repeats: usize,
    /// `num_layers_per_pipeline_stage`: consecutive layers per group.
    pub layers_per_stage: usize,
    /// `num_pipeline_microbatches`: per forward pass (per gradient accumulation step).
    pub microbatches: usize,
    /// Sequences per microbatch: int(devices x per_device_batch_size) / microbatches.
    pub microbatch_size: usize,
    pub schedule: PipelineSchedule,
}

impl PipelinePlan {
    /// Layer groups in pipeline order (`stages x repeats`): group `g` runs layers
    /// `g x layers_per_stage ..` on stage `g mod stages`.
    pub fn virtual_stages(&self) -> usize {
        self.stages * self.repeats
    }

    /// The idle fraction of an ideal schedule with equal stage costs and free transfers,
    /// `(stages - 1) / (repeats x microbatches + stages - 1)` (MaxText's base.yml formula; for
    /// one repeat the GPipe and 1F1B bubble).
    pub fn theoretical_bubble(&self) -> f64 {
        let p = self.stages as f64;
        (p - 1.0) / (self.repeats as f64 * self.microbatches as f64 + p - 1.0)
    }

    /// The schedule's name as it runs ([`PipelineSchedule::running_name`]).
    pub fn schedule_name(&self) -> &'static str {
        self.schedule.running_name(self.repeats)
    }
}

impl fmt::Display for PipelinePlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pipeline: {} stages x {} repeat{} x {} layer{} per stage, {} microbatches of {} sequences, schedule {}, \
             bubble (stages - 1) / (repeats x microbatches + stages - 1) = {:.1}%",
            self.stages,
            self.repeats,
            if self.repeats == 1 { "" } else { "s" },
            self.layers_per_stage,
            if self.layers_per_stage == 1 { "" } else { "s" },
            self.microbatches,
            self.microbatch_size,
            self.schedule_name(),
            100.0 * self.theoretical_bubble()
        )
    }
}

impl PipelineSchedule {
    /// The name of this schedule as it runs over `repeats` layer groups per stage: `1f1b` over
    /// several repeats is the interleaved 1F1B.
    pub fn running_name(self, repeats: usize) -> &'static str {
        match (self, repeats) {
            (PipelineSchedule::Gpipe, _) => "gpipe",
            (_, 1) => "1f1b",
            _ => "interleaved_1f1b",
        }
    }
}

/// The pipeline of `c` on `mesh` (`None` without a `stage` axis larger than 1). `micro_batch` is
/// the sequences of one forward pass, `batch_shards` how many ways a batch splits over the
/// `activation_batch` mesh axes (inside each stage).
pub(crate) fn plan(
    c: &Config,
    mesh: &Mesh,
    num_slices: usize,
    micro_batch: usize,
    batch_shards: usize,
) -> Result<Option<PipelinePlan>, ConfigError> {
    let stages = mesh.size("stage");
    if stages == 1 {
        check_unused(c)?;
        return Ok(None);
    }
    check_across_processes(c, num_slices)?;
    check_spmd_options(c)?;
    if c.logits_via_embedding {
        return Err(ConfigError::invalid(
            "logits_via_embedding, ici_pipeline_parallelism",
            "logits_via_embedding=true with pipeline parallelism is not supported yet: the embedding lives on the \
             first stage and the output projection on the last; set logits_via_embedding=false",
        ));
    }
    if !matches!(c.remat_policy, RematPolicy::Full | RematPolicy::None) {
        return Err(ConfigError::invalid(
            "remat_policy, ici_pipeline_parallelism",
            format!(
                "remat_policy={} with pipeline parallelism is not supported yet: a stage keeps each layer's input \
                 between its forward and backward programs and recomputes the layer (remat_policy=full); set \
                 remat_policy=full",
                c.remat_policy
            ),
        ));
    }

    let layers = c.base_num_decoder_layers;
    if c.pipeline_parallel_layers != -1 && c.pipeline_parallel_layers != layers {
        return Err(ConfigError::invalid(
            "pipeline_parallel_layers",
            format!(
                "pipeline_parallel_layers={} with {layers} decoder layers: pipelining only some layers is not \
                 supported yet; use -1 (every layer)",
                c.pipeline_parallel_layers
            ),
        ));
    }
    let per_stage = c.num_layers_per_pipeline_stage;
    if per_stage < 1 {
        return Err(ConfigError::invalid(
            "num_layers_per_pipeline_stage",
            format!("num_layers_per_pipeline_stage={per_stage}; it must be a positive integer"),
        ));
    }
    let s = stages as i64;
    let repeats = match c.num_pipeline_repeats {
        -1 if layers % (s * per_stage) != 0 => {
            return Err(ConfigError::invalid(
                "base_num_decoder_layers, ici_pipeline_parallelism, num_layers_per_pipeline_stage",
                format!(
                    "{layers} decoder layers do not divide into {stages} stages x num_layers_per_pipeline_stage \
                     {per_stage} = {}: each stage boundary must fall between layers; make base_num_decoder_layers a \
                     multiple of {} or change ici_pipeline_parallelism / num_layers_per_pipeline_stage",
                    s * per_stage,
                    s * per_stage
                ),
            ))
        }
        -1 => layers / (s * per_stage),
        r if r < 1 => {
            return Err(ConfigError::invalid(
                "num_pipeline_repeats",
                format!("num_pipeline_repeats={r}; use a positive integer, or -1 to derive it from the layers"),
            ))
        }
        r => r,
    };
    if s * repeats * per_stage != layers {
        return Err(ConfigError::invalid(
            "base_num_decoder_layers, ici_pipeline_parallelism, num_pipeline_repeats, num_layers_per_pipeline_stage",
            format!(
                "{stages} stages x num_pipeline_repeats {repeats} x num_layers_per_pipeline_stage {per_stage} = {} \
                 layers, but the model has {layers}; the product must equal base_num_decoder_layers (set \
                 num_pipeline_repeats=-1 to derive it)",
                s * repeats * per_stage
            ),
        ));
    }

    let microbatches = match c.num_pipeline_microbatches {
        -1 => stages,
        m if m < 1 => {
            return Err(ConfigError::invalid(
                "num_pipeline_microbatches",
                format!("num_pipeline_microbatches={m}; use a positive multiple of the {stages} stages, or -1"),
            ))
        }
        m => m as usize,
    };
    if !microbatches.is_multiple_of(stages) {
        return Err(ConfigError::invalid(
            "num_pipeline_microbatches, ici_pipeline_parallelism",
            format!(
                "num_pipeline_microbatches={microbatches} is not a multiple of the {stages} stages (as in MaxText); \
                 use {} or {}",
                microbatches.div_ceil(stages).max(1) * stages,
                (microbatches.div_ceil(stages) + 1) * stages
            ),
        ));
    }
    if !micro_batch.is_multiple_of(microbatches) {
        return Err(ConfigError::invalid(
            "per_device_batch_size, num_pipeline_microbatches",
            format!(
                "the batch of one forward pass, {micro_batch} sequences, does not split into \
                 num_pipeline_microbatches={microbatches}; make int(devices x per_device_batch_size) a multiple of it"
            ),
        ));
    }
    let microbatch_size = micro_batch / microbatches;
    if !microbatch_size.is_multiple_of(batch_shards) {
        return Err(ConfigError::invalid(
            "per_device_batch_size, num_pipeline_microbatches",
            format!(
                "a microbatch of {microbatch_size} sequences ({micro_batch} / {microbatches} microbatches) does not split \
                 over the {batch_shards} batch shards inside a stage (the activation_batch rule); raise \
                 per_device_batch_size or lower num_pipeline_microbatches"
            ),
        ));
    }
    Ok(Some(PipelinePlan {
        stages,
        repeats: repeats as usize,
        layers_per_stage: per_stage as usize,
        microbatches,
        microbatch_size,
        schedule: c.pipeline_schedule,
    }))
}

/// Without a `stage` axis the pipeline keys do nothing (as in MaxText); one set to another
/// value than its default is most likely a forgotten `ici_pipeline_parallelism`, so it is named.
fn check_unused(c: &Config) -> Result<(), ConfigError> {
    let set = [
        ("num_layers_per_pipeline_stage", c.num_layers_per_pipeline_stage != 1),
        ("num_pipeline_repeats", c.num_pipeline_repeats != -1),
        ("pipeline_parallel_layers", c.pipeline_parallel_layers != -1),
        ("num_pipeline_microbatches", c.num_pipeline_microbatches != -1),
        ("pipeline_schedule", c.pipeline_schedule != PipelineSchedule::OneFOneB),
    ];
    match set.iter().find(|(_, changed)| *changed) {
        Some((key, _)) => Err(ConfigError::invalid(
            *key,
            format!(
                "{key} is set but there are no pipeline stages (ici_pipeline_parallelism=1), so it would do nothing; \
                 set ici_pipeline_parallelism > 1 or leave {key} at its default"
            ),
        )),
        None => check_spmd_options(c),
    }
}

/// An eval of a pipelined run goes through the stages' programs, traced for the training
/// batches: its batches must be packed as those are, and split into whole passes of the
/// schedule's microbatches (`eval_batch` sequences per eval step).
pub(crate) fn check_eval(c: &Config, plan: &PipelinePlan, eval_batch: usize) -> Result<(), ConfigError> {
    if c.eval_interval <= 0 {
        return Ok(());
    }
    if c.packing && !c.packed_batches() {
        return Err(ConfigError::invalid(
            "packing, dataset_type, eval_interval",
            format!(
                "eval with pipeline stages runs the stages' programs, traced for dataset_type={}'s unpacked batches, \
                 but packing=true packs the hf_eval_files batches; set packing=false (or train on dataset_type=hf)",
                c.dataset_type
            ),
        ));
    }
    let pass = plan.microbatches * plan.microbatch_size;
    if !eval_batch.is_multiple_of(pass) {
        return Err(ConfigError::invalid(
            "eval_per_device_batch_size, num_pipeline_microbatches",
            format!(
                "an eval step of {eval_batch} sequences does not split into passes of the pipeline's {} microbatches \
                 of {} sequences; make int(devices x eval_per_device_batch_size) a multiple of {pass}, or leave \
                 eval_per_device_batch_size at 0 (the training batch)",
                plan.microbatches, plan.microbatch_size
            ),
        ));
    }
    Ok(())
}

/// MaxText's options of its SPMD pipeline (a loop inside one program): only their defaults mean
/// something for separate stage programs.
/// Pipeline stages over several hosts or slices: the stage axis is DCN-outer, so the hosts form
/// `dcn_pipeline_parallelism` groups (mesh validation checks that the DCN axes multiply to the
/// hosts); a pipeline over several hosts without a DCN stage axis would put every stage on every
/// host, which is not supported yet. Running stages that span processes is refused where the
/// run places them (`train::pipeline::run::PipelinedPlan::on_process`); compiling them ahead of
/// time is not.
fn check_across_processes(c: &Config, num_slices: usize) -> Result<(), ConfigError> {
    if num_slices > 1 && c.dcn_pipeline_parallelism == 1 {
        return Err(ConfigError::invalid(
            "dcn_pipeline_parallelism, ici_pipeline_parallelism",
            format!(
                "pipeline stages inside each of {num_slices} hosts or slices are not supported yet: put the stages on \
                 different hosts (dcn_pipeline_parallelism, one group of stages a host), or run the pipeline inside \
                 one host and use dcn_data_parallelism or dcn_fsdp_parallelism across hosts"
            ),
        ));
    }
    Ok(())
}

fn check_spmd_options(c: &Config) -> Result<(), ConfigError> {
    let options = [
        ("pipeline_delay_activation_forwarding", c.pipeline_delay_activation_forwarding, false),
        ("pipeline_fsdp_ag_once", c.pipeline_fsdp_ag_once, false),
        ("pipeline_fsdp_ag_per_repeat", c.pipeline_fsdp_ag_per_repeat, false),
        ("scan_pipeline_iterations", c.scan_pipeline_iterations, true),
        ("scan_pipeline_repeats", c.scan_pipeline_repeats, false),
        ("scan_layers_per_stage", c.scan_layers_per_stage, false),
        ("set_remat_policy_on_pipeline_iterations", c.set_remat_policy_on_pipeline_iterations, true),
        ("set_remat_policy_on_layers_per_stage", c.set_remat_policy_on_layers_per_stage, false),
    ];
    match options.iter().find(|(_, value, default)| value != default) {
        Some((key, value, default)) => Err(ConfigError::invalid(
            *key,
            format!(
                "{key}={value} is not supported yet: it tunes MaxText's SPMD pipeline loop, and maxrs runs each stage \
                 as its own programs; leave it at {default}"
            ),
        )),
        None => Ok(()),
    }
}
