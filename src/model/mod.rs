//! Models traced with the `tensor` API, behind one decoder seam.
//!
//! - [`decoder`]: the shared decoder (`Model`): parameters and their layout, embedding, layer
//!   stacking (scan / unroll, remat), final norm, logits, loss, parameter count, FLOPs; and the
//!   `Family` trait a decoder family implements.
//! - [`attention`]: RoPE, attention masks (causal, sliding window, packed documents) and
//!   attention (`attend`), shared by the families; [`blockwise`]: the memory-efficient
//!   blockwise attention with its own backward pass.
//! - [`config`]: `ModelConfig`, the sizes and numerics every family reads, and `remat_policy`.
//! - [`params`]: parameter declarations, initialization, program inputs.
//! - [`moe`]: the routed mixture-of-experts block (router, dropless / dropping / every-expert
//!   computations, load-balancing loss), shared by MoE families.
//! - One file per family: [`llama`] (MaxText's `llama2` and `mistral` blocks), and beside it
//!   [`llama_hf`], its Hugging Face layout (`maxrs convert`); [`mixtral`] (`mixtral`: Llama's
//!   attention and a routed MoE block).

pub mod attention;
pub mod blockwise;
pub mod config;
pub mod decoder;
pub mod llama;
pub mod llama_hf;
pub mod mixtral;
pub mod moe;
pub mod params;

pub use config::ModelConfig;
pub use decoder::{loss_from_logits, CacheStep, Family, Forward, LayerFlops, LayerOutput, Model};
pub use params::{ParamDef, ParamInit};
