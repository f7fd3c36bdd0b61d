//! Host arrays: how maxrs holds a tensor in host memory wherever it moves between disk, the
//! input pipeline and the devices. [`HostTensor`] (`tensor`), the element types ([`DType`],
//! which traced programs use too), the 8-bit
//! float formats' bits (`f8`), parameter
//! files in safetensors (`params_io`), and the block copies between a global array and the blocks
//! its sharding gives each device, or between any two blocks of one array (`blocks`).
//!
//! A foundation: it knows nothing of tracing or devices. `pjrt` moves these arrays to and from
//! devices, `runtime` shards them, `checkpoint`, `data` and `inference` read and write them.

mod blocks;
mod dtype;
pub mod f8;
pub mod params_io;
mod tensor;

pub use blocks::{assemble, block_of, copy_region, shard, whole, Bounds};
pub use dtype::DType;
pub(crate) use tensor::{convert_float, is_float};
pub use tensor::{shape_string, HostTensor};
