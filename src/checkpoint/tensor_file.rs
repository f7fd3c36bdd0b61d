//! safetensors files streamed through the storage seam, with the CRC32C of every byte.
//!
//! The format (<https://github.com/huggingface/safetensors>): 8 bytes little-endian header
//! length, a JSON header `{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__":
//! {...}}` padded with spaces to a multiple of 8 bytes, then the tensors' bytes back to back.
//! Writing never holds more than one tensor's bytes beyond the caller's; reading reads the
//! tensors in file order, so a GCS object streams once.

use std::collections::BTreeMap;
use std::io::{Read, Write};

use anyhow::{anyhow, bail, Result};
use safetensors::tensor::Metadata;

use crate::host::params_io::{from_dtype, to_dtype};
use crate::host::{shape_string, DType, HostTensor};

/// The maxrs element type of a safetensors dtype name (`F32`, `BF16`, ...).
pub(super) fn element_type(name: &str) -> Option<DType> {
    let dtype: safetensors::Dtype = serde_json::from_value(serde_json::Value::String(name.into())).ok()?;
    from_dtype(dtype)
}

/// Size and CRC32C of a file as written or read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Digest {
    pub bytes: u64,
    pub crc32c: u32,
}

/// A writer that counts bytes and folds them into a CRC32C.
struct Checksummed<W> {
    inner: W,
    digest: Digest,
}

impl<W: Write> Checksummed<W> {
    fn put(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.inner.write_all(bytes)?;
        self.digest.crc32c = crc32c::crc32c_append(self.digest.crc32c, bytes);
        self.digest.bytes += bytes.len() as u64;
        Ok(())
    }
}

/// A file written: its digest, and where each tensor's bytes begin with their CRC32C (in the
/// order given).
pub struct Written {
    pub digest: Digest,
    pub tensors: Vec<(u64, u32)>,
}

/// Writes `tensors` as a safetensors file to `out`, in the given order; `metadata` goes in the
/// header's `__metadata__`.
pub fn write_safetensors(
    out: &mut dyn Write,
    tensors: &[(&str, &HostTensor)],
    metadata: &BTreeMap<String, String>,
) -> std::io::Result<Written> {
    let mut header = serde_json::Map::new();
    if !metadata.is_empty() {
        header.insert("__metadata__".into(), serde_json::to_value(metadata).expect("strings serialize"));
    }
    let mut offset = 0usize;
    for (name, tensor) in tensors {
        let end = offset + tensor.data.len();
        header.insert(
            name.to_string(),
            serde_json::json!({
                "dtype": to_dtype(tensor.ty),
                "shape": tensor.dims,
                "data_offsets": [offset, end],
            }),
        );
        offset = end;
    }
    let mut header = serde_json::to_vec(&serde_json::Value::Object(header)).expect("JSON serializes");
    // The format pads the header with spaces so the data starts 8-byte aligned.
    header.resize(header.len().div_ceil(8) * 8, b' ');
    let mut out = Checksummed { inner: out, digest: Digest { bytes: 0, crc32c: 0 } };
    out.put(&(header.len() as u64).to_le_bytes())?;
    out.put(&header)?;
    let mut located = Vec::with_capacity(tensors.len());
    for (_, tensor) in tensors {
        located.push((out.digest.bytes, crc32c::crc32c(&tensor.data)));
        out.put(&tensor.data)?;
    }
    Ok(Written { digest: out.digest, tensors: located })
}

/// Every tensor of a safetensors stream, with the stream's digest.
pub struct TensorFile {
    pub tensors: BTreeMap<String, HostTensor>,
    pub metadata: BTreeMap<String, String>,
    pub digest: Digest,
}

/// Reads a whole safetensors stream (`what` names it in errors). Errors say what is wrong:
/// truncated, unreadable header, unknown dtype, overlapping or short data. Memory follows the
/// bytes that arrive: a header claiming a tensor larger than the file (or than memory) is an
/// error, never an allocation of what it claims.
pub fn read_safetensors(input: &mut dyn Read, what: &str) -> Result<TensorFile> {
    let mut digest = Digest { bytes: 0, crc32c: 0 };
    // The next `len` bytes of the stream, read as they arrive (the capacity is reserved
    // fallibly, so an absurd claim is an error rather than an abort).
    let mut take_vec = |len: usize, part: &str| -> Result<Vec<u8>> {
        let mut buf = Vec::new();
        buf.try_reserve_exact(len)
            .map_err(|_| anyhow!("{what}: the {part} needs {len} bytes of memory, more than there is"))?;
        input.take(len as u64).read_to_end(&mut buf).map_err(|e| anyhow!("{what}: {e}"))?;
        if buf.len() < len {
            bail!(
                "{what}: truncated: the file ends inside the {part} (after {} bytes)",
                digest.bytes + buf.len() as u64
            );
        }
        digest.crc32c = crc32c::crc32c_append(digest.crc32c, &buf);
        digest.bytes += buf.len() as u64;
        Ok(buf)
    };
    let len = take_vec(8, "8-byte header length")?;
    let header_len = u64::from_le_bytes(len.try_into().expect("8 bytes"));
    if header_len > 100 << 20 {
        bail!("{what}: not a safetensors file (header length {header_len} bytes)");
    }
    let header = take_vec(header_len as usize, "header")?;
    let parsed: Metadata = serde_json::from_slice(&header)
        .map_err(|e| anyhow!("{what}: not a safetensors file: unreadable header ({e})"))?;
    let metadata: BTreeMap<String, String> = serde_json::from_slice::<serde_json::Value>(&header)
        .ok()
        .and_then(|v| serde_json::from_value(v["__metadata__"].clone()).ok())
        .unwrap_or_default();
    let mut infos: Vec<_> = parsed.tensors().into_iter().collect();
    infos.sort_by_key(|(_, info)| info.data_offsets.0);
    let mut tensors = BTreeMap::new();
    let mut position = 0usize;
    for (name, info) in infos {
        let ty = from_dtype(info.dtype)
            .ok_or_else(|| anyhow!("{what}: tensor {name} has dtype {:?}, which maxrs does not read", info.dtype))?;
        let too_large = || anyhow!("{what}: tensor {name} has shape {:?}, too large for this machine", info.shape);
        let dims: Vec<i64> =
            info.shape.iter().map(|&d| i64::try_from(d)).collect::<Result<_, _>>().map_err(|_| too_large())?;
        let (begin, end) = info.data_offsets;
        let expected = info
            .shape
            .iter()
            .try_fold(ty.byte_size(), |bytes, &d| bytes.checked_mul(d))
            .filter(|&bytes| position.checked_add(bytes).is_some())
            .ok_or_else(too_large)?;
        if begin != position || end < begin || end - begin != expected {
            bail!(
                "{what}: tensor {name} ({}) has data offsets [{begin}, {end}), expected [{position}, {})",
                shape_string(ty, &dims),
                position + expected
            );
        }
        let data = take_vec(expected, &format!("data of tensor {name}"))?;
        position = end;
        tensors.insert(name, HostTensor::new(ty, &dims, data));
    }
    // Anything after the last tensor is not part of a safetensors file.
    let mut extra = [0u8; 1];
    if input.read(&mut extra).map_err(|e| anyhow!("{what}: {e}"))? != 0 {
        bail!("{what}: has bytes after its last tensor (at {})", digest.bytes);
    }
    Ok(TensorFile { tensors, metadata, digest })
}
