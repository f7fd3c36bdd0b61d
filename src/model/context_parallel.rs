//! Context parallelism: attention over a sequence split across the `context` mesh axis, as
//! MaxText's `context_parallel_*` keys ask (`AttentionOp`, layers/attention_op.py at e591f30),
//! and the load-balancing reorder of the batch (`reorder_causal_load_balanced`,
//! utils/max_utils.py at e591f30).
//!
//! - **Reorder** (`context_parallel_load_balance`): the batch's token arrays are permuted along
//!   the sequence before the model sees them (`reorder_batch`), so that context device `i` holds
//!   an early and a late part of every row and causal attention's work is even; the loss is a sum
//!   over tokens, so it is unchanged. Attention then masks by each token's plain index
//!   (`Mask::order`).
//! - **Strategies**, each one manual computation over `context` (JAX's `shard_map`), the other
//!   mesh axes left to the partitioner; gradients are autodiff's, through the collectives'
//!   transposes:
//!   - `all_gather`: each device gathers every key and value (and document id) and attends with
//!     its own queries;
//!   - `ring`: keys and values go round the devices (`ppermute`), each step's partial attention
//!     merged into the running one by its log-sum-exp (an online softmax);
//!   - `ulysses`: an all-to-all trades the sequence split for a head split, every device attends
//!     over the whole sequence with its heads, and a second all-to-all trades back;
//!   - `usp` (Ulysses over ring): the sequence is split over `context` x `context_usp_ulysses`;
//!     an all-to-all over the Ulysses group trades its split for a head split, the ring strategy
//!     runs over `context` with the group's share of the heads, and an all-to-all trades back
//!     (MaxText's `call_usp_attention`, kernels/attention/usp_attention.py at e591f30).
//!
//!   Each body runs the model's kernel: dot-product attention, or blockwise attention (`flash`,
//!   and cuDNN's fallback: XLA's fused attention has no mask for one device's queries against
//!   every key), whose key blocks are skipped where no device's queries can see them (one
//!   program serves every device). MaxText's Ulysses needs `attention=flash`.

use crate::config::{Config, ContextParallelStrategy, Reorder};
use crate::ir::DType;
use crate::sharding::PartitionSpec;
use crate::tensor::{einsum, manual_computation, Tensor, Tree};

use super::blockwise;
use super::kernel::{attend_sinks, dot_product, masked_scores, AttendOptions, AttentionImpl};
use super::mask::{Mask, Order};

/// The mesh axis the sequence is split over (MaxText's `context_sharding`); usp's ring.
pub const AXIS: &str = "context";

/// usp's Ulysses group, the sequence's second, minor split (MaxText's `ulysses_context_sharding`).
pub const ULYSSES: &str = "context_usp_ulysses";

/// The batch arrays the reorder permutes: MaxText's `_reorder_keys` (utils/max_utils.py:955-964
/// at e591f30) that maxrs's batches have.
pub const REORDERED: &[&str] = &["inputs", "targets", "inputs_position", "inputs_segmentation", "targets_segmentation"];

/// What the context-parallelism keys ask of a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextParallel {
    pub strategy: ContextParallelStrategy,
    /// The load-balancing order (none: `context_parallel_load_balance=false`).
    pub reorder: Option<Reorder>,
}

impl ContextParallel {
    pub fn from_config(c: &Config) -> ContextParallel {
        ContextParallel { strategy: c.context_parallel_strategy, reorder: crate::config::load_balance(c) }
    }
}

/// The devices on the context axis of the mesh `t` is traced on (1 without a mesh).
pub fn shards(t: &Tensor) -> i64 {
    t.trace().mesh().and_then(|m| m.axis_size(AXIS)).unwrap_or(1) as i64
}

/// The load-balanced order of a sequence of `seq` tokens over `cp` context devices:
/// `order[i]` is the plain index of the token at `i`. Dual-chunk-swap cuts the sequence into
/// `2 cp` chunks and gives device `d` chunks `d` and `2 cp - 1 - d` (`reorder_sequence`,
/// utils/max_utils.py:859-917 at e591f30: `[0..8]` over 2 becomes `[0, 1, 6, 7, 2, 3, 4, 5]`);
/// striped gives device `d` tokens `d, d + cp, d + 2 cp, ...` (Transformer Engine's order, as
/// `reorder_causal_load_balanced`'s docstring shows it).
pub fn permutation(reorder: Reorder, seq: i64, cp: i64) -> Vec<i64> {
    match reorder {
        Reorder::DualChunkSwap => {
            let chunk = seq / (2 * cp);
            (0..cp).flat_map(|d| [d, 2 * cp - 1 - d]).flat_map(|c| c * chunk..(c + 1) * chunk).collect()
        }
        Reorder::Striped => (0..cp).flat_map(|d| (0..seq / cp).map(move |j| j * cp + d)).collect(),
    }
}

/// The inverse of `order`: where each plain token went (`reorder_sequence(to_contiguous=True)`).
pub fn inverse(order: &[i64]) -> Vec<i64> {
    let mut inverse = vec![0; order.len()];
    for (i, &plain) in order.iter().enumerate() {
        inverse[plain as usize] = i as i64;
    }
    inverse
}

/// `x: [batch, seq]` with its columns in `order` (column `i` is `x[:, order[i]]`).
pub fn permute(x: &Tensor, order: &[i64]) -> Tensor {
    let (b, t) = (x.shape()[0], x.shape()[1]);
    let values: Vec<f64> = order.iter().map(|&i| i as f64).collect();
    let indices = x.trace().constant(DType::S32, &[t], &values).broadcast_in_dim(&[b, t], &[1]);
    x.take_along_axis(&indices, 1)
}

/// `batch` as the model sees it under `cp`: when the sequence is split over more than one
/// context device with load balancing, its token arrays (`REORDERED`) permuted by the
/// load-balanced order, which is returned too; `inputs_position` is added first (`0..seq`)
/// when the batch has none, so attention and RoPE still see each token's position.
pub fn reorder_batch(cp: &ContextParallel, batch: &Tree) -> (Tree, Option<Order>) {
    let tokens = &batch["inputs"];
    let n = shards(tokens);
    let Some(reorder) = cp.reorder.filter(|_| n > 1) else { return (batch.clone(), None) };
    let (b, t) = (tokens.shape()[0], tokens.shape()[1]);
    let order = permutation(reorder, t, n);
    let mut out = batch.clone();
    if out.get("inputs_position").is_none() {
        out.insert("inputs_position", tokens.trace().iota(DType::S32, &[b, t], 1));
    }
    let out = out.map(|name, x| if REORDERED.contains(&name) { permute(x, &order) } else { x.clone() });
    (out, Some(order.into()))
}

/// Attention of `q: [batch, seq, heads, head_dim]` over `k, v: [batch, seq, kv_heads, head_dim]`
/// under `mask` by `cp`'s strategy with `how`'s kernel, when the sequence is split over more than
/// one context device; `None` otherwise. `(batch_axes, head_axes)` are the mesh axes the
/// activations' batch and heads are split over.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    cp: &ContextParallel,
    [q, k, v]: [&Tensor; 3],
    (batch_axes, head_axes): (&[String], &[String]),
    mask: &Mask,
    how: AttentionImpl,
    options: &AttendOptions,
    sinks: Option<&Tensor>,
) -> Option<Tensor> {
    let n = shards(q);
    if n <= 1 {
        return None;
    }
    let strategy = cp.strategy;
    // cuDNN's fused attention does not split the sequence: its blockwise fallback.
    let kernel = match how {
        AttentionImpl::DotProduct => None,
        AttentionImpl::Blockwise { block } | AttentionImpl::Cudnn { block } => Some(block),
    };
    let seq = q.shape()[1];
    // Each ring device's share of the sequence: under usp, its Ulysses group's after the exchange.
    let local = seq / n;
    // Blocks of the local queries (and of every device's keys): the kernel's, shrunk to divide them.
    let block = kernel.map(|b| (1..=b.min(local)).rev().find(|d| local % d == 0).unwrap_or(local));
    let order: Vec<i64> = match &mask.order {
        Some(order) => order.to_vec(),
        None => (0..seq).collect(),
    };
    let body = Body { n, local, block, order, options: *options };
    let usp = strategy == ContextParallelStrategy::Usp;
    // The sequence's split, the ring's major (`with_usp_sequence_axes`: `(ring, ulysses)`).
    let seq_axes: Vec<String> = if usp { vec![AXIS.into(), ULYSSES.into()] } else { vec![AXIS.into()] };
    // The batch's axes, and the heads' for the strategies that keep every head on its device,
    // are manual too (JAX's shard_map specs in MaxText's attention name them): a body with
    // collectives is not split further over the axes left to the partitioner, which gathered the
    // whole batch into it (llama3.1-70b at 128k on context 8 x fsdp 8: each device attended for
    // all 8 rows, ~21 GiB more at the peak).
    let mesh = q.trace().mesh().cloned().expect("context shards come from a mesh");
    let splits =
        |n: i64, axes: &[String]| n % axes.iter().map(|a| mesh.axis_size(a).unwrap_or(1) as i64).product::<i64>() == 0;
    let rows: Vec<String> = if splits(q.shape()[0], batch_axes) { batch_axes.to_vec() } else { Vec::new() };
    let keeps_heads = matches!(strategy, ContextParallelStrategy::AllGather | ContextParallelStrategy::Ring);
    let whole_heads = keeps_heads && splits(q.shape()[2], head_axes) && splits(k.shape()[2], head_axes);
    let heads: Vec<String> = if whole_heads { head_axes.to_vec() } else { Vec::new() };
    let seq_spec = |rank: usize| {
        let mut dims = vec![vec![]; rank];
        dims[0] = rows.clone();
        dims[1] = seq_axes.clone();
        if rank == 4 {
            dims[2] = heads.clone();
        }
        PartitionSpec::from_axes(dims)
    };
    // Each device's plain token indices and (Ulysses) its heads' sinks come in split over the
    // context axis: a body that computed them from its `axis_index` would not partition along
    // the other mesh axes, which stay automatic. Under usp the indices are the ring device's
    // (the same for its whole Ulysses group).
    let indices = mask.indices(q, q.shape()[1]);
    let mut inputs = vec![q, k, v, &indices];
    let mut specs = vec![seq_spec(4), seq_spec(4), seq_spec(4), PartitionSpec::new(&[&[AXIS]])];
    inputs.extend(&mask.segments);
    specs.extend(mask.segments.as_ref().map(|_| seq_spec(2)));
    inputs.extend(sinks);
    specs.extend(sinks.map(|_| match strategy {
        ContextParallelStrategy::Ulysses => PartitionSpec::new(&[&[AXIS]]),
        _ => PartitionSpec::from_axes(vec![heads.clone()]),
    }));
    let (segmented, with_sinks) = (mask.segments.is_some(), sinks.is_some());
    let out = manual_computation(&inputs, &specs, &[seq_spec(4)], |parts| {
        let (q, k, v, query) = (&parts[0], &parts[1], &parts[2], &parts[3]);
        let segments = segmented.then(|| parts[4].clone());
        let sinks = with_sinks.then(|| parts[parts.len() - 1].clone());
        let local_mask = Mask { segments, ..mask.clone() };
        let out = match strategy {
            ContextParallelStrategy::AllGather => body.all_gather([q, k, v], query, &local_mask, sinks.as_ref()),
            ContextParallelStrategy::Ring => body.ring([q, k, v], query, &local_mask, sinks.as_ref()),
            ContextParallelStrategy::Usp => body.usp([q, k, v], query, &local_mask),
            ContextParallelStrategy::Ulysses => ulysses([q, k, v], &local_mask, how, options, sinks.as_ref()),
        };
        vec![out.astype(q.dtype())]
    });
    Some(out[0].checkpoint_name("context"))
}

/// What the all-gather and ring bodies share: `n` devices of `local` tokens, blockwise attention's
/// `block` (none: dot-product attention), the sequence's order (`order[i]`: the plain index of
/// the token at `i`) and the kernel's options.
struct Body {
    n: i64,
    local: i64,
    block: Option<i64>,
    order: Vec<i64>,
    options: AttendOptions,
}

impl Body {
    /// The plain-index span of key block `i` of device `d`'s tokens.
    fn key_span(&self, d: i64, i: i64, block: i64) -> (i64, i64) {
        let at = (d * self.local + i * block) as usize;
        blockwise::span(&self.order[at..at + block as usize])
    }

    /// For each local query block, the blocks of a `keys`-long key sequence some device's
    /// queries may see, device `d` holding keys whose block `i` spans `key_span(d, i)`: one
    /// program serves every device, so a block is skipped only where every device may skip it.
    fn visits(&self, mask: &Mask, keys: i64, key_span: impl Fn(i64, i64) -> (i64, i64)) -> Vec<Vec<i64>> {
        let block = self.block.expect("blockwise");
        let within = (mask.window, mask.chunk);
        // Every span once: `[device][block]`.
        let spans = |blocks: i64, span: &dyn Fn(i64, i64) -> (i64, i64)| -> Vec<Vec<(i64, i64)>> {
            (0..self.n).map(|d| (0..blocks).map(|i| span(d, i)).collect()).collect()
        };
        let queries = spans(self.local / block, &|d, j| self.key_span(d, j, block));
        let keys = spans(keys / block, &key_span);
        (0..queries[0].len())
            .map(|j| {
                (0..keys[0].len())
                    .filter(|&i| (0..self.n as usize).any(|d| blockwise::may_see(within, queries[d][j], keys[d][i])))
                    .map(|i| i as i64)
                    .collect()
            })
            .collect()
    }

    /// The all-gather strategy in the body: every key, value, plain index and document id
    /// gathered, the local queries (`query`: their plain indices) attending over them (MaxText's
    /// all-gather path, layers/attention_op.py:2079-2101 at e591f30, all-gathers through its
    /// `shard_map`'s key/value specs; its reordered keys are put back in order there, here the
    /// mask reads their plain indices instead).
    fn all_gather(&self, [q, k, v]: [&Tensor; 3], query: &Tensor, mask: &Mask, sinks: Option<&Tensor>) -> Tensor {
        let (k, v, key) = (k.all_gather(AXIS, 1), v.all_gather(AXIS, 1), query.all_gather(AXIS, 0));
        let segments = mask.segments.as_ref().map(|s| (s.clone(), s.all_gather(AXIS, 1)));
        let (qk, kk) = self.options.product_operands(q, &k);
        let Some(block) = self.block else {
            let allowed = mask.allowed(query, &key, segments.as_ref().map(|(a, b)| (a, b)));
            return dot_product(&qk, &kk, &v, &allowed, self.options.logits_soft_cap, sinks);
        };
        let keys = self.n * self.local;
        let visits =
            self.visits(mask, keys, |_, i| blockwise::span(&self.order[(i * block) as usize..][..block as usize]));
        let at = blockwise::Placement { query: query.clone(), key, segments, visits };
        let vk = if self.options.float32_qk_product { v.astype(DType::F32) } else { v };
        blockwise::attention_at([&qk, &kk, &vk], mask, block, sinks, &at).0
    }

    /// The ring strategy in the body: `n` steps; at step `s` device `d` holds the keys, values,
    /// plain indices and document ids of device `d - s` (each step passes them on to the next
    /// device) and merges its queries' attention over them into the running output by
    /// log-sum-exp (MaxText's GPU ring is Transformer Engine's; this is its algorithm in XLA
    /// collectives). A step whose keys a query cannot see adds nothing (its weight `e^(lse_s -
    /// lse)` is 0); the query's own step always has a visible key, so the running log-sum-exp
    /// is finite from step 0.
    fn ring(&self, [q, k, v]: [&Tensor; 3], query: &Tensor, mask: &Mask, sinks: Option<&Tensor>) -> Tensor {
        let n = self.n;
        let next: Vec<(usize, usize)> = (0..n as usize).map(|d| (d, (d + 1) % n as usize)).collect();
        let (mut k, mut v, mut key, mut key_segments) = (k.clone(), v.clone(), query.clone(), mask.segments.clone());
        let mut state: Option<(Tensor, Tensor)> = None;
        for step in 0..n {
            if step > 0 {
                k = k.ppermute(AXIS, &next);
                v = v.ppermute(AXIS, &next);
                key = key.ppermute(AXIS, &next);
                key_segments = key_segments.map(|s| s.ppermute(AXIS, &next));
            }
            let segments = mask.segments.clone().zip(key_segments.clone());
            let (out, lse) = self.step([q, &k, &v], query, &key, mask, segments, step);
            state = Some(match state {
                None => (out, lse),
                Some((acc, acc_lse)) => {
                    let merged = log_add_exp(&acc_lse, &lse);
                    (acc * by_query(&(&acc_lse - &merged).exp()) + out * by_query(&(&lse - &merged).exp()), merged)
                }
            });
        }
        let (out, lse) = state.expect("at least one step");
        // A sink joins each query's softmax denominator with no value: the output shrinks by
        // `e^lse / (e^lse + e^z)` (`LayerContext::attend_sinks`).
        match sinks {
            Some(z) => {
                let z = z.astype(DType::F32).broadcast_in_dim(lse.shape(), &[1]);
                out * by_query(&(&lse - log_add_exp(&lse, &z)).exp())
            }
            None => out,
        }
    }

    /// The usp strategy in the body: queries, keys and values from `[batch, seq / (n u), heads,
    /// d]` to `[batch, seq / n, heads / u, d]` by an all-to-all over the Ulysses group of `u`
    /// devices (which holds the ring device's `seq / n` tokens in order, the ring's axis being
    /// the major one), document ids all-gathered over the group, the ring strategy over
    /// `context` with the group's share of the heads, and the output back by the inverse
    /// all-to-all (`call_usp_attention`, kernels/attention/usp_attention.py at e591f30). Sinks
    /// are refused with usp, as in MaxText (`config::context_parallel`).
    fn usp(&self, [q, k, v]: [&Tensor; 3], query: &Tensor, mask: &Mask) -> Tensor {
        let to_heads = |x: &Tensor| x.all_to_all(ULYSSES, 2, 1);
        let group = Mask { segments: mask.segments.as_ref().map(|s| s.all_gather(ULYSSES, 1)), ..mask.clone() };
        let out = self.ring([&to_heads(q), &to_heads(k), &to_heads(v)], query, &group, None);
        out.astype(q.dtype()).all_to_all(ULYSSES, 1, 2)
    }

    /// One ring step: this device's queries over the keys of device `d - step`: the f32 output
    /// `[batch, queries, heads, dv]` normalized over those keys alone, and its log-sum-exp
    /// `[batch, heads, queries]`.
    fn step(
        &self,
        [q, k, v]: [&Tensor; 3],
        query: &Tensor,
        key: &Tensor,
        mask: &Mask,
        segments: Option<(Tensor, Tensor)>,
        step: i64,
    ) -> (Tensor, Tensor) {
        let (qk, kk) = self.options.product_operands(q, k);
        let Some(block) = self.block else {
            let allowed = mask.allowed(query, key, segments.as_ref().map(|(a, b)| (a, b)));
            return partial(&qk, &kk, v, &allowed, self.options.logits_soft_cap);
        };
        let n = self.n;
        let visits = self.visits(mask, self.local, |d, i| self.key_span((d - step).rem_euclid(n), i, block));
        let at = blockwise::Placement { query: query.clone(), key: key.clone(), segments, visits };
        let vk = if self.options.float32_qk_product { v.astype(DType::F32) } else { v.clone() };
        let (out, lse) = blockwise::attention_at([&qk, &kk, &vk], mask, block, None, &at);
        (out.astype(DType::F32), lse)
    }
}

/// A per-query `[batch, heads, queries]` value laid out to scale `[batch, queries, heads, d]`.
fn by_query(x: &Tensor) -> Tensor {
    x.transpose(&[0, 2, 1]).expand_dims(-1)
}

/// `log(e^a + e^b)`, stable.
fn log_add_exp(a: &Tensor, b: &Tensor) -> Tensor {
    let m = a.maximum(b);
    &m + ((a - &m).exp() + (b - &m).exp()).log()
}

/// Softmax attention of `q: [batch, queries, heads, d]` over one ring step's `k, v` under
/// `allowed: pred[1 or batch, queries, keys]`: the f32 output `[batch, queries, heads, dv]`
/// normalized over these keys alone, and its log-sum-exp `[batch, heads, queries]`.
fn partial(q: &Tensor, k: &Tensor, v: &Tensor, allowed: &Tensor, soft_cap: Option<f64>) -> (Tensor, Tensor) {
    let (b, t, heads) = (q.shape()[0], q.shape()[1], q.shape()[2]);
    let scores = masked_scores(q, k, allowed, soft_cap);
    let lse = scores.logsumexp(-1);
    let probs = (scores - lse.expand_dims(-1)).exp().astype(v.dtype());
    let out = einsum("bngts,bsnk->btngk", &[&probs, v]).astype(DType::F32);
    (out.reshape(&[b, t, heads, v.shape()[3]]), lse.reshape(&[b, heads, t]))
}

/// The Ulysses strategy in the body: all-to-all from `[batch, seq / n, heads, d]` to
/// `[batch, seq, heads / n, d]` (queries, keys and values), the model's kernel over the whole
/// sequence with this device's heads (and their sinks), all-to-all back (MaxText's
/// `ulysses_all_to_all` and its inverse, layers/attention_op.py:2041-2065 at e591f30, whose
/// document ids are all-gathered the same way).
fn ulysses(
    [q, k, v]: [&Tensor; 3],
    mask: &Mask,
    how: AttentionImpl,
    options: &AttendOptions,
    sinks: Option<&Tensor>,
) -> Tensor {
    let to_heads = |x: &Tensor| x.all_to_all(AXIS, 2, 1);
    let (qh, kh, vh) = (to_heads(q), to_heads(k), to_heads(v));
    let whole = Mask { segments: mask.segments.as_ref().map(|s| s.all_gather(AXIS, 1)), ..mask.clone() };
    let how = match how {
        AttentionImpl::Cudnn { block } => AttentionImpl::Blockwise { block },
        other => other,
    };
    attend_sinks(&qh, &kh, &vh, &whole, how, options, sinks).all_to_all(AXIS, 1, 2)
}
