//! Models traced with the `tensor` API, behind one decoder seam. Files import downward only
//! (no import cycle; `tests/layers.rs` checks it):
//!
//! - [`decoder`]: the shared decoder (`Model`): parameters and their layout, embedding, final
//!   norm, logits, loss, parameter count, FLOPs; [`run_stacks`]: the forward pass over the
//!   stacks (scan / unroll, remat) and a pipeline stage's share; [`decode`]: the layers with a
//!   key/value cache (prefill, generate).
//! - [`family`]: the seam, the `Family` trait a decoder family implements and what its layers
//!   use of the decoder; [`families`]: which family each `decoder_block` is (the only file that
//!   names them all); [`stacks`]: the layers as an ordered list of stacks (MaxText's `layers`,
//!   `layers_remainder`, `dense_layers`, `moe_layers`) and their parameter names.
//! - [`kernel`]: which attention kernel a run uses, decided once from the config;
//!   [`attention`]: RoPE (default and Llama 3.1's), the per-batch layer context and attention
//!   (`attend`, optionally soft-capped), shared by the families; [`mask`]: causal, sliding
//!   window and packed-document masks; [`blockwise`]: the memory-efficient blockwise attention
//!   with its own backward pass; [`cudnn`]: XLA's cuDNN fused attention custom calls, as JAX
//!   emits them (CUDA only).
//! - [`blocks`]: MaxText's layer blocks several families share: norms, the MLP block, the
//!   self-attention block.
//! - [`config`]: `ModelConfig`, the sizes and numerics every family reads, and `remat_policy`.
//! - [`flops`]: the shape of one train step's work per device and its TFLOPs, as MaxText counts them.
//! - [`fp8`]: fp8 training (`quantization=fp8`): the quantized products and their scaling state.
//! - [`params`]: parameter declarations, initialization, program inputs.
//! - [`moe`]: the routed mixture-of-experts block (router, dropless / dropping / every-expert
//!   computations, load-balancing loss), shared by MoE families.
//! - One file per family (`decoder_block`): [`llama`] (`llama2`), [`mistral`], [`gemma`],
//!   [`gemma2`], [`gemma3`] (blocks of 5 local + 1 global layers), [`gemma4`] (Gemma 3's blocks with
//!   a global head of its own, partial RoPE, value norms; experts beside a shared MLP),
//!   [`gemma4_small`] (Gemma 4's layers with per-layer input embeddings and keys and values shared
//!   across layers), [`gpt3`], [`mixtral`] (Llama's
//!   attention and a routed MoE block), [`qwen2`] (Llama's layer with query/key/value biases),
//!   [`qwen3`] (Llama's layer with QK-norm), [`qwen3_custom`] (Qwen3's attention into a narrower
//!   latent, routed experts there, then back up to `emb`), [`deepseek`]
//!   (multi-head latent attention, [`mla`], with YaRN RoPE; dense, then routed layers),
//!   [`olmo3`] (blocks of 3 sliding + 1 global post-norm layers, QK-norm over all heads),
//!   [`gpt_oss`] (pairs of sliding + global layers with attention sinks, biased experts),
//!   [`llama4`] (Llama 4's text layers: chunked attention and NoPE layers, top-1 sigmoid experts).
//! - [`hf`]: the families' Hugging Face checkpoint layouts (`maxrs convert`).

pub mod attention;
pub mod blocks;
pub mod blockwise;
pub mod config;
pub mod context_parallel;
pub mod cudnn;
pub mod decode;
pub mod decoder;
pub mod deepseek;
pub mod families;
pub mod family;
pub mod flops;
pub mod fp8;
pub mod gemma;
pub mod gemma2;
pub mod gemma3;
pub mod gemma4;
pub mod gemma4_small;
pub mod gpt3;
pub mod gpt_oss;
pub mod hf;
pub mod kernel;
pub mod llama;
pub mod llama4;
pub mod lora;
pub mod mask;
pub mod mistral;
pub mod mixtral;
pub mod mla;
pub mod moe;
pub mod olmo3;
pub mod params;
pub mod qwen2;
pub mod qwen3;
pub mod qwen3_custom;
pub mod rng_streams;
pub mod run_stacks;
pub mod stacks;

pub use config::ModelConfig;
pub use decode::CacheStep;
pub use decoder::{loss_from_logits, Forward, Model};
pub use family::{Family, LayerFlops, LayerOutput};
pub use params::{ParamDef, ParamInit};
pub use run_stacks::ParamRole;
pub use stacks::Stack;
