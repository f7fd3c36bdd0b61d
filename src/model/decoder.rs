//! The decoder seam: what every decoder family shares, written once. A family (`Family`)
//! declares one layer's parameters and computes one layer; the shared decoder stacks the layers
//! (scanned over stacked parameters with `scan_layers`, unrolled otherwise, each layer a
//! `checkpoint` region under the remat policy), and owns the token embedding, the final norm,
//! the logits, the loss, the parameter list and count, and the FLOP count. The train step, the
//! initializer, TFLOPs, the AOT artifact's compiled keys and the parameter-file check all ask a
//! `Model` instead of knowing any family's layout.
//!
//! Shared parameters (names as in a MaxText checkpoint's `params` tree):
//!
//! | name | shape | logical axes | init |
//! |---|---|---|---|
//! | `token_embedder.embedding` | [vocab, emb] | vocab, embed | normal(1.0) |
//! | `decoder.layers.<layer param>` | [layers, ...] | layers, ... | the family's |
//! | `decoder.decoder_norm.scale` | [emb] | norm | ones |
//! | `decoder.logits_dense.kernel` | [emb, vocab] | embed, vocab | fan_in (absent with `logits_via_embedding`) |
//!
//! With `scan_layers=false` layer `i`'s parameters are `decoder.layers_{i}.<layer param>`
//! without the leading axis (MaxText's unscanned names).

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use crate::config::{Config, DecoderBlock};
use crate::ir::{DType, Signature};
use crate::tensor::{checkpoint, einsum, scan, scan_reverse, stack, value_and_grad, Tensor, Tree};
use crate::train::flops::{StepShape, StepTflops};

use super::attention::LayerContext;
use super::config::SHARED_KEYS;
use super::params::{self, ParamDef, ParamInit};
use super::{llama, ModelConfig};

/// What a decoder family defines; everything else is the shared decoder's.
pub trait Family: fmt::Debug + Send + Sync {
    /// Configuration keys the family reads besides `ModelConfig`'s: they are compiled into the
    /// train step (the AOT artifact checks them).
    fn config_keys(&self) -> &'static [&'static str] {
        &[]
    }

    /// One layer's parameters, named relative to the layer (`self_attention.query.kernel`), with
    /// the logical axes of one layer (the decoder adds `layers` when stacking).
    fn layer_params(&self, c: &ModelConfig) -> Vec<ParamDef>;

    /// One decoder layer on the residual stream `x: [batch, seq, emb]` (in `dtype`) with that
    /// layer's parameters `p`.
    fn layer(&self, c: &ModelConfig, p: &Tree, x: &Tensor, ctx: &LayerContext) -> Tensor;

    /// Forward FLOPs of one layer for `tokens` tokens in sequences of `seq`: matmuls against
    /// weights, and attention's activation-activation matmuls (MaxText's split).
    fn layer_flops(&self, c: &ModelConfig, tokens: f64, seq: f64) -> LayerFlops;
}

/// Forward FLOPs of one layer, split as MaxText's `calculate_tflops_training_per_device`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerFlops {
    pub weights: f64,
    pub attention: f64,
}

/// The family `decoder_block` names, with its own keys read from `c`.
fn family(c: &Config) -> Result<Arc<dyn Family>, String> {
    Ok(match c.decoder_block {
        DecoderBlock::Llama2 | DecoderBlock::Mistral => Arc::new(llama::Llama),
    })
}

/// A decoder: the shared configuration and the family's layer.
#[derive(Clone, Debug)]
pub struct Model {
    pub config: ModelConfig,
    family: Arc<dyn Family>,
}

/// The forward pass's results.
pub struct Forward {
    /// `[batch, seq, emb]` in `dtype`: the token embeddings (input of layer 0).
    pub embeddings: Tensor,
    /// `[layers, batch, seq, emb]`: each layer's output, when asked for.
    pub layer_outputs: Option<Tensor>,
    /// `[batch, seq, vocab]`, f32.
    pub logits: Tensor,
}

/// The part of the decoder a parameter belongs to ([`Model::param_role`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamRole {
    /// The token embedding (before layer 0).
    Embedding,
    /// Stacked over every layer on a leading `layers` axis (`scan_layers`).
    StackedLayers,
    /// Of one layer (unscanned).
    Layer(i64),
    /// The final norm and output projection (after the last layer).
    Head,
}

/// `[batch, seq, emb]` activations' logical axes.
pub const BTE: &[&str] = &["activation_batch", "activation_length", "activation_embed"];

impl Model {
    pub fn from_config(c: &Config) -> Result<Model, String> {
        Ok(Model { config: ModelConfig::from_config(c), family: family(c)? })
    }

    /// Every configuration key the traced model depends on.
    pub fn config_keys(&self) -> Vec<&'static str> {
        SHARED_KEYS.iter().chain(self.family.config_keys()).copied().collect()
    }

    /// Every parameter, in a fixed order (the order `init_params` draws them in).
    pub fn param_defs(&self) -> Vec<ParamDef> {
        let c = &self.config;
        let mut defs = vec![ParamDef::new(
            "token_embedder.embedding",
            &[c.vocab, c.emb],
            &["vocab", "embed"],
            ParamInit::Normal(1.0),
        )];
        for layer in self.family.layer_params(c) {
            if c.scan_layers {
                defs.push(ParamDef {
                    name: format!("decoder.layers.{}", layer.name),
                    shape: [&[c.layers][..], &layer.shape].concat(),
                    logical: [&["layers"][..], &layer.logical].concat(),
                    init: layer.init,
                });
            } else {
                for i in 0..c.layers {
                    defs.push(ParamDef { name: format!("decoder.layers_{i}.{}", layer.name), ..layer.clone() });
                }
            }
        }
        defs.push(ParamDef::new("decoder.decoder_norm.scale", &[c.emb], &["norm"], ParamInit::Ones));
        if !c.logits_via_embedding {
            defs.push(ParamDef::new(
                "decoder.logits_dense.kernel",
                &[c.emb, c.vocab],
                &["embed", "vocab"],
                ParamInit::FanIn(c.emb),
            ));
        }
        defs
    }

    /// The number of parameters.
    pub fn num_params(&self) -> u64 {
        self.param_defs().iter().map(ParamDef::size).sum()
    }

    /// Declares every parameter as an input `{prefix}.{name}` of `sig` (in `weight_dtype`),
    /// sharded by the logical rules when the signature has a mesh.
    pub fn declare_params(&self, sig: &mut Signature, prefix: &str) {
        params::declare(sig, &self.param_defs(), self.config.weight_dtype, &self.config.rules, prefix);
    }

    /// Draws every parameter from `key` (`random::key(ctx, init_weights_seed)`).
    pub fn init_params(&self, key: &Tensor) -> Tree {
        params::init(&self.param_defs(), self.config.weight_dtype, key)
    }

    /// Embeds `batch["inputs"]` (`s32[batch, seq]`), runs the decoder layers and the final
    /// norm, and returns f32 logits. `inputs_position` and `inputs_segmentation`, when the batch
    /// has them, give each token's RoPE position and document. With `keep_layer_outputs` the
    /// output of every layer is returned too (for tests; it costs memory).
    pub fn forward(&self, params: &Tree, batch: &Tree, keep_layer_outputs: bool) -> Forward {
        let c = &self.config;
        let x = self.embed(params, batch);
        let ctx = LayerContext::new(c, batch);
        let layer = |x: &Tensor, p: &Tree| -> Tensor {
            // The layer's parameters and its input are the region's inputs: with `full` only they
            // are kept for the backward pass, everything inside is recomputed.
            let inputs = p.clone().prefixed("params").with("x", x.clone());
            let out = checkpoint(&c.remat, &inputs, |a| {
                Tree::new().with("x", self.family.layer(c, &a.subtree("params"), &a["x"], &ctx))
            });
            out["x"].clone()
        };
        let (y, layer_outputs) = if c.scan_layers {
            let (carry, ys) = scan(&Tree::new().with("x", x.clone()), &params.subtree("decoder.layers"), |carry, p| {
                let y = layer(&carry["x"], p);
                let ys = if keep_layer_outputs { Tree::new().with("x", y.clone()) } else { Tree::new() };
                (Tree::new().with("x", y), ys)
            });
            (carry["x"].clone(), ys.get("x").cloned())
        } else {
            let mut outs = Vec::new();
            let mut y = x.clone();
            for i in 0..c.layers {
                y = layer(&y, &params.subtree(&format!("decoder.layers_{i}")));
                outs.push(y.clone());
            }
            let stacked = keep_layer_outputs.then(|| stack(&outs.iter().collect::<Vec<_>>(), 0));
            (y, stacked)
        };
        Forward { embeddings: x, layer_outputs, logits: self.logits(params, &y) }
    }

    /// The token embeddings of `batch["inputs"]` (`s32[batch, seq]`): `[batch, seq, emb]` in
    /// `dtype`, the input of layer 0.
    pub fn embed(&self, params: &Tree, batch: &Tree) -> Tensor {
        let c = &self.config;
        let embedding = params["token_embedder.embedding"].astype(c.dtype);
        constrain(c, embedding.take(&batch["inputs"]), BTE)
    }

    /// The final norm and the f32 logits `[batch, seq, vocab]` of the last layer's output `y`.
    pub fn logits(&self, params: &Tree, y: &Tensor) -> Tensor {
        let c = &self.config;
        let y = y.rms_norm(&params["decoder.decoder_norm.scale"], c.eps);
        let logits = if c.logits_via_embedding {
            einsum("btd,vd->btv", &[&y, &params["token_embedder.embedding"].astype(c.dtype)])
        } else {
            y.matmul(&params["decoder.logits_dense.kernel"].astype(c.dtype))
        };
        constrain(c, logits.astype(DType::F32), &["activation_batch", "activation_length", "activation_vocab"])
    }

    /// The final norm, logits and [`Model::loss`]'s loss and aux values of the last layer's
    /// output `y` on `batch`.
    pub fn head_loss(&self, params: &Tree, y: &Tensor, batch: &Tree, z_loss_multiplier: f64) -> (Tensor, Tree) {
        let logits = self.logits(params, y);
        loss_from_logits(&logits, &batch["targets"], &batch["targets_segmentation"], z_loss_multiplier)
    }

    /// Which part of the decoder the parameter `name` (a name of [`Model::param_defs`]) belongs
    /// to: how a pipeline splits the parameters over its stages.
    pub fn param_role(&self, name: &str) -> ParamRole {
        if name.starts_with("token_embedder.") {
            ParamRole::Embedding
        } else if name.starts_with("decoder.layers.") {
            ParamRole::StackedLayers
        } else if let Some(index) =
            name.strip_prefix("decoder.layers_").and_then(|rest| rest.split('.').next()).and_then(|i| i.parse().ok())
        {
            ParamRole::Layer(index)
        } else {
            ParamRole::Head
        }
    }

    /// Runs the contiguous decoder layers `layers` on `x` (a pipeline stage's share): `params`
    /// holds their parameters under the model's names (`decoder.layers.*` stacked over just these
    /// layers with `scan_layers`, else `decoder.layers_{i}.*`). Returns the last layer's output
    /// and every layer's input stacked, `[layers, batch, seq, emb]`: what
    /// [`Model::layers_backward`] needs, the values `remat_policy=full` keeps.
    pub fn layers_forward(&self, params: &Tree, layers: Range<i64>, x: &Tensor, ctx: &LayerContext) -> (Tensor, Tensor) {
        let c = &self.config;
        if c.scan_layers {
            let stacked = params.subtree("decoder.layers");
            let (carry, inputs) = scan(&Tree::new().with("x", x.clone()), &stacked, |carry, p| {
                let x = &carry["x"];
                (Tree::new().with("x", self.family.layer(c, p, x, ctx)), Tree::new().with("x", x.clone()))
            });
            (carry["x"].clone(), inputs["x"].clone())
        } else {
            let mut inputs = Vec::new();
            let mut y = x.clone();
            for i in layers {
                inputs.push(y.clone());
                y = self.family.layer(c, &params.subtree(&format!("decoder.layers_{i}")), &y, ctx);
            }
            (y, stack(&inputs.iter().collect::<Vec<_>>(), 0))
        }
    }

    /// The backward pass of [`Model::layers_forward`] from the layers' saved inputs
    /// (`[layers, batch, seq, emb]`) and the cotangent `ct` of the last layer's output: each
    /// layer is recomputed from its input and differentiated, last to first, as the train step
    /// does under `remat_policy=full`. Returns the cotangent of the first layer's input and the
    /// gradient of every parameter of `params`, under the same names.
    pub fn layers_backward(
        &self,
        params: &Tree,
        layers: Range<i64>,
        inputs: &Tensor,
        ct: &Tensor,
        ctx: &LayerContext,
    ) -> (Tensor, Tree) {
        let c = &self.config;
        // The vector-Jacobian product of one layer: the gradient of <layer(p, x), ct>.
        let layer_vjp = |p: &Tree, x: &Tensor, ct: &Tensor| -> (Tensor, Tree) {
            let args = p.clone().prefixed("params").with("x", x.clone());
            let (_, grads) = value_and_grad(&args, |a| {
                let y = self.family.layer(c, &a.subtree("params"), &a["x"], ctx);
                (y.astype(DType::F32) * ct.astype(DType::F32)).sum_all()
            });
            (grads["x"].clone(), grads.subtree("params"))
        };
        if c.scan_layers {
            let xs = params.subtree("decoder.layers").prefixed("params").with("x", inputs.clone());
            let (carry, grads) = scan_reverse(&Tree::new().with("ct", ct.clone()), &xs, |carry, xs| {
                let (dx, dp) = layer_vjp(&xs.subtree("params"), &xs["x"], &carry["ct"]);
                (Tree::new().with("ct", dx), dp)
            });
            (carry["ct"].clone(), grads.prefixed("decoder.layers"))
        } else {
            let mut ct = ct.clone();
            let mut grads = Tree::new();
            for (k, i) in layers.enumerate().collect::<Vec<_>>().into_iter().rev() {
                let name = format!("decoder.layers_{i}");
                let x = inputs.slice_axis(0, k as i64, k as i64 + 1).squeeze(0);
                let (dx, dp) = layer_vjp(&params.subtree(&name), &x, &ct);
                grads.extend(dp.prefixed(&name));
                ct = dx;
            }
            (ct, grads)
        }
    }

    /// MaxText's loss on a batch tree with `inputs`, `targets` (s32 `[batch, seq]`) and
    /// `targets_segmentation` (s32, 0 = padding): per token `logsumexp(logits) - logits[target]`
    /// plus `z_loss_multiplier * logsumexp^2`, masked by `targets_segmentation != 0`, summed and
    /// divided by the number of unmasked tokens. Returns the loss and an aux tree with
    /// `total_loss` (the masked sum), `total_weights` (the token count) and `z_loss` (its masked
    /// mean part of the loss), all f32 scalars.
    pub fn loss(&self, params: &Tree, batch: &Tree, z_loss_multiplier: f64) -> (Tensor, Tree) {
        let logits = self.forward(params, batch, false).logits;
        loss_from_logits(&logits, &batch["targets"], &batch["targets_segmentation"], z_loss_multiplier)
    }

    /// TFLOPs of one train step on one device (MaxText's `calculate_tflops_training_per_device`
    /// in `src/maxtext/utils/maxtext_utils.py`): every matmul counted on the per-device batch,
    /// forward + backward = 3 x forward.
    pub fn training_tflops_per_device(&self, shape: &StepShape) -> StepTflops {
        let c = &self.config;
        let seq = shape.max_target_length as f64;
        let tokens = shape.per_device_batch_size * seq;
        let layer = self.family.layer_flops(c, tokens, seq);
        let unembedding = 2.0 * tokens * c.emb as f64 * c.vocab as f64;
        let scale = 3.0 / 1e12 * shape.gradient_accumulation_steps as f64;
        let learnable_weight = (layer.weights * c.layers as f64 + unembedding) * scale;
        let attention = layer.attention * c.layers as f64 * scale;
        StepTflops { total: learnable_weight + attention, learnable_weight, attention }
    }
}

/// Pins an activation's sharding by logical axis names (no-op without a mesh).
pub fn constrain(c: &ModelConfig, x: Tensor, logical: &[&str]) -> Tensor {
    match x.trace().mesh().cloned() {
        Some(mesh) => x.with_sharding_constraint(&c.rules.spec(logical, &mesh)),
        None => x,
    }
}

/// The loss of `Model::loss` given f32 logits.
pub fn loss_from_logits(logits: &Tensor, targets: &Tensor, segmentation: &Tensor, z: f64) -> (Tensor, Tree) {
    let vocab = logits.shape()[2];
    let log_z = logits.logsumexp(-1);
    let target_logit = (logits * &targets.one_hot(vocab, DType::F32)).sum(&[-1]);
    let weights = segmentation.ne(0).astype(DType::F32);
    let z_term = log_z.square() * z;
    let xent = (&log_z - &target_logit + &z_term) * &weights;
    let total_loss = xent.sum_all();
    let total_weights = weights.sum_all();
    let loss = &total_loss / &total_weights.maximum(1.0);
    let z_loss = (z_term * &weights).sum_all() / &total_weights.maximum(1.0);
    let aux = Tree::new().with("total_loss", total_loss).with("total_weights", total_weights).with("z_loss", z_loss);
    (loss, aux)
}
