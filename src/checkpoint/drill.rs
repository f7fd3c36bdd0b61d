//! `maxrs checkpoint-check`'s state: a small synthetic training state sharded over the devices
//! of a job as a real multi-host run holds it, whose every value is a function of (seed, step),
//! so that a checkpoint restored on any process count and mesh is compared element by element
//! (bit for bit) with what it must hold. No XLA program runs: the CPU plugin cannot run one
//! program across processes, and this checks everything around it (the parts, the commit, kills
//! mid-save, restores onto other meshes).
//!
//! The mesh: `processes` x `devices_per_process` devices, device d on process
//! d / devices_per_process, split `fsdp` ways (device d holds fsdp block d % fsdp; the other
//! axis replicates, as data parallelism does). With `fsdp == devices_per_process` every
//! process holds whole replicas (the seed job's `dcn_data_parallelism=2`).

use std::collections::BTreeMap;

use anyhow::{bail, Result};

use super::dir::{Expected, LoadedBlocks, Share};
use super::shards::{plan, ArrayLayout, Bounds, HostArray};
use crate::host::{block_of, whole, DType, HostTensor};

/// The arrays: name, dtype, shape and the dimension split over fsdp (`None`: replicated).
const ARRAYS: &[(&str, DType, &[i64], Option<usize>)] = &[
    ("params.token_embedder.embedding", DType::F32, &[128, 64], Some(0)),
    ("params.decoder.layers.mlp.wi", DType::BF16, &[3, 64, 48], Some(1)),
    ("params.decoder.decoder_norm.scale", DType::F32, &[64], None),
    ("opt_state.mu.token_embedder.embedding", DType::F32, &[128, 64], Some(0)),
    ("opt_state.mu.decoder.layers.mlp.wi", DType::F32, &[3, 64, 48], Some(1)),
    ("opt_state.count", DType::S32, &[], None),
];

/// The largest split: the sharded dimensions are all multiples of 64.
pub const MAX_FSDP: usize = 64;

/// How a job holds the state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mesh {
    pub processes: usize,
    pub devices_per_process: usize,
    pub fsdp: usize,
}

impl Mesh {
    /// Checks the split: `fsdp` divides the devices and at most [`MAX_FSDP`].
    pub fn new(processes: usize, devices_per_process: usize, fsdp: usize) -> Result<Mesh> {
        let devices = processes * devices_per_process;
        if devices_per_process == 0 || devices_per_process > 1024 {
            bail!("--devices-per-process {devices_per_process}: give 1 to 1024");
        }
        if fsdp == 0 || fsdp > MAX_FSDP || !MAX_FSDP.is_multiple_of(fsdp) || !devices.is_multiple_of(fsdp) {
            bail!(
                "--fsdp {fsdp}: give a power of two up to {MAX_FSDP} that divides the job's {devices} devices \
                 ({processes} processes x {devices_per_process})"
            );
        }
        Ok(Mesh { processes, devices_per_process, fsdp })
    }

    /// Every array's blocks per device, with the process holding it.
    pub fn layouts(&self) -> Vec<ArrayLayout> {
        let devices = self.processes * self.devices_per_process;
        ARRAYS
            .iter()
            .map(|&(name, ty, dims, split)| ArrayLayout {
                name: name.into(),
                ty,
                dims: dims.to_vec(),
                blocks: (0..devices)
                    .map(|d| {
                        let mut bounds = whole(dims);
                        if let Some(axis) = split {
                            let n = dims[axis] / self.fsdp as i64;
                            bounds[axis] = ((d % self.fsdp) as i64 * n, n);
                        }
                        (d / self.devices_per_process, bounds)
                    })
                    .collect(),
            })
            .collect()
    }

    /// The arrays a restore expects.
    pub fn expected(&self) -> Vec<Expected> {
        ARRAYS.iter().map(|&(name, ty, dims, _)| Expected { name: name.into(), ty, dims: dims.to_vec() }).collect()
    }

    /// The blocks `process`'s devices hold, by array.
    pub fn wanted(&self, process: usize) -> BTreeMap<String, Vec<Bounds>> {
        self.layouts().into_iter().map(|l| (l.name.clone(), l.blocks_of(process))).collect()
    }

    /// What `process` writes of the state after `step`: the blocks the write plan gives it.
    pub fn share(&self, seed: u64, step: u64, process: usize, data: serde_json::Value) -> Share {
        let layouts = self.layouts();
        let plan = plan(&layouts, self.processes);
        let mine = plan.of(process);
        let arrays = layouts
            .iter()
            .enumerate()
            .map(|(i, layout)| {
                let global = value(seed, step, i);
                let blocks =
                    mine.get(&layout.name).into_iter().flatten().map(|b| (b.clone(), block_of(&global, b))).collect();
                HostArray { name: layout.name.clone(), ty: layout.ty, dims: layout.dims.clone(), blocks }
            })
            .collect();
        Share { step: Some(step), arrays, model: model_keys(), data: Some(data) }
    }

    /// Compares what `process` restored with the state after `step`, element by element; the
    /// first difference is the error.
    pub fn verify(&self, seed: u64, step: u64, process: usize, loaded: &LoadedBlocks) -> Result<()> {
        let wanted = self.wanted(process);
        for (i, &(name, ..)) in ARRAYS.iter().enumerate() {
            let global = value(seed, step, i);
            let Some(array) = loaded.arrays.get(name) else { bail!("{name}: not restored") };
            for bounds in &wanted[name] {
                let want = block_of(&global, bounds);
                let got = array.block(bounds)?;
                if let Some(at) = want.data.iter().zip(&got.data).position(|(a, b)| a != b) {
                    bail!(
                        "{name}{}: byte {at} differs from the state after step {step} (restored {}, expected {})",
                        super::shards::ranges(bounds),
                        got.data[at],
                        want.data[at]
                    );
                }
            }
        }
        Ok(())
    }
}

/// The model keys the manifest records (the check's own, so that a real run's checkpoint is
/// never taken for one of its).
pub fn model_keys() -> BTreeMap<String, serde_json::Value> {
    BTreeMap::from([("checkpoint_check_state".to_string(), serde_json::json!(1))])
}

/// Array `index` of the state after `step`: every byte from a hash of (seed, step, index,
/// position), SplitMix64's finalizer.
fn value(seed: u64, step: u64, index: usize) -> HostTensor {
    let (_, ty, dims, _) = ARRAYS[index];
    let bytes = dims.iter().product::<i64>() as usize * ty.byte_size();
    let base = seed ^ step.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (index as u64).wrapping_mul(0xd1b5_4a32_d192_ed03);
    // A plain loop: the drill runs in every process of the tests' kill drills, in debug builds,
    // where an iterator chain per byte cost more than the checkpoint I/O.
    let mut data = Vec::with_capacity(bytes.next_multiple_of(8));
    for i in 0..bytes.div_ceil(8) as u64 {
        let mut z = base.wrapping_add(i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        data.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    data.truncate(bytes);
    HostTensor::new(ty, dims, data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::dir::{load_blocks, manifest_of, write_manifest, write_part};
    use crate::files::Location;

    /// Two processes write their parts of one directory; the manifest of both restores onto one
    /// process (whole arrays), four processes with fsdp 8, and the saving mesh itself, bit for
    /// bit; each restoring process reads only the slices that meet its blocks.
    #[test]
    fn parts_of_two_processes_restore_onto_other_meshes() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Location::Local(tmp.path().to_path_buf());
        let saving = Mesh::new(2, 2, 4).unwrap();
        let parts: Vec<_> = (0..2)
            .map(|p| write_part(&dir, &saving.share(7, 5, p, serde_json::json!({"process": p})), p, 2).unwrap())
            .collect();
        let manifest = manifest_of(&saving.share(7, 5, 0, serde_json::Value::Null), 2, parts).unwrap();
        assert_eq!(manifest.data_per_process, [serde_json::json!({"process": 0}), serde_json::json!({"process": 1})]);
        write_manifest(&dir, &manifest).unwrap();
        let files: Vec<&str> = manifest.files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            files,
            [
                "opt_state.0-of-2.safetensors",
                "params.0-of-2.safetensors",
                "opt_state.1-of-2.safetensors",
                "params.1-of-2.safetensors"
            ]
        );
        let total: u64 =
            ARRAYS.iter().map(|&(_, ty, dims, _)| dims.iter().product::<i64>() as u64 * ty.byte_size() as u64).sum();
        for (mesh, process) in [(Mesh::new(1, 1, 1).unwrap(), 0), (Mesh::new(4, 2, 8).unwrap(), 3), (saving, 1)] {
            let loaded = load_blocks(&dir, &mesh.expected(), &model_keys(), false, &mesh.wanted(process)).unwrap();
            mesh.verify(7, 5, process, &loaded).unwrap();
            if mesh.processes == 1 {
                assert_eq!(loaded.bytes_read, total);
            } else {
                assert!(loaded.bytes_read < total, "{mesh:?} read {} of {total} bytes", loaded.bytes_read);
            }
            assert!(mesh.verify(7, 4, process, &loaded).is_err(), "another step's state differs");
        }
        // A flipped byte inside a slice is found by that slice's checksum.
        let file = tmp.path().join("params.1-of-2.safetensors");
        let mut bytes = std::fs::read(&file).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&file, bytes).unwrap();
        let mesh = Mesh::new(1, 1, 1).unwrap();
        let err = load_blocks(&dir, &mesh.expected(), &model_keys(), false, &mesh.wanted(0)).err().unwrap();
        assert!(format!("{err:#}").contains("the file is corrupt"), "{err:#}");
    }

    #[test]
    fn a_missing_part_is_refused_before_the_manifest() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Location::Local(tmp.path().to_path_buf());
        let mesh = Mesh::new(2, 1, 2).unwrap();
        let part = write_part(&dir, &mesh.share(1, 0, 0, serde_json::Value::Null), 0, 2).unwrap();
        let err = manifest_of(&mesh.share(1, 0, 0, serde_json::Value::Null), 2, vec![part]).err().unwrap();
        assert!(format!("{err:#}").contains("not of all 2"), "{err:#}");
    }
}
