//! Catalog of ahead-of-time compilation targets: turns a topology name (`a3mega-2`, `v5e-256`,
//! `cpu-8`, ...) and a slice count into the devices the target has and the arguments that make
//! its PJRT plugin describe it without the hardware (`PJRT_TopologyDescription_Create`).
//! Pure data: compiling against it is the AOT driver's job.

use std::fmt;

use anyhow::{anyhow, bail, Result};

use crate::config::{quote, MAX_CPU_DEVICES, MAX_GPU_HOSTS};
use crate::pjrt::provision::PluginName;

/// The kind of hardware, which picks the compile path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Platform {
    Cpu,
    Cuda,
    Tpu,
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Cpu => "cpu",
            Self::Cuda => "cuda",
            Self::Tpu => "tpu",
        })
    }
}

/// XLA's GPU target descriptions (`xla/backends/gpu/target_config/<name>.txtpb`, embedded in the
/// CUDA plugin); the plugin's `target_config` option takes the text of one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuTarget {
    H100Sxm,
    H200,
}

impl GpuTarget {
    /// The file stem of the target config in XLA.
    pub fn xla_name(self) -> &'static str {
        match self {
            Self::H100Sxm => "h100_sxm",
            Self::H200 => "h200",
        }
    }

    /// The `device_description_str` of the target config, which is also the device kind the
    /// plugin reports on the real GPU.
    pub fn device_kind(self) -> &'static str {
        match self {
            Self::H100Sxm => "NVIDIA H100 80GB HBM3",
            Self::H200 => "NVIDIA H200 141GB HBM3e",
        }
    }

    /// `device_memory_size` of the target config (what XLA plans with).
    pub fn memory_bytes(self) -> u64 {
        match self {
            Self::H100Sxm => 84_942_979_072,
            Self::H200 => 151_397_597_184,
        }
    }
}

/// A typed value of a named PJRT option.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OptionValue {
    Str(String),
    Int(i64),
    Ints(Vec<i64>),
}

/// How the plugin is made to describe the target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TopologyArgs {
    /// The CPU plugin has no deviceless topology: compile with a client of this many devices
    /// (client option `cpu_device_count`).
    Cpu { device_count: u32 },
    /// CUDA plugin options `topology` = `<slices>x<hosts per slice>x<devices per host>` (every
    /// host its own NVLink domain, so hosts are listed as slices: `2x1x8` for two A3 Mega nodes)
    /// and `target_config` = the text of `target`'s config.
    Gpu { topology: String, target: GpuTarget },
    /// libtpu topology name (`v5e:16x16`) and named options.
    Tpu { name: String, options: Vec<(&'static str, OptionValue)> },
}

/// One compilation target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    /// The name as MaxText spells it (`v5e-256`, `a3mega-2`).
    pub name: String,
    pub num_slices: u32,
    pub platform: Platform,
    pub plugin: PluginName,
    pub device_kind: &'static str,
    /// Memory of one device; `None` for CPU (host memory).
    pub memory_bytes_per_device: Option<u64>,
    pub devices_per_host: u32,
    pub hosts_per_slice: u32,
    pub args: TopologyArgs,
}

impl Topology {
    pub fn devices_per_slice(&self) -> u32 {
        self.devices_per_host * self.hosts_per_slice
    }

    pub fn num_hosts(&self) -> u32 {
        self.hosts_per_slice * self.num_slices
    }

    /// All devices of all slices: what `num_partitions` x `num_replicas` must equal.
    pub fn num_devices(&self) -> u32 {
        self.devices_per_slice() * self.num_slices
    }
}

/// A family of names, for listing (`maxrs topologies`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Family {
    /// `a3mega-N`, `v5e-N`, ...
    pub pattern: &'static str,
    /// What N may be, in words.
    pub sizes: String,
    pub platform: Platform,
    /// `None` where it depends on N (`cpu-N`; `v5e-1` has one chip where larger v5e have 4 per host).
    pub devices_per_host: Option<u32>,
    pub device_kind: &'static str,
    pub memory_bytes_per_device: Option<u64>,
}

const GIB: u64 = 1 << 30;

/// The TPU generations MaxText names, with libtpu's generation prefix and nominal HBM per chip.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tpu {
    V4,
    V5e,
    V5p,
    V6e,
}

impl Tpu {
    fn family(self) -> &'static str {
        match self {
            Self::V4 => "v4",
            Self::V5e => "v5e",
            Self::V5p => "v5p",
            Self::V6e => "v6e",
        }
    }

    fn libtpu_prefix(self) -> &'static str {
        match self {
            Self::V4 => "v4",
            Self::V5e => "v5e",
            Self::V5p => "v5",
            Self::V6e => "v6e",
        }
    }

    fn device_kind(self) -> &'static str {
        match self {
            Self::V4 => "TPU v4",
            Self::V5e => "TPU v5 lite",
            Self::V5p => "TPU v5",
            Self::V6e => "TPU v6 lite",
        }
    }

    fn memory_bytes(self) -> u64 {
        match self {
            Self::V4 | Self::V6e => 32 * GIB,
            Self::V5e => 16 * GIB,
            Self::V5p => 95 * GIB,
        }
    }

    /// v4 and v5p names count TensorCores, two per (megacore) chip; v5e and v6e count chips.
    fn megacore(self) -> bool {
        matches!(self, Self::V4 | Self::V5p)
    }

    /// Chips of each size MaxText's `accelerator_to_spec_map.py` lists.
    fn chip_counts(self) -> Vec<u32> {
        match self {
            Self::V5e | Self::V6e => vec![1, 4, 8, 16, 32, 64, 128, 256],
            Self::V4 => [4, 8, 16, 32].into_iter().chain([1, 2, 3, 4, 8, 12, 16, 32].map(|u| 64 * u)).collect(),
            // Every multiple of 64 chips up to 6144 whose torus side stays within 256 chips,
            // then the two large pods.
            Self::V5p => [4, 8, 16, 32]
                .into_iter()
                .chain((1..=96).filter(|u| cube_units(*u)[2] <= 64).map(|u| 64 * u))
                .chain([6912, 8960])
                .collect(),
        }
    }
}

/// 3-D torus of `chips` (v4, v5p): small slices are fixed shapes; from 64 chips on, cubes of 4x4x4
/// chips arranged as close to a cube as possible (smallest longest side, then smallest middle
/// side). This reproduces every shape of MaxText's table.
fn torus_3d(chips: u32) -> [u32; 3] {
    match chips {
        4 => [2, 2, 1],
        8 => [2, 2, 2],
        16 => [2, 2, 4],
        32 => [2, 4, 4],
        _ => cube_units(chips / 64).map(|d| 4 * d),
    }
}

/// The factorization `a <= b <= c` of `units` with the smallest `c`, then the smallest `b`.
fn cube_units(units: u32) -> [u32; 3] {
    let mut best = [1, 1, units];
    for a in 1..=units {
        for b in a..=units / a {
            if units.is_multiple_of(a * b) {
                let c = units / (a * b);
                if c >= b && (c, b) < (best[2], best[1]) {
                    best = [a, b, c];
                }
            }
        }
    }
    best
}

/// 2-D torus of `chips` (v5e, v6e).
fn torus_2d(chips: u32) -> [u32; 2] {
    match chips {
        1 => [1, 1],
        4 => [2, 2],
        8 => [2, 4],
        16 => [4, 4],
        32 => [4, 8],
        64 => [8, 8],
        128 => [8, 16],
        _ => [16, 16],
    }
}

fn tpu_topology(gen: Tpu, size: u32, name: &str, num_slices: u32) -> Result<Topology> {
    let chips = if gen.megacore() { size / 2 } else { size };
    let valid = gen.chip_counts();
    if (gen.megacore() && !size.is_multiple_of(2)) || !valid.contains(&chips) {
        let sizes: Vec<String> = valid.iter().map(|c| (if gen.megacore() { c * 2 } else { *c }).to_string()).collect();
        bail!("unknown TPU topology {}: {}-N takes N in {}", quote(name), gen.family(), sizes.join(", "));
    }
    let host_bounds: [i64; 3] = if chips == 1 { [1, 1, 1] } else { [2, 2, 1] };
    let chips_per_host = host_bounds.iter().product::<i64>() as u32;
    let (dims, wrap): (Vec<u32>, [bool; 3]) = if gen.megacore() {
        // Slices of 64 chips and more are full tori.
        (torus_3d(chips).to_vec(), [chips >= 64; 3])
    } else {
        (torus_2d(chips).to_vec(), [chips == 256, chips >= 128, false])
    };
    let dims: Vec<String> = dims.iter().map(u32::to_string).collect();
    let options = vec![
        ("chip_config_name", OptionValue::Str(if gen.megacore() { "megacore" } else { "default" }.into())),
        ("chips_per_host_bounds", OptionValue::Ints(host_bounds.to_vec())),
        ("wrap", OptionValue::Ints(wrap.map(i64::from).to_vec())),
        ("num_slices", OptionValue::Int(num_slices.into())),
    ];
    Ok(Topology {
        name: name.to_string(),
        num_slices,
        platform: Platform::Tpu,
        plugin: PluginName::Tpu,
        device_kind: gen.device_kind(),
        memory_bytes_per_device: Some(gen.memory_bytes()),
        devices_per_host: chips_per_host,
        hosts_per_slice: chips / chips_per_host,
        args: TopologyArgs::Tpu { name: format!("{}:{}", gen.libtpu_prefix(), dims.join("x")), options },
    })
}

/// GPU hosts: for GPUs a host is the unit of fast interconnect, so slices multiply hosts
/// (MaxText's `a3` with `compile_topology_num_slices=N` is N hosts).
fn gpu_topology(target: GpuTarget, hosts: u32, devices_per_host: u32, name: &str, num_slices: u32) -> Topology {
    let all_hosts = hosts * num_slices;
    Topology {
        name: name.to_string(),
        num_slices,
        platform: Platform::Cuda,
        // The default; the CUDA 13 plugin describes the same targets.
        plugin: PluginName::Cuda12,
        device_kind: target.device_kind(),
        memory_bytes_per_device: Some(target.memory_bytes()),
        devices_per_host,
        hosts_per_slice: hosts,
        args: TopologyArgs::Gpu { topology: format!("{all_hosts}x1x{devices_per_host}"), target },
    }
}

const VALID: &str = "a3-N, a3mega-N (N hosts x 8 H100), a3ultra-N (N hosts x 8 H200), h100-1, h100-8, \
                     cpu-N (N devices), v4-N, v5e-N, v5p-N, v6e-N (MaxText's TPU names; see `maxrs topologies`)";

/// The target `name` with `num_slices` slices (MaxText's `compile_topology` and
/// `compile_topology_num_slices`).
pub fn lookup(name: &str, num_slices: u32) -> Result<Topology> {
    if num_slices == 0 {
        bail!("compile_topology_num_slices must be at least 1, got 0");
    }
    // MaxText's plain `a3` is one host; slices add hosts.
    let spelled = if name == "a3" { "a3-1" } else { name };
    let (family, size) = spelled
        .rsplit_once('-')
        .and_then(|(family, n)| Some((family, n.parse::<u32>().ok().filter(|n| *n > 0)?)))
        .ok_or_else(|| anyhow!("unknown topology {}: valid names are {VALID}", quote(name)))?;
    // Bounded before anything is sized by them: XLA aborts or crashes on huge targets.
    let gpu_hosts = match family {
        "a3" | "a3mega" | "a3ultra" => Some(u64::from(size) * u64::from(num_slices)),
        "h100" => Some(u64::from(num_slices)),
        _ => None,
    };
    if let Some(hosts) = gpu_hosts.filter(|hosts| *hosts > MAX_GPU_HOSTS as u64) {
        bail!(
            "topology {} with {num_slices} slice(s) is {hosts} GPU hosts; maxrs compiles for at most {MAX_GPU_HOSTS}",
            quote(name)
        );
    }
    if family == "cpu" && i64::from(size) > MAX_CPU_DEVICES {
        bail!(
            "topology {}: the CPU plugin makes at most {MAX_CPU_DEVICES} devices (cpu-1 to cpu-{MAX_CPU_DEVICES})",
            quote(name)
        );
    }
    match family {
        "a3" | "a3mega" => Ok(gpu_topology(GpuTarget::H100Sxm, size, 8, name, num_slices)),
        "a3ultra" => Ok(gpu_topology(GpuTarget::H200, size, 8, name, num_slices)),
        "h100" if size == 1 || size == 8 => Ok(gpu_topology(GpuTarget::H100Sxm, 1, size, name, num_slices)),
        "h100" => bail!("unknown topology {}: h100-1 and h100-8 are one host; use a3mega-N for N hosts of 8", quote(name)),
        "cpu" if num_slices > 1 => bail!(
            "topology `{name}` cannot have {num_slices} slices: the CPU plugin runs one process (use cpu-{} for that many devices)",
            u64::from(size) * u64::from(num_slices)
        ),
        "cpu" => Ok(Topology {
            name: name.to_string(),
            num_slices,
            platform: Platform::Cpu,
            plugin: PluginName::Cpu,
            device_kind: "cpu",
            memory_bytes_per_device: None,
            devices_per_host: size,
            hosts_per_slice: 1,
            args: TopologyArgs::Cpu { device_count: size },
        }),
        "v4" => tpu_topology(Tpu::V4, size, name, num_slices),
        "v5e" => tpu_topology(Tpu::V5e, size, name, num_slices),
        "v5p" => tpu_topology(Tpu::V5p, size, name, num_slices),
        "v6e" => tpu_topology(Tpu::V6e, size, name, num_slices),
        _ => bail!("unknown topology {}: valid names are {VALID}", quote(name)),
    }
}

/// Every family of names, with what N may be.
pub fn catalog() -> Vec<Family> {
    let gpu = |pattern, sizes: &str, target: GpuTarget, devices| Family {
        pattern,
        sizes: sizes.to_string(),
        platform: Platform::Cuda,
        devices_per_host: Some(devices),
        device_kind: target.device_kind(),
        memory_bytes_per_device: Some(target.memory_bytes()),
    };
    let tpu = |pattern, gen: Tpu| {
        let sizes: Vec<String> =
            gen.chip_counts().iter().map(|c| (if gen.megacore() { c * 2 } else { *c }).to_string()).collect();
        Family {
            pattern,
            sizes: sizes.join(", "),
            platform: Platform::Tpu,
            devices_per_host: gen.megacore().then_some(4),
            device_kind: gen.device_kind(),
            memory_bytes_per_device: Some(gen.memory_bytes()),
        }
    };
    vec![
        gpu("a3-N", "1 to 4096 hosts", GpuTarget::H100Sxm, 8),
        gpu("a3mega-N", "1 to 4096 hosts", GpuTarget::H100Sxm, 8),
        gpu("a3ultra-N", "1 to 4096 hosts", GpuTarget::H200, 8),
        gpu("h100-1", "one GPU", GpuTarget::H100Sxm, 1),
        gpu("h100-8", "one host", GpuTarget::H100Sxm, 8),
        Family {
            pattern: "cpu-N",
            sizes: "1 to 1024 devices, one process".into(),
            platform: Platform::Cpu,
            devices_per_host: None,
            device_kind: "cpu",
            memory_bytes_per_device: None,
        },
        tpu("v4-N", Tpu::V4),
        tpu("v5e-N", Tpu::V5e),
        tpu("v5p-N", Tpu::V5p),
        tpu("v6e-N", Tpu::V6e),
    ]
}

#[cfg(test)]
mod tests;
