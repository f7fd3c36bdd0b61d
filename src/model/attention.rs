//! What attention is, for every family: the per-batch context the layers share (RoPE tables for
//! each token's position, the mask of which keys each query may see, the attention kernel
//! `kernel.rs` decided, fitted to the batch's sequence) and attention over grouped-query heads
//! (optionally soft-capped), computed as that kernel says: dot-product attention over the whole
//! `[seq, seq]` score matrix, blockwise attention (`super::blockwise`) with an online softmax
//! over key/value blocks, or XLA's cuDNN fused attention on CUDA (`super::cudnn`), which falls
//! back to blockwise attention for a call cuDNN cannot take (an f32 query-key product, heads or
//! batch that do not split over the mesh).
//! Families compute their own projections (or use `blocks::SelfAttention`) and call
//! `LayerContext::attend`, which is also where decoding's key/value cache is read and written:
//! no family knows whether it runs in training, in prefill or in a generate step, nor which
//! kernel computes its attention.

use std::cell::RefCell;

use crate::ir::DType;
use crate::tensor::{concatenate, Tensor, Tree};

use super::config::Rope;
use super::context_parallel::{self, ContextParallel};
pub use super::kernel::{attend, attend_sinks, attend_with, AttendOptions};
use super::kernel::{dot_product, AttentionImpl};
use super::mask::{Mask, Order};
use super::{cudnn, ModelConfig};

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
    /// At most this many documents in a packed row (`max_segments_per_seq`), for cuDNN.
    max_segments: Option<i64>,
    /// RoPE rotates interleaved pairs `(x[2i], x[2i+1])` (Llama 3.1) instead of the two halves.
    pub interleaved_rope: bool,
    /// The model's attention kernel (`ModelConfig::attention`) fitted to this batch's sequence.
    how: AttentionImpl,
    /// How attention reaches keys and values split over the context axis.
    context_parallel: ContextParallel,
    /// The batch's order when it was load-balanced (`context_parallel::reorder_batch`).
    order: Option<Order>,
    /// On a mesh: the mesh axes (of size > 1) that shard the batch, the heads and the sequence
    /// of `[batch, seq, heads, head_dim]` activations, for cuDNN's calls (`cudnn_call`).
    axes: Option<ActivationAxes>,
    /// What the family computes for its layers once per forward pass (`Family::per_layer_inputs`;
    /// set by the shared decoder): Gemma 4 small's per-layer inputs `[batch, seq, layers, width]`.
    pub per_layer_inputs: Option<Tensor>,
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
        // MaxText's timescales: `max_timescale^(2i / head_dim)` for `i < head_dim / 2`, times
        // `rope_linear_scaling_factor` for the default RoPE (`RotaryEmbedding.timescale` in
        // `layers/embeddings.py` at main e591f30); the angle of position `p` is `p / timescale`.
        let inv_timescale: Vec<f64> = (0..c.head_dim / 2)
            .map(|i| {
                let frequency = c.rope_max_timescale.powf(-2.0 * i as f64 / c.head_dim as f64);
                match c.rope {
                    Rope::Llama31 { use_scale: true } => llama31_scaled_frequency(frequency),
                    Rope::Llama31 { use_scale: false } => frequency,
                    Rope::Default => frequency / c.rope_linear_factor,
                }
            })
            .collect();
        let (cos, sin) = rope_tables(&positions, &inv_timescale);
        LayerContext {
            cos,
            sin,
            positions,
            segments: batch.get("inputs_segmentation").cloned(),
            max_segments: c.max_segments_per_seq,
            interleaved_rope: matches!(c.rope, Rope::Llama31 { .. }),
            how: c.attention.fitted(t),
            context_parallel: c.context_parallel,
            order: None,
            axes: ctx.mesh().map(|mesh| ActivationAxes::new(c, mesh)),
            per_layer_inputs: None,
            cache: None,
        }
    }

    /// The same context for a batch in `order` (`context_parallel::reorder_batch`'s).
    pub fn in_order(self, order: Option<Order>) -> LayerContext {
        LayerContext { order, ..self }
    }

    /// The same context with `cache` for one layer's attention calls (decoding).
    pub fn with_cache(&self, cache: LayerCache) -> LayerContext {
        LayerContext {
            cos: self.cos.clone(),
            sin: self.sin.clone(),
            positions: self.positions.clone(),
            segments: self.segments.clone(),
            max_segments: self.max_segments,
            interleaved_rope: self.interleaved_rope,
            how: self.how,
            context_parallel: self.context_parallel,
            order: self.order.clone(),
            axes: self.axes.clone(),
            per_layer_inputs: self.per_layer_inputs.clone(),
            cache: Some(RefCell::new(cache)),
        }
    }

    /// Whether the layer runs with a key/value cache (decoding: no backward pass).
    pub fn decoding(&self) -> bool {
        self.cache.is_some()
    }

    /// The layer's cache after its attention calls (none outside decoding).
    pub fn into_cache(self) -> Option<LayerCache> {
        self.cache.map(RefCell::into_inner)
    }

    /// Self-attention of queries `q: [batch, seq, heads, head_dim]` (already scaled) over keys
    /// and values `k, v: [batch, seq, kv_heads, head_dim]` of the same tokens, causal and within
    /// `window` tokens when given, computed by the model's kernel with `options`: the one entry point
    /// families call. Outside decoding it is `attend_with` under `mask(window)`. When decoding,
    /// the shared decoder has attached this layer's cache: prefill attends the same way and
    /// records `k`, `v`; a generate step writes `k`, `v` at the tokens' positions and attends
    /// (dot-product: one query per row) over every cached position up to each query's (and within
    /// `window`), so each query sees exactly the keys the full sequence would give it.
    pub fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor, window: Option<i64>, options: &AttendOptions) -> Tensor {
        self.attend_sinks([q, k, v], window, options, None)
    }

    /// `attend` with attention sinks when `sinks` (`[heads]`, MaxText's `attention_sink`): a learned
    /// logit per query head joins each query's softmax denominator, with no value (MaxText's
    /// `AttentionOp.compute_local_attention`, `layers/attention_op.py` at e591f30, appends it to
    /// the scores as one more column and drops that column after the softmax).
    pub fn attend_sinks(
        &self,
        [q, k, v]: [&Tensor; 3],
        window: Option<i64>,
        options: &AttendOptions,
        sinks: Option<&Tensor>,
    ) -> Tensor {
        self.attend_within([q, k, v], (window, None), options, sinks)
    }

    /// `attend` within chunks of `chunk` tokens instead of a window: a query sees the keys at or
    /// before it in its own chunk (Llama 4's chunked attention, `chunk_attn_window_size`).
    pub fn attend_chunked(&self, q: &Tensor, k: &Tensor, v: &Tensor, chunk: i64, options: &AttendOptions) -> Tensor {
        self.attend_within([q, k, v], (None, Some(chunk)), options, None)
    }

    /// `attend_sinks` within `(window, chunk)` (`Mask`'s).
    fn attend_within(
        &self,
        [q, k, v]: [&Tensor; 3],
        (window, chunk): (Option<i64>, Option<i64>),
        options: &AttendOptions,
        sinks: Option<&Tensor>,
    ) -> Tensor {
        let how = self.how;
        let Some(cache) = &self.cache else {
            return self.attend_whole([q, k, v], (window, chunk), how, options, sinks, true);
        };
        match &mut *cache.borrow_mut() {
            LayerCache::Fill { len, filled } => {
                let t = k.shape()[1];
                let pad = |x: &Tensor| x.pad(0.0, &[0, 0, 0, 0], &[0, *len - t, 0, 0], &[0, 0, 0, 0]);
                filled.push(KvCache { key: pad(k), value: pad(v) });
                self.attend_whole([q, k, v], (window, chunk), how, options, sinks, false)
            }
            LayerCache::Update { layer, caches, used } => {
                let Some(slot) = caches.get_mut(*used) else {
                    panic!("the layer makes more attention calls than the cache has ({})", caches.len())
                };
                *used += 1;
                slot.key = write_rows(&slot.key, k, layer, &self.positions);
                slot.value = write_rows(&slot.value, v, layer, &self.positions);
                let (keys, values) = (layer_of(&slot.key, layer), layer_of(&slot.value, layer));
                let (qk, kk) = options.product_operands(q, &keys);
                let allowed = self.cache_mask((window, chunk), kk.shape()[1]);
                dot_product(&qk, &kk, &values, &allowed, options.logits_soft_cap, sinks)
                    .astype(q.dtype())
                    .checkpoint_name("context")
            }
        }
    }

    /// MLA's attention with a compressed cache (MaxText's `MlaKVCache`, `mla_naive_kvcache=false`):
    /// the cache holds each token's `latent: [batch, seq, 1, a]` and `rope: [batch, seq, 1, b]`
    /// (as `key` and `value`), and `expand` turns them into keys and values. Outside decoding and
    /// in prefill, attention runs over the tokens' own expanded keys and values (prefill records
    /// the latents); a generate step writes the tokens' latents at their positions and attends
    /// over the whole cached layer, expanded, up to each query's position.
    pub fn attend_latent(
        &self,
        q: &Tensor,
        [latent, rope]: [&Tensor; 2],
        expand: impl Fn(&Tensor, &Tensor) -> (Tensor, Tensor),
    ) -> Tensor {
        let how = self.how;
        let options = AttendOptions::default();
        let Some(cache) = &self.cache else {
            let (k, v) = expand(latent, rope);
            return self.attend_whole([q, &k, &v], (None, None), how, &options, None, true);
        };
        match &mut *cache.borrow_mut() {
            LayerCache::Fill { len, filled } => {
                let t = latent.shape()[1];
                let pad = |x: &Tensor| x.pad(0.0, &[0, 0, 0, 0], &[0, *len - t, 0, 0], &[0, 0, 0, 0]);
                filled.push(KvCache { key: pad(latent), value: pad(rope) });
                let (k, v) = expand(latent, rope);
                self.attend_whole([q, &k, &v], (None, None), how, &options, None, false)
            }
            LayerCache::Update { layer, caches, used } => {
                let Some(slot) = caches.get_mut(*used) else {
                    panic!("the layer makes more attention calls than the cache has ({})", caches.len())
                };
                *used += 1;
                slot.key = write_rows(&slot.key, latent, layer, &self.positions);
                slot.value = write_rows(&slot.value, rope, layer, &self.positions);
                let (k, v) = expand(&layer_of(&slot.key, layer), &layer_of(&slot.value, layer));
                let allowed = self.cache_mask((None, None), k.shape()[1]);
                dot_product(q, &k, &v, &allowed, None, None).astype(q.dtype()).checkpoint_name("context")
            }
        }
    }

    /// Attention over the queries' own keys (training, prefill): `attend_with`, or cuDNN's
    /// calls (`training`: the differentiable pair) where `cudnn_call` allows, else blockwise;
    /// blockwise always with sinks, which cuDNN's fused attention lacks (gpt_oss, the family with
    /// sinks, refuses the cuDNN kernels as MaxText's `validate_gpu_flash_attention` does); blockwise
    /// within a chunk too, which cuDNN's fused attention has no mask for (Llama 4's chunked layers).
    #[allow(clippy::too_many_arguments)]
    fn attend_whole(
        &self,
        [q, k, v]: [&Tensor; 3],
        (window, chunk): (Option<i64>, Option<i64>),
        how: AttentionImpl,
        options: &AttendOptions,
        sinks: Option<&Tensor>,
        training: bool,
    ) -> Tensor {
        let mask = Mask { chunk, ..self.mask(window) };
        let (batch, heads) = match &self.axes {
            Some(axes) => (&axes.batch[..], &axes.heads[..]),
            None => (&[][..], &[][..]),
        };
        let cp = &self.context_parallel;
        if let Some(out) = context_parallel::attend(cp, [q, k, v], (batch, heads), &mask, how, options, sinks) {
            return out;
        }
        let AttentionImpl::Cudnn { block } = how else { return attend_sinks(q, k, v, &mask, how, options, sinks) };
        let blockwise = AttentionImpl::Blockwise { block };
        let Some(split) = self.cudnn_call(q, k, options).filter(|_| sinks.is_none() && chunk.is_none()) else {
            return attend_sinks(q, k, v, &mask, blockwise, options, sinks);
        };
        let sequences = match (&self.segments, self.max_segments) {
            (Some(segments), Some(max)) => cudnn::Sequences::Packed { segments, max },
            _ => cudnn::Sequences::Whole,
        };
        let (out, stats) = match split {
            Some((batch, heads)) => cudnn::sharded_attention(q, k, v, window, sequences, (&batch, &heads), training),
            None => cudnn::attention(q, k, v, window, sequences, training),
        };
        // Tagged as MaxText's `cudnn_jax_flash_attention` tags its output and `lse`.
        if let Some(stats) = stats {
            stats.checkpoint_name("context");
        }
        out.checkpoint_name("context")
    }

    /// Whether cuDNN's fused attention can compute this call: `None` if not (packed documents
    /// without `max_segments_per_seq`, a soft cap, an f32 product, a dtype or head dim it refuses,
    /// a sharded sequence, heads or batch that do not split evenly); otherwise the mesh axes of
    /// the batch and the heads to run it under (`None` without a mesh, or on one whose batch and
    /// head axes are all of size 1).
    #[allow(clippy::type_complexity)]
    fn cudnn_call(
        &self,
        q: &Tensor,
        k: &Tensor,
        options: &AttendOptions,
    ) -> Option<Option<(Vec<String>, Vec<String>)>> {
        let documents_known = self.segments.is_none() || self.max_segments.is_some();
        let plain = documents_known && options.logits_soft_cap.is_none() && !options.float32_qk_product;
        if !plain || cudnn::unsupported(q.dtype(), q.shape()[3]).is_some() {
            return None;
        }
        let Some(axes) = &self.axes else { return Some(None) };
        let splits = |n: i64, shards: i64| n % shards == 0;
        let ok = axes.sequence_shards == 1
            && splits(q.shape()[0], axes.batch_shards)
            && splits(q.shape()[2], axes.head_shards)
            && splits(k.shape()[2], axes.head_shards);
        // A mesh whose batch and head axes are all of size 1 (one device) needs no manual region.
        let split = !(axes.batch.is_empty() && axes.heads.is_empty());
        ok.then(|| split.then(|| (axes.batch.clone(), axes.heads.clone())))
    }

    /// `pred[batch, seq, len]`: which of `len` cache positions each token's query sees: those at
    /// or before its position, within `window` tokens and in its chunk when given.
    fn cache_mask(&self, (window, chunk): (Option<i64>, Option<i64>), len: i64) -> Tensor {
        let (b, t) = (self.positions.shape()[0], self.positions.shape()[1]);
        let query = self.positions.broadcast_in_dim(&[b, t, len], &[0, 1]);
        let key = self.positions.trace().iota(DType::S32, &[b, t, len], 2);
        let mut allowed = key.le(&query);
        if let Some(w) = window {
            allowed = allowed.bitwise_and((&query - &key).lt(w as f64));
        }
        if let Some(c) = chunk {
            allowed = allowed.bitwise_and((&query / c as f64).eq(&key / c as f64));
        }
        allowed
    }

    /// Which keys each query may see: causal, within `window` tokens when given, and in the same
    /// document when the batch is packed.
    pub fn mask(&self, window: Option<i64>) -> Mask {
        Mask { window, chunk: None, segments: self.segments.clone(), order: self.order.clone() }
    }
}

/// The mesh axes that shard `[batch, seq, heads, head_dim]` activations under the logical rules
/// (`activation_batch`, `activation_length`, `activation_heads`), only those of size > 1.
#[derive(Clone, Debug)]
struct ActivationAxes {
    batch: Vec<String>,
    heads: Vec<String>,
    batch_shards: i64,
    head_shards: i64,
    sequence_shards: i64,
}

impl ActivationAxes {
    fn new(c: &ModelConfig, mesh: &crate::sharding::Mesh) -> ActivationAxes {
        let spec = c.rules.spec(&["activation_batch", "activation_length", "activation_heads"], mesh);
        let axes = |d: usize| -> Vec<String> {
            spec.dim(d).iter().filter(|a| mesh.axis_size(a).unwrap_or(1) > 1).cloned().collect()
        };
        let shards = |axes: &[String]| axes.iter().map(|a| mesh.axis_size(a).unwrap_or(1) as i64).product();
        let (batch, sequence, heads) = (axes(0), axes(1), axes(2));
        ActivationAxes {
            batch_shards: shards(&batch),
            head_shards: shards(&heads),
            sequence_shards: shards(&sequence),
            batch,
            heads,
        }
    }
}

/// Llama 3.1's frequency scaling (Meta's `apply_scaling`; MaxText's
/// `LLaMARotaryEmbedding._apply_scaling_factor` in `src/maxtext/layers/embeddings.py`, e591f30):
/// frequencies whose wavelength is under 8192 / 4 tokens are kept, those over 8192 divided by 8,
/// and those in between interpolated smoothly.
pub fn llama31_scaled_frequency(frequency: f64) -> f64 {
    const FACTOR: f64 = 8.0;
    const LOW_FREQ_FACTOR: f64 = 1.0;
    const HIGH_FREQ_FACTOR: f64 = 4.0;
    const OLD_CONTEXT: f64 = 8192.0;
    let wavelength = 2.0 * std::f64::consts::PI / frequency;
    if wavelength < OLD_CONTEXT / HIGH_FREQ_FACTOR {
        frequency
    } else if wavelength > OLD_CONTEXT / LOW_FREQ_FACTOR {
        frequency / FACTOR
    } else {
        let smooth = (OLD_CONTEXT / wavelength - LOW_FREQ_FACTOR) / (HIGH_FREQ_FACTOR - LOW_FREQ_FACTOR);
        (1.0 - smooth) * frequency / FACTOR + smooth * frequency
    }
}

/// The RoPE tables `(cos, sin)`, `f32[batch, seq, frequencies]`, of the angles
/// `position * frequency` for `positions: s32[batch, seq]`.
pub fn rope_tables(positions: &Tensor, frequencies: &[f64]) -> (Tensor, Tensor) {
    let (b, t, half) = (positions.shape()[0], positions.shape()[1], frequencies.len() as i64);
    let angles = positions.astype(DType::F32).broadcast_in_dim(&[b, t, half], &[0, 1])
        * &positions.trace().constant(DType::F32, &[half], frequencies);
    (angles.cos(), angles.sin())
}

/// MaxText's default RoPE frequencies `1 / (max_timescale^(2i / head_dim) * linear_factor)`
/// (`RotaryEmbedding.timescale`, `src/maxtext/layers/embeddings.py`, e591f30).
pub fn default_frequencies(head_dim: i64, max_timescale: f64, linear_factor: f64) -> Vec<f64> {
    (0..head_dim / 2).map(|i| max_timescale.powf(-2.0 * i as f64 / head_dim as f64) / linear_factor).collect()
}

/// Rotary position embedding of `x: [batch, seq, heads, head_dim]`. MaxText's default is the
/// half-split convention: with `x = [x1, x2]` split in halves of the head dimension,
/// `[x1 cos - x2 sin, x2 cos + x1 sin]`; Llama 3.1's (`ctx.interleaved_rope`) rotates the pairs
/// `(x[2i], x[2i+1])` by the same angles. Computed in f32, returned in `x`'s dtype. The tables
/// are broadcast over heads by the products (inside the layer's remat region or scan body), not
/// beforehand: a broadcast table would be a full-size `[batch, seq, heads, head_dim / 2]` input
/// of every layer's region.
pub fn rope(x: &Tensor, ctx: &LayerContext) -> Tensor {
    rope_with(x, &ctx.cos, &ctx.sin, ctx.interleaved_rope)
}

/// `rope` with the tables `cos`, `sin` (`[batch, seq, head_dim / 2]`, `rope_tables`), rotating
/// interleaved pairs when `interleaved`.
pub fn rope_with(x: &Tensor, cos: &Tensor, sin: &Tensor, interleaved: bool) -> Tensor {
    rotate_f32(x, cos, sin, interleaved).astype(x.dtype())
}

/// `rope_with`, the rotated values multiplied by `scale` (YaRN's `rope_attention_scaling`) in
/// f32, before the cast back to `x`'s dtype, as MaxText's `YarnRotaryEmbedding.__call__`
/// (`src/maxtext/layers/embeddings.py` at main e591f30) scales `output` before its
/// `astype(fprop_dtype)`.
pub fn rope_scaled(x: &Tensor, cos: &Tensor, sin: &Tensor, interleaved: bool, scale: f64) -> Tensor {
    (rotate_f32(x, cos, sin, interleaved) * scale).astype(x.dtype())
}

/// The rotation of `rope_with`, in f32.
fn rotate_f32(x: &Tensor, cos: &Tensor, sin: &Tensor, interleaved: bool) -> Tensor {
    let (b, t, h, k) = (x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]);
    let xf = x.astype(DType::F32);
    if interleaved {
        let table = |v: &Tensor| v.reshape(&[b, t, 1, k / 2, 1]);
        let (cos, sin) = (table(cos), table(sin));
        let xp = xf.reshape(&[b, t, h, k / 2, 2]);
        let (x1, x2) = (xp.slice_axis(4, 0, 1), xp.slice_axis(4, 1, 2));
        concatenate(&[&(&x1 * &cos - &x2 * &sin), &(&x2 * &cos + &x1 * &sin)], 4).reshape(&[b, t, h, k])
    } else {
        let table = |v: &Tensor| v.reshape(&[b, t, 1, k / 2]);
        let (cos, sin) = (table(cos), table(sin));
        let (x1, x2) = (xf.slice_axis(3, 0, k / 2), xf.slice_axis(3, k / 2, k));
        concatenate(&[&(&x1 * &cos - &x2 * &sin), &(&x2 * &cos + &x1 * &sin)], 3)
    }
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

/// The cache tree of a layer's attention calls, in call order: `<i>.key`, `<i>.value`.
pub(super) fn cache_tree(caches: Vec<KvCache>) -> Tree {
    let mut tree = Tree::new();
    for (i, cache) in caches.into_iter().enumerate() {
        tree.insert(format!("{i}.key"), cache.key);
        tree.insert(format!("{i}.value"), cache.value);
    }
    tree
}

/// The inverse of `cache_tree`.
pub(super) fn cache_slots(tree: &Tree) -> Vec<KvCache> {
    (0..tree.len() / 2)
        .map(|i| KvCache { key: tree[&format!("{i}.key")].clone(), value: tree[&format!("{i}.value")].clone() })
        .collect()
}
