//! Zarr v3 arrays, read only, from any [`Store`] of keys (an OCDBT database, or an Orbax item's
//! folder without one): the array metadata (`<array>/zarr.json`), its regular chunk grid with the
//! default chunk key encoding (`<array>/c/0/1`, `<array>/c` for a 0-d array), and the codecs
//! TensorStore writes for Orbax: `bytes` (little endian), `zstd`, `crc32c`, and
//! `sharding_indexed` holding such inner chunks (its index at the shard's end or start, read by
//! itself before the inner chunks it points to, each inner chunk one ranged read). Any other
//! codec, data type or encoding is refused by name.
//!
//! And zarr v2 arrays, which Orbax writes with `use_zarr3=False` (MaxText's
//! `checkpoint_storage_use_zarr3=false`): `<array>/.zarray` (zarr-developers/zarr-specs
//! `docs/v2/v2.0.rst`), little-endian C-order chunks keyed `0.1` (`0` for a 0-d array) by the
//! `dimension_separator`, compressed with `zstd` or not at all, no filters; TensorStore's
//! `bfloat16` dtype as its zarr driver writes it.
//!
//! The format is the Zarr v3 core specification (zarr-developers/zarr-specs
//! `docs/v3/core/index.rst`, with `docs/v3/codecs/{bytes,crc32c,sharding-indexed,zstd}`), as
//! TensorStore writes it (google/tensorstore commit bc4fbc11f69ee5379b2f611a934663006e1f573f,
//! `tensorstore/driver/zarr3/`: `bfloat16` is its extension data type).

use anyhow::{anyhow, bail, ensure, Context, Result};
use serde_json::Value as Json;

use crate::host::{DType, HostTensor};

/// Keys holding bytes, each read by ranges.
pub trait Store {
    /// The size of the value of `key`, `None` when there is none (an error when the store could
    /// not say: a missing chunk may read as zeros, an unreadable one must not).
    fn value_len(&self, key: &str) -> Result<Option<u64>>;
    /// Bytes `start..start + len` of the value of `key`.
    fn read_range(&self, key: &str, start: u64, len: u64) -> Result<Vec<u8>>;
}

/// A zarr v3 array's metadata: what it holds and how its chunks are stored.
#[derive(Clone, Debug)]
pub struct Array {
    /// The key prefix of the array (`params.params.decoder.decoder_norm.scale`).
    pub path: String,
    pub ty: DType,
    pub shape: Vec<u64>,
    chunk_shape: Vec<u64>,
    codecs: Codecs,
    /// Whether a missing chunk reads as zeros (the fill value is zero); else it is an error.
    fill_is_zero: bool,
    /// How its chunks' keys are spelled.
    keys: KeyEncoding,
}

/// Chunk keys: zarr v3's default encoding (`c/0/1`), or zarr v2's (`0.1` with its separator,
/// `0` for a 0-d array).
#[derive(Clone, Copy, Debug)]
enum KeyEncoding {
    V3,
    V2 { separator: char },
}

/// How a stored chunk decodes to its elements.
#[derive(Clone, Debug)]
enum Codecs {
    /// `bytes`, then bytes-to-bytes codecs (in writing order).
    Plain(Vec<BytesCodec>),
    /// `sharding_indexed`: the shard holds inner chunks of `chunk_shape`, decoded by `inner`, and
    /// an index of `(offset, length)` per inner chunk, decoded by `index`.
    Sharded { chunk_shape: Vec<u64>, inner: Vec<BytesCodec>, index: Vec<BytesCodec>, index_at_end: bool },
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum BytesCodec {
    Zstd,
    Crc32c,
}

impl Array {
    /// Reads `<path>/zarr.json` (zarr v3) or `<path>/.zarray` (zarr v2) from `store`.
    pub fn open(store: &dyn Store, path: &str) -> Result<Array> {
        let (v3, v2) = (format!("{path}/zarr.json"), format!("{path}/.zarray"));
        let (key, len) = match (store.value_len(&v3)?, store.value_len(&v2)?) {
            (Some(len), _) => (v3, len),
            (None, Some(len)) => (v2, len),
            (None, None) => bail!("no zarr array {path:?} (no {v3:?}, nor zarr v2's {v2:?})"),
        };
        ensure!(len <= 1 << 20, "{key}: {len} bytes, not array metadata");
        let text = store.read_range(&key, 0, len)?;
        let meta: Json = serde_json::from_slice(&text).with_context(|| format!("{key}: not JSON"))?;
        match key.ends_with(".zarray") {
            true => Array::from_v2_metadata(path, &meta),
            false => Array::from_metadata(path, &meta),
        }
        .with_context(|| key.clone())
    }

    /// A zarr v2 array's `.zarray`.
    fn from_v2_metadata(path: &str, meta: &Json) -> Result<Array> {
        let field = |name: &str| meta.get(name).ok_or_else(|| anyhow!("no {name:?}"));
        ensure!(field("zarr_format")? == 2, "zarr_format {} (a .zarray is zarr v2)", field("zarr_format")?);
        let dtype = field("dtype")?.as_str().ok_or_else(|| anyhow!("dtype is not a name"))?;
        let ty = V2_DATA_TYPES.iter().find(|(n, _)| *n == dtype).map(|(_, ty)| *ty).ok_or_else(|| {
            let names: Vec<&str> = V2_DATA_TYPES.iter().map(|(n, _)| *n).collect();
            anyhow!("dtype {dtype:?} is not supported ({} are)", names.join(", "))
        })?;
        let shape = dims(field("shape")?).context("shape")?;
        let chunk_shape = dims(field("chunks")?).context("chunks")?;
        ensure!(chunk_shape.len() == shape.len(), "chunks {chunk_shape:?} for shape {shape:?}");
        ensure!(chunk_shape.iter().all(|&c| c > 0), "chunks {chunk_shape:?} has a zero");
        let order = meta.get("order").and_then(Json::as_str).unwrap_or("C");
        ensure!(order == "C", "order {order:?} (maxrs reads \"C\")");
        let filters = meta.get("filters").unwrap_or(&Json::Null);
        ensure!(filters.is_null(), "filters {filters} (maxrs reads arrays without filters)");
        let codecs = match meta.get("compressor").unwrap_or(&Json::Null) {
            Json::Null => vec![],
            c if c["id"] == "zstd" => vec![BytesCodec::Zstd],
            other => bail!("compressor {other} is not supported (maxrs reads zstd or none)"),
        };
        let separator = match meta.get("dimension_separator").and_then(Json::as_str).unwrap_or(".") {
            "." => '.',
            "/" => '/',
            other => bail!("dimension_separator {other:?} (zarr v2 has \".\" and \"/\")"),
        };
        let fill = field("fill_value")?;
        let fill_is_zero = fill.as_f64() == Some(0.0) || fill == false;
        let (path, codecs) = (path.to_string(), Codecs::Plain(codecs));
        Ok(Array { path, ty, shape, chunk_shape, codecs, fill_is_zero, keys: KeyEncoding::V2 { separator } })
    }

    fn from_metadata(path: &str, meta: &Json) -> Result<Array> {
        let field = |name: &str| meta.get(name).ok_or_else(|| anyhow!("no {name:?}"));
        ensure!(field("zarr_format")? == 3, "zarr_format {} (maxrs reads zarr v3)", field("zarr_format")?);
        ensure!(field("node_type")? == "array", "node_type {} (an array was expected)", field("node_type")?);
        let data_type = field("data_type")?.as_str().ok_or_else(|| anyhow!("data_type is not a name"))?;
        let ty = element_type(data_type)?;
        let shape = dims(field("shape")?).context("shape")?;
        let grid = field("chunk_grid")?;
        ensure!(grid["name"] == "regular", "chunk grid {} (maxrs reads \"regular\")", grid["name"]);
        let chunk_shape = dims(&grid["configuration"]["chunk_shape"]).context("chunk_shape")?;
        ensure!(chunk_shape.len() == shape.len(), "chunk_shape {chunk_shape:?} for shape {shape:?}");
        ensure!(chunk_shape.iter().all(|&c| c > 0), "chunk_shape {chunk_shape:?} has a zero");
        let encoding = field("chunk_key_encoding")?;
        let separator = encoding["configuration"]["separator"].as_str().unwrap_or("/");
        ensure!(
            encoding["name"] == "default" && separator == "/",
            "chunk key encoding {encoding} (maxrs reads \"default\" with separator \"/\")"
        );
        let fill = field("fill_value")?;
        let fill_is_zero = fill.as_f64() == Some(0.0) || fill == false;
        let codecs = codecs(field("codecs")?, ty, chunk_shape.len())?;
        if let Codecs::Sharded { chunk_shape: inner, .. } = &codecs {
            let divides = inner.iter().zip(&chunk_shape).all(|(i, s)| *i > 0 && s % i == 0);
            ensure!(divides, "sharding_indexed chunk_shape {inner:?} does not divide the shard shape {chunk_shape:?}");
        }
        Ok(Array { path: path.to_string(), ty, shape, chunk_shape, codecs, fill_is_zero, keys: KeyEncoding::V3 })
    }

    /// The whole array, in row-major order.
    pub fn read(&self, store: &dyn Store) -> Result<HostTensor> {
        self.read_block(store, &vec![0; self.shape.len()], &self.shape)
    }

    /// The block of `shape` at `start` of the array, in row-major order, reading only the
    /// chunks (and a shard's inner chunks) that overlap it: what one process of a job needs.
    pub fn read_block(&self, store: &dyn Store, start: &[u64], shape: &[u64]) -> Result<HostTensor> {
        let mut blocks = self.read_blocks(store, &[(start.to_vec(), shape.to_vec())])?;
        Ok(blocks.pop().expect("one block asked, one read"))
    }

    /// The blocks `(start, shape)` of the array, each in row-major order, decoding each chunk
    /// (and a shard's inner chunk) that overlaps any of them once: a process whose devices hold
    /// several blocks of one chunk (Orbax writes a one-host save as one chunk per array) decodes
    /// it once, not once per device.
    pub fn read_blocks(&self, store: &dyn Store, wanted: &[(Vec<u64>, Vec<u64>)]) -> Result<Vec<HostTensor>> {
        let rank = self.shape.len();
        for (start, shape) in wanted {
            ensure!(
                start.len() == rank
                    && shape.len() == rank
                    && (0..rank).all(|d| start[d].checked_add(shape[d]).is_some_and(|end| end <= self.shape[d])),
                "the block {shape:?} at {start:?} is not inside the array's shape {:?}",
                self.shape
            );
        }
        let elem = self.ty.byte_size();
        let mut outs: Vec<Vec<u8>> =
            wanted.iter().map(|(_, shape)| vec![0u8; shape.iter().product::<u64>() as usize * elem]).collect();
        // The non-empty blocks, each with its output.
        let (blocks, mut filled): (Vec<Block>, Vec<&mut Vec<u8>>) = wanted
            .iter()
            .zip(outs.iter_mut())
            .filter(|((_, shape), _)| shape.iter().product::<u64>() > 0)
            .map(|((start, shape), out)| (Block { start, shape }, out))
            .unzip();
        // The chunks any block overlaps: per block, from the one holding its first element to the
        // one holding its last, along each dimension.
        let mut chunks = std::collections::BTreeSet::new();
        for block in &blocks {
            let first: Vec<u64> = (0..rank).map(|d| block.start[d] / self.chunk_shape[d]).collect();
            let span: Vec<u64> =
                (0..rank).map(|d| (block.start[d] + block.shape[d] - 1) / self.chunk_shape[d] + 1 - first[d]).collect();
            chunks
                .extend(indices(&span).map(|offset| offset.iter().zip(&first).map(|(o, f)| o + f).collect::<Vec<_>>()));
        }
        for chunk in chunks {
            let origin: Vec<u64> = chunk.iter().zip(&self.chunk_shape).map(|(i, c)| i * c).collect();
            let key = self.chunk_key(&chunk);
            let Some(len) = store.value_len(&key)? else {
                ensure!(self.fill_is_zero, "{key}: no such chunk, and the array's fill value is not zero");
                continue;
            };
            match &self.codecs {
                Codecs::Plain(codecs) => {
                    let bytes = decode(store.read_range(&key, 0, len)?, codecs, self.chunk_bytes(&self.chunk_shape))
                        .with_context(|| key.clone())?;
                    self.place_all(&blocks, &mut filled, bytes, &origin, &self.chunk_shape)
                        .with_context(|| key.clone())?;
                }
                Codecs::Sharded { chunk_shape, inner, index, index_at_end } => {
                    let per_shard: Vec<u64> = self.chunk_shape.iter().zip(chunk_shape).map(|(s, c)| s / c).collect();
                    let n: u64 = per_shard.iter().product();
                    let index_len = n * 16 + if index.contains(&BytesCodec::Crc32c) { 4 } else { 0 };
                    ensure!(len >= index_len, "{key}: a shard of {len} bytes, shorter than its index of {index_len}");
                    let index_start = if *index_at_end { len - index_len } else { 0 };
                    let entries = decode(store.read_range(&key, index_start, index_len)?, index, n * 16)
                        .with_context(|| format!("{key}: the shard index"))?;
                    ensure!(
                        entries.len() as u64 == n * 16,
                        "{key}: a shard index of {} bytes for {n} chunks",
                        entries.len()
                    );
                    for (i, inner_chunk) in indices(&per_shard).enumerate() {
                        let inner_origin: Vec<u64> =
                            origin.iter().zip(&inner_chunk).zip(chunk_shape).map(|((o, i), c)| o + i * c).collect();
                        if !blocks.iter().any(|block| block.overlaps(&inner_origin, chunk_shape)) {
                            continue;
                        }
                        let entry = &entries[i * 16..i * 16 + 16];
                        let offset = u64::from_le_bytes(entry[..8].try_into().expect("8 bytes"));
                        let nbytes = u64::from_le_bytes(entry[8..].try_into().expect("8 bytes"));
                        if offset == u64::MAX && nbytes == u64::MAX {
                            ensure!(
                                self.fill_is_zero,
                                "{key}: inner chunk {inner_chunk:?} missing, fill value not zero"
                            );
                            continue;
                        }
                        ensure!(
                            offset.checked_add(nbytes).is_some_and(|end| end <= len),
                            "{key}: inner chunk {inner_chunk:?} at {offset}+{nbytes}, past the shard's {len} bytes"
                        );
                        let bytes =
                            decode(store.read_range(&key, offset, nbytes)?, inner, self.chunk_bytes(chunk_shape))
                                .with_context(|| format!("{key}: inner chunk {inner_chunk:?}"))?;
                        self.place_all(&blocks, &mut filled, bytes, &inner_origin, chunk_shape)
                            .with_context(|| format!("{key}: inner chunk {inner_chunk:?}"))?;
                    }
                }
            }
        }
        Ok(outs
            .into_iter()
            .zip(wanted)
            .map(|(out, (_, shape))| {
                let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
                HostTensor::new(self.ty, &dims, out)
            })
            .collect())
    }

    /// The key of the chunk at grid index `chunk`: v3's default encoding, `c` then each index,
    /// `/`-separated; v2's, the indices joined by the separator (`0` for a 0-d array).
    fn chunk_key(&self, chunk: &[u64]) -> String {
        let indices: Vec<String> = chunk.iter().map(u64::to_string).collect();
        match self.keys {
            KeyEncoding::V3 => std::iter::once(format!("{}/c", self.path)).chain(indices).collect::<Vec<_>>().join("/"),
            KeyEncoding::V2 { .. } if chunk.is_empty() => format!("{}/0", self.path),
            KeyEncoding::V2 { separator } => format!("{}/{}", self.path, indices.join(&separator.to_string())),
        }
    }

    fn chunk_bytes(&self, chunk_shape: &[u64]) -> u64 {
        chunk_shape.iter().product::<u64>() * self.ty.byte_size() as u64
    }

    /// Copies the decoded chunk `bytes` (of `chunk_shape`, at `origin`) into each block's output;
    /// a lone block that is exactly the chunk takes the bytes as they are (a whole array stored
    /// as one chunk, as Orbax writes a one-host save: no second buffer, no copy).
    fn place_all(
        &self,
        blocks: &[Block],
        outs: &mut [&mut Vec<u8>],
        bytes: Vec<u8>,
        origin: &[u64],
        chunk_shape: &[u64],
    ) -> Result<()> {
        if let ([block], [out]) = (blocks, &mut *outs) {
            if block.start == origin && block.shape == chunk_shape && bytes.len() == out.len() {
                **out = bytes;
                return Ok(());
            }
        }
        for (block, out) in blocks.iter().zip(outs.iter_mut()) {
            self.place(out, block, &bytes, origin, chunk_shape)?;
        }
        Ok(())
    }

    /// Copies the part of the decoded chunk `bytes` (of `chunk_shape`, at `origin`) inside the
    /// array and the `block` into `out` (the block's elements), row by row of the last dimension.
    fn place(&self, out: &mut [u8], block: &Block, bytes: &[u8], origin: &[u64], chunk_shape: &[u64]) -> Result<()> {
        let elem = self.ty.byte_size() as u64;
        let chunk_count: u64 = chunk_shape.iter().product();
        ensure!(
            bytes.len() as u64 == chunk_count * elem,
            "{} decoded bytes for a chunk of {chunk_count} {} elements",
            bytes.len(),
            self.ty
        );
        let rank = self.shape.len();
        if rank == 0 {
            out.copy_from_slice(bytes);
            return Ok(());
        }
        // The part of the chunk inside the block (which is inside the array: a chunk at the
        // array's edge overhangs it).
        let low: Vec<u64> = (0..rank).map(|d| origin[d].max(block.start[d])).collect();
        let high: Vec<u64> =
            (0..rank).map(|d| (origin[d] + chunk_shape[d]).min(block.start[d] + block.shape[d])).collect();
        if (0..rank).any(|d| low[d] >= high[d]) {
            return Ok(());
        }
        let extent: Vec<u64> = (0..rank).map(|d| high[d] - low[d]).collect();
        let row = extent[rank - 1] * elem;
        for at in indices(&extent[..rank - 1]) {
            let (mut src, mut dst) = (0u64, 0u64);
            for d in 0..rank - 1 {
                src = src * chunk_shape[d] + low[d] - origin[d] + at[d];
                dst = dst * block.shape[d] + low[d] - block.start[d] + at[d];
            }
            let src = (src * chunk_shape[rank - 1] + low[rank - 1] - origin[rank - 1]) * elem;
            let dst = (dst * block.shape[rank - 1] + low[rank - 1] - block.start[rank - 1]) * elem;
            out[dst as usize..(dst + row) as usize].copy_from_slice(&bytes[src as usize..(src + row) as usize]);
        }
        Ok(())
    }
}

/// The part of an array one read wants: `shape` elements from `start`.
struct Block<'a> {
    start: &'a [u64],
    shape: &'a [u64],
}

impl Block<'_> {
    /// Whether the chunk of `chunk_shape` at `origin` holds any of the block's elements.
    fn overlaps(&self, origin: &[u64], chunk_shape: &[u64]) -> bool {
        (0..origin.len())
            .all(|d| origin[d] < self.start[d] + self.shape[d] && self.start[d] < origin[d] + chunk_shape[d])
    }
}

/// Every index of a grid of `extent`, in row-major order (one empty index for rank 0).
fn indices(extent: &[u64]) -> impl Iterator<Item = Vec<u64>> + '_ {
    let count: u64 = extent.iter().product();
    (0..count).map(move |mut flat| {
        let mut index = vec![0; extent.len()];
        for d in (0..extent.len()).rev() {
            index[d] = flat % extent[d];
            flat /= extent[d];
        }
        index
    })
}

fn dims(json: &Json) -> Result<Vec<u64>> {
    let list = json.as_array().ok_or_else(|| anyhow!("{json} is not a list"))?;
    list.iter().map(|d| d.as_u64().ok_or_else(|| anyhow!("{d} is not a size"))).collect()
}

/// The zarr v3 data types maxrs reads and writes, by name (`bfloat16` is TensorStore's).
const DATA_TYPES: [(&str, DType); 12] = [
    ("bool", DType::Pred),
    ("int8", DType::S8),
    ("int32", DType::S32),
    ("int64", DType::S64),
    ("uint8", DType::U8),
    ("uint32", DType::U32),
    ("float16", DType::F16),
    ("bfloat16", DType::BF16),
    ("float32", DType::F32),
    ("float64", DType::F64),
    ("float8_e4m3fn", DType::F8E4M3FN),
    ("float8_e5m2", DType::F8E5M2),
];

fn supported_types() -> String {
    DATA_TYPES.iter().map(|(name, _)| *name).collect::<Vec<_>>().join(", ")
}

/// The zarr v2 dtypes maxrs reads (little-endian; `bfloat16` as TensorStore's zarr driver
/// writes it).
const V2_DATA_TYPES: [(&str, DType); 10] = [
    ("|b1", DType::Pred),
    ("|i1", DType::S8),
    ("<i4", DType::S32),
    ("<i8", DType::S64),
    ("|u1", DType::U8),
    ("<u4", DType::U32),
    ("<f2", DType::F16),
    ("bfloat16", DType::BF16),
    ("<f4", DType::F32),
    ("<f8", DType::F64),
];

/// The element type of a zarr v3 data type name.
fn element_type(name: &str) -> Result<DType> {
    let found = DATA_TYPES.iter().find(|(n, _)| *n == name).map(|(_, ty)| *ty);
    found.ok_or_else(|| anyhow!("data type {name:?} is not supported ({} are)", supported_types()))
}

/// The zarr v3 data type name of an element type.
pub(super) fn data_type_name(ty: DType) -> Result<&'static str> {
    let found = DATA_TYPES.iter().find(|(_, t)| *t == ty).map(|(name, _)| *name);
    found.ok_or_else(|| anyhow!("element type {ty} has no zarr data type maxrs writes ({} do)", supported_types()))
}

/// A codec list: the array-to-bytes codec (`bytes`, or `sharding_indexed` at the top level)
/// and the bytes-to-bytes codecs after it.
fn codecs(json: &Json, ty: DType, rank: usize) -> Result<Codecs> {
    let list = json.as_array().ok_or_else(|| anyhow!("codecs {json} is not a list"))?;
    let (first, rest) = list.split_first().ok_or_else(|| anyhow!("an empty codec list"))?;
    match first["name"].as_str() {
        Some("sharding_indexed") => {
            ensure!(rest.is_empty(), "codecs after sharding_indexed are not supported: {}", Json::from(rest.to_vec()));
            let config = &first["configuration"];
            let chunk_shape = dims(&config["chunk_shape"]).context("sharding_indexed chunk_shape")?;
            ensure!(chunk_shape.len() == rank, "sharding_indexed chunk_shape {chunk_shape:?} for rank {rank}");
            let inner = match codecs(&config["codecs"], ty, rank)? {
                Codecs::Plain(inner) => inner,
                Codecs::Sharded { .. } => bail!("nested sharding_indexed is not supported"),
            };
            let index = match codecs(&config["index_codecs"], DType::S64, 1)? {
                Codecs::Plain(index) => index,
                Codecs::Sharded { .. } => bail!("a sharded shard index is not supported"),
            };
            ensure!(!index.contains(&BytesCodec::Zstd), "a compressed shard index is not supported");
            let index_at_end = match config.get("index_location").and_then(Json::as_str) {
                None | Some("end") => true,
                Some("start") => false,
                Some(other) => bail!("sharding_indexed index_location {other:?} (\"start\" or \"end\")"),
            };
            Ok(Codecs::Sharded { chunk_shape, inner, index, index_at_end })
        }
        Some("bytes") => {
            let endian = first["configuration"]["endian"].as_str();
            ensure!(
                endian == Some("little") || (endian.is_none() && ty.byte_size() == 1),
                "bytes codec with endian {:?} is not supported (little endian is)",
                endian
            );
            let rest = rest
                .iter()
                .map(|codec| match codec["name"].as_str() {
                    Some("zstd") => Ok(BytesCodec::Zstd),
                    Some("crc32c") => Ok(BytesCodec::Crc32c),
                    _ => bail!("codec {codec} is not supported (bytes, zstd, crc32c, sharding_indexed are)"),
                })
                .collect::<Result<_>>()?;
            Ok(Codecs::Plain(rest))
        }
        _ => bail!("codec {first} is not supported (bytes, zstd, crc32c, sharding_indexed are)"),
    }
}

/// Undoes the bytes-to-bytes codecs, last written first; `expected` is the decoded size, which
/// bounds what a corrupt zstd frame can make us allocate.
fn decode(mut bytes: Vec<u8>, codecs: &[BytesCodec], expected: u64) -> Result<Vec<u8>> {
    use std::io::Read;
    // A crc32c codec before zstd adds its 4 bytes to what zstd decompresses.
    let limit = expected + 4 * codecs.len() as u64;
    for codec in codecs.iter().rev() {
        bytes = match codec {
            BytesCodec::Zstd => {
                let mut out = Vec::new();
                zstd::stream::Decoder::new(bytes.as_slice())?.take(limit + 1).read_to_end(&mut out).context("zstd")?;
                ensure!(out.len() as u64 <= limit, "zstd decompresses past the {expected} bytes of the chunk");
                out
            }
            BytesCodec::Crc32c => {
                ensure!(bytes.len() >= 4, "{} bytes, too short for a crc32c", bytes.len());
                let (data, crc) = bytes.split_at(bytes.len() - 4);
                let want = u32::from_le_bytes(crc.try_into().expect("4 bytes"));
                ensure!(crc32c::crc32c(data) == want, "its crc32c does not match (corrupt)");
                data.to_vec()
            }
        };
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    struct Memory(BTreeMap<String, Vec<u8>>);

    impl Store for Memory {
        fn value_len(&self, key: &str) -> Result<Option<u64>> {
            Ok(self.0.get(key).map(|v| v.len() as u64))
        }
        fn read_range(&self, key: &str, start: u64, len: u64) -> Result<Vec<u8>> {
            Ok(self.0[key][start as usize..(start + len) as usize].to_vec())
        }
    }

    /// A 3x5 int32 array of value 10 * row + column in 2x2 chunks (the last row and column of
    /// chunks overhang it), the chunk at (1, 2) missing (fill value 0), each chunk's elements
    /// 10 * row + column of the array position they stand for, overhang included.
    #[test]
    fn chunks_overhanging_the_array_and_missing_ones() {
        let meta = serde_json::json!({
            "zarr_format": 3, "node_type": "array", "data_type": "int32", "shape": [3, 5],
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2, 2]}},
            "chunk_key_encoding": {"name": "default"}, "fill_value": 0,
            "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
        });
        let mut store = BTreeMap::new();
        store.insert("a/zarr.json".to_string(), serde_json::to_vec(&meta).unwrap());
        for (ci, cj) in [(0i32, 0i32), (0, 1), (0, 2), (1, 0), (1, 1)] {
            let mut bytes = Vec::new();
            for i in 0..2 {
                for j in 0..2 {
                    bytes.extend_from_slice(&(10 * (2 * ci + i) + 2 * cj + j).to_le_bytes());
                }
            }
            let crc = crc32c::crc32c(&bytes);
            bytes.extend_from_slice(&crc.to_le_bytes());
            store.insert(format!("a/c/{ci}/{cj}"), bytes);
        }
        let store = Memory(store);
        let tensor = Array::open(&store, "a").unwrap().read(&store).unwrap();
        let values: Vec<i32> = tensor.data.chunks(4).map(|b| i32::from_le_bytes(b.try_into().unwrap())).collect();
        let want: Vec<i32> =
            (0..3).flat_map(|i| (0..5).map(move |j| if i == 2 && j == 4 { 0 } else { 10 * i + j })).collect();
        assert_eq!(values, want);

        // A block reads only the chunks it overlaps: rows 0..2, columns 1..3 lie in chunks (0, 0)
        // and (0, 1); row 2, columns 3..5 in (1, 1) and the missing (1, 2).
        let array = Array::open(&store, "a").unwrap();
        for (start, shape, want, chunks) in [
            ([0, 1], [2, 2], vec![1, 2, 11, 12], vec!["a/c/0/0", "a/c/0/1"]),
            ([2, 3], [1, 2], vec![23, 0], vec!["a/c/1/1"]),
        ] {
            let counting = Counting { store: &store, read: Default::default() };
            let block = array.read_block(&counting, &start, &shape).unwrap();
            assert_eq!(block.dims, shape.map(|d| d as i64));
            let values: Vec<i32> = block.data.chunks(4).map(|b| i32::from_le_bytes(b.try_into().unwrap())).collect();
            let keys: BTreeSet<String> = counting.read.into_inner().into_iter().map(|(key, _)| key).collect();
            assert_eq!((values, keys), (want, chunks.iter().map(|k| k.to_string()).collect()));
        }
        let e = array.read_block(&store, &[2, 0], &[2, 1]).unwrap_err().to_string();
        assert!(e.contains("the block [2, 1] at [2, 0] is not inside the array's shape [3, 5]"), "{e}");
    }

    /// A 4x4 int32 array of value 10 * row + column in one shard of 2x2 inner chunks (index at
    /// the end, with its CRC32C), as TensorStore writes a shard: a block reads the shard's index
    /// and only the inner chunks it overlaps.
    #[test]
    fn a_block_of_a_shard_reads_only_its_inner_chunks() {
        let meta = serde_json::json!({
            "zarr_format": 3, "node_type": "array", "data_type": "int32", "shape": [4, 4],
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4, 4]}},
            "chunk_key_encoding": {"name": "default"}, "fill_value": 0,
            "codecs": [{"name": "sharding_indexed", "configuration": {
                "chunk_shape": [2, 2],
                "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
                "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
                "index_location": "end"}}],
        });
        let (mut shard, mut index) = (Vec::new(), Vec::new());
        for (ci, cj) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
            index.extend_from_slice(&(shard.len() as u64).to_le_bytes());
            for (i, j) in [(0i32, 0i32), (0, 1), (1, 0), (1, 1)] {
                shard.extend_from_slice(&(10 * (2 * ci + i) + 2 * cj + j).to_le_bytes());
            }
            index.extend_from_slice(&16u64.to_le_bytes());
        }
        let crc = crc32c::crc32c(&index);
        index.extend_from_slice(&crc.to_le_bytes());
        shard.extend_from_slice(&index);
        let mut store = BTreeMap::new();
        store.insert("a/zarr.json".to_string(), serde_json::to_vec(&meta).unwrap());
        store.insert("a/c/0/0".to_string(), shard);
        let store = Memory(store);
        let array = Array::open(&store, "a").unwrap();
        let counting = Counting { store: &store, read: Default::default() };
        // Rows 1..3, column 2: inner chunks (0, 1) at byte 16 and (1, 1) at byte 48; the index at 64.
        let block = array.read_block(&counting, &[1, 2], &[2, 1]).unwrap();
        assert_eq!(block.data, [12i32, 22].map(i32::to_le_bytes).concat());
        assert_eq!(counting.starts(), [16, 48, 64]);

        // Two blocks that share inner chunk (0, 0): rows 0..2 of column 0, and row 1. Each inner
        // chunk they overlap is read once, and each block is what it is read alone.
        let counting = Counting { store: &store, read: Default::default() };
        let wanted = [(vec![0, 0], vec![2, 1]), (vec![1, 0], vec![1, 4])];
        let blocks = array.read_blocks(&counting, &wanted).unwrap();
        assert_eq!(counting.starts(), [0, 16, 64]);
        assert_eq!(blocks[0].data, [0i32, 10].map(i32::to_le_bytes).concat());
        assert_eq!(blocks[1].data, [10i32, 11, 12, 13].map(i32::to_le_bytes).concat());
        for ((start, shape), block) in wanted.iter().zip(&blocks) {
            assert_eq!(block, &array.read_block(&store, start, shape).unwrap());
        }
    }

    /// A store that notes the key and start of each range read.
    struct Counting<'a> {
        store: &'a Memory,
        read: std::cell::RefCell<Vec<(String, u64)>>,
    }

    impl Counting<'_> {
        /// The start of every range read, in order of the start (a range read twice: twice).
        fn starts(&self) -> Vec<u64> {
            let mut starts: Vec<u64> = self.read.borrow().iter().map(|(_, start)| *start).collect();
            starts.sort();
            starts
        }
    }

    impl Store for Counting<'_> {
        fn value_len(&self, key: &str) -> Result<Option<u64>> {
            self.store.value_len(key)
        }
        fn read_range(&self, key: &str, start: u64, len: u64) -> Result<Vec<u8>> {
            self.read.borrow_mut().push((key.to_string(), start));
            self.store.read_range(key, start, len)
        }
    }

    #[test]
    fn unsupported_codecs_and_types_are_named() {
        let e = codecs(
            &serde_json::json!([{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "gzip"}]),
            DType::F32,
            1,
        )
        .unwrap_err();
        assert!(e.to_string().contains("codec {\"name\":\"gzip\"} is not supported"), "{e}");
        let e = codecs(&serde_json::json!([{"name": "bytes", "configuration": {"endian": "big"}}]), DType::F32, 1)
            .unwrap_err();
        assert!(e.to_string().contains("endian Some(\"big\")"), "{e}");
        assert!(element_type("complex64").unwrap_err().to_string().contains("\"complex64\" is not supported"));
    }
}
