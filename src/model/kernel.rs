//! Which attention kernel a run uses, decided once from the config (and the model's keys)
//! before tracing: `AttentionImpl` is what `ModelConfig::attention` holds and every layer's
//! `LayerContext::attend` computes. MaxText's `attention` key (`autoselected`, `dot_product`,
//! `flash`, `cudnn_flash_te`, `cudnn_flash_jax`) resolves per hardware and sequence length;
//! cuDNN's fused attention is used where `cudnn_declined` finds nothing against it; a soft cap
//! picks or requires dot-product attention. What stays per call (`attention.rs`): blockwise
//! attention's block fitted to a shorter sequence (prefill), and cuDNN's fallback to blockwise
//! attention for a call cuDNN cannot take (Gemma 2's f32 query-key product in its global
//! layers, heads or batch that do not split over the mesh).

use std::fmt;

use crate::config::{AttentionKernel, Config, DecoderBlock, Hardware};

use super::cudnn;

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
    if c.ici_context_parallelism * c.dcn_context_parallelism > 1 {
        return Some("the sequence is sharded (context parallelism), which cuDNN's calls do not split".into());
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
                    DecoderBlock::Gemma4 => match cudnn::unsupported(c.dtype.ir(), c.global_head_dim) {
                        Some(why) if c.global_head_dim > 0 => {
                            format!("; blockwise ({block}-token blocks) in the global layers: {why}")
                        }
                        _ => String::new(),
                    },
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
