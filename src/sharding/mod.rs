//! Sharding: the device `Mesh` of named axes, `PartitionSpec`s saying which mesh axes split each
//! dimension of an array, and MaxText's logical axis rules that derive specs from logical
//! dimension names. Pure data and index arithmetic: the lowering turns these into Shardy
//! annotations (`lower::shardy`), the runtime uses `Mesh::shard_bounds` to split host arrays.

mod mesh;
mod rules;
mod spec;

pub use mesh::Mesh;
pub use rules::LogicalRules;
pub use spec::PartitionSpec;
