//! `PartitionSpec`: for each array dimension, the mesh axes that split it (major first).
//! Dimensions past the end of the spec are replicated, as in JAX.

use super::Mesh;
use std::fmt;
use std::sync::Arc;

#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PartitionSpec(Arc<[Vec<String>]>);

impl PartitionSpec {
    /// `PartitionSpec::new(&[&["data", "fsdp"], &[]])`: dim 0 split over data x fsdp, dim 1 whole.
    pub fn new(dims: &[&[&str]]) -> PartitionSpec {
        PartitionSpec(dims.iter().map(|axes| axes.iter().map(|a| a.to_string()).collect()).collect())
    }

    pub fn from_axes(dims: Vec<Vec<String>>) -> PartitionSpec {
        PartitionSpec(dims.into())
    }

    /// Fully replicated.
    pub fn replicated() -> PartitionSpec {
        PartitionSpec(Arc::from(Vec::new()))
    }

    /// Number of dimensions the spec names (the array may have more).
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// Mesh axes splitting dimension `d` (empty: not split).
    pub fn dim(&self, d: usize) -> &[String] {
        self.0.get(d).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Every axis exists in the mesh and is used at most once; the array has enough dimensions.
    pub fn validate(&self, mesh: &Mesh, rank: usize) -> Result<(), String> {
        if self.rank() > rank {
            return Err(format!("{self} names {} dimensions, the array has {rank}", self.rank()));
        }
        let mut seen: Vec<&str> = Vec::new();
        for axis in self.0.iter().flatten() {
            if mesh.axis_size(axis).is_none() {
                return Err(format!("{self} uses mesh axis \"{axis}\", which the mesh does not have"));
            }
            if seen.contains(&axis.as_str()) {
                return Err(format!("{self} uses mesh axis \"{axis}\" twice"));
            }
            seen.push(axis);
        }
        Ok(())
    }
}

/// JAX notation: `P('data', ('fsdp', 'tensor'), None)`.
impl fmt::Display for PartitionSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("P(")?;
        for (i, axes) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            match axes.as_slice() {
                [] => f.write_str("None")?,
                [a] => write!(f, "'{a}'")?,
                many => write!(f, "({})", many.iter().map(|a| format!("'{a}'")).collect::<Vec<_>>().join(", "))?,
            }
        }
        f.write_str(")")
    }
}

impl fmt::Debug for PartitionSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}
