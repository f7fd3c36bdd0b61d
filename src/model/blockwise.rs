//! Blockwise attention: the memory-efficient attention behind MaxText's `flash`,
//! `cudnn_flash_te` and `cudnn_flash_jax` kinds, written with the tensor API so it runs on every
//! backend. The algorithm is FlashAttention-2's (Dao, 2023) in XLA terms:
//!
//! - **Forward.** The queries are cut into blocks of `block` tokens. For each query block (a
//!   loop unrolled at trace time, so causal, sliding-window and chunked attention skip the key
//!   blocks no query of the block can see), a `scan` over the visible key/value blocks keeps a running
//!   maximum `m`, normalizer `l` and unnormalized output `acc` per query (the online softmax):
//!   `m' = max(m, rowmax(s))`, `p = exp(s - m')`, `l' = l e^(m - m') + rowsum(p)`,
//!   `acc' = acc e^(m - m') + p v`. The output is `acc / l`; the log-sum-exp `m + log l` is kept
//!   for the backward pass. Memory per query block: its scores against one key block.
//! - **Backward** (a `composite`, so autodiff does not keep per-block residuals): per query
//!   block, the scan over the same key blocks recomputes `p = exp(s - lse)`, accumulates `dq`
//!   in its carry and adds each key block's contributions in place into the full `dk`, `dv`
//!   (carried from one query block's scan to the next): `dv += pᵀ do`, `ds = p (do vᵀ - δ)`
//!   with `δ = rowsum(do ∘ o)`, `dq += ds k`, `dk += dsᵀ q`.
//!
//! Memory: a scan reads its key blocks by index (`dynamic_slice` inside the body), so no pass
//! materializes per-query-block copies of the keys and values, and per-query statistics are
//! broadcast over keys inside the body (`tensor`'s implicit broadcasts bind there), so no
//! `[.., block, block]` array is a loop operand.
//!
//! - **Sinks** (MaxText's `attention_sink`): a per-head logit `z` joins each query's softmax
//!   denominator with no value. After the scan it joins as one more score (`m' = max(m, z)`,
//!   `l' = l e^(m - m') + e^(z - m')`, `acc' = acc e^(m - m')`), so the output is `acc' / l'` and
//!   the log-sum-exp covers the sink; the backward pass is unchanged for `q`, `k`, `v`
//!   (`p = exp(s - lse)` with that log-sum-exp), and the sink's gradient is
//!   `-sum over queries of e^(z - lse) δ`: its softmax probability times its score's cotangent,
//!   `0 - δ` (no value; the log-sum-exp's own cotangent is in `δ`).
//!
//! Matmul operands stay in the input dtype (bf16 in training); scores, the softmax and every
//! accumulator are f32, as in dot-product attention. Masked scores get `MASK_VALUE` like
//! dot-product attention's, so a query whose first visible block is entirely masked carries a
//! harmless running state until the block that holds the query itself, which it always sees.

use crate::ir::DType;
use crate::tensor::{composite, concatenate, einsum, scan, where_, Tensor, Tree};

use super::mask::{Mask, Order, MASK_VALUE};

/// Whether some query of a block whose plain indices span `query` (lowest, highest) may see
/// some key of a block spanning `key`, under the causal mask and `(window, chunk)` (the spans'
/// ends bound every pair, so a false answer is exact, a true one may be too wide).
pub(super) fn may_see(
    (window, chunk): (Option<i64>, Option<i64>),
    (q_lo, q_hi): (i64, i64),
    (k_lo, k_hi): (i64, i64),
) -> bool {
    let causal = k_lo <= q_hi;
    let window = window.is_none_or(|w| k_hi > q_lo - w);
    let chunk = chunk.is_none_or(|c| k_lo / c <= q_hi / c && q_lo / c <= k_hi / c);
    causal && window && chunk
}

/// The lowest and highest of `indices` (plain sequence indices of a block).
pub(super) fn span(indices: &[i64]) -> (i64, i64) {
    let lo = *indices.iter().min().expect("a block has tokens");
    (lo, *indices.iter().max().expect("a block has tokens"))
}

/// Blockwise attention of `q: [batch, seq, heads, head_dim]` (already scaled) over `k, v:
/// [batch, seq, kv_heads, head_dim]` under `mask`, with query and key blocks of `block` tokens
/// (which must divide `seq`), with attention sinks (`[heads]`) when given. Returns the output,
/// `[batch, seq, heads, head_dim]` in `q`'s dtype, and the f32 log-sum-exp of each query's
/// scores (and sink), `[batch, heads, seq]`.
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Mask,
    block: i64,
    sinks: Option<&Tensor>,
) -> (Tensor, Tensor) {
    let seq = q.shape()[1];
    assert!(block > 0 && seq % block == 0, "blockwise attention: block {block} does not divide seq {seq}");
    let layout = Layout::new(q, k, block, mask.window, mask.chunk);
    let indices = mask.indices(q, seq);
    let visits = (0..layout.q_blocks).map(|j| layout.key_blocks(j, mask.order.as_ref())).collect();
    let segments = mask.segments.as_ref().map(|s| (s.clone(), s.clone()));
    let at = Placement { query: indices.clone(), key: indices, segments, visits };
    attention_at([q, k, v], mask, block, sinks, &at)
}

/// Where a call's queries and keys are in the sequence, when they are not all of it in order
/// (context parallelism: one device's queries against gathered or passed-on keys).
pub struct Placement {
    /// `s32[queries]`, `s32[keys]`: each query's and key's index in the plain sequence, which the
    /// causal, window and chunk masks compare.
    pub query: Tensor,
    pub key: Tensor,
    /// The queries' and the keys' documents (`s32[batch, queries]`, `s32[batch, keys]`), packed.
    pub segments: Option<(Tensor, Tensor)>,
    /// For each query block, the key blocks it visits: at least those holding a key one of its
    /// queries may see (the mask inside a block decides the rest). A query block with none
    /// gets output 0 and log-sum-exp `MASK_VALUE`.
    pub visits: Vec<Vec<i64>>,
}

/// `attention` of `q: [batch, queries, heads, head_dim]` over `k, v: [batch, keys, kv_heads,
/// head_dim]` placed as `at` says, masked by `mask`'s window and chunk (its documents and order
/// are `at`'s); `block` divides both lengths.
pub fn attention_at(
    [q, k, v]: [&Tensor; 3],
    mask: &Mask,
    block: i64,
    sinks: Option<&Tensor>,
    at: &Placement,
) -> (Tensor, Tensor) {
    let (queries, keys) = (q.shape()[1], k.shape()[1]);
    assert!(
        block > 0 && queries % block == 0 && keys % block == 0,
        "blockwise attention: block {block} does not divide {queries} queries and {keys} keys"
    );
    let layout = Layout::new(q, k, block, mask.window, mask.chunk);
    // The composite's inputs: q, k, v, then the sinks (in the accumulation dtype) when given,
    // the queries' and keys' indices, and their documents when given; its cotangents are those
    // of the float ones, in order.
    let sinks = sinks.map(|z| z.astype(layout.acc));
    let mut inputs = vec![q, k, v];
    inputs.extend(sinks.as_ref());
    inputs.extend([&at.query, &at.key]);
    if let Some((sq, sk)) = &at.segments {
        inputs.extend([sq, sk]);
    }
    let with_sinks = sinks.is_some();
    let visits = &at.visits;
    let parts = |ins: &[Tensor]| {
        let (z, rest) = if with_sinks { (ins.get(3).cloned(), &ins[4..]) } else { (None, &ins[3..]) };
        let segments = (rest.len() == 4).then(|| (rest[2].clone(), rest[3].clone()));
        let placed = Placed { query: rest[0].clone(), key: rest[1].clone(), segments, visits: visits.clone() };
        (z, placed)
    };
    let results = composite(
        "blockwise_attention",
        &inputs,
        |ins| {
            let (z, placed) = parts(ins);
            let blocks = Blocks::new(&layout, [&ins[0], &ins[1], &ins[2]], placed);
            let (out, lse) = forward(&layout, &blocks, &ins[2], z.as_ref());
            vec![out, lse]
        },
        |ins, outs, cts| {
            let (z, placed) = parts(ins);
            let grads = Grads { out: &outs[0], lse: &outs[1], d_out: &cts[0], d_lse: &cts[1] };
            let blocks = Blocks::new(&layout, [&ins[0], &ins[1], &ins[2]], placed);
            let (dq, dk, dv, dz) = backward(&layout, &blocks, [&ins[0], &ins[1], &ins[2]], z.as_ref(), &grads);
            [dq, dk, dv].into_iter().chain(dz).collect()
        },
    );
    (results[0].clone(), results[1].clone())
}

/// A `Placement` inside the composite's traces.
struct Placed {
    query: Tensor,
    key: Tensor,
    segments: Option<(Tensor, Tensor)>,
    visits: Vec<Vec<i64>>,
}

/// Sinks `[heads]` as `[kv_heads, group]`, to broadcast over `[batch, kv_heads, group, queries]`.
fn sinks_by_group(l: &Layout, z: &Tensor) -> Tensor {
    z.reshape(&[l.kv_heads, l.group()])
}

/// Sizes and the key blocks each query block visits.
#[derive(Clone, Copy)]
struct Layout {
    batch: i64,
    /// Queries and keys (equal but under context parallelism).
    q_seq: i64,
    k_seq: i64,
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
    block: i64,
    q_blocks: i64,
    k_blocks: i64,
    window: Option<i64>,
    chunk: Option<i64>,
    /// Scores, softmax and accumulators: f32, or f64 for f64 inputs.
    acc: DType,
}

impl Layout {
    fn new(q: &Tensor, k: &Tensor, block: i64, window: Option<i64>, chunk: Option<i64>) -> Layout {
        let (batch, q_seq, heads, head_dim) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
        let acc = if q.dtype() == DType::F64 { DType::F64 } else { DType::F32 };
        let (k_seq, kv_heads) = (k.shape()[1], k.shape()[2]);
        let (q_blocks, k_blocks) = (q_seq / block, k_seq / block);
        Layout { batch, q_seq, k_seq, heads, kv_heads, head_dim, block, q_blocks, k_blocks, window, chunk, acc }
    }

    fn group(&self) -> i64 {
        self.heads / self.kv_heads
    }

    /// The key blocks that query block `j` may see. In order: up to the block holding its last
    /// query (causal), from the block holding the first key its first query's window or chunk
    /// reaches. Load-balanced (`order`): each block whose plain indices' range can meet the
    /// query block's under the causal, window and chunk masks (a superset is harmless: the mask
    /// inside the block decides), so a reordered sequence skips as much as the plain one.
    fn key_blocks(&self, j: i64, order: Option<&Order>) -> Vec<i64> {
        let Some(order) = order else {
            let first_query = j * self.block;
            let hi = (first_query + self.block - 1) / self.block + 1;
            let window_lo = self.window.map_or(0, |w| (first_query - w + 1).max(0));
            let chunk_lo = self.chunk.map_or(0, |c| first_query / c * c);
            let lo = window_lo.max(chunk_lo) / self.block;
            return (lo..hi).collect();
        };
        let range = |i: i64| span(&order[(i * self.block) as usize..((i + 1) * self.block) as usize]);
        let query = range(j);
        (0..self.k_blocks).filter(|&i| may_see((self.window, self.chunk), query, range(i))).collect()
    }
}

/// The views every pass uses: queries `[batch, seq, kv_heads, group, head_dim]`, keys and
/// values `[batch, seq, kv_heads, head_dim]`, documents `[batch, seq]`. A scan over key blocks
/// takes block indices and slices its block out of these inside the body (`key_block`):
/// slicing `lo..hi` beforehand would materialize one copy of the keys and values per query
/// block, which XLA may compute long before the loop that reads it.
struct Blocks {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    placed: Placed,
}

impl Blocks {
    fn new(l: &Layout, [q, k, v]: [&Tensor; 3], placed: Placed) -> Blocks {
        Blocks {
            q: q.reshape(&[l.batch, l.q_seq, l.kv_heads, l.group(), l.head_dim]),
            k: k.clone(),
            v: v.clone(),
            placed,
        }
    }

    /// The key blocks query block `j` visits, as the scanned input: their indices (none when it
    /// visits none).
    fn key_range(&self, j: i64) -> Option<Tree> {
        let visits: Vec<f64> = self.placed.visits[j as usize].iter().map(|&i| i as f64).collect();
        let indices = self.k.trace().constant(DType::S32, &[visits.len() as i64], &visits);
        (!visits.is_empty()).then(|| Tree::new().with("block", indices))
    }

    /// Key block `index` (an s32 scalar inside a scan body): keys and values `[batch, block,
    /// kv_heads, head_dim]`, positions `[block]`, documents `[batch, block]`.
    fn key_block(&self, l: &Layout, index: &Tensor) -> Tree {
        let start = index * l.block as f64;
        let zero = index.trace().scalar(0.0, DType::S32);
        let rows =
            |x: &Tensor| x.dynamic_slice(&[&zero, &start, &zero, &zero], &[l.batch, l.block, l.kv_heads, l.head_dim]);
        let positions = self.placed.key.dynamic_slice(&[&start], &[l.block]);
        let mut x = Tree::new().with("k", rows(&self.k)).with("v", rows(&self.v)).with("pos", positions);
        if let Some((_, seg)) = &self.placed.segments {
            x.insert("seg", seg.dynamic_slice(&[&zero, &start], &[l.batch, l.block]));
        }
        x
    }
}

/// One query block: its queries `[batch, block, kv_heads, group, head_dim]`, positions and
/// documents.
struct QueryBlock {
    q: Tensor,
    positions: Tensor,
    segments: Option<Tensor>,
}

impl QueryBlock {
    fn new(l: &Layout, blocks: &Blocks, j: i64) -> QueryBlock {
        let start = j * l.block;
        QueryBlock {
            q: blocks.q.slice_axis(1, start, start + l.block),
            positions: blocks.placed.query.slice_axis(0, start, start + l.block),
            segments: blocks.placed.segments.as_ref().map(|(s, _)| s.slice_axis(1, start, start + l.block)),
        }
    }

    /// Scores (in the accumulation dtype) against one key block, masked: `[batch, kv_heads, group, block, block]`, and
    /// the mask.
    fn scores(&self, l: &Layout, x: &Tree) -> (Tensor, Tensor) {
        let s = einsum("bqngd,bknd->bngqk", &[&self.q, &x["k"]]).astype(l.acc);
        let mask = Mask { window: l.window, chunk: l.chunk, segments: None, order: None };
        let segments = self.segments.as_ref().zip(x.get("seg"));
        let allowed = mask.allowed(&self.positions, &x["pos"], segments).broadcast_in_dim(s.shape(), &[0, 3, 4]);
        (where_(&allowed, &s, MASK_VALUE), allowed)
    }
}

/// `x` with a trailing axis of 1, to broadcast a per-query value over keys or features.
fn per_query(x: &Tensor) -> Tensor {
    x.expand_dims(-1)
}

fn forward(l: &Layout, blocks: &Blocks, v: &Tensor, sinks: Option<&Tensor>) -> (Tensor, Tensor) {
    let (b, n, g, bq, d) = (l.batch, l.kv_heads, l.group(), l.block, l.head_dim);
    let ctx = v.trace();
    let (mut outs, mut lses) = (Vec::new(), Vec::new());
    for j in 0..l.q_blocks {
        let query = QueryBlock::new(l, blocks, j);
        let carry = Tree::new()
            .with("m", ctx.full(MASK_VALUE, l.acc, &[b, n, g, bq]))
            .with("l", ctx.zeros(l.acc, &[b, n, g, bq]))
            .with("acc", ctx.zeros(l.acc, &[b, n, g, bq, d]));
        // A query block that visits no key block: output 0 and log-sum-exp `MASK_VALUE` (a
        // normalizer of 1 over nothing), or the sink's alone.
        let Some(visits) = blocks.key_range(j) else {
            let none = carry.clone().with("l", ctx.full(1.0, l.acc, &[b, n, g, bq]));
            let (out, lse) = finish(l, &none, sinks);
            outs.push(out);
            lses.push(lse);
            continue;
        };
        let (state, _) = scan(&carry, &visits, |c, xs| {
            let x = &blocks.key_block(l, &xs["block"]);
            let (s, _) = query.scores(l, x);
            let m = c["m"].maximum(s.max(&[-1]));
            let p = (&s - &per_query(&m)).exp();
            let correction = (&c["m"] - &m).exp();
            let pv = einsum("bngqk,bknd->bngqd", &[&p.astype(v.dtype()), &x["v"]]).astype(l.acc);
            let next = Tree::new()
                .with("l", &c["l"] * &correction + p.sum(&[-1]))
                .with("acc", &c["acc"] * &per_query(&correction) + pv)
                .with("m", m);
            (next, Tree::new())
        });
        let (out, lse) = finish(l, &state, sinks);
        outs.push(out);
        lses.push(lse);
    }
    let out = concatenate(&outs.iter().collect::<Vec<_>>(), 1).astype(blocks.q.dtype());
    let lse = concatenate(&lses.iter().collect::<Vec<_>>(), 3).reshape(&[b, l.heads, l.q_seq]);
    (out, lse)
}

/// A query block's output `[batch, block, heads, head_dim]` and log-sum-exp `[batch, kv_heads,
/// group, block]` from its scan's final `state`. The sink `z` joins as one more score: the
/// running maximum becomes `max(m, z)`, and `l` and `acc` are rescaled to it.
fn finish(l: &Layout, state: &Tree, sinks: Option<&Tensor>) -> (Tensor, Tensor) {
    let (b, n, g, bq, d) = (l.batch, l.kv_heads, l.group(), l.block, l.head_dim);
    let (m, l_sum, acc) = match sinks {
        Some(z) => {
            let z = sinks_by_group(l, z).broadcast_in_dim(&[b, n, g, bq], &[1, 2]);
            let m = state["m"].maximum(&z);
            let rescale = (&state["m"] - &m).exp();
            let l_sum = &state["l"] * &rescale + (z - &m).exp();
            (m, l_sum, &state["acc"] * &per_query(&rescale))
        }
        None => (state["m"].clone(), state["l"].clone(), state["acc"].clone()),
    };
    let out = acc / per_query(&l_sum);
    (out.transpose(&[0, 3, 1, 2, 4]).reshape(&[b, bq, l.heads, d]), m + l_sum.log())
}

/// The forward results and their cotangents.
struct Grads<'a> {
    out: &'a Tensor,
    lse: &'a Tensor,
    d_out: &'a Tensor,
    d_lse: &'a Tensor,
}

fn backward(
    l: &Layout,
    blocks: &Blocks,
    [q, k, v]: [&Tensor; 3],
    sinks: Option<&Tensor>,
    grads: &Grads,
) -> (Tensor, Tensor, Tensor, Option<Tensor>) {
    let (b, n, g, bq, d) = (l.batch, l.kv_heads, l.group(), l.block, l.head_dim);
    let by_query = |x: &Tensor| x.reshape(&[b, l.q_seq, n, g, d]);
    let d_out = by_query(grads.d_out);
    // δ = rowsum(do ∘ o), less the log-sum-exp's own cotangent (d lse / d s = p).
    let delta = (d_out.astype(l.acc) * by_query(grads.out).astype(l.acc)).sum(&[-1]).transpose(&[0, 2, 3, 1])
        - grads.d_lse.reshape(&[b, n, g, l.q_seq]);
    let lse = grads.lse.reshape(&[b, n, g, l.q_seq]);
    // The sinks' gradient: `-sum over batch and queries of e^(z - lse) δ`.
    let dz = sinks.map(|z| {
        let z = sinks_by_group(l, z).broadcast_in_dim(&[b, n, g, l.q_seq], &[1, 2]);
        -((z - &lse).exp() * &delta).sum(&[0, 3]).reshape(&[l.heads])
    });
    let ctx = q.trace();
    // `dk` and `dv` are carried through every query block's scan and updated in place, one key
    // block at a time.
    let mut dkv =
        Tree::new().with("dk", ctx.zeros(l.acc, &[b, l.k_seq, n, d])).with("dv", ctx.zeros(l.acc, &[b, l.k_seq, n, d]));
    let mut dqs = Vec::new();
    for j in 0..l.q_blocks {
        let Some(visits) = blocks.key_range(j) else {
            dqs.push(ctx.zeros(l.acc, &[b, bq, l.heads, d]));
            continue;
        };
        let query = QueryBlock::new(l, blocks, j);
        let rows = |x: &Tensor, axis: isize| x.slice_axis(axis, j * bq, (j + 1) * bq);
        let (d_out_j, lse_j, delta_j) = (rows(&d_out, 1), rows(&lse, 3), rows(&delta, 3));
        let carry = dkv.clone().with("dq", ctx.zeros(l.acc, &[b, n, g, bq, d]));
        let (state, _) = scan(&carry, &visits, |c, xs| {
            let x = &blocks.key_block(l, &xs["block"]);
            let (s, allowed) = query.scores(l, x);
            let p = where_(&allowed, (&s - &per_query(&lse_j)).exp(), 0.0);
            let dv_i = einsum("bngqk,bqngd->bknd", &[&p.astype(v.dtype()), &d_out_j]).astype(l.acc);
            let dp = einsum("bqngd,bknd->bngqk", &[&d_out_j, &x["v"]]).astype(l.acc);
            let ds = (&p * &(dp - per_query(&delta_j))).astype(q.dtype());
            let dq = &c["dq"] + &einsum("bngqk,bknd->bngqd", &[&ds, &x["k"]]).astype(l.acc);
            let dk_i = einsum("bngqk,bqngd->bknd", &[&ds, &query.q]).astype(l.acc);
            let start = &xs["block"] * bq as f64;
            let zero = start.trace().scalar(0.0, DType::S32);
            let at = [&zero, &start, &zero, &zero];
            let add = |acc: &Tensor, update: Tensor| {
                let current = acc.dynamic_slice(&at, &[b, bq, n, d]);
                acc.dynamic_update_slice(&(current + update), &at)
            };
            let next = Tree::new().with("dq", dq).with("dk", add(&c["dk"], dk_i)).with("dv", add(&c["dv"], dv_i));
            (next, Tree::new())
        });
        dkv = Tree::new().with("dk", state["dk"].clone()).with("dv", state["dv"].clone());
        dqs.push(state["dq"].transpose(&[0, 3, 1, 2, 4]).reshape(&[b, bq, l.heads, d]));
    }
    let dq = concatenate(&dqs.iter().collect::<Vec<_>>(), 1).astype(q.dtype());
    (dq, dkv["dk"].astype(k.dtype()), dkv["dv"].astype(v.dtype()), dz)
}
