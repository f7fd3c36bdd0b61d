//! The host's memory: how much this machine has, and whether a train step compiled for the CPU
//! plugin's devices (which share it) fits.

use anyhow::Result;
use indicatif::HumanBytes;

use crate::pjrt::{self, Client};

/// Total memory of this machine, from `/proc/meminfo` (Linux); `None` elsewhere.
pub(super) fn host_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// [`crate::pjrt::gpu_memory::step_shortfall`] for the CPU plugin, whose devices share this machine's memory:
/// `None` when a compiled step of `stats` on each of `client`'s devices fits in it (or the
/// devices are not the host's), else what it needs and what there is. Without it a step too
/// large for the machine (deepseek3-tiny's defaults: 32 GB) died of XLA's allocation error,
/// which names no key.
pub(super) fn cpu_step_shortfall(client: &Client, stats: &pjrt::CompiledMemoryStats) -> Result<Option<String>> {
    if client.platform_name()? != "cpu" {
        return Ok(None);
    }
    let Some(host) = host_memory_bytes() else { return Ok(None) };
    let devices = client.addressable_devices()?.len() as u64;
    let per_device = stats.total_bytes().max(0) as u64;
    let needed = per_device.saturating_mul(devices);
    Ok((needed > host).then(|| {
        format!(
            "needs {} on the CPU devices ({devices} x {}), more than this machine's {} of memory",
            HumanBytes(needed),
            HumanBytes(per_device),
            HumanBytes(host)
        )
    }))
}
