//! The Mistral decoder layer (MaxText's `decoder_block: mistral`): Llama 2's layer
//! (`llama.rs`: the same parameters, names and FLOPs) whose attention may be limited to a
//! sliding window of `sliding_window_size` tokens, as Mistral 7B v0.1 was trained: query `t`
//! sees keys `s` with `t - window < s <= t` (a banded causal mask).
//!
//! `sliding_window_size=0`, MaxText's default and what every MaxText mistral model file has, is
//! plain causal attention: exactly MaxText's mistral layer, which applies no window at all
//! (`MistralDecoderLayer` in `src/maxtext/models/mistral.py`, e591f30, builds global attention
//! whatever `sliding_window_size` says). FLOPs are MaxText's dense formula, which does not discount
//! the window (masked scores are computed all the same).

use crate::config::Config;
use crate::tensor::{Tensor, Tree};

use super::attention::LayerContext;
use super::blocks::SelfAttention;
use super::family::LayerRngs;
use super::family::{dense_layer_flops, Family, LayerFlops, LayerOutput};
use super::params::ParamDef;
use super::{llama, ModelConfig};

/// Llama 2's layer with an optional sliding window.
#[derive(Debug)]
pub struct Mistral {
    /// `sliding_window_size` when positive.
    pub window: Option<i64>,
}

impl Mistral {
    pub fn from_config(c: &Config) -> Mistral {
        Mistral { window: (c.sliding_window_size > 0).then_some(c.sliding_window_size) }
    }
}

impl Family for Mistral {
    /// MaxText's `MistralDecoderLayer` (`src/maxtext/models/mistral.py` at e591f30) keeps its `rngs` (line 54) and has
    /// a `dropout` (line 119).
    fn layer_rngs(&self, _c: &ModelConfig, _kind: usize) -> Option<LayerRngs> {
        Some(LayerRngs { keeps: true, dropout: true })
    }

    fn layer_params(&self, c: &ModelConfig, _kind: usize) -> Vec<ParamDef> {
        llama::layer_params(c)
    }

    fn layer(&self, c: &ModelConfig, _kind: usize, p: &Tree, x: &Tensor, ctx: &LayerContext) -> LayerOutput {
        LayerOutput::new(llama::layer(c, p, x, ctx, &SelfAttention { window: self.window, ..llama::ATTENTION }))
    }

    fn layer_flops(&self, c: &ModelConfig, _kind: usize, tokens: f64, seq: f64) -> LayerFlops {
        dense_layer_flops(c, tokens, seq)
    }
}
