//! Parameters to and from safetensors files (`load_parameters_path=FILE`).
//!
//! Loading checks the file against the parameters the model expects and reports every problem
//! at once: missing names, unexpected names, and wrong shapes or dtypes, each with expected vs
//! found. Floating-point tensors are converted to the expected float type (f32, bf16, f16, f64
//! in any direction; bf16/f16 round to nearest even). Tensors are read one at a time straight
//! from the file, so peak memory is the parameters plus one tensor, not twice the file.
//!
//! Saving writes a temporary file next to the target and renames it over the target, so an
//! interrupted save leaves any existing file intact.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, Metadata, TensorView};

use super::{convert_float, is_float, shape_string, DType, HostTensor};

/// Parameters by name; ordered so files and listings are deterministic.
pub type Params = BTreeMap<String, HostTensor>;

/// One parameter the model expects.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSpec {
    pub name: String,
    pub ty: DType,
    pub dims: Vec<i64>,
}

/// Why a parameter file was rejected.
#[derive(Debug, thiserror::Error)]
pub enum ParamsError {
    #[error("load_parameters_path={}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    /// Not a regular file (missing, a FIFO, a folder, ...).
    #[error(transparent)]
    Input(#[from] crate::input::InputError),
    #[error("load_parameters_path={}: not a safetensors file: {reason}", path.display())]
    Format { path: PathBuf, reason: String },
    #[error("{0}")]
    Mismatch(Mismatch),
    #[error("{}: {reason}", path.display())]
    Save { path: PathBuf, reason: String },
}

/// Everything that differs between a file and the expected parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Mismatch {
    pub path: PathBuf,
    /// Expected but absent: name and expected `dtype[shape]`.
    pub missing: Vec<(String, String)>,
    /// In the file but not expected: name and found `dtype[shape]`.
    pub unexpected: Vec<(String, String)>,
    /// Present with the wrong shape or an unconvertible dtype: name, expected, found.
    pub wrong: Vec<(String, String, String)>,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "load_parameters_path={}: the parameters do not match the model", self.path.display())?;
        if !self.missing.is_empty() {
            write!(f, "\n  missing ({}):", self.missing.len())?;
            for (name, expected) in &self.missing {
                write!(f, "\n    {name}: expected {expected}")?;
            }
        }
        if !self.unexpected.is_empty() {
            write!(f, "\n  unexpected ({}):", self.unexpected.len())?;
            for (name, found) in &self.unexpected {
                write!(f, "\n    {name}: found {found}")?;
            }
        }
        if !self.wrong.is_empty() {
            write!(f, "\n  wrong shape or dtype ({}):", self.wrong.len())?;
            for (name, expected, found) in &self.wrong {
                write!(f, "\n    {name}: expected {expected}, found {found}")?;
            }
        }
        Ok(())
    }
}

pub(crate) fn to_dtype(ty: DType) -> Dtype {
    match ty {
        DType::Pred => Dtype::BOOL,
        DType::S8 => Dtype::I8,
        DType::S32 => Dtype::I32,
        DType::S64 => Dtype::I64,
        DType::U8 => Dtype::U8,
        DType::U32 => Dtype::U32,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::F8E4M3FN => Dtype::F8_E4M3,
        DType::F8E5M2 => Dtype::F8_E5M2,
    }
}

pub(crate) fn from_dtype(dtype: Dtype) -> Option<DType> {
    Some(match dtype {
        Dtype::BOOL => DType::Pred,
        Dtype::I8 => DType::S8,
        Dtype::I32 => DType::S32,
        Dtype::I64 => DType::S64,
        Dtype::U8 => DType::U8,
        Dtype::U32 => DType::U32,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        // safetensors' F8_E4M3 is the `fn` variant (no infinities), as torch's float8_e4m3fn.
        Dtype::F8_E4M3 => DType::F8E4M3FN,
        Dtype::F8_E5M2 => DType::F8E5M2,
        _ => return None,
    })
}

/// `dtype[shape]` of a tensor in the file, in safetensors' dtype names when maxrs has no type.
fn found_string(dtype: Dtype, shape: &[usize]) -> String {
    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    match from_dtype(dtype) {
        Some(ty) => shape_string(ty, &dims),
        None => format!("{dtype:?}{dims:?}"),
    }
}

/// Loads `path` and returns exactly the `expected` parameters, in their expected dtypes.
pub fn load_parameters(path: &Path, expected: &[ParamSpec]) -> Result<Params, ParamsError> {
    let io = |source| ParamsError::Io { path: path.to_owned(), source };
    let format = |reason: String| ParamsError::Format { path: path.to_owned(), reason };
    let mut file = crate::input::open("load_parameters_path", path)?;
    let file_len = file.metadata().map_err(io)?.len();

    let mut len_bytes = [0u8; 8];
    file.read_exact(&mut len_bytes)
        .map_err(|_| format(format!("{file_len} bytes, shorter than the 8-byte header length")))?;
    let header_len = u64::from_le_bytes(len_bytes);
    if header_len > file_len - 8 {
        return Err(format(format!("header length {header_len} exceeds the file size {file_len}")));
    }
    let mut header = vec![0u8; header_len as usize];
    file.read_exact(&mut header).map_err(io)?;
    let metadata: Metadata =
        serde_json::from_slice(&header).map_err(|e| format(format!("unreadable JSON header: {e}")))?;
    let data_start = 8 + header_len;
    let infos = metadata.tensors();

    let mut mismatch = Mismatch { path: path.to_owned(), missing: vec![], unexpected: vec![], wrong: vec![] };
    let expected_names: HashMap<&str, &ParamSpec> = expected.iter().map(|s| (s.name.as_str(), s)).collect();
    let mut unexpected: Vec<(String, String)> = infos
        .iter()
        .filter(|(name, _)| !expected_names.contains_key(name.as_str()))
        .map(|(name, info)| (name.clone(), found_string(info.dtype, &info.shape)))
        .collect();
    unexpected.sort();
    mismatch.unexpected = unexpected;

    let mut params = Params::new();
    for spec in expected {
        let expected_string = shape_string(spec.ty, &spec.dims);
        let Some(info) = infos.get(&spec.name) else {
            mismatch.missing.push((spec.name.clone(), expected_string));
            continue;
        };
        let found = found_string(info.dtype, &info.shape);
        let shape_ok =
            info.shape.len() == spec.dims.len() && info.shape.iter().zip(&spec.dims).all(|(&a, &b)| a as i64 == b);
        let file_ty = from_dtype(info.dtype);
        let dtype_ok = file_ty == Some(spec.ty) || (file_ty.is_some_and(is_float) && is_float(spec.ty));
        if !shape_ok || !dtype_ok {
            mismatch.wrong.push((spec.name.clone(), expected_string, found));
            continue;
        }
        let file_ty = file_ty.expect("dtype_ok implies a known dtype");
        let (begin, end) = info.data_offsets;
        let byte_len = info.shape.iter().product::<usize>() * file_ty.byte_size();
        if end < begin || end - begin != byte_len || data_start + end as u64 > file_len {
            return Err(format(format!(
                "tensor {}: data offsets [{begin}, {end}) do not hold {found} ({byte_len} bytes) within the {file_len}-byte file",
                spec.name
            )));
        }
        let mut data = vec![0u8; byte_len];
        file.seek(SeekFrom::Start(data_start + begin as u64)).map_err(io)?;
        file.read_exact(&mut data).map_err(io)?;
        let mut tensor = HostTensor::new(file_ty, &spec.dims, data);
        if file_ty != spec.ty {
            tracing::debug!("{}: {} converts {found} to {}", path.display(), spec.name, spec.ty);
            tensor = convert_float(&tensor, spec.ty);
        }
        params.insert(spec.name.clone(), tensor);
    }

    if mismatch.missing.is_empty() && mismatch.unexpected.is_empty() && mismatch.wrong.is_empty() {
        Ok(params)
    } else {
        Err(ParamsError::Mismatch(mismatch))
    }
}

/// Writes `params` as a safetensors file at `path`, atomically ([`crate::files::write_atomic`]).
pub fn save_safetensors(path: &Path, params: &Params) -> Result<(), ParamsError> {
    let fail = |reason: String| ParamsError::Save { path: path.to_owned(), reason };
    let mut views = Vec::with_capacity(params.len());
    for (name, tensor) in params {
        let shape: Vec<usize> = tensor.dims.iter().map(|&d| d as usize).collect();
        let view = TensorView::new(to_dtype(tensor.ty), shape, &tensor.data)
            .map_err(|e| fail(format!("tensor {name} {}: {e:?}", tensor.shape_string())))?;
        views.push((name.as_str(), view));
    }
    let bytes = safetensors::tensor::serialize(views, &None).map_err(|e| fail(format!("{e:?}")))?;

    crate::files::write_atomic(path, |file| file.write_all(&bytes)).map_err(|e| fail(format!("{e:#}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 8-bit floats are written with safetensors' `F8_E4M3` / `F8_E5M2` dtypes, read back
    /// bit for bit, and converted to f32 on request (every bit pattern but NaNs).
    #[test]
    fn f8_tensors_round_trip_through_safetensors() {
        let bits: Vec<u8> = (0..=255).collect();
        let file = tempfile::Builder::new().suffix(".safetensors").tempfile().unwrap();
        let path = file.path();
        let params: Params = [
            ("a".to_string(), HostTensor::new(DType::F8E4M3FN, &[16, 16], bits.clone())),
            ("b".to_string(), HostTensor::new(DType::F8E5M2, &[256], bits.clone())),
        ]
        .into();
        save_safetensors(path, &params).unwrap();
        let header = String::from_utf8_lossy(&std::fs::read(path).unwrap()[8..200]).to_string();
        assert!(header.contains("\"F8_E4M3\"") && header.contains("\"F8_E5M2\""), "{header}");
        let spec = |name: &str, ty: DType, dims: &[i64]| ParamSpec { name: name.into(), ty, dims: dims.to_vec() };
        let same = [spec("a", DType::F8E4M3FN, &[16, 16]), spec("b", DType::F8E5M2, &[256])];
        assert_eq!(load_parameters(path, &same).unwrap(), params);
        let wide = [spec("a", DType::F32, &[16, 16]), spec("b", DType::F32, &[256])];
        let loaded = load_parameters(path, &wide).unwrap();
        for name in ["a", "b"] {
            let (want, got) = (params[name].to_f64(), loaded[name].to_f64());
            for (w, g) in want.iter().zip(&got) {
                assert!(w == g || (w.is_nan() && g.is_nan()), "{name}: {w} vs {g}");
            }
        }
    }
}
