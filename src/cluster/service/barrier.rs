//! Barriers by id and counter, over all or some processes, with a timeout; `ShutdownTask` is the
//! barrier of every live process, after which they disconnect together.

// `tonic::Status` (the gRPC layer's error) is large; it is what every call returns anyway.
#![allow(clippy::result_large_err)]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tonic::{Code, Status};

use super::{lock, Barrier, Service, State};
use crate::cluster::proto::{coordination_status, TaskState};

pub(super) const SHUTDOWN_BARRIER: &str = "[Shutdown]Wait_for_all_tasks_to_shut_down";

impl Service {
    pub(super) fn pass_barrier(barrier: &mut Barrier, result: Result<(), Status>) {
        barrier.passed = true;
        barrier.result = result.clone();
        for (_, waiter) in barrier.waiters.drain(..) {
            let _ = waiter.send(result.clone().map(|()| barrier.counter));
        }
    }

    /// `task` arrives at barrier `id` (instance `counter`) of `participants` (empty: everyone).
    pub async fn barrier(
        &self,
        id: &str,
        counter: i64,
        timeout: Duration,
        task: i32,
        participants: &[i32],
    ) -> Result<i64, Status> {
        let wait = {
            let mut state = lock(&self.state);
            if state.stopped {
                return Err(Self::stopped_error(&format!("barrier {id}")));
            }
            for &p in participants {
                self.check_task(p)?;
            }
            let everyone: BTreeSet<i32> = (0..self.config.num_processes as i32).collect();
            let wanted: BTreeSet<i32> =
                if participants.is_empty() { everyone } else { participants.iter().copied().collect() };
            if !wanted.contains(&task) {
                return Err(coordination_status(
                    Code::InvalidArgument,
                    format!("process {task} called barrier {id} but is not one of its processes {wanted:?}"),
                    Some(task),
                ));
            }
            let failed_participant =
                wanted.iter().copied().find(|&p| state.tasks[p as usize].state == TaskState::Error);
            let now = Instant::now();
            let fresh = match state.barriers.get(id) {
                None => counter == 0,
                Some(b) => b.passed && counter == b.counter + 1,
            };
            if fresh {
                let mut barrier = Barrier {
                    counter,
                    passed: false,
                    result: Ok(()),
                    participants: wanted.clone(),
                    arrived: BTreeSet::new(),
                    deadline: now + timeout,
                    initiator: task,
                    waiters: Vec::new(),
                };
                if let Some(p) = failed_participant {
                    let message = format!("barrier {id}: {} had already failed", self.name(&state, p));
                    Self::pass_barrier(&mut barrier, Err(coordination_status(Code::Internal, message, Some(p))));
                }
                state.barriers.insert(id.to_string(), barrier);
            }
            let name = self.name(&state, task);
            let Some(barrier) = state.barriers.get_mut(id) else {
                return Err(coordination_status(
                    Code::Internal,
                    format!(
                        "{name} called barrier {id} as instance {counter}, but it was never started (instance 0 first)"
                    ),
                    Some(task),
                ));
            };
            if counter != barrier.counter {
                let error = coordination_status(
                    Code::Internal,
                    format!(
                        "{name} called barrier {id} as instance {counter}, but the service is at instance {}: \
                         a process restarted or runs ahead of the others",
                        barrier.counter
                    ),
                    Some(task),
                );
                if !barrier.passed {
                    Self::pass_barrier(barrier, Err(error.clone()));
                }
                return Err(error);
            }
            if barrier.passed {
                return barrier.result.clone().map(|()| barrier.counter);
            }
            if barrier.participants != wanted {
                let error = coordination_status(
                    Code::InvalidArgument,
                    format!(
                        "barrier {id}: process {} called it for processes {:?}, {name} for {wanted:?}; every caller must name the same processes",
                        barrier.initiator, barrier.participants
                    ),
                    Some(task),
                );
                Self::pass_barrier(barrier, Err(error.clone()));
                return Err(error);
            }
            let (tx, rx) = oneshot::channel();
            barrier.waiters.retain(|(t, _)| *t != task);
            barrier.waiters.push((task, tx));
            barrier.arrived.insert(task);
            if barrier.arrived == barrier.participants {
                Self::pass_barrier(barrier, Ok(()));
                if id == SHUTDOWN_BARRIER {
                    self.disconnect_all(&mut state);
                }
            }
            rx
        };
        wait.await.unwrap_or_else(|_| Err(Self::stopped_error("the barrier")))
    }

    pub fn cancel_barrier(&self, id: &str, counter: i64, task: i32) -> Result<(), Status> {
        let mut state = lock(&self.state);
        let name = self.name(&state, task);
        match state.barriers.get_mut(id) {
            Some(b) if b.counter == counter && !b.passed => {
                let message = format!("barrier {id} was cancelled by {name}");
                Self::pass_barrier(b, Err(coordination_status(Code::Cancelled, message, Some(task))));
                Ok(())
            }
            Some(b) if b.counter == counter => {
                Err(Status::failed_precondition(format!("barrier {id} has already passed")))
            }
            _ => Err(Status::failed_precondition(format!("barrier {id} instance {counter} is not running"))),
        }
    }

    /// The shutdown barrier over every process not in error; then all disconnect together.
    pub async fn shutdown_task(&self, task: i32) -> Result<(), Status> {
        let (participants, counter) = {
            let state = lock(&self.state);
            if state.tasks[task as usize].state != TaskState::Connected {
                return Err(coordination_status(
                    Code::FailedPrecondition,
                    format!("{} asked to shut down but is not connected", self.name(&state, task)),
                    Some(task),
                ));
            }
            let participants: Vec<i32> = (0..self.config.num_processes as i32)
                .filter(|&t| state.tasks[t as usize].state != TaskState::Error)
                .collect();
            // Each job shuts down once; a process that re-registered alone shuts down alone.
            let counter = match state.barriers.get(SHUTDOWN_BARRIER) {
                None => 0,
                Some(b) if b.passed => b.counter + 1,
                Some(b) => b.counter,
            };
            (participants, counter)
        };
        let participants = if counter == 0 { participants } else { vec![task] };
        self.barrier(SHUTDOWN_BARRIER, counter, self.config.shutdown_timeout, task, &participants).await.map(|_| ())
    }

    pub(super) fn disconnect_all(&self, state: &mut State) {
        let grace = Instant::now() + self.config.heartbeat_timeout;
        for t in &mut state.tasks {
            if t.state == TaskState::Connected {
                t.state = TaskState::Disconnected;
                t.grace_until = Some(grace);
            }
        }
        self.refresh_aliveness(state);
        self.bump_version();
        if state.job_error.is_none() {
            self.finished.send_replace(Some(Ok(())));
        }
    }
}
