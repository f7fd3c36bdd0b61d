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

use crate::host::{copy_region, shape_string, whole, DType, HostTensor};

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

/// `[0:4096,512:1024]`: a block's ranges, as checkpoint files name a slice of an array. In
/// i128, so that the numbers of a manifest not yet checked show as they are.
pub fn ranges(bounds: &Bounds) -> String {
    let parts: Vec<String> = bounds.iter().map(|&(s, n)| format!("{s}:{}", s as i128 + n as i128)).collect();
    format!("[{}]", parts.join(","))
}

/// The most pieces [`check_tiling`] cuts an array into: a job's blocks of an array form a grid of
/// at most one piece per device, far fewer; this bounds the check's memory (64 MiB) whatever the
/// numbers of a manifest say.
const MOST_PIECES: usize = 1 << 24;

/// Checks that `blocks` tile an array of shape `dims` exactly: each lies inside it, no two
/// overlap, and every element is in one. The reason names the first block outside, or the first
/// two that overlap, or the first part that none holds. Bounded in time and memory by the
/// number of blocks, whatever their numbers: the edges of the blocks cut the array into a grid of
/// pieces (one per block for the grids of blocks a mesh gives), and each piece is claimed once.
pub fn check_tiling(dims: &[i64], blocks: &[Bounds]) -> Result<(), String> {
    if let Some(d) = dims.iter().find(|&&d| d < 0) {
        return Err(format!("dimension {d} is negative"));
    }
    for b in blocks {
        if b.len() != dims.len() {
            return Err(format!("the slice {} has {} dimensions, the array {}", ranges(b), b.len(), dims.len()));
        }
        if b.iter().zip(dims).any(|(&(start, n), &d)| start < 0 || n < 0 || start > d - n) {
            return Err(format!("the slice {} lies outside the array", ranges(b)));
        }
    }
    // (Not `elements`: the product of a manifest's numbers may overflow.)
    let blocks: Vec<&Bounds> = blocks.iter().filter(|b| b.iter().all(|&(_, n)| n > 0)).collect();
    // The cuts along each dimension: every block's edges, and the array's.
    let cuts: Vec<Vec<i64>> = (0..dims.len())
        .map(|axis| {
            let mut at: Vec<i64> = blocks.iter().flat_map(|b| [b[axis].0, b[axis].0 + b[axis].1]).collect();
            at.extend([0, dims[axis]]);
            at.sort_unstable();
            at.dedup();
            at
        })
        .collect();
    let pieces = cuts
        .iter()
        .try_fold(1usize, |n, at| n.checked_mul(at.len() - 1))
        .filter(|&n| n <= MOST_PIECES)
        .ok_or_else(|| format!("its {} slices cut it into more than {MOST_PIECES} pieces", blocks.len()))?;
    // Which block holds each piece (row-major): 0 for none, i + 1 for block i.
    let mut holder: Vec<u32> = vec![0; pieces];
    for (i, b) in blocks.iter().enumerate() {
        // The block's pieces: per dimension, the range of cut intervals it spans.
        let spans: Vec<(usize, usize)> = b
            .iter()
            .zip(&cuts)
            .map(|(&(start, n), at)| (at.partition_point(|&c| c < start), at.partition_point(|&c| c < start + n)))
            .collect();
        let mut piece: Vec<usize> = spans.iter().map(|s| s.0).collect();
        loop {
            let index = piece.iter().zip(&cuts).fold(0, |index, (&p, at)| index * (at.len() - 1) + p);
            if holder[index] != 0 {
                let other = blocks[holder[index] as usize - 1];
                return Err(format!("the slices {} and {} overlap", ranges(other), ranges(b)));
            }
            holder[index] = i as u32 + 1;
            // The next piece, the last dimension fastest; done after the last.
            let Some(axis) = (0..piece.len()).rev().find(|&a| piece[a] + 1 < spans[a].1) else { break };
            piece[axis] += 1;
            piece[axis + 1..].iter_mut().zip(&spans[axis + 1..]).for_each(|(p, s)| *p = s.0);
        }
    }
    match holder.iter().position(|&h| h == 0) {
        Some(gap) => Err(format!("no slice holds {}", ranges(&piece_bounds(gap, &cuts)))),
        None => Ok(()),
    }
}

/// The bounds of piece `index` (row-major) of the grid `cuts` draws.
fn piece_bounds(mut index: usize, cuts: &[Vec<i64>]) -> Bounds {
    let mut bounds: Bounds = cuts
        .iter()
        .rev()
        .map(|at| {
            let count = at.len() - 1;
            let p = index % count;
            index /= count;
            (at[p], at[p + 1] - at[p])
        })
        .collect();
    bounds.reverse();
    bounds
}

/// One array of a state: its global dtype and shape, and every device's block with the process
/// that holds it (the same list on every process).
#[derive(Clone, Debug, PartialEq)]
pub struct ArrayLayout {
    pub name: String,
    pub ty: DType,
    pub dims: Vec<i64>,
    /// `(process, block)` for every device of the job.
    pub blocks: Vec<(usize, Bounds)>,
}

impl ArrayLayout {
    /// An array held whole by process 0 alone.
    pub fn whole(name: &str, ty: DType, dims: &[i64]) -> ArrayLayout {
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
    pub ty: DType,
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

    /// Any exact tiling passes (a mesh's grid, bricks, a scalar, an empty array); an overlap, a
    /// gap or a block outside is named; absurd numbers cost no more than the blocks.
    #[test]
    fn tilings_are_checked_exactly_and_cheaply() {
        let grid: Vec<Bounds> = (0..4).flat_map(|r| (0..2).map(move |c| vec![(r * 2, 2), (c * 3, 3)])).collect();
        assert_eq!(check_tiling(&[8, 6], &grid), Ok(()));
        let bricks = [vec![(0, 2), (0, 4)], vec![(2, 2), (0, 1)], vec![(2, 2), (1, 3)]];
        assert_eq!(check_tiling(&[4, 4], &bricks), Ok(()));
        assert_eq!(check_tiling(&[], &[vec![]]), Ok(()));
        assert_eq!(check_tiling(&[0, 4], &[vec![(0, 0), (0, 4)]]), Ok(()));
        assert_eq!(check_tiling(&[], &[vec![], vec![]]), Err("the slices [] and [] overlap".into()));
        assert_eq!(check_tiling(&[4, 4], &bricks[..2]), Err("no slice holds [2:4,1:4]".into()));
        let outside = [vec![(0, 4), (2, i64::MAX)]];
        assert_eq!(
            check_tiling(&[4, 4], &outside),
            Err(format!("the slice [0:4,2:{}] lies outside the array", i64::MAX as i128 + 2))
        );
        // Single-element blocks staggered along a diagonal of a huge array: too many pieces.
        let diagonal: Vec<Bounds> = (0..5000).map(|i| vec![(i, 1), (i, 1)]).collect();
        let e = check_tiling(&[1 << 40, 1 << 40], &diagonal).unwrap_err();
        assert_eq!(e, format!("its 5000 slices cut it into more than {MOST_PIECES} pieces"));
    }

    #[test]
    fn replicas_are_written_once_and_shared_between_holders() {
        // 2 processes x 2 devices; "a" sharded over all 4 devices, "b" over the 2 devices of each
        // process (replicated across processes), "c" replicated everywhere.
        let rows = |n: i64, k: i64| -> Vec<Bounds> { (0..k).map(|i| vec![(i * n / k, n / k)]).collect() };
        let layout = |name: &str, blocks: Vec<Bounds>| ArrayLayout {
            name: name.into(),
            ty: DType::F32,
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
