//! Which processes are alive: heartbeats and the health check that fails a silent process, a
//! failure reaching every process (error polls, heartbeat answers), reported errors, the task
//! states `WatchTasks` streams, and `GetAliveTasks`.

// `tonic::Status` (the gRPC layer's error) is large; it is what every call returns anyway.
#![allow(clippy::result_large_err)]

use std::collections::BTreeSet;
use std::time::Instant;

use tokio::sync::oneshot;
use tonic::{Code, Status};

use super::barrier::SHUTDOWN_BARRIER;
use super::{lock, task_name, Aliveness, Service, State};
use crate::cluster::proto::{self, coordination_status, TaskState};

impl Service {
    /// Marks `task` failed, fails the barriers it is in, and stops the job.
    pub(super) fn fail_task(&self, state: &mut State, task: i32, error: Status) {
        let t = &mut state.tasks[task as usize];
        if t.state == TaskState::Error {
            return;
        }
        t.state = TaskState::Error;
        t.error = Some(error.clone());
        let ids: Vec<String> = state
            .barriers
            .iter()
            .filter(|(_, b)| !b.passed && b.participants.contains(&task))
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            let message = format!("barrier {id} failed: {}", error.message());
            let barrier = state.barriers.get_mut(&id).expect("listed above");
            Self::pass_barrier(barrier, Err(coordination_status(Code::Internal, message, Some(task))));
        }
        self.refresh_aliveness(state);
        self.set_job_error(state, error);
        self.bump_version();
    }

    pub(super) fn set_job_error(&self, state: &mut State, error: Status) {
        if state.job_error.is_some() {
            return;
        }
        tracing::error!("coordination service: {}", error.message());
        state.job_error = Some(error.clone());
        self.job_error.send_replace(Some(error.clone()));
        self.finished.send_replace(Some(Err(error.message().to_string())));
    }

    /// One pass of the health check: stale heartbeats, expired barriers, the registration
    /// deadline. Runs every `min(1 s, heartbeat_timeout / 4)`.
    pub fn check_health(&self) {
        let now = Instant::now();
        let mut state = lock(&self.state);
        if state.stopped {
            return;
        }
        self.check_registration(&mut state, now);
        let timeout = self.config.heartbeat_timeout;
        let stale: Vec<i32> = state
            .tasks
            .iter()
            .enumerate()
            .filter(|(_, t)| t.state == TaskState::Connected && now.duration_since(t.last_heartbeat) > timeout)
            .map(|(i, _)| i as i32)
            .collect();
        for task in stale {
            let silent = now.duration_since(state.tasks[task as usize].last_heartbeat);
            let error = coordination_status(
                Code::Unavailable,
                format!(
                    "{} sent no heartbeat for {:.1} s (heartbeat_timeout_seconds={}): it died, hangs or lost its \
                     network; stopping every process of the job",
                    self.name(&state, task),
                    silent.as_secs_f64(),
                    timeout.as_secs_f64()
                ),
                Some(task),
            );
            self.fail_task(&mut state, task, error);
        }
        let expired: Vec<String> =
            state.barriers.iter().filter(|(_, b)| !b.passed && now > b.deadline).map(|(id, _)| id.clone()).collect();
        for id in expired {
            let barrier = &state.barriers[&id];
            let missing: Vec<String> = barrier
                .participants
                .difference(&barrier.arrived)
                .map(|&t| task_name(t, &state.tasks[t as usize].host))
                .collect();
            let message = format!(
                "barrier {id} timed out: {} of {} processes arrived (first: process {}); missing: {}",
                barrier.arrived.len(),
                barrier.participants.len(),
                barrier.initiator,
                missing.join(", ")
            );
            let shutdown = id == SHUTDOWN_BARRIER;
            let barrier = state.barriers.get_mut(&id).expect("listed above");
            Self::pass_barrier(barrier, Err(coordination_status(Code::DeadlineExceeded, message.clone(), None)));
            if shutdown {
                let error =
                    coordination_status(Code::Internal, format!("the shutdown barrier failed: {message}"), None);
                self.set_job_error(&mut state, error);
            }
        }
    }

    pub fn heartbeat(&self, task: i32, incarnation: u64) -> Result<u64, Status> {
        let mut state = lock(&self.state);
        if state.stopped {
            return Err(Self::stopped_error("the heartbeat"));
        }
        if let Some(error) = state.job_error.clone() {
            state.told.insert(task);
            return Err(error);
        }
        let name = self.name(&state, task);
        let t = &mut state.tasks[task as usize];
        match t.state {
            TaskState::Connected => {}
            TaskState::Error => return Err(t.error.clone().unwrap_or_else(|| Status::aborted("in error"))),
            _ if t.grace_until.is_some_and(|g| Instant::now() < g) => return Ok(self.incarnation),
            _ => {
                return Err(coordination_status(
                    Code::InvalidArgument,
                    format!("{name} sent a heartbeat without being registered; it must register first"),
                    Some(task),
                ))
            }
        }
        if incarnation != 0 && incarnation != t.incarnation {
            let error = coordination_status(
                Code::Aborted,
                format!(
                    "{name} sent a heartbeat as incarnation {incarnation:#x}, but registered as {:#x}: it restarted",
                    t.incarnation
                ),
                Some(task),
            );
            self.fail_task(&mut state, task, error.clone());
            return Err(error);
        }
        t.last_heartbeat = Instant::now();
        Ok(self.incarnation)
    }

    /// Waits until the job fails (the error) or the service stops (`CANCELLED`).
    pub async fn poll_for_error(&self, task: i32) -> Status {
        {
            let state = lock(&self.state);
            let t = &state.tasks[task as usize];
            if t.state == TaskState::Disconnected && t.grace_until.is_none_or(|g| Instant::now() >= g) {
                return coordination_status(
                    Code::FailedPrecondition,
                    format!("{} polls for errors without being registered", self.name(&state, task)),
                    Some(task),
                );
            }
        }
        let mut rx = self.job_error.subscribe();
        let mut stopping = self.stopping.subscribe();
        let cancelled = || Status::cancelled("the coordination service is shutting down");
        tokio::select! {
            error = rx.wait_for(|e| e.is_some()) => match error {
                Ok(error) => {
                    let error = error.clone().expect("waited for Some");
                    lock(&self.state).told.insert(task);
                    error
                }
                Err(_) => cancelled(),
            },
            _ = stopping.wait_for(|s| *s) => cancelled(),
        }
    }

    /// Whether every connected task other than `except` has been handed the job's error (a task
    /// that failed itself needs no telling).
    pub fn error_delivered(&self, except: i32) -> bool {
        let state = lock(&self.state);
        state.job_error.is_some()
            && (0..state.tasks.len() as i32)
                .filter(|&t| t != except && state.tasks[t as usize].state == TaskState::Connected)
                .all(|t| state.told.contains(&t))
    }

    pub fn report_error(&self, task: i32, code: i32, message: &str) -> Result<(), Status> {
        let mut state = lock(&self.state);
        if state.tasks[task as usize].state != TaskState::Connected {
            return Err(coordination_status(
                Code::FailedPrecondition,
                format!("{} reported an error but is not connected", self.name(&state, task)),
                Some(task),
            ));
        }
        let error = coordination_status(
            Code::from_i32(code),
            format!("{} reported an error: {message}", self.name(&state, task)),
            Some(task),
        );
        self.fail_task(&mut state, task, error);
        Ok(())
    }

    fn task_infos(&self, state: &State) -> Vec<proto::TaskInfo> {
        state
            .tasks
            .iter()
            .enumerate()
            .map(|(i, t)| proto::TaskInfo {
                task_id: i as i32,
                incarnation: t.incarnation,
                state: t.state as i32,
                error_code: t.error.as_ref().map_or(0, |e| e.code() as i32),
                error_message: t.error.as_ref().map(|e| e.message().to_string()).unwrap_or_default(),
                error_payload: t
                    .error
                    .as_ref()
                    .map(|_| proto::CoordinationServiceError { is_reported_error: false, source_task_id: i as i32 }),
            })
            .collect()
    }

    /// The task states once their version differs from `version` (-1: now).
    pub async fn watch_tasks(&self, version: i64) -> (Vec<proto::TaskInfo>, i64) {
        let mut rx = self.version.subscribe();
        let mut stopping = self.stopping.subscribe();
        tokio::select! {
            _ = rx.wait_for(|v| *v != version) => {}
            _ = stopping.wait_for(|s| *s) => {}
        }
        let current = *rx.borrow();
        (self.task_infos(&lock(&self.state)), current)
    }

    pub(super) fn alive(state: &State, tasks: &BTreeSet<i32>) -> Vec<i32> {
        tasks.iter().copied().filter(|&t| state.tasks[t as usize].state == TaskState::Connected).collect()
    }

    pub(super) fn refresh_aliveness(&self, state: &mut State) {
        let mut i = 0;
        while i < state.aliveness.len() {
            let alive = Self::alive(state, &state.aliveness[i].tasks);
            if alive.iter().all(|t| state.aliveness[i].in_barrier.contains(t)) {
                let incarnations = alive.iter().map(|&t| state.tasks[t as usize].incarnation).collect::<Vec<_>>();
                for waiter in state.aliveness.remove(i).waiters {
                    let _ = waiter.send((alive.clone(), incarnations.clone()));
                }
            } else {
                i += 1;
            }
        }
    }

    /// XLA's `GetAliveTasks`: a barrier among the live processes of `tasks`, which all get the
    /// same answer.
    pub async fn get_alive_tasks(&self, task: i32, tasks: &[i32]) -> Result<(Vec<i32>, Vec<u64>), Status> {
        for &t in tasks {
            self.check_task(t)?;
        }
        let set: BTreeSet<i32> = tasks.iter().copied().collect();
        if !set.contains(&task) {
            return Err(Status::invalid_argument(format!(
                "process {task} asked about {tasks:?}, which must include it"
            )));
        }
        let rx = {
            let mut state = lock(&self.state);
            let (tx, rx) = oneshot::channel();
            match state.aliveness.iter_mut().find(|a| a.tasks == set) {
                Some(a) => {
                    a.in_barrier.insert(task);
                    a.waiters.push(tx);
                }
                None => state.aliveness.push(Aliveness { tasks: set, in_barrier: [task].into(), waiters: vec![tx] }),
            }
            self.refresh_aliveness(&mut state);
            rx
        };
        rx.await.map_err(|_| Self::stopped_error("GetAliveTasks"))
    }
}
