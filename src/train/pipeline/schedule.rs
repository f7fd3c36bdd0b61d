//! Pipeline schedules: the order in which each stage runs its tasks, a forward or a backward
//! pass of one chunk (virtual stage) on one microbatch, and a simulator that times an order
//! under given task costs (to check that it cannot deadlock, to compute its bubble and how many
//! microbatches' activations each stage keeps at once).
//!
//! - **gpipe** (Huang et al. 2019, GPipe): every forward, then every backward in reverse; with
//!   several repeats, the forwards go round the stages repeat by repeat (MaxText's circular
//!   pipeline).
//! - **1f1b** (Narayanan et al. 2021, PipeDream-Flush / Megatron-LM): stage `s` of `p` runs
//!   `p - s - 1` warm-up forwards, then alternates one forward and one backward, then drains the
//!   remaining backwards; at most `p - s` microbatches are in flight on stage `s`. With `v > 1`
//!   repeats it is Megatron-LM's interleaved 1F1B (`get_forward_backward_func` with virtual
//!   pipeline stages): forwards walk the chunks `p` microbatches at a time, the warm-up is
//!   `2 (p - s - 1) + (v - 1) p` forwards, and the bubble shrinks by `v`.
//!
//! With equal costs per chunk (forward `f`, backward `b`) and free transfers both have the
//! bubble `(p - 1) / (v m + p - 1)` for `m` microbatches (the tests check it by simulation).

use serde::{Deserialize, Serialize};

use crate::config::{PipelinePlan, PipelineSchedule};

/// Forward or backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Pass {
    Forward,
    Backward,
}

/// One unit of work of one stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Task {
    pub pass: Pass,
    /// The virtual stage (layer group) in pipeline order.
    pub chunk: usize,
    pub microbatch: usize,
}

impl Task {
    fn forward(chunk: usize, microbatch: usize) -> Task {
        Task { pass: Pass::Forward, chunk, microbatch }
    }

    fn backward(chunk: usize, microbatch: usize) -> Task {
        Task { pass: Pass::Backward, chunk, microbatch }
    }
}

impl std::fmt::Display for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pass = if self.pass == Pass::Forward { "F" } else { "B" };
        write!(f, "{pass}{}.{}", self.chunk, self.microbatch)
    }
}

/// Every stage's tasks in the order it runs them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    /// As it runs: `gpipe`, `1f1b`, or `interleaved_1f1b` (1f1b over several repeats).
    pub name: String,
    pub stages: usize,
    pub repeats: usize,
    pub microbatches: usize,
    pub per_stage: Vec<Vec<Task>>,
}

/// An array one stage's task hands to another stage's task: an activation forward, or its
/// gradient backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transfer {
    pub from: usize,
    pub to: usize,
    /// The task that reads it.
    pub consumer: Task,
}

/// When each task ran (or would run), per stage, in seconds from the start.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Timeline {
    pub per_stage: Vec<Vec<(Task, f64, f64)>>,
}

impl Timeline {
    /// First start to last end over every stage.
    pub fn span(&self) -> f64 {
        let all = self.per_stage.iter().flatten();
        let start = all.clone().map(|t| t.1).fold(f64::INFINITY, f64::min);
        let end = all.map(|t| t.2).fold(f64::NEG_INFINITY, f64::max);
        if end > start {
            end - start
        } else {
            0.0
        }
    }

    /// The fraction of the span each stage was idle.
    pub fn idle_fractions(&self) -> Vec<f64> {
        let span = self.span();
        self.per_stage
            .iter()
            .map(|tasks| {
                let busy: f64 = tasks.iter().map(|t| t.2 - t.1).sum();
                if span > 0.0 {
                    1.0 - busy / span
                } else {
                    0.0
                }
            })
            .collect()
    }

    /// The bubble: the stages' mean idle fraction.
    pub fn bubble(&self) -> f64 {
        let idle = self.idle_fractions();
        idle.iter().sum::<f64>() / idle.len().max(1) as f64
    }
}

impl Schedule {
    /// The schedule a plan asks for.
    pub fn new(plan: &PipelinePlan) -> Schedule {
        match plan.schedule {
            PipelineSchedule::Gpipe => Schedule::gpipe(plan.stages, plan.repeats, plan.microbatches),
            PipelineSchedule::OneFOneB | PipelineSchedule::Interleaved1F1B => {
                Schedule::one_forward_one_backward(plan.stages, plan.repeats, plan.microbatches)
            }
        }
    }

    /// All forwards (repeat by repeat, microbatches in order), then all backwards in reverse.
    pub fn gpipe(stages: usize, repeats: usize, microbatches: usize) -> Schedule {
        let per_stage = (0..stages)
            .map(|s| {
                let chunks: Vec<usize> = (0..repeats).map(|r| r * stages + s).collect();
                let forwards = chunks.iter().flat_map(|&c| (0..microbatches).map(move |i| Task::forward(c, i)));
                let backwards =
                    chunks.iter().rev().flat_map(|&c| (0..microbatches).rev().map(move |i| Task::backward(c, i)));
                forwards.chain(backwards).collect()
            })
            .collect();
        let name = PipelineSchedule::Gpipe.running_name(repeats).into();
        Schedule { name, stages, repeats, microbatches, per_stage }
    }

    /// 1F1B, interleaved over the repeats when there are several (see the module docs).
    pub fn one_forward_one_backward(stages: usize, repeats: usize, microbatches: usize) -> Schedule {
        let (p, v, m) = (stages, repeats, microbatches);
        let total = m * v;
        // The k-th forward (backward) of a stage: chunks advance every `p` microbatches.
        let microbatch = |k: usize| if v == 1 { k } else { (k / (p * v)) * p + k % p };
        let repeat_forward = |k: usize| if v == 1 { 0 } else { (k / p) % v };
        let per_stage = (0..p)
            .map(|s| {
                let forward = |k: usize| Task::forward(repeat_forward(k) * p + s, microbatch(k));
                let backward = |k: usize| Task::backward((v - 1 - repeat_forward(k)) * p + s, microbatch(k));
                let warmup = if v == 1 { (p - s - 1).min(total) } else { (2 * (p - s - 1) + (v - 1) * p).min(total) };
                let mut order: Vec<Task> = (0..warmup).map(forward).collect();
                for k in 0..total - warmup {
                    order.push(forward(warmup + k));
                    order.push(backward(k));
                }
                order.extend((total - warmup..total).map(backward));
                order
            })
            .collect();
        let name = PipelineSchedule::OneFOneB.running_name(repeats).into();
        Schedule { name, stages, repeats, microbatches, per_stage }
    }

    /// Chunks (virtual stages) in pipeline order.
    pub fn chunks(&self) -> usize {
        self.stages * self.repeats
    }

    /// Runs the orders against each other with `cost(stage, task)` seconds per task and free
    /// transfers: a task starts when its stage is free and its input exists (the previous
    /// chunk's forward, the next chunk's backward, its own forward). Errors when the orders
    /// deadlock or miss a task.
    pub fn simulate(&self, cost: impl Fn(usize, &Task) -> f64) -> anyhow::Result<Timeline> {
        let chunks = self.chunks();
        let expected = 2 * chunks * self.microbatches;
        let count: usize = self.per_stage.iter().map(Vec::len).sum();
        if count != expected || self.per_stage.len() != self.stages {
            return Err(anyhow::anyhow!(
                "the schedule has {count} tasks on {} stages; expected {expected}",
                self.per_stage.len()
            ));
        }
        let index = |t: &Task| (t.chunk * self.microbatches + t.microbatch) * 2 + (t.pass == Pass::Backward) as usize;
        let mut done: Vec<Option<f64>> = vec![None; expected];
        let mut next = vec![0usize; self.stages];
        let mut free = vec![0.0f64; self.stages];
        let mut timeline = Timeline { per_stage: vec![Vec::new(); self.stages] };
        let mut finished = 0;
        while finished < expected {
            let mut progressed = false;
            for s in 0..self.stages {
                let Some(task) = self.per_stage[s].get(next[s]) else { continue };
                if task.chunk >= chunks || task.microbatch >= self.microbatches || task.chunk % self.stages != s {
                    return Err(anyhow::anyhow!("stage {s} cannot run {task}"));
                }
                let deps: Vec<Task> = match task.pass {
                    Pass::Forward if task.chunk == 0 => vec![],
                    Pass::Forward => vec![Task::forward(task.chunk - 1, task.microbatch)],
                    Pass::Backward if task.chunk + 1 == chunks => vec![Task::forward(task.chunk, task.microbatch)],
                    Pass::Backward => vec![
                        Task::forward(task.chunk, task.microbatch),
                        Task::backward(task.chunk + 1, task.microbatch),
                    ],
                };
                let ready: Option<Vec<f64>> = deps.iter().map(|d| done[index(d)]).collect();
                let Some(ready) = ready else { continue };
                if done[index(task)].is_some() {
                    return Err(anyhow::anyhow!("stage {s} runs {task} twice"));
                }
                let start = ready.into_iter().fold(free[s], f64::max);
                let end = start + cost(s, task);
                done[index(task)] = Some(end);
                free[s] = end;
                timeline.per_stage[s].push((*task, start, end));
                next[s] += 1;
                finished += 1;
                progressed = true;
            }
            if !progressed {
                let waiting: Vec<String> = (0..self.stages)
                    .filter_map(|s| self.per_stage[s].get(next[s]).map(|t| format!("stage {s} at {t}")))
                    .collect();
                return Err(anyhow::anyhow!("the schedule deadlocks: {}", waiting.join(", ")));
            }
        }
        Ok(timeline)
    }

    /// Every array handed from one stage to another in a run of the schedule (all its tasks, or
    /// with `forward_only` only the forward ones), in one order both sides of each link can
    /// follow: by when the producing task ends in the timeline of unit costs (ties by stage,
    /// then by the stage's order). A task that needs an array before it produces another
    /// ends after the first one's producer, so a link that hands its arrays over strictly in
    /// this order, one at a time, never waits for an array that waits for it (the tests check it
    /// by simulation). Transfers between devices of two processes must keep one order on both
    /// sides: NCCL matches a send to a receive by their order on the pair's communicator.
    pub fn transfers(&self, forward_only: bool) -> Vec<Transfer> {
        let timeline = self.simulate(|_, _| 1.0).expect("a schedule that runs");
        let chunks = self.chunks();
        let mut ended: Vec<(f64, usize, usize, Task)> = timeline
            .per_stage
            .iter()
            .enumerate()
            .flat_map(|(s, tasks)| tasks.iter().enumerate().map(move |(i, (t, _, end))| (*end, s, i, *t)))
            .collect();
        ended.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        ended
            .into_iter()
            .filter(|(_, _, _, t)| !forward_only || t.pass == Pass::Forward)
            .filter_map(|(_, from, _, producer)| {
                let consumer = match producer.pass {
                    Pass::Forward if producer.chunk + 1 < chunks => {
                        Task::forward(producer.chunk + 1, producer.microbatch)
                    }
                    Pass::Backward if producer.chunk > 0 => Task::backward(producer.chunk - 1, producer.microbatch),
                    _ => return None,
                };
                Some(Transfer { from, to: consumer.chunk % self.stages, consumer })
            })
            .collect()
    }

    /// Per stage, the most (chunk, microbatch) pairs whose forward ran and backward did not yet:
    /// the sets of saved activations the stage holds at once.
    pub fn max_in_flight(&self) -> Vec<usize> {
        self.per_stage
            .iter()
            .map(|tasks| {
                let (mut live, mut most) = (0i64, 0i64);
                for t in tasks {
                    live += if t.pass == Pass::Forward { 1 } else { -1 };
                    most = most.max(live);
                }
                most as usize
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Forward 1, backward 2 per layer group, split over `repeats` chunks per stage.
    fn unit_costs(repeats: usize) -> impl Fn(usize, &Task) -> f64 {
        move |_, t| if t.pass == Pass::Forward { 1.0 / repeats as f64 } else { 2.0 / repeats as f64 }
    }

    #[test]
    fn bubbles_match_the_closed_form() {
        for p in [2, 4, 8] {
            for v in [1, 2, 3] {
                for m in [p, 2 * p, 4 * p] {
                    let theory = (p as f64 - 1.0) / ((v * m) as f64 + p as f64 - 1.0);
                    let one_f_one_b = Schedule::one_forward_one_backward(p, v, m).simulate(unit_costs(v)).unwrap();
                    assert!(
                        (one_f_one_b.bubble() - theory).abs() < 1e-9,
                        "1f1b p={p} v={v} m={m}: {} vs {theory}",
                        one_f_one_b.bubble()
                    );
                    let gpipe = Schedule::gpipe(p, v, m).simulate(unit_costs(v)).unwrap();
                    assert!(
                        (gpipe.bubble() - theory).abs() < 1e-9,
                        "gpipe p={p} v={v} m={m}: {} vs {theory}",
                        gpipe.bubble()
                    );
                }
            }
        }
    }

    #[test]
    fn one_f_one_b_keeps_fewer_microbatches_in_flight_than_gpipe() {
        let (p, m) = (4, 8);
        assert_eq!(Schedule::one_forward_one_backward(p, 1, m).max_in_flight(), [4, 3, 2, 1]);
        assert_eq!(Schedule::gpipe(p, 1, m).max_in_flight(), [8, 8, 8, 8]);
        // The order of stage 1 of 4: two warm-up forwards, then one forward one backward.
        let order: Vec<String> =
            Schedule::one_forward_one_backward(p, 1, m).per_stage[1].iter().map(|t| t.to_string()).collect();
        assert_eq!(order[..6], ["F1.0", "F1.1", "F1.2", "B1.0", "F1.3", "B1.1"]);
    }

    /// Each stage runs its tasks in its order; each link between two stages hands over its
    /// arrays one at a time in the order of `transfers` (an array goes only once its producer
    /// ran, and a consumer runs only once its array arrived): every run completes, for every
    /// schedule, forward and backward or forward alone.
    #[test]
    fn links_that_follow_the_transfer_order_never_deadlock() {
        for p in 2..=8 {
            for v in [1, 2, 3] {
                for m in [p, p + 1, 2 * p].into_iter().filter(|&m| v == 1 || m % p == 0) {
                    let schedules = [Schedule::gpipe(p, v, m), Schedule::one_forward_one_backward(p, v, m)];
                    for (schedule, forward_only) in schedules.iter().flat_map(|s| [(s, false), (s, true)]) {
                        run_with_ordered_links(schedule, forward_only);
                    }
                }
            }
        }
    }

    fn run_with_ordered_links(schedule: &Schedule, forward_only: bool) {
        let what = format!(
            "{} p={} v={} m={} forward_only={forward_only}",
            schedule.name, schedule.stages, schedule.repeats, schedule.microbatches
        );
        let transfers = schedule.transfers(forward_only);
        let link = |t: &Transfer| (t.from.min(t.to), t.from.max(t.to));
        let mut links: std::collections::BTreeMap<(usize, usize), Vec<Transfer>> = Default::default();
        for t in &transfers {
            links.entry(link(t)).or_default().push(*t);
        }
        let orders: Vec<Vec<Task>> = schedule
            .per_stage
            .iter()
            .map(|tasks| tasks.iter().filter(|t| !forward_only || t.pass == Pass::Forward).copied().collect())
            .collect();
        let needs_input = |t: &Task| match t.pass {
            Pass::Forward => t.chunk > 0,
            Pass::Backward => !forward_only && t.chunk + 1 < schedule.chunks(),
        };
        let mut next = vec![0usize; schedule.stages];
        let mut next_on_link: std::collections::BTreeMap<(usize, usize), usize> = Default::default();
        let (mut produced, mut arrived) = (std::collections::HashSet::new(), std::collections::HashSet::new());
        loop {
            let mut progressed = false;
            for s in 0..schedule.stages {
                let Some(task) = orders[s].get(next[s]) else { continue };
                if needs_input(task) && !arrived.contains(task) {
                    continue;
                }
                produced.insert(*task);
                next[s] += 1;
                progressed = true;
            }
            for (key, sequence) in &links {
                let at = next_on_link.entry(*key).or_default();
                while let Some(t) = sequence.get(*at) {
                    let producer = match t.consumer.pass {
                        Pass::Forward => Task::forward(t.consumer.chunk - 1, t.consumer.microbatch),
                        Pass::Backward => Task::backward(t.consumer.chunk + 1, t.consumer.microbatch),
                    };
                    if !produced.contains(&producer) {
                        break;
                    }
                    arrived.insert(t.consumer);
                    *at += 1;
                    progressed = true;
                }
            }
            if next.iter().zip(&orders).all(|(n, o)| *n == o.len()) {
                break;
            }
            assert!(progressed, "{what}: deadlock with stages at {next:?}");
        }
        let expected = orders.iter().flatten().filter(|t| needs_input(t)).count();
        assert_eq!(transfers.len(), expected, "{what}: every input is a transfer");
    }

    #[test]
    fn a_bad_order_is_reported_as_a_deadlock() {
        let mut s = Schedule::one_forward_one_backward(2, 1, 2);
        // Stage 0 waits for a backward before sending its second forward, which stage 1 needs
        // first: F0.0, B0.0, F0.1, B0.1 against F1.0, F1.1, B1.0, B1.1.
        s.per_stage[1] = vec![Task::forward(1, 0), Task::forward(1, 1), Task::backward(1, 0), Task::backward(1, 1)];
        s.per_stage[0] = vec![Task::forward(0, 0), Task::backward(0, 0), Task::forward(0, 1), Task::backward(0, 1)];
        let err = s.simulate(unit_costs(1)).unwrap_err().to_string();
        assert!(err.contains("deadlocks"), "{err}");
    }
}
