//! Per-step metrics: MaxText's log line, and the `metrics_file=PATH` JSON-lines file.
//!
//! Names and formats follow MaxText's `metric_logger.py` so existing tooling reads maxrs runs:
//! - log line: `completed step: 3, seconds: 0.512, TFLOP/s/device: 12.300, Tokens/s/device:
//!   4000.000, total_weights: 8192, loss: 5.123` (three decimals, as MaxText's `:.3f`); maxrs
//!   appends `, moe_lb_loss: 0.010000` (six decimals, as MaxText) for models with experts and
//!   `, MFU: 45.10%` when the device's peak is known (MaxText appends its optional fields after
//!   `loss` too, so parsers that look fields up by name keep working);
//! - metrics file: one JSON object per step, every value a float (the step too: `"step": 3.0`,
//!   as MaxText writes it), plus `run_name`. Keys: `step`, `learning/loss`, `learning/grad_norm`,
//!   `learning/current_learning_rate`, `learning/total_weights`, `perf/step_time_seconds`,
//!   `perf/per_device_tflops`, `perf/per_device_tflops_per_sec`, `perf/per_device_tokens`,
//!   `perf/per_device_tokens_per_sec`, `learning/moe_lb_loss` for models with experts, and
//!   (maxrs only, when the peak is known) `perf/mfu` as a fraction;
//! - with `use_dpo`, Tunix's preference metrics (`super::dpo::METRICS`: `rewards/chosen`,
//!   `rewards/rejected`, `rewards/margin`, `rewards/accuracy`, `log_probs/chosen`,
//!   `log_probs/rejected`, ORPO's `odds_ratio`) in the file, and the rewards on the log line;
//!   an eval's over all its pairs as `eval/<name>` (`eval/rewards/accuracy`, ...).

use serde_json::{Map, Value};

use crate::storage::Appender;

use crate::files::Location;

use super::dpo::METRICS;

/// What is fixed for a run: the per-device work of a step and the device's peak.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PerDeviceWork {
    /// TFLOPs per step per device ([`crate::model::Model::training_tflops_per_device`]`.total`).
    pub tflops: f64,
    /// Tokens per step per device ([`crate::model::flops::StepShape::tokens_per_device`]).
    pub tokens: f64,
    /// Dense bf16 peak TFLOP/s of one device, when known.
    pub peak_tflops: Option<f64>,
}

/// The metrics of one completed step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepMetrics {
    pub step: u64,
    pub loss: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    pub learning_rate: f64,
    /// Number of target tokens the loss counted (sum of the loss mask over the global batch).
    pub total_weights: u64,
    /// The MoE load-balancing loss (part of `loss`), for models with experts.
    pub moe_lb_loss: Option<f64>,
    /// With `use_dpo`: the preference metrics, in `dpo::METRICS` order (none where the step
    /// has no such metric).
    pub preference: [Option<f64>; 7],
    pub step_time_seconds: f64,
    pub work: PerDeviceWork,
}

impl StepMetrics {
    pub fn tflops_per_sec_per_device(&self) -> f64 {
        self.work.tflops / self.step_time_seconds
    }

    pub fn tokens_per_sec_per_device(&self) -> f64 {
        self.work.tokens / self.step_time_seconds
    }

    /// Achieved over peak TFLOP/s, as a fraction; `None` when the peak is unknown.
    pub fn mfu(&self) -> Option<f64> {
        self.work.peak_tflops.map(|peak| crate::train::flops::mfu(self.tflops_per_sec_per_device(), peak))
    }

    /// MaxText's per-step log line (see the module docs).
    pub fn log_line(&self) -> String {
        let mut line = format!(
            "completed step: {}, seconds: {}, TFLOP/s/device: {}, Tokens/s/device: {}, total_weights: {}, loss: {}",
            self.step,
            fixed3(self.step_time_seconds),
            fixed3(self.tflops_per_sec_per_device()),
            fixed3(self.tokens_per_sec_per_device()),
            self.total_weights,
            fixed3(self.loss),
        );
        if let Some(lb) = self.moe_lb_loss {
            line.push_str(&format!(", moe_lb_loss: {lb:.6}"));
        }
        for ((_, name), value) in METRICS.iter().zip(&self.preference).take(4) {
            if let Some(value) = value {
                line.push_str(&format!(", {name}: {value:.4}"));
            }
        }
        if let Some(mfu) = self.mfu() {
            line.push_str(&format!(", MFU: {:.2}%", mfu * 100.0));
        }
        line
    }

    /// The JSON object of one metrics-file line (see the module docs for the keys).
    pub fn to_json(&self, run_name: &str) -> Value {
        let mut object = Map::new();
        let mut put = |key: &str, value: f64| {
            // JSON has no NaN/inf; null keeps the line parseable and the step visible.
            object.insert(key.to_owned(), serde_json::Number::from_f64(value).map_or(Value::Null, Value::Number));
        };
        put("learning/loss", self.loss);
        put("learning/grad_norm", self.grad_norm);
        put("learning/current_learning_rate", self.learning_rate);
        put("learning/total_weights", self.total_weights as f64);
        if let Some(lb) = self.moe_lb_loss {
            put("learning/moe_lb_loss", lb);
        }
        for ((_, name), value) in METRICS.iter().zip(&self.preference) {
            if let Some(value) = value {
                put(name, *value);
            }
        }
        put("perf/step_time_seconds", self.step_time_seconds);
        put("perf/per_device_tflops", self.work.tflops);
        put("perf/per_device_tflops_per_sec", self.tflops_per_sec_per_device());
        put("perf/per_device_tokens", self.work.tokens);
        put("perf/per_device_tokens_per_sec", self.tokens_per_sec_per_device());
        if let Some(mfu) = self.mfu() {
            put("perf/mfu", mfu);
        }
        put("step", self.step as f64);
        object.insert("run_name".to_owned(), Value::String(run_name.to_owned()));
        Value::Object(object)
    }
}

/// One eval's totals over its batches, reported as MaxText's metric logger reports them
/// (maxtext `src/maxtext/common/metric_logger.py` `_finalize_eval_metrics` and
/// `_log_eval_metrics`, main e591f30): `eval/avg_loss` = total loss / total weights,
/// `eval/avg_perplexity` = exp of that, `eval/avg_z_loss` = the z-losses' mean over eval steps;
/// for models with experts `eval/moe_lb_loss` (the sum) and `eval/avg_moe_lb_loss` (the mean
/// over eval steps) of the load-balancing loss, which `eval/avg_loss` leaves out, as MaxText's
/// `record_eval_metrics` does.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EvalMetrics {
    /// The train step after which the eval ran.
    pub step: u64,
    pub total_loss: f64,
    pub total_weights: f64,
    pub z_loss_sum: f64,
    /// The load-balancing losses' sum over eval steps, for models with experts.
    pub moe_lb_loss_sum: Option<f64>,
    /// With `use_dpo`: the preference metrics summed over the eval's pairs, in `dpo::METRICS`
    /// order (`total_weights` counts the pairs then).
    pub preference_sums: [Option<f64>; 7],
    pub eval_steps: u64,
}

impl EvalMetrics {
    /// MaxText's EPS in the division keeps an eval without tokens finite.
    pub fn avg_loss(&self) -> f64 {
        self.total_loss / (self.total_weights + 1e-8)
    }

    pub fn avg_z_loss(&self) -> f64 {
        self.z_loss_sum / self.eval_steps.max(1) as f64
    }

    pub fn avg_moe_lb_loss(&self) -> Option<f64> {
        self.moe_lb_loss_sum.map(|sum| sum / self.eval_steps.max(1) as f64)
    }

    /// `Completed eval after train step 9, loss=4.123, perplexity=61.753, total_weights=8188.0, avg_z_loss=0.000`
    /// (then `, avg_moe_lb_loss=0.010000` for models with experts).
    pub fn log_line(&self) -> String {
        let line = format!(
            "Completed eval after train step {}, loss={}, perplexity={}, total_weights={:?}, avg_z_loss={}",
            self.step,
            fixed3(self.avg_loss()),
            fixed3(self.avg_loss().exp()),
            self.total_weights,
            fixed3(self.avg_z_loss())
        );
        match self.avg_moe_lb_loss() {
            Some(lb) => format!("{line}, avg_moe_lb_loss={lb:.6}"),
            None => line,
        }
    }

    pub fn to_json(&self, run_name: &str) -> Value {
        let mut object = Map::new();
        let mut put = |key: &str, value: f64| {
            object.insert(key.to_owned(), serde_json::Number::from_f64(value).map_or(Value::Null, Value::Number));
        };
        put("eval/avg_loss", self.avg_loss());
        put("eval/avg_perplexity", self.avg_loss().exp());
        put("eval/total_loss", self.total_loss);
        put("eval/total_weights", self.total_weights);
        put("eval/avg_z_loss", self.avg_z_loss());
        if let (Some(sum), Some(avg)) = (self.moe_lb_loss_sum, self.avg_moe_lb_loss()) {
            put("eval/moe_lb_loss", sum);
            put("eval/avg_moe_lb_loss", avg);
        }
        // Over all the eval's pairs, as Tunix reduces its `WeightedMetric`s over eval batches
        // (`tunix/sft/peft_trainer.py` at c7d8950, `_weighted_metric_mean`; its metrics logger
        // names them `<mode>/<name>`, `eval/rewards/accuracy`).
        for ((_, name), sum) in METRICS.iter().zip(&self.preference_sums) {
            if let Some(sum) = sum {
                put(&format!("eval/{name}"), sum / self.total_weights.max(1.0));
            }
        }
        put("eval/steps", self.eval_steps as f64);
        put("step", self.step as f64);
        object.insert("run_name".to_owned(), Value::String(run_name.to_owned()));
        Value::Object(object)
    }
}

/// Python's `f"{x:.3f}"`: Rust prints NaN as `NaN`, Python as `nan`; log scrapers match the latter.
fn fixed3(value: f64) -> String {
    if value.is_nan() {
        "nan".to_owned()
    } else {
        format!("{value:.3}")
    }
}

/// Writes `metrics_file` (local or gs://, through [`crate::storage::Appender`]): one JSON object
/// per step. Locally each line is written whole and unbuffered, so a crash keeps every completed
/// step, and the file is locked while the writer lives: a second run naming it is refused. On
/// GCS the object is rewritten on [`MetricsWriter::flush`].
pub struct MetricsWriter {
    file: Appender,
    run_name: String,
}

impl MetricsWriter {
    /// Opens `location` as MaxText does: a run starting at step 0 replaces the file (at its
    /// first line, so a run that fails earlier leaves it as it was), a run resumed from a later
    /// step appends to it. Missing parent directories are created.
    pub fn open(location: &Location, first_step: u64, run_name: &str) -> anyhow::Result<MetricsWriter> {
        let file = Appender::open("metrics_file", location, first_step == 0)?;
        Ok(MetricsWriter { file, run_name: run_name.to_owned() })
    }

    pub fn write(&mut self, metrics: &StepMetrics) -> anyhow::Result<()> {
        self.write_line(metrics.to_json(&self.run_name))
    }

    /// An eval's line (keys `eval/...`, and the train `step` it followed).
    pub fn write_eval(&mut self, metrics: &EvalMetrics) -> anyhow::Result<()> {
        self.write_line(metrics.to_json(&self.run_name))
    }

    fn write_line(&mut self, object: Value) -> anyhow::Result<()> {
        let mut line = object.to_string();
        line.push('\n');
        self.file.append(line.as_bytes())
    }

    pub fn flush(&mut self) -> anyhow::Result<()> {
        self.file.flush()
    }
}

/// Median step time over all steps but the first, which includes compilation and warm-up.
/// `None` with fewer than two steps.
pub fn median_step_time(step_times_seconds: &[f64]) -> Option<f64> {
    median_step_time_after(step_times_seconds, 1)
}

/// Median step time over the steps after the first `skip` (MaxText's
/// `skip_first_n_steps_for_profiler`). `None` when no step is left.
pub fn median_step_time_after(step_times_seconds: &[f64], skip: usize) -> Option<f64> {
    let mut times: Vec<f64> = step_times_seconds.get(skip..)?.to_vec();
    if times.is_empty() {
        return None;
    }
    times.sort_by(f64::total_cmp);
    let mid = times.len() / 2;
    Some(if times.len() % 2 == 1 { times[mid] } else { (times[mid - 1] + times[mid]) / 2.0 })
}
