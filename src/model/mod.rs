//! Models traced with the `tensor` API, behind one decoder seam.
//!
//! - [`decoder`]: the shared decoder (`Model`): parameters and their layout, embedding, layer
//!   stacking (scan / unroll, remat), final norm, logits, loss, parameter count, FLOPs; and the
//!   `Family` trait a decoder family implements.
//! - [`attention`]: RoPE, attention masks (causal, sliding window, packed documents) and
//!   dot-product attention, shared by the families.
//! - [`config`]: `ModelConfig`, the sizes and numerics every family reads, and `remat_policy`.
//! - [`params`]: parameter declarations, initialization, program inputs.
//! - One file per family: [`llama`] (MaxText's `llama2` and `mistral` blocks).

pub mod attention;
pub mod config;
pub mod decoder;
pub mod llama;
pub mod params;

pub use config::ModelConfig;
pub use decoder::{loss_from_logits, Family, Forward, LayerFlops, Model, ParamRole};
pub use params::{ParamDef, ParamInit};
