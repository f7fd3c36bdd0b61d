//! The context-parallelism keys (`context_parallel_strategy`, `context_parallel_load_balance`,
//! `context_parallel_reorder_strategy`, and usp's `ici/dcn_context_usp_ulysses_parallelism`):
//! MaxText's checks of them and of their pairs with the attention kernel and the mesh
//! (`configs/types.py`, `utils/train_utils.py` and `utils/max_utils.py` at MaxText e591f30), and
//! the load-balancing order a run uses ([`load_balance`], `auto` resolved as MaxText's train
//! setup resolves it). What the strategies compute is `model::context_parallel`'s.

use super::choices::{AttentionKernel, AttentionType, ContextParallelStrategy, ReorderStrategy};
use super::error::ConfigError;
use super::keys::Config;

/// The permutation of the sequence a load-balanced run trains on (`auto` resolved).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reorder {
    /// The sequence in `2n` chunks for `n` context devices; device `i` holds chunks `i` and
    /// `2n - 1 - i` (`max_utils.reorder_sequence`).
    DualChunkSwap,
    /// Device `i` holds tokens `i, i + n, i + 2n, ...` (Transformer Engine's striped order).
    Striped,
}

/// The reorder of the run `c` describes when its sequence is split over more than one context
/// device (none without load balancing). `auto` is striped for packed batches under ring
/// attention on GPU, else dual-chunk-swap (`setup_train_loop`, `utils/train_utils.py:308-320` at
/// e591f30).
pub fn load_balance(c: &Config) -> Option<Reorder> {
    if !c.context_parallel_load_balance {
        return None;
    }
    Some(match c.context_parallel_reorder_strategy {
        ReorderStrategy::DualChunkSwap => Reorder::DualChunkSwap,
        ReorderStrategy::Striped => Reorder::Striped,
        ReorderStrategy::Auto
            if c.packed_batches()
                && c.context_parallel_strategy == ContextParallelStrategy::Ring
                && c.hardware.is_gpu() =>
        {
            Reorder::Striped
        }
        ReorderStrategy::Auto => Reorder::DualChunkSwap,
    })
}

/// MaxText's checks of the context-parallelism keys for a mesh with `context` devices on the
/// context axis and `ulysses` on the context_usp_ulysses axis, and a model of `heads` query and
/// key/value heads, each error naming the keys.
pub fn check(c: &Config, (context, ulysses): (usize, usize), heads: (i64, i64)) -> Result<(), ConfigError> {
    let strategy = c.context_parallel_strategy;
    let seq = c.max_target_length;
    let cp = context as i64;
    match strategy {
        ContextParallelStrategy::Usp => check_usp(c, (cp, ulysses as i64), heads)?,
        // `_validate_usp_context_parallelism` (configs/types.py:3038-3045 at e591f30).
        _ if (c.ici_context_usp_ulysses_parallelism, c.dcn_context_usp_ulysses_parallelism) != (1, 1) => {
            return Err(ConfigError::invalid(
                "ici_context_usp_ulysses_parallelism, dcn_context_usp_ulysses_parallelism",
                format!(
                    "the context_usp_ulysses axis is usp's Ulysses group: set it only with \
                     context_parallel_strategy=usp (as MaxText), not {strategy}"
                ),
            ));
        }
        ContextParallelStrategy::Ulysses => check_ulysses(c, cp, heads)?,
        _ => {}
    }
    // Transformer Engine's cuDNN attention keeps packed documents apart under context
    // parallelism only in its load-balanced ring (`setup_train_loop`, utils/train_utils.py:292-300).
    if cp > 1
        && c.hardware.is_gpu()
        && c.packed_batches()
        && c.attention == AttentionKernel::CudnnFlashTe
        && !(strategy == ContextParallelStrategy::Ring && c.context_parallel_load_balance)
    {
        return Err(ConfigError::invalid(
            "context_parallel_strategy, context_parallel_load_balance",
            "attention=cudnn_flash_te takes packed documents under context parallelism only with \
             context_parallel_strategy=ring and context_parallel_load_balance=true (as MaxText)",
        ));
    }
    // Under usp the sequence is split over both axes; the load-balancing order below is over the
    // context axis alone, as MaxText's train setup reorders by `mesh.shape[context_sharding]`
    // (utils/train_utils.py:258 at e591f30).
    let shards = cp * ulysses as i64;
    if shards > 1 && seq % shards != 0 {
        let keys = match ulysses {
            1 => "max_target_length, ici_context_parallelism",
            _ => "max_target_length, ici_context_parallelism, ici_context_usp_ulysses_parallelism",
        };
        return Err(ConfigError::invalid(
            keys,
            format!("the sequence ({seq} tokens) does not split over the {shards} context shards"),
        ));
    }
    match load_balance(c).filter(|_| cp > 1) {
        // `reorder_causal_load_balanced` refuses striped without Transformer Engine (configs/types.py:4136-4148).
        Some(Reorder::Striped) if !c.hardware.is_gpu() => Err(ConfigError::invalid(
            "context_parallel_reorder_strategy",
            format!(
                "striped is Transformer Engine's order, GPU only (hardware={}); use dual_chunk_swap or auto",
                c.hardware
            ),
        )),
        Some(Reorder::Striped) if seq % cp != 0 => Err(ConfigError::invalid(
            "max_target_length, context_parallel_reorder_strategy",
            format!(
                "striped load balancing needs max_target_length ({seq}) to be a multiple of the {cp} context shards"
            ),
        )),
        // `reorder_sequence` (utils/max_utils.py:859-880): two chunks a device, swapped in pairs.
        Some(Reorder::DualChunkSwap) if cp % 2 != 0 => Err(ConfigError::invalid(
            "context_parallel_load_balance",
            format!(
                "dual_chunk_swap load balancing pairs the context shards, so their number ({cp}) must be even; use an \
                 even ici_context_parallelism x dcn_context_parallelism or context_parallel_load_balance=false"
            ),
        )),
        Some(Reorder::DualChunkSwap) if seq % (2 * cp) != 0 => Err(ConfigError::invalid(
            "max_target_length, context_parallel_load_balance",
            format!(
                "dual_chunk_swap load balancing cuts the sequence into 2 x {cp} chunks; max_target_length ({seq}) is \
                 not a multiple of {}",
                2 * cp
            ),
        )),
        _ => Ok(()),
    }
}

/// MaxText's Ulysses checks (`configs/types.py:4071-4133` at e591f30) but the TPU-only ones:
/// maxrs's all-to-all runs on every backend.
fn check_ulysses(c: &Config, cp: i64, (heads, kv_heads): (i64, i64)) -> Result<(), ConfigError> {
    let refuse = |keys: &str, why: String| Err(ConfigError::invalid(keys, why));
    if cp <= 1 {
        return refuse(
            "context_parallel_strategy, ici_context_parallelism",
            "ulysses needs a context axis of more than one device".into(),
        );
    }
    if c.dcn_context_parallelism != 1 {
        return refuse(
            "context_parallel_strategy, dcn_context_parallelism",
            "ulysses over the context axis across hosts/slices is not supported yet (nor in MaxText)".into(),
        );
    }
    if c.attention != AttentionKernel::Flash {
        return refuse(
            "context_parallel_strategy, attention",
            format!("ulysses needs attention=flash (as MaxText), not attention={}", c.attention),
        );
    }
    if c.context_parallel_load_balance {
        return refuse(
            "context_parallel_strategy, context_parallel_load_balance",
            "ulysses needs context_parallel_load_balance=false: after its all-to-all every device attends over the \
             whole sequence in order, so the reorder balances nothing (as MaxText)"
                .into(),
        );
    }
    if heads % cp != 0 || kv_heads % cp != 0 {
        return refuse(
            "context_parallel_strategy, base_num_query_heads, base_num_kv_heads",
            format!(
                "ulysses splits the heads over the {cp} context shards: {heads} query and {kv_heads} key/value heads \
                 do not split"
            ),
        );
    }
    Ok(())
}

/// MaxText's usp checks (`_validate_usp_context_parallelism`, configs/types.py:3038-3105, and
/// `validate_head_sharding`, kernels/attention/ulysses_attention.py, at e591f30) but the TPU-only
/// ones (TPU hardware, Tokamax's splash kernel): maxrs's all-to-all and ring run on every backend.
/// The keys MaxText also checks that maxrs takes only at their default (`use_indexer`,
/// `use_ragged_attention`, `use_chunked_prefill`, `use_multimodal`, `use_qk_clip`,
/// `dq_reduction_steps`, a non-zero `dropout_rate`, `logical_axis_rules_for_eval`) are refused
/// where they are read.
fn check_usp(c: &Config, (ring, ulysses): (i64, i64), (heads, kv_heads): (i64, i64)) -> Result<(), ConfigError> {
    let refuse = |keys: &str, why: String| Err(ConfigError::invalid(keys, why));
    const AXES: [&str; 2] = ["context", "context_usp_ulysses"];
    if let Some(axis) = AXES.iter().find(|a| !c.mesh_axes.iter().any(|m| m == *a)) {
        return refuse("context_parallel_strategy, mesh_axes", format!("usp needs the mesh axis {axis} in mesh_axes"));
    }
    let length = c.logical_axis_rules.iter().find(|r| r.0 == "activation_length").map(|r| r.1.to_vec());
    if length.as_deref() != Some(&AXES.map(String::from)[..]) {
        return refuse(
            "context_parallel_strategy, logical_axis_rules",
            format!(
                "usp needs activation_length to map to {AXES:?} in logical_axis_rules (as MaxText), not {length:?}"
            ),
        );
    }
    let sizes = [
        ("ici_context_parallelism", c.ici_context_parallelism),
        ("dcn_context_parallelism", c.dcn_context_parallelism),
        ("ici_context_usp_ulysses_parallelism", c.ici_context_usp_ulysses_parallelism),
        ("dcn_context_usp_ulysses_parallelism", c.dcn_context_usp_ulysses_parallelism),
    ];
    if let Some((key, value)) = sizes.iter().find(|(_, v)| *v <= 0) {
        return refuse(
            &format!("context_parallel_strategy, {key}"),
            format!("usp needs explicit context sizes (as MaxText), not {key}={value}"),
        );
    }
    if ring <= 1 {
        return refuse(
            "context_parallel_strategy, ici_context_parallelism",
            "usp needs a ring of more than one device: ici_context_parallelism > 1".into(),
        );
    }
    if ulysses <= 1 {
        return refuse(
            "context_parallel_strategy, ici_context_usp_ulysses_parallelism",
            "usp needs a Ulysses group of more than one device: ici_context_usp_ulysses_parallelism > 1".into(),
        );
    }
    if c.dcn_context_parallelism != 1 || c.dcn_context_usp_ulysses_parallelism != 1 {
        return refuse(
            "context_parallel_strategy, dcn_context_parallelism, dcn_context_usp_ulysses_parallelism",
            "usp across hosts/slices is not supported yet (nor in MaxText)".into(),
        );
    }
    if c.attention != AttentionKernel::Flash {
        return refuse(
            "context_parallel_strategy, attention",
            format!("usp needs attention=flash (as MaxText), not attention={}", c.attention),
        );
    }
    if c.attention_type != AttentionType::Global || c.sliding_window_size > 0 || c.chunk_attn_window_size > 0 {
        return refuse(
            "context_parallel_strategy, attention_type, sliding_window_size, chunk_attn_window_size",
            format!(
                "usp supports global causal attention only (as MaxText), not attention_type={} with \
                 sliding_window_size={} and chunk_attn_window_size={}",
                c.attention_type, c.sliding_window_size, c.chunk_attn_window_size
            ),
        );
    }
    if c.attention_sink {
        return refuse("context_parallel_strategy, attention_sink", "usp has no attention sinks (as MaxText)".into());
    }
    if c.mtp_num_layers > 0 {
        return refuse(
            "context_parallel_strategy, mtp_num_layers",
            "usp with multi-token prediction is not supported yet (nor in MaxText)".into(),
        );
    }
    if heads % ulysses != 0 || kv_heads % ulysses != 0 {
        return refuse(
            "context_parallel_strategy, base_num_query_heads, base_num_kv_heads, ici_context_usp_ulysses_parallelism",
            format!(
                "usp splits the heads over the {ulysses} devices of its Ulysses group: {heads} query and {kv_heads} \
                 key/value heads do not split"
            ),
        );
    }
    Ok(())
}
