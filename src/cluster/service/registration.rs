//! Registration, a barrier of every process: `RegisterTask` answers once all have registered,
//! or fails for all of them at the registration deadline, naming who never came.

// `tonic::Status` (the gRPC layer's error) is large; it is what every call returns anyway.
#![allow(clippy::result_large_err)]

use std::collections::BTreeSet;
use std::time::Instant;

use tokio::sync::oneshot;
use tonic::{Code, Status};

use super::{lock, task_name, Service, State};
use crate::cluster::proto::{coordination_status, TaskState};

impl Service {
    pub async fn register(&self, task: i32, incarnation: u64, host: String) -> Result<(), Status> {
        let wait = {
            let mut state = lock(&self.state);
            if state.stopped {
                return Err(Self::stopped_error("registration"));
            }
            if let Some(error) = &state.registration.failed {
                return Err(error.clone());
            }
            let t = &state.tasks[task as usize];
            match t.state {
                TaskState::Connected if t.incarnation == incarnation => {
                    // A retried registration whose answer was lost: already connected.
                    state.tasks[task as usize].last_heartbeat = Instant::now();
                    return Ok(());
                }
                TaskState::Connected => {
                    let message = format!(
                        "{} registered again with a new incarnation ({:#x}, was {:#x}) from {host}: \
                         it restarted, or two processes have the same process id; the job stops",
                        self.name(&state, task),
                        incarnation,
                        t.incarnation
                    );
                    let error = coordination_status(Code::Aborted, message, Some(task));
                    self.fail_task(&mut state, task, error.clone());
                    return Err(error);
                }
                TaskState::Error => {
                    let existing = t.error.as_ref().map(|e| e.message().to_string()).unwrap_or_default();
                    return Err(coordination_status(
                        Code::Aborted,
                        format!("{} tried to register while in error: {existing}", self.name(&state, task)),
                        Some(task),
                    ));
                }
                _ => {}
            }
            if state.registration.done {
                // Registration passed and this task had shut down: it may come back alone.
                let t = &mut state.tasks[task as usize];
                t.state = TaskState::Connected;
                t.incarnation = incarnation;
                t.host = host;
                t.last_heartbeat = Instant::now();
                t.grace_until = None;
                self.bump_version();
                return Ok(());
            }
            let t = &mut state.tasks[task as usize];
            t.incarnation = incarnation;
            t.host = host;
            let (tx, rx) = oneshot::channel();
            let registration = &mut state.registration;
            if let Some(old) = registration.waiters.insert(task, tx) {
                let _ =
                    old.send(Err(Status::cancelled("a newer registration from the same process replaced this one")));
            }
            if registration.waiters.len() == self.config.num_processes {
                let now = Instant::now();
                for (_, waiter) in std::mem::take(&mut registration.waiters) {
                    let _ = waiter.send(Ok(()));
                }
                registration.done = true;
                for t in &mut state.tasks {
                    t.state = TaskState::Connected;
                    t.last_heartbeat = now;
                }
                self.bump_version();
            }
            rx
        };
        wait.await.unwrap_or_else(|_| Err(Self::stopped_error("registration")))
    }

    /// Fails registration for everyone when its deadline passed, naming who never came.
    pub(super) fn check_registration(&self, state: &mut State, now: Instant) {
        let registration = &mut state.registration;
        let Some(deadline) = registration.deadline else { return };
        if registration.done || registration.failed.is_some() || now < deadline {
            return;
        }
        let arrived: BTreeSet<i32> = registration.waiters.keys().copied().collect();
        let missing: Vec<String> =
            (0..self.config.num_processes as i32).filter(|t| !arrived.contains(t)).map(|t| t.to_string()).collect();
        let present: Vec<String> = arrived.iter().map(|&t| task_name(t, &state.tasks[t as usize].host)).collect();
        let error = coordination_status(
            Code::DeadlineExceeded,
            format!(
                "registration timed out after {:.0} s (jax_distributed_initialization_timeout): process{} {} of {} never registered \
                 (registered: {}); check that every process started and can reach the coordinator",
                self.config.register_timeout.as_secs_f64(),
                if missing.len() == 1 { "" } else { "es" },
                missing.join(", "),
                self.config.num_processes,
                if present.is_empty() { "none".to_string() } else { present.join(", ") }
            ),
            None,
        );
        for (_, waiter) in std::mem::take(&mut registration.waiters) {
            let _ = waiter.send(Err(error.clone()));
        }
        registration.failed = Some(error.clone());
        for t in &mut state.tasks {
            t.state = TaskState::Error;
            t.error = Some(error.clone());
        }
        self.set_job_error(state, error);
    }
}
