//! The decoder seam: what a decoder family implements (`Family`: its stacks, one layer's
//! parameters, computation and FLOPs for each kind of layer, its fp8 products and final norm) and
//! what every family's layer may use from the shared decoder (`LayerOutput`, the dense FLOP
//! terms, `constrain` with the activations' logical axes). Families import this file, never
//! `decoder.rs`, which runs them; `families.rs` says which family each `decoder_block` is.

use std::fmt;

use crate::tensor::{Tensor, Tree};

use super::attention::LayerContext;
use super::blocks::Norm;
use super::fp8;
use super::params::ParamDef;
use super::stacks::Stack;
use super::ModelConfig;

/// What MaxText's module of one layer (of each sub-layer, for a stack named per sub-layer) keeps
/// of random streams, beyond the modules its parameters show.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerRngs {
    /// It keeps the `Rngs` it was built with (`self.rngs = rngs` in its `__init__`).
    pub keeps: bool,
    /// It has a `dropout` of its own (on its output).
    pub dropout: bool,
}

/// What a decoder family defines; everything else is the shared decoder's.
pub trait Family: fmt::Debug + Send + Sync {
    /// The decoder's stacks of layers, in order (`stacks.rs`); by default MaxText's one stack
    /// `layers` of `c.layers` layers of kind 0.
    fn stacks(&self, c: &ModelConfig) -> Vec<Stack> {
        vec![Stack::new("layers", c.layers, 0)]
    }

    /// One layer's parameters for a layer of `kind` (a `Stack::kind` of `stacks`), named
    /// relative to the layer (`self_attention.query.kernel`), with the logical axes of one layer
    /// (stacking adds the stack's own axis: `layers`, DeepSeek's `dense_layers` / `moe_layers`).
    fn layer_params(&self, c: &ModelConfig, kind: usize) -> Vec<ParamDef>;

    /// One decoder layer of `kind` on the residual stream `x: [batch, seq, emb]` (in `dtype`)
    /// with that layer's parameters `p`.
    fn layer(&self, c: &ModelConfig, kind: usize, p: &Tree, x: &Tensor, ctx: &LayerContext) -> LayerOutput;

    /// Forward FLOPs of one layer of `kind` for `tokens` tokens in sequences of `seq`: matmuls
    /// against weights, and attention's activation-activation matmuls (MaxText's split).
    fn layer_flops(&self, c: &ModelConfig, kind: usize, tokens: f64, seq: f64) -> LayerFlops;

    /// The quantized products of one layer of `kind` with `quantization=fp8`, named relative to
    /// the layer as their state is (`fp8::state_defs`): by default one per kernel `<op>.kernel`.
    fn fp8_products(&self, c: &ModelConfig, kind: usize) -> Vec<String> {
        fp8::kernel_products(&self.layer_params(c, kind))
    }

    /// What MaxText's module of a layer of `kind` (each sub-layer's, in a stack named per
    /// sub-layer) keeps of NNX random streams (`rng_streams.rs`); `None` where maxrs does not
    /// know it (a train state of the family does not convert to MaxText's).
    fn layer_rngs(&self, _c: &ModelConfig, _kind: usize) -> Option<LayerRngs> {
        None
    }

    /// Whether the family's layer makes its sub-layers remat regions of their own (`checkpoint`
    /// under `remat_policy`), so that the decoder does not make the layer one: Gemma 4 small, whose
    /// one module holds every layer (MaxText's layers are each a region). By default the decoder
    /// makes each layer a region.
    fn remats_its_sub_layers(&self) -> bool {
        false
    }

    /// The decoder's parameters outside its layers and the shared ones (Gemma 4 small's per-layer
    /// embedder, `decoder.per_layer_embedder.*`), named from the model's root; by default none.
    fn decoder_params(&self, _c: &ModelConfig) -> Vec<ParamDef> {
        vec![]
    }

    /// What the layers read besides their input, computed once per forward pass from the model's
    /// `params`, the `tokens: s32[batch, seq]` and their embeddings `x: [batch, seq, emb]`
    /// (`LayerContext::per_layer_inputs`; Gemma 4 small's per-layer inputs); by default none.
    fn per_layer_inputs(&self, _c: &ModelConfig, _params: &Tree, _tokens: &Tensor, _x: &Tensor) -> Option<Tensor> {
        None
    }

    /// The decoder's final norm (`decoder.decoder_norm`): MaxText's `get_norm_layer` of the
    /// family, with `normalization_layer_epsilon`.
    fn final_norm(&self, c: &ModelConfig) -> Norm {
        Norm::Rms { eps: c.eps }
    }
}

/// One layer's result: the new residual stream and its auxiliary losses, named f32 scalars
/// (already weighted; every layer of a model reports the same names). The decoder averages each
/// over the layers and adds it to the loss, as MaxText's `loss_fn` does with the `moe_lb_loss`
/// intermediates.
pub struct LayerOutput {
    pub x: Tensor,
    pub aux_losses: Tree,
}

impl LayerOutput {
    /// A layer without auxiliary losses.
    pub fn new(x: Tensor) -> LayerOutput {
        LayerOutput { x, aux_losses: Tree::new() }
    }
}

/// Forward FLOPs of one layer, split as MaxText's `calculate_tflops_training_per_device`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerFlops {
    pub weights: f64,
    pub attention: f64,
}

/// MaxText's dense per-layer terms (`calculate_tflops_training_per_device` in
/// `src/maxtext/utils/maxtext_utils.py`, e591f30): `2 * tokens * mlp * emb` per MLP projection
/// (one per activation, and the output), `2 * tokens * emb * (heads + 2 kv_heads) * head_dim` for
/// q/k/v, `2 * tokens * emb * heads * head_dim` for the output projection; attention's `QK^T` and
/// `PV` counted causally, `4 * tokens * seq * heads * head_dim / 2`.
pub fn dense_layer_flops(c: &ModelConfig, tokens: f64, seq: f64) -> LayerFlops {
    let ffn = 2.0 * tokens * c.mlp as f64 * c.emb as f64 * (c.mlp_activations.len() as f64 + 1.0);
    let attention = attention_flops(c, tokens, seq);
    LayerFlops { weights: ffn + attention.weights, attention: attention.attention }
}

/// The attention terms of `dense_layer_flops` alone (for families whose MLP differs: Mixtral).
pub fn attention_flops(c: &ModelConfig, tokens: f64, seq: f64) -> LayerFlops {
    let [e, h, kv, d] = [c.emb, c.heads, c.kv_heads, c.head_dim].map(|x| x as f64);
    let qkv = 2.0 * tokens * e * (h + 2.0 * kv) * d;
    let out = 2.0 * tokens * e * h * d;
    LayerFlops { weights: qkv + out, attention: 4.0 * tokens * seq * h * d / 2.0 }
}

/// `[batch, seq, emb]` activations' logical axes.
pub const BTE: &[&str] = &["activation_batch", "activation_length", "activation_embed"];

/// Pins an activation's sharding by logical axis names (no-op without a mesh).
pub fn constrain(c: &ModelConfig, x: Tensor, logical: &[&str]) -> Tensor {
    match x.trace().mesh().cloned() {
        Some(mesh) => x.with_sharding_constraint(&c.rules.spec(logical, &mesh)),
        None => x,
    }
}
