//! Block copies between a global host array and the dense blocks its sharding gives each
//! device: [`shard`] cuts a device's block out, [`assemble`] puts the blocks back together;
//! [`copy_region`] copies any region between two blocks of one array (a checkpoint's saved
//! slices and the blocks a restoring process needs).

use anyhow::{anyhow, Result};

/// A block of an array: (start, length) per dimension, in the global array's coordinates.
pub type Bounds = Vec<(i64, i64)>;

use super::HostTensor;
use crate::sharding::{Mesh, PartitionSpec};

/// The block of `global` that the device at mesh position `pos` holds under `spec`.
pub fn shard(global: &HostTensor, mesh: &Mesh, spec: &PartitionSpec, pos: usize) -> Result<HostTensor> {
    let bounds = mesh.shard_bounds(spec, &global.dims, pos)?;
    Ok(block_of(global, &bounds))
}

/// The dense block of `array` at `bounds` ((start, length) per dimension).
pub fn block_of(array: &HostTensor, bounds: &[(i64, i64)]) -> HostTensor {
    let dims: Vec<i64> = bounds.iter().map(|b| b.1).collect();
    let mut data = vec![0u8; dims.iter().product::<i64>() as usize * array.ty.byte_size()];
    copy_region(&mut data, bounds, &array.data, &whole(&array.dims), bounds, array.ty.byte_size());
    HostTensor::new(array.ty, &dims, data)
}

/// The bounds of a whole array of shape `dims`.
pub fn whole(dims: &[i64]) -> Vec<(i64, i64)> {
    dims.iter().map(|&d| (0, d)).collect()
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
        let bounds = mesh.shard_bounds(spec, dims, pos)?;
        copy_region(&mut data, &whole(dims), &block.data, &bounds, &bounds, ty.byte_size());
    }
    Ok(HostTensor::new(ty, dims, data))
}

/// Copies `region` ((start, length) per dimension, in the global array's coordinates) from the
/// row-major dense block `src`, which covers `src_at`, into the dense block `dst`, which covers
/// `dst_at`; both contain the region. One contiguous run of the last dimension at a time.
pub fn copy_region(
    dst: &mut [u8],
    dst_at: &[(i64, i64)],
    src: &[u8],
    src_at: &[(i64, i64)],
    region: &[(i64, i64)],
    elem: usize,
) {
    let rank = region.len();
    if rank == 0 {
        dst[..elem].copy_from_slice(&src[..elem]);
        return;
    }
    if region.iter().any(|r| r.1 == 0) {
        return;
    }
    let strides = |at: &[(i64, i64)]| {
        let mut strides = vec![1i64; rank];
        for d in (0..rank - 1).rev() {
            strides[d] = strides[d + 1] * at[d + 1].1;
        }
        strides
    };
    let (src_strides, dst_strides) = (strides(src_at), strides(dst_at));
    let offset = |at: &[(i64, i64)], strides: &[i64], index: &[i64]| -> usize {
        let position: i64 =
            (0..rank).map(|d| (region[d].0 - at[d].0 + if d < rank - 1 { index[d] } else { 0 }) * strides[d]).sum();
        position as usize * elem
    };
    let run = region[rank - 1].1 as usize * elem;
    let rows: i64 = region[..rank - 1].iter().map(|b| b.1).product();
    let mut index = vec![0i64; rank - 1];
    for _ in 0..rows {
        let (s, d) = (offset(src_at, &src_strides, &index), offset(dst_at, &dst_strides, &index));
        dst[d..d + run].copy_from_slice(&src[s..s + run]);
        for d in (0..rank - 1).rev() {
            index[d] += 1;
            if index[d] < region[d].1 {
                break;
            }
            index[d] = 0;
        }
    }
}
