//! Spelling IR things in MLIR: SSA names, tensor types, integer lists and constant literals.

use crate::host::f8::F8;
use crate::ir::{DType, Literal, Type};
use half::{bf16, f16};
use std::fmt::{self, Display, Write};

/// An SSA value name. Numbers come from one counter per module, so names are unique across
/// nested regions too.
#[derive(Clone, Copy)]
pub(super) enum Ssa {
    /// `%12`
    Value(u32),
    /// `%12#1`: result 1 of a multi-result op.
    Result(u32, u32),
    /// `%arg3`: function argument.
    Arg(usize),
}

impl Display for Ssa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ssa::Value(n) => write!(f, "%{n}"),
            Ssa::Result(n, k) => write!(f, "%{n}#{k}"),
            Ssa::Arg(i) => write!(f, "%arg{i}"),
        }
    }
}

/// `tensor<4x8xf32>`, `tensor<f32>`.
pub(super) struct TensorType<'a>(pub &'a Type);

impl Display for TensorType<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tensor<")?;
        for d in self.0.shape.iter() {
            write!(f, "{d}x")?;
        }
        write!(f, "{}>", self.0.dtype.mlir())
    }
}

/// `[0, 2]`, or with a prefix like `array<i64: 0, 2>`.
pub(super) struct List<'a, T>(pub &'a [T]);

impl<T: Display> Display for List<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        write_joined(f, self.0)?;
        f.write_str("]")
    }
}

/// `array<i64: 0, 2>` (a dense i64 array attribute).
pub(super) struct I64Array<'a, T>(pub &'a [T]);

impl<T: Display> Display for I64Array<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("array<i64>");
        }
        f.write_str("array<i64: ")?;
        write_joined(f, self.0)?;
        f.write_str(">")
    }
}

fn write_joined<T: Display>(f: &mut fmt::Formatter<'_>, items: &[T]) -> fmt::Result {
    for (i, x) in items.iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        write!(f, "{x}")?;
    }
    Ok(())
}

/// `dense<...>` for a constant of type `ty`.
pub(super) fn dense(out: &mut String, ty: &Type, value: &Literal) {
    out.push_str("dense<");
    match value {
        Literal::Splat(v) => scalar(out, ty.dtype, *v),
        Literal::Dense(values) if ty.rank() == 0 => scalar(out, ty.dtype, values[0]),
        Literal::Dense(values) => nested(out, ty.dtype, &ty.shape, values),
    }
    out.push('>');
}

fn nested(out: &mut String, dtype: DType, shape: &[i64], values: &[f64]) {
    out.push('[');
    let inner: usize = shape[1..].iter().product::<i64>() as usize;
    for i in 0..shape[0] as usize {
        if i > 0 {
            out.push_str(", ");
        }
        if shape.len() == 1 {
            scalar(out, dtype, values[i]);
        } else {
            nested(out, dtype, &shape[1..], &values[i * inner..(i + 1) * inner]);
        }
    }
    out.push(']');
}

/// One element. Floats print in decimal when finite (as the nearest value of the element
/// type, so parsing gives it back exactly), else and for 16- and 8-bit floats as exact hex bits (also the 8-bit
/// floats).
fn scalar(out: &mut String, dtype: DType, v: f64) {
    let r = match dtype {
        DType::Pred => write!(out, "{}", v != 0.0),
        DType::S8 | DType::S32 | DType::S64 | DType::U8 | DType::U32 => write!(out, "{}", v as i64),
        DType::F16 => write!(out, "0x{:04X}", f16::from_f64(v).to_bits()),
        DType::BF16 => write!(out, "0x{:04X}", bf16::from_f64(v).to_bits()),
        DType::F8E4M3FN => write!(out, "0x{:02X}", F8::E4M3FN.encode(v)),
        DType::F8E5M2 => write!(out, "0x{:02X}", F8::E5M2.encode(v)),
        DType::F32 if (v as f32).is_finite() => decimal(out, format!("{:?}", v as f32)),
        DType::F32 => write!(out, "0x{:08X}", (v as f32).to_bits()),
        DType::F64 if v.is_finite() => decimal(out, format!("{v:?}")),
        DType::F64 => write!(out, "0x{:016X}", v.to_bits()),
    };
    r.expect("writing to a String cannot fail");
}

/// MLIR float literals need a decimal point: `1e-5` becomes `1.0e-5`.
fn decimal(out: &mut String, s: String) -> fmt::Result {
    match s.split_once('e') {
        Some((mantissa, exp)) if !mantissa.contains('.') => write!(out, "{mantissa}.0e{exp}"),
        _ => out.write_str(&s),
    }
}

/// An MLIR string literal: `"name"`, with `"`, `\` and non-printable bytes escaped as `\XX`.
pub(super) struct Quoted<'a>(pub &'a str);

impl Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"")?;
        for b in self.0.bytes() {
            if b == b'"' || b == b'\\' || !(0x20..0x7f).contains(&b) {
                write!(f, "\\{b:02X}")?;
            } else {
                f.write_char(b as char)?;
            }
        }
        f.write_str("\"")
    }
}
