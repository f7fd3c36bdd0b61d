//! Step times of a step that runs ahead of the host, from when the devices finished each step.

use std::time::Instant;

/// When each step finished on the devices, and how long they waited for the host before the
/// next: step `k` took from step `k - 1`'s completion (step 0: its dispatch) to its own, and
/// the devices were idle for the part of that before step `k` was dispatched.
pub(super) struct DeviceTiming {
    /// Steps left out of the idle share (`skip_first_n_steps_for_profiler`).
    skip: usize,
    last_done: Option<Instant>,
    /// Per completed step: (wall seconds, idle seconds).
    steps: Vec<(f64, f64)>,
}

impl DeviceTiming {
    pub fn new(skip: usize) -> DeviceTiming {
        DeviceTiming { skip, last_done: None, steps: Vec::new() }
    }

    /// Records a step dispatched at `dispatched` and done at `done`; returns its step time.
    pub fn completed(&mut self, dispatched: Instant, done: Instant) -> f64 {
        let start = self.last_done.unwrap_or(dispatched);
        let wall = done.saturating_duration_since(start).as_secs_f64();
        let idle = match self.last_done {
            Some(previous) => dispatched.saturating_duration_since(previous).as_secs_f64(),
            None => 0.0,
        };
        self.last_done = Some(done.max(start));
        self.steps.push((wall, idle.min(wall)));
        wall
    }

    /// The host did work it was asked for (a checkpoint copy) with the devices drained: the next
    /// step is timed from its own dispatch, and the gap is not counted as idle.
    pub fn pause(&mut self) {
        self.last_done = None;
    }

    /// Idle over wall time of the steps after the skipped ones.
    pub fn idle_fraction(&self) -> Option<f64> {
        let counted = self.steps.get(self.skip..).filter(|s| !s.is_empty())?;
        let wall: f64 = counted.iter().map(|s| s.0).sum();
        (wall > 0.0).then(|| counted.iter().map(|s| s.1).sum::<f64>() / wall)
    }
}
