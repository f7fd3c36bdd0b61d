//! Models traced with the `tensor` API. One file per decoder family; `llama` is MaxText's
//! `decoder_block: llama2` (and mistral, which is the same block here).

pub mod llama;
pub mod moe;

pub use llama::{LlamaConfig, ParamDef, ParamInit};
