//! A run's outputs besides checkpoints, under `base_output_directory/run_name/` (MaxText's
//! layout: maxtext `src/maxtext/configs/types.py` sets `checkpoint_dir`, `metrics_dir` and
//! `tensorboard_dir` to `checkpoints/`, `metrics/` and `tensorboard/` there, commit e591f30):
//! - `config.yml`: the resolved configuration (`save_config_to_gcs`);
//! - `metrics/metrics_step_<first>_to_step_<last>.txt`: one JSON object per step (the
//!   `metrics_file` format), a file per `log_period` steps (`gcs_metrics`; maxtext
//!   `common/metric_logger.py` `write_metrics_for_gcs`);
//! - `tensorboard/<run_name>/events.out.tfevents.*`: the scalars ([`super::tensorboard`],
//!   `enable_tensorboard`), flushed every `log_period` steps;
//! - `metrics_file=PATH` (local or gs://) as before: every step, truncated by a run starting at
//!   step 0 and appended to by a resumed one.

use anyhow::{Context, Result};

use super::metrics::{EvalMetrics, MetricsWriter, StepMetrics};
use super::tensorboard::EventWriter;
use crate::config::Config;
use crate::files::Location;
use crate::storage;

/// `run_name`, or MaxText's default for an empty one: `$JOBSET_NAME`, else
/// `<model_name>_<YYYY-MM-DD-HH-MM>` (maxtext `configs/types.py`, commit e591f30; UTC here).
pub fn resolved_run_name(c: &Config) -> String {
    if !c.run_name.is_empty() {
        return c.run_name.clone();
    }
    if let Some(jobset) = std::env::var("JOBSET_NAME").ok().filter(|s| !s.is_empty()) {
        return jobset;
    }
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let (hh, mm) = ((secs % 86_400) / 3600, (secs % 3600) / 60);
    format!("{}_{y:04}-{m:02}-{d:02}-{hh:02}-{mm:02}", c.model_name)
}

/// Days since 1970-01-01 to (year, month, day) (Howard Hinnant's algorithm).
pub(crate) fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// `base_output_directory/run_name`, when the run has an output directory.
pub fn run_dir(c: &Config) -> Result<Option<Location>> {
    if c.base_output_directory.is_empty() {
        return Ok(None);
    }
    Ok(Some(Location::parse(&c.base_output_directory)?.join(&c.run_name)))
}

/// The numeric `group/name` entries of a metrics line: what TensorBoard plots.
fn scalars(json: &serde_json::Value) -> Vec<(String, f64)> {
    json.as_object()
        .expect("metrics are an object")
        .iter()
        .filter(|(k, _)| k.contains('/'))
        .filter_map(|(k, v)| v.as_f64().map(|v| (k.clone(), v)))
        .collect()
}

/// The writers of one run's metrics and events.
pub struct RunOutputs {
    log_period: u64,
    last_step: u64,
    metrics_file: Option<MetricsWriter>,
    /// `metrics/` and the lines of the current `log_period` chunk.
    chunks: Option<(Location, Vec<String>, Option<u64>)>,
    events: Option<EventWriter>,
}

impl RunOutputs {
    /// Writes nothing: what processes other than process 0 use.
    pub fn none(c: &Config) -> RunOutputs {
        RunOutputs {
            log_period: c.log_period as u64,
            last_step: (c.steps as u64).saturating_sub(1),
            metrics_file: None,
            chunks: None,
            events: None,
        }
    }

    /// Opens what `c` asks for; `first_step` is 0 for a fresh run, later for a resumed one.
    pub fn open(c: &Config, first_step: u64) -> Result<RunOutputs> {
        let dir = run_dir(c)?;
        let mut outputs = RunOutputs::none(c);
        if !c.metrics_file.is_empty() {
            let location = Location::parse(&c.metrics_file)?;
            outputs.metrics_file = Some(MetricsWriter::open(&location, first_step, &c.run_name)?);
        }
        if let Some(dir) = dir {
            if c.save_config_to_gcs {
                let text = serde_yaml::to_string(c).context("the config serializes")?;
                storage::write(&dir.join("config.yml"), text.as_bytes())?;
            }
            if c.gcs_metrics {
                outputs.chunks = Some((dir.join("metrics"), Vec::new(), None));
            }
            if c.enable_tensorboard {
                let events = EventWriter::create(&dir.join("tensorboard").join(&c.run_name))?;
                println!("To see full metrics 'tensorboard --logdir={}'", dir.join("tensorboard"));
                outputs.events = Some(events);
            }
        }
        Ok(outputs)
    }

    /// Records one step's metrics: the metrics file at once; chunks and events flushed every
    /// `log_period` steps and at the last step.
    pub fn step(&mut self, metrics: &StepMetrics, run_name: &str) -> Result<()> {
        let json = metrics.to_json(run_name);
        if let Some(file) = &mut self.metrics_file {
            file.write(metrics)?;
        }
        let step = metrics.step;
        let boundary = (step + 1).is_multiple_of(self.log_period) || step == self.last_step;
        if let Some((_, lines, first)) = &mut self.chunks {
            first.get_or_insert(step);
            lines.push(json.to_string());
        }
        if let Some(events) = &mut self.events {
            events.scalars(step, &scalars(&json))?;
        }
        if boundary {
            self.flush(step)?;
        }
        Ok(())
    }

    /// Records an eval's metrics (`eval/...`, at the train step it followed): a metrics-file
    /// line and TensorBoard scalars.
    pub fn eval(&mut self, metrics: &EvalMetrics, run_name: &str) -> Result<()> {
        if let Some(file) = &mut self.metrics_file {
            file.write_eval(metrics)?;
        }
        if let Some(events) = &mut self.events {
            events.scalars(metrics.step, &scalars(&metrics.to_json(run_name)))?;
        }
        Ok(())
    }

    /// Writes what is pending up to `step` (also called when a run stops early).
    pub fn flush(&mut self, step: u64) -> Result<()> {
        if let Some(file) = &mut self.metrics_file {
            file.flush()?;
        }
        if let Some((dir, lines, first)) = &mut self.chunks {
            if let Some(first) = first.take() {
                let start = (first / self.log_period) * self.log_period;
                let name = format!("metrics_step_{start:06}_to_step_{step:06}.txt");
                let mut text = lines.join("\n");
                text.push('\n');
                storage::write(&dir.join(&name), text.as_bytes())?;
                lines.clear();
            }
        }
        if let Some(events) = &mut self.events {
            events.flush()?;
        }
        Ok(())
    }
}
