//! What attention is, for every family: the per-batch context the layers share (RoPE tables for
//! each token's position, the mask of which keys each query may see) and dot-product attention
//! over grouped-query heads. Families compute their own projections and call `attend`.

use crate::ir::DType;
use crate::tensor::{concatenate, einsum, where_, Tensor, Tree};

use super::ModelConfig;

/// The large negative score masked positions get (MaxText's `DEFAULT_MASK_VALUE`).
pub const MASK_VALUE: f64 = -0.7 * f32::MAX as f64;

/// What the layers of one forward pass share, built once from the batch.
pub struct LayerContext {
    /// `[batch, seq, head_dim / 2]` f32 RoPE angles' cosines and sines at each token's position.
    pub cos: Tensor,
    pub sin: Tensor,
    /// `s32[batch, seq]`: each token's position in its document (`inputs_position` when the batch
    /// has it, else `0..seq`).
    pub positions: Tensor,
    /// `s32[batch, seq]`: each token's document (`inputs_segmentation`), when the batch is packed.
    pub segments: Option<Tensor>,
}

impl LayerContext {
    /// The context of a batch tree with `inputs` (`s32[batch, seq]`) and optionally
    /// `inputs_position` and `inputs_segmentation`.
    pub fn new(c: &ModelConfig, batch: &Tree) -> LayerContext {
        let tokens = &batch["inputs"];
        let (b, t) = (tokens.shape()[0], tokens.shape()[1]);
        let ctx = tokens.trace();
        let positions = batch.get("inputs_position").cloned().unwrap_or_else(|| ctx.iota(DType::S32, &[b, t], 1));
        // MaxText's timescales: `max_timescale^(2i / head_dim)` for `i < head_dim / 2`; the angle
        // of position `p` is `p / timescale`.
        let half = c.head_dim / 2;
        let inv_timescale: Vec<f64> =
            (0..half).map(|i| c.rope_max_timescale.powf(-2.0 * i as f64 / c.head_dim as f64)).collect();
        let angles = positions.astype(DType::F32).broadcast_in_dim(&[b, t, half], &[0, 1])
            * &ctx.constant(DType::F32, &[half], &inv_timescale);
        LayerContext {
            cos: angles.cos(),
            sin: angles.sin(),
            positions,
            segments: batch.get("inputs_segmentation").cloned(),
        }
    }

    /// `pred[1 or batch, seq, seq]`: true where query `t` may attend to key `s`: `s <= t`, within
    /// `window` tokens when given (`t - s < window`), and in the same document when packed.
    pub fn mask(&self, window: Option<i64>) -> Tensor {
        let t = self.positions.shape()[1];
        let ctx = self.positions.trace();
        let (query, key) = (ctx.iota(DType::S32, &[1, t, t], 1), ctx.iota(DType::S32, &[1, t, t], 2));
        let mut allowed = key.le(&query);
        if let Some(w) = window {
            allowed = allowed.bitwise_and((&query - &key).lt(w as f64));
        }
        if let Some(seg) = &self.segments {
            let b = seg.shape()[0];
            let same = seg.broadcast_in_dim(&[b, t, t], &[0, 1]).eq(seg.broadcast_in_dim(&[b, t, t], &[0, 2]));
            allowed = same.bitwise_and(&allowed);
        }
        allowed
    }
}

/// Rotary position embedding of `x: [batch, seq, heads, head_dim]`, MaxText's half-split
/// convention: with `x = [x1, x2]` split in halves of the head dimension,
/// `[x1 cos - x2 sin, x2 cos + x1 sin]`. Computed in f32, returned in `x`'s dtype.
pub fn rope(x: &Tensor, ctx: &LayerContext) -> Tensor {
    let (b, t, h, k) = (x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]);
    let table = |v: &Tensor| v.broadcast_in_dim(&[b, t, h, k / 2], &[0, 1, 3]);
    let (cos, sin) = (table(&ctx.cos), table(&ctx.sin));
    let xf = x.astype(DType::F32);
    let (x1, x2) = (xf.slice_axis(3, 0, k / 2), xf.slice_axis(3, k / 2, k));
    concatenate(&[&(&x1 * &cos - &x2 * &sin), &(&x2 * &cos + &x1 * &sin)], 3).astype(x.dtype())
}

/// Dot-product attention of queries `q: [batch, seq, heads, head_dim]` (already scaled) over
/// keys and values `k, v: [batch, seq, kv_heads, head_dim]` under `mask` (`LayerContext::mask`);
/// query head `i` uses key/value head `i / (heads / kv_heads)`. Scores and softmax are f32; the
/// result, `[batch, seq, heads, head_dim]` in `q`'s dtype, is tagged `context` (MaxText's name,
/// which `minimal_with_context` saves).
pub fn attend(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor) -> Tensor {
    let (b, t, heads, d) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
    let kv_heads = k.shape()[2];
    let q = q.reshape(&[b, t, kv_heads, heads / kv_heads, d]);
    let scores = einsum("btngk,bsnk->bngts", &[&q, k]).astype(DType::F32);
    let mask = mask.broadcast_in_dim(scores.shape(), &[0, 3, 4]);
    let probs = where_(&mask, &scores, MASK_VALUE).softmax(-1).astype(v.dtype());
    einsum("bngts,bsnk->btngk", &[&probs, v]).reshape(&[b, t, heads, d]).checkpoint_name("context")
}
