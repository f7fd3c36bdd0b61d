//! Shardy annotations: the mesh declaration and per-value shardings
//! (`sdy.mesh @mesh = <["data"=2, "fsdp"=4]>`, `#sdy.sharding<@mesh, [{"data"}, {}]>`).
//! Dimensions past the end of a spec are written as replicated (`{}`), i.e. closed.

use crate::sharding::{Mesh, PartitionSpec};
use std::fmt::{self, Display};

pub(super) struct MeshDecl<'a>(pub &'a Mesh);

impl Display for MeshDecl<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("sdy.mesh @mesh = <[")?;
        for (i, (name, size)) in self.0.axes().iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "\"{name}\"={size}")?;
        }
        f.write_str("]>")
    }
}

/// The dimension shardings `<@mesh, [{"data"}, {}]>` of a rank-`rank` value (`None`: replicated).
pub(super) struct Shardings<'a> {
    pub spec: Option<&'a PartitionSpec>,
    pub rank: usize,
    /// Open dimensions (`{"data", ?}`, `{?}`): the partitioner may shard them further over
    /// other axes.
    pub open: bool,
}

impl Display for Shardings<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<@mesh, [")?;
        for d in 0..self.rank {
            if d > 0 {
                f.write_str(", ")?;
            }
            f.write_str("{")?;
            let axes = self.spec.map_or(&[][..], |s| s.dim(d));
            for (i, a) in axes.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "\"{a}\"")?;
            }
            match (self.open, axes.is_empty()) {
                (false, _) => {}
                (true, true) => f.write_str("?")?,
                (true, false) => f.write_str(", ?")?,
            }
            f.write_str("}")?;
        }
        f.write_str("]>")
    }
}
