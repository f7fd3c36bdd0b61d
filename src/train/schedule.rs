//! MaxText's learning-rate schedule (`create_learning_rate_schedule`, cosine type) on the host.
//!
//! The train step computes the same function in-graph from its step counter; this version is
//! the reference for tests and the value logged as `learning/current_learning_rate`.
//!
//! With `W = int(learning_rate_schedule_steps * warmup_steps_fraction)`,
//! `C = learning_rate_schedule_steps - W` and `final = learning_rate * learning_rate_final_fraction`:
//! - steps `0 .. W`: linear from 0 to `learning_rate`, reaching it at step `W - 1`
//!   (`lr * step / (W - 1)`; a one-step warmup is just 0, as optax's zero-length linear schedule);
//! - steps `W .. W + C`: cosine from `learning_rate` at step `W` to `final` at step `W + C - 1`
//!   (`pct = (step - W) / (C - 1)`, or 1 when `C == 1`);
//! - steps from `learning_rate_schedule_steps` on: 0. MaxText only reaches this part when
//!   `steps > learning_rate_schedule_steps` (a zero-rate tail to measure the trained model);
//!   when the schedule is longer than the run, training simply ends before the decay does.
//!
//! The `- 1`s are current MaxText's convention (the schedule hits its end values on the last
//! step of each part); older MaxText divided by `W` and `C` and named the fraction
//! `cosine_learning_rate_final_fraction`.

use std::f64::consts::PI;

/// The schedule's parameters, with MaxText's config names.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LearningRateSchedule {
    /// `learning_rate`: the peak.
    pub learning_rate: f64,
    /// `learning_rate_final_fraction`: where the cosine ends, as a fraction of the peak.
    pub final_fraction: f64,
    /// `warmup_steps_fraction` of `learning_rate_schedule_steps`.
    pub warmup_steps_fraction: f64,
    /// `learning_rate_schedule_steps` after resolving MaxText's `-1` (= `steps`).
    pub schedule_steps: u64,
}

impl LearningRateSchedule {
    /// Resolves `learning_rate_schedule_steps = -1` to `steps` and checks the values, naming the
    /// config key that is out of range.
    pub fn new(
        learning_rate: f64,
        final_fraction: f64,
        warmup_steps_fraction: f64,
        learning_rate_schedule_steps: i64,
        steps: u64,
    ) -> Result<LearningRateSchedule, String> {
        if !(learning_rate >= 0.0 && learning_rate.is_finite()) {
            return Err(format!("learning_rate={learning_rate}: must be a finite number >= 0"));
        }
        if !(final_fraction >= 0.0 && final_fraction.is_finite()) {
            return Err(format!("learning_rate_final_fraction={final_fraction}: must be a finite number >= 0"));
        }
        if !(0.0..=1.0).contains(&warmup_steps_fraction) {
            return Err(format!("warmup_steps_fraction={warmup_steps_fraction}: must be in [0, 1]"));
        }
        let schedule_steps = match learning_rate_schedule_steps {
            -1 => steps,
            n if n >= 1 => n as u64,
            n => {
                return Err(format!(
                    "learning_rate_schedule_steps={n}: must be -1 (use `steps`) or a positive step count"
                ))
            }
        };
        if schedule_steps == 0 {
            return Err("steps=0 with learning_rate_schedule_steps=-1: the schedule needs at least one step".into());
        }
        Ok(LearningRateSchedule { learning_rate, final_fraction, warmup_steps_fraction, schedule_steps })
    }

    /// `int(learning_rate_schedule_steps * warmup_steps_fraction)`, truncated as Python's `int`.
    pub fn warmup_steps(&self) -> u64 {
        (self.schedule_steps as f64 * self.warmup_steps_fraction) as u64
    }

    /// The learning rate used by the update of step `step` (0-based).
    pub fn at(&self, step: u64) -> f64 {
        let lr = self.learning_rate;
        let warmup = self.warmup_steps();
        let cosine = self.schedule_steps - warmup;
        if step >= self.schedule_steps {
            return 0.0;
        }
        if step < warmup {
            return if warmup > 1 { lr * step as f64 / (warmup - 1) as f64 } else { 0.0 };
        }
        let pct = if cosine > 1 { (step - warmup) as f64 / (cosine - 1) as f64 } else { 1.0 };
        let a = 0.5 * ((PI * pct).cos() + 1.0);
        let final_lr = lr * self.final_fraction;
        lr * a + final_lr * (1.0 - a)
    }
}
