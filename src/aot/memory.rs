//! Per-device memory of a compiled program, from XLA's compile-time accounting
//! (`PJRT_Executable_GetCompiledMemoryStats`): a small table for the user, and the check that
//! turns "does not fit" into an error before anything is shipped to the cluster.
//!
//! Needed bytes = arguments + outputs - aliased + temporaries + generated code. MaxText prints
//! `compiled.memory_analysis()` as "Total memory size" = output + temp + argument - alias; the
//! generated code is added here because it is loaded into the same device memory (it is small
//! next to the rest). Outputs that alias donated arguments reuse those buffers, hence the
//! subtraction.
//!
//! On a GPU the program does not get the whole device: XLA's allocator may hand out the
//! device's memory x the memory fraction JAX's variables set (`pjrt::gpu_memory`), so a CUDA
//! target is judged against that budget, and a shortfall names the variable that gives more.

use std::fmt;

use anyhow::{bail, Result};
use indicatif::HumanBytes;

use crate::config::MEMORY_REMEDIES as REMEDIES;
use crate::pjrt::gpu_memory::GpuBudget;
use crate::pjrt::CompiledMemoryStats;

const ALIASED: &str = "outputs written into donated arguments";

/// A compiled program's memory on one device, and the device's capacity.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryReport {
    pub stats: CompiledMemoryStats,
    /// Memory of one device; `None` where it is not known (CPU devices share host memory).
    pub capacity: Option<u64>,
    /// GPU targets: the part of `capacity` XLA's allocator may use under this environment's
    /// settings, which the program is judged against.
    pub budget: Option<GpuBudget>,
    /// What the devices are, for messages (`a3mega-2 (NVIDIA H100 80GB HBM3)`).
    pub device: String,
}

impl MemoryReport {
    /// Bytes the program occupies on each device while it runs (see the module docs).
    pub fn needed_bytes(&self) -> u64 {
        self.stats.total_bytes().max(0) as u64
    }

    /// An error when the program needs more than a device has (on a GPU: more than the
    /// allocator may use), naming both sizes and the keys that reduce the need (on a GPU also
    /// the variable that gives more). Nothing to check where the capacity is unknown.
    pub fn check(&self) -> Result<()> {
        let needed = self.needed_bytes();
        if let Some(short) = self.budget.as_ref().and_then(|b| b.shortfall(needed)) {
            bail!("out of memory: the compiled program {short}.\n{self}\nTo fit, {REMEDIES}.");
        }
        match self.capacity {
            Some(capacity) if needed > capacity => bail!(
                "out of memory: the compiled program needs {} ({needed} bytes) per device, but each device of {} \
                 has {} ({capacity} bytes), {} short.\n{self}\nTo fit, {REMEDIES}.",
                HumanBytes(needed),
                self.device,
                HumanBytes(capacity),
                HumanBytes(needed - capacity),
            ),
            _ => Ok(()),
        }
    }
}

impl fmt::Display for MemoryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.stats;
        let bytes = |n: i64| HumanBytes(n.max(0) as u64).to_string();
        let rows = [
            ("arguments", bytes(s.argument_bytes), ""),
            ("outputs", bytes(s.output_bytes), ""),
            ("aliased", format!("{}{}", if s.alias_bytes > 0 { "-" } else { "" }, bytes(s.alias_bytes)), ALIASED),
            ("temporaries", bytes(s.temp_bytes), ""),
            ("generated code", bytes(s.generated_code_bytes), ""),
        ];
        writeln!(f, "memory per device on {}:", self.device)?;
        for (what, value, note) in rows {
            writeln!(f, "{}", format!("  {what:<15} {value:>12}  {note}").trim_end())?;
        }
        let needed = self.needed_bytes();
        write!(f, "  {:<15} {:>12}", "needed", HumanBytes(needed).to_string())?;
        if let Some(capacity) = self.capacity {
            let share = 100.0 * needed as f64 / capacity as f64;
            write!(f, "  of {} ({share:.1}%)", HumanBytes(capacity))?;
        }
        if let Some(budget) = &self.budget {
            let share = 100.0 * needed as f64 / budget.usable_bytes.max(1) as f64;
            write!(
                f,
                "\n  {:<15} {:>12}  ({share:.1}% of it needed): {}",
                "usable",
                HumanBytes(budget.usable_bytes).to_string(),
                budget.allocator
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: i64 = 1 << 30;

    fn report(temp_bytes: i64, capacity: Option<u64>) -> MemoryReport {
        MemoryReport {
            stats: CompiledMemoryStats {
                generated_code_bytes: 1 << 20,
                argument_bytes: 20 * GIB,
                output_bytes: 20 * GIB,
                alias_bytes: 19 * GIB,
                temp_bytes,
                peak_bytes: 0,
            },
            capacity,
            budget: None,
            device: "a3mega-2 (NVIDIA H100 80GB HBM3)".into(),
        }
    }

    #[test]
    fn needed_counts_aliased_outputs_once_and_includes_code() {
        assert_eq!(report(30 * GIB, None).needed_bytes(), (51 * GIB + (1 << 20)) as u64);
    }

    #[test]
    fn a_program_that_fits_passes_and_one_byte_more_fails_with_both_sizes_and_the_keys() {
        let fits = report(30 * GIB, Some(80 * GIB as u64));
        fits.check().unwrap();
        let exact = fits.needed_bytes();
        report(30 * GIB, Some(exact)).check().unwrap();
        let err = report(30 * GIB, Some(exact - 1)).check().unwrap_err().to_string();
        assert!(err.contains(&format!("needs 51.00 GiB ({exact} bytes)")), "{err}");
        assert!(err.contains(&format!("({} bytes), 1 B short", exact - 1)), "{err}");
        assert!(err.contains("a3mega-2 (NVIDIA H100 80GB HBM3)"), "{err}");
        for key in ["per_device_batch_size", "max_target_length", "remat_policy", "ici_fsdp_parallelism", "dcn_"] {
            assert!(err.contains(key), "{key} missing from: {err}");
        }
        assert!(err.contains("weight_dtype"), "{err}");
    }

    #[test]
    fn unknown_capacity_is_not_checked_and_the_table_shows_every_row() {
        let huge = report(1 << 50, None);
        huge.check().unwrap();
        let table = huge.to_string();
        for row in ["arguments", "outputs", "aliased", "temporaries", "generated code", "needed"] {
            assert!(table.contains(row), "{row} missing from:\n{table}");
        }
        assert!(table.contains("-19.00 GiB") && !table.contains(" of "), "{table}");
        assert!(report(30 * GIB, Some(102 * GIB as u64)).to_string().contains("of 102.00 GiB (50.0%)"));
    }

    /// The seed recipe: 59.45 GiB needed on an H100 of 79.11 GiB "fits" the device, but
    /// XLA's allocator gives 75% of it by default (59.33 GiB).
    #[test]
    fn a_gpu_step_is_judged_against_the_allocators_share_and_names_the_variable() {
        use crate::pjrt::gpu_memory::{GpuAllocator, GpuBudget};
        let h100: u64 = 84_942_979_072; // the plugin's H100 description: 79.11 GiB
        let needed = (59.45 * GIB as f64) as i64;
        let mut r = report(needed - (21 * GIB + (1 << 20)), Some(h100));
        assert_eq!(r.needed_bytes(), needed as u64);
        r.budget = Some(GpuBudget::planned(GpuAllocator::default(), h100));
        let err = r.check().unwrap_err().to_string();
        assert!(err.contains("needs 59.45 GiB") && err.contains("may use 59.33 GiB"), "{err}");
        // 59.45 / 79.11 = 0.7515: the next hundredth.
        assert!(err.contains("Set XLA_PYTHON_CLIENT_MEM_FRACTION=0.76 "), "{err}");
        assert!(err.contains("usable") && err.contains("per_device_batch_size"), "{err}");
        let allocator =
            GpuAllocator::from_lookup(|v| Ok((v == "XLA_PYTHON_CLIENT_MEM_FRACTION").then(|| "0.76".into())));
        r.budget = Some(GpuBudget::planned(allocator.unwrap(), h100));
        r.check().unwrap();
        assert!(r.to_string().contains("memory fraction 0.76 (XLA_PYTHON_CLIENT_MEM_FRACTION)"), "{r}");
    }
}
