//! XLA's cuDNN fused attention (`attention=cudnn_flash_jax` / `cudnn_flash_te` on CUDA), emitted
//! exactly as JAX 0.11.2's `jax._src.cudnn.fused_attention_stablehlo` emits it for MaxText's
//! `cudnn_jax_flash_attention` (`src/maxtext/layers/attention_op.py`, MaxText e591f30:
//! `dot_product_attention(q, k, v, mask_type=CAUSAL, scale=1.0, qkv_layout="BTNH")`, queries
//! already scaled):
//!
//! - the forward pass is the custom call `__cudnn$fmhaSoftmax` on `q, k, v` (`[batch, seq,
//!   heads, head_dim]`, bf16 or f16), whose results are the output in `[batch, heads, seq,
//!   head_dim]` shape with a `[3, 1, 2, 0]` layout (so the transpose back to `[batch, seq, heads,
//!   head_dim]` is free), the f32 softmax statistics `[batch, heads, seq]` (training only) and a
//!   `u8[0]` workspace XLA sizes itself;
//! - the backward pass is `__cudnn$fmhaSoftmaxBackward` on `q, k, v, stats, d_out, out`;
//! - both carry JAX's backend config (`create_dot_product_attention_backend_config`): the mask
//!   (`CAUSAL`, or `PADDING_CAUSAL` with per-row lengths as two more `s32[batch]` operands, or
//!   with packed documents in cuDNN's packed layout, [`Sequences::Packed`]), the sliding window
//!   (`sliding_window_length`: key `s` is seen from query `t` when `t - s < window`, JAX's
//!   `local_window_size=(window - 1, 0)`), the dot dimension numbers of the BTNH layout and
//!   `fmha_scale = 1.0`.
//!
//! The pair is one `composite` (JAX's `custom_vjp`): its forward returns the output and the
//! statistics, both tagged `context` by the caller, so `remat_policy=minimal_flash` keeps them
//! and the backward never recomputes attention; its backward is the backward call. With packed
//! documents the calls' statistics have a row of `seq` entries per document slot (`batch x max`
//! of them, [`Fmha::stats_type`]), of which a document uses its length: the composite keeps
//! them one entry per token (`batch x seq`, the size of an unpacked call's) and puts them back
//! in place for the backward call ([`pack_stats`]). A custom
//! call has no derivative of its own (autodiff refuses to differentiate one), so the composite
//! is the only way a gradient reaches it.
//!
//! On a mesh both calls run inside a Shardy manual computation (JAX's `shard_map`) over the
//! mesh axes that shard the batch and the heads: XLA's SPMD partitioner does not know these
//! custom calls (JAX partitions them with `custom_partitioning` callbacks, which are Python).
//! Inside, every device sees its local shapes; the backend config is written for them.

use std::fmt::Write;

use crate::ir::{CustomCall, DType, GatherDims, Prim, ScatterDims, Type};
use crate::sharding::PartitionSpec;
use crate::tensor::{composite, custom_call, manual_computation, stack, Tensor};

pub const FORWARD: &str = "__cudnn$fmhaSoftmax";
pub const BACKWARD: &str = "__cudnn$fmhaSoftmaxBackward";

/// One fused attention call's static shape and mask, in local (per-device) sizes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fmha {
    pub batch: i64,
    pub seq: i64,
    pub heads: i64,
    pub kv_heads: i64,
    pub head_dim: i64,
    pub dtype: DType,
    /// Keys within `window` tokens back (`t - s < window`), besides causality.
    pub window: Option<i64>,
    pub rows: Rows,
}

/// What a row of the batch holds, for the calls' mask and extra operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rows {
    /// One sequence (`CAUSAL`).
    Whole,
    /// One sequence of a valid length (`PADDING_CAUSAL`, two `s32[batch]` lengths).
    Lengths,
    /// Up to `max` documents (`PADDING_CAUSAL`, `max_seg_per_batch = max`): each document's
    /// length and start as cuDNN's packed layout takes them ([`packed_layout`]).
    Packed { max: i64 },
}

/// The tensors behind [`Rows`]: nothing, the `s32[batch]` valid lengths of the queries and of
/// the keys, or each token's document `s32[batch, seq]` (`inputs_segmentation`) with at most
/// `max` documents a row.
#[derive(Clone, Copy)]
pub enum Sequences<'a> {
    Whole,
    Lengths(&'a Tensor, &'a Tensor),
    Packed { segments: &'a Tensor, max: i64 },
}

/// Why cuDNN's fused attention cannot serve attention of this kind, if it cannot: JAX's
/// `check_layout` and `check_is_flash_attention` (bf16/f16 only; head dim a multiple of 8, at
/// most 256 on Hopper or later: maxrs targets Hopper, JAX allows 128 before it).
pub fn unsupported(dtype: DType, head_dim: i64) -> Option<String> {
    if !matches!(dtype, DType::BF16 | DType::F16) {
        return Some(format!("cuDNN's fused attention takes bf16 or f16, not {dtype} (dtype)"));
    }
    if head_dim % 8 != 0 || head_dim > 256 {
        return Some(format!(
            "cuDNN's fused attention needs a head_dim that is a multiple of 8, at most 256, not {head_dim}"
        ));
    }
    None
}

impl Fmha {
    /// The call for `q: [batch, seq, heads, head_dim]` and `k: [batch, seq, kv_heads, head_dim]`.
    pub fn new(q: &Tensor, k: &Tensor, window: Option<i64>, rows: Rows) -> Fmha {
        let s = q.shape();
        Fmha {
            batch: s[0],
            seq: s[1],
            heads: s[2],
            kv_heads: k.shape()[2],
            head_dim: s[3],
            dtype: q.dtype(),
            window,
            rows,
        }
    }

    fn bnth(&self, heads: i64) -> Type {
        Type::new(self.dtype, vec![self.batch, heads, self.seq, self.head_dim])
    }

    /// Documents per row as cuDNN counts them (`max_seg_per_batch`).
    fn segments_per_row(&self) -> i64 {
        match self.rows {
            Rows::Packed { max } => max,
            Rows::Whole | Rows::Lengths => 1,
        }
    }

    /// The f32 softmax statistics, `[batch x documents a row, heads, seq]`.
    fn stats_type(&self) -> Type {
        Type::new(DType::F32, vec![self.batch * self.segments_per_row(), self.heads, self.seq])
    }

    /// The layouts of the operands after `q, k, v` (and, backward, the statistics and outputs).
    fn sequence_layouts(&self) -> Vec<Vec<usize>> {
        match self.rows {
            Rows::Whole => vec![],
            Rows::Lengths => vec![vec![0]; 2],
            Rows::Packed { .. } => vec![vec![1, 0]; 4],
        }
    }

    /// The forward call: results `out: [batch, heads, seq, head_dim]` and, when `training`, the
    /// f32 statistics `[batch x documents a row, heads, seq]`.
    pub fn forward_call(&self, training: bool) -> CustomCall {
        let mut operand_layouts = vec![vec![3, 2, 1, 0]; 3];
        operand_layouts.extend(self.sequence_layouts());
        let (mut results, mut result_layouts) = (vec![self.bnth(self.heads)], vec![vec![3, 1, 2, 0]]);
        if training {
            results.push(self.stats_type());
            result_layouts.push(vec![2, 1, 0]);
        }
        CustomCall {
            target: FORWARD.into(),
            backend_config: self.backend_config(false).into(),
            api_version: 2,
            operand_layouts,
            result_layouts,
            results,
            workspace: true,
        }
    }

    /// The backward call on `q, k, v, stats, d_out, out` (and the lengths): results `dq, dk,
    /// dv` in `[batch, heads, seq, head_dim]` shape with the output's layout.
    pub fn backward_call(&self) -> CustomCall {
        let mut operand_layouts = vec![vec![3, 2, 1, 0], vec![3, 2, 1, 0], vec![3, 2, 1, 0], vec![2, 1, 0]];
        operand_layouts.extend([vec![3, 2, 1, 0], vec![3, 2, 1, 0]]);
        operand_layouts.extend(self.sequence_layouts());
        CustomCall {
            target: BACKWARD.into(),
            backend_config: self.backend_config(true).into(),
            api_version: 2,
            operand_layouts,
            result_layouts: vec![vec![3, 1, 2, 0]; 3],
            results: vec![self.bnth(self.heads), self.bnth(self.kv_heads), self.bnth(self.kv_heads)],
            workspace: true,
        }
    }

    /// JAX's backend config as `json.dumps` writes it (same keys, order and separators).
    pub fn backend_config(&self, backward: bool) -> String {
        let dtype = match self.dtype {
            DType::F16 => "F16",
            _ => "BF16",
        };
        let mask = if self.rows == Rows::Whole { "CAUSAL" } else { "PADDING_CAUSAL" };
        let mut s = String::from("{\"operation_queue_id\": \"0\", \"cudnn_fmha_backend_config\": {");
        s.push_str("\"algorithm\": {\"algo_id\": \"0\", \"math_type\": \"TENSOR_OP_MATH\", \"tuning_knobs\": {\"17\": \"1\", \"24\": \"0\"}, \"is_cudnn_frontend\": true, \"workspace_size\": \"0\"}, ");
        s.push_str("\"fmha_scale\": 1.0, ");
        let _ = write!(
            s,
            "\"intermediate_tensor_shape\": {{\"element_type\": \"{dtype}\", \"dimensions\": [\"{}\", \"{}\", \"{}\", \"{}\"], ",
            self.batch, self.heads, self.seq, self.seq
        );
        s.push_str("\"tuple_shapes\": [], \"layout\": {\"dim_level_types\": [], \"dim_unique\": [], \"dim_ordered\": [], \"minor_to_major\": [\"3\", \"2\", \"1\", \"0\"], \"tiles\": [], \"element_size_in_bits\": \"0\", \"memory_space\": \"0\", \"index_primitive_type\": \"PRIMITIVE_TYPE_INVALID\", \"pointer_primitive_type\": \"PRIMITIVE_TYPE_INVALID\", \"dynamic_shape_metadata_prefix_bytes\": \"0\"}, \"is_dynamic_dimension\": [false, false, false, false]}, ");
        let _ = write!(s, "\"is_flash_attention\": true, \"mask_type\": \"{mask}\", ");
        // BTNH: ((lhs contracting, rhs contracting), (lhs batch, rhs batch)) per matmul.
        let dims: &[DotNumbers] = if backward {
            &[
                ("bmm1_grad_gemm1", (2, 1), [0, 1], [0, 2]),
                ("bmm1_grad_gemm2", (3, 1), [0, 1], [0, 2]),
                ("bmm2_grad_gemm1", (2, 1), [0, 1], [0, 2]),
                ("bmm2_grad_gemm2", (3, 3), [0, 2], [0, 2]),
            ]
        } else {
            &[("bmm1", (3, 3), [0, 2], [0, 2]), ("bmm2", (3, 1), [0, 1], [0, 2])]
        };
        for (name, (lc, rc), lb, rb) in dims {
            let _ = write!(
                s,
                "\"{name}_dot_dimension_numbers\": {{\"lhs_contracting_dimensions\": [\"{lc}\"], \"rhs_contracting_dimensions\": [\"{rc}\"], \"lhs_batch_dimensions\": [\"{}\", \"{}\"], \"rhs_batch_dimensions\": [\"{}\", \"{}\"]}}, ",
                lb[0], lb[1], rb[0], rb[1]
            );
        }
        let _ = write!(
            s,
            "\"dropout_rate\": 0.0, \"seed\": 42, \"sliding_window_length\": {}, \"max_seg_per_batch\": {}, \"is_paged_attention\": false}}}}",
            self.window.unwrap_or(0),
            self.segments_per_row()
        );
        s
    }
}

/// One matmul's dimension numbers in the backend config: its name, the lhs and rhs contracting
/// dimensions, the lhs and rhs batch dimensions.
type DotNumbers = (&'static str, (usize, usize), [usize; 2], [usize; 2]);

/// `[batch, heads, seq, d]` back to `[batch, seq, heads, d]` (free: the calls' result layout).
fn btnh(x: &Tensor) -> Tensor {
    x.transpose(&[0, 2, 1, 3])
}

/// The operands that describe packed documents to cuDNN, computed from each token's document
/// `segments: s32[batch, seq]` (at most `max` documents a row), in the form JAX 0.11.2's
/// `_fix_seqlen_offsets` gives the call (`jax/_src/cudnn/fused_attention_stablehlo.py`):
///
/// - `q_seqlen`, `kv_seqlen: s32[batch, max]`: the lengths of all the batch's documents, row
///   after row, then zeros;
/// - `q_offsets`, `kv_offsets: s32[batch, max + 1]`: where each of them starts in the whole
///   `[batch, seq, heads, head_dim]` array, in elements (token `b * seq + t` times the heads
///   times `head_dim`), then the batch's end.
///
/// A document starts where a row starts and where the segment id changes to a non-zero one: a
/// row's padding (segment 0, at its end) belongs to its last document. Its queries then see that
/// document, where blockwise attention lets them see only padding; either way padded tokens
/// never reach the loss (their targets are masked), so the loss and every gradient are the
/// same, and every token is in some document (cuDNN leaves the output of a token outside every
/// document undefined).
pub fn packed_layout(segments: &Tensor, max: i64, heads: i64, kv_heads: i64, head_dim: i64) -> [Tensor; 4] {
    let b = segments.shape()[0];
    let documents = Documents::of(segments, max);
    let lengths = documents.lengths.reshape(&[b, max]);
    let starts = documents.starts.reshape(&[b, max + 1]);
    [lengths.clone(), lengths, &starts * (heads * head_dim) as i32, &starts * (kv_heads * head_dim) as i32]
}

/// Where the packed documents of `segments: s32[batch, seq]` (at most `max` a row) lie, numbered
/// through the whole batch: each token's document (`s32[batch x seq]`), and for each of the
/// `batch x max` document slots its length and the tokens before it (`batch x (max + 1)` of
/// those: the batch's end past the last document).
struct Documents {
    token: Tensor,
    lengths: Tensor,
    starts: Tensor,
}

impl Documents {
    fn of(segments: &Tensor, max: i64) -> Documents {
        let (b, t) = (segments.shape()[0], segments.shape()[1]);
        let ctx = segments.trace();
        let previous = segments.slice_axis(1, 0, t - 1).pad(0i32, &[0, 1], &[0, 0], &[0, 0]);
        let row_start = ctx.iota(DType::S32, &[b, t], 1).eq(0i32);
        let starts = row_start.bitwise_or(segments.ne(&previous).bitwise_and(segments.ne(0i32)));
        let token = starts.astype(DType::S32).reshape(&[b * t]).cumsum(0) - 1i32;
        let count = |slots: i64, per_slot: fn(&Tensor, &Tensor) -> Tensor| {
            let slot = ctx.iota(DType::S32, &[b * t, slots], 1);
            per_slot(&token.broadcast_in_dim(&[b * t, slots], &[0]), &slot).astype(DType::S32).sum(&[0])
        };
        // Slot j: the tokens of document j (0 past the last document) and the tokens before it.
        let lengths = count(b * max, |doc, j| doc.eq(j));
        let starts = count(b * (max + 1), |doc, j| doc.lt(j));
        Documents { token, lengths, starts }
    }

    /// Each token's entry in the calls' statistics: `s32[batch, seq, 2]`, its document (their
    /// first axis) and its place in the document (their last).
    fn stats_index(segments: &Tensor, max: i64) -> Tensor {
        let (b, t) = (segments.shape()[0], segments.shape()[1]);
        let documents = Documents::of(segments, max);
        let first = documents.starts.take(&documents.token);
        let place = segments.trace().iota(DType::S32, &[b * t], 0) - first;
        stack(&[&documents.token, &place], 1).reshape(&[b, t, 2])
    }
}

/// The statistics of a packed call over `segments` (at most `max` documents a row), `f32[batch x
/// max, heads, seq]`, as the composite keeps them: `f32[batch, heads, seq]`, each token's where
/// the token is. In XLA's packed graph each document slot is one sequence of cuDNN's batch
/// (hence JAX's `softmax_stat_shape = (B * max_seg_per_batch, N, T)`): its queries start at its
/// offset and its statistics are a dense `[heads, seq]` block (the calls take offsets for the
/// queries and keys only) whose first `length` places it fills. The rest, which the backward
/// call does not read, is all but `1 / max` of the statistics: kept, it was 1.9 GiB a device in
/// MaxText's 2-node Llama2-7B recipe (32 documents a row, 32 layers). The CPU plugin runs no
/// cuDNN: `tools/cudnn_check`'s packed cases check the gradients through the kept statistics on
/// a GPU. The index passes a barrier with the statistics, which makes it each call's own: with
/// one index for all, XLA fuses every layer's gather into one after the last layer's call,
/// keeping every layer's whole statistics until then.
pub fn pack_stats(stats: &Tensor, segments: &Tensor, max: i64) -> Tensor {
    let index = Documents::stats_index(segments, max);
    let fenced = stats.trace().bind(Prim::OptimizationBarrier, &[stats, &index]);
    let dims = GatherDims {
        offset_dims: vec![1],
        collapsed_slice_dims: vec![0, 2],
        operand_batching_dims: vec![],
        start_indices_batching_dims: vec![],
        start_index_map: vec![0, 2],
        index_vector_dim: 2,
        slice_sizes: vec![1, stats.shape()[1], 1],
    };
    fenced[0].gather(&fenced[1], dims)
}

/// [`pack_stats`] undone for the backward call: `f32[batch x max, heads, seq]`, zero where no
/// token is.
pub fn unpack_stats(kept: &Tensor, segments: &Tensor, max: i64) -> Tensor {
    let (b, heads, t) = (kept.shape()[0], kept.shape()[1], kept.shape()[2]);
    let dims = ScatterDims {
        update_window_dims: vec![1],
        inserted_window_dims: vec![0, 2],
        input_batching_dims: vec![],
        scatter_indices_batching_dims: vec![],
        scatter_dims_to_operand_dims: vec![0, 2],
        index_vector_dim: 2,
    };
    let index = Documents::stats_index(segments, max);
    kept.trace().zeros(DType::F32, &[b * max, heads, t]).scatter_add_with(&index, kept, dims)
}

impl<'a> Sequences<'a> {
    /// A packing of at most one document a row is one sequence a row: a document's padding
    /// follows it, and what padding queries see never reaches the loss.
    fn rows(&self) -> Rows {
        match *self {
            Sequences::Whole | Sequences::Packed { max: ..=1, .. } => Rows::Whole,
            Sequences::Lengths(..) => Rows::Lengths,
            Sequences::Packed { max, .. } => Rows::Packed { max },
        }
    }

    /// The tensors behind it, which a call's extra operands are computed from.
    fn tensors(&self) -> Vec<&'a Tensor> {
        match *self {
            Sequences::Whole => vec![],
            Sequences::Lengths(lq, lk) => vec![lq, lk],
            Sequences::Packed { segments, .. } => vec![segments],
        }
    }

    /// The same kind of rows over `given`, other copies of its `tensors` (one device's shards, a
    /// composite's inputs).
    fn over<'b>(&self, given: &'b [Tensor]) -> Sequences<'b> {
        match *self {
            Sequences::Whole => Sequences::Whole,
            Sequences::Lengths(..) => Sequences::Lengths(&given[0], &given[1]),
            Sequences::Packed { max, .. } => Sequences::Packed { segments: &given[0], max },
        }
    }

    /// The extra operands of a call on `q: [batch, seq, heads, head_dim]` and `k`.
    fn operands(&self, q: &Tensor, k: &Tensor) -> Vec<Tensor> {
        match (*self, self.rows()) {
            (_, Rows::Whole) | (Sequences::Whole, _) => vec![],
            (Sequences::Lengths(lq, lk), _) => vec![lq.clone(), lk.clone()],
            (Sequences::Packed { segments, max }, _) => {
                packed_layout(segments, max, q.shape()[2], k.shape()[2], q.shape()[3]).into()
            }
        }
    }

    /// The forward call's results `[out, stats]` as the composite returns them: the statistics
    /// as it keeps them ([`pack_stats`]), the output after them. Nothing else in the forward pass
    /// waits for the packed statistics, so without the barrier XLA gathers them just before the
    /// backward call and keeps every layer's whole statistics until then.
    fn keep(&self, out: Tensor, stats: &Tensor) -> [Tensor; 2] {
        match (*self, self.rows()) {
            (Sequences::Packed { segments, max }, Rows::Packed { .. }) => {
                let kept = pack_stats(stats, segments, max);
                let fenced = stats.trace().bind(Prim::OptimizationBarrier, &[&out, &kept]);
                fenced.try_into().expect("two results")
            }
            _ => [out, stats.clone()],
        }
    }

    /// Kept statistics as the backward call reads them ([`unpack_stats`]).
    fn call_stats(&self, kept: &Tensor) -> Tensor {
        match (*self, self.rows()) {
            (Sequences::Packed { segments, max }, Rows::Packed { .. }) => unpack_stats(kept, segments, max),
            _ => kept.clone(),
        }
    }
}

/// The forward call on `q, k, v` over `sequences`: the output `[batch, seq, heads, head_dim]`
/// and, when `training`, the f32 statistics as the composite keeps them.
fn forward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    window: Option<i64>,
    sequences: Sequences,
    training: bool,
) -> Vec<Tensor> {
    let fmha = Fmha::new(q, k, window, sequences.rows());
    let extra = sequences.operands(q, k);
    let operands: Vec<&Tensor> = [q, k, v].into_iter().chain(&extra).collect();
    let out = custom_call(fmha.forward_call(training), &operands);
    if !training {
        return vec![btnh(&out[0])];
    }
    let [out, stats] = sequences.keep(out[0].clone(), &out[1]);
    vec![btnh(&out), stats]
}

/// The backward call on `[q, k, v, stats, d_out, out]` (the statistics as the composite keeps
/// them) over `sequences`: `dq, dk, dv`.
fn backward(saved: [&Tensor; 6], window: Option<i64>, sequences: Sequences) -> Vec<Tensor> {
    let fmha = Fmha::new(saved[0], saved[1], window, sequences.rows());
    let extra = sequences.operands(saved[0], saved[1]);
    let [q, k, v, kept, d_out, out] = saved;
    let stats = sequences.call_stats(kept);
    let operands: Vec<&Tensor> = [q, k, v, &stats, d_out, out].into_iter().chain(&extra).collect();
    custom_call(fmha.backward_call(), &operands).iter().map(btnh).collect()
}

/// Causal attention of `q: [batch, seq, heads, head_dim]` (already scaled) over `k, v: [batch,
/// seq, kv_heads, head_dim]` by cuDNN, within `window` tokens when given, over what `sequences`
/// says each row holds. `training` gives the differentiable form, which also returns the f32
/// statistics (one entry per token and head, [`pack_stats`]); otherwise the forward call alone
/// (inference), as JAX emits each. The forward and the backward call each compute their extra
/// operands from `sequences`' tensors, as JAX's do.
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    window: Option<i64>,
    sequences: Sequences,
    training: bool,
) -> (Tensor, Option<Tensor>) {
    if !training {
        return (forward(q, k, v, window, sequences, false).remove(0), None);
    }
    let inputs: Vec<&Tensor> = [q, k, v].into_iter().chain(sequences.tensors()).collect();
    let results = composite(
        "cudnn_fmha",
        &inputs,
        |ins| forward(&ins[0], &ins[1], &ins[2], window, sequences.over(&ins[3..]), true),
        |ins, outs, cts| {
            backward([&ins[0], &ins[1], &ins[2], &outs[1], &cts[0], &outs[0]], window, sequences.over(&ins[3..]))
        },
    );
    (results[0].clone(), Some(results[1].clone()))
}

/// `attention` on a mesh: the batch split over the mesh axes `batch_axes` and the heads over
/// `head_axes` (`split`; axes of size 1 are dropped), each device running cuDNN on its own shards
/// inside a manual computation. The forward and the backward calls each get their own manual
/// computation inside the composite, so autodiff never differentiates one. Packed documents'
/// lengths and offsets are computed inside, from the device's own rows (they index its local
/// arrays), as JAX computes them inside its partitioned primitive.
pub fn sharded_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    window: Option<i64>,
    sequences: Sequences,
    (batch_axes, head_axes): (&[String], &[String]),
    training: bool,
) -> (Tensor, Option<Tensor>) {
    let qkv = PartitionSpec::from_axes(vec![batch_axes.to_vec(), vec![], head_axes.to_vec(), vec![]]);
    let stats = PartitionSpec::from_axes(vec![batch_axes.to_vec(), head_axes.to_vec(), vec![]]);
    // The tensors behind `sequences`, split by rows like the batch.
    let given = sequences.tensors();
    let given_specs: Vec<PartitionSpec> = given
        .iter()
        .map(|t| {
            let mut axes = vec![batch_axes.to_vec()];
            axes.resize(t.shape().len(), vec![]);
            PartitionSpec::from_axes(axes)
        })
        .collect();
    let specs = |n: usize| -> Vec<PartitionSpec> { [vec![qkv.clone(); n], given_specs.clone()].concat() };
    let inputs: Vec<&Tensor> = [q, k, v].into_iter().chain(given).collect();
    if !training {
        let out = manual_computation(&inputs, &specs(3), std::slice::from_ref(&qkv), |ins| {
            forward(&ins[0], &ins[1], &ins[2], window, sequences.over(&ins[3..]), false)
        });
        return (out[0].clone(), None);
    }
    let results = composite(
        "cudnn_fmha",
        &inputs,
        |ins| {
            let outs = [qkv.clone(), stats.clone()];
            manual_computation(&ins.iter().collect::<Vec<_>>(), &specs(3), &outs, |local| {
                forward(&local[0], &local[1], &local[2], window, sequences.over(&local[3..]), true)
            })
        },
        |ins, outs, cts| {
            let mut operands = vec![&ins[0], &ins[1], &ins[2], &outs[1], &cts[0], &outs[0]];
            operands.extend(&ins[3..]);
            let in_specs =
                [vec![qkv.clone(); 3], vec![stats.clone()], vec![qkv.clone(); 2], given_specs.clone()].concat();
            manual_computation(&operands, &in_specs, &vec![qkv.clone(); 3], |local| {
                let saved = [&local[0], &local[1], &local[2], &local[3], &local[4], &local[5]];
                backward(saved, window, sequences.over(&local[6..]))
            })
        },
    );
    (results[0].clone(), Some(results[1].clone()))
}
