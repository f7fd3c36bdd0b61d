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
//!
//! This module holds the service's state and its life cycle; each concern's methods are in
//! their own file: `identity` (the checks every request goes through), `registration`,
//! `liveness` (heartbeats, failures, error polling, task states), `kv`, `barrier`
//! (shutdown included), and `grpc` (routing requests to the methods, and the server).

// `tonic::Status` (the gRPC layer's error) is large; it is what every call returns anyway.
#![allow(clippy::result_large_err)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, watch, Notify};
use tonic::Status;

use super::proto::TaskState;

mod barrier;
mod grpc;
mod identity;
mod kv;
mod liveness;
mod registration;

pub use grpc::{Coordinator, GrpcService};
pub use kv::normalize_key;

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
}
