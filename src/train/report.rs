//! What a training run returns ([`RunReport`], for tests and benchmarks) and the summary line it
//! ends with. Both step executors fill the same report; the pipelined one adds its
//! [`PipelineReport`].

use crate::checkpoint::Saved;
use crate::data;
use crate::pjrt;

use super::metrics::{median_step_time_after, EvalMetrics, PerDeviceWork};

/// Wall times of the start-up phases, in seconds.
#[derive(Clone, Debug, Default)]
pub struct StartupTimes {
    /// Plugin load and client creation.
    pub client: f64,
    /// Tracing the train step (with its gradient) into the IR.
    pub trace: f64,
    /// IR to StableHLO text.
    pub lower: f64,
    /// XLA compile of the train step, or loading the one `compiled_trainstep_file` names.
    pub compile: f64,
    /// Building the initial state on the devices (init program or parameter file).
    pub init: f64,
}

/// What a run did.
#[derive(Clone, Debug, Default)]
pub struct RunReport {
    pub startup: StartupTimes,
    /// Per step.
    pub losses: Vec<f64>,
    pub grad_norms: Vec<f64>,
    pub learning_rates: Vec<f64>,
    pub step_times: Vec<f64>,
    /// Each eval: the train step it followed and its metrics.
    pub evals: Vec<EvalMetrics>,
    /// Seconds per step the loop waited for the input pipeline's next batch.
    pub data_wait_times: Vec<f64>,
    /// The data stream's position after the last step (what a checkpoint saves).
    pub data_state: Option<data::DataState>,
    /// TFLOPs per device per step (MaxText's formula).
    pub tflops_per_device: f64,
    /// Peak device memory in use after the run, when the plugin reports it.
    pub peak_memory_bytes: Option<i64>,
    /// The first step this run executed (0, or one past the restored checkpoint's step).
    pub first_step: u64,
    /// Checkpoints written, in order.
    pub checkpoints: Vec<Saved>,
    /// Seconds the loop spent copying the state off the devices for each checkpoint: with
    /// `async_checkpointing`, the training time a save costs.
    pub snapshot_seconds: Vec<f64>,
    /// Saves that failed under `on_checkpoint_error=continue`.
    pub checkpoint_failures: Vec<String>,
    /// The signal that ended the run early (`SIGTERM`, `SIGINT`).
    pub stopped_by: Option<&'static str>,
    /// The share of wall time the devices had finished a step and the host had not yet
    /// dispatched the next (steps after the first `perf_skipped_steps`), when measurable.
    pub device_idle_fraction: Option<f64>,
    /// Steps left out of the performance summary (`skip_first_n_steps_for_profiler`).
    pub perf_skipped_steps: usize,
    /// With pipeline parallelism: the measured bubble of each step.
    pub pipeline: Option<PipelineReport>,
}

/// The pipeline's part of a run's report.
#[derive(Clone, Debug, Default)]
pub struct PipelineReport {
    /// The schedule as it ran (`gpipe`, `1f1b`, `interleaved_1f1b`).
    pub schedule: String,
    /// `(stages - 1) / (repeats x microbatches + stages - 1)`.
    pub theoretical_bubble: f64,
    /// Per step: the stages' mean idle fraction between the first task's start and the last
    /// task's end.
    pub bubbles: Vec<f64>,
    /// Per step: host seconds per microbatch that were neither execution nor waiting.
    pub host_overhead_per_microbatch: Vec<f64>,
}

/// The highest peak memory use of `devices`, where the plugin reports it.
pub(super) fn peak_memory(devices: &[pjrt::Device]) -> Option<i64> {
    devices.iter().filter_map(|d| d.memory_stats().ok().flatten()).filter_map(|s| s.peak_bytes_in_use).max()
}

/// The run's last line: steps, loss, median step time and throughput, the devices' idle share
/// and peak memory, as far as they were measured.
pub(super) fn print_summary(report: &RunReport, work: &PerDeviceWork) {
    let (Some(first), Some(last)) = (report.losses.first(), report.losses.last()) else { return };
    // The first `skip_first_n_steps_for_profiler` steps (compilation, warm-up) are left out; a
    // run with no step after them shows its last step.
    let median =
        median_step_time_after(&report.step_times, report.perf_skipped_steps).or(report.step_times.last().copied());
    let mut line = format!("done: {} steps, loss {first:.3} -> {last:.3}", report.losses.len());
    if let Some(m) = median {
        line.push_str(&format!(", median step {:.4} s, {:.3} TFLOP/s/device", m, work.tflops / m));
    }
    if let Some(idle) = report.device_idle_fraction {
        line.push_str(&format!(", device waiting for the host {:.1}% of the time", idle * 100.0));
    }
    if let Some(peak) = report.peak_memory_bytes {
        line.push_str(&format!(", peak device memory {:.1} MiB", peak as f64 / (1u64 << 20) as f64));
    }
    println!("{line}");
}
