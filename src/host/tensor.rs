//! [`HostTensor`], a dense row-major array in host memory (little-endian bytes plus element
//! type and dimensions), and conversions between float types.

use half::{bf16, f16};

use super::dtype::DType;
use super::f8::F8;

/// Formats a shape the way error messages show it: `f32[4,8]`.
pub fn shape_string(ty: DType, dims: &[i64]) -> String {
    let dims: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
    format!("{ty}[{}]", dims.join(","))
}

/// A dense row-major array in host memory.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    pub ty: DType,
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
    pub fn new(ty: DType, dims: &[i64], data: Vec<u8>) -> HostTensor {
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

    pub fn zeros(ty: DType, dims: &[i64]) -> HostTensor {
        let count: i64 = dims.iter().product();
        HostTensor::new(ty, dims, vec![0; count as usize * ty.byte_size()])
    }

    from_slice!(from_f32, f32, DType::F32);
    from_slice!(from_f64, f64, DType::F64);
    from_slice!(from_i32, i32, DType::S32);
    from_slice!(from_i64, i64, DType::S64);
    from_slice!(from_u32, u32, DType::U32);
    from_slice!(from_u8, u8, DType::U8);
    from_slice!(from_i8, i8, DType::S8);
    from_slice!(from_bf16, bf16, DType::BF16);
    from_slice!(from_f16, f16, DType::F16);

    pub fn from_bool(dims: &[i64], values: &[bool]) -> HostTensor {
        HostTensor::new(DType::Pred, dims, values.iter().map(|&b| b as u8).collect())
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
            DType::F64 => self.chunks::<8>().map(f64::from_le_bytes).collect(),
            DType::F32 => self.chunks::<4>().map(|b| f32::from_le_bytes(b) as f64).collect(),
            DType::BF16 => self.chunks::<2>().map(|b| bf16::from_le_bytes(b).to_f64()).collect(),
            DType::F16 => self.chunks::<2>().map(|b| f16::from_le_bytes(b).to_f64()).collect(),
            DType::S32 => self.chunks::<4>().map(|b| i32::from_le_bytes(b) as f64).collect(),
            DType::S64 => self.chunks::<8>().map(|b| i64::from_le_bytes(b) as f64).collect(),
            DType::U32 => self.chunks::<4>().map(|b| u32::from_le_bytes(b) as f64).collect(),
            DType::S8 => self.data.iter().map(|&b| b as i8 as f64).collect(),
            DType::U8 | DType::Pred => self.data.iter().map(|&b| b as f64).collect(),
            DType::F8E4M3FN => self.data.iter().map(|&b| F8::E4M3FN.decode(b)).collect(),
            DType::F8E5M2 => self.data.iter().map(|&b| F8::E5M2.decode(b)).collect(),
        }
    }

    /// The values as f32, converting from any element type.
    pub fn to_f32(&self) -> Vec<f32> {
        match self.ty {
            DType::F32 => self.chunks::<4>().map(f32::from_le_bytes).collect(),
            DType::BF16 => self.chunks::<2>().map(|b| bf16::from_le_bytes(b).to_f32()).collect(),
            DType::F16 => self.chunks::<2>().map(|b| f16::from_le_bytes(b).to_f32()).collect(),
            _ => self.to_f64().into_iter().map(|v| v as f32).collect(),
        }
    }

    /// The values of an integer or boolean tensor as i64.
    pub fn to_i64(&self) -> Vec<i64> {
        match self.ty {
            DType::S32 => self.chunks::<4>().map(|b| i32::from_le_bytes(b) as i64).collect(),
            DType::S64 => self.chunks::<8>().map(i64::from_le_bytes).collect(),
            DType::U32 => self.chunks::<4>().map(|b| u32::from_le_bytes(b) as i64).collect(),
            DType::S8 => self.data.iter().map(|&b| b as i8 as i64).collect(),
            DType::U8 | DType::Pred => self.data.iter().map(|&b| b as i64).collect(),
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
pub(crate) fn is_float(ty: DType) -> bool {
    matches!(ty, DType::F16 | DType::BF16 | DType::F32 | DType::F64 | DType::F8E4M3FN | DType::F8E5M2)
}

/// Converts between float element types (the caller checked both are floats).
pub(crate) fn convert_float(tensor: &HostTensor, to: DType) -> HostTensor {
    let values = tensor.to_f64();
    match to {
        DType::F64 => HostTensor::from_f64(&tensor.dims, &values),
        DType::F32 => HostTensor::from_f32(&tensor.dims, &values.iter().map(|&v| v as f32).collect::<Vec<_>>()),
        DType::BF16 => {
            HostTensor::from_bf16(&tensor.dims, &values.iter().map(|&v| bf16::from_f64(v)).collect::<Vec<_>>())
        }
        DType::F16 => HostTensor::from_f16(&tensor.dims, &values.iter().map(|&v| f16::from_f64(v)).collect::<Vec<_>>()),
        DType::F8E4M3FN => f8_tensor(&tensor.dims, &values, F8::E4M3FN),
        DType::F8E5M2 => f8_tensor(&tensor.dims, &values, F8::E5M2),
        other => unreachable!("convert_float to {other}"),
    }
}

fn f8_tensor(dims: &[i64], values: &[f64], format: F8) -> HostTensor {
    let ty = match format {
        F8::E4M3FN => DType::F8E4M3FN,
        F8::E5M2 => DType::F8E5M2,
    };
    HostTensor::new(ty, dims, values.iter().map(|&v| format.encode(v)).collect())
}
