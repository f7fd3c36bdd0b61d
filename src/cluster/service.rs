//! The coordination service: XLA's `CoordinationService` (the one `jax.distributed` runs on
//! process 0) over gRPC, with the semantics of XLA's `coordination_service.cc`:
//!
//! - **Registration** is a barrier: `RegisterTask` answers once every process has registered, or
//!   fails for all of them at the `jax_distributed_initialization_timeout`, naming the processes
//!   that never arrived. The time counts from the service's start (XLA starts it at the first
//!   registration), so that a coordinator no process ever reaches gives up too, and
//!   `maxrs coordinator` exits instead of waiting forever.
//! - **Heartbeats**: a connected process that sends none for `heartbeat_timeout_seconds` is
//!   marked failed; the error (naming its rank and host) goes to every process through its
//!   long-polling `PollForError` call and through every later heartbeat, so all of them stop
//!   instead of waiting in a collective for a peer that is gone.
//! - **Key-value store**: insert (optionally without overwrite), blocking get (bounded by the
//!   caller's gRPC deadline), try-get, directory get, increment, delete (recursive). Keys are
//!   normalized as XLA does (`//a//b/` is `a/b`).
//! - **Barriers** by id and counter, over all or some processes, with a timeout; a failed
//!   participant fails the barriers it is in. `ShutdownTask` is a barrier of all live processes
//!   (`shutdown_timeout_seconds`), after which they are disconnected together.
//! - **Job identity**: a request for another service instance (a stale incarnation), from a
//!   process id outside the job, from a process that restarted (new incarnation), or carrying
//!   maxrs's `maxrs-job` / `maxrs-num-processes` metadata for another job, is refused with a
//!   coordination error and does not disturb the job. Malformed messages are refused by the
//!   gRPC layer (bad frames close the connection, undecodable bodies get `INTERNAL`).
//!
//! [`Coordinator`] runs the service on its own threads (it is hosted by process 0, or
//! standalone by `maxrs coordinator`).

// `tonic::Status` (the gRPC layer's error) is large; it is what every call returns anyway.
#![allow(clippy::result_large_err)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use prost::Message;
use tokio::sync::{oneshot, watch, Notify};
use tonic::codec::{CompressionEncoding, ProstCodec};
use tonic::{Code, Request, Response, Status};

use super::proto::{self, coordination_status, Incarnations, TaskState};

/// gRPC metadata a maxrs client sends with every request so that a process of another job is
/// refused (JAX's own client sends none and is judged by task id and incarnation alone).
pub const JOB_METADATA: &str = "maxrs-job";
pub const NUM_PROCESSES_METADATA: &str = "maxrs-num-processes";

/// What a service instance is configured with.
#[derive(Clone, Debug)]
pub struct ServiceConfig {
    /// Processes in the job (task ids `0..num_processes`).
    pub num_processes: usize,
    /// The job's name, checked against clients that send one (`maxrs-job` metadata).
    pub job_name: String,
    pub heartbeat_timeout: Duration,
    /// How long registration waits for every process (`jax_distributed_initialization_timeout`).
    pub register_timeout: Duration,
    /// How long the shutdown barrier waits (`shutdown_timeout_seconds`).
    pub shutdown_timeout: Duration,
}

/// One process of the job as the service sees it.
struct Task {
    state: TaskState,
    incarnation: u64,
    /// The peer address it registered from (the "host" errors name).
    host: String,
    last_heartbeat: Instant,
    error: Option<Status>,
    /// Heartbeats and polls are still accepted this long after a disconnect (in-flight calls).
    grace_until: Option<Instant>,
}

struct Barrier {
    counter: i64,
    passed: bool,
    result: Result<(), Status>,
    participants: BTreeSet<i32>,
    arrived: BTreeSet<i32>,
    deadline: Instant,
    initiator: i32,
    waiters: Vec<(i32, oneshot::Sender<Result<i64, Status>>)>,
}

/// The registration barrier: who is waiting, and when it gives up (`None`: never).
struct Registration {
    deadline: Option<Instant>,
    waiters: BTreeMap<i32, oneshot::Sender<Result<(), Status>>>,
    failed: Option<Status>,
    done: bool,
}

struct Aliveness {
    tasks: BTreeSet<i32>,
    in_barrier: BTreeSet<i32>,
    waiters: Vec<oneshot::Sender<(Vec<i32>, Vec<u64>)>>,
}

struct State {
    tasks: Vec<Task>,
    kv: BTreeMap<String, Vec<u8>>,
    barriers: HashMap<String, Barrier>,
    registration: Registration,
    aliveness: Vec<Aliveness>,
    /// The first error that stops the job, sent to every poller and heartbeat.
    job_error: Option<Status>,
    /// The tasks that have been handed `job_error` (by a poll or a heartbeat answer).
    told: BTreeSet<i32>,
    stopped: bool,
}

/// The service state machine. Cheap to share (`Arc`); every method is safe to call from any
/// task of the runtime.
pub struct Service {
    config: ServiceConfig,
    incarnation: u64,
    state: Mutex<State>,
    kv_changed: Notify,
    job_error: watch::Sender<Option<Status>>,
    /// Turns true when the service stops: long polls end with `CANCELLED`.
    stopping: watch::Sender<bool>,
    version: watch::Sender<i64>,
    /// Set once every process has shut down (or the job failed): `maxrs coordinator` exits.
    finished: watch::Sender<Option<Result<(), String>>>,
}

const SHUTDOWN_BARRIER: &str = "[Shutdown]Wait_for_all_tasks_to_shut_down";

/// XLA's key normalization: no leading, trailing or repeated slashes.
pub fn normalize_key(key: &str) -> String {
    key.split('/').filter(|part| !part.is_empty()).collect::<Vec<_>>().join("/")
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    // A panic while holding the lock would be a bug in this module; the state stays usable.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn task_name(id: i32, host: &str) -> String {
    if host.is_empty() {
        format!("process {id}")
    } else {
        format!("process {id} (host {host})")
    }
}

impl Service {
    pub fn new(config: ServiceConfig) -> Arc<Service> {
        let now = Instant::now();
        let tasks = (0..config.num_processes)
            .map(|_| Task {
                state: TaskState::Disconnected,
                incarnation: 0,
                host: String::new(),
                last_heartbeat: now,
                error: None,
                grace_until: None,
            })
            .collect();
        Arc::new(Service {
            incarnation: rand::random::<u64>() | 1,
            state: Mutex::new(State {
                tasks,
                kv: BTreeMap::new(),
                barriers: HashMap::new(),
                registration: Registration {
                    deadline: now.checked_add(config.register_timeout),
                    waiters: BTreeMap::new(),
                    failed: None,
                    done: false,
                },
                aliveness: Vec::new(),
                job_error: None,
                told: BTreeSet::new(),
                stopped: false,
            }),
            config,
            kv_changed: Notify::new(),
            job_error: watch::channel(None).0,
            stopping: watch::channel(false).0,
            version: watch::channel(0).0,
            finished: watch::channel(None).0,
        })
    }

    pub fn config(&self) -> &ServiceConfig {
        &self.config
    }

    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// Resolves when the job is over: `Ok` after every process shut down, `Err` with the error
    /// that stopped it.
    pub fn finished(&self) -> watch::Receiver<Option<Result<(), String>>> {
        self.finished.subscribe()
    }

    fn name(&self, state: &State, id: i32) -> String {
        task_name(id, state.tasks.get(id as usize).map(|t| t.host.as_str()).unwrap_or(""))
    }

    fn bump_version(&self) {
        self.version.send_modify(|v| *v += 1);
    }

    // ---- checks every request goes through ----

    /// Refuses requests from another job (metadata), process ids outside the job, other
    /// service instances and restarted processes.
    fn check_identity<T>(
        &self,
        request: &Request<T>,
        task: Option<i32>,
        incarnations: Option<&Incarnations>,
    ) -> Result<(), Status> {
        let metadata = request.metadata();
        let text = |key: &str| metadata.get(key).and_then(|v| v.to_str().ok()).map(str::to_owned);
        if let Some(job) = text(JOB_METADATA) {
            if job != self.config.job_name {
                return Err(coordination_status(
                    Code::InvalidArgument,
                    format!(
                        "this coordinator serves job `{}`, but the request comes from job `{job}`; \
                         check coordinator_address (or JAX_COORDINATOR_ADDRESS) and run_name",
                        self.config.job_name
                    ),
                    None,
                ));
            }
        }
        if let Some(n) = text(NUM_PROCESSES_METADATA) {
            if n != self.config.num_processes.to_string() {
                return Err(coordination_status(
                    Code::InvalidArgument,
                    format!(
                        "this coordinator serves a job of {} processes, but the request comes from a job of {n}; \
                         every process must have the same num_processes (NNODES)",
                        self.config.num_processes
                    ),
                    None,
                ));
            }
        }
        if let Some(task) = task {
            self.check_task(task)?;
        }
        if let Some(inc) = incarnations {
            if inc.service_incarnation != 0 && inc.service_incarnation != self.incarnation {
                let payload = proto::ServiceMismatchError { service_incarnation: self.incarnation }.encode_to_vec();
                return Err(proto::with_payloads(
                    Code::FailedPrecondition,
                    format!(
                        "process {} registered with coordinator instance {:#x}, this is instance {:#x}: \
                         the coordinator restarted; restart the job",
                        task.map_or("?".to_string(), |t| t.to_string()),
                        inc.service_incarnation,
                        self.incarnation
                    ),
                    &[
                        (proto::COORDINATION_ERROR_KEY, proto::coordination_payload(task)),
                        (proto::SERVICE_MISMATCH_KEY, payload),
                    ],
                ));
            }
            let state = lock(&self.state);
            match task {
                Some(task) => {
                    let t = &state.tasks[task as usize];
                    if inc.task_incarnation != 0 && t.incarnation != 0 && inc.task_incarnation != t.incarnation {
                        return Err(coordination_status(
                            Code::Aborted,
                            format!(
                                "{} sent a request as incarnation {:#x}, but it registered as {:#x}: \
                                 another process claims the same process id, or it restarted",
                                self.name(&state, task),
                                inc.task_incarnation,
                                t.incarnation
                            ),
                            Some(task),
                        ));
                    }
                }
                // Key-value requests do not say which process sends them: the incarnation must
                // be one of the job's.
                None => {
                    if inc.task_incarnation != 0
                        && state.registration.done
                        && !state.tasks.iter().any(|t| t.incarnation == inc.task_incarnation)
                    {
                        return Err(coordination_status(
                            Code::Aborted,
                            format!(
                                "a process of incarnation {:#x} is not part of this job (it restarted, or belongs to \
                                 another job)",
                                inc.task_incarnation
                            ),
                            None,
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    fn check_task(&self, task: i32) -> Result<(), Status> {
        if task < 0 || task as usize >= self.config.num_processes {
            return Err(coordination_status(
                Code::InvalidArgument,
                format!(
                    "process {task} is not part of this job, which has processes 0..={}; check process_id (NODE_RANK) and num_processes (NNODES)",
                    self.config.num_processes - 1
                ),
                None,
            ));
        }
        Ok(())
    }

    fn stopped_error(what: &str) -> Status {
        coordination_status(Code::Internal, format!("the coordination service has stopped; {what} failed"), None)
    }

    // ---- registration ----

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
    fn check_registration(&self, state: &mut State, now: Instant) {
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

    // ---- failures ----

    /// Marks `task` failed, fails the barriers it is in, and stops the job.
    fn fail_task(&self, state: &mut State, task: i32, error: Status) {
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

    fn set_job_error(&self, state: &mut State, error: Status) {
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

    // ---- heartbeats and error polling ----

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

    // ---- key-value store ----

    pub fn insert(&self, key: &str, value: Vec<u8>, allow_overwrite: bool) -> Result<(), Status> {
        let key = normalize_key(key);
        {
            let mut state = lock(&self.state);
            if !allow_overwrite && state.kv.contains_key(&key) {
                return Err(Status::already_exists(format!("key {key} already exists")));
            }
            state.kv.insert(key, value);
        }
        self.kv_changed.notify_waiters();
        Ok(())
    }

    /// Waits until `key` exists (the caller's deadline bounds the wait).
    pub async fn get(&self, key: &str) -> Result<Vec<u8>, Status> {
        let key = normalize_key(key);
        loop {
            let changed = self.kv_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let state = lock(&self.state);
                if state.stopped {
                    return Err(Self::stopped_error("the key-value get"));
                }
                if let Some(value) = state.kv.get(&key) {
                    return Ok(value.clone());
                }
            }
            changed.await;
        }
    }

    pub fn try_get(&self, key: &str) -> Option<Vec<u8>> {
        lock(&self.state).kv.get(&normalize_key(key)).cloned()
    }

    pub fn get_dir(&self, directory: &str) -> Vec<(String, Vec<u8>)> {
        let prefix = format!("{}/", normalize_key(directory));
        let state = lock(&self.state);
        state
            .kv
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Adds `increment` to the decimal integer at `key` (0 when absent); returns the new value.
    pub fn increment(&self, key: &str, increment: i64) -> Result<i64, Status> {
        let key = normalize_key(key);
        let value = {
            let mut state = lock(&self.state);
            let current = match state.kv.get(&key) {
                None => 0,
                Some(bytes) => std::str::from_utf8(bytes)
                    .ok()
                    .and_then(|s| s.parse::<i64>().ok())
                    .ok_or_else(|| Status::failed_precondition(format!("key {key} does not hold a decimal integer")))?,
            };
            let value =
                current.checked_add(increment).ok_or_else(|| Status::out_of_range(format!("key {key} overflows")))?;
            state.kv.insert(key, value.to_string().into_bytes());
            value
        };
        self.kv_changed.notify_waiters();
        Ok(value)
    }

    pub fn delete(&self, key: &str) {
        let key = normalize_key(key);
        let prefix = format!("{key}/");
        let mut state = lock(&self.state);
        state.kv.remove(&key);
        state.kv.retain(|k, _| !k.starts_with(&prefix));
    }

    // ---- barriers ----

    fn pass_barrier(barrier: &mut Barrier, result: Result<(), Status>) {
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

    // ---- shutdown ----

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

    fn disconnect_all(&self, state: &mut State) {
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

    /// Stops the service: pending calls get `CANCELLED`/`INTERNAL`, pollers are released.
    pub fn stop(&self) {
        let mut state = lock(&self.state);
        state.stopped = true;
        for barrier in state.barriers.values_mut().filter(|b| !b.passed) {
            Self::pass_barrier(barrier, Err(Status::aborted("the coordination service is shutting down")));
        }
        drop(state);
        self.stopping.send_replace(true);
        self.kv_changed.notify_waiters();
    }

    // ---- task states ----

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

    fn alive(state: &State, tasks: &BTreeSet<i32>) -> Vec<i32> {
        tasks.iter().copied().filter(|&t| state.tasks[t as usize].state == TaskState::Connected).collect()
    }

    fn refresh_aliveness(&self, state: &mut State) {
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

// ---- gRPC plumbing ----

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

type Handle<Req, Resp> = fn(Arc<Service>, Request<Req>) -> BoxFuture<Result<Response<Resp>, Status>>;

/// A unary handler as tonic's server wants it: the service and one method's function.
struct Handler<Req, Resp>(Arc<Service>, Handle<Req, Resp>);

impl<Req, Resp> tonic::server::UnaryService<Req> for Handler<Req, Resp> {
    type Response = Resp;
    type Future = BoxFuture<Result<Response<Resp>, Status>>;

    fn call(&mut self, request: Request<Req>) -> Self::Future {
        (self.1)(self.0.clone(), request)
    }
}

async fn serve_unary<Req, Resp, B>(
    request: http::Request<B>,
    service: Arc<Service>,
    handle: Handle<Req, Resp>,
) -> http::Response<tonic::body::Body>
where
    Req: Message + Default + Send + 'static,
    Resp: Message + Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send,
{
    let mut grpc = tonic::server::Grpc::new(ProstCodec::<Resp, Req>::default())
        .accept_compressed(CompressionEncoding::Gzip)
        .send_compressed(CompressionEncoding::Gzip);
    grpc.unary(Handler(service, handle), request).await
}

/// The tower service tonic's server runs: routes `/xla.coordination.CoordinationService/<Method>`
/// to [`Service`].
#[derive(Clone)]
pub struct GrpcService(pub Arc<Service>);

fn host_of<T>(request: &Request<T>) -> String {
    request.remote_addr().map(|a| a.ip().to_string()).unwrap_or_default()
}

/// Defines the routing table: each entry decodes a request type, runs a body with
/// (service, tonic request, message) and encodes the response type.
macro_rules! routes {
    ($service:expr, $path:expr, $request:expr, { $($method:literal => |$s:ident, $r:ident, $m:ident: $req:ty| -> $resp:ty $body:block)* }) => {
        match $path {
            $(concat!("/xla.coordination.CoordinationService/", $method) => {
                fn handle($s: Arc<Service>, $r: Request<$req>) -> BoxFuture<Result<Response<$resp>, Status>> {
                    Box::pin(async move {
                        let $m = $r.get_ref().clone();
                        let result: Result<$resp, Status> = $body;
                        result.map(Response::new)
                    })
                }
                serve_unary($request, $service.clone(), handle).await
            })*
            other => Status::unimplemented(format!("{other} is not a method of {}", proto::SERVICE_NAME)).into_http(),
        }
    };
}

impl<B> tower_service::Service<http::Request<B>> for GrpcService
where
    B: http_body::Body + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move {
            let path = request.uri().path().to_string();
            Ok(routes!(service, path.as_str(), request, {
                "RegisterTask" => |s, r, m: proto::RegisterTaskRequest| -> proto::RegisterTaskResponse {
                    async {
                        s.check_identity(&r, Some(m.source_task_id), None)?;
                        s.register(m.source_task_id, m.incarnation, host_of(&r)).await?;
                        Ok(proto::RegisterTaskResponse { service_incarnation: s.incarnation() })
                    }.await
                }
                "Heartbeat" => |s, r, m: proto::HeartbeatRequest| -> proto::HeartbeatResponse {
                    s.check_identity(&r, Some(m.source_task_id), m.incarnations.as_ref())
                        .and_then(|()| s.heartbeat(m.source_task_id, m.incarnation))
                        .map(|service_incarnation| proto::HeartbeatResponse { service_incarnation })
                }
                "PollForError" => |s, r, m: proto::PollForErrorRequest| -> proto::PollForErrorResponse {
                    async {
                        s.check_identity(&r, Some(m.source_task_id), m.incarnations.as_ref())?;
                        Err(s.poll_for_error(m.source_task_id).await)
                    }.await
                }
                "ReportErrorToService" => |s, r, m: proto::ReportErrorToServiceRequest| -> proto::ReportErrorToServiceResponse {
                    s.check_identity(&r, Some(m.source_task_id), m.incarnations.as_ref())
                        .and_then(|()| s.report_error(m.source_task_id, m.error_code, &m.error_message))
                        .map(|()| proto::ReportErrorToServiceResponse {})
                }
                "ShutdownTask" => |s, r, m: proto::ShutdownTaskRequest| -> proto::ShutdownTaskResponse {
                    async {
                        s.check_identity(&r, Some(m.source_task_id), m.incarnations.as_ref())?;
                        s.shutdown_task(m.source_task_id).await?;
                        Ok(proto::ShutdownTaskResponse {})
                    }.await
                }
                "WatchTasks" => |s, r, m: proto::WatchTasksRequest| -> proto::WatchTasksResponse {
                    async {
                        if let Some(inc) = &m.incarnations {
                            s.check_identity(&r, None, Some(inc))?;
                        }
                        let (task_state, version_number) = s.watch_tasks(m.version_number).await;
                        Ok(proto::WatchTasksResponse { task_state, version_number })
                    }.await
                }
                "InsertKeyValue" => |s, r, m: proto::InsertKeyValueRequest| -> proto::InsertKeyValueResponse {
                    check_kv_identity(&s, &r, m.incarnations.as_ref()).and_then(|()| {
                        let kv = m.kv.ok_or_else(|| Status::invalid_argument("InsertKeyValue without a key-value entry"))?;
                        s.insert(&kv.key, kv.value, m.allow_overwrite).map(|()| proto::InsertKeyValueResponse {})
                    })
                }
                "GetKeyValue" => |s, r, m: proto::GetKeyValueRequest| -> proto::GetKeyValueResponse {
                    async {
                        check_kv_identity(&s, &r, m.incarnations.as_ref())?;
                        let value = s.get(&m.key).await?;
                        Ok(proto::GetKeyValueResponse { kv: Some(proto::KeyValueEntry { key: m.key, value }) })
                    }.await
                }
                "TryGetKeyValue" => |s, r, m: proto::TryGetKeyValueRequest| -> proto::TryGetKeyValueResponse {
                    check_kv_identity(&s, &r, m.incarnations.as_ref()).and_then(|()| match s.try_get(&m.key) {
                        Some(value) => Ok(proto::TryGetKeyValueResponse { kv: Some(proto::KeyValueEntry { key: m.key, value }) }),
                        None => Err(Status::not_found(format!("key {} not found", m.key))),
                    })
                }
                "IncrementKeyValue" => |s, r, m: proto::IncrementKeyValueRequest| -> proto::IncrementKeyValueResponse {
                    check_kv_identity(&s, &r, m.incarnations.as_ref()).and_then(|()| {
                        let value = s.increment(&m.key, m.increment)?;
                        Ok(proto::IncrementKeyValueResponse {
                            kv: Some(proto::KeyValueEntry { key: m.key, value: value.to_string().into_bytes() }),
                        })
                    })
                }
                "GetKeyValueDir" => |s, r, m: proto::GetKeyValueDirRequest| -> proto::GetKeyValueDirResponse {
                    check_kv_identity(&s, &r, m.incarnations.as_ref()).map(|()| {
                        let kv = s.get_dir(&m.directory_key).into_iter().map(|(key, value)| proto::KeyValueEntry { key, value }).collect();
                        proto::GetKeyValueDirResponse { directory_key: m.directory_key, kv }
                    })
                }
                "DeleteKeyValue" => |s, r, m: proto::DeleteKeyValueRequest| -> proto::DeleteKeyValueResponse {
                    check_kv_identity(&s, &r, m.incarnations.as_ref()).map(|()| {
                        s.delete(&m.key);
                        proto::DeleteKeyValueResponse {}
                    })
                }
                "Barrier" => |s, r, m: proto::BarrierRequest| -> proto::BarrierResponse {
                    async {
                        s.check_identity(&r, Some(m.source_task_id), m.incarnations.as_ref())?;
                        let timeout = Duration::from_millis(m.barrier_timeout_in_ms.clamp(0, i64::MAX) as u64);
                        let counter = s.barrier(&m.barrier_id, m.counter, timeout, m.source_task_id, &m.task_ids).await?;
                        Ok(proto::BarrierResponse { counter })
                    }.await
                }
                "CancelBarrier" => |s, r, m: proto::CancelBarrierRequest| -> proto::CancelBarrierResponse {
                    s.check_identity(&r, Some(m.source_task_id), m.incarnations.as_ref())
                        .and_then(|()| s.cancel_barrier(&m.barrier_id, m.counter, m.source_task_id))
                        .map(|()| proto::CancelBarrierResponse {})
                }
                "GetAliveTasks" => |s, r, m: proto::GetAliveTasksRequest| -> proto::GetAliveTasksResponse {
                    async {
                        s.check_identity(&r, Some(m.requesting_task_id), m.incarnations.as_ref())?;
                        let (alive_task_ids, incarnations) = s.get_alive_tasks(m.requesting_task_id, &m.task_ids).await?;
                        Ok(proto::GetAliveTasksResponse { alive_task_ids, incarnations })
                    }.await
                }
            }))
        })
    }
}

/// Key-value requests name their task only inside `incarnations` (absent from some clients).
fn check_kv_identity<T>(
    service: &Service,
    request: &Request<T>,
    incarnations: Option<&Incarnations>,
) -> Result<(), Status> {
    service.check_identity(request, None, incarnations)
}

/// A running service: its own threads, its port, stopped when dropped.
pub struct Coordinator {
    service: Arc<Service>,
    address: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<()>>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Coordinator {
    /// Binds `bind` (port 0 picks a free one) and serves `config`'s job on two threads.
    pub fn start(bind: SocketAddr, config: ServiceConfig) -> Result<Coordinator> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("maxrs-coordinator")
            .enable_all()
            .build()
            .context("starting the coordinator's threads")?;
        let listener = std::net::TcpListener::bind(bind).with_context(|| {
            format!("the coordinator cannot listen on {bind} (is another job or coordinator using the port?)")
        })?;
        listener.set_nonblocking(true)?;
        let address = listener.local_addr()?;
        let service = Service::new(config);
        let (shutdown, stop) = oneshot::channel::<()>();
        let grpc = GrpcService(service.clone());
        let health = service.clone();
        let server = runtime.block_on(async {
            let listener = tokio::net::TcpListener::from_std(listener)?;
            let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
            let server = tokio::spawn(async move {
                let result = tonic::transport::Server::builder()
                    .serve_with_incoming_shutdown(grpc, incoming, async {
                        let _ = stop.await;
                    })
                    .await;
                if let Err(e) = result {
                    tracing::error!("the coordination service stopped: {e}");
                }
            });
            let period = (health.config.heartbeat_timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(period);
                loop {
                    tick.tick().await;
                    health.check_health();
                }
            });
            anyhow::Ok(server)
        })?;
        Ok(Coordinator { service, address, shutdown: Some(shutdown), server: Some(server), runtime: Some(runtime) })
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    pub fn service(&self) -> &Arc<Service> {
        &self.service
    }

    /// Blocks until the job is over (see [`Service::finished`]).
    pub fn wait_finished(&self) -> Result<(), String> {
        let mut rx = self.service.finished();
        let runtime = self.runtime.as_ref().expect("running");
        runtime
            .block_on(async { rx.wait_for(|f| f.is_some()).await.map(|f| f.clone().expect("waited")) })
            .unwrap_or(Ok(()))
    }
}

impl Drop for Coordinator {
    fn drop(&mut self) {
        self.service.stop();
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(runtime) = self.runtime.take() {
            // In-flight answers (the other processes' shutdown barrier) leave before the
            // connections close; a peer that does not read them gets 2 s.
            if let Some(server) = self.server.take() {
                let _ = runtime.block_on(async { tokio::time::timeout(Duration::from_secs(2), server).await });
            }
            runtime.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_normalized_like_xla() {
        assert_eq!(normalize_key("///a//b/c//"), "a/b/c");
        assert_eq!(normalize_key("gpu:local_topology/cuda/0"), "gpu:local_topology/cuda/0");
        assert_eq!(normalize_key("/"), "");
    }
}
