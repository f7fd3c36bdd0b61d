//! TensorStore's OCDBT key-value store, read only: the newest version's keys and where each
//! value lies, from `manifest.ocdbt` and the B+tree nodes it leads to, each node one ranged read
//! of its data file; a value is read whole or by ranges without reading the rest of its file.
//!
//! The format is TensorStore's document `tensorstore/kvstore/ocdbt/index.rst` (google/tensorstore
//! commit bc4fbc11f69ee5379b2f611a934663006e1f573f): a manifest (header, optionally zstd body:
//! config and version tree, crc32c footer), B+tree nodes of the same framing, varints as
//! unsigned LEB128, tables stored column by column, keys prefix-compressed against the previous
//! key and relative to the prefix their path from the root implies, data file paths relative to
//! the database root, each node's table extending the path its parent reached it by.
//! Only the single-file manifest kind (what Orbax writes) is read; the numbered kind is refused
//! by name. Older versions (the version tree's nodes) are never needed: the newest version is
//! always among the manifest's inline versions.

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, ensure, Context, Result};

use crate::files::Location;
use crate::input::Limit;
use crate::storage;

pub(super) const MANIFEST_FILE: &str = "manifest.ocdbt";
pub(super) const MANIFEST_MAGIC: u32 = 0x0cdb_3a2a;
pub(super) const BTREE_MAGIC: u32 = 0x0cdb_20de;
/// The largest manifest read: its config and inline versions are a few hundred bytes.
const MANIFEST_LIMIT: Limit = Limit { bytes: 16 << 20, of: "an OCDBT manifest" };
/// The largest node decoded, compressed or not (TensorStore's default `max_decoded_node_bytes` is
/// 8 MiB; a node declares its own size, and this bounds what a corrupt one can make us allocate).
const NODE_LIMIT: u64 = 64 << 20;

/// Where a value lies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// Stored in its leaf node.
    Inline(Vec<u8>),
    /// `length` bytes at `offset` of the data file `file` (a path relative to the database root).
    Indirect { file: String, offset: u64, length: u64 },
}

impl Value {
    /// The value's size in bytes.
    pub fn size(&self) -> u64 {
        match self {
            Value::Inline(bytes) => bytes.len() as u64,
            Value::Indirect { length, .. } => *length,
        }
    }
}

/// The newest version of an OCDBT database: every key and where its value lies.
pub struct Ocdbt {
    root: Location,
    entries: BTreeMap<Vec<u8>, Value>,
}

impl Ocdbt {
    /// Whether `root` holds an OCDBT database (its `manifest.ocdbt`).
    pub fn is_database(root: &Location) -> Result<bool> {
        storage::is_file(&root.join(MANIFEST_FILE))
    }

    /// Reads the manifest at `root` and every B+tree node of its newest version.
    pub fn open(root: &Location) -> Result<Ocdbt> {
        let manifest_at = root.join(MANIFEST_FILE);
        let manifest = storage::read(&manifest_at, MANIFEST_LIMIT)?;
        let body = unframe(&manifest, MANIFEST_MAGIC).with_context(|| format!("{manifest_at}"))?;
        let newest = newest_root(&body).with_context(|| format!("{manifest_at}"))?;
        let mut db = Ocdbt { root: root.clone(), entries: BTreeMap::new() };
        if let Some(node) = newest {
            db.walk(&node, &[]).with_context(|| format!("the OCDBT database at {root}"))?;
        }
        Ok(db)
    }

    /// Every key, in order.
    pub fn keys(&self) -> impl Iterator<Item = &[u8]> {
        self.entries.keys().map(Vec::as_slice)
    }

    pub fn get(&self, key: &[u8]) -> Option<&Value> {
        self.entries.get(key)
    }

    /// Bytes `start..start + len` of the value of `key` (an error past its end).
    pub fn read_range(&self, key: &[u8], start: u64, len: u64) -> Result<Vec<u8>> {
        let name = String::from_utf8_lossy(key);
        let value = self.get(key).ok_or_else(|| anyhow!("{}: no key {name:?} in the OCDBT database", self.root))?;
        ensure!(
            start.checked_add(len).is_some_and(|end| end <= value.size()),
            "{}: bytes {start}..{} of {name:?}, a value of {} bytes",
            self.root,
            start.saturating_add(len),
            value.size()
        );
        match value {
            Value::Inline(bytes) => Ok(bytes[start as usize..(start + len) as usize].to_vec()),
            Value::Indirect { file, offset, .. } => {
                let at = self.root.join(file);
                let bytes = storage::read_range(&at, offset + start, len)?;
                ensure!(bytes.len() as u64 == len, "{at}: ends before the value of {name:?} (truncated data file)");
                Ok(bytes)
            }
        }
    }

    /// The whole value of `key`.
    pub fn read(&self, key: &[u8]) -> Result<Vec<u8>> {
        let len = self.get(key).map_or(0, Value::size);
        self.read_range(key, 0, len)
    }

    /// Reads the node `node` (whose keys all start with `prefix`) and, below it, its subtree.
    fn walk(&mut self, node: &NodeRef, prefix: &[u8]) -> Result<()> {
        ensure!(node.length <= NODE_LIMIT, "a B+tree node of {} bytes in {}", node.length, node.file);
        let at = self.root.join(&node.file);
        let bytes = storage::read_range(&at, node.offset, node.length)?;
        ensure!(bytes.len() as u64 == node.length, "{at}: ends before its B+tree node at byte {}", node.offset);
        let body =
            unframe(&bytes, BTREE_MAGIC).with_context(|| format!("the B+tree node at byte {} of {at}", node.offset))?;
        let mut r = Reader::new(&body);
        let height = r.u8()?;
        ensure!(height == node.height, "{at}: a B+tree node of height {height} where {} was expected", node.height);
        let files = r.data_file_table(&node.transitive)?;
        let n = r.varint_usize()?;
        let (keys, subtree_prefixes) = r.keys(n, height > 0)?;
        if height == 0 {
            let lengths = r.varints(n)?;
            let kinds = r.varints(n)?;
            let indirect: Vec<usize> = (0..n).filter(|&i| kinds[i] == 1).collect();
            if let Some(i) = (0..n).find(|&i| kinds[i] > 1) {
                bail!("{at}: value kind {} (0 inline, 1 out of line)", kinds[i]);
            }
            let ids = r.varints(indirect.len())?;
            let offsets = r.varints(indirect.len())?;
            let mut out_of_line = ids.into_iter().zip(offsets);
            for (i, key) in keys.into_iter().enumerate() {
                let value = if kinds[i] == 0 {
                    Value::Inline(r.bytes(lengths[i] as usize)?.to_vec())
                } else {
                    let (id, offset) = out_of_line.next().expect("one per indirect entry");
                    Value::Indirect { file: files.full_path(id)?, offset, length: lengths[i] }
                };
                self.entries.insert([prefix, &key].concat(), value);
            }
        } else {
            let ids = r.varints(n)?;
            let offsets = r.varints(n)?;
            let lengths = r.varints(n)?;
            // Three columns of statistics (keys, tree bytes, indirect bytes) end the node: unused.
            for (i, key) in keys.iter().enumerate() {
                let common = subtree_prefixes[i] as usize;
                ensure!(common <= key.len(), "{at}: a subtree prefix longer than its key");
                let child = NodeRef {
                    file: files.full_path(ids[i])?,
                    transitive: files.child_transitive(ids[i])?,
                    offset: offsets[i],
                    length: lengths[i],
                    height: height - 1,
                };
                self.walk(&child, &[prefix, &key[..common]].concat())?;
            }
        }
        Ok(())
    }
}

/// A B+tree node: where it lies, its height, and the path its data file table extends.
struct NodeRef {
    file: String,
    transitive: String,
    offset: u64,
    length: u64,
    height: u8,
}

/// The body of a manifest or node: checks its magic, length, version and crc32c, and
/// decompresses it (zstd) when its header says so.
fn unframe(bytes: &[u8], magic: u32) -> Result<Vec<u8>> {
    ensure!(bytes.len() >= 16, "{} bytes, too short for an OCDBT header and footer", bytes.len());
    let (framed, crc) = bytes.split_at(bytes.len() - 4);
    let want = u32::from_le_bytes(crc.try_into().expect("4 bytes"));
    ensure!(crc32c::crc32c(framed) == want, "its crc32c does not match (corrupt)");
    let mut r = Reader::new(framed);
    let got = u32::from_be_bytes(r.bytes(4)?.try_into().expect("4 bytes"));
    ensure!(got == magic, "magic {got:#010x}, not {magic:#010x} (not an OCDBT file)");
    let length = u64::from_le_bytes(r.bytes(8)?.try_into().expect("8 bytes"));
    ensure!(length == bytes.len() as u64, "declares {length} bytes but has {}", bytes.len());
    let version = r.varint()?;
    ensure!(version == 0, "format version {version} (maxrs reads version 0)");
    let compression = r.varint()?;
    let body = r.rest();
    match compression {
        0 => Ok(body.to_vec()),
        1 => {
            let mut out = Vec::new();
            std::io::Read::read_to_end(
                &mut std::io::Read::take(zstd::stream::Decoder::new(body)?, NODE_LIMIT + 1),
                &mut out,
            )
            .context("decompressing its zstd body")?;
            ensure!(out.len() as u64 <= NODE_LIMIT, "decompresses past {NODE_LIMIT} bytes");
            Ok(out)
        }
        other => bail!("compression format {other} (0 none, 1 zstd)"),
    }
}

/// The root node of the newest version in a manifest's body, `None` for an empty database.
fn newest_root(body: &[u8]) -> Result<Option<NodeRef>> {
    let mut r = Reader::new(body);
    r.bytes(16)?; // the database's uuid
    let kind = r.varint()?;
    ensure!(
        kind == 0,
        "manifest kind {kind}: the numbered manifest kind is not supported (maxrs reads kind 0, single)"
    );
    r.varint()?; // max_inline_value_bytes
    r.varint()?; // max_decoded_node_bytes
    r.u8()?; // version_tree_arity_log2
    match r.varint()? {
        0 => {}
        1 => drop(r.bytes(4)?), // the zstd level a writer uses
        other => bail!("compression method {other} (0 none, 1 zstd)"),
    }
    let files = r.data_file_table("")?;
    let n = r.varint_usize()?;
    let generations = r.varints(n)?;
    let heights: Vec<u8> = (0..n).map(|_| r.u8()).collect::<Result<_>>()?;
    let ids = r.varints(n)?;
    let offsets = r.varints(n)?;
    let lengths = r.varints(n)?;
    let newest = (0..n).max_by_key(|&i| generations[i]);
    let Some(i) = newest else { return Ok(None) };
    if lengths[i] == 0 {
        return Ok(None);
    }
    Ok(Some(NodeRef {
        file: files.full_path(ids[i])?,
        transitive: files.child_transitive(ids[i])?,
        offset: offsets[i],
        length: lengths[i],
        height: heights[i],
    }))
}

/// A node's data file table: each file's path and base path, relative to the database root.
struct DataFiles {
    transitive: String,
    /// `(base_path, path)`, `base_path` a prefix of `path`.
    files: Vec<(String, String)>,
}

impl DataFiles {
    fn get(&self, id: u64) -> Result<&(String, String)> {
        self.files.get(id as usize).ok_or_else(|| anyhow!("data file {id} of a table of {}", self.files.len()))
    }

    fn full_path(&self, id: u64) -> Result<String> {
        Ok(format!("{}{}", self.transitive, self.get(id)?.1))
    }

    fn child_transitive(&self, id: u64) -> Result<String> {
        Ok(format!("{}{}", self.transitive, self.get(id)?.0))
    }
}

/// Little cursor over a decoded body.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes, at: 0 }
    }

    fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&end| end <= self.bytes.len());
        let end = end.ok_or_else(|| anyhow!("truncated: {n} bytes wanted at byte {}", self.at))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn rest(&self) -> &'a [u8] {
        &self.bytes[self.at..]
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.bytes(1)?[0])
    }

    /// Unsigned LEB128, at most 64 bits.
    fn varint(&mut self) -> Result<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.u8()?;
            let bits = u64::from(byte & 0x7f);
            ensure!(shift < 63 || bits <= 1, "a varint past 64 bits");
            value |= bits << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        bail!("a varint past 64 bits")
    }

    fn varint_usize(&mut self) -> Result<usize> {
        let n = self.varint()?;
        // Every counted item takes at least one byte: a count past the rest is corrupt.
        ensure!(n <= (self.bytes.len() - self.at) as u64, "a count of {n} in {} bytes", self.bytes.len() - self.at);
        Ok(n as usize)
    }

    fn varints(&mut self, n: usize) -> Result<Vec<u64>> {
        (0..n).map(|_| self.varint()).collect()
    }

    /// `n` prefix-compressed keys: prefix lengths (`n - 1`), suffix lengths, for an interior
    /// node each child's `subtree_common_prefix_length`, then the suffixes.
    fn keys(&mut self, n: usize, interior: bool) -> Result<(Vec<Vec<u8>>, Vec<u64>)> {
        let prefixes = self.varints(n.saturating_sub(1))?;
        let suffixes = self.varints(n)?;
        let subtree_prefixes = if interior { self.varints(n)? } else { Vec::new() };
        let mut keys: Vec<Vec<u8>> = Vec::with_capacity(n);
        for i in 0..n {
            let mut key = match i {
                0 => Vec::new(),
                _ => {
                    let previous = &keys[i - 1];
                    let common = prefixes[i - 1] as usize;
                    ensure!(common <= previous.len(), "a key prefix longer than the previous key");
                    previous[..common].to_vec()
                }
            };
            key.extend_from_slice(self.bytes(suffixes[i] as usize)?);
            keys.push(key);
        }
        Ok((keys, subtree_prefixes))
    }

    /// Data file table: count, prefix lengths, suffix lengths, base path lengths, suffixes.
    fn data_file_table(&mut self, transitive: &str) -> Result<DataFiles> {
        let n = self.varint_usize()?;
        let prefixes = self.varints(n.saturating_sub(1))?;
        let suffixes = self.varints(n)?;
        let bases = self.varints(n)?;
        let mut files: Vec<(String, String)> = Vec::with_capacity(n);
        for i in 0..n {
            let mut path = match i {
                0 => Vec::new(),
                _ => {
                    let previous = files[i - 1].1.as_bytes();
                    let common = prefixes[i - 1] as usize;
                    ensure!(common <= previous.len(), "a data file path prefix longer than the previous path");
                    previous[..common].to_vec()
                }
            };
            path.extend_from_slice(self.bytes(suffixes[i] as usize)?);
            let path = String::from_utf8(path).map_err(|_| anyhow!("a data file path that is not UTF-8"))?;
            let base = bases[i] as usize;
            ensure!(base <= path.len() && path.is_char_boundary(base), "data file {path:?}: base path of {base} bytes");
            files.push((path[..base].to_string(), path));
        }
        for (_, path) in &files {
            let full = format!("{transitive}{path}");
            let escapes = full.starts_with('/') || full.split('/').any(|part| part == ".." || part == ".");
            ensure!(!escapes, "data file {full:?} is not a path inside the database");
        }
        Ok(DataFiles { transitive: transitive.to_string(), files })
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::fixture;
    use super::*;

    /// Key counts as TensorStore lists them (`ts.KvStore.open({"driver": "ocdbt", "base":
    /// "file://<items>"}).result().list()`, tensorstore 0.1.86): 138 keys in the train state's
    /// item (the zarr.json and chunk of its 69 arrays), 24 in the parameter-only one.
    #[test]
    fn lists_every_key_tensorstore_lists() {
        for (folder, count) in [("nnx/checkpoints/1/items", 138), ("nnx_params/0/items", 24)] {
            let db = Ocdbt::open(&fixture(folder)).unwrap();
            assert_eq!(db.keys().count(), count, "{folder}");
        }
        let db = Ocdbt::open(&fixture("nnx/checkpoints/1/items")).unwrap();
        // A 0-d array's one chunk is `c` (TensorStore lists `step/c`, 33 bytes).
        assert_eq!(db.get(b"step/c").map(Value::size), Some(33));
        let json = db.read(b"step/zarr.json").unwrap();
        assert!(String::from_utf8(json).unwrap().contains("\"data_type\":\"int32\""));
        let e = db.read_range(b"step/c", 30, 4).unwrap_err().to_string();
        assert!(e.contains("bytes 30..34 of \"step/c\", a value of 33 bytes"), "{e}");
    }

    #[test]
    fn a_corrupt_manifest_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut manifest = std::fs::read(fixture("nnx_params/0/items/manifest.ocdbt").local_path().unwrap()).unwrap();
        manifest[20] ^= 1;
        std::fs::write(dir.path().join(MANIFEST_FILE), &manifest).unwrap();
        let e = Ocdbt::open(&Location::Local(dir.path().to_path_buf())).err().unwrap();
        assert!(format!("{e:#}").contains("crc32c does not match"), "{e:#}");
    }
}
