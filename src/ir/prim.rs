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
    DotGeneral(DotDims),
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
    /// Embedding lookup: `table[V, ...]` indexed along axis 0 by an integer array `idx[...]`,
    /// giving `[idx..., ...]`. Lowers to `stablehlo.gather`.
    Take,
    /// The transpose of `Take`: `operand[V, ...]` plus `updates[idx..., ...]` added at rows `idx`.
    ScatterAdd,
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
        Arc::ptr_eq(&self.body, &other.body) && self.saved_names == other.saved_names
    }
}

impl PartialEq for Composite {
    fn eq(&self, other: &Composite) -> bool {
        Arc::ptr_eq(&self.forward, &other.forward) && Arc::ptr_eq(&self.backward, &other.backward)
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
            Prim::DotGeneral(_) => "dot_general",
            Prim::Reduce { op: ReduceOp::Sum, .. } => "reduce_sum",
            Prim::Reduce { op: ReduceOp::Max, .. } => "reduce_max",
            Prim::Reshape(_) => "reshape",
            Prim::Transpose(_) => "transpose",
            Prim::BroadcastInDim { .. } => "broadcast_in_dim",
            Prim::Slice { .. } => "slice",
            Prim::DynamicSlice { .. } => "dynamic_slice",
            Prim::DynamicUpdateSlice => "dynamic_update_slice",
            Prim::Concatenate { .. } => "concatenate",
            Prim::Take => "take",
            Prim::ScatterAdd => "scatter_add",
            Prim::Pad { .. } => "pad",
            Prim::StopGradient => "stop_gradient",
            Prim::Name(_) => "checkpoint_name",
            Prim::ShardingConstraint(_) => "sharding_constraint",
            Prim::OptimizationBarrier => "optimization_barrier",
            Prim::Scan(_) => "scan",
            Prim::Remat(_) => "checkpoint",
            Prim::Composite(_) => "composite",
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
