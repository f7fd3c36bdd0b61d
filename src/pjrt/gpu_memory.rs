//! How much of each GPU a run may use. Owns the CUDA plugin's allocator settings, read as JAX
//! reads them (jaxlib 0.11.2 `jaxlib/xla_client.py` `generate_pjrt_gpu_plugin_options`: the
//! environment variables below, with JAX's spellings and checks), the client options they become,
//! and the budget a step's per-device memory is judged against: by `train-compile` before the
//! step ships (device memory x fraction) and by `maxrs train` once the devices exist (the limit
//! the plugin reports).
//!
//! | variable | client option | unset (XLA's default) |
//! |---|---|---|
//! | `XLA_PYTHON_CLIENT_ALLOCATOR` | `allocator`: default, platform, bfc, cuda_async, vmm, address | `default` (BFC) |
//! | `XLA_CLIENT_MEM_FRACTION`, or the deprecated `XLA_PYTHON_CLIENT_MEM_FRACTION` (both set: error) | `memory_fraction` | 0.75 |
//! | `XLA_PYTHON_CLIENT_PREALLOCATE` (`false`, `False`, `0`: off) | `preallocate` | on |
//! | `XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB` | `collective_memory_size` (bytes) | 0: grows |
//! | `XLA_PYTHON_CLIENT_ABORT_COLLECTIVES_ON_FAILURE` (an integer, non-zero: on) | `abort_collectives_on_failure` | off |
//!
//! XLA's defaults are `GpuAllocatorConfig`'s (openxla/xla `xla/pjrt/gpu/gpu_helpers.h` at
//! 5d8f791; now `xla/pjrt/gpu/allocator_config.h` at a14fe88): the BFC allocator, memory
//! fraction 0.75, preallocated. Its pool may hold `total device memory x memory_fraction` bytes,
//! taken at start or grown on demand up to the same limit (`gpu_helpers.cc` at 963f488,
//! `CreateBFCAllocator`: `allow_growth = !preallocate`); so preallocate=false lets two processes
//! share a GPU but gives none of them more. The platform allocator has no pool and no limit of
//! its own. maxrs passes only the options a variable sets: the plugin's defaults are the ones
//! above, so this is what JAX does, and a plugin that does not know an option is only asked for
//! it when the user asked.

use std::fmt;
use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use indicatif::HumanBytes;

use super::{Client, KeyValueStore, Plugin, Value};

/// XLA's memory fraction when none is set (`GpuAllocatorConfig::memory_fraction`).
pub const DEFAULT_FRACTION: f64 = 0.75;
/// The variable maxrs names when asking for a larger fraction: the one MaxText's GPU scripts
/// set (`tools/orchestration/gpu_multi_process_run.sh` at e591f30: 0.85) and every JAX reads.
pub const FRACTION_VAR: &str = "XLA_PYTHON_CLIENT_MEM_FRACTION";
/// JAX 0.11's name for the fraction; `FRACTION_VAR` is its deprecated alias.
pub const NEW_FRACTION_VAR: &str = "XLA_CLIENT_MEM_FRACTION";
const ALLOCATOR_VAR: &str = "XLA_PYTHON_CLIENT_ALLOCATOR";
const PREALLOCATE_VAR: &str = "XLA_PYTHON_CLIENT_PREALLOCATE";
const COLLECTIVE_VAR: &str = "XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB";
const ABORT_VAR: &str = "XLA_PYTHON_CLIENT_ABORT_COLLECTIVES_ON_FAILURE";
/// JAX's switch to another GPU client implementation, which maxrs does not drive.
const TFRT_VAR: &str = "XLA_PYTHON_CLIENT_USE_TFRT_GPU_CLIENT";

/// The highest fraction maxrs advises (maxrs's own rule): the rest of the device holds what
/// lives outside the allocator's pool (CUDA's context, cuBLAS and cuDNN workspaces, NCCL's
/// buffers). MaxText's GPU scripts go up to 0.94.
pub const MAX_ADVISED_FRACTION: f64 = 0.95;

/// JAX's allocator names (`allowed_allocators` in `generate_pjrt_gpu_plugin_options`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocatorKind {
    /// XLA picks: BFC on CUDA.
    Default,
    /// cudaMalloc and cudaFree per buffer: no pool, no limit but the device's free memory.
    Platform,
    Bfc,
    CudaAsync,
    Vmm,
    Address,
}

impl AllocatorKind {
    pub const ALL: [AllocatorKind; 6] =
        [Self::Default, Self::Platform, Self::Bfc, Self::CudaAsync, Self::Vmm, Self::Address];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Default => "default",
            Self::Platform => "platform",
            Self::Bfc => "bfc",
            Self::CudaAsync => "cuda_async",
            Self::Vmm => "vmm",
            Self::Address => "address",
        }
    }
}

/// A value and the variable that set it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FromVar<T> {
    pub value: T,
    pub var: &'static str,
}

/// The allocator settings of a CUDA client: each `None` is unset (XLA's default applies).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuAllocator {
    pub kind: Option<AllocatorKind>,
    pub fraction: Option<FromVar<f64>>,
    pub preallocate: Option<bool>,
    pub collective_memory_bytes: Option<i64>,
    pub abort_collectives_on_failure: Option<bool>,
}

impl GpuAllocator {
    /// The settings this process's environment gives; a value JAX would refuse, or one maxrs
    /// cannot honour, is an error naming the variable.
    pub fn from_env() -> Result<GpuAllocator> {
        Self::from_lookup(|var| match std::env::var(var) {
            Ok(value) => Ok(Some(value)),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(v)) => bail!("{var}={v:?} is not UTF-8 text"),
        })
    }

    /// The settings `lookup` gives for each variable (`None`: unset).
    pub fn from_lookup(lookup: impl Fn(&str) -> Result<Option<String>>) -> Result<GpuAllocator> {
        // JAX reads an empty fraction, preallocate or collective size as unset (`if value:`),
        // but an empty allocator as the (invalid) name "".
        let get = |var: &'static str| -> Result<Option<String>> { Ok(lookup(var)?.filter(|v| !v.is_empty())) };
        let kind = match lookup(ALLOCATOR_VAR)? {
            None => None,
            Some(value) => {
                Some(AllocatorKind::ALL.into_iter().find(|k| value.to_lowercase() == k.as_str()).ok_or_else(|| {
                    let names: Vec<&str> = AllocatorKind::ALL.iter().map(|k| k.as_str()).collect();
                    anyhow!("{ALLOCATOR_VAR}={value:?} is not an allocator JAX knows; give one of {}", names.join(", "))
                })?)
            }
        };
        let fraction = match (get(NEW_FRACTION_VAR)?, get(FRACTION_VAR)?) {
            (Some(new), Some(old)) => bail!(
                "{NEW_FRACTION_VAR}={new:?} and {FRACTION_VAR}={old:?} are both set, which JAX refuses; unset \
                 {FRACTION_VAR}, the deprecated name"
            ),
            (Some(value), None) => {
                Some(FromVar { value: parse_fraction(NEW_FRACTION_VAR, &value)?, var: NEW_FRACTION_VAR })
            }
            (None, Some(value)) => Some(FromVar { value: parse_fraction(FRACTION_VAR, &value)?, var: FRACTION_VAR }),
            (None, None) => None,
        };
        let preallocate = match get(PREALLOCATE_VAR)?.as_deref() {
            None => None,
            Some("false" | "False" | "0") => Some(false),
            Some("true" | "True" | "1") => Some(true),
            // JAX takes every other value for true; a typo of "false" must not preallocate.
            Some(other) => bail!(
                "{PREALLOCATE_VAR}={other:?}: give false (also False or 0: allocate on demand) or true (also True \
                 or 1: XLA's default)"
            ),
        };
        let collective_memory_bytes = match get(COLLECTIVE_VAR)? {
            None => None,
            Some(value) => Some(
                value.trim().parse::<i64>().ok().filter(|mb| (0..=(i64::MAX >> 20)).contains(mb)).ok_or_else(|| {
                    anyhow!(
                        "{COLLECTIVE_VAR}={value:?} is not a whole number of MiB >= 0; give the collective memory \
                             to preallocate, e.g. 512 (0 or unset: grow it as needed)"
                    )
                })? << 20,
            ),
        };
        let abort_collectives_on_failure = get(ABORT_VAR)?.map(|v| parse_switch(ABORT_VAR, &v)).transpose()?;
        if let Some(value) = get(TFRT_VAR)? {
            if parse_switch(TFRT_VAR, &value)? {
                bail!("{TFRT_VAR}={value:?}: JAX's TFRT GPU client is not supported yet by maxrs; unset it or set 0");
            }
        }
        Ok(GpuAllocator { kind, fraction, preallocate, collective_memory_bytes, abort_collectives_on_failure })
    }

    /// The `PJRT_Client_Create` options of the settings made, under the names jaxlib gives them.
    pub fn client_options(&self) -> Vec<(String, Value)> {
        let mut options = Vec::new();
        if let Some(kind) = self.kind {
            options.push(("allocator".to_string(), Value::Str(kind.as_str().to_string())));
        }
        if let Some(fraction) = self.fraction {
            options.push(("memory_fraction".to_string(), Value::F32(fraction.value as f32)));
        }
        if let Some(preallocate) = self.preallocate {
            options.push(("preallocate".to_string(), Value::Bool(preallocate)));
        }
        if let Some(bytes) = self.collective_memory_bytes {
            options.push(("collective_memory_size".to_string(), Value::I64(bytes)));
        }
        if let Some(abort) = self.abort_collectives_on_failure {
            options.push(("abort_collectives_on_failure".to_string(), Value::Bool(abort)));
        }
        options
    }

    /// The fraction of each device's memory the allocator may use.
    pub fn fraction(&self) -> f64 {
        self.fraction.map_or(DEFAULT_FRACTION, |f| f.value)
    }

    /// Whether the allocator is held to `fraction` (all but the platform allocator).
    pub fn is_capped(&self) -> bool {
        self.kind != Some(AllocatorKind::Platform)
    }

    /// Bytes the allocator may hand out on a device of `device_bytes`: XLA's
    /// `total_memory * memory_fraction`, truncated as its `size_t` is; the whole device for the
    /// platform allocator.
    pub fn usable_bytes(&self, device_bytes: u64) -> u64 {
        if self.is_capped() {
            (device_bytes as f64 * self.fraction()) as u64
        } else {
            device_bytes
        }
    }

    /// A client-create failure explained when it concerns an option a variable set (an older
    /// plugin may not know one): one line naming the option, the variable and the plugin file.
    pub fn explain_create_error(&self, plugin: &Plugin, error: &super::Error) -> Option<String> {
        let message = error.to_string();
        let (option, _) = self.client_options().into_iter().find(|(name, _)| message.contains(name.as_str()))?;
        let var = match option.as_str() {
            "allocator" => ALLOCATOR_VAR,
            "memory_fraction" => self.fraction.map_or(FRACTION_VAR, |f| f.var),
            "preallocate" => PREALLOCATE_VAR,
            "collective_memory_size" => COLLECTIVE_VAR,
            _ => ABORT_VAR,
        };
        Some(format!(
            "the plugin {} refused the client option `{option}` that {var} sets ({}); unset {var}, or use a plugin \
             build that knows the option (cuda12 or cuda13)",
            plugin.path().display(),
            message.lines().next().unwrap_or_default().trim()
        ))
    }
}

impl fmt::Display for GpuAllocator {
    /// `default (BFC) allocator, preallocated, memory fraction 0.75 (XLA's default; ...)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            None => write!(f, "default (BFC) allocator")?,
            Some(AllocatorKind::Default) => write!(f, "default (BFC) allocator ({ALLOCATOR_VAR})")?,
            Some(kind) => write!(f, "{} allocator ({ALLOCATOR_VAR})", kind.as_str())?,
        }
        if !self.is_capped() {
            return write!(f, ", no pool: each buffer from the device's free memory");
        }
        match self.preallocate {
            None => write!(f, ", preallocated")?,
            Some(true) => write!(f, ", preallocated ({PREALLOCATE_VAR})")?,
            Some(false) => write!(f, ", grown on demand ({PREALLOCATE_VAR}=false)")?,
        }
        match self.fraction {
            None => write!(f, ", memory fraction {DEFAULT_FRACTION} (XLA's default; {FRACTION_VAR} sets it)"),
            Some(FromVar { value, var }) => write!(f, ", memory fraction {value} ({var})"),
        }
    }
}

/// A fraction JAX would pass: a number in (0, 1].
fn parse_fraction(var: &str, value: &str) -> Result<f64> {
    match value.trim().parse::<f64>() {
        Ok(f) if f > 0.0 && f <= 1.0 => Ok(f),
        _ => bail!(
            "{var}={value:?} is not a fraction in (0, 1]; give the share of each GPU's memory XLA's allocator may \
             use, e.g. 0.9 (XLA's default: {DEFAULT_FRACTION})"
        ),
    }
}

/// JAX's `bool(int(value))`: an integer, non-zero for on.
fn parse_switch(var: &str, value: &str) -> Result<bool> {
    let n: i64 =
        value.trim().parse().map_err(|_| anyhow!("{var}={value:?} is not an integer; give 0 (off) or 1 (on)"))?;
    Ok(n != 0)
}

/// Whether `plugin` drives NVIDIA GPUs: it reports the CUDA release it was built for.
pub fn is_cuda_plugin(plugin: &Plugin) -> bool {
    plugin.attributes().is_ok_and(|attributes| attributes.iter().any(|(key, _)| key == "cuda_version"))
}

/// A client of `plugin` with `options`; a CUDA plugin's also with the allocator settings of the
/// environment ([`GpuAllocator::from_env`]), and an option it refuses explained in one line.
pub fn create_client(
    plugin: &Arc<Plugin>,
    mut options: Vec<(String, Value)>,
    store: Option<Arc<dyn KeyValueStore>>,
) -> Result<Client> {
    let allocator = if is_cuda_plugin(plugin) { Some(GpuAllocator::from_env()?) } else { None };
    options.extend(allocator.iter().flat_map(GpuAllocator::client_options));
    Client::create(plugin, &options, store).map_err(|e| {
        match allocator.as_ref().and_then(|a| a.explain_create_error(plugin, &e)) {
            Some(line) => anyhow!(line),
            None => anyhow!(e),
        }
    })
}

/// The start-up line of a client's GPU memory (`None` for other platforms).
pub fn describe_client(client: &Client) -> Result<Option<String>> {
    if client.platform_name()? != "cuda" {
        return Ok(None);
    }
    Ok(Some(match client_budget(client)? {
        Some(budget) => format!("GPU memory: {budget}"),
        None => format!("GPU memory: {}; the plugin reports no limit", GpuAllocator::from_env()?),
    }))
}

/// The memory a step may use on each GPU of a run, and where that number comes from.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuBudget {
    pub allocator: GpuAllocator,
    /// One device's memory: as the plugin describes the target (`train-compile`), or on a live
    /// device its limit / fraction.
    pub device_bytes: u64,
    /// What the allocator may hand out on one device.
    pub usable_bytes: u64,
    /// `usable_bytes` is the limit a live client reports, not computed.
    pub reported: bool,
}

impl GpuBudget {
    /// The budget of a target's devices of `device_bytes` each, before any exists.
    pub fn planned(allocator: GpuAllocator, device_bytes: u64) -> GpuBudget {
        let usable_bytes = allocator.usable_bytes(device_bytes);
        GpuBudget { allocator, device_bytes, usable_bytes, reported: false }
    }

    /// The budget of live devices whose allocator reports `limit` bytes (the smallest over the
    /// devices); `None` without a limit (the platform allocator has none).
    pub fn reported(allocator: GpuAllocator, limit: Option<u64>) -> Option<GpuBudget> {
        let usable_bytes = limit.filter(|_| allocator.is_capped())?;
        let device_bytes = (usable_bytes as f64 / allocator.fraction()) as u64;
        Some(GpuBudget { allocator, device_bytes, usable_bytes, reported: true })
    }

    /// `None` when `needed` bytes per device fit; else what does not fit, with both numbers,
    /// and the variable that gives more when more would help (a fraction up to
    /// [`MAX_ADVISED_FRACTION`] that covers `needed`).
    pub fn shortfall(&self, needed: u64) -> Option<String> {
        if needed <= self.usable_bytes {
            return None;
        }
        let mut line = format!(
            "needs {} ({needed} bytes) per device, but a run may use {} ({} bytes) of each GPU's {}: {}",
            HumanBytes(needed),
            HumanBytes(self.usable_bytes),
            self.usable_bytes,
            HumanBytes(self.device_bytes),
            self.allocator
        );
        let fraction = (needed as f64 / self.device_bytes as f64 * 100.0).ceil() / 100.0;
        let var = self.allocator.fraction.map_or(FRACTION_VAR, |f| f.var);
        if self.allocator.is_capped() && fraction <= MAX_ADVISED_FRACTION {
            line.push_str(&format!(
                ". Set {var}={fraction:.2} (or more, up to {MAX_ADVISED_FRACTION}) for the run and for train-compile, \
                 or make the step smaller"
            ));
        } else if self.allocator.is_capped() {
            line.push_str(&format!(
                ". It needs {:.0}% of the device; past {var}={MAX_ADVISED_FRACTION} too little is left for what \
                 lives outside the allocator (CUDA's context, cuBLAS/cuDNN workspaces, NCCL buffers): make the step \
                 smaller",
                fraction * 100.0
            ));
        } else {
            line.push_str(": make the step smaller");
        }
        Some(line)
    }
}

impl fmt::Display for GpuBudget {
    /// `59.33 GiB usable of 79.11 GiB per device: <allocator>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let of = if self.reported {
            "the plugin's limit".to_string()
        } else {
            format!("of {}", HumanBytes(self.device_bytes))
        };
        write!(f, "{} usable per GPU ({of}): {}", HumanBytes(self.usable_bytes), self.allocator)
    }
}

/// The budget of `client`'s devices: `None` unless it is a CUDA client whose allocator reports
/// a limit. Reads the settings from the environment, as the client was created with them.
pub fn client_budget(client: &Client) -> Result<Option<GpuBudget>> {
    if client.platform_name()? != "cuda" {
        return Ok(None);
    }
    let mut limit: Option<u64> = None;
    for device in client.addressable_devices()? {
        if let Some(bytes) = device.memory_stats()?.and_then(|s| s.bytes_limit).filter(|b| *b > 0) {
            limit = Some(limit.map_or(bytes as u64, |l| l.min(bytes as u64)));
        }
    }
    Ok(GpuBudget::reported(GpuAllocator::from_env()?, limit))
}

/// `maxrs train`'s verdict on a compiled step of `stats` on `client`'s devices: `None` when it
/// fits what the allocator may hand out (or nothing limits it), else the shortfall
/// ([`GpuBudget::shortfall`]). Checked before the state is put on the devices, so a step that
/// cannot fit fails with both numbers instead of XLA's out-of-memory error mid-step.
pub fn step_shortfall(client: &Client, stats: &super::CompiledMemoryStats) -> Result<Option<String>> {
    Ok(client_budget(client)?.and_then(|budget| budget.shortfall(stats.total_bytes().max(0) as u64)))
}

#[cfg(test)]
mod tests;
