//! MaxText's logical axis rules: a table from logical dimension names (`embed`, `mlp`,
//! `activation_batch`, ...) to candidate mesh axes, turned into a `PartitionSpec` per array.

use super::{Mesh, PartitionSpec};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogicalRules(Vec<(String, Vec<String>)>);

impl LogicalRules {
    /// From `(logical name, mesh axes)` rows, e.g. `config::axis_rules`.
    pub fn from_rows(rows: &[(String, Vec<String>)]) -> LogicalRules {
        LogicalRules(rows.to_vec())
    }

    /// The spec for an array whose dimensions have these logical names (`""` or a name without
    /// a rule: not split), with flax's `logical_to_mesh_axes` semantics, which MaxText's tables
    /// are written for: rows are tried in table order; a row for a name the array has applies
    /// if that dimension is still unassigned and none of the row's mesh axes is assigned to
    /// another dimension. So a later row for the same name is a fallback for when an earlier
    /// row's axes are taken (`embed` -> `[fsdp, context, expert]` when `mlp` took
    /// `fsdp_transpose`). Axes count as taken by name, whatever their size; the spec then leaves
    /// out the axes the mesh lacks or has with size 1.
    pub fn spec(&self, logical: &[&str], mesh: &Mesh) -> PartitionSpec {
        let mut assigned: Vec<Option<&[String]>> = vec![None; logical.len()];
        for (name, axes) in &self.0 {
            let Some(dim) = logical.iter().position(|l| l == name) else { continue };
            let taken = |axis: &String| assigned.iter().flatten().any(|a| a.contains(axis));
            if assigned[dim].is_none() && !axes.iter().any(taken) {
                assigned[dim] = Some(axes);
            }
        }
        let dims = assigned
            .into_iter()
            .map(|axes| {
                axes.unwrap_or_default().iter().filter(|a| mesh.axis_size(a).is_some_and(|s| s > 1)).cloned().collect()
            })
            .collect();
        PartitionSpec::from_axes(dims)
    }
}
