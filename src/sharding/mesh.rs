//! The device mesh: named axes with sizes, and the device id at each mesh position (row-major).

use super::PartitionSpec;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mesh {
    axes: Vec<(String, usize)>,
    /// Device ids in row-major mesh order: this is the compile's device assignment.
    devices: Vec<i64>,
}

impl Mesh {
    /// A mesh over devices `0..n` in order (one host, or when the order does not matter).
    pub fn new(axes: &[(&str, usize)]) -> Mesh {
        let n: usize = axes.iter().map(|a| a.1).product();
        Mesh { axes: axes.iter().map(|&(a, s)| (a.to_string(), s)).collect(), devices: (0..n as i64).collect() }
    }

    /// A multi-host mesh like jax's `create_hybrid_device_mesh`: axis `k` has size
    /// `ici[k] * dcn[k]`, its DCN factor is the major one, and `granules[g]` (the devices of one
    /// host or slice, in their local order) fills the ICI block at DCN position `g` (row-major).
    /// So ICI-axis neighbours are always devices of the same host.
    pub fn hybrid(names: &[&str], ici: &[usize], dcn: &[usize], granules: &[Vec<i64>]) -> anyhow::Result<Mesh> {
        if names.len() != ici.len() || names.len() != dcn.len() {
            anyhow::bail!("mesh axis names, ICI and DCN factors differ in length");
        }
        let per_granule: usize = ici.iter().product();
        let num_granules: usize = dcn.iter().product();
        if granules.len() != num_granules || granules.iter().any(|g| g.len() != per_granule) {
            return Err(anyhow::anyhow!(
                "DCN factors {dcn:?} need {num_granules} hosts of {per_granule} devices (ICI factors {ici:?}), \
                 got {} hosts with {:?} devices",
                granules.len(),
                granules.iter().map(Vec::len).collect::<Vec<_>>()
            ));
        }
        let axes: Vec<(String, usize)> =
            names.iter().zip(ici.iter().zip(dcn)).map(|(n, (i, d))| (n.to_string(), i * d)).collect();
        let mut mesh = Mesh { axes, devices: Vec::new() };
        let total = per_granule * num_granules;
        mesh.devices = (0..total)
            .map(|pos| {
                let coords = mesh.coords(pos);
                let (mut granule, mut local) = (0, 0);
                for (k, &c) in coords.iter().enumerate() {
                    granule = granule * dcn[k] + c / ici[k];
                    local = local * ici[k] + c % ici[k];
                }
                granules[granule][local]
            })
            .collect();
        Ok(mesh)
    }

    pub fn axes(&self) -> &[(String, usize)] {
        &self.axes
    }

    pub fn axis_size(&self, name: &str) -> Option<usize> {
        self.axes.iter().find(|a| a.0 == name).map(|a| a.1)
    }

    pub fn size(&self) -> usize {
        self.devices.len()
    }

    pub fn device_ids(&self) -> &[i64] {
        &self.devices
    }

    /// The devices at `index` along axis `name`, as a mesh with the same axes in which `name` has
    /// size 1 (a pipeline stage's devices: shardings written for the whole mesh mean the same
    /// on it, minus that axis).
    pub fn slice(&self, name: &str, index: usize) -> anyhow::Result<Mesh> {
        let k = self
            .axes
            .iter()
            .position(|a| a.0 == name)
            .ok_or_else(|| anyhow::anyhow!("the mesh has no axis `{name}`"))?;
        if index >= self.axes[k].1 {
            return Err(anyhow::anyhow!("index {index} is outside mesh axis `{name}` of size {}", self.axes[k].1));
        }
        let mut axes = self.axes.clone();
        axes[k].1 = 1;
        let devices = (0..self.devices.len()).filter(|&pos| self.coords(pos)[k] == index).map(|pos| self.devices[pos]);
        Ok(Mesh { axes, devices: devices.collect() })
    }

    /// Mesh coordinates (one per axis) of the device at row-major position `pos`.
    pub fn coords(&self, mut pos: usize) -> Vec<usize> {
        let mut c = vec![0; self.axes.len()];
        for (k, (_, size)) in self.axes.iter().enumerate().rev() {
            c[k] = pos % size;
            pos /= size;
        }
        c
    }

    /// The block of a global array of shape `dims` held by the device at mesh position `pos`
    /// under `spec`: per dimension, (start, length).
    pub fn shard_bounds(&self, spec: &PartitionSpec, dims: &[i64], pos: usize) -> anyhow::Result<Vec<(i64, i64)>> {
        spec.validate(self, dims.len()).map_err(anyhow::Error::msg)?;
        let coords = self.coords(pos);
        let mut out = Vec::with_capacity(dims.len());
        for (d, &size) in dims.iter().enumerate() {
            let (mut index, mut count) = (0usize, 1usize);
            for axis in spec.dim(d) {
                let k = self.axes.iter().position(|a| &a.0 == axis).expect("validated");
                index = index * self.axes[k].1 + coords[k];
                count *= self.axes[k].1;
            }
            if size % count as i64 != 0 {
                return Err(anyhow::anyhow!(
                    "dimension {d} of size {size} is not divisible into {count} shards by {spec}: its size must be a \
                     multiple of {count}, or those mesh axes smaller (their ici_/dcn_*_parallelism keys)"
                ));
            }
            let len = size / count as i64;
            out.push((index as i64 * len, len));
        }
        Ok(out)
    }
}
