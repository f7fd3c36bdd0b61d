//! Compiling for a catalog target without its hardware: loads (or downloads) the target's PJRT
//! plugin, makes it describe the target's devices (`PJRT_TopologyDescription_Create` for GPU and
//! TPU; a CPU client with the target's device count for `cpu-N`), groups those devices the way
//! the mesh needs them (per host on GPU, per slice on TPU), and compiles traced programs over
//! them with the SPMD options the target needs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Once;

use anyhow::{anyhow, bail, Context, Result};

use super::memory::MemoryReport;
use super::target_config::gpu_target_config;
use super::topology::{OptionValue, Platform, Topology, TopologyArgs};
use crate::ir::Program;
use crate::lower::to_stablehlo;
use crate::pjrt::gpu_memory::{GpuAllocator, GpuBudget};
use crate::pjrt::provision::{cuda_toolchain_dir, CudaMajor, PluginName, ResolvedPlugin};
use crate::pjrt::xla_flags::XlaFlags;
use crate::pjrt::{self, Client, CompileOptions, Executable, LoadedExecutable, Plugin, TopologyDevice, Value};

/// The XLA option naming the folder with `ptxas` and `libdevice`.
const CUDA_DATA_DIR: &str = "xla_gpu_cuda_data_dir";

/// XLA's GPU compiler turns large sorts (from 2^14 or so keys, e.g. the MoE dropless path's
/// argsort of a long batch's assignments) into CUB radix sorts, and asks the CUDA runtime for
/// their scratch size while compiling; a deviceless compile has no CUDA runtime and fails
/// ("CUDA Runtime error: Error loading CUDA libraries"). For programs with a sort (and only
/// those: the option changes nothing else) the GPU compile turns it off, unless `XLA_FLAGS`
/// sets it, and XLA sorts with its own kernels (the same result; stable sorts stay stable).
const CUB_RADIX_SORT: &str = "xla_gpu_enable_cub_radix_sort";

/// A target ready to compile for.
pub struct CompileTarget {
    topology: Topology,
    plugin: ResolvedPlugin,
    backend: Backend,
    granules: Vec<Vec<i64>>,
    platform_name: String,
    platform_version: String,
    memory_bytes_per_device: Option<u64>,
    /// XLA options every compile for this target carries.
    xla_overrides: Vec<(String, String)>,
    /// GPU without `XLA_FLAGS` naming [`CUB_RADIX_SORT`]: programs with a sort turn it off.
    disable_cub_sort: bool,
    /// GPU: where the device description came from (`target_config::TargetDescription`).
    gpu_description: Option<String>,
}

enum Backend {
    /// GPU and TPU: the plugin's description of devices that are not here.
    Deviceless(pjrt::Topology),
    /// CPU: the CPU plugin has no deviceless topology, but its devices are always here.
    Client(Client),
}

impl CompileTarget {
    /// Prepares `topology` with `plugin` (a name or a path; `None` takes the catalog's plugin,
    /// e.g. `cuda12` for GPU targets), downloading the plugin and, for GPUs, the CUDA compile
    /// toolchain on first use.
    pub fn new(topology: &Topology, plugin: Option<&str>) -> Result<CompileTarget> {
        Self::with_gpu_description(topology, plugin, None)
    }

    /// [`CompileTarget::new`], with the GPU description read from `gpu_target_config` when given
    /// (see `target_config`).
    pub fn with_gpu_description(
        topology: &Topology,
        plugin: Option<&str>,
        description_file: Option<&Path>,
    ) -> Result<CompileTarget> {
        let spec = plugin.unwrap_or(topology.plugin.as_str());
        check_plugin(topology, spec)?;
        if topology.platform == Platform::Tpu {
            prepare_libtpu_environment();
        }
        let (resolved, plugin) = pjrt::load_plugin(Some(spec))?;
        let mut xla_overrides = Vec::new();
        let mut disable_cub_sort = false;
        let mut gpu_description = None;
        let backend = match &topology.args {
            TopologyArgs::Cpu { device_count } => {
                let options = [("cpu_device_count".to_string(), Value::I64((*device_count).into()))];
                Backend::Client(Client::create(&plugin, &options, None)?)
            }
            TopologyArgs::Gpu { topology: shape, target } => {
                let flags = XlaFlags::from_env()?;
                if flags.get(CUDA_DATA_DIR).is_none() {
                    let toolchain = cuda_toolchain_dir(cuda_major(&plugin, &resolved)?)?;
                    xla_overrides.push((CUDA_DATA_DIR.to_string(), toolchain.display().to_string()));
                }
                disable_cub_sort = flags.get(CUB_RADIX_SORT).is_none();
                let description = gpu_target_config(plugin.path(), *target, description_file)?;
                let options = [
                    ("topology".to_string(), Value::Str(shape.clone())),
                    ("target_config".to_string(), Value::Str(description.text.to_string())),
                ];
                let created = pjrt::Topology::create(&plugin, &topology.name, &options).map_err(|e| {
                    anyhow!(
                        "the CUDA plugin {} cannot use the description of {} from {}: {}; name one it reads with \
                         gpu_target_config=FILE",
                        resolved.path.display(),
                        target.device_kind(),
                        description.source,
                        e.to_string().lines().next().unwrap_or_default()
                    )
                })?;
                gpu_description = Some(description.source);
                Backend::Deviceless(created)
            }
            TopologyArgs::Tpu { name, options } => {
                let options: Vec<(String, Value)> =
                    options.iter().map(|(key, value)| (key.to_string(), pjrt_value(value))).collect();
                Backend::Deviceless(pjrt::Topology::create(&plugin, name, &options)?)
            }
        };
        let (platform_name, platform_version, devices) = match &backend {
            Backend::Deviceless(t) => (t.platform_name()?, t.platform_version()?, t.devices()?),
            Backend::Client(c) => (c.platform_name()?, c.platform_version()?, client_devices(c)?),
        };
        let plugin_file = resolved.path.display();
        if platform_name != topology.platform.to_string() {
            bail!(
                "plugin {plugin_file} compiles for platform `{platform_name}`, but topology `{}` is a {} target; use {}",
                topology.name,
                topology.platform,
                plugin_names(topology.platform)
            );
        }
        let granules = granules(topology, &devices).with_context(|| {
            format!("plugin {plugin_file} does not describe topology `{}` as the catalog does", topology.name)
        })?;
        let limits = devices.iter().filter_map(|d| match attribute(d, "device_memory_bytes_limit") {
            Some(Value::I64(n)) if *n > 0 => Some(*n as u64),
            _ => None,
        });
        Ok(CompileTarget {
            topology: topology.clone(),
            plugin: resolved,
            backend,
            granules,
            platform_name,
            platform_version,
            memory_bytes_per_device: limits.min().or(topology.memory_bytes_per_device),
            xla_overrides,
            disable_cub_sort,
            gpu_description,
        })
    }

    /// GPU targets: where the device description came from.
    pub fn gpu_description(&self) -> Option<&str> {
        self.gpu_description.as_deref()
    }

    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// The plugin file, and the package and version it came from (for the artifact header).
    pub fn plugin(&self) -> &ResolvedPlugin {
        &self.plugin
    }

    /// The platform as the plugin names it (`cuda`, `tpu`, `cpu`).
    pub fn platform_name(&self) -> &str {
        &self.platform_name
    }

    /// The platform version the plugin reports.
    pub fn platform_version(&self) -> &str {
        &self.platform_version
    }

    /// The device ids of each host (GPU, CPU) or slice (TPU), in increasing id order: what
    /// `config::Mesh::physical` takes to lay the mesh out so that ICI axes stay inside one.
    /// Id order is local GPU order on a host, and row-major chip coordinates in a TPU slice
    /// (consecutive ids are torus neighbours along the first dimension).
    pub fn granules(&self) -> &[Vec<i64>] {
        &self.granules
    }

    pub fn num_devices(&self) -> usize {
        self.granules.iter().map(Vec::len).sum()
    }

    /// Memory of one device as the plugin describes it (what XLA plans with), else the
    /// catalog's; `None` for CPU.
    pub fn memory_bytes_per_device(&self) -> Option<u64> {
        self.memory_bytes_per_device
    }

    /// What the compile of `program` is told: SPMD over the program's mesh, devices assigned
    /// in mesh order, one process per host, and the target's XLA option overrides.
    pub fn compile_options(&self, program: &Program) -> Result<CompileOptions> {
        self.options(program, false)
    }

    /// The options of [`CompileTarget::compile_options`]; with `part`, the program's mesh may
    /// cover only some of the target's devices (a pipeline stage's).
    fn options(&self, program: &Program, part: bool) -> Result<CompileOptions> {
        let name = &self.topology.name;
        let (ids, mut options) = match &program.mesh {
            Some(mesh) => (mesh.device_ids().to_vec(), CompileOptions::spmd(mesh.size() as i64)),
            None if self.num_devices() == 1 => (vec![self.granules[0][0]], CompileOptions::single_device()),
            None => bail!(
                "the program has no mesh, but `{name}` has {} devices: trace it over a mesh built with \
                 config::Mesh::physical(target.granules())",
                self.num_devices()
            ),
        };
        if ids.len() != self.num_devices() && !part {
            bail!(
                "the program's mesh has {} devices, but `{name}` has {}: build the mesh for {} devices in {} \
                 groups of {}",
                ids.len(),
                self.num_devices(),
                self.num_devices(),
                self.granules.len(),
                self.granules[0].len()
            );
        }
        let known: BTreeSet<i64> = self.granules.iter().flatten().copied().collect();
        let mut seen = BTreeSet::new();
        if let Some(bad) = ids.iter().find(|id| !known.contains(id) || !seen.insert(**id)) {
            let first = known.first().expect("a target has devices");
            let last = known.last().expect("a target has devices");
            bail!(
                "device id {bad} is {} the program's mesh: `{name}` has device ids {first}..={last} ({} of them); \
                 build the mesh from target.granules()",
                if known.contains(bad) { "repeated in" } else { "not a device of the target, but is in" },
                known.len()
            );
        }
        options.device_assignment = Some(ids);
        options.process_count = self.topology.num_hosts().into();
        options.xla_option_overrides.extend(self.xla_overrides.iter().cloned());
        Ok(options)
    }

    /// Lowers `program` to StableHLO and compiles it for the target.
    pub fn compile(&self, program: &Program) -> Result<Executable> {
        self.compile_lowered(program, &to_stablehlo(program))
    }

    /// Compiles `program`, already lowered to `mlir`, for the target.
    pub fn compile_lowered(&self, program: &Program, mlir: &str) -> Result<Executable> {
        let mut options = self.compile_options(program)?;
        if self.disable_cub_sort && has_sort(mlir) {
            options.xla_option_overrides.push((CUB_RADIX_SORT.to_string(), "false".to_string()));
        }
        let compiled = self.compile_with(mlir, &options);
        compiled.with_context(|| format!("compiling for topology `{}`", self.topology.name))
    }

    /// Compiles `program`, already lowered to `mlir`, for the devices of its mesh, which may
    /// be a part of the target's (a pipeline stage's devices).
    pub fn compile_part_lowered(&self, program: &Program, mlir: &str) -> Result<Executable> {
        let options = self.options(program, true)?;
        let compiled = self.compile_with(mlir, &options);
        compiled.with_context(|| format!("compiling for part of topology `{}`", self.topology.name))
    }

    /// `mlir` compiled with `options` by the target's backend: deviceless, or on a client.
    fn compile_with(&self, mlir: &str, options: &CompileOptions) -> crate::pjrt::Result<Executable> {
        match &self.backend {
            Backend::Deviceless(topology) => topology.compile(mlir, options),
            Backend::Client(client) => {
                client.compile_uncached(mlir, options).and_then(LoadedExecutable::into_executable)
            }
        }
    }

    /// Compiles StableHLO lowered elsewhere (JAX's `Lowered.as_text()`: MaxText's own step in
    /// `tools/compile_stablehlo.rs`) as an SPMD program over all the target's devices in id
    /// order, with the options, overrides and process count maxrs's own programs get.
    pub fn compile_module(&self, mlir: &str) -> Result<Executable> {
        let ids: Vec<i64> = self.granules.iter().flatten().copied().collect();
        let mut options = CompileOptions::spmd(ids.len() as i64);
        options.device_assignment = Some(ids);
        options.process_count = self.topology.num_hosts().into();
        options.xla_option_overrides.extend(self.xla_overrides.iter().cloned());
        if self.disable_cub_sort && has_sort(mlir) {
            options.xla_option_overrides.push((CUB_RADIX_SORT.to_string(), "false".to_string()));
        }
        let compiled = self.compile_with(mlir, &options);
        compiled.with_context(|| format!("compiling a lowered module for topology `{}`", self.topology.name))
    }

    /// On a GPU target, what XLA's allocator will let a run use of each device, under the
    /// allocator variables of this environment (the run's must be the same: train-compile's
    /// verdict says so when it matters).
    pub fn gpu_budget(&self) -> Result<Option<GpuBudget>> {
        match (self.topology.platform, self.memory_bytes_per_device) {
            (Platform::Cuda, Some(device)) => Ok(Some(GpuBudget::planned(GpuAllocator::from_env()?, device))),
            _ => Ok(None),
        }
    }

    /// The memory one device's program may use: the GPU budget's, else the device's.
    pub fn usable_bytes_per_device(&self) -> Result<Option<u64>> {
        Ok(self.gpu_budget()?.map(|b| b.usable_bytes).or(self.memory_bytes_per_device))
    }

    /// The per-device memory of `executable` against this target's device memory.
    pub fn memory_report(&self, executable: &Executable) -> Result<MemoryReport> {
        Ok(MemoryReport {
            stats: executable.compiled_memory_stats()?,
            capacity: self.memory_bytes_per_device,
            budget: self.gpu_budget()?,
            device: format!("{} ({})", self.topology.name, self.topology.device_kind),
        })
    }
}

/// Whether the lowered program sorts: `stablehlo.sort`, or `chlo.top_k`, which XLA may expand
/// into a sort.
fn has_sort(mlir: &str) -> bool {
    mlir.contains("stablehlo.sort") || mlir.contains("chlo.top_k")
}

/// Checks that plugin `spec`, when it is a name, compiles for `topology`'s platform (a plugin
/// path is checked once loaded: its platform name must be the target's).
pub(crate) fn check_plugin(topology: &Topology, spec: &str) -> Result<()> {
    if let Ok(name) = spec.parse::<PluginName>() {
        if platform_of(name) != topology.platform {
            bail!(
                "topology `{}` is a {} target, but plugin `{name}` compiles for {}; use {}",
                topology.name,
                topology.platform,
                platform_of(name),
                plugin_names(topology.platform)
            );
        }
    }
    Ok(())
}

fn platform_of(plugin: PluginName) -> Platform {
    match plugin {
        PluginName::Cpu => Platform::Cpu,
        PluginName::Cuda12 | PluginName::Cuda13 => Platform::Cuda,
        PluginName::Tpu => Platform::Tpu,
    }
}

/// The plugin names that compile for `platform`, for messages.
fn plugin_names(platform: Platform) -> String {
    let names: Vec<String> =
        PluginName::ALL.into_iter().filter(|p| platform_of(*p) == platform).map(|p| format!("`{p}`")).collect();
    format!("{} (or a path to such a plugin)", names.join(" or "))
}

/// The CUDA release the plugin was built for, whose `ptxas` must compile its PTX: the plugin's
/// `cuda_version` attribute (12090 for 12.9), else what its name says.
fn cuda_major(plugin: &Plugin, resolved: &ResolvedPlugin) -> Result<CudaMajor> {
    let from_attribute = plugin.attributes()?.into_iter().find_map(|(key, value)| match (key.as_str(), value) {
        ("cuda_version", Value::I64(v)) => Some(v / 1000),
        _ => None,
    });
    match (from_attribute, resolved.name.and_then(PluginName::cuda_major)) {
        (Some(12), _) => Ok(CudaMajor::Cuda12),
        (Some(13), _) => Ok(CudaMajor::Cuda13),
        (None, Some(major)) => Ok(major),
        (found, _) => Err(anyhow!(
            "cannot tell which CUDA release the plugin {} was built for (cuda_version attribute: {found:?}); \
             set XLA_FLAGS=--{CUDA_DATA_DIR}=DIR to a folder with bin/ptxas and nvvm/libdevice of that release",
            resolved.path.display()
        )),
    }
}

/// libtpu reads these when it initialises, so they must be in the environment before it is
/// loaded; a value the user set is kept. Without them libtpu spends minutes querying the cloud
/// metadata server of a TPU VM that is not there, and a lock file in /tmp makes a second
/// process that compiles at the same time fail. Setting the environment while other threads
/// may read it is a known hazard (a thread spawning a program at that moment, e.g. XLA's
/// `ptxas`, can fail); it happens once, and libtpu offers no other channel. A process with
/// threads of its own (the test binary) calls this first, while it has one thread.
pub fn prepare_libtpu_environment() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let log_dir = std::env::temp_dir().join("maxrs-tpu-logs");
        let settings = [
            ("TPU_SKIP_MDS_QUERY", "1".into()),
            ("ALLOW_MULTIPLE_LIBTPU_LOAD", "1".into()),
            ("TPU_LOG_DIR", log_dir.display().to_string()),
        ];
        for (name, value) in settings {
            if std::env::var_os(name).is_none() {
                std::env::set_var(name, value);
            }
        }
    });
}

fn pjrt_value(value: &OptionValue) -> Value {
    match value {
        OptionValue::Str(s) => Value::Str(s.clone()),
        OptionValue::Int(i) => Value::I64(*i),
        OptionValue::Ints(v) => Value::I64List(v.clone()),
    }
}

fn client_devices(client: &Client) -> Result<Vec<TopologyDevice>> {
    Ok(client
        .devices()?
        .into_iter()
        .map(|d| TopologyDevice { id: d.id, process_index: d.process_index, kind: d.kind, attributes: d.attributes })
        .collect())
}

fn attribute<'a>(device: &'a TopologyDevice, name: &str) -> Option<&'a Value> {
    device.attributes.iter().find(|(key, _)| key == name).map(|(_, value)| value)
}

/// Groups `devices` per host (GPU, CPU) or per slice (TPU: the `slice_index` attribute, absent
/// on a single slice), each group in id order, and checks the groups against the catalog.
fn granules(topology: &Topology, devices: &[TopologyDevice]) -> Result<Vec<Vec<i64>>> {
    let (unit, expected_groups, per_group) = match topology.platform {
        Platform::Tpu => ("slice", topology.num_slices, topology.devices_per_slice()),
        Platform::Cuda | Platform::Cpu => ("host", topology.num_hosts(), topology.devices_per_host),
    };
    let mut groups: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for device in devices {
        if device.kind != topology.device_kind {
            bail!("device {} is a `{}`, the catalog expects `{}`", device.id, device.kind, topology.device_kind);
        }
        let group = match (topology.platform, attribute(device, "slice_index")) {
            (Platform::Tpu, Some(Value::I64(slice))) => *slice,
            (Platform::Tpu, _) => 0,
            _ => device.process_index.into(),
        };
        groups.entry(group).or_default().push(device.id.into());
    }
    let sizes: Vec<usize> = groups.values().map(Vec::len).collect();
    if groups.len() != expected_groups as usize || sizes.iter().any(|n| *n != per_group as usize) {
        bail!(
            "{} devices in {} {unit}s of {sizes:?} devices; expected {} {unit}s of {per_group} devices",
            devices.len(),
            groups.len(),
            expected_groups,
        );
    }
    Ok(groups
        .into_values()
        .map(|mut ids| {
            ids.sort_unstable();
            ids
        })
        .collect())
}
