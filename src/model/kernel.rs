//! Which attention kernel a run uses, decided once from the config (and the model's keys)
//! before tracing: `AttentionImpl` is what `ModelConfig::attention` holds and every layer's
//! `LayerContext::attend` computes; and attention computed as a kernel says (`attend` and its
//! options: dot-product attention here, blockwise attention in `blockwise.rs`), below both the
//! layer context (`attention.rs`) and context parallelism (`context_parallel.rs`). MaxText's `attention` key (`autoselected`, `dot_product`,
//! `flash`, `cudnn_flash_te`, `cudnn_flash_jax`) resolves per hardware and sequence length;
//! cuDNN's fused attention is used where `cudnn_declined` finds nothing against it; a soft cap
//! picks or requires dot-product attention. What stays per call (`attention.rs`): blockwise
//! attention's block fitted to a shorter sequence (prefill), and cuDNN's fallback to blockwise
//! attention for a call cuDNN cannot take (Gemma 2's f32 query-key product in its global
//! layers, heads or batch that do not split over the mesh).

use std::fmt;

use crate::config::{AttentionKernel, Config, DecoderBlock, Hardware};
use crate::ir::DType;
use crate::tensor::{concatenate, einsum, where_, Tensor};

use super::mask::{Mask, MASK_VALUE};
use super::{blockwise, cudnn};

/// How `attend` computes attention, resolved from MaxText's `attention` key and the hardware.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionImpl {
    /// Scores for every query and key at once: `[batch, heads, seq, seq]` in memory.
    DotProduct,
    /// An online softmax over key/value blocks of `block` tokens, per query block of the same
    /// size, with its own backward pass: memory `O(seq)` per query block.
    Blockwise { block: i64 },
    /// XLA's cuDNN fused attention (`__cudnn$fmhaSoftmax`), on CUDA; blockwise attention with
    /// `block` for a call cuDNN cannot serve (an f32 product, heads or batch that do not split).
    Cudnn { block: i64 },
}

/// Query and key/value block size of blockwise attention (MaxText's splash attention default
/// block sizes, `sa_block_q`/`sa_block_kv`, are 512 too).
pub const BLOCK: i64 = 512;

impl AttentionImpl {
    /// What `attention` means on `hardware` for sequences of `seq` tokens. MaxText's
    /// `autoselected` is dot-product attention on CPU and for sequences under 128 tokens, flash
    /// attention otherwise (`AttentionOp.apply_attention` in `src/maxtext/layers/attention_op.py`,
    /// main at e591f30). maxrs's memory-efficient attention is its blockwise kernel, which stands
    /// for `flash` (MaxText: a Pallas Triton kernel on GPU, Splash on TPU), `cudnn_flash_te`
    /// (Transformer Engine's cuDNN attention) and `cudnn_flash_jax` (XLA's cuDNN fused attention).
    pub fn resolve(kernel: AttentionKernel, hardware: Hardware, seq: i64) -> AttentionImpl {
        let blockwise = AttentionImpl::Blockwise { block: block_size(seq) };
        match kernel {
            AttentionKernel::DotProduct => AttentionImpl::DotProduct,
            AttentionKernel::Autoselected if hardware == Hardware::Cpu || seq < 128 => AttentionImpl::DotProduct,
            AttentionKernel::Autoselected
            | AttentionKernel::Flash
            | AttentionKernel::CudnnFlashTe
            | AttentionKernel::CudnnFlashJax => blockwise,
        }
    }

    /// What `c.attention` means for the run `c` describes: `resolve`, with cuDNN's fused
    /// attention for `cudnn_flash_te` and `cudnn_flash_jax` where `cudnn_declined` finds nothing
    /// against it. `autoselected` never picks cuDNN: MaxText's picks its Pallas Triton flash
    /// kernel on GPU (`AttentionOp.apply_attention`, `src/maxtext/layers/attention_op.py`,
    /// e591f30), which maxrs's blockwise attention stands for. With a soft cap
    /// (`attn_logits_soft_cap`), which only dot-product attention computes in maxrs,
    /// `autoselected` is dot-product attention; another kernel is refused (`soft_cap_refusal`).
    pub fn for_config(c: &Config) -> AttentionImpl {
        match AttentionImpl::resolve(c.attention, c.hardware, c.max_target_length) {
            AttentionImpl::Blockwise { .. }
                if soft_cap(c).is_some() && c.attention == AttentionKernel::Autoselected =>
            {
                AttentionImpl::DotProduct
            }
            AttentionImpl::Blockwise { block } if cudnn_wanted(c.attention) && cudnn_declined(c).is_none() => {
                AttentionImpl::Cudnn { block }
            }
            other => other,
        }
    }

    /// This kernel for a sequence of `seq` queries: blockwise attention's block shrunk to a
    /// divisor of `seq` when the configured one (sized for `max_target_length`) does not divide
    /// it, as in prefill over `max_prefill_predict_length` tokens.
    pub fn fitted(self, seq: i64) -> AttentionImpl {
        match self {
            AttentionImpl::Blockwise { block } if seq % block != 0 => {
                AttentionImpl::Blockwise { block: block_size(seq) }
            }
            AttentionImpl::Cudnn { block } if seq % block != 0 => AttentionImpl::Cudnn { block: block_size(seq) },
            other => other,
        }
    }
}

/// `attn_logits_soft_cap` when positive: attention's scores become `cap * tanh(scores / cap)`
/// (Gemma 2 and 3; the families that do not read the key refuse it).
pub fn soft_cap(c: &Config) -> Option<f64> {
    (c.attn_logits_soft_cap > 0.0).then_some(c.attn_logits_soft_cap)
}

/// Why the run `c` describes cannot have its soft cap: the kernel asked for is blockwise (or
/// cuDNN's, which falls back to it), which has none yet.
pub fn soft_cap_refusal(c: &Config) -> Option<String> {
    let cap = soft_cap(c)?;
    matches!(AttentionImpl::for_config(c), AttentionImpl::Blockwise { .. } | AttentionImpl::Cudnn { .. }).then(|| {
        format!(
            "attention={}: maxrs's blockwise attention has no attn_logits_soft_cap ({cap}) yet; use attention=dot_product \
             (or autoselected, which picks it with a soft cap)",
            c.attention
        )
    })
}

fn cudnn_wanted(kernel: AttentionKernel) -> bool {
    matches!(kernel, AttentionKernel::CudnnFlashTe | AttentionKernel::CudnnFlashJax)
}

/// Why `attention=cudnn_flash_te|cudnn_flash_jax` cannot use cuDNN's fused attention for the run
/// `c` describes (`None`: it can, or another kind was asked for).
pub fn cudnn_declined(c: &Config) -> Option<String> {
    if !cudnn_wanted(c.attention) {
        return None;
    }
    let cuda_plugin = matches!(c.plugin.as_str(), "cuda12" | "cuda13")
        || std::path::Path::new(&c.plugin).file_name().is_some_and(|f| f.to_string_lossy().contains("cuda"));
    if !c.hardware.is_gpu() || !cuda_plugin {
        return Some(format!(
            "cuDNN runs on a CUDA GPU (hardware=gpu with plugin=cuda12 or cuda13), not hardware={} plugin={:?}",
            c.hardware, c.plugin
        ));
    }
    // XLA builds cuDNN's graphs only with a GPU at hand (`RunCudnnCompilerPasses` runs only with a
    // stream executor, `xla/service/gpu/gpu_compiler.cc`), and a loaded executable's `CuDnnThunk`
    // looks its graph up among them (`xla/backends/gpu/runtime/cudnn_thunk.cc`): a deviceless
    // compile's executable holds none, so it could not run its cuDNN calls.
    if !c.compile_topology.is_empty() {
        return Some(format!(
            "a deviceless compile (compile_topology={:?}) cannot hold cuDNN's compiled graphs, which XLA builds only \
             on a GPU",
            c.compile_topology
        ));
    }
    // The width each call sees (multi-head latent attention pads its values to its keys').
    if let Some(reason) = cudnn::unsupported(c.dtype.ir(), c.qk_head_dim()) {
        return Some(reason);
    }
    if c.attn_logits_soft_cap > 0.0 {
        return Some(format!(
            "cuDNN's fused attention has no soft cap (attn_logits_soft_cap={})",
            c.attn_logits_soft_cap
        ));
    }
    if c.packed_batches() && c.max_documents_per_row().is_none() {
        return Some(
            "packed documents (dataset_type=hf, packing=true) go into cuDNN's packed layout only with a fixed number of \
             documents a row: set max_segments_per_seq (MaxText's GPU configs use 32)"
                .into(),
        );
    }
    // MaxText hands a split sequence to Transformer Engine's own context parallelism
    // (`cudnn_flash_attention`, layers/attention_op.py:2230-2338 at e591f30); XLA's fused
    // attention has one causal mask aligned at the first query and key, which one device's
    // queries against every key (all_gather, ring) do not have.
    if c.ici_context_parallelism * c.dcn_context_parallelism > 1 {
        return Some(format!(
            "the sequence is sharded (context parallelism), which cuDNN's calls do not split:              context_parallel_strategy={} runs blockwise attention on each device's queries",
            c.context_parallel_strategy
        ));
    }
    None
}

impl fmt::Display for AttentionImpl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttentionImpl::DotProduct => write!(f, "dot-product attention ([batch, heads, seq, seq] scores)"),
            AttentionImpl::Blockwise { block } => {
                write!(f, "blockwise attention (online softmax over {block}-token key/value blocks)")
            }
            AttentionImpl::Cudnn { .. } => {
                write!(f, "XLA's cuDNN fused attention (`{}` / `{}` custom calls)", cudnn::FORWARD, cudnn::BACKWARD)
            }
        }
    }
}

/// The start-up line that says what `c.attention` became (`how`) and, for a fallback, why.
pub fn describe(c: &Config, how: AttentionImpl) -> String {
    let kernel = c.attention;
    let note = match kernel {
        AttentionKernel::CudnnFlashTe | AttentionKernel::CudnnFlashJax => match (how, cudnn_declined(c)) {
            (AttentionImpl::Cudnn { block }, _) => {
                let te = match kernel {
                    AttentionKernel::CudnnFlashTe => "; maxrs has no Transformer Engine: XLA's calls instead",
                    _ => "",
                };
                let global = match c.decoder_block {
                    DecoderBlock::Gemma2 => format!(
                        "; blockwise ({block}-token blocks) in the global layers, whose f32 query-key product cuDNN does not take"
                    ),
                    // MaxText's cudnn_flash_te hands Transformer Engine the chunk mask as an explicit
                    // mask, its cudnn_flash_jax drops it (`AttentionOp.cudnn_flash_attention`,
                    // `cudnn_jax_flash_attention`, layers/attention_op.py at e591f30); XLA's fused
                    // attention takes no mask, so maxrs computes those layers blockwise.
                    DecoderBlock::Llama4 if c.chunk_attn_window_size > 0 => format!(
                        "; blockwise ({block}-token blocks) in the chunked-attention layers, whose chunk mask cuDNN's fused attention does not take"
                    ),
                    // Gemma 4's global layers have their own head size (512 in the model files).
                    DecoderBlock::Gemma4 | DecoderBlock::Gemma4Small => {
                        match cudnn::unsupported(c.dtype.ir(), c.global_head_dim) {
                            Some(why) if c.global_head_dim > 0 => {
                                format!("; blockwise ({block}-token blocks) in the global layers: {why}")
                            }
                            _ => String::new(),
                        }
                    }
                    _ => String::new(),
                };
                format!("{te}{global}")
            }
            (_, Some(reason)) => format!("; not cuDNN: {reason}"),
            (_, None) => String::new(),
        },
        AttentionKernel::Flash => "; MaxText's Pallas (GPU) and Splash (TPU) kernels are not in maxrs".into(),
        AttentionKernel::Autoselected | AttentionKernel::DotProduct => String::new(),
    };
    format!("attention: {kernel} -> {how}{note}")
}

/// The largest block of at most `BLOCK` tokens that divides `seq` (all of it when shorter).
fn block_size(seq: i64) -> i64 {
    (1..=BLOCK.min(seq)).rev().find(|b| seq % b == 0).unwrap_or(seq)
}

/// What `attend_with` does besides the plain softmax attention of `attend`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AttendOptions {
    /// Scores become `cap * tanh(scores / cap)` before masking (MaxText's `attn_logits_soft_cap`).
    pub logits_soft_cap: Option<f64>,
    /// Queries and keys are cast to f32 before their product (MaxText's `float32_qk_product`).
    pub float32_qk_product: bool,
}

impl AttendOptions {
    /// The queries and keys as their product reads them: in f32 with `float32_qk_product`.
    pub fn product_operands(&self, q: &Tensor, k: &Tensor) -> (Tensor, Tensor) {
        match self.float32_qk_product {
            true => (q.astype(DType::F32), k.astype(DType::F32)),
            false => (q.clone(), k.clone()),
        }
    }
}

/// Attention of queries `q: [batch, seq, heads, head_dim]` (already scaled) over keys and values
/// `k, v: [batch, seq, kv_heads, head_dim]` under `mask`, computed as `how` says; query head `i`
/// uses key/value head `i / (heads / kv_heads)`. Scores and softmax are f32; the result,
/// `[batch, seq, heads, head_dim]` in `q`'s dtype, is tagged `context` by the blockwise kernel
/// (MaxText's name, which `minimal_with_context` saves; dot-product attention's is not, as in
/// MaxText). Blockwise attention's softmax statistics are tagged `context` too, as MaxText's
/// cuDNN attention tags its `lse`: a policy that saves the context then never recomputes
/// attention in the backward pass.
pub fn attend(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Mask, how: AttentionImpl) -> Tensor {
    attend_with(q, k, v, mask, how, &AttendOptions::default())
}

/// `attend` with `options`: soft-capped scores (dot-product attention only: the families refuse
/// a soft cap with blockwise attention), an f32 query-key product.
pub fn attend_with(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Mask,
    how: AttentionImpl,
    options: &AttendOptions,
) -> Tensor {
    attend_sinks(q, k, v, mask, how, options, None)
}

/// `attend_with` with attention sinks (`[heads]`, see `LayerContext::attend_sinks`) when given.
pub fn attend_sinks(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Mask,
    how: AttentionImpl,
    options: &AttendOptions,
    sinks: Option<&Tensor>,
) -> Tensor {
    let (qk, kk) = options.product_operands(q, k);
    match how {
        // Not tagged `context`: MaxText's `apply_attention_dot` names nothing
        // (`src/maxtext/layers/attention_op.py` at e591f30; only its cuDNN and flash kernels name
        // their results `context`), so `minimal_with_context` recomputes this product from the
        // saved queries, keys and values with the scores its backward pass recomputes anyway.
        AttentionImpl::DotProduct => {
            let allowed = mask.dense(&qk, qk.shape()[1]);
            dot_product(&qk, &kk, v, &allowed, options.logits_soft_cap, sinks).astype(q.dtype())
        }
        // `LayerContext::attend` runs cuDNN's calls; elsewhere (a bare `attend`), blockwise.
        AttentionImpl::Blockwise { block } | AttentionImpl::Cudnn { block } => {
            assert!(
                options.logits_soft_cap.is_none(),
                "blockwise attention has no soft cap (kernel::soft_cap_refusal refuses it)"
            );
            // The kernel's matmuls take one dtype: with an f32 query-key product, f32 values too.
            let vk = if options.float32_qk_product { v.astype(DType::F32) } else { v.clone() };
            let (out, lse) = blockwise::attention(&qk, &kk, &vk, mask, block, sinks);
            lse.checkpoint_name("context");
            out.astype(q.dtype()).checkpoint_name("context")
        }
    }
}

/// The f32 scores `[batch, kv_heads, group, queries, keys]` of `q: [batch, queries, heads, d]`
/// against `k: [batch, keys, kv_heads, d]`, soft-capped at `cap * tanh(scores / cap)` when
/// `soft_cap` is given, and `MASK_VALUE` where `allowed: pred[1 or batch, queries, keys]` is false.
pub(super) fn masked_scores(q: &Tensor, k: &Tensor, allowed: &Tensor, soft_cap: Option<f64>) -> Tensor {
    let (b, t, heads, d) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
    let kv_heads = k.shape()[2];
    let q = q.reshape(&[b, t, kv_heads, heads / kv_heads, d]);
    let scores = einsum("btngk,bsnk->bngts", &[&q, k]).astype(DType::F32);
    let scores = match soft_cap {
        Some(cap) => (scores / cap).tanh() * cap,
        None => scores,
    };
    let mask = allowed.broadcast_in_dim(scores.shape(), &[0, 3, 4]);
    where_(&mask, &scores, MASK_VALUE)
}

/// Scores for every query and key at once, `[batch, kv_heads, group, queries, keys]`, soft-capped
/// at `cap * tanh(scores / cap)` when `soft_cap` is given, under `allowed: pred[1 or batch,
/// queries, keys]`; with `sinks` (`[heads]`) one more score per query, its head's sink, joins
/// the softmax and is dropped after it.
pub(super) fn dot_product(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    allowed: &Tensor,
    soft_cap: Option<f64>,
    sinks: Option<&Tensor>,
) -> Tensor {
    let (b, t, heads, kv_heads) = (q.shape()[0], q.shape()[1], q.shape()[2], k.shape()[2]);
    // The values' head dimension may differ from the queries' and keys' (MLA's v_head_dim).
    let dv = v.shape()[3];
    let scores = masked_scores(q, k, allowed, soft_cap);
    let probs = match sinks {
        None => scores.softmax(-1),
        Some(sinks) => {
            let keys = scores.shape()[4];
            let column: Vec<i64> = scores.shape()[..4].iter().copied().chain([1]).collect();
            let sinks = sinks.astype(scores.dtype()).reshape(&[kv_heads, heads / kv_heads]);
            let sinks = sinks.broadcast_in_dim(&column, &[1, 2]);
            concatenate(&[&scores, &sinks], 4).softmax(-1).slice_axis(4, 0, keys)
        }
    };
    let probs = probs.astype(v.dtype());
    einsum("bngts,bsnk->btngk", &[&probs, v]).reshape(&[b, t, heads, dv])
}
