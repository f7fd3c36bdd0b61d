//! Element types: one enum (`DType`) for the tracer's values, the arrays in host memory, files
//! and devices: what each is called in error messages (JAX's short names, `f32[4,8]`) and in
//! StableHLO, its size, and which ones carry gradients (only floats do: integer and boolean
//! values have no cotangent). The serialized names (checkpoint manifests, compiled-step
//! artifacts) are the variants' names.

use std::fmt;

/// The element types maxrs knows. In traced programs u32 exists for random bits, s32 for
/// indices, pred for masks, the 8-bit floats for fp8 training's quantized values (`f8` has their
/// bits); s8, s64 and u8 come from files (safetensors, data) and are converted on the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum DType {
    Pred,
    S8,
    S32,
    S64,
    U8,
    U32,
    F16,
    BF16,
    F32,
    F64,
    /// `float8_e4m3fn` (see `f8`).
    F8E4M3FN,
    /// `float8_e5m2`.
    F8E5M2,
}

impl DType {
    /// Floating-point types are the only ones that are differentiated.
    pub fn is_float(self) -> bool {
        match self {
            DType::F16 | DType::BF16 | DType::F32 | DType::F64 | DType::F8E4M3FN | DType::F8E5M2 => true,
            DType::Pred | DType::S8 | DType::S32 | DType::S64 | DType::U8 | DType::U32 => false,
        }
    }

    /// The 8-bit floats: fp8 products take them as operands, of either format.
    pub fn is_f8(self) -> bool {
        matches!(self, DType::F8E4M3FN | DType::F8E5M2)
    }

    pub fn is_integer(self) -> bool {
        match self {
            DType::S8 | DType::S32 | DType::S64 | DType::U8 | DType::U32 => true,
            DType::Pred | DType::F16 | DType::BF16 | DType::F32 | DType::F64 | DType::F8E4M3FN | DType::F8E5M2 => false,
        }
    }

    pub fn byte_size(self) -> usize {
        match self {
            DType::Pred | DType::S8 | DType::U8 | DType::F8E4M3FN | DType::F8E5M2 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::S32 | DType::U32 | DType::F32 => 4,
            DType::S64 | DType::F64 => 8,
        }
    }

    /// JAX-style short name used in messages: `f32[4,8]`.
    pub fn name(self) -> &'static str {
        match self {
            DType::Pred => "pred",
            DType::S8 => "s8",
            DType::S32 => "s32",
            DType::S64 => "s64",
            DType::U8 => "u8",
            DType::U32 => "u32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F8E4M3FN => "f8_e4m3fn",
            DType::F8E5M2 => "f8_e5m2",
        }
    }

    /// The element type as StableHLO spells it inside `tensor<...>`.
    pub fn mlir(self) -> &'static str {
        match self {
            DType::Pred => "i1",
            DType::S8 => "i8",
            DType::S32 => "i32",
            DType::S64 => "i64",
            DType::U8 => "ui8",
            DType::U32 => "ui32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F8E4M3FN => "f8E4M3FN",
            DType::F8E5M2 => "f8E5M2",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
