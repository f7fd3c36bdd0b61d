//! MaxText's `profiler` key during training (`src/maxtext/common/profiler.py`, main at e591f30):
//! profiling starts before step `skip_first_n_steps_for_profiler` and stops after step
//! `min(skip + profiler_steps - 1, steps - 1)`, with the devices idle at both ends (MaxText's
//! `profile_cleanly`: the loop finishes the steps in flight first).
//!
//! - `xplane`: the PJRT plugin's own profiler (`pjrt::Profiler`); the trace is written where
//!   `jax.profiler.start_trace(tensorboard_dir)` writes it and TensorBoard's profile plugin
//!   looks: `base_output_directory/run_name/tensorboard/plugins/profile/<YYYY_MM_DD_HH_MM_SS>/
//!   <host>.xplane.pb` (a local directory or `gs://`, through `storage`).
//! - `nsys`: `cudaProfilerStart()` / `cudaProfilerStop()` from `libcudart`, which Nsight Systems
//!   started with `--capture-range=cudaProfilerApi` uses to bracket its capture; without
//!   `libcudart` (or outside Nsight) it has no effect, as in MaxText.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};

use super::outputs;
use crate::config::{Config, ProfilerKind};
use crate::files::Location;
use crate::pjrt::{self, Plugin};
use crate::storage;

/// The profiled step range and what profiles it.
pub struct StepProfiler {
    kind: ProfilerKind,
    first: u64,
    last: u64,
    /// Where traces go (`xplane`): `tensorboard_dir/plugins/profile`.
    profiles: Option<Location>,
    plugin: Arc<Plugin>,
    session: Option<Session>,
}

enum Session {
    Xplane(pjrt::Profiler),
    Nsys(libloading::Library),
}

/// The directory TensorBoard reads a run from: `base_output_directory/run_name/tensorboard`
/// (MaxText's `tensorboard_dir`), when the run has an output directory.
pub fn tensorboard_dir(c: &Config) -> Result<Option<Location>> {
    Ok(outputs::run_dir(c)?.map(|dir| dir.join("tensorboard")))
}

impl StepProfiler {
    /// The profiler `c` asks for over a run of `steps` steps, or `None`. For `xplane` the output
    /// directory is created now, so that an unwritable one fails before training.
    pub fn new(c: &Config, plugin: &Arc<Plugin>, steps: u64) -> Result<Option<StepProfiler>> {
        if c.profiler == ProfilerKind::None {
            return Ok(None);
        }
        let first = c.skip_first_n_steps_for_profiler as u64;
        let last = (first + c.profiler_steps as u64 - 1).min(steps.saturating_sub(1));
        let mut profiles = None;
        if c.profiler == ProfilerKind::Xplane {
            if !pjrt::Profiler::available(plugin) {
                bail!(
                    "profiler=xplane: the plugin {} has no profiler (PJRT's profiler extension); the CUDA and TPU \
                     plugins have one, the CPU plugin does not",
                    plugin.path().display()
                );
            }
            let dir = tensorboard_dir(c)?
                .ok_or_else(|| anyhow!("profiler=xplane needs base_output_directory"))?
                .join("plugins")
                .join("profile");
            if let Some(path) = dir.local_path() {
                std::fs::create_dir_all(path)
                    .with_context(|| format!("profiler=xplane: cannot create {}", path.display()))?;
            }
            profiles = Some(dir);
        }
        Ok(Some(StepProfiler { kind: c.profiler, first, last, profiles, plugin: plugin.clone(), session: None }))
    }

    /// Whether profiling starts before `step`.
    pub fn starts_at(&self, step: u64) -> bool {
        step == self.first
    }

    /// Whether profiling stops after `step`.
    pub fn stops_after(&self, step: u64) -> bool {
        step == self.last
    }

    pub fn start(&mut self) -> Result<()> {
        self.session = match self.kind {
            ProfilerKind::None => None,
            ProfilerKind::Xplane => {
                let profiler = pjrt::Profiler::start(&self.plugin).with_context(|| {
                    format!("profiler=xplane: the plugin {} cannot profile", self.plugin.path().display())
                })?;
                Some(Session::Xplane(profiler))
            }
            ProfilerKind::Nsys => cuda_profiler("cudaProfilerStart").map(Session::Nsys),
        };
        println!("profiler={}: profiling steps {} to {}", self.kind, self.first, self.last);
        Ok(())
    }

    /// Stops profiling; returns the trace file written, for `xplane`.
    pub fn stop(&mut self) -> Result<Option<Location>> {
        match self.session.take() {
            None => Ok(None),
            Some(Session::Nsys(library)) => {
                call_cuda(&library, "cudaProfilerStop");
                Ok(None)
            }
            Some(Session::Xplane(profiler)) => {
                let trace = profiler.stop().context("profiler=xplane: collecting the trace")?;
                let profiles = self.profiles.as_ref().expect("xplane has a trace directory");
                let run = profiles.join(&timestamp(SystemTime::now()));
                let path = run.join(&format!("{}.xplane.pb", hostname()));
                storage::write(&path, &trace).with_context(|| format!("profiler=xplane: writing {path}"))?;
                println!("profiler=xplane: wrote {path}");
                Ok(Some(path))
            }
        }
    }
}

/// `libcudart` with `function` called, or `None` (with a warning) when it cannot be loaded.
fn cuda_profiler(function: &str) -> Option<libloading::Library> {
    for name in ["libcudart.so", "libcudart.so.12", "libcudart.so.13"] {
        // SAFETY: loading the CUDA runtime runs its initializers, which have no preconditions.
        if let Ok(library) = unsafe { libloading::Library::new(name) } {
            call_cuda(&library, function);
            return Some(library);
        }
    }
    println!("profiler=nsys: libcudart cannot be loaded; the profiler has no effect");
    None
}

/// Calls a `cudaError_t f(void)` of the CUDA runtime, warning on failure.
fn call_cuda(library: &libloading::Library, function: &str) {
    // SAFETY: cudaProfilerStart and cudaProfilerStop take no arguments and return cudaError_t.
    let result = unsafe { library.get::<unsafe extern "C" fn() -> i32>(function.as_bytes()).map(|f| f()) };
    match result {
        Ok(0) => {}
        Ok(code) => println!("profiler=nsys: {function} returned CUDA error {code}"),
        Err(e) => println!("profiler=nsys: {function} is missing from libcudart: {e}"),
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

/// `YYYY_MM_DD_HH_MM_SS` in UTC, the run folder name `jax.profiler` uses.
pub fn timestamp(at: SystemTime) -> String {
    let secs = at.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0) as i64;
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (year, month, day) = outputs::civil_from_days(days);
    format!("{year:04}_{month:02}_{day:02}_{:02}_{:02}_{:02}", rest / 3600, rest % 3600 / 60, rest % 60)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// `date -u -d @1795452384 +%Y_%m_%d_%H_%M_%S` and `@951782400` (a leap day).
    #[test]
    fn timestamps_are_utc_calendar_dates() {
        assert_eq!(timestamp(UNIX_EPOCH + Duration::from_secs(1_795_452_384)), "2026_11_23_16_46_24");
        assert_eq!(timestamp(UNIX_EPOCH + Duration::from_secs(951_782_400)), "2000_02_29_00_00_00");
        assert_eq!(timestamp(UNIX_EPOCH), "1970_01_01_00_00_00");
    }
}
