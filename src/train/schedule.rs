//! MaxText's learning-rate schedule (`create_learning_rate_schedule` in
//! `src/maxtext/utils/maxtext_utils.py`, MaxText main at e591f30, 2026-08), as a list of pieces
//! joined at step boundaries the way `optax.join_schedules` joins them: piece `i` runs from
//! boundary `i - 1` (0 for the first) and is evaluated at the step *minus* that boundary.
//!
//! With `S = learning_rate_schedule_steps` (`-1`: `steps`), `W = int(S * warmup_steps_fraction)`
//! and `final = learning_rate * learning_rate_final_fraction`:
//! 1. warmup (when `W > 0`): `optax.linear_schedule(0, lr, W)`, i.e. `lr * step / W`, so the
//!    peak is reached at step `W` (where the next piece starts at its own peak);
//! 2. `lr_schedule_type=cosine`: a cosine from `lr` to `final` over `C = S - W` steps,
//!    `pct = t / (C - 1)` (1 when `C == 1`), reaching `final` on the schedule's last step;
//!    `lr_schedule_type=wsd`: `lr` held for `S - W - D` steps, `D = int(S *
//!    wsd_decay_steps_fraction)`, then a decay over `D` steps to `final`: linear
//!    (`optax.linear_schedule(lr, final, D - 1)`) or the same cosine (`wsd_decay_style`);
//! 3. when `steps > S`: 0 from step `S` on (a zero-rate tail to measure the trained model).
//!
//! The host evaluates it here (`at`): the value logged as `learning/current_learning_rate` and the
//! tests' reference; the train step evaluates the same pieces in-graph from its step counter
//! (`AdamW::learning_rate`).

use std::f64::consts::PI;

use crate::config::{Config, LrScheduleType, WsdDecayStyle};
use crate::ir::DType;
use crate::tensor::{where_, Tensor};

/// One piece of the schedule, evaluated at `t`, the steps since the piece began.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Piece {
    /// `optax.linear_schedule(from, to, steps)`: `from + (to - from) * min(t, steps) / steps`
    /// (`from` when `steps` is 0).
    Linear {
        from: f64,
        to: f64,
        steps: u64,
    },
    /// `a = (cos(pi * pct) + 1) / 2` with `pct = t / (len - 1)` (1 when `len <= 1`);
    /// `from * a + to * (1 - a)`.
    Cosine {
        from: f64,
        to: f64,
        len: u64,
    },
    Constant(f64),
}

impl Piece {
    pub fn at(&self, t: f64) -> f64 {
        match *self {
            // optax returns `init_value` for a zero-step transition.
            Piece::Linear { from, steps: 0, .. } => from,
            Piece::Linear { from, to, steps } => from + (to - from) * t.min(steps as f64) / steps as f64,
            Piece::Cosine { from, to, len } => {
                let pct = if len > 1 { t / (len - 1) as f64 } else { 1.0 };
                let a = 0.5 * ((PI * pct).cos() + 1.0);
                from * a + to * (1.0 - a)
            }
            Piece::Constant(v) => v,
        }
    }

    /// `at`, traced: `t` is an f32 scalar.
    fn traced(&self, t: &Tensor) -> Tensor {
        match *self {
            Piece::Linear { from, steps: 0, .. } | Piece::Constant(from) => t.full_like(from),
            Piece::Linear { from, to, steps } => t.minimum(steps as f64) * ((to - from) / steps as f64) + from,
            Piece::Cosine { from, to, len } => {
                let pct = if len > 1 { t * (1.0 / (len - 1) as f64) } else { t.full_like(1.0) };
                let a = ((pct * PI).cos() + 1.0) * 0.5;
                &a * from + (1.0 - &a) * to
            }
        }
    }
}

/// The schedule: `pieces[i]` applies from `starts[i]` (the previous piece's boundary).
#[derive(Debug, Clone, PartialEq)]
pub struct LearningRateSchedule {
    pub pieces: Vec<(u64, Piece)>,
    /// `learning_rate_schedule_steps` after resolving MaxText's `-1` (= `steps`).
    pub schedule_steps: u64,
    /// `int(schedule_steps * warmup_steps_fraction)`.
    pub warmup_steps: u64,
}

impl LearningRateSchedule {
    /// The schedule of a run's config; an out-of-range value is an error naming its key.
    pub fn from_config(c: &Config) -> anyhow::Result<LearningRateSchedule> {
        let decay = match c.lr_schedule_type {
            LrScheduleType::Cosine => None,
            LrScheduleType::Wsd => Some((c.wsd_decay_steps_fraction, c.wsd_decay_style)),
        };
        LearningRateSchedule::new(
            c.learning_rate,
            c.learning_rate_final_fraction,
            c.warmup_steps_fraction,
            decay,
            c.learning_rate_schedule_steps,
            c.steps,
        )
    }

    /// `decay`: `None` for the cosine schedule, `Some((wsd_decay_steps_fraction, wsd_decay_style))`
    /// for warmup-stable-decay.
    pub fn new(
        learning_rate: f64,
        final_fraction: f64,
        warmup_steps_fraction: f64,
        decay: Option<(f64, WsdDecayStyle)>,
        learning_rate_schedule_steps: i64,
        steps: i64,
    ) -> anyhow::Result<LearningRateSchedule> {
        if !(learning_rate >= 0.0 && learning_rate.is_finite()) {
            return Err(anyhow::anyhow!("learning_rate={learning_rate}: must be a finite number >= 0"));
        }
        if !(final_fraction >= 0.0 && final_fraction.is_finite()) {
            return Err(anyhow::anyhow!("learning_rate_final_fraction={final_fraction}: must be a finite number >= 0"));
        }
        if !(0.0..=1.0).contains(&warmup_steps_fraction) {
            return Err(anyhow::anyhow!("warmup_steps_fraction={warmup_steps_fraction}: must be in [0, 1]"));
        }
        if steps < 1 {
            return Err(anyhow::anyhow!("steps={steps}: must be at least 1"));
        }
        let schedule_steps = match learning_rate_schedule_steps {
            -1 => steps as u64,
            n if n >= 1 => n as u64,
            n => {
                return Err(anyhow::anyhow!(
                    "learning_rate_schedule_steps={n}: must be -1 (use `steps`) or a positive step count"
                ))
            }
        };
        let lr = learning_rate;
        let final_lr = lr * final_fraction;
        let warmup = (schedule_steps as f64 * warmup_steps_fraction) as u64;
        let mut pieces = Vec::new();
        let mut start = 0;
        let mut push = |len: u64, piece: Piece| {
            if len > 0 {
                pieces.push((start, piece));
                start += len;
            }
        };
        push(warmup, Piece::Linear { from: 0.0, to: lr, steps: warmup });
        match decay {
            None => {
                let len = schedule_steps - warmup;
                push(len, Piece::Cosine { from: lr, to: final_lr, len });
            }
            Some((fraction, style)) => {
                if !(0.0..=1.0).contains(&fraction) || fraction + warmup_steps_fraction > 1.0 {
                    return Err(anyhow::anyhow!(
                        "wsd_decay_steps_fraction={fraction}: must be in [0, 1] and, with warmup_steps_fraction={warmup_steps_fraction}, not exceed 1"
                    ));
                }
                let decay_steps = (schedule_steps as f64 * fraction) as u64;
                push(schedule_steps.saturating_sub(warmup + decay_steps), Piece::Constant(lr));
                let piece = match style {
                    WsdDecayStyle::Linear => {
                        Piece::Linear { from: lr, to: final_lr, steps: decay_steps.saturating_sub(1) }
                    }
                    WsdDecayStyle::Cosine => Piece::Cosine { from: lr, to: final_lr, len: decay_steps },
                };
                push(decay_steps, piece);
            }
        }
        if steps as u64 > schedule_steps {
            push(steps as u64 - schedule_steps, Piece::Constant(0.0));
        }
        Ok(LearningRateSchedule { pieces, schedule_steps, warmup_steps: warmup })
    }

    /// The learning rate used by the update of step `step` (0-based).
    pub fn at(&self, step: u64) -> f64 {
        // The first piece starts at 0, so some piece has started.
        let (start, piece) = self.pieces.iter().rev().find(|(start, _)| step >= *start).unwrap_or(&self.pieces[0]);
        piece.at((step - start) as f64)
    }

    /// The same function traced, at `step` (an s32 scalar, e.g. the optimizer's count): an f32
    /// scalar. Each piece is evaluated and the one whose range holds `step` is selected.
    pub fn traced(&self, step: &Tensor) -> Tensor {
        let t = step.astype(DType::F32);
        let (_, first) = &self.pieces[0];
        self.pieces[1..].iter().fold(first.traced(&t), |lr, (start, piece)| {
            let start = *start as f64;
            where_(&t.ge(start), piece.traced(&(&t - start)), &lr)
        })
    }
}
