//! Elementwise operations: unary math, binary arithmetic with numpy-style broadcasting and
//! scalar operands (a scalar takes the tensor's dtype, like JAX's weakly typed Python scalars),
//! comparisons, `where_`, `astype`, and the operator overloads (`&a + &b`, `x * 2.0`, `1.0 - x`).

use super::trace::{apply1, op_error, usage_error, Tensor, Trace};
use crate::ir::{BinaryOp, Comparison, DType, Prim, Shape, UnaryOp};
use std::ops::{Add, Div, Mul, Neg, Sub};

/// The right-hand side of a binary operation: a tensor or a scalar.
pub enum Operand {
    Tensor(Tensor),
    Scalar(f64),
}

pub trait IntoOperand {
    fn into_operand(self) -> Operand;
}

impl IntoOperand for Tensor {
    fn into_operand(self) -> Operand {
        Operand::Tensor(self)
    }
}

impl IntoOperand for &Tensor {
    fn into_operand(self) -> Operand {
        Operand::Tensor(self.clone())
    }
}

impl IntoOperand for f64 {
    fn into_operand(self) -> Operand {
        Operand::Scalar(self)
    }
}

impl IntoOperand for f32 {
    fn into_operand(self) -> Operand {
        Operand::Scalar(self as f64)
    }
}

impl IntoOperand for i32 {
    fn into_operand(self) -> Operand {
        Operand::Scalar(self as f64)
    }
}

impl Operand {
    /// The operand as a tensor next to `like` (a scalar becomes a constant of its type).
    #[track_caller]
    fn resolve(self, like: &Tensor) -> Tensor {
        match self {
            Operand::Tensor(t) => t,
            Operand::Scalar(v) => like.full_like(v),
        }
    }
}

/// Numpy broadcasting of two shapes, or `None` if they are incompatible.
pub fn broadcast_shapes(a: &[i64], b: &[i64]) -> Option<Vec<i64>> {
    let rank = a.len().max(b.len());
    let dim = |s: &[i64], i: usize| if i + s.len() >= rank { s[i + s.len() - rank] } else { 1 };
    (0..rank)
        .map(|i| match (dim(a, i), dim(b, i)) {
            (x, y) if x == y => Some(x),
            (1, y) => Some(y),
            (x, 1) => Some(x),
            _ => None,
        })
        .collect()
}

/// Broadcasts operands to their common shape; `op` names the caller in the error.
///
/// The broadcasts are bound where the operation itself lands (the innermost trace of all
/// operands), not in each operand's own trace: a small tensor from outside a `scan` or
/// `checkpoint` body, combined with a body tensor, is captured small and broadcast inside. Bound
/// outside, the broadcast would be hoisted out of the body and materialized at full size as a
/// loop operand or a remat input (XLA's own loop-invariant code motion does not hoist
/// size-inflating broadcasts for the same reason).
#[track_caller]
fn broadcast_all(op: &str, ts: &[&Tensor]) -> Vec<Tensor> {
    let mut shape = ts[0].shape().to_vec();
    for t in &ts[1..] {
        match broadcast_shapes(&shape, t.shape()) {
            Some(s) => shape = s,
            None => op_error(op, "shapes do not broadcast", &ts.iter().map(|t| t.ty()).collect::<Vec<_>>()),
        }
    }
    let at = Trace::innermost(ts.iter().copied());
    let mut out = Vec::with_capacity(ts.len());
    for t in ts {
        if t.shape() == shape.as_slice() {
            out.push((*t).clone());
            continue;
        }
        let offset = shape.len() - t.rank();
        let dims = (offset..shape.len()).collect();
        out.push(at.bind1(Prim::BroadcastInDim { shape: Shape::new(&shape), dims }, &[t]));
    }
    out
}

#[track_caller]
pub(crate) fn binary(op: BinaryOp, a: &Tensor, b: impl IntoOperand) -> Tensor {
    let b = b.into_operand().resolve(a);
    if a.dtype() != b.dtype() {
        op_error(op.name(), "element types differ (convert one with astype)", &[a.ty(), b.ty()]);
    }
    let both = broadcast_all(op.name(), &[a, &b]);
    apply1(Prim::Binary(op), &[&both[0], &both[1]])
}

#[track_caller]
fn compare(dir: Comparison, a: &Tensor, b: impl IntoOperand) -> Tensor {
    let b = b.into_operand().resolve(a);
    if a.dtype() != b.dtype() {
        op_error("compare", "element types differ", &[a.ty(), b.ty()]);
    }
    let both = broadcast_all("compare", &[a, &b]);
    apply1(Prim::Compare(dir), &[&both[0], &both[1]])
}

#[track_caller]
fn unary(op: UnaryOp, x: &Tensor) -> Tensor {
    apply1(Prim::Unary(op), &[x])
}

/// `cond ? a : b` elementwise, broadcasting all three; at most one of `a`, `b` may be a scalar.
#[track_caller]
pub fn where_(cond: &Tensor, a: impl IntoOperand, b: impl IntoOperand) -> Tensor {
    let (a, b) = match (a.into_operand(), b.into_operand()) {
        (Operand::Tensor(a), b) => {
            let b = b.resolve(&a);
            (a, b)
        }
        (a @ Operand::Scalar(_), Operand::Tensor(b)) => (a.resolve(&b), b),
        (Operand::Scalar(_), Operand::Scalar(_)) => usage_error("where_ needs at least one tensor branch"),
    };
    if a.dtype() != b.dtype() {
        op_error("select", "branch element types differ", &[cond.ty(), a.ty(), b.ty()]);
    }
    let all = broadcast_all("select", &[cond, &a, &b]);
    apply1(Prim::Select, &[&all[0], &all[1], &all[2]])
}

impl Tensor {
    #[track_caller]
    pub fn exp(&self) -> Tensor {
        unary(UnaryOp::Exp, self)
    }
    #[track_caller]
    pub fn log(&self) -> Tensor {
        unary(UnaryOp::Log, self)
    }
    #[track_caller]
    pub fn log1p(&self) -> Tensor {
        unary(UnaryOp::Log1p, self)
    }
    #[track_caller]
    pub fn tanh(&self) -> Tensor {
        unary(UnaryOp::Tanh, self)
    }
    /// The logistic sigmoid.
    #[track_caller]
    pub fn sigmoid(&self) -> Tensor {
        unary(UnaryOp::Logistic, self)
    }
    #[track_caller]
    pub fn sqrt(&self) -> Tensor {
        unary(UnaryOp::Sqrt, self)
    }
    #[track_caller]
    pub fn rsqrt(&self) -> Tensor {
        unary(UnaryOp::Rsqrt, self)
    }
    #[track_caller]
    pub fn abs(&self) -> Tensor {
        unary(UnaryOp::Abs, self)
    }
    #[track_caller]
    pub fn sign(&self) -> Tensor {
        unary(UnaryOp::Sign, self)
    }
    #[track_caller]
    pub fn erf(&self) -> Tensor {
        unary(UnaryOp::Erf, self)
    }
    #[track_caller]
    pub fn erf_inv(&self) -> Tensor {
        unary(UnaryOp::ErfInv, self)
    }
    #[track_caller]
    pub fn sin(&self) -> Tensor {
        unary(UnaryOp::Sin, self)
    }
    #[track_caller]
    pub fn cos(&self) -> Tensor {
        unary(UnaryOp::Cos, self)
    }
    #[track_caller]
    pub fn square(&self) -> Tensor {
        self * self
    }
    #[track_caller]
    pub fn pow(&self, exponent: impl IntoOperand) -> Tensor {
        binary(BinaryOp::Pow, self, exponent)
    }
    #[track_caller]
    pub fn maximum(&self, other: impl IntoOperand) -> Tensor {
        binary(BinaryOp::Max, self, other)
    }
    #[track_caller]
    pub fn minimum(&self, other: impl IntoOperand) -> Tensor {
        binary(BinaryOp::Min, self, other)
    }
    #[track_caller]
    pub fn clamp(&self, lo: impl IntoOperand, hi: impl IntoOperand) -> Tensor {
        self.maximum(lo).minimum(hi)
    }
    #[track_caller]
    pub fn bitwise_and(&self, other: impl IntoOperand) -> Tensor {
        binary(BinaryOp::And, self, other)
    }
    #[track_caller]
    pub fn bitwise_or(&self, other: impl IntoOperand) -> Tensor {
        binary(BinaryOp::Or, self, other)
    }
    #[track_caller]
    pub fn bitwise_xor(&self, other: impl IntoOperand) -> Tensor {
        binary(BinaryOp::Xor, self, other)
    }
    #[track_caller]
    pub fn shift_left(&self, bits: impl IntoOperand) -> Tensor {
        binary(BinaryOp::ShiftLeft, self, bits)
    }
    #[track_caller]
    pub fn shift_right_logical(&self, bits: impl IntoOperand) -> Tensor {
        binary(BinaryOp::ShiftRightLogical, self, bits)
    }

    #[track_caller]
    pub fn eq(&self, other: impl IntoOperand) -> Tensor {
        compare(Comparison::Eq, self, other)
    }
    #[track_caller]
    pub fn ne(&self, other: impl IntoOperand) -> Tensor {
        compare(Comparison::Ne, self, other)
    }
    #[track_caller]
    pub fn lt(&self, other: impl IntoOperand) -> Tensor {
        compare(Comparison::Lt, self, other)
    }
    #[track_caller]
    pub fn le(&self, other: impl IntoOperand) -> Tensor {
        compare(Comparison::Le, self, other)
    }
    #[track_caller]
    pub fn gt(&self, other: impl IntoOperand) -> Tensor {
        compare(Comparison::Gt, self, other)
    }
    #[track_caller]
    pub fn ge(&self, other: impl IntoOperand) -> Tensor {
        compare(Comparison::Ge, self, other)
    }

    /// Converts the element type (a no-op if it already is `dtype`).
    #[track_caller]
    pub fn astype(&self, dtype: DType) -> Tensor {
        if self.dtype() == dtype {
            return self.clone();
        }
        apply1(Prim::Convert(dtype), &[self])
    }

    /// `x * sigmoid(x)`, Llama's MLP activation.
    #[track_caller]
    pub fn silu(&self) -> Tensor {
        self * &self.sigmoid()
    }

    /// The tanh approximation of GELU, `x / 2 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3)))`:
    /// `jax.nn.gelu`'s default, which MaxText's `gelu` activation is.
    #[track_caller]
    pub fn gelu(&self) -> Tensor {
        let inner = (self + &(self * self * self * 0.044_715)) * (2.0 / std::f64::consts::PI).sqrt();
        self * &((inner.tanh() + 1.0) * 0.5)
    }

    #[track_caller]
    pub fn relu(&self) -> Tensor {
        self.maximum(0.0)
    }
}

macro_rules! binary_operator {
    ($trait:ident, $method:ident, $op:expr) => {
        impl<R: IntoOperand> $trait<R> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: R) -> Tensor {
                binary($op, self, rhs)
            }
        }
        impl<R: IntoOperand> $trait<R> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: R) -> Tensor {
                binary($op, &self, rhs)
            }
        }
        impl $trait<&Tensor> for f64 {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Tensor {
                binary($op, &rhs.full_like(self), rhs)
            }
        }
        impl $trait<Tensor> for f64 {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Tensor {
                binary($op, &rhs.full_like(self), &rhs)
            }
        }
    };
}

binary_operator!(Add, add, BinaryOp::Add);
binary_operator!(Sub, sub, BinaryOp::Sub);
binary_operator!(Mul, mul, BinaryOp::Mul);
binary_operator!(Div, div, BinaryOp::Div);

impl Neg for &Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        unary(UnaryOp::Neg, self)
    }
}

impl Neg for Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        unary(UnaryOp::Neg, &self)
    }
}
