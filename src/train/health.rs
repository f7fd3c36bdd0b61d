//! Run health: what the loop does when a step's numbers say training has gone wrong.
//! - A NaN or infinite loss stops the run after the step's metrics are written, as MaxText's
//!   `metric_logger.py` does with `abort_on_nan_loss` / `abort_on_inf_loss` (both true by
//!   default; maxtext `src/maxtext/common/metric_logger.py` `_maybe_abort_after_write_metrics`
//!   at main e591f30); with the key false, a warning (once) and the run goes on.
//! - A gradient norm of exactly 0 for [`ZERO_GRAD_STEPS`] steps in a row gets a warning: the
//!   model no longer learns (maxrs's own check; MaxText has none).
//! - A step whose batch has no target that carries loss (`total_weights` 0: SFT rows whose
//!   completions are cut off or missing) gets a warning of its own, every time: it trained
//!   nothing, and its `loss: 0.000` is no loss at all. (A run whose first batches have none is
//!   refused at its start, `data::BatchIterator::check_loss_tokens`.) Such steps do not count
//!   towards the zero-gradient warning, whose causes are others.

use anyhow::{bail, Result};

use crate::config::Config;

/// Steps with a zero gradient norm in a row before the warning.
pub const ZERO_GRAD_STEPS: u64 = 10;

/// Watches the loss and gradient norm of each step.
#[derive(Debug, Default)]
pub struct Health {
    abort_on_nan: bool,
    abort_on_inf: bool,
    non_finite_warned: bool,
    zero_grad_steps: u64,
    /// Why a step may have no target that carries loss, for its warning.
    no_loss_cause: String,
}

impl Health {
    pub fn new(c: &Config) -> Health {
        Health {
            abort_on_nan: c.abort_on_nan_loss,
            abort_on_inf: c.abort_on_inf_loss,
            no_loss_cause: crate::data::no_loss_cause(c),
            ..Health::default()
        }
    }

    /// Judges step `step` (`total_weights`: its targets that carry loss): an error stops the run;
    /// `Ok(Some(warning))` is to be logged.
    pub fn observe(&mut self, step: u64, loss: f64, grad_norm: f64, total_weights: u64) -> Result<Option<String>> {
        if !loss.is_finite() {
            let (key, abort) = if loss.is_nan() {
                ("abort_on_nan_loss", self.abort_on_nan)
            } else {
                ("abort_on_inf_loss", self.abort_on_inf)
            };
            if abort {
                bail!("step {step}: the loss is {loss}; stopping ({key}=true; try a lower learning_rate)");
            }
            if !self.non_finite_warned {
                self.non_finite_warned = true;
                return Ok(Some(format!("step {step}: the loss is {loss}; training goes on because {key}=false")));
            }
        }
        if total_weights == 0 {
            return Ok(Some(format!(
                "step {step}: no target token of its batch carries loss (total_weights: 0), so it trained nothing: {}",
                self.no_loss_cause
            )));
        }
        self.zero_grad_steps = if grad_norm == 0.0 { self.zero_grad_steps + 1 } else { 0 };
        if self.zero_grad_steps == ZERO_GRAD_STEPS {
            return Ok(Some(format!(
                "the gradient norm has been 0 for {ZERO_GRAD_STEPS} steps (steps {}..={step}): the model no longer \
                 learns; check learning_rate, the data and the initialization",
                step + 1 - ZERO_GRAD_STEPS
            )));
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health(nan: bool, inf: bool) -> Health {
        Health { abort_on_nan: nan, abort_on_inf: inf, ..Health::default() }
    }

    #[test]
    fn non_finite_losses_stop_or_warn_once() {
        let e = health(true, true).observe(4, f64::NAN, 1.0, 8).unwrap_err().to_string();
        assert!(e.contains("step 4") && e.contains("NaN") && e.contains("abort_on_nan_loss=true"), "{e}");
        let e = health(true, true).observe(2, f64::INFINITY, 1.0, 8).unwrap_err().to_string();
        assert!(e.contains("abort_on_inf_loss=true"), "{e}");
        let mut h = health(false, true);
        assert!(h.observe(1, f64::NAN, 1.0, 8).unwrap().unwrap().contains("abort_on_nan_loss=false"));
        assert_eq!(h.observe(2, f64::NAN, 1.0, 8).unwrap(), None, "warned once");
        assert!(h.observe(3, f64::NEG_INFINITY, 1.0, 8).is_err());
    }

    #[test]
    fn a_zero_gradient_for_ten_steps_warns_once() {
        let mut h = health(true, true);
        let mut warnings = vec![];
        for step in 0..30 {
            let norm = if step == 3 { 0.5 } else { 0.0 };
            warnings.extend(h.observe(step, 2.0, norm, 8).unwrap());
        }
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("steps 4..=13"), "{}", warnings[0]);
    }
}
