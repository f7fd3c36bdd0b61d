//! The traced programs of a training run: `init` (parameters and optimizer state, drawn on the
//! devices where they live) and `train_step` (loss, gradients, clipping, AdamW, schedule: one
//! executable). Both have the same state signature, so the outputs of one feed the other and
//! every step's outputs feed the next, never leaving the devices.
//!
//! Program names, which are also the names in saved files and AOT headers:
//! - `params.<name>`: the model's parameters (`Model::param_defs`), sharded by the logical
//!   axis rules, donated to the step;
//! - `opt_state.mu.<name>`, `opt_state.nu.<name>` (sharded like the parameter), `opt_state.count`
//!   (s32 scalar, replicated), donated;
//! - `fp8.<name>` with `quantization=fp8`: the scales and amax histories of the fp8 products
//!   (`Model::fp8_state_defs`, f32, replicated), donated; the step's new values are their
//!   "gradients" (`model::fp8`), which bypass the optimizer;
//! - `batch.inputs`, `batch.targets`, `batch.targets_segmentation`: s32 `[global_batch, seq]`,
//!   rows split over the mesh axes of `activation_batch`; with packed batches (`dataset_type=hf`,
//!   `packing=true`) also `batch.inputs_position` and `batch.inputs_segmentation`, which give the
//!   model each token's RoPE position and document (attention stays within a document);
//! - outputs: the new state under the same names, and f32 scalars `metrics.loss`,
//!   `metrics.grad_norm`, `metrics.learning_rate`, `metrics.total_weights`, `metrics.z_loss`, and
//!   `metrics.<name>` for each auxiliary loss the model's layers report (`moe_lb_loss`).
//!
//! With `use_dpo` (`super::dpo`) the batch arrays are `inputs`, `targets`,
//! `targets_segmentation` and `inputs_segmentation`, s32 `[global_batch, 2 * seq]`: each row is a
//! preference pair, its chosen row then its rejected row (`data::preference`), so that a pair
//! stays on one device and a process's rows are whole pairs. DPO without LoRA carries
//! `reference.<name>`, the frozen reference model (donated and returned as it came). The
//! metrics are the loss, `grad_norm`, `learning_rate`, `total_weights` (the responses' tokens),
//! and Tunix's preference metrics (`metrics.rewards.chosen`, ...); the layers' auxiliary losses are
//! not part of the loss, as in Tunix's DPO (`super::dpo`).

use std::collections::BTreeSet;

use crate::autodiff::value_and_grad_with_aux;
use crate::config::{Config, Derived};
use crate::ir::{DType, Program, Signature};
use crate::model::{fp8, params, Model};
use crate::sharding::{Mesh, PartitionSpec};
use crate::tensor::{random, scan, trace, Tensor, TraceError, Tree};

use crate::train_state::{Group, OptState, StateArray, TrainState};

use super::dpo::{means, without_adapters, Algo, Dpo};
use super::optimizer::AdamW;

/// The batch arrays every step reads.
pub const BATCH_INPUTS: &[&str] = &["inputs", "targets", "targets_segmentation"];
/// The arrays a step on packed batches reads too (`Config::packed_batches`). Unpacked rows (token
/// files, `synthetic_progression`, `packing=false`) hold one sequence from position 0, which is what the model assumes
/// without
/// them, so their programs stay without these inputs.
pub const PACKED_INPUTS: &[&str] = &["inputs_position", "inputs_segmentation"];

/// The batch arrays of a preference step (`use_dpo`): what `dpo::row_logps` reads.
pub const PREFERENCE_INPUTS: &[&str] = &["inputs", "targets", "targets_segmentation", "inputs_segmentation"];

/// The batch arrays of a step on packed (`packed`) or unpacked batches.
pub fn batch_inputs(packed: bool) -> Vec<&'static str> {
    let extra = if packed { PACKED_INPUTS } else { &[] };
    BATCH_INPUTS.iter().chain(extra).copied().collect()
}

/// Everything that decides the traced programs.
#[derive(Clone, Debug)]
pub struct TrainStep {
    pub model: Model,
    pub optimizer: AdamW,
    /// Sequences per optimizer step (all micro-batches).
    pub global_batch: i64,
    pub seq: i64,
    /// Micro-batches per step (`gradient_accumulation_steps`).
    pub accumulation: i64,
    pub z_loss_multiplier: f64,
    pub init_weights_seed: u32,
    /// The device mesh (none: one device, no sharding annotations).
    pub mesh: Option<Mesh>,
    /// Training batches are packed documents (`dataset_type=hf` with `packing=true`).
    pub packed: bool,
    /// `use_dpo`: the loss is a preference loss over pairs.
    pub dpo: Option<Dpo>,
}

impl TrainStep {
    pub fn new(c: &Config, derived: &Derived, mesh: Option<Mesh>) -> anyhow::Result<TrainStep> {
        Ok(TrainStep {
            model: Model::from_config(c)?,
            optimizer: AdamW::from_config(c)?,
            global_batch: derived.global_batch_size as i64,
            seq: derived.max_target_length as i64,
            accumulation: derived.gradient_accumulation_steps as i64,
            z_loss_multiplier: c.z_loss_multiplier,
            init_weights_seed: c.init_weights_seed as u32,
            mesh,
            packed: c.packed_batches(),
            dpo: Dpo::from_config(c),
        })
    }

    /// The train state this step carries (`train_state`): with DPO's reference copy.
    pub fn state(&self) -> TrainState {
        let state = TrainState::of(&self.model);
        match &self.dpo {
            Some(dpo) if dpo.keeps_reference_copy(&self.model) => state.with_reference(),
            _ => state,
        }
    }

    /// The train step's batch arrays and their width: a preference pair's two rows side by side.
    pub fn batch_names(&self) -> (Vec<&'static str>, i64) {
        match self.dpo {
            Some(_) => (PREFERENCE_INPUTS.to_vec(), 2 * self.seq),
            None => (batch_inputs(self.packed), self.seq),
        }
    }

    /// The sharding of a state array (none: one device).
    fn state_sharding(&self, array: &StateArray) -> Option<PartitionSpec> {
        self.mesh.as_ref().map(|m| array.sharding(&self.model.config.rules, m))
    }

    /// The sharding of the `[global_batch, seq]` batch arrays.
    pub fn batch_sharding(&self) -> Option<PartitionSpec> {
        self.mesh.as_ref().map(|m| self.model.config.rules.spec(&["activation_batch", "activation_length"], m))
    }

    fn signature(&self) -> Signature {
        let mut sig = Signature::new(self.mesh.clone());
        for array in &self.state().arrays {
            let (name, sharding) = (array.name(), self.state_sharding(array));
            if let Some(spec) = &sharding {
                sig.output_sharding(&name, spec.clone());
            }
            let input = sig.input(&name, array.dtype, &array.def.shape);
            input.donated();
            if let Some(spec) = sharding {
                input.sharded(spec);
            }
        }
        sig
    }

    /// The program that creates the initial state from `init_weights_seed`: no inputs; outputs
    /// the step's state inputs, already sharded: all of them but the parameters `given` (their
    /// keys), which come from elsewhere (`load_parameters_path`; under LoRA its base model, the
    /// adapters drawn here or given by `lora.lora_restore_path`).
    pub fn init(&self, given: &BTreeSet<String>) -> Result<Program, TraceError> {
        // DPO's reference copy is drawn with the parameters it copies, or given with them.
        let drawn =
            |group: Group, key: &str| !matches!(group, Group::Params | Group::Reference) || !given.contains(key);
        let mut sig = Signature::new(self.mesh.clone());
        for array in &self.state().arrays {
            if let Some(spec) = self.state_sharding(array).filter(|_| drawn(array.group, &array.def.name)) {
                sig.output_sharding(&array.name(), spec);
            }
        }
        trace(&sig, |ctx, _| {
            let key = random::key(ctx, self.init_weights_seed);
            let params = self.model.init_params(&key);
            let mut out = self.optimizer.init(&self.state().split_frozen(&params).0).into_names();
            out.extend(Group::Fp8.prefixed(params::init(&self.model.fp8_state_defs(), DType::F32, &key)));
            let params: Tree =
                params.iter().filter(|(k, _)| drawn(Group::Params, k)).map(|(k, v)| (k, v.clone())).collect();
            if self.state().group(Group::Reference).next().is_some() {
                // DPO's reference starts as the starting weights; given ones are copied in
                // where they are put (`SpmdStep::initialize`).
                out.extend(Group::Reference.prefixed(params.clone()));
            }
            out.extend(Group::Params.prefixed(params));
            out
        })
    }

    /// The train step: `(state, batch) -> (state, metrics)`.
    pub fn train_step(&self) -> Result<Program, TraceError> {
        let mut sig = self.signature();
        let (names, width) = self.batch_names();
        for name in names {
            let input = sig.input(&format!("batch.{name}"), DType::S32, &[self.global_batch, width]);
            if let Some(spec) = self.batch_sharding() {
                input.sharded(spec);
            }
        }
        if let Some(dpo) = &self.dpo {
            return trace(&sig, |_, inp| self.preference_step(dpo, inp));
        }
        trace(&sig, |_, inp| {
            let (state, batch) = (OptState::from_names(inp), inp.subtree("batch"));
            let (params, frozen) = self.state().split_frozen(&Group::Params.subtree(inp));
            let (loss, aux, grads, new_fp8) = self.loss_and_grads(&params, &frozen, &Group::Fp8.subtree(inp), &batch);
            let (mut new_params, new_state, opt_metrics) = self.optimizer.update(&params, &grads, &state);
            // Frozen parameters (the base weights under LoRA) come back as they went in: their
            // donated buffers are the outputs, no copy.
            new_params.extend(frozen);
            let mut metrics = opt_metrics
                .with("loss", loss)
                .with("total_weights", aux["total_weights"].clone())
                .with("z_loss", aux["z_loss"].clone());
            metrics.extend(aux.subtree("aux_losses"));
            let mut out = Group::Params.prefixed(new_params);
            out.extend(new_state.into_names());
            out.extend(Group::Fp8.prefixed(new_fp8));
            out.extend(metrics.prefixed("metrics"));
            out
        })
    }

    /// The train step of `use_dpo` on its inputs `inp`: the preference loss of the pairs (each
    /// row's first `seq` columns are the chosen row, the rest the rejected one) against the
    /// reference model (the frozen copy; under LoRA the base without adapters; none for ORPO).
    fn preference_step(&self, dpo: &Dpo, inp: &Tree) -> Tree {
        let (state, batch) = (OptState::from_names(inp), inp.subtree("batch"));
        let (params, frozen) = self.state().split_frozen(&Group::Params.subtree(inp));
        let copy = Group::Reference.subtree(inp);
        let (loss, sums, grads) = self.preference_loss_and_grads(dpo, &params, &frozen, &copy, &batch);
        let (mut new_params, new_state, opt_metrics) = self.optimizer.update(&params, &grads, &state);
        new_params.extend(frozen);
        let mut metrics = opt_metrics.with("loss", loss).with("total_weights", sums["total_weights"].clone());
        metrics.extend(means(&sums));
        let mut out = Group::Params.prefixed(new_params);
        out.extend(Group::Reference.prefixed(copy));
        out.extend(new_state.into_names());
        out.extend(metrics.prefixed("metrics"));
        out
    }

    /// The preference loss of `batch`'s pairs (the mean over them), its sums (`Dpo::loss`) and
    /// the gradients of the loss. With gradient accumulation the pairs are split into
    /// micro-batches scanned in sequence (as [`Self::micro_batches`] splits them); each
    /// contributes the gradient of its loss summed over its pairs, and the sum is divided by the
    /// number of pairs at the end: the gradient of the whole batch's mean, as Tunix accumulates a
    /// `WeightedMetric` loss (`tunix/sft/peft_trainer.py` at c7d8950: the unreduced gradients
    /// added up with the loss's denominator, the pairs, then divided by their sum).
    fn preference_loss_and_grads(
        &self,
        dpo: &Dpo,
        params: &Tree,
        frozen: &Tree,
        copy: &Tree,
        batch: &Tree,
    ) -> (Tensor, Tree, Tree) {
        let sums_of = |p: &Tree, pairs: &Tree| {
            let mut all = p.clone();
            all.extend(frozen.clone());
            let reference = self.reference(dpo, copy, &all);
            let (chosen, rejected) = self.pair_sides(pairs);
            dpo.loss(&self.model, &all, reference.as_ref(), &chosen, &rejected)
        };
        if self.accumulation == 1 {
            return value_and_grad_with_aux(params, |p| sums_of(p, batch));
        }
        let carry = params.map(|_, p| p.zeros_like());
        let (grads, per_micro_batch) = scan(&carry, &self.micro_batches(batch, 2 * self.seq), |carry, mb| {
            let (_, sums, grads) = value_and_grad_with_aux(params, |p| {
                let (_, sums) = sums_of(p, mb);
                (sums["total_loss"].clone(), sums)
            });
            (grads.map(|name, g| &carry[name] + g), sums)
        });
        let sums = per_micro_batch.map(|_, per| per.sum(&[0]));
        let pairs = sums["pairs"].maximum(1.0);
        let grads = grads.map(|_, g| g / &pairs.astype(g.dtype()));
        (&sums["total_loss"] / &pairs, sums, grads)
    }

    /// The eval step: `(params, batch of rows x seq) -> metrics` (loss only, no update): f32
    /// scalars `metrics.loss`, `metrics.total_loss`, `metrics.total_weights`, `metrics.z_loss`,
    /// and `metrics.<name>` for each auxiliary loss (as the train step).
    /// The parameters (and fp8 state) are the train state's arrays, read (not donated); `packed`
    /// as for [`batch_inputs`].
    pub fn eval_step(&self, rows: i64, packed: bool) -> Result<Program, TraceError> {
        if let Some(dpo) = &self.dpo {
            return self.preference_eval_step(dpo, rows);
        }
        let sig = self.eval_signature(&batch_inputs(packed), rows, self.seq);
        trace(&sig, |_, inp| {
            let mut model_inputs = Group::Params.subtree(inp);
            model_inputs.extend(Group::Fp8.subtree(inp));
            let (loss, aux) = self.model.loss(&model_inputs, &inp.subtree("batch"), self.z_loss_multiplier);
            let mut metrics = Tree::new()
                .with("loss", loss)
                .with("total_loss", aux["total_loss"].clone())
                .with("total_weights", aux["total_weights"].clone())
                .with("z_loss", aux["z_loss"].clone());
            metrics.extend(aux.subtree("aux_losses"));
            metrics.prefixed("metrics")
        })
    }

    /// An eval step's inputs: the state arrays the forward pass reads (read, not donated) and the
    /// batch arrays `names`, each `[rows, width]`.
    fn eval_signature(&self, names: &[&str], rows: i64, width: i64) -> Signature {
        let mut sig = Signature::new(self.mesh.clone());
        for array in self.state().arrays.iter().filter(|a| a.group.read_by_forward()) {
            let input = sig.input(&array.name(), array.dtype, &array.def.shape);
            if let Some(spec) = self.state_sharding(array) {
                input.sharded(spec);
            }
        }
        for name in names {
            let input = sig.input(&format!("batch.{name}"), DType::S32, &[rows, width]);
            if let Some(spec) = self.batch_sharding() {
                input.sharded(spec);
            }
        }
        sig
    }

    /// The chosen and the rejected sides of a preference batch (`[rows, 2 * seq]` arrays).
    fn pair_sides(&self, batch: &Tree) -> (Tree, Tree) {
        let side = |half: i64| batch.map(|_, x| x.slice_axis(1, half * self.seq, (half + 1) * self.seq));
        (side(0), side(1))
    }

    /// DPO's reference model: the frozen copy `copy` (`reference.*`), or under LoRA the
    /// parameters `params` without their adapters; none for ORPO.
    fn reference(&self, dpo: &Dpo, copy: &Tree, params: &Tree) -> Option<Tree> {
        match (dpo.algo, copy.is_empty()) {
            (Algo::Orpo, _) => None,
            (_, false) => Some(copy.clone()),
            (_, true) => Some(without_adapters(&self.model, params)),
        }
    }

    /// The eval step of `use_dpo`: the preference loss of `rows` pairs (`[rows, 2 * seq]`, as the
    /// train step's) with the current parameters and reference. `metrics.total_loss` is the
    /// loss summed over the pairs and `metrics.total_weights` their number, so that an eval's
    /// `eval/avg_loss` is the mean over its pairs; `metrics.z_loss` is 0; `metrics.sums.<metric>`
    /// are the preference metrics summed over the pairs (the evaluator adds them up over its
    /// batches and divides by the pairs).
    fn preference_eval_step(&self, dpo: &Dpo, rows: i64) -> Result<Program, TraceError> {
        let (names, width) = self.batch_names();
        let sig = self.eval_signature(&names, rows, width);
        trace(&sig, |_, inp| {
            let params = Group::Params.subtree(inp);
            let reference = self.reference(dpo, &Group::Reference.subtree(inp), &params);
            let (chosen, rejected) = self.pair_sides(&inp.subtree("batch"));
            let (loss, aux) = dpo.loss(&self.model, &params, reference.as_ref(), &chosen, &rejected);
            let mut metrics = Tree::new()
                .with("loss", loss)
                .with("total_loss", aux["total_loss"].clone())
                .with("total_weights", aux["pairs"].clone())
                .with("z_loss", aux["pairs"].zeros_like());
            metrics.extend(aux.subtree("sums").prefixed("sums"));
            metrics.prefixed("metrics")
        })
    }

    /// The mean loss, its aux values and the gradients of the mean loss. With gradient
    /// accumulation the batch is split into micro-batches scanned in sequence; each contributes
    /// the gradient of its summed loss, and the sum is divided by the total token count at the
    /// end, which equals the gradient of the whole batch's mean loss. The layers' auxiliary
    /// losses count as their mean over micro-batches (as MaxText reports them); each
    /// micro-batch's are scaled by `tokens / micro-batches` before that division so that the
    /// gradient is the reported loss's. (MaxText's accumulation divides their gradient by the
    /// token count too, which weights them far less than the loss it reports.)
    ///
    /// Returns the fp8 state's new values too (its "gradients", `model::fp8`), which validation
    /// allows only without accumulation. The `frozen` parameters are read but not
    /// differentiated: their gradients are never computed.
    fn loss_and_grads(
        &self,
        params: &Tree,
        frozen: &Tree,
        fp8_state: &Tree,
        batch: &Tree,
    ) -> (Tensor, Tree, Tree, Tree) {
        let z = self.z_loss_multiplier;
        let with_frozen = |p: &Tree| {
            let mut all = p.clone();
            all.extend(frozen.clone());
            all
        };
        if self.accumulation == 1 {
            let mut inputs = params.clone();
            inputs.extend(fp8_state.clone());
            let (loss, aux, grads) = value_and_grad_with_aux(&inputs, |p| self.model.loss(&with_frozen(p), batch, z));
            let names: Vec<String> = fp8_state.names().map(str::to_string).collect();
            let (grads, new_fp8) = fp8::split(&grads, &names);
            return (loss, aux, grads, new_fp8);
        }
        assert!(fp8_state.is_empty(), "validation refuses quantization=fp8 with gradient accumulation");
        let a = self.accumulation;
        let micro_batches = self.micro_batches(batch, self.seq);
        let f32_zero = |t: &Tensor| t.trace().scalar(0.0, DType::F32);
        let step_weights = batch["targets_segmentation"].ne(0).astype(DType::F32).sum_all();
        let aux_scale = step_weights.maximum(1.0) / a as f64;
        let first = params.values().next().expect("a model has parameters");
        let carry = params
            .map(|_, p| p.zeros_like())
            .prefixed("grad")
            .with("total_loss", f32_zero(first))
            .with("total_weights", f32_zero(first))
            .with("z_loss_sum", f32_zero(first));
        let (sums, per_micro_batch) = scan(&carry, &micro_batches, |carry, mb| {
            let (_, aux, grads) = value_and_grad_with_aux(params, |p| {
                let (_, aux) = self.model.loss(&with_frozen(p), mb, z);
                let mut objective = aux["total_loss"].clone();
                for (_, value) in aux.subtree("aux_losses").iter() {
                    objective = objective + &(value * &aux_scale);
                }
                (objective, aux)
            });
            let mut next: Tree =
                grads.iter().map(|(n, g)| (format!("grad.{n}"), &carry[&format!("grad.{n}")] + g)).collect();
            next.insert("total_loss", &carry["total_loss"] + &aux["total_loss"]);
            next.insert("total_weights", &carry["total_weights"] + &aux["total_weights"]);
            next.insert("z_loss_sum", &carry["z_loss_sum"] + &(&aux["z_loss"] * &aux["total_weights"]));
            (next, aux.subtree("aux_losses").prefixed("aux_losses"))
        });
        let weights = sums["total_weights"].maximum(1.0);
        let grads = sums.subtree("grad").map(|_, g| g / &weights.astype(g.dtype()));
        let aux_losses = per_micro_batch.subtree("aux_losses").map(|_, per| per.mean(&[0]));
        let mut loss = &sums["total_loss"] / &weights;
        for (_, value) in aux_losses.iter() {
            loss = loss + value;
        }
        let mut aux = Tree::new()
            .with("total_loss", sums["total_loss"].clone())
            .with("total_weights", sums["total_weights"].clone())
            .with("z_loss", &sums["z_loss_sum"] / &weights);
        aux.extend(aux_losses.prefixed("aux_losses"));
        (loss, aux, grads, Tree::new())
    }

    /// The batch arrays (`[global_batch, width]`) as `accumulation` micro-batches
    /// (`[accumulation, global_batch / accumulation, width]`): row r of micro-batch k is global
    /// row r * accumulation + k, so that every device keeps its own rows.
    fn micro_batches(&self, batch: &Tree, width: i64) -> Tree {
        let (a, micro) = (self.accumulation, self.global_batch / self.accumulation);
        batch.map(|_, x| {
            let x = x.reshape(&[micro, a, width]).transpose(&[1, 0, 2]);
            match self.batch_sharding() {
                Some(spec) => {
                    let spec = PartitionSpec::from_axes(vec![vec![], spec.dim(0).to_vec(), spec.dim(1).to_vec()]);
                    x.with_sharding_constraint(&spec)
                }
                None => x,
            }
        })
    }
}
