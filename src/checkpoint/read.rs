//! Reading the blocks of an array out of a checkpoint's slices: each slice that meets a wanted
//! block is read once (a ranged read of its bytes, checked against its CRC32C; a version-1 file
//! is read whole once and checked against its own CRC32C) and the parts of the wanted blocks it
//! holds are copied out of it. A process restoring onto a mesh other than the saving one thus
//! reads the slices its devices need, not whole arrays.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{anyhow, bail, Context, Result};

use super::manifest::{self, ArrayEntry, Manifest, Slice};
use super::shards::{elements, intersect, Bounds, HostArray};
use super::tensor_file::read_safetensors;
use crate::files::Location;
use crate::host::params_io::to_dtype;
use crate::host::{copy_region, DType, HostTensor};
use crate::storage;

/// Reads slices of one checkpoint directory whose manifest `dir::read_manifest` read (and
/// checked), checking each file's size once.
pub struct SliceReader<'a> {
    dir: &'a Location,
    manifest: &'a Manifest,
    /// Files whose size was checked.
    sized: BTreeSet<String>,
    /// Version-1 files, read whole: their tensors by key.
    whole_files: BTreeMap<String, BTreeMap<String, HostTensor>>,
    pub bytes_read: u64,
}

impl<'a> SliceReader<'a> {
    pub fn new(dir: &'a Location, manifest: &'a Manifest) -> SliceReader<'a> {
        SliceReader { dir, manifest, sized: BTreeSet::new(), whole_files: BTreeMap::new(), bytes_read: 0 }
    }

    /// The blocks `wanted` of `array` (in its saved dtype), each assembled from the slices that
    /// meet it.
    pub fn read(&mut self, array: &ArrayEntry, wanted: &[Bounds]) -> Result<HostArray> {
        let ty = super::tensor_file::element_type(&array.dtype).ok_or_else(|| {
            anyhow!(
                "checkpoint {}: array {} has dtype {}, which maxrs does not read",
                self.dir,
                array.name,
                array.dtype
            )
        })?;
        let elem = ty.byte_size();
        // `read_manifest` checked that the slices tile the array exactly, so every element of a
        // wanted block is copied once.
        let mut blocks: Vec<(Bounds, Vec<u8>)> =
            wanted.iter().map(|b| (b.clone(), vec![0u8; elements(b) as usize * elem])).collect();
        for slice in array.slices() {
            if !blocks.iter().any(|(b, _)| intersect(b, &slice.bounds).is_some()) {
                continue;
            }
            let held = self.slice_bytes(array, ty, &slice)?;
            for (b, data) in &mut blocks {
                if let Some(region) = intersect(b, &slice.bounds) {
                    copy_region(data, b, &held, &slice.bounds, &region, elem);
                }
            }
        }
        let blocks = blocks
            .into_iter()
            .map(|(b, data)| {
                let dims: Vec<i64> = b.iter().map(|r| r.1).collect();
                (b, HostTensor::new(ty, &dims, data))
            })
            .collect();
        Ok(HostArray { name: array.name.clone(), ty, dims: array.shape.clone(), blocks })
    }

    /// The bytes of one slice, checked.
    fn slice_bytes(&mut self, array: &ArrayEntry, ty: DType, slice: &Slice) -> Result<Vec<u8>> {
        let location = self.dir.join(&slice.file);
        let entry =
            self.manifest.files.iter().find(|f| f.name == slice.file).expect("read_manifest checked the slices' files");
        let Some((offset, crc)) = &slice.located else {
            return self.whole_file_tensor(array, ty, slice, entry);
        };
        if !self.sized.contains(&slice.file) {
            match storage::size(&location)? {
                None => bail!("checkpoint {}: {} is missing", self.dir, slice.file),
                Some(n) if n != entry.bytes => bail!(
                    "{location}: {n} bytes, the manifest says {}: the file is truncated or was changed",
                    entry.bytes
                ),
                Some(_) => {}
            }
            self.sized.insert(slice.file.clone());
        }
        let len = elements(&slice.bounds) as u64 * ty.byte_size() as u64;
        let bytes = storage::read_range(&location, *offset, len)?;
        if bytes.len() as u64 != len {
            bail!("{location}: truncated: it ends {} bytes into the {len} bytes at offset {offset}", bytes.len());
        }
        self.bytes_read += len;
        let got = manifest::crc_hex(crc32c::crc32c(&bytes));
        if &got != crc {
            bail!("{location}: the bytes of {} (tensor `{}`) have CRC32C {got}, the manifest says {crc}: the file is corrupt", array.name, slice.key);
        }
        Ok(bytes)
    }

    /// A tensor of a version-1 file (read whole once, checked against the file's CRC32C).
    fn whole_file_tensor(
        &mut self,
        array: &ArrayEntry,
        ty: DType,
        slice: &Slice,
        entry: &manifest::FileEntry,
    ) -> Result<Vec<u8>> {
        if !self.whole_files.contains_key(&slice.file) {
            let location = self.dir.join(&slice.file);
            let mut input = storage::open_read(&location)
                .with_context(|| format!("checkpoint {}: {} is missing", self.dir, slice.file))?;
            let read = read_safetensors(&mut input, &location.to_string())?;
            self.bytes_read += read.digest.bytes;
            if read.digest.bytes != entry.bytes {
                bail!(
                    "{location}: {} bytes, the manifest says {}: the file is truncated or was changed",
                    read.digest.bytes,
                    entry.bytes
                );
            }
            let crc = manifest::crc_hex(read.digest.crc32c);
            if crc != entry.crc32c {
                bail!("{location}: CRC32C {crc}, the manifest says {}: the file is corrupt", entry.crc32c);
            }
            self.whole_files.insert(slice.file.clone(), read.tensors);
        }
        let tensors = self.whole_files.get_mut(&slice.file).expect("inserted above");
        let location = self.dir.join(&slice.file);
        let tensor = tensors.remove(&slice.key).ok_or_else(|| {
            anyhow!("{location}: has no tensor `{}` (array {}) that the manifest lists", slice.key, array.name)
        })?;
        if tensor.dims != array.shape || tensor.ty != ty {
            bail!(
                "{location}: tensor `{}` is {}, the manifest says {:?}{:?}",
                slice.key,
                tensor.shape_string(),
                to_dtype(ty),
                array.shape
            );
        }
        Ok(tensor.data)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use crate::checkpoint::dir::{load, read_manifest, save, Expected, Snapshot};
    use crate::files::Location;
    use crate::host::HostTensor;

    /// A checkpoint of version 1 (one process; each array named by its file and key, no slices)
    /// still restores: its files are read whole and checked against their own CRC32C.
    #[test]
    fn version_1_checkpoints_still_restore() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Location::Local(tmp.path().join("7"));
        let w = HostTensor::from_f32(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let count = HostTensor::from_i32(&[], &[8]);
        let arrays = vec![("params.w".to_string(), w.clone()), ("opt_state.count".to_string(), count.clone())];
        save(&dir, &Snapshot { step: Some(7), arrays, model: BTreeMap::new(), data: None }).unwrap();
        // The same directory as version 1 wrote it: the files are the same, the manifest names
        // one file and key per array.
        let mut manifest = serde_json::to_value(read_manifest(&dir).unwrap()).unwrap();
        manifest["version"] = 1.into();
        for array in manifest["arrays"].as_array_mut().unwrap() {
            let slice = array["slices"][0].clone();
            array["file"] = slice["file"].clone();
            array["key"] = slice["key"].clone();
            array.as_object_mut().unwrap().remove("slices");
        }
        std::fs::write(tmp.path().join("7/manifest.json"), serde_json::to_vec(&manifest).unwrap()).unwrap();
        let expected = [
            Expected { name: "params.w".into(), ty: w.ty, dims: w.dims.clone() },
            Expected { name: "opt_state.count".into(), ty: count.ty, dims: vec![] },
        ];
        let loaded = load(&dir, &expected, &BTreeMap::new(), false).unwrap();
        assert_eq!(loaded.manifest.version, 1);
        assert_eq!((&loaded.arrays["params.w"], &loaded.arrays["opt_state.count"]), (&w, &count));
    }
}
