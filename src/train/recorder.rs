//! What happens to a finished step's metrics: logged above the progress bar (by the process
//! that logs) and written, then judged by [`Health`] (as MaxText's metric_logger: the step's
//! metrics are written, then the run may stop), and kept in the report.

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

use crate::config::Config;

use super::health::Health;
use super::metrics::StepMetrics;
use super::outputs::RunOutputs;
use super::report::RunReport;

/// Records each finished step, in step order.
pub(super) struct StepRecorder<'a> {
    run_name: &'a str,
    /// The run's progress bar (hidden on processes that do not log).
    pub bar: ProgressBar,
    logger: bool,
    health: Health,
    /// The last step recorded.
    pub last_step: Option<u64>,
}

impl<'a> StepRecorder<'a> {
    pub fn new(c: &'a Config, bar: ProgressBar, logger: bool) -> StepRecorder<'a> {
        StepRecorder { run_name: &c.run_name, bar, logger, health: Health::new(c), last_step: None }
    }

    pub fn record(&mut self, metrics: StepMetrics, report: &mut RunReport, outputs: &mut RunOutputs) -> Result<()> {
        if self.logger {
            print_line(&self.bar, &metrics.log_line());
        }
        outputs.step(&metrics, self.run_name).context("writing the run's metrics")?;
        let verdict = self.health.observe(metrics.step, metrics.loss, metrics.grad_norm, metrics.total_weights);
        if verdict.is_err() {
            self.bar.finish_and_clear();
        }
        if let Some(warning) = verdict? {
            self.bar.suspend(|| tracing::warn!("{warning}"));
        }
        report.losses.push(metrics.loss);
        report.grad_norms.push(metrics.grad_norm);
        report.learning_rates.push(metrics.learning_rate);
        report.step_times.push(metrics.step_time_seconds);
        self.last_step = Some(metrics.step);
        self.bar.inc(1);
        Ok(())
    }
}

pub(super) fn progress_bar(steps: u64) -> ProgressBar {
    let bar = ProgressBar::new(steps);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} steps, {elapsed} elapsed, ~{eta} left")
            .expect("a valid template"),
    );
    bar
}

/// Prints above the progress bar, or plainly when there is none (stderr is not a terminal).
pub(super) fn print_line(bar: &ProgressBar, line: &str) {
    if bar.is_hidden() {
        println!("{line}");
    } else {
        bar.println(line);
    }
}
