//! The forward pass over a model's stacks of layers (`stacks.rs`): scanned over stacked
//! parameters with `scan_layers`, unrolled otherwise, each layer a `checkpoint` region under the
//! remat policy, with the layers' auxiliary losses averaged; a pipeline stage's share of the
//! layers (`layers_forward` / `layers_backward`); and which part of the decoder a parameter is
//! (`ParamRole`), by which a pipeline splits the parameters over its stages.

use std::ops::Range;

use crate::ir::{DType, RematFences};
use crate::tensor::{checkpoint, concatenate, scan, scan_reverse, stack, RematPolicy, Tensor, Tree};

use super::attention::LayerContext;
use super::decoder::Model;
use super::stacks::Stack;

/// The part of the decoder a parameter belongs to ([`Model::param_role`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamRole {
    /// The token embedding (before layer 0).
    Embedding,
    /// Stacked over every layer of a stack on a leading `layers` axis (`scan_layers`).
    StackedLayers,
    /// Of one layer (unscanned, or a single module), numbered over all stacks.
    Layer(i64),
    /// The final norm and output projection (after the last layer).
    Head,
}

/// Adds one layer's (or stack's) auxiliary losses to the running sums (`sums`, by name), and
/// `layers` to the count of layers that reported each.
fn add_aux_losses(sums: &mut Tree, counts: &mut Vec<(String, i64)>, reported: &Tree, layers: i64) {
    for (name, value) in reported.iter() {
        let sum = match sums.get(name) {
            Some(sum) => sum + value,
            None => value.clone(),
        };
        sums.insert(name, sum);
        match counts.iter_mut().find(|(n, _)| n == name) {
            Some((_, count)) => *count += layers,
            None => counts.push((name.to_string(), layers)),
        }
    }
}

impl Model {
    /// Which part of the decoder the parameter `name` (a name of [`Model::param_defs`]) belongs
    /// to: how a pipeline splits the parameters over its stages.
    pub fn param_role(&self, name: &str) -> ParamRole {
        if name.starts_with("token_embedder.") || name.starts_with("decoder.position_embedder.") {
            return ParamRole::Embedding;
        }
        let (mut first, scan_layers) = (0, self.config.scan_layers);
        for s in self.stacks() {
            let stacked = name.strip_prefix(&s.prefix()).is_some_and(|rest| rest.starts_with('.'));
            if stacked && s.scanned(scan_layers) {
                return ParamRole::StackedLayers;
            }
            if let Some((i, _)) = s.unstacked_layer(name, scan_layers) {
                return ParamRole::Layer(first + i);
            }
            first += s.count;
        }
        ParamRole::Head
    }

    /// Every stack's layers on the embeddings `x`: the last layer's output, every layer's output
    /// stacked `[layers, batch, seq, emb]` with `keep_layer_outputs`, and each auxiliary loss
    /// averaged over the layers that report it (MaxText's `loss_fn` takes the mean of every
    /// layer's `moe_lb_loss` intermediate, `src/maxtext/trainers/pre_train/train.py`, e591f30).
    pub(super) fn run_stacks(
        &self,
        params: &Tree,
        x: &Tensor,
        ctx: &LayerContext,
        keep_layer_outputs: bool,
    ) -> (Tensor, Option<Tensor>, Tree) {
        let c = &self.config;
        // A layer's region returns `x` and its auxiliary losses under `aux.`.
        let layer = |kind: usize, x: &Tensor, p: &Tree, scanned: bool| -> Tree {
            // The layer's parameters and its input are the region's inputs: with `full` only they
            // are kept for the backward pass, everything inside is recomputed.
            let inputs = p.clone().prefixed("params").with("x", x.clone());
            let fences = RematFences { inputs: c.remat_prevent_cse, cotangents: !scanned, wait_for_cotangents: false };
            // A family whose layer holds sub-layers that are regions of their own (Gemma 4 small).
            let policy = if self.family.remats_its_sub_layers() { &RematPolicy::None } else { &c.remat };
            checkpoint(policy, fences, &inputs, |a| {
                let out = self.family.layer(c, kind, &a.subtree("params"), &a["x"], ctx);
                out.aux_losses.prefixed("aux").with("x", out.x)
            })
        };
        let (mut sums, mut counts) = (Tree::new(), Vec::new());
        let mut outputs = Vec::new();
        let mut y = x.clone();
        for s in self.stacks() {
            if s.scanned(c.scan_layers) {
                let (carry, ys) = scan(&Tree::new().with("x", y), &params.subtree(&s.prefix()), |carry, p| {
                    let out = layer(s.kind, &carry["x"], p, true);
                    let mut ys = out.subtree("aux").prefixed("aux");
                    if keep_layer_outputs {
                        ys.insert("x", out["x"].clone());
                    }
                    (Tree::new().with("x", out["x"].clone()), ys)
                });
                add_aux_losses(&mut sums, &mut counts, &ys.subtree("aux").map(|_, l| l.sum(&[0])), s.count);
                outputs.extend(ys.get("x").cloned());
                y = carry["x"].clone();
            } else {
                let mut outs = Vec::new();
                for i in 0..s.count {
                    let out = layer(s.kind, &y, &s.layer_params(params, i, c.scan_layers), false);
                    add_aux_losses(&mut sums, &mut counts, &out.subtree("aux"), 1);
                    y = out["x"].clone();
                    outs.push(y.clone());
                }
                if keep_layer_outputs {
                    outputs.push(stack(&outs.iter().collect::<Vec<_>>(), 0));
                }
            }
        }
        let layer_outputs = match outputs.len() {
            0 => None,
            1 => outputs.pop(),
            _ => Some(concatenate(&outputs.iter().collect::<Vec<_>>(), 0)),
        };
        let aux = counts.into_iter().map(|(name, n)| (name.clone(), &sums[name.as_str()] / n as f64)).collect();
        (y, layer_outputs, aux)
    }

    /// The one stack a pipeline splits over its stages (`PipelineStep::new` refuses a model of
    /// several stacks).
    fn pipelined_stack(&self) -> &Stack {
        match self.stacks() {
            [s] => s,
            stacks => panic!("a pipeline runs a model of one stack of layers, this one has {}", stacks.len()),
        }
    }

    /// Runs the contiguous decoder layers `layers` on `x` (a pipeline stage's share): `params`
    /// holds their parameters under the model's names (`decoder.layers.*` stacked over just these
    /// layers with `scan_layers`, else layer by layer, `Stack::layer_param_name`). Returns the last layer's output,
    /// every layer's input stacked, `[layers, batch, seq, emb]` (what [`Model::layers_backward`]
    /// needs, the values `remat_policy=full` keeps), and each auxiliary loss summed over these
    /// layers (the decoder's loss adds their mean over all layers).
    pub fn layers_forward(
        &self,
        params: &Tree,
        layers: Range<i64>,
        x: &Tensor,
        ctx: &LayerContext,
    ) -> (Tensor, Tensor, Tree) {
        let c = &self.config;
        let s = self.pipelined_stack();
        if s.scanned(c.scan_layers) {
            let stacked = params.subtree(&s.prefix());
            let (carry, ys) = scan(&Tree::new().with("x", x.clone()), &stacked, |carry, p| {
                let x = &carry["x"];
                let out = self.family.layer(c, s.kind, p, x, ctx);
                (Tree::new().with("x", out.x), out.aux_losses.prefixed("aux").with("x", x.clone()))
            });
            let aux = ys.subtree("aux").map(|_, per_layer| per_layer.sum(&[0]));
            (carry["x"].clone(), ys["x"].clone(), aux)
        } else {
            let mut inputs = Vec::new();
            let (mut aux_sums, mut counts) = (Tree::new(), Vec::new());
            let mut y = x.clone();
            for i in layers {
                inputs.push(y.clone());
                let out = self.family.layer(c, s.kind, &s.layer_params(params, i, c.scan_layers), &y, ctx);
                add_aux_losses(&mut aux_sums, &mut counts, &out.aux_losses, 1);
                y = out.x;
            }
            (y, stack(&inputs.iter().collect::<Vec<_>>(), 0), aux_sums)
        }
    }

    /// The backward pass of [`Model::layers_forward`] from the layers' saved inputs
    /// (`[layers, batch, seq, emb]`) and the cotangent `ct` of the last layer's output: each
    /// layer is recomputed from its input and differentiated, last to first, as the train step
    /// does under `remat_policy=full`. Each layer's auxiliary losses enter with weight
    /// `aux_weight` (an f32 scalar). Returns the cotangent of the first layer's input and the
    /// gradient of every parameter of `params`, under the same names.
    pub fn layers_backward(
        &self,
        params: &Tree,
        layers: Range<i64>,
        inputs: &Tensor,
        ct: &Tensor,
        aux_weight: &Tensor,
        ctx: &LayerContext,
    ) -> (Tensor, Tree) {
        let c = &self.config;
        let s = self.pipelined_stack();
        // The vector-Jacobian product of one layer: the gradient of <layer(p, x), ct> plus its
        // weighted auxiliary losses.
        let layer_vjp = |p: &Tree, x: &Tensor, ct: &Tensor| -> (Tensor, Tree) {
            let args = p.clone().prefixed("params").with("x", x.clone());
            let (_, grads) = crate::autodiff::value_and_grad(&args, |a| {
                let out = self.family.layer(c, s.kind, &a.subtree("params"), &a["x"], ctx);
                let mut objective = (out.x.astype(DType::F32) * ct.astype(DType::F32)).sum_all();
                for (_, value) in out.aux_losses.iter() {
                    objective = objective + &(value * aux_weight);
                }
                objective
            });
            (grads["x"].clone(), grads.subtree("params"))
        };
        if s.scanned(c.scan_layers) {
            let xs = params.subtree(&s.prefix()).prefixed("params").with("x", inputs.clone());
            let (carry, grads) = scan_reverse(&Tree::new().with("ct", ct.clone()), &xs, |carry, xs| {
                let (dx, dp) = layer_vjp(&xs.subtree("params"), &xs["x"], &carry["ct"]);
                (Tree::new().with("ct", dx), dp)
            });
            (carry["ct"].clone(), grads.prefixed(&s.prefix()))
        } else {
            let mut ct = ct.clone();
            let mut grads = Tree::new();
            for (k, i) in layers.enumerate().collect::<Vec<_>>().into_iter().rev() {
                let x = inputs.slice_axis(0, k as i64, k as i64 + 1).squeeze(0);
                let (dx, dp) = layer_vjp(&s.layer_params(params, i, c.scan_layers), &x, &ct);
                grads.extend(s.named_layer_params(&dp, i, c.scan_layers));
                ct = dx;
            }
            (ct, grads)
        }
    }
}
