//! The valid range of every numeric key, checked before anything is traced. Every key that holds
//! a number declares its range in `keys.rs` (the registry's tests fail on a numeric key without
//! one), so a new key gets a range when it is added; an integer key that may also be `None`
//! accepts `None` besides its range.
//!
//! The bounds are sanity limits, far beyond any real model, chosen so that no size computed from
//! them (parameter counts, batch x sequence x vocabulary, mesh products) can overflow a 64-bit
//! integer; what must hold between keys (heads that group, a batch that splits) is checked in
//! `validate.rs`.

use serde_json::Value;

use super::error::ConfigError;
use super::keys::Config;
use super::registry::{self, Kind};

/// The values a numeric key accepts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Range {
    pub min: f64,
    /// `min` itself is excluded.
    pub min_open: bool,
    pub max: f64,
    /// `max` itself is excluded.
    pub max_open: bool,
    /// `-1` is accepted too (MaxText's "fill in" / "unset" value).
    pub minus_one: bool,
    pub integer: bool,
}

pub(crate) const fn int(min: i64, max: i64) -> Range {
    Range { min: min as f64, min_open: false, max: max as f64, max_open: false, minus_one: false, integer: true }
}

pub(crate) const fn int_or_fill(min: i64, max: i64) -> Range {
    Range { minus_one: true, ..int(min, max) }
}

pub(crate) const fn closed(min: f64, max: f64) -> Range {
    Range { min, min_open: false, max, max_open: false, minus_one: false, integer: false }
}

pub(crate) const fn open_min(min: f64, max: f64) -> Range {
    Range { min_open: true, ..closed(min, max) }
}

pub(crate) const fn open_max(min: f64, max: f64) -> Range {
    Range { max_open: true, ..closed(min, max) }
}

pub(crate) const fn open(min: f64, max: f64) -> Range {
    Range { min_open: true, max_open: true, ..closed(min, max) }
}

/// Largest model width: 2^20 (real models stay below 2^15).
pub(crate) const MAX_EMB: i64 = 1 << 20;
/// Largest head count, head size and layer count: 2^12.
pub(crate) const MAX_HEADS: i64 = 1 << 12;
/// Largest mesh axis: 2^20 devices.
pub(crate) const MAX_AXIS: i64 = 1 << 20;
/// Largest step count: 2^40.
pub(crate) const MAX_STEPS: i64 = 1 << 40;
/// Most devices the CPU plugin is asked for (`cpu_device_count`, `cpu-N`): its start-up time
/// grows with the square of the count (1024: ~3 s, 4096: ~12 s), and XLA aborts or crashes
/// past about 20,000.
pub const MAX_CPU_DEVICES: i64 = 1024;
/// Most GPU hosts of a compile target (hosts per slice x slices): 4,096 hosts of 8 GPUs.
pub const MAX_GPU_HOSTS: i64 = 1 << 12;
/// Longest timeout: a year, in seconds.
pub(crate) const MAX_SECONDS: i64 = 365 * 24 * 3600;

impl Range {
    pub fn contains(&self, x: f64) -> bool {
        if self.minus_one && x == -1.0 {
            return true;
        }
        let above = if self.min_open { x > self.min } else { x >= self.min };
        let below = if self.max_open { x < self.max } else { x <= self.max };
        x.is_finite() && above && below && (!self.integer || x.fract() == 0.0)
    }
}

impl std::fmt::Display for Range {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bound = |x: f64| if self.integer { format!("{}", x as i64) } else { format!("{x}") };
        write!(
            f,
            "{}{} in {}{}, {}{}",
            if self.minus_one { "-1 or " } else { "" },
            if self.integer { "an integer" } else { "a number" },
            if self.min_open { "(" } else { "[" },
            bound(self.min),
            bound(self.max),
            if self.max_open { ")" } else { "]" },
        )
    }
}

/// The range of numeric key `key`, if it is one.
pub fn range(key: &str) -> Option<Range> {
    registry::key(key)?.range
}

/// Checks every numeric key against its range; the error names the key, its value and the range.
pub(crate) fn check(config: &Config) -> Result<(), ConfigError> {
    let values = serde_json::to_value(config).map_err(|e| ConfigError::invalid("config", e.to_string()))?;
    for key in registry::keys() {
        let Some(range) = key.range else { continue };
        let (name, or_none) = (key.name, if key.kind == Kind::IntOrNone { ", or None" } else { "" });
        let value = values.get(name).unwrap_or(&Value::Null);
        if value.is_null() && !or_none.is_empty() {
            continue;
        }
        let Some(x) = value.as_f64() else {
            return Err(ConfigError::invalid(
                name,
                format!("{name} is not a finite number; it must be {range}{or_none}"),
            ));
        };
        if !range.contains(x) {
            return Err(ConfigError::invalid(name, format!("{name}={value}; it must be {range}{or_none}")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_read_as_written() {
        assert_eq!(int_or_fill(1, 8).to_string(), "-1 or an integer in [1, 8]");
        assert_eq!(open_max(0.0, 1.0).to_string(), "a number in [0, 1)");
        assert!(int_or_fill(1, 8).contains(-1.0) && !int_or_fill(1, 8).contains(0.0));
        assert!(!int(1, 8).contains(2.5) && !closed(0.0, 1.0).contains(f64::NAN));
        assert!(open(0.0, 1.0).contains(1e-5) && !open(0.0, 1.0).contains(0.0) && !open(0.0, 1.0).contains(1.0));
    }
}
