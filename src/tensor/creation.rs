//! Tensors made from nothing but a trace: constants, fills and iotas.

use super::trace::{usage_error, Tensor, Trace};
use crate::ir::{DType, Literal, Prim, Shape, Type};

impl Trace {
    /// Every element equal to `value`.
    #[track_caller]
    pub fn full(&self, value: f64, dtype: DType, shape: &[i64]) -> Tensor {
        check_representable(value, dtype);
        self.bind1(Prim::Constant { ty: Type::new(dtype, Shape::new(shape)), value: Literal::Splat(value) }, &[])
    }

    #[track_caller]
    pub fn zeros(&self, dtype: DType, shape: &[i64]) -> Tensor {
        self.full(0.0, dtype, shape)
    }

    #[track_caller]
    pub fn scalar(&self, value: f64, dtype: DType) -> Tensor {
        self.full(value, dtype, &[])
    }

    /// A constant from row-major values.
    #[track_caller]
    pub fn constant(&self, dtype: DType, shape: &[i64], values: &[f64]) -> Tensor {
        values.iter().for_each(|&v| check_representable(v, dtype));
        self.bind1(
            Prim::Constant { ty: Type::new(dtype, Shape::new(shape)), value: Literal::Dense(values.into()) },
            &[],
        )
    }

    /// Each element is its index along `axis`.
    #[track_caller]
    pub fn iota(&self, dtype: DType, shape: &[i64], axis: usize) -> Tensor {
        self.bind1(Prim::Iota { ty: Type::new(dtype, Shape::new(shape)), axis }, &[])
    }
}

impl Tensor {
    #[track_caller]
    pub fn full_like(&self, value: f64) -> Tensor {
        self.trace().full(value, self.dtype(), self.shape())
    }

    #[track_caller]
    pub fn zeros_like(&self) -> Tensor {
        self.full_like(0.0)
    }

    #[track_caller]
    pub fn ones_like(&self) -> Tensor {
        self.full_like(1.0)
    }
}

/// Integer and boolean constants must be exact; the lowering prints them as integers.
#[track_caller]
fn check_representable(value: f64, dtype: DType) {
    let ok = match dtype {
        DType::Pred => value == 0.0 || value == 1.0,
        DType::S8 => value.fract() == 0.0 && value >= i8::MIN as f64 && value <= i8::MAX as f64,
        DType::S32 => value.fract() == 0.0 && value >= i32::MIN as f64 && value <= i32::MAX as f64,
        // Exact up to 2^53, what an f64 holds.
        DType::S64 => value.fract() == 0.0 && value.abs() <= (1u64 << 53) as f64,
        DType::U8 => value.fract() == 0.0 && value >= 0.0 && value <= u8::MAX as f64,
        DType::U32 => value.fract() == 0.0 && value >= 0.0 && value <= u32::MAX as f64,
        DType::F16 | DType::BF16 | DType::F32 | DType::F64 => true,
        // Printed as the nearest 8-bit value; e4m3fn has no infinity, which would become NaN.
        DType::F8E4M3FN => !value.is_infinite(),
        DType::F8E5M2 => true,
    };
    if !ok {
        usage_error(&format!("constant {value} is not a {dtype} value"));
    }
}
