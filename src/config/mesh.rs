//! The device mesh the config asks for: which axes exist, their `ici_*` / `dcn_*` parallelism keys,
//! filling the one `-1` per group, and checking the products against the devices.

use std::fmt;

use super::error::{closest, quote, ConfigError};
use super::keys::Config;

/// The mesh axes maxrs knows, in MaxText's `mesh_axes` order, each with the word its parallelism
/// keys use (`stage` is `ici_pipeline_parallelism`, as in MaxText).
pub const MESH_AXES: &[(&str, &str)] = &[
    ("data", "data"),
    ("stage", "pipeline"),
    ("fsdp", "fsdp"),
    ("fsdp_transpose", "fsdp_transpose"),
    ("context", "context"),
    ("context_usp_ulysses", "context_usp_ulysses"),
    ("tensor", "tensor"),
    ("tensor_sequence", "tensor_sequence"),
    ("expert", "expert"),
    ("autoregressive", "autoregressive"),
];

/// MaxText's mesh axes that maxrs does not implement (`mesh_axes` of `src/maxtext/configs/base.yml`
/// at MaxText e591f30). Their `ici_*` / `dcn_*` parallelism keys take only MaxText's default, 1
/// (`maxtext_keys`), so they are always of size 1 here: `mesh_axes` and the logical axis rules may
/// name them, as MaxText's own files do, and they shard nothing (leaving an axis out of the mesh
/// is the same as giving it size 1).
pub const SIZE_ONE_AXES: &[&str] = &["diloco", "context_autoregressive"];

/// Whether `axis` is a mesh axis maxrs builds.
pub(crate) fn built(axis: &str) -> bool {
    MESH_AXES.iter().any(|(a, _)| *a == axis)
}

/// One axis of the mesh. Its size is `dcn x ici`; as in MaxText's hybrid mesh, the DCN part is the
/// slower-varying one (index = dcn index x ici + ici index), so neighbours share a slice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MeshAxis {
    pub name: String,
    pub ici: usize,
    pub dcn: usize,
}

impl MeshAxis {
    pub fn size(&self) -> usize {
        self.ici * self.dcn
    }
}

/// The mesh, axes in `mesh_axes` order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mesh {
    pub axes: Vec<MeshAxis>,
}

impl Mesh {
    pub fn names(&self) -> Vec<&str> {
        self.axes.iter().map(|a| a.name.as_str()).collect()
    }

    /// Sizes per axis (ici x dcn).
    pub fn shape(&self) -> Vec<usize> {
        self.axes.iter().map(MeshAxis::size).collect()
    }

    /// Sizes within a slice (or host).
    pub fn ici_shape(&self) -> Vec<usize> {
        self.axes.iter().map(|a| a.ici).collect()
    }

    /// Sizes across slices (or hosts).
    pub fn dcn_shape(&self) -> Vec<usize> {
        self.axes.iter().map(|a| a.dcn).collect()
    }

    /// The size of an axis; 1 for an axis the mesh does not have.
    pub fn size(&self, name: &str) -> usize {
        self.axes.iter().find(|a| a.name == name).map_or(1, MeshAxis::size)
    }

    pub fn num_devices(&self) -> usize {
        self.shape().iter().product()
    }

    /// The physical mesh on real devices: `granules[g]` are the device ids of slice (or host) `g`
    /// in their local order; ICI neighbours stay inside a granule (`sharding::Mesh::hybrid`).
    pub fn physical(&self, granules: &[Vec<i64>]) -> anyhow::Result<crate::sharding::Mesh> {
        crate::sharding::Mesh::hybrid(&self.names(), &self.ici_shape(), &self.dcn_shape(), granules)
    }

    /// The mesh a step is traced on, the same rule for `maxrs train`, `maxrs train-compile` and
    /// `maxrs decode`: none on one device (a plain, unpartitioned program), else [`Mesh::physical`]
    /// over `granules`, the device ids of each host (GPU) or slice (TPU).
    pub fn step_mesh(&self, granules: &[Vec<i64>]) -> anyhow::Result<Option<crate::sharding::Mesh>> {
        match granules.iter().map(Vec::len).sum::<usize>() {
            1 => Ok(None),
            _ => self.physical(granules).map(Some),
        }
    }
}

impl fmt::Display for Mesh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[{}] = {:?} (ici {:?}, dcn {:?})",
            self.names().join(", "),
            self.shape(),
            self.ici_shape(),
            self.dcn_shape()
        )
    }
}

pub fn ici_key(axis_word: &str) -> String {
    format!("ici_{axis_word}_parallelism")
}

pub fn dcn_key(axis_word: &str) -> String {
    format!("dcn_{axis_word}_parallelism")
}

/// The (ici, dcn) values set for an axis.
fn parallelism(config: &Config, axis: &str) -> (i64, i64) {
    let c = config;
    match axis {
        "data" => (c.ici_data_parallelism, c.dcn_data_parallelism),
        "stage" => (c.ici_pipeline_parallelism, c.dcn_pipeline_parallelism),
        "fsdp" => (c.ici_fsdp_parallelism, c.dcn_fsdp_parallelism),
        "fsdp_transpose" => (c.ici_fsdp_transpose_parallelism, c.dcn_fsdp_transpose_parallelism),
        "context" => (c.ici_context_parallelism, c.dcn_context_parallelism),
        "context_usp_ulysses" => (c.ici_context_usp_ulysses_parallelism, c.dcn_context_usp_ulysses_parallelism),
        "tensor" => (c.ici_tensor_parallelism, c.dcn_tensor_parallelism),
        "tensor_sequence" => (c.ici_tensor_sequence_parallelism, c.dcn_tensor_sequence_parallelism),
        "expert" => (c.ici_expert_parallelism, c.dcn_expert_parallelism),
        "autoregressive" => (c.ici_autoregressive_parallelism, c.dcn_autoregressive_parallelism),
        _ => unreachable!("MESH_AXES and parallelism() list the same axes"),
    }
}

/// Builds the mesh for `num_devices` devices in `num_slices` slices (hosts, on GPU).
pub(crate) fn build(config: &Config, num_devices: usize, num_slices: usize) -> Result<Mesh, ConfigError> {
    if num_slices == 0 || num_devices == 0 || !num_devices.is_multiple_of(num_slices) {
        return Err(ConfigError::invalid(
            "devices",
            format!("{num_devices} devices cannot be split evenly into {num_slices} slices"),
        ));
    }
    check_axis_names(config)?;

    for &(axis, word) in MESH_AXES.iter().filter(|(a, _)| !config.mesh_axes.iter().any(|m| m == a)) {
        let (i, d) = parallelism(config, axis);
        for (key, value) in [(ici_key(word), i), (dcn_key(word), d)] {
            if value != 1 {
                return Err(ConfigError::invalid(
                    key.as_str(),
                    format!("{key}={value} but `{axis}` is not in mesh_axes; set it to 1 or add `{axis}` to mesh_axes"),
                ));
            }
        }
    }

    let (mut ici, mut dcn) = (Vec::new(), Vec::new());
    let built_axes: Vec<&String> = config.mesh_axes.iter().filter(|a| built(a)).collect();
    for name in &built_axes {
        let word = MESH_AXES.iter().find(|(a, _)| a == name).map(|(_, w)| *w).expect("names checked above");
        let (i, d) = parallelism(config, name);
        ici.push((ici_key(word), i));
        dcn.push((dcn_key(word), d));
    }
    let per_slice = num_devices / num_slices;
    let ici = fill("ICI", ici, per_slice, &format!("{per_slice} devices per slice"))?;
    let dcn = fill("DCN", dcn, num_slices, &plural(num_slices, "slice"))?;
    let axes = built_axes
        .into_iter()
        .zip(ici.into_iter().zip(dcn))
        .map(|(name, (ici, dcn))| MeshAxis { name: name.clone(), ici, dcn })
        .collect();
    Ok(Mesh { axes })
}

fn check_axis_names(config: &Config) -> Result<(), ConfigError> {
    let known: Vec<&str> = MESH_AXES.iter().map(|(a, _)| *a).collect();
    for (i, axis) in config.mesh_axes.iter().enumerate() {
        if !known.contains(&axis.as_str()) && !SIZE_ONE_AXES.contains(&axis.as_str()) {
            let hint =
                closest(axis, known.iter().copied()).map(|s| format!("; did you mean `{s}`?")).unwrap_or_default();
            return Err(ConfigError::invalid(
                "mesh_axes",
                format!("unknown mesh axis {}{hint} (maxrs knows {})", quote(axis), known.join(", ")),
            ));
        }
        if config.mesh_axes[..i].contains(axis) {
            return Err(ConfigError::invalid("mesh_axes", format!("mesh axis {} is listed twice", quote(axis))));
        }
    }
    Ok(())
}

/// Fills the one `-1` of a group so that its product is `target`, as MaxText's
/// `fill_unspecified_mesh_axes` does, with errors that name the keys.
fn fill(group: &str, values: Vec<(String, i64)>, target: usize, target_desc: &str) -> Result<Vec<usize>, ConfigError> {
    if let Some((key, v)) = values.iter().find(|(_, v)| *v == 0 || *v < -1) {
        return Err(ConfigError::invalid(
            key.as_str(),
            format!("{key}={v}; a parallelism is a positive integer, or -1 to take what the other axes leave"),
        ));
    }
    let unset: Vec<&String> = values.iter().filter(|(_, v)| *v == -1).map(|(k, _)| k).collect();
    if unset.len() > 1 {
        let keys = unset.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ");
        return Err(ConfigError::invalid(
            keys.as_str(),
            format!("{keys} are all -1; at most one {group} axis may be -1 (set the others to explicit sizes)"),
        ));
    }
    let set: Vec<&(String, i64)> = values.iter().filter(|(_, v)| *v > 1).collect();
    let product: usize = set.iter().map(|(_, v)| *v as usize).product();
    let listing = || {
        if set.is_empty() {
            "all 1".to_string()
        } else {
            set.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" x ")
        }
    };
    let mut sizes: Vec<usize> = values.iter().map(|(_, v)| (*v).max(1) as usize).collect();
    if let Some(key) = unset.first() {
        if !target.is_multiple_of(product) {
            return Err(ConfigError::invalid(
                key.as_str(),
                format!(
                    "{key}=-1 cannot be filled: the other {group} axes multiply to {product} ({}), which does not divide {target_desc}",
                    listing()
                ),
            ));
        }
        let at = values.iter().position(|(k, _)| k == *key).expect("key comes from values");
        sizes[at] = target / product;
    } else if product != target {
        let keys = if set.is_empty() {
            format!("{}_*_parallelism", group.to_lowercase())
        } else {
            set.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>().join(", ")
        };
        return Err(ConfigError::invalid(
            keys,
            format!(
                "the {group} parallelism multiplies to {product} ({}) but there are {target_desc}; make the product {target}, or set one {group} axis to -1",
                listing()
            ),
        ));
    }
    Ok(sizes)
}

pub(crate) fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        format!("1 {word}")
    } else {
        format!("{n} {word}s")
    }
}
