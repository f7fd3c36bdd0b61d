//! Which keys each query may see (`Mask`: causal, within a sliding window, within a chunk, within
//! a packed document) and the score masked positions get. Below every attention kernel: dot-product
//! attention builds the mask whole, blockwise attention (`blockwise.rs`) one block at a time.

use std::sync::Arc;

use crate::ir::DType;
use crate::tensor::Tensor;

/// The order of a load-balanced sequence (`context_parallel::permutation`): `order[i]` is the
/// index in the plain sequence of the token at `i`, which the causal, window and chunk masks
/// compare instead of `i`.
pub type Order = Arc<[i64]>;

/// The large negative score masked positions get (MaxText's `DEFAULT_MASK_VALUE`).
pub const MASK_VALUE: f64 = -0.7 * f32::MAX as f64;

/// Which keys each query may see: key `s` is visible to query `t` when `s <= t`, `t - s <
/// window` (with a window), `s / chunk == t / chunk` (with a chunk: Llama 4's chunked attention,
/// MaxText's `ChunkedCausalMask` and `_generate_chunk_attention_mask` in `layers/attention_op.py`
/// at e591f30), and both are in the same document (with segments). Dot-product
/// attention builds it whole, blockwise attention one block at a time (`allowed`).
#[derive(Clone)]
pub struct Mask {
    pub window: Option<i64>,
    /// Llama 4's attention chunk (`chunk_attn_window_size`): queries see keys of their own chunk.
    pub chunk: Option<i64>,
    /// `s32[batch, seq]`: each token's document, when the batch is packed.
    pub segments: Option<Tensor>,
    /// The sequence's order when it is load-balanced over the context axis (none: in order).
    /// MaxText masks such a sequence by its reordered positions (`use_segment_positions`,
    /// `AttentionOp.generate_attention_mask`, layers/attention_op.py:973-1000 at e591f30); within
    /// a document those order the tokens as their plain indices do, which this holds statically.
    pub order: Option<Order>,
}

impl Mask {
    /// `pred[1 or batch, queries, keys]` for query positions `query: s32[queries]` and key
    /// positions `key: s32[keys]`, with their documents `query_segments: s32[batch, queries]` and
    /// `key_segments: s32[batch, keys]` when packed.
    pub fn allowed(&self, query: &Tensor, key: &Tensor, segments: Option<(&Tensor, &Tensor)>) -> Tensor {
        let (tq, tk) = (query.shape()[0], key.shape()[0]);
        let query = query.broadcast_in_dim(&[1, tq, tk], &[1]);
        let key = key.broadcast_in_dim(&[1, tq, tk], &[2]);
        let mut allowed = key.le(&query);
        if let Some(w) = self.window {
            allowed = allowed.bitwise_and((&query - &key).lt(w as f64));
        }
        if let Some(c) = self.chunk {
            // Positions are non-negative: s32 division is the floor.
            allowed = allowed.bitwise_and((&query / c as f64).eq(&key / c as f64));
        }
        if let Some((sq, sk)) = segments {
            let b = sq.shape()[0];
            let same = sq.broadcast_in_dim(&[b, tq, tk], &[0, 1]).eq(sk.broadcast_in_dim(&[b, tq, tk], &[0, 2]));
            allowed = same.bitwise_and(allowed.broadcast_in_dim(&[b, tq, tk], &[0, 1, 2]));
        }
        allowed
    }

    /// `pred[1 or batch, seq, seq]` for a sequence of `seq` tokens on `like`'s trace.
    pub(super) fn dense(&self, like: &Tensor, seq: i64) -> Tensor {
        let positions = self.indices(like, seq);
        self.allowed(&positions, &positions, self.segments.as_ref().map(|s| (s, s)))
    }

    /// `s32[seq]`: each token's index in the plain sequence (`order`, else `0..seq`).
    pub(super) fn indices(&self, like: &Tensor, seq: i64) -> Tensor {
        match &self.order {
            Some(order) => {
                let values: Vec<f64> = order.iter().map(|&i| i as f64).collect();
                like.trace().constant(DType::S32, &[seq], &values)
            }
            None => like.trace().iota(DType::S32, &[seq], 0),
        }
    }
}
