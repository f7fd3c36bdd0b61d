//! The traced programs of a pipelined train step. Per chunk (virtual stage), on its stage's
//! devices:
//!
//! - **forward** `chunk.{c}.forward`: `params.*` (the parameters the chunk reads), `batch.inputs`
//!   (with packing also `batch.inputs_position` and `batch.inputs_segmentation`; and
//!   `batch.targets`, `batch.targets_segmentation` on the last chunk), `activation` (the
//!   previous chunk's output, `[microbatch, seq, emb]`, donated; the first chunk embeds the
//!   tokens instead) -> `activation` (the chunk's output, for the next chunk),
//!   `residual.layer_inputs` (`[layers of the chunk, microbatch, seq, emb]`, kept on the stage
//!   for the backward pass) and `metrics.aux.<name>` (each auxiliary loss of the layers, e.g.
//!   MoE's `moe_lb_loss`, summed over the chunk's layers). The last chunk also runs the final
//!   norm, the logits and the loss and differentiates them at once: it also reads `loss_scale`
//!   (one over the step's token count, so that every gradient is of the step's mean loss, as
//!   the unpipelined step's), and its outputs are `residual.cotangent` (the scaled loss's
//!   gradient with respect to the last layer's output), the summed `metrics.total_loss`,
//!   `metrics.total_weights` and `metrics.z_loss_sum`, and `grad.*` of the head's parameters
//!   (accumulators, donated).
//! - **backward** `chunk.{c}.backward`: `params.*`, the batch's token arrays,
//!   `residual.layer_inputs`, `cotangent` (the next chunk's input gradient; `residual.cotangent`
//!   on the last chunk), `aux_weight` (the weight of each layer's auxiliary losses in the step's
//!   loss) and the `grad.*` accumulators (donated) -> `cotangent` (for the previous chunk; the
//!   first chunk adds it to the embeddings' gradients instead) and the accumulators plus this
//!   microbatch's share of the gradients of the step's loss. Each layer is recomputed from its
//!   saved input (`Model::layers_backward`).
//!
//! - **eval** `eval.head` (on the last stage): the last chunk's forward with the loss and
//!   without gradients (an eval's forward runs the other chunks' forward programs and drops
//!   their `residual.layer_inputs`): `params.*`, the batch's arrays with the targets,
//!   `activation` (donated) -> the `metrics.*` of the last chunk's forward.
//!
//! Per stage: **norm** `stage.{s}.norm` (`grad.*` -> `sumsq`, the squared norm of the stage's
//! gradients) and **update** `stage.{s}.update` (`params.*`, `opt_state.*`, `grad.*` donated,
//! `grad_norm` -> the new parameters and optimizer state, zeroed accumulators and
//! `metrics.learning_rate`): the unpipelined step's
//! clipping, AdamW and schedule, with the norm over every stage. And once, on every device,
//! **init**: the unpipelined initializer's parameters (same draws), their optimizer state and
//! zero accumulators, with stacked layers in stage-major order and split over the `stage` axis,
//! so each stage's devices end up holding exactly that stage's arrays.
//!
//! With `quantization=fp8` the forward, backward and eval programs also read `fp8.*` (the
//! delayed-scaling state of the chunk's quantized products, `model::fp8`), and the backward
//! program keeps the new state its products compute (their "gradients") in `fp8_next.*`
//! (donated), as the element-wise maximum over the step's microbatches: flax's answer for fp8
//! state shared by the microbatches of a pipeline (`fp32_max_grad` in `flax/linen/fp8_ops.py`,
//! whose gradients accumulate with `max`, used by MaxText's pipelines through
//! `Fp8DirectDotGeneralOp`). Every microbatch of a step quantizes with the same scales (those
//! of the state before the step), so the maximum is the history with the step's largest amax
//! at its head: what one unpipelined step over the whole batch computes. The update program
//! makes `fp8_next.*` the new `fp8.*` and zeroes it.

use anyhow::{anyhow, bail, Result};

use super::layout::StageLayout;
use crate::autodiff::{value_and_grad, value_and_grad_with_aux};
use crate::config::{Config, Derived};
use crate::ir::{DType, Program, Signature};
use crate::model::attention::LayerContext;
use crate::model::family::BTE;
use crate::model::{params, Model, ParamDef, ParamRole};
use crate::sharding::{Mesh, PartitionSpec};
use crate::tensor::{random, trace, Tensor, TraceError, Tree};
use crate::train::optimizer::AdamW;
use crate::train::step::batch_inputs;
use crate::train_state::{Group, OptState};

/// Everything that decides a pipelined step's programs.
#[derive(Clone, Debug)]
pub struct PipelineStep {
    pub model: Model,
    pub optimizer: AdamW,
    pub layout: StageLayout,
    /// Sequences per microbatch.
    pub microbatch: i64,
    pub seq: i64,
    pub z_loss_multiplier: f64,
    pub init_weights_seed: u32,
    /// Batches are packed documents (`inputs_position`, `inputs_segmentation` too).
    pub packed: bool,
    /// Every device of the pipeline.
    pub mesh: Mesh,
    /// Each stage's devices (`mesh` at that index of the `stage` axis).
    pub stage_meshes: Vec<Mesh>,
}

/// The programs one stage runs.
pub struct StagePrograms {
    /// Per chunk the stage runs, in [`StageLayout::stage_chunks`] order.
    pub forward: Vec<Program>,
    pub backward: Vec<Program>,
    pub norm: Program,
    pub update: Program,
}

/// The prefix of a stage's gradient accumulators (`grad.<parameter>`), which only a pipeline
/// keeps: its train state is `train_state`'s.
pub const GRAD: &str = "grad";
/// The prefix of a stage's fp8 state accumulators (`fp8_next.<product>.<name>`): the new fp8
/// state of the step so far, the element-wise maximum of every microbatch's (see the module docs).
pub const FP8_NEXT: &str = "fp8_next";

impl PipelineStep {
    /// The step of a validated pipelined config on `mesh` (the whole mesh, with its `stage`
    /// axis).
    pub fn new(c: &Config, derived: &Derived, mesh: Mesh) -> Result<PipelineStep> {
        let plan = derived.pipeline.as_ref().ok_or_else(|| anyhow!("the config has no pipeline"))?;
        let layout = StageLayout::new(plan);
        let stage_meshes = (0..layout.stages).map(|s| layout.stage_mesh(&mesh, s)).collect::<Result<_>>()?;
        let model = Model::from_config(c)?;
        if let [first, second, ..] = model.stacks() {
            bail!(
                "ici_pipeline_parallelism={}, dcn_pipeline_parallelism={}: pipeline parallelism over a model of several \
                 stacks of layers (decoder.{} and decoder.{}) is not supported yet; set both to 1",
                c.ici_pipeline_parallelism,
                c.dcn_pipeline_parallelism,
                first.name,
                second.name
            );
        }
        // The plan splits the config's decoder layers; a family that scans several of them as one
        // stacked row (Gemma 3's blocks of 6) would have its rows cut wrongly.
        let planned = (plan.virtual_stages() * plan.layers_per_stage) as i64;
        if let [stack] = model.stacks() {
            if stack.count != planned {
                bail!(
                    "ici_pipeline_parallelism={}, dcn_pipeline_parallelism={}: pipeline parallelism splits \
                     base_num_decoder_layers={} into stages, but decoder_block={} scans them as {} blocks \
                     (decoder.{}); pipeline parallelism for it is not supported yet; set both to 1",
                    c.ici_pipeline_parallelism,
                    c.dcn_pipeline_parallelism,
                    c.base_num_decoder_layers,
                    c.decoder_block,
                    stack.count,
                    stack.name
                );
            }
        }
        Ok(PipelineStep {
            model,
            optimizer: AdamW::from_config(c)?,
            layout,
            microbatch: plan.microbatch_size as i64,
            seq: derived.max_target_length as i64,
            z_loss_multiplier: c.z_loss_multiplier,
            init_weights_seed: c.init_weights_seed as u32,
            packed: c.packed_batches(),
            mesh,
            stage_meshes,
        })
    }

    /// The model's definitions of a train-state group laid out as the parameters are: the
    /// parameters (and their moments) or the fp8 state.
    pub fn full_defs(&self, group: Group) -> Vec<ParamDef> {
        match group {
            Group::Fp8 => self.model.fp8_state_defs(),
            _ => self.model.param_defs(),
        }
    }

    /// A parameter's sharding inside a stage (the logical rules; the `stage` axis has size 1
    /// there, so it never appears).
    pub fn param_spec(&self, def: &ParamDef) -> PartitionSpec {
        self.model.config.rules.spec(&def.logical, &self.stage_meshes[0])
    }

    /// The sharding of `[microbatch, seq, emb]` activations inside a stage.
    pub fn activation_spec(&self) -> PartitionSpec {
        self.model.config.rules.spec(BTE, &self.stage_meshes[0])
    }

    /// The sharding of `[microbatch, seq]` token arrays inside a stage.
    pub fn batch_spec(&self) -> PartitionSpec {
        self.model.config.rules.spec(&["activation_batch", "activation_length"], &self.stage_meshes[0])
    }

    /// The sharding of `[layers, microbatch, seq, emb]` saved layer inputs.
    fn residual_spec(&self) -> PartitionSpec {
        let act = self.activation_spec();
        PartitionSpec::from_axes([vec![]].into_iter().chain((0..3).map(|d| act.dim(d).to_vec())).collect())
    }

    fn activation_shape(&self) -> [i64; 3] {
        [self.microbatch, self.seq, self.model.config.emb]
    }

    fn is_stacked(&self, def: &ParamDef) -> bool {
        self.model.param_role(&def.name) == ParamRole::StackedLayers
    }

    /// Declares `{prefix}.{name}` inputs for `defs` (donated when asked), with those outputs'
    /// shardings when they are donated (so each aliases its input): in `weight_dtype`, or f32
    /// for the fp8 state and its accumulators (prefixes `fp8`, `fp8_next`).
    fn declare(&self, sig: &mut Signature, prefix: &str, defs: &[ParamDef], donated: bool) {
        let fp8 = prefix == Group::Fp8.prefix() || prefix == FP8_NEXT;
        let dtype = if fp8 { DType::F32 } else { self.model.config.weight_dtype };
        for def in defs {
            let name = format!("{prefix}.{}", def.name);
            let spec = self.param_spec(def);
            let input = sig.input(&name, dtype, &def.shape);
            input.sharded(spec.clone());
            if donated {
                input.donated();
                sig.output_sharding(&name, spec);
            }
        }
    }

    /// The microbatch's arrays a chunk reads: the tokens (and packing's positions and segments);
    /// `with_targets` (the last chunk, which computes the loss) the targets too.
    fn declare_batch(&self, sig: &mut Signature, with_targets: bool) {
        let names = batch_inputs(self.packed);
        for name in names.iter().filter(|n| with_targets || !n.starts_with("targets")) {
            sig.input(&format!("batch.{name}"), DType::S32, &[self.microbatch, self.seq]).sharded(self.batch_spec());
        }
    }

    /// The layer parameters of `chunk` under the model's names: with several repeats, the
    /// chunk's rows of the stage's stacked arrays.
    fn chunk_layer_params(&self, params: &Tree, chunk: usize) -> Tree {
        let rows = self.layout.chunk_rows(chunk);
        params
            .iter()
            .map(|(name, p)| match self.model.param_role(name) {
                ParamRole::StackedLayers if self.layout.repeats > 1 => {
                    (name.to_string(), p.slice_axis(0, rows.start, rows.end))
                }
                _ => (name.to_string(), p.clone()),
            })
            .collect()
    }

    /// The fp8 state `chunk` reads (`quantization=fp8`; none otherwise).
    fn chunk_fp8(&self, chunk: usize) -> Vec<ParamDef> {
        self.layout.chunk_defs(&self.model, &self.model.fp8_state_defs(), chunk)
    }

    /// What the model's layers and head read from a chunk program's inputs: the parameters and
    /// the fp8 state of the quantized products, under the model's names.
    fn model_inputs(inp: &Tree) -> Tree {
        let mut params = Group::Params.subtree(inp);
        params.extend(Group::Fp8.subtree(inp));
        params
    }

    /// `combine(acc, g)`, where `g` is for `chunk`'s rows when `name` is stacked over several
    /// repeats (only those rows of `acc` change).
    fn accumulate(
        &self,
        name: &str,
        acc: &Tensor,
        g: &Tensor,
        chunk: usize,
        combine: impl Fn(&Tensor, &Tensor) -> Tensor,
    ) -> Tensor {
        match self.model.param_role(name) {
            ParamRole::StackedLayers if self.layout.repeats > 1 => {
                let rows = self.layout.chunk_rows(chunk);
                let ctx = acc.trace();
                let mut starts = vec![ctx.scalar(rows.start as f64, DType::S32)];
                starts.extend((1..acc.rank()).map(|_| ctx.scalar(0.0, DType::S32)));
                let updated = combine(&acc.slice_axis(0, rows.start, rows.end), g);
                acc.dynamic_update_slice(&updated, &starts.iter().collect::<Vec<_>>())
            }
            _ => combine(acc, g),
        }
    }

    fn head_defs(&self, chunk: usize) -> Vec<ParamDef> {
        let defs = self.layout.chunk_params(&self.model, chunk);
        defs.into_iter().filter(|d| self.model.param_role(&d.name) == ParamRole::Head).collect()
    }

    /// The forward program of `chunk` (see the module docs).
    pub fn forward(&self, chunk: usize) -> Result<Program, TraceError> {
        let (first, last) = (self.layout.is_first(chunk), self.layout.is_last(chunk));
        let mesh = &self.stage_meshes[self.layout.stage_of(chunk)];
        let c = &self.model.config;
        let mut sig = Signature::new(Some(mesh.clone()));
        self.declare(&mut sig, Group::Params.prefix(), &self.layout.chunk_params(&self.model, chunk), false);
        self.declare(&mut sig, Group::Fp8.prefix(), &self.chunk_fp8(chunk), false);
        self.declare_batch(&mut sig, last);
        let act = self.activation_spec();
        if !first {
            sig.input("activation", c.dtype, &self.activation_shape()).sharded(act.clone()).donated();
        }
        if last {
            sig.input("loss_scale", DType::F32, &[]);
            self.declare(&mut sig, GRAD, &self.head_defs(chunk), true);
            sig.output_sharding("residual.cotangent", act.clone());
            for name in ["total_loss", "total_weights", "z_loss_sum"] {
                sig.output_sharding(&format!("metrics.{name}"), PartitionSpec::replicated());
            }
        } else {
            sig.output_sharding("activation", act.clone());
        }
        sig.output_sharding("residual.layer_inputs", self.residual_spec());
        let layers = self.layout.chunk_layers(chunk);
        trace(&sig, |_, inp| {
            let (params, batch) = (Self::model_inputs(inp), inp.subtree("batch"));
            let context = LayerContext::new(c, &batch);
            let x = if first {
                self.model.embed(&params, &batch["inputs"], &context.positions)
            } else {
                inp["activation"].clone()
            };
            let (y, inputs, aux_sums) =
                self.model.layers_forward(&self.chunk_layer_params(&params, chunk), layers, &x, &context);
            let mut out = Tree::new().with("residual.layer_inputs", inputs);
            out.extend(aux_sums.prefixed("metrics.aux"));
            if !last {
                return out.with("activation", y);
            }
            // The head: forward and backward at once, its gradients straight into the accumulators.
            let head: Tree = params
                .iter()
                .filter(|(n, _)| self.model.param_role(n) == ParamRole::Head)
                .map(|(n, p)| (n, p.clone()))
                .collect();
            let args = head.prefixed("head").with("y", y);
            let z = self.z_loss_multiplier;
            let (_, aux, grads) = value_and_grad_with_aux(&args, |a| {
                let (_, aux) = self.model.head_loss(&a.subtree("head"), &a["y"], &batch, z);
                (&aux["total_loss"] * &inp["loss_scale"], aux)
            });
            for (name, g) in grads.subtree("head").iter() {
                let acc = &inp[&format!("{GRAD}.{name}")];
                out.insert(format!("{GRAD}.{name}"), self.accumulate(name, acc, g, chunk, |a, g| a + g));
            }
            out.insert("residual.cotangent", grads["y"].clone());
            out.insert("metrics.total_loss", aux["total_loss"].clone());
            out.insert("metrics.total_weights", aux["total_weights"].clone());
            out.insert("metrics.z_loss_sum", &aux["z_loss"] * &aux["total_weights"]);
            out
        })
    }

    /// The eval program of the last chunk (see the module docs): its forward without the
    /// head's gradients, so an eval leaves the train state (the accumulators) untouched.
    pub fn eval_head(&self) -> Result<Program, TraceError> {
        let chunk = self.layout.chunks() - 1;
        let mesh = &self.stage_meshes[self.layout.stage_of(chunk)];
        let c = &self.model.config;
        let mut sig = Signature::new(Some(mesh.clone()));
        self.declare(&mut sig, Group::Params.prefix(), &self.layout.chunk_params(&self.model, chunk), false);
        self.declare(&mut sig, Group::Fp8.prefix(), &self.chunk_fp8(chunk), false);
        self.declare_batch(&mut sig, true);
        sig.input("activation", c.dtype, &self.activation_shape()).sharded(self.activation_spec()).donated();
        for name in ["total_loss", "total_weights", "z_loss_sum"] {
            sig.output_sharding(&format!("metrics.{name}"), PartitionSpec::replicated());
        }
        let layers = self.layout.chunk_layers(chunk);
        trace(&sig, |_, inp| {
            let (params, batch) = (Self::model_inputs(inp), inp.subtree("batch"));
            let context = LayerContext::new(c, &batch);
            let layer_params = self.chunk_layer_params(&params, chunk);
            let (y, _, aux_sums) = self.model.layers_forward(&layer_params, layers, &inp["activation"], &context);
            let (_, aux) = self.model.head_loss(&params, &y, &batch, self.z_loss_multiplier);
            let mut out = aux_sums.prefixed("metrics.aux");
            out.insert("metrics.total_loss", aux["total_loss"].clone());
            out.insert("metrics.total_weights", aux["total_weights"].clone());
            out.insert("metrics.z_loss_sum", &aux["z_loss"] * &aux["total_weights"]);
            out
        })
    }

    /// The backward program of `chunk` (see the module docs).
    pub fn backward(&self, chunk: usize) -> Result<Program, TraceError> {
        let (first, last) = (self.layout.is_first(chunk), self.layout.is_last(chunk));
        let mesh = &self.stage_meshes[self.layout.stage_of(chunk)];
        let c = &self.model.config;
        let defs = self.layout.chunk_params(&self.model, chunk);
        let fp8 = self.chunk_fp8(chunk);
        let mut sig = Signature::new(Some(mesh.clone()));
        self.declare(&mut sig, Group::Params.prefix(), &defs, false);
        self.declare(&mut sig, Group::Fp8.prefix(), &fp8, false);
        self.declare(&mut sig, FP8_NEXT, &fp8, true);
        self.declare_batch(&mut sig, false);
        let residual_shape = [&[self.layout.layers_per_stage as i64][..], &self.activation_shape()].concat();
        sig.input("residual.layer_inputs", c.dtype, &residual_shape).sharded(self.residual_spec()).donated();
        let act = self.activation_spec();
        let cotangent = if last { "residual.cotangent" } else { "cotangent" };
        sig.input(cotangent, c.dtype, &self.activation_shape()).sharded(act.clone()).donated();
        let accumulated: Vec<ParamDef> =
            defs.into_iter().filter(|d| self.model.param_role(&d.name) != ParamRole::Head).collect();
        self.declare(&mut sig, GRAD, &accumulated, true);
        sig.input("aux_weight", DType::F32, &[]);
        if !first {
            sig.output_sharding("cotangent", act);
        }
        let layers = self.layout.chunk_layers(chunk);
        trace(&sig, |_, inp| {
            let (params, batch) = (Self::model_inputs(inp), inp.subtree("batch"));
            let context = LayerContext::new(c, &batch);
            let layer_params = self.chunk_layer_params(&params, chunk);
            let (dx, mut grads) = self.model.layers_backward(
                &layer_params,
                layers,
                &inp["residual.layer_inputs"],
                &inp[cotangent],
                &inp["aux_weight"],
                &context,
            );
            let mut out = Tree::new();
            if first {
                let embedding: Tree = params
                    .iter()
                    .filter(|(n, _)| self.model.param_role(n) == ParamRole::Embedding)
                    .map(|(n, p)| (n, p.clone()))
                    .collect();
                let (_, g) = value_and_grad(&embedding, |p| {
                    let x = self.model.embed(p, &batch["inputs"], &context.positions);
                    (x.astype(DType::F32) * dx.astype(DType::F32)).sum_all()
                });
                grads.extend(g);
            } else {
                out.insert("cotangent", dx);
            }
            for def in &accumulated {
                let (name, g) = (format!("{GRAD}.{}", def.name), &grads[&def.name]);
                out.insert(name.clone(), self.accumulate(&def.name, &inp[&name], g, chunk, |a, g| a + g));
            }
            // The fp8 state's "gradients" are this microbatch's new state: the step keeps the
            // element-wise maximum over its microbatches (see the module docs).
            for def in &fp8 {
                let (name, new) = (format!("{FP8_NEXT}.{}", def.name), &grads[&def.name]);
                out.insert(name.clone(), self.accumulate(&def.name, &inp[&name], new, chunk, |a, n| a.maximum(n)));
            }
            out
        })
    }

    /// The squared norm of stage `stage`'s gradients (see the module docs).
    pub fn norm(&self, stage: usize) -> Result<Program, TraceError> {
        let mut sig = Signature::new(Some(self.stage_meshes[stage].clone()));
        self.declare(&mut sig, GRAD, &self.layout.stage_params(&self.model, stage), false);
        sig.output_sharding("sumsq", PartitionSpec::replicated());
        trace(&sig, |_, inp| {
            let squares: Vec<Tensor> =
                inp.subtree(GRAD).values().map(|g| g.astype(DType::F32).square().sum_all()).collect();
            let mut total = squares[0].clone();
            for s in &squares[1..] {
                total = total + s;
            }
            Tree::new().with("sumsq", total)
        })
    }

    /// Stage `stage`'s optimizer update (see the module docs).
    pub fn update(&self, stage: usize) -> Result<Program, TraceError> {
        let defs = self.layout.stage_params(&self.model, stage);
        let mut sig = Signature::new(Some(self.stage_meshes[stage].clone()));
        for group in Group::PER_PARAMETER {
            self.declare(&mut sig, group.prefix(), &defs, true);
        }
        self.declare(&mut sig, GRAD, &defs, true);
        let fp8 = self.layout.stage_defs(&self.model, &self.model.fp8_state_defs(), stage);
        self.declare(&mut sig, Group::Fp8.prefix(), &fp8, true);
        self.declare(&mut sig, FP8_NEXT, &fp8, true);
        let count = Group::Count.prefix();
        sig.input(count, DType::S32, &[]).donated();
        sig.output_sharding(count, PartitionSpec::replicated());
        sig.input("grad_norm", DType::F32, &[]);
        sig.output_sharding("metrics.learning_rate", PartitionSpec::replicated());
        trace(&sig, |_, inp| {
            let grads = inp.subtree(GRAD);
            let (params, state) = (Group::Params.subtree(inp), OptState::from_names(inp));
            let (params, state, metrics) = self.optimizer.update_with_norm(&params, &grads, &state, &inp["grad_norm"]);
            let mut out = Group::Params.prefixed(params);
            out.extend(state.into_names());
            out.extend(grads.map(|_, g| g.zeros_like()).prefixed(GRAD));
            // The step's new fp8 state; the accumulators start again from 0, below every new
            // scale and amax (both positive or zero).
            let next = inp.subtree(FP8_NEXT);
            out.extend(next.map(|_, n| n.zeros_like()).prefixed(FP8_NEXT));
            out.extend(Group::Fp8.prefixed(next));
            out.insert("metrics.learning_rate", metrics["learning_rate"].clone());
            out
        })
    }

    /// A parameter's sharding over every device for the initializer: as inside a stage, and
    /// stacked layers split over the `stage` axis (rows in stage-major order).
    pub fn init_spec(&self, def: &ParamDef) -> PartitionSpec {
        let spec = self.param_spec(def);
        if !self.is_stacked(def) {
            return spec;
        }
        let mut dims: Vec<Vec<String>> = (0..def.shape.len()).map(|d| spec.dim(d).to_vec()).collect();
        dims[0].insert(0, "stage".to_string());
        PartitionSpec::from_axes(dims)
    }

    /// The initializer over every device (see the module docs): `params.*` (unless
    /// `with_params` is false: the parameters come from a file), `opt_state.*`, `fp8.*` and the
    /// accumulators `grad.*`, `fp8_next.*` under the model's names, stacked layers in
    /// stage-major order.
    pub fn init(&self, with_params: bool) -> Result<Program, TraceError> {
        let (defs, fp8) = (self.model.param_defs(), self.model.fp8_state_defs());
        let mut sig = Signature::new(Some(self.mesh.clone()));
        for def in &defs {
            let spec = self.init_spec(def);
            for prefix in [Group::Params.prefix(), Group::Mu.prefix(), Group::Nu.prefix(), GRAD] {
                if with_params || prefix != Group::Params.prefix() {
                    sig.output_sharding(&format!("{prefix}.{}", def.name), spec.clone());
                }
            }
        }
        for def in &fp8 {
            for prefix in [Group::Fp8.prefix(), FP8_NEXT] {
                sig.output_sharding(&format!("{prefix}.{}", def.name), self.init_spec(def));
            }
        }
        sig.output_sharding(Group::Count.prefix(), PartitionSpec::replicated());
        let order: Vec<f64> = self.layout.stage_major_order().into_iter().map(|l| l as f64).collect();
        trace(&sig, |ctx, _| {
            let key = random::key(ctx, self.init_weights_seed);
            let stage_major = |drawn: Tree| -> Tree {
                drawn
                    .iter()
                    .map(|(name, p)| match self.model.param_role(name) {
                        ParamRole::StackedLayers if self.layout.repeats > 1 => {
                            let rows = ctx.constant(DType::S32, &[order.len() as i64], &order);
                            (name.to_string(), p.take(&rows))
                        }
                        _ => (name.to_string(), p.clone()),
                    })
                    .collect()
            };
            let params = stage_major(self.model.init_params(&key));
            let fp8_state = stage_major(params::init(&fp8, DType::F32, &key));
            let mut out = self.optimizer.init(&params).into_names();
            out.extend(params.map(|_, p| p.zeros_like()).prefixed(GRAD));
            out.extend(fp8_state.map(|_, s| s.zeros_like()).prefixed(FP8_NEXT));
            out.extend(Group::Fp8.prefixed(fp8_state));
            if with_params {
                out.extend(Group::Params.prefixed(params));
            }
            out
        })
    }

    /// Every program of stage `stage`.
    pub fn stage_programs(&self, stage: usize) -> Result<StagePrograms> {
        let chunks = self.layout.stage_chunks(stage);
        let traced = |what: &str, r: Result<Program, TraceError>| r.map_err(|e| anyhow!("tracing {what}: {e}"));
        Ok(StagePrograms {
            forward: chunks
                .iter()
                .map(|&c| traced(&format!("chunk {c}'s forward"), self.forward(c)))
                .collect::<Result<_>>()?,
            backward: chunks
                .iter()
                .map(|&c| traced(&format!("chunk {c}'s backward"), self.backward(c)))
                .collect::<Result<_>>()?,
            norm: traced(&format!("stage {stage}'s gradient norm"), self.norm(stage))?,
            update: traced(&format!("stage {stage}'s update"), self.update(stage))?,
        })
    }
}
