//! A state as the processes of a job hold it: each array cut into the blocks its sharding gives
//! the devices, each device on one process. Saving writes every distinct block once ([`plan`]:
//! replicas are skipped, and the owner of a block is one of the processes holding it, chosen so
//! that every process writes about the same number of bytes); restoring gives each process the
//! blocks its own devices need, whatever the mesh that saved them ([`HostArray::block`]).
//!
//! Orbax writes each shard once too, from the device whose `replica_id` is 0
//! (google/orbax `checkpoint/orbax/checkpoint/_src/serialization/type_handlers.py`, commit
//! 08ec2b4). That puts every replicated block on the first process: a job with data
//! parallelism across hosts (the seed job: `dcn_data_parallelism=2`) would write from one host.
//! Here the replicas' holders share the writing instead, which every process computes alike from
//! the layouts alone.

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Result};

use crate::host::{copy_region, shape_string, whole, ElementType, HostTensor};

pub use crate::host::Bounds;

/// The intersection of two blocks, `None` when it is empty.
pub fn intersect(a: &Bounds, b: &Bounds) -> Option<Bounds> {
    let region: Bounds = a
        .iter()
        .zip(b)
        .map(|(&(a0, an), &(b0, bn))| {
            let start = a0.max(b0);
            (start, (a0 + an).min(b0 + bn) - start)
        })
        .collect();
    region.iter().all(|&(_, n)| n > 0).then_some(region)
}

/// Elements in a block.
pub fn elements(bounds: &Bounds) -> i64 {
    bounds.iter().map(|b| b.1).product()
}

/// `[0:4096,512:1024]`: a block's ranges, as checkpoint files name a slice of an array.
pub fn ranges(bounds: &Bounds) -> String {
    let parts: Vec<String> = bounds.iter().map(|(s, n)| format!("{s}:{}", s + n)).collect();
    format!("[{}]", parts.join(","))
}

/// One array of a state: its global dtype and shape, and every device's block with the process
/// that holds it (the same list on every process).
#[derive(Clone, Debug, PartialEq)]
pub struct ArrayLayout {
    pub name: String,
    pub ty: ElementType,
    pub dims: Vec<i64>,
    /// `(process, block)` for every device of the job.
    pub blocks: Vec<(usize, Bounds)>,
}

impl ArrayLayout {
    /// An array held whole by process 0 alone.
    pub fn whole(name: &str, ty: ElementType, dims: &[i64]) -> ArrayLayout {
        ArrayLayout { name: name.into(), ty, dims: dims.to_vec(), blocks: vec![(0, whole(dims))] }
    }

    /// The distinct blocks `process`'s devices hold, in device order.
    pub fn blocks_of(&self, process: usize) -> Vec<Bounds> {
        let mut out: Vec<Bounds> = Vec::new();
        for (p, b) in &self.blocks {
            if *p == process && !out.contains(b) {
                out.push(b.clone());
            }
        }
        out
    }
}

/// Which process writes each distinct block of each array.
#[derive(Clone, Debug, PartialEq)]
pub struct WritePlan {
    /// Per array (layout order): its name and each distinct block with its writer.
    pub arrays: Vec<(String, Vec<(Bounds, usize)>)>,
    /// Bytes each process writes.
    pub bytes: Vec<u64>,
}

impl WritePlan {
    /// The blocks `process` writes, by array name (arrays it writes nothing of are left out).
    pub fn of(&self, process: usize) -> BTreeMap<String, Vec<Bounds>> {
        self.arrays
            .iter()
            .filter_map(|(name, blocks)| {
                let mine: Vec<Bounds> = blocks.iter().filter(|(_, p)| *p == process).map(|(b, _)| b.clone()).collect();
                (!mine.is_empty()).then(|| (name.clone(), mine))
            })
            .collect()
    }
}

/// Assigns each distinct block of `layouts` to one of the processes holding it: the one that
/// has been given the fewest bytes so far (the lowest index on a tie), going through the arrays
/// and their blocks in order. Deterministic, so every process computes the same plan.
pub fn plan(layouts: &[ArrayLayout], processes: usize) -> WritePlan {
    let mut bytes = vec![0u64; processes.max(1)];
    let arrays = layouts
        .iter()
        .map(|layout| {
            let mut distinct: Vec<(Bounds, Vec<usize>)> = Vec::new();
            for (p, b) in &layout.blocks {
                match distinct.iter_mut().find(|(d, _)| d == b) {
                    Some((_, holders)) if !holders.contains(p) => holders.push(*p),
                    Some(_) => {}
                    None => distinct.push((b.clone(), vec![*p])),
                }
            }
            let blocks = distinct
                .into_iter()
                .map(|(b, holders)| {
                    let size = elements(&b) as u64 * layout.ty.byte_size() as u64;
                    let writer = *holders.iter().min_by_key(|&&p| (bytes[p], p)).expect("a block has a holder");
                    bytes[writer] += size;
                    (b, writer)
                })
                .collect();
            (layout.name.clone(), blocks)
        })
        .collect();
    WritePlan { arrays, bytes }
}

/// What `process` of `processes` writes of the state `held` (the distinct blocks its devices
/// hold, laid out as `layouts` say): one process writes every array whole (so that its
/// `params.safetensors` is a parameters file by itself); in a job, each process the blocks the
/// write plan gives it.
pub fn to_write(
    layouts: &[ArrayLayout],
    held: Vec<HostArray>,
    process: usize,
    processes: usize,
) -> Result<Vec<HostArray>> {
    if processes == 1 {
        return held.into_iter().map(|a| Ok(HostArray::whole(&a.name, a.assemble()?))).collect();
    }
    let mine = plan(layouts, processes).of(process);
    held.into_iter()
        .map(|array| {
            let blocks = match mine.get(&array.name) {
                Some(bounds) => bounds.iter().map(|b| Ok((b.clone(), array.block(b)?))).collect::<Result<_>>()?,
                None => Vec::new(),
            };
            Ok(HostArray { blocks, ..array })
        })
        .collect()
}

/// Blocks of one array held on the host: a process's share to write, or what a restore read.
#[derive(Clone, Debug, PartialEq)]
pub struct HostArray {
    pub name: String,
    pub ty: ElementType,
    /// The global shape.
    pub dims: Vec<i64>,
    pub blocks: Vec<(Bounds, HostTensor)>,
}

impl HostArray {
    /// The whole array as one block.
    pub fn whole(name: &str, tensor: HostTensor) -> HostArray {
        HostArray {
            name: name.into(),
            ty: tensor.ty,
            dims: tensor.dims.clone(),
            blocks: vec![(whole(&tensor.dims), tensor)],
        }
    }

    /// The block at `bounds`, cut from a held block that contains it.
    pub fn block(&self, bounds: &Bounds) -> Result<HostTensor> {
        let (at, held) = self
            .blocks
            .iter()
            .find(|(at, _)| intersect(at, bounds).as_ref() == Some(bounds))
            .ok_or_else(|| anyhow!("{}: no block {} was read", self.name, ranges(bounds)))?;
        if at == bounds {
            return Ok(held.clone());
        }
        let dims: Vec<i64> = bounds.iter().map(|b| b.1).collect();
        let mut data = vec![0u8; elements(bounds) as usize * self.ty.byte_size()];
        copy_region(&mut data, bounds, &held.data, at, bounds, self.ty.byte_size());
        Ok(HostTensor::new(self.ty, &dims, data))
    }

    /// The whole array, from blocks that cover it.
    pub fn assemble(&self) -> Result<HostTensor> {
        let all = whole(&self.dims);
        if self.blocks.len() == 1 && self.blocks[0].0 == all {
            return Ok(self.blocks[0].1.clone());
        }
        let mut data = vec![0u8; elements(&all) as usize * self.ty.byte_size()];
        let mut covered = 0;
        for (at, block) in &self.blocks {
            copy_region(&mut data, &all, &block.data, at, at, self.ty.byte_size());
            covered += elements(at);
        }
        if covered != elements(&all) {
            bail!("{}: its blocks cover {covered} of {} elements", self.name, shape_string(self.ty, &self.dims));
        }
        Ok(HostTensor::new(self.ty, &self.dims, data))
    }

    pub fn bytes(&self) -> u64 {
        self.blocks.iter().map(|(_, t)| t.data.len() as u64).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `[rows, cols]` with element (r, c) = r * 100 + c.
    fn grid(rows: i64, cols: i64) -> HostTensor {
        let values: Vec<i32> = (0..rows).flat_map(|r| (0..cols).map(move |c| (r * 100 + c) as i32)).collect();
        HostTensor::from_i32(&[rows, cols], &values)
    }

    #[test]
    fn blocks_cut_and_reassemble_across_meshes() {
        let global = grid(4, 6);
        // Saved as two row blocks; read as three column blocks.
        let saved = HostArray {
            name: "w".into(),
            ty: global.ty,
            dims: vec![4, 6],
            blocks: vec![
                (vec![(0, 2), (0, 6)], crate::host::block_of(&global, &[(0, 2), (0, 6)])),
                (vec![(2, 2), (0, 6)], crate::host::block_of(&global, &[(2, 2), (0, 6)])),
            ],
        };
        assert_eq!(saved.assemble().unwrap(), global);
        let rows = saved.block(&vec![(1, 1), (0, 6)]).unwrap();
        assert_eq!(rows.to_i32(), [100, 101, 102, 103, 104, 105]);
        assert!(saved.block(&vec![(1, 2), (0, 2)]).is_err(), "a block across two saved blocks is not held whole");
        let mut column = vec![0u8; 4 * 2 * 4];
        let want = vec![(0, 4), (2, 2)];
        for (at, block) in &saved.blocks {
            let region = intersect(at, &want).unwrap();
            copy_region(&mut column, &want, &block.data, at, &region, 4);
        }
        assert_eq!(HostTensor::new(global.ty, &[4, 2], column).to_i32(), [2, 3, 102, 103, 202, 203, 302, 303]);
    }

    #[test]
    fn replicas_are_written_once_and_shared_between_holders() {
        // 2 processes x 2 devices; "a" sharded over all 4 devices, "b" over the 2 devices of each
        // process (replicated across processes), "c" replicated everywhere.
        let rows = |n: i64, k: i64| -> Vec<Bounds> { (0..k).map(|i| vec![(i * n / k, n / k)]).collect() };
        let layout = |name: &str, blocks: Vec<Bounds>| ArrayLayout {
            name: name.into(),
            ty: ElementType::F32,
            dims: vec![8],
            blocks: [0, 0, 1, 1].into_iter().zip(blocks).collect(),
        };
        let b = rows(8, 2);
        let layouts = [
            layout("a", rows(8, 4)),
            layout("b", vec![b[0].clone(), b[1].clone(), b[0].clone(), b[1].clone()]),
            layout("c", vec![vec![(0, 8)]; 4]),
        ];
        let plan = plan(&layouts, 2);
        let writers: Vec<Vec<usize>> = plan.arrays.iter().map(|(_, bs)| bs.iter().map(|(_, p)| *p).collect()).collect();
        // "a": each block by its only holder; "b": the first block to the process with fewer bytes
        // (a tie: process 0), the second to process 1; "c": to the one with fewer bytes.
        assert_eq!(writers, [vec![0, 0, 1, 1], vec![0, 1], vec![0]]);
        assert_eq!(plan.bytes, [4 * (4 + 4 + 8), 4 * (4 + 4)]);
        assert_eq!(plan.of(1).keys().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(layouts[1].blocks_of(1), b);
    }
}
