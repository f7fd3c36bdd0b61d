//! Block copies between a global host array and the dense blocks its sharding gives each
//! device: [`shard`] cuts a device's block out, [`assemble`] puts the blocks back together.

use anyhow::{anyhow, Result};

use super::HostTensor;
use crate::sharding::{Mesh, PartitionSpec};

/// The block of `global` that the device at mesh position `pos` holds under `spec`.
pub fn shard(global: &HostTensor, mesh: &Mesh, spec: &PartitionSpec, pos: usize) -> Result<HostTensor> {
    let bounds = mesh.shard_bounds(spec, &global.dims, pos).map_err(|e| anyhow!(e))?;
    Ok(block_of(global, &bounds))
}

/// The dense block of `array` at `bounds` ((start, length) per dimension).
pub(crate) fn block_of(array: &HostTensor, bounds: &[(i64, i64)]) -> HostTensor {
    let dims: Vec<i64> = bounds.iter().map(|b| b.1).collect();
    let mut data = vec![0u8; dims.iter().product::<i64>() as usize * array.ty.byte_size()];
    copy_block(&mut data, &array.data, &array.dims, bounds, array.ty.byte_size(), Direction::Gather);
    HostTensor::new(array.ty, &dims, data)
}

/// The global array of shape `dims` from per-device blocks (`shards[d]` at mesh position
/// `positions[d]`). Replicated copies are written over each other: they are equal.
pub fn assemble(
    shards: &[HostTensor],
    positions: &[usize],
    mesh: &Mesh,
    spec: &PartitionSpec,
    dims: &[i64],
) -> Result<HostTensor> {
    let ty = shards.first().ok_or_else(|| anyhow!("no shards"))?.ty;
    let mut data = vec![0u8; dims.iter().product::<i64>() as usize * ty.byte_size()];
    for (block, &pos) in shards.iter().zip(positions) {
        let bounds = mesh.shard_bounds(spec, dims, pos).map_err(|e| anyhow!(e))?;
        copy_block(&mut data, &block.data, dims, &bounds, ty.byte_size(), Direction::Scatter);
    }
    Ok(HostTensor::new(ty, dims, data))
}

enum Direction {
    /// Copy the block of the global array (`global`) into `block`.
    Gather,
    /// Copy `block` into its place in the global array.
    Scatter,
}

/// Copies between a row-major global array of shape `dims` and the dense block at `bounds`
/// ((start, length) per dimension), one contiguous run of the last dimension at a time.
fn copy_block(dst: &mut [u8], src: &[u8], dims: &[i64], bounds: &[(i64, i64)], elem: usize, direction: Direction) {
    let rank = dims.len();
    if rank == 0 {
        dst[..elem].copy_from_slice(&src[..elem]);
        return;
    }
    let mut strides = vec![1i64; rank];
    for d in (0..rank - 1).rev() {
        strides[d] = strides[d + 1] * dims[d + 1];
    }
    let run = bounds[rank - 1].1 as usize * elem;
    let rows: i64 = bounds[..rank - 1].iter().map(|b| b.1).product();
    let mut index = vec![0i64; rank - 1];
    for row in 0..rows as usize {
        let global: i64 = (0..rank).map(|d| (bounds[d].0 + if d < rank - 1 { index[d] } else { 0 }) * strides[d]).sum();
        let (g, b) = (global as usize * elem, row * run);
        match direction {
            Direction::Gather => dst[b..b + run].copy_from_slice(&src[g..g + run]),
            Direction::Scatter => dst[g..g + run].copy_from_slice(&src[b..b + run]),
        }
        for d in (0..rank - 1).rev() {
            index[d] += 1;
            if index[d] < bounds[d].1 {
                break;
            }
            index[d] = 0;
        }
    }
}
