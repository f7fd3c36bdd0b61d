//! The closed set of primitives. Every transformation matches this enum exhaustively (no `_ =>`
//! arms): the shape rule (`shape_rules`), the VJP rule (`autodiff::rules`) and the StableHLO
//! lowering (`lower::ops`). Adding a variant without its three rules does not compile.
//!
//! Operands are strict: binary ops need identical types; the `Tensor` API does numpy-style
//! broadcasting and scalar promotion before binding, so the IR never broadcasts implicitly.

use super::{DType, Graph, Shape, Type};
use crate::sharding::PartitionSpec;
use std::sync::Arc;

#[derive(Clone, Debug, PartialEq)]
pub enum Prim {
    Unary(UnaryOp),
    Binary(BinaryOp),
    Compare(Comparison),
    /// `select(pred, on_true, on_false)`, all three of one shape.
    Select,
    Convert(DType),
    Iota {
        ty: Type,
        axis: usize,
    },
    Constant {
        ty: Type,
        value: Literal,
    },
    /// `dot_general`; `preferred` is JAX's `preferred_element_type`: the result's element type
    /// when it is not the operands' (a float no narrower than them, which the products
    /// accumulate into). With one, the operands may be the two 8-bit formats: an fp8 product
    /// multiplies e4m3 values, and e5m2 gradients by e4m3 values, into bf16 or f32.
    DotGeneral {
        dims: DotDims,
        preferred: Option<DType>,
    },
    Reduce {
        op: ReduceOp,
        axes: Vec<usize>,
    },
    Reshape(Shape),
    Transpose(Vec<usize>),
    /// Operand dim `i` becomes output dim `dims[i]`; size-1 operand dims may stretch.
    BroadcastInDim {
        shape: Shape,
        dims: Vec<usize>,
    },
    Slice {
        start: Vec<i64>,
        limit: Vec<i64>,
        strides: Vec<i64>,
    },
    /// Operands: the array, then one s32 scalar start index per dimension.
    DynamicSlice {
        sizes: Vec<i64>,
    },
    /// Operands: the array, the update, then one s32 scalar start index per dimension.
    DynamicUpdateSlice,
    Concatenate {
        axis: usize,
    },
    /// `stablehlo.gather`: operands `operand`, integer `indices`; slices of `operand` at the
    /// positions `indices` give (row lookup, `take_along_axis`, ...).
    Gather(GatherDims),
    /// `stablehlo.scatter` with addition, the transpose of `Gather`: operands `operand`,
    /// integer `indices`, `updates`; `updates` added into `operand` at `indices` (repeated
    /// positions accumulate, out-of-range ones are dropped).
    ScatterAdd(ScatterDims),
    /// Stable sort of every operand along `axis` by the order of operand 0 (the keys); all
    /// operands have one shape. Floats compare in IEEE total order.
    Sort {
        axis: usize,
        descending: bool,
    },
    /// The `k` largest entries along the last axis, in decreasing order (ties: lower index
    /// first): results `values` and their s32 `indices`.
    TopK {
        k: i64,
    },
    /// Inclusive cumulative sum along `axis` (from the end with `reverse`).
    Cumsum {
        axis: usize,
        reverse: bool,
    },
    /// A grouped matrix product over consecutive row groups (XLA's ragged dot): operands `lhs`,
    /// `rhs`, and `group_sizes: s32[G]`, the sizes of consecutive groups of rows of `lhs`
    /// (rows past their sum belong to no group).
    RaggedDot(RaggedDotMode),
    /// Operands: the array and a scalar padding value. Padding amounts are non-negative.
    Pad {
        low: Vec<i64>,
        high: Vec<i64>,
        interior: Vec<i64>,
    },
    /// Identity whose cotangent is zero.
    StopGradient,
    /// Identity that tags a value for remat policies (`checkpoint_name`).
    Name(Arc<str>),
    /// Identity that pins a value's sharding on the program's mesh.
    ShardingConstraint(PartitionSpec),
    /// Identity over all operands that XLA may not look through: keeps recomputation in the
    /// backward pass from being merged with the forward pass (common-subexpression elimination).
    OptimizationBarrier,
    Scan(Scan),
    Remat(Remat),
    /// A function with its own backward pass (JAX's `custom_vjp`), e.g. blockwise attention.
    Composite(Composite),
    /// An operation XLA implements itself (`stablehlo.custom_call`), e.g. cuDNN's fused
    /// attention. It has no derivative of its own: a differentiable use wraps it in a
    /// `Composite` whose backward pass is the matching backward call.
    CustomCall(CustomCall),
    /// A body run by every device on its own shards (Shardy's `sdy.manual_computation`, JAX's
    /// `shard_map`), for operations the SPMD partitioner does not know, e.g. custom calls.
    ManualComputation(Manual),
    /// Data exchanged between the devices of one manual axis inside a manual computation's
    /// body (JAX's collectives in a `shard_map`).
    Collective(Collective),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnaryOp {
    Neg,
    Exp,
    Log,
    Log1p,
    Tanh,
    Logistic,
    Sqrt,
    Rsqrt,
    Abs,
    Sign,
    Erf,
    /// Inverse error function: the normal sampler's transform of uniform bits (as in JAX).
    ErfInv,
    Sin,
    Cos,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Max,
    Min,
    Pow,
    /// Bitwise ops exist for the threefry random-bit generator, which is traced from them.
    And,
    Or,
    Xor,
    ShiftLeft,
    ShiftRightLogical,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Comparison {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Max,
}

/// Dimension numbers of `dot_general`. Output dims: batch, then lhs free, then rhs free.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DotDims {
    pub lhs_batch: Vec<usize>,
    pub rhs_batch: Vec<usize>,
    pub lhs_contract: Vec<usize>,
    pub rhs_contract: Vec<usize>,
}

/// Dimension numbers of `gather` (StableHLO's, plus the slice sizes). The result has the
/// batch dimensions of `indices` (all but `index_vector_dim`, in order) at the positions not in
/// `offset_dims`, and the slice's dimensions not collapsed or batched at `offset_dims`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatherDims {
    pub offset_dims: Vec<usize>,
    /// Operand dims of slice size 1 that the result drops.
    pub collapsed_slice_dims: Vec<usize>,
    /// Operand dims paired with `start_indices_batching_dims`: element `i` of one reads
    /// element `i` of the other (as a batched `take_along_axis`).
    pub operand_batching_dims: Vec<usize>,
    pub start_indices_batching_dims: Vec<usize>,
    /// The operand dims that the index vector's entries index, in order.
    pub start_index_map: Vec<usize>,
    /// The dim of `indices` holding index vectors; `indices.rank` means a trailing 1.
    pub index_vector_dim: usize,
    pub slice_sizes: Vec<i64>,
}

/// Dimension numbers of `scatter` (StableHLO's): the mirror of `GatherDims`, with the update
/// window at `update_window_dims` of `updates`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScatterDims {
    pub update_window_dims: Vec<usize>,
    pub inserted_window_dims: Vec<usize>,
    pub input_batching_dims: Vec<usize>,
    pub scatter_indices_batching_dims: Vec<usize>,
    pub scatter_dims_to_operand_dims: Vec<usize>,
    pub index_vector_dim: usize,
}

/// The two forms of `RaggedDot`, the second being the first's weight gradient. Row `m` belongs
/// to group `g` when `sum(group_sizes[..g]) <= m < sum(group_sizes[..=g])`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RaggedDotMode {
    /// `lhs[M,K]` and `rhs[G,K,N]` (`[G,N,K]` when `rhs_transposed`) give `out[M,N]`, row `m`
    /// of group `g` being `lhs[m] @ rhs[g]` (`rhs[g]^T`); rows in no group are zero.
    NonContracting { rhs_transposed: bool },
    /// `lhs[M,K]` and `rhs[M,N]` give `out[G,K,N]`, `out[g] = lhs[rows of g]^T @ rhs[rows of g]`.
    Contracting,
}

/// Constant contents. Integers up to 2^53 and every f32/bf16/f16 value are exact in an f64.
#[derive(Clone, Debug, PartialEq)]
pub enum Literal {
    Splat(f64),
    Dense(Arc<[f64]>),
}

/// A structured loop over the leading axis of `xs` (JAX's `scan`).
/// Operands: `consts ++ carry ++ xs`; results: `carry ++ ys` (ys stacked on a new leading axis).
/// The body maps `consts ++ carry ++ x-slices` to `carry ++ y-slices`.
#[derive(Clone, Debug)]
pub struct Scan {
    pub body: Arc<Graph>,
    pub length: i64,
    pub num_consts: usize,
    pub num_carry: usize,
    /// Iterate from the last slice to the first (the backward pass of a forward scan).
    pub reverse: bool,
}

/// A rematerialization region: the body is inlined in the forward pass and recomputed in the
/// backward pass, except values tagged (by `Prim::Name`) with one of `saved_names`, which are kept.
#[derive(Clone, Debug)]
pub struct Remat {
    pub body: Arc<Graph>,
    pub saved_names: Arc<[Arc<str>]>,
    pub fences: RematFences,
}

/// Where the backward pass of a [`Remat`] region puts optimization barriers. Both matter only for
/// regions XLA sees side by side (unrolled layers); in a scan body each iteration stands alone,
/// and a barrier there only costs: XLA copies what passes through it out of the stacked
/// parameters, residuals and gradients instead of reading or writing them in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RematFences {
    /// JAX's `prevent_cse`: the recomputation reads the region's operands through a barrier, so
    /// that XLA cannot merge it with the forward pass.
    pub inputs: bool,
    /// The region's operand cotangents leave through one barrier, so that XLA cannot defer a
    /// layer's weight-gradient products past the layers before it (keeping every layer's
    /// operands alive at once).
    pub cotangents: bool,
    /// The recomputation's barrier (`inputs`) also holds the region's output cotangents, so the
    /// recomputation waits for them: without it XLA may schedule a recomputation that depends
    /// only on early values (a one-hot of the batch's tokens) at the start of the step, next to
    /// the forward pass, and keep its result as long as if it had been saved.
    pub wait_for_cotangents: bool,
}

/// A function given with its own backward pass, as JAX's `custom_vjp`: `forward` maps the
/// operands to the results (it is inlined where the composite is used); `backward` maps
/// `operands ++ results ++ result cotangents` to one cotangent per float operand, in operand
/// order. The backward pass reads only operands and results, so a remat policy that saves the
/// results never recomputes the forward.
#[derive(Clone, Debug)]
pub struct Composite {
    /// What it computes, for errors and reports (`blockwise_attention`).
    pub name: Arc<str>,
    pub forward: Arc<Graph>,
    pub backward: Arc<Graph>,
}

/// The fields of a `stablehlo.custom_call` that say what XLA runs. Layouts are minor-to-major
/// dimension orders (`[1, 0]` is row-major for a matrix).
#[derive(Clone, Debug, PartialEq)]
pub struct CustomCall {
    /// The call target, e.g. `__cudnn$fmhaSoftmax`.
    pub target: Arc<str>,
    /// The backend configuration string, passed to XLA as written (cuDNN's is JSON).
    pub backend_config: Arc<str>,
    /// `api_version` (2: the original API with a backend config string).
    pub api_version: i32,
    pub operand_layouts: Vec<Vec<usize>>,
    pub result_layouts: Vec<Vec<usize>>,
    /// The results the program reads.
    pub results: Vec<Type>,
    /// XLA's GPU custom calls end with a `u8[n]` scratch buffer that XLA sizes itself (`n` is
    /// written as 0) and nobody reads: lowered as an extra last result, not an IR value.
    pub workspace: bool,
}

/// A manual computation: `body` maps each operand's local shard to the result's local shards
/// on every device. Operand `i` is split over the manual axes as `in_specs[i]` says (the
/// other dimensions, and the other mesh axes, whole), the results as `out_specs` say: a
/// result's global dimension is its local one times its axes' sizes.
#[derive(Clone, Debug)]
pub struct Manual {
    pub body: Arc<Graph>,
    /// The mesh axes the body is manual over, with their sizes, in mesh order.
    pub axes: Vec<(String, usize)>,
    pub in_specs: Vec<PartitionSpec>,
    pub out_specs: Vec<PartitionSpec>,
}

/// A mesh axis that a manual computation's body is manual over, and its size: what a
/// collective in the body runs across.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManualAxis {
    pub name: String,
    pub size: usize,
}

/// The collectives of a manual body, over the devices of `axis` (those whose mesh coordinates
/// differ only along it), each as JAX's namesake with `tiled=True`. Device `k` is the one at
/// coordinate `k` of the axis.
#[derive(Clone, Debug, PartialEq)]
pub enum Collective {
    /// Every device's operand, concatenated along `dim` in device order (`all_gather`).
    AllGather { axis: ManualAxis, dim: usize },
    /// The sum of every device's operand, cut along `dim` into `size` parts: device `k` keeps
    /// part `k` (`psum_scatter`).
    ReduceScatter { axis: ManualAxis, dim: usize },
    /// Device `from` sends its operand to device `to` for each pair; a device no pair sends
    /// to gets zeros (`ppermute`).
    Permute { axis: ManualAxis, pairs: Vec<(usize, usize)> },
    /// The operand cut along `split` into `size` parts, part `k` sent to device `k`; the parts
    /// a device receives, concatenated along `concat` in device order (`all_to_all`).
    AllToAll { axis: ManualAxis, split: usize, concat: usize },
    /// The device's coordinate along the axis, an `s32` scalar (`axis_index`).
    AxisIndex { axis: ManualAxis },
}

impl Collective {
    pub fn axis(&self) -> &ManualAxis {
        match self {
            Collective::AllGather { axis, .. }
            | Collective::ReduceScatter { axis, .. }
            | Collective::Permute { axis, .. }
            | Collective::AllToAll { axis, .. }
            | Collective::AxisIndex { axis } => axis,
        }
    }

    /// The name in error messages: JAX's.
    pub fn name(&self) -> &'static str {
        match self {
            Collective::AllGather { .. } => "all_gather",
            Collective::ReduceScatter { .. } => "psum_scatter",
            Collective::Permute { .. } => "ppermute",
            Collective::AllToAll { .. } => "all_to_all",
            Collective::AxisIndex { .. } => "axis_index",
        }
    }
}

impl Manual {
    /// The number of shards dimension `d` of a value with `spec` is cut into.
    pub fn shards(&self, spec: &PartitionSpec, d: usize) -> i64 {
        spec.dim(d).iter().map(|a| self.axes.iter().find(|(n, _)| n == a).map_or(1, |(_, s)| *s as i64)).product()
    }
}

/// Sub-graphs compare by identity: two scans are the same primitive only if they share a body.
impl PartialEq for Scan {
    fn eq(&self, other: &Scan) -> bool {
        Arc::ptr_eq(&self.body, &other.body)
            && (self.length, self.num_consts, self.num_carry, self.reverse)
                == (other.length, other.num_consts, other.num_carry, other.reverse)
    }
}

impl PartialEq for Remat {
    fn eq(&self, other: &Remat) -> bool {
        Arc::ptr_eq(&self.body, &other.body) && self.saved_names == other.saved_names && self.fences == other.fences
    }
}

impl PartialEq for Composite {
    fn eq(&self, other: &Composite) -> bool {
        Arc::ptr_eq(&self.forward, &other.forward) && Arc::ptr_eq(&self.backward, &other.backward)
    }
}

impl PartialEq for Manual {
    fn eq(&self, other: &Manual) -> bool {
        Arc::ptr_eq(&self.body, &other.body)
            && (&self.axes, &self.in_specs, &self.out_specs) == (&other.axes, &other.in_specs, &other.out_specs)
    }
}

impl Prim {
    /// The name used in error messages (the StableHLO op name where there is one).
    pub fn name(&self) -> &'static str {
        match self {
            Prim::Unary(op) => op.name(),
            Prim::Binary(op) => op.name(),
            Prim::Compare(_) => "compare",
            Prim::Select => "select",
            Prim::Convert(_) => "convert",
            Prim::Iota { .. } => "iota",
            Prim::Constant { .. } => "constant",
            Prim::DotGeneral { .. } => "dot_general",
            Prim::Reduce { op: ReduceOp::Sum, .. } => "reduce_sum",
            Prim::Reduce { op: ReduceOp::Max, .. } => "reduce_max",
            Prim::Reshape(_) => "reshape",
            Prim::Transpose(_) => "transpose",
            Prim::BroadcastInDim { .. } => "broadcast_in_dim",
            Prim::Slice { .. } => "slice",
            Prim::DynamicSlice { .. } => "dynamic_slice",
            Prim::DynamicUpdateSlice => "dynamic_update_slice",
            Prim::Concatenate { .. } => "concatenate",
            Prim::Gather(_) => "gather",
            Prim::ScatterAdd(_) => "scatter_add",
            Prim::Sort { .. } => "sort",
            Prim::TopK { .. } => "top_k",
            Prim::Cumsum { .. } => "cumsum",
            Prim::RaggedDot(_) => "ragged_dot",
            Prim::Pad { .. } => "pad",
            Prim::StopGradient => "stop_gradient",
            Prim::Name(_) => "checkpoint_name",
            Prim::ShardingConstraint(_) => "sharding_constraint",
            Prim::OptimizationBarrier => "optimization_barrier",
            Prim::Scan(_) => "scan",
            Prim::Remat(_) => "checkpoint",
            Prim::Composite(_) => "composite",
            Prim::CustomCall(_) => "custom_call",
            Prim::ManualComputation(_) => "manual_computation",
            Prim::Collective(c) => c.name(),
        }
    }
}

impl UnaryOp {
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Log1p => "log1p",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Logistic => "logistic",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Abs => "abs",
            UnaryOp::Sign => "sign",
            UnaryOp::Erf => "erf",
            UnaryOp::ErfInv => "erf_inv",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
        }
    }
}

impl BinaryOp {
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Max => "max",
            BinaryOp::Min => "min",
            BinaryOp::Pow => "pow",
            BinaryOp::And => "and",
            BinaryOp::Or => "or",
            BinaryOp::Xor => "xor",
            BinaryOp::ShiftLeft => "shift_left",
            BinaryOp::ShiftRightLogical => "shift_right_logical",
        }
    }
}
