//! What attention is, for every family: the per-batch context the layers share (RoPE tables for
//! each token's position, the mask of which keys each query may see, and when decoding the
//! key/value cache) and dot-product attention over grouped-query heads. Families compute their
//! own projections and call `LayerContext::attend`, which is where decoding's cache is read and
//! written: no family knows whether it runs in training, in prefill or in a generate step.

use std::cell::RefCell;

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
    /// Decoding: the key/value cache this layer's attention calls fill or update (set by the
    /// shared decoder for each layer, `with_cache`).
    cache: Option<RefCell<LayerCache>>,
}

/// One attention call's key/value cache, `[layers, batch, cache_len, kv_heads, head_dim]` each
/// (MaxText's logical axes `layers, cache_batch, cache_sequence, cache_heads, cache_kv`): the keys
/// and values of every layer, stacked, so that a generate step updates them in place.
#[derive(Clone, Debug)]
pub struct KvCache {
    pub key: Tensor,
    pub value: Tensor,
}

/// The logical axes of a `KvCache` array (MaxText's `cache_*` names).
pub const CACHE_AXES: &[&str] = &["layers", "cache_batch", "cache_sequence", "cache_heads", "cache_kv"];

/// What decoding gives one layer: the caches of its attention calls, in call order.
#[derive(Debug)]
pub enum LayerCache {
    /// Prefill: the tokens are a prompt from position 0; each call attends over the prompt's own
    /// keys and values (exactly as in training) and records them, padded to `len` positions, as
    /// this layer's `[batch, len, kv_heads, head_dim]` cache (`filled`, in call order).
    Fill { len: i64, filled: Vec<KvCache> },
    /// A generate step: each call writes its tokens' keys and values into layer `layer` of the
    /// next cache of `caches` (at each row's position) and attends over everything cached up to
    /// the query's position; `used` counts the calls so far.
    Update { layer: Tensor, caches: Vec<KvCache>, used: usize },
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
            cache: None,
        }
    }

    /// The same context with `cache` for one layer's attention calls (decoding).
    pub fn with_cache(&self, cache: LayerCache) -> LayerContext {
        LayerContext {
            cos: self.cos.clone(),
            sin: self.sin.clone(),
            positions: self.positions.clone(),
            segments: self.segments.clone(),
            cache: Some(RefCell::new(cache)),
        }
    }

    /// The layer's cache after its attention calls (none outside decoding).
    pub fn into_cache(self) -> Option<LayerCache> {
        self.cache.map(RefCell::into_inner)
    }

    /// Self-attention of queries `q: [batch, seq, heads, head_dim]` (already scaled) over keys
    /// and values `k, v: [batch, seq, kv_heads, head_dim]` of the same tokens, causal and within
    /// `window` tokens when given: the one entry point families call. Outside decoding it is
    /// `attend` under `mask(window)`. When decoding, the shared decoder has attached this
    /// layer's cache: prefill attends the same way and records `k`, `v`; a generate step writes
    /// `k`, `v` at the tokens' positions and attends over every cached position up to each query's
    /// (and within `window`), so each query sees exactly the keys the full sequence would give it.
    pub fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor, window: Option<i64>) -> Tensor {
        let Some(cache) = &self.cache else { return attend(q, k, v, &self.mask(window)) };
        match &mut *cache.borrow_mut() {
            LayerCache::Fill { len, filled } => {
                let t = k.shape()[1];
                let pad = |x: &Tensor| x.pad(0.0, &[0, 0, 0, 0], &[0, *len - t, 0, 0], &[0, 0, 0, 0]);
                filled.push(KvCache { key: pad(k), value: pad(v) });
                attend(q, k, v, &self.mask(window))
            }
            LayerCache::Update { layer, caches, used } => {
                let Some(slot) = caches.get_mut(*used) else {
                    panic!("the layer makes more attention calls than the cache has ({})", caches.len())
                };
                *used += 1;
                slot.key = write_rows(&slot.key, k, layer, &self.positions);
                slot.value = write_rows(&slot.value, v, layer, &self.positions);
                let (keys, values) = (layer_of(&slot.key, layer), layer_of(&slot.value, layer));
                attend(q, &keys, &values, &self.cache_mask(window, keys.shape()[1]))
            }
        }
    }

    /// `pred[batch, seq, len]`: which of `len` cache positions each token's query sees: those at
    /// or before its position, within `window` tokens when given.
    fn cache_mask(&self, window: Option<i64>, len: i64) -> Tensor {
        let (b, t) = (self.positions.shape()[0], self.positions.shape()[1]);
        let query = self.positions.broadcast_in_dim(&[b, t, len], &[0, 1]);
        let key = self.positions.trace().iota(DType::S32, &[b, t, len], 2);
        let mut allowed = key.le(&query);
        if let Some(w) = window {
            allowed = allowed.bitwise_and((&query - &key).lt(w as f64));
        }
        allowed
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

/// `cache: [layers, batch, len, kv_heads, head_dim]` with row `b` of `new: [batch, seq, kv_heads,
/// head_dim]` written in layer `layer` from position `positions[b, 0]` on (one in-place
/// `dynamic_update_slice` per row: rows may be at different positions).
fn write_rows(cache: &Tensor, new: &Tensor, layer: &Tensor, positions: &Tensor) -> Tensor {
    let [b, t, kv, d] = [new.shape()[0], new.shape()[1], new.shape()[2], new.shape()[3]];
    let ctx = cache.trace();
    let zero = ctx.scalar(0.0, DType::S32);
    let mut out = cache.clone();
    for row in 0..b {
        let update = new.slice_axis(0, row, row + 1).reshape(&[1, 1, t, kv, d]).astype(cache.dtype());
        let start = positions.slice(&[row, 0], &[row + 1, 1]).reshape(&[]);
        let at = ctx.scalar(row as f64, DType::S32);
        out = out.dynamic_update_slice(&update, &[layer, &at, &start, &zero, &zero]);
    }
    out
}

/// Layer `layer` of a stacked cache: `[batch, len, kv_heads, head_dim]`.
fn layer_of(cache: &Tensor, layer: &Tensor) -> Tensor {
    let zero = cache.trace().scalar(0.0, DType::S32);
    let mut sizes = cache.shape().to_vec();
    sizes[0] = 1;
    cache.dynamic_slice(&[layer, &zero, &zero, &zero, &zero], &sizes).reshape(&cache.shape()[1..])
}
