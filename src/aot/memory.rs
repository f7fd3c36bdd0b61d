//! Per-device memory of a compiled program, from XLA's compile-time accounting
//! (`PJRT_Executable_GetCompiledMemoryStats`): a small table for the user, and the check that
//! turns "does not fit" into an error before anything is shipped to the cluster.
//!
//! Needed bytes = arguments + outputs - aliased + temporaries + generated code. MaxText prints
//! `compiled.memory_analysis()` as "Total memory size" = output + temp + argument - alias; the
//! generated code is added here because it is loaded into the same device memory (it is small
//! next to the rest). Outputs that alias donated arguments reuse those buffers, hence the
//! subtraction.

use std::fmt;

use anyhow::{bail, Result};
use indicatif::HumanBytes;

use crate::pjrt::CompiledMemoryStats;

/// The configuration keys that lower per-device memory, with how.
const REMEDIES: &str = "lower per_device_batch_size or max_target_length, recompute more in the backward pass \
                        (remat_policy=full), shard the weights over more devices (ici_fsdp_parallelism, or \
                        dcn_fsdp_parallelism across hosts/slices instead of dcn_data_parallelism), or keep \
                        the weights in half precision (weight_dtype=bfloat16)";

const ALIASED: &str = "outputs written into donated arguments";

/// A compiled program's memory on one device, and the device's capacity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryReport {
    pub stats: CompiledMemoryStats,
    /// Memory of one device; `None` where it is not known (CPU devices share host memory).
    pub capacity: Option<u64>,
    /// What the devices are, for messages (`a3mega-2 (NVIDIA H100 80GB HBM3)`).
    pub device: String,
}

impl MemoryReport {
    /// Bytes the program occupies on each device while it runs (see the module docs).
    pub fn needed_bytes(&self) -> u64 {
        self.stats.total_bytes().max(0) as u64
    }

    /// An error when the program needs more than a device has, naming both sizes and the keys
    /// that reduce the need. Nothing to check where the capacity is unknown.
    pub fn check(&self) -> Result<()> {
        let needed = self.needed_bytes();
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
}
