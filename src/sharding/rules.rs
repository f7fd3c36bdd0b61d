//! MaxText's logical axis rules: a table from logical dimension names (`embed`, `mlp`,
//! `activation_batch`, ...) to candidate mesh axes, turned into a `PartitionSpec` per array.

use super::{Mesh, PartitionSpec};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogicalRules(Vec<(String, Vec<String>)>);

impl LogicalRules {
    pub fn new(rules: &[(&str, &[&str])]) -> LogicalRules {
        LogicalRules(
            rules.iter().map(|(l, axes)| (l.to_string(), axes.iter().map(|a| a.to_string()).collect())).collect(),
        )
    }

    /// The core rows of MaxText's `base.yml` `logical_axis_rules`.
    pub fn maxtext() -> LogicalRules {
        LogicalRules::new(&[
            ("activation_batch", &["data", "fsdp", "fsdp_transpose", "expert"]),
            ("activation_length", &["context"]),
            ("activation_embed", &["tensor"]),
            ("activation_mlp", &["tensor", "tensor_sequence"]),
            ("activation_heads", &["tensor", "tensor_sequence"]),
            ("activation_kv", &["tensor", "tensor_sequence"]),
            ("activation_vocab", &["tensor", "tensor_sequence"]),
            ("heads", &["tensor", "tensor_sequence", "autoregressive"]),
            ("mlp", &["fsdp_transpose", "tensor", "tensor_sequence", "autoregressive"]),
            ("embed", &["fsdp", "fsdp_transpose", "context", "expert"]),
            ("vocab", &["tensor", "tensor_sequence", "autoregressive"]),
            ("exp", &["expert"]),
            ("layers", &["stage"]),
            ("kv", &[]),
        ])
    }

    /// The spec for an array whose dimensions have these logical names (`""` or an unknown
    /// name: not split). Per dimension, left to right: the rule's mesh axes that the mesh has
    /// with size > 1 and that no earlier dimension of the same array already uses.
    pub fn spec(&self, logical: &[&str], mesh: &Mesh) -> PartitionSpec {
        let mut used: Vec<&str> = Vec::new();
        let mut dims = Vec::with_capacity(logical.len());
        for name in logical {
            let mut axes = Vec::new();
            if let Some((_, candidates)) = self.0.iter().find(|(l, _)| l == name) {
                for axis in candidates {
                    if mesh.axis_size(axis).is_some_and(|s| s > 1) && !used.contains(&axis.as_str()) {
                        used.push(axis);
                        axes.push(axis.clone());
                    }
                }
            }
            dims.push(axes);
        }
        PartitionSpec::from_axes(dims)
    }
}
