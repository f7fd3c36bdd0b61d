//! [`HostTensor`], a dense row-major array in host memory (little-endian bytes plus element
//! type and dimensions), its [`ElementType`]s, and conversions between float types.

use half::{bf16, f16};

use super::f8::F8;

/// The element types maxrs moves between host and device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ElementType {
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

impl ElementType {
    pub fn byte_size(self) -> usize {
        match self {
            ElementType::Pred | ElementType::S8 | ElementType::U8 | ElementType::F8E4M3FN | ElementType::F8E5M2 => 1,
            ElementType::F16 | ElementType::BF16 => 2,
            ElementType::S32 | ElementType::U32 | ElementType::F32 => 4,
            ElementType::S64 | ElementType::F64 => 8,
        }
    }

    /// The MLIR spelling of the type (`f32`, `bf16`, `i1`, `ui32`, ...).
    pub fn mlir_name(self) -> &'static str {
        match self {
            ElementType::Pred => "i1",
            ElementType::S8 => "i8",
            ElementType::S32 => "i32",
            ElementType::S64 => "i64",
            ElementType::U8 => "ui8",
            ElementType::U32 => "ui32",
            ElementType::F16 => "f16",
            ElementType::BF16 => "bf16",
            ElementType::F32 => "f32",
            ElementType::F64 => "f64",
            ElementType::F8E4M3FN => "f8E4M3FN",
            ElementType::F8E5M2 => "f8E5M2",
        }
    }
}

impl std::fmt::Display for ElementType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.mlir_name())
    }
}

/// Formats a shape the way error messages show it: `f32[4,8]`.
pub fn shape_string(ty: ElementType, dims: &[i64]) -> String {
    let dims: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
    format!("{ty}[{}]", dims.join(","))
}

/// A dense row-major array in host memory.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    pub ty: ElementType,
    pub dims: Vec<i64>,
    /// Little-endian element bytes, `element_count() * ty.byte_size()` long.
    pub data: Vec<u8>,
}

macro_rules! from_slice {
    ($name:ident, $t:ty, $ty:expr) => {
        pub fn $name(dims: &[i64], values: &[$t]) -> HostTensor {
            let mut data = Vec::with_capacity(values.len() * std::mem::size_of::<$t>());
            for v in values {
                data.extend_from_slice(&v.to_le_bytes());
            }
            HostTensor::new($ty, dims, data)
        }
    };
}

impl HostTensor {
    /// Panics if `data` does not hold exactly the elements `dims` describes: callers construct
    /// tensors from values they just computed, so a mismatch is a bug, not bad input.
    pub fn new(ty: ElementType, dims: &[i64], data: Vec<u8>) -> HostTensor {
        let count: i64 = dims.iter().product();
        assert_eq!(
            data.len(),
            count as usize * ty.byte_size(),
            "HostTensor {}: {} data bytes",
            shape_string(ty, dims),
            data.len()
        );
        HostTensor { ty, dims: dims.to_vec(), data }
    }

    pub fn zeros(ty: ElementType, dims: &[i64]) -> HostTensor {
        let count: i64 = dims.iter().product();
        HostTensor::new(ty, dims, vec![0; count as usize * ty.byte_size()])
    }

    from_slice!(from_f32, f32, ElementType::F32);
    from_slice!(from_f64, f64, ElementType::F64);
    from_slice!(from_i32, i32, ElementType::S32);
    from_slice!(from_i64, i64, ElementType::S64);
    from_slice!(from_u32, u32, ElementType::U32);
    from_slice!(from_u8, u8, ElementType::U8);
    from_slice!(from_i8, i8, ElementType::S8);
    from_slice!(from_bf16, bf16, ElementType::BF16);
    from_slice!(from_f16, f16, ElementType::F16);

    pub fn from_bool(dims: &[i64], values: &[bool]) -> HostTensor {
        HostTensor::new(ElementType::Pred, dims, values.iter().map(|&b| b as u8).collect())
    }

    pub fn element_count(&self) -> usize {
        self.dims.iter().product::<i64>() as usize
    }

    pub fn shape_string(&self) -> String {
        shape_string(self.ty, &self.dims)
    }

    fn chunks<const N: usize>(&self) -> impl Iterator<Item = [u8; N]> + '_ {
        self.data.chunks_exact(N).map(|c| c.try_into().unwrap())
    }

    /// The values as f64, converting from any element type.
    pub fn to_f64(&self) -> Vec<f64> {
        match self.ty {
            ElementType::F64 => self.chunks::<8>().map(f64::from_le_bytes).collect(),
            ElementType::F32 => self.chunks::<4>().map(|b| f32::from_le_bytes(b) as f64).collect(),
            ElementType::BF16 => self.chunks::<2>().map(|b| bf16::from_le_bytes(b).to_f64()).collect(),
            ElementType::F16 => self.chunks::<2>().map(|b| f16::from_le_bytes(b).to_f64()).collect(),
            ElementType::S32 => self.chunks::<4>().map(|b| i32::from_le_bytes(b) as f64).collect(),
            ElementType::S64 => self.chunks::<8>().map(|b| i64::from_le_bytes(b) as f64).collect(),
            ElementType::U32 => self.chunks::<4>().map(|b| u32::from_le_bytes(b) as f64).collect(),
            ElementType::S8 => self.data.iter().map(|&b| b as i8 as f64).collect(),
            ElementType::U8 | ElementType::Pred => self.data.iter().map(|&b| b as f64).collect(),
            ElementType::F8E4M3FN => self.data.iter().map(|&b| F8::E4M3FN.decode(b)).collect(),
            ElementType::F8E5M2 => self.data.iter().map(|&b| F8::E5M2.decode(b)).collect(),
        }
    }

    /// The values as f32, converting from any element type.
    pub fn to_f32(&self) -> Vec<f32> {
        match self.ty {
            ElementType::F32 => self.chunks::<4>().map(f32::from_le_bytes).collect(),
            ElementType::BF16 => self.chunks::<2>().map(|b| bf16::from_le_bytes(b).to_f32()).collect(),
            ElementType::F16 => self.chunks::<2>().map(|b| f16::from_le_bytes(b).to_f32()).collect(),
            _ => self.to_f64().into_iter().map(|v| v as f32).collect(),
        }
    }

    /// The values of an integer or boolean tensor as i64.
    pub fn to_i64(&self) -> Vec<i64> {
        match self.ty {
            ElementType::S32 => self.chunks::<4>().map(|b| i32::from_le_bytes(b) as i64).collect(),
            ElementType::S64 => self.chunks::<8>().map(i64::from_le_bytes).collect(),
            ElementType::U32 => self.chunks::<4>().map(|b| u32::from_le_bytes(b) as i64).collect(),
            ElementType::S8 => self.data.iter().map(|&b| b as i8 as i64).collect(),
            ElementType::U8 | ElementType::Pred => self.data.iter().map(|&b| b as i64).collect(),
            float => panic!("to_i64 on a {float} tensor; use to_f64"),
        }
    }

    pub fn to_i32(&self) -> Vec<i32> {
        self.to_i64().into_iter().map(|v| v as i32).collect()
    }

    pub fn to_u32(&self) -> Vec<u32> {
        self.to_i64().into_iter().map(|v| v as u32).collect()
    }

    pub fn to_bool(&self) -> Vec<bool> {
        self.to_i64().into_iter().map(|v| v != 0).collect()
    }
}

/// Whether `ty` is a floating-point type (the types [`convert_float`] converts between).
pub(crate) fn is_float(ty: ElementType) -> bool {
    matches!(
        ty,
        ElementType::F16
            | ElementType::BF16
            | ElementType::F32
            | ElementType::F64
            | ElementType::F8E4M3FN
            | ElementType::F8E5M2
    )
}

/// Converts between float element types (the caller checked both are floats).
pub(crate) fn convert_float(tensor: &HostTensor, to: ElementType) -> HostTensor {
    let values = tensor.to_f64();
    match to {
        ElementType::F64 => HostTensor::from_f64(&tensor.dims, &values),
        ElementType::F32 => HostTensor::from_f32(&tensor.dims, &values.iter().map(|&v| v as f32).collect::<Vec<_>>()),
        ElementType::BF16 => {
            HostTensor::from_bf16(&tensor.dims, &values.iter().map(|&v| bf16::from_f64(v)).collect::<Vec<_>>())
        }
        ElementType::F16 => {
            HostTensor::from_f16(&tensor.dims, &values.iter().map(|&v| f16::from_f64(v)).collect::<Vec<_>>())
        }
        ElementType::F8E4M3FN => f8_tensor(&tensor.dims, &values, F8::E4M3FN),
        ElementType::F8E5M2 => f8_tensor(&tensor.dims, &values, F8::E5M2),
        other => unreachable!("convert_float to {other}"),
    }
}

fn f8_tensor(dims: &[i64], values: &[f64], format: F8) -> HostTensor {
    let ty = match format {
        F8::E4M3FN => ElementType::F8E4M3FN,
        F8::E5M2 => ElementType::F8E5M2,
    };
    HostTensor::new(ty, dims, values.iter().map(|&v| format.encode(v)).collect())
}
