//! The client every process runs (process 0 too): XLA's coordination service agent
//! (`coordination_service_agent.cc`) in Rust, with a blocking API.
//!
//! [`CoordinationClient::connect`] registers (retrying while the coordinator is not up yet,
//! until `jax_distributed_initialization_timeout`), then two background tasks run until
//! [`CoordinationClient::shutdown`]: heartbeats every `heartbeat_timeout / 2`, and a long-polling
//! `PollForError` that returns only when the job failed. The first failure (an error from the
//! service naming the failed process, or no answered heartbeat for `heartbeat_timeout`) is handed
//! once to the error handler, which in a maxrs process logs what it was waiting for and ends
//! the process: a peer that died must not leave it waiting in a collective.
//!
//! The client is also the key-value store the GPU plugin exchanges its topology and NCCL ids
//! through ([`crate::pjrt::KeyValueStore`]).

// `tonic::Status` (the gRPC layer's error) is large; it is what every call returns anyway.
#![allow(clippy::result_large_err)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use prost::Message;
use tokio::sync::watch;
use tonic::codec::{CompressionEncoding, ProstCodec};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use super::diagnostics;
use super::proto::{self, Incarnations};
use super::service::{JOB_METADATA, NUM_PROCESSES_METADATA};
use crate::net::retry::RetryPolicy;

/// What a client needs to know about its job.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// The coordinator, `host:port`.
    pub address: String,
    pub process_id: i32,
    pub num_processes: usize,
    /// Sent with every request so that a coordinator of another job refuses it.
    pub job_name: String,
    pub heartbeat_timeout: Duration,
    pub register_timeout: Duration,
    pub shutdown_timeout: Duration,
}

/// How long a registration call waits past the deadline for the coordinator's own answer (it
/// checks its deadline at least once a second).
const REGISTRATION_ANSWER_GRACE: Duration = Duration::from_secs(2);

/// Called once with the message of the first failure.
pub type ErrorHandler = Arc<dyn Fn(&str) + Send + Sync>;

pub struct CoordinationClient {
    options: ClientOptions,
    grpc: tonic::client::Grpc<Channel>,
    incarnation: u64,
    service_incarnation: Arc<AtomicU64>,
    /// Background tasks stop when this turns true.
    stop: watch::Sender<bool>,
    failure: Arc<Failure>,
    barrier_counters: Mutex<HashMap<String, i64>>,
    connected: AtomicBool,
    // Dropped last: the channel and tasks live on it.
    runtime: tokio::runtime::Runtime,
}

/// The first failure, recorded once; the handler runs once.
struct Failure {
    message: Mutex<Option<String>>,
    handler: ErrorHandler,
}

impl Failure {
    fn raise(&self, message: String) {
        {
            let mut slot = self.message.lock().unwrap_or_else(|p| p.into_inner());
            if slot.is_some() {
                return;
            }
            *slot = Some(message.clone());
        }
        (self.handler)(&message);
    }
}

fn method(name: &'static str) -> http::uri::PathAndQuery {
    http::uri::PathAndQuery::from_static(name)
}

macro_rules! path {
    ($name:literal) => {
        method(concat!("/xla.coordination.CoordinationService/", $name))
    };
}

/// A protobuf message the client can send or receive from any thread.
trait WireMessage: Message + Send + Sync + 'static {}
impl<T: Message + Send + Sync + 'static> WireMessage for T {}

/// One unary call: metadata naming the job, a deadline both in the request (for the service)
/// and around the call (for a service that does not answer at all).
async fn unary<Req, Resp>(
    mut grpc: tonic::client::Grpc<Channel>,
    options: &ClientOptions,
    path: http::uri::PathAndQuery,
    message: Req,
    timeout: Option<Duration>,
) -> Result<Resp, Status>
where
    Req: WireMessage,
    Resp: WireMessage + Default,
{
    let mut request = tonic::Request::new(message);
    let metadata = request.metadata_mut();
    if let Ok(job) = options.job_name.parse() {
        metadata.insert(JOB_METADATA, job);
    }
    if let Ok(n) = options.num_processes.to_string().parse() {
        metadata.insert(NUM_PROCESSES_METADATA, n);
    }
    if let Some(timeout) = timeout {
        request.set_timeout(timeout);
    }
    let call = async {
        grpc.ready().await.map_err(|e| Status::unavailable(format!("cannot reach the coordinator: {e}")))?;
        grpc.unary(request, path, ProstCodec::<Req, Resp>::default()).await.map(tonic::Response::into_inner)
    };
    match timeout {
        // A little longer than the request's own deadline, so the service's answer wins.
        Some(timeout) => tokio::time::timeout(timeout + Duration::from_millis(500), call).await.unwrap_or_else(|_| {
            Err(Status::deadline_exceeded(format!("no answer within {:.1} s", timeout.as_secs_f64())))
        }),
        None => call.await,
    }
}

impl CoordinationClient {
    /// A client for `options`; nothing is sent before [`CoordinationClient::connect`].
    pub fn new(options: ClientOptions, on_error: ErrorHandler) -> Result<CoordinationClient> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("maxrs-cluster-client")
            .enable_all()
            .build()
            .context("starting the coordination client's threads")?;
        let endpoint = Endpoint::from_shared(format!("http://{}", options.address))
            .with_context(|| format!("coordinator address {:?} is not host:port", options.address))?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(5));
        let channel = {
            let _guard = runtime.enter();
            endpoint.connect_lazy()
        };
        let grpc = tonic::client::Grpc::new(channel).accept_compressed(CompressionEncoding::Gzip);
        Ok(CoordinationClient {
            grpc,
            incarnation: rand::random::<u64>() | 1,
            service_incarnation: Arc::new(AtomicU64::new(0)),
            stop: watch::channel(false).0,
            failure: Arc::new(Failure { message: Mutex::new(None), handler: on_error }),
            barrier_counters: Mutex::new(HashMap::new()),
            connected: AtomicBool::new(false),
            options,
            runtime,
        })
    }

    pub fn options(&self) -> &ClientOptions {
        &self.options
    }

    pub fn process_id(&self) -> i32 {
        self.options.process_id
    }

    /// The first failure seen, if any.
    pub fn failure(&self) -> Option<String> {
        self.failure.message.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn incarnations(&self) -> Option<Incarnations> {
        Some(Incarnations {
            task_id: self.options.process_id,
            task_incarnation: self.incarnation,
            service_incarnation: self.service_incarnation.load(Ordering::Relaxed),
        })
    }

    fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }

    /// Registers with the coordinator and waits for every process (the registration barrier);
    /// returns how long that took. Retries while the coordinator is unreachable, until
    /// `register_timeout` (`jax_distributed_initialization_timeout`) has passed.
    pub fn connect(&self) -> Result<Duration> {
        let start = Instant::now();
        let o = &self.options;
        let _activity = diagnostics::waiting_for(format!("registration with the coordinator at {}", o.address));
        // Waits of 0.1 s doubling up to 0.8 s, jittered (every process of a job starts at once).
        let policy = RetryPolicy {
            attempts: u32::MAX,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(800),
            jitter: true,
            deadline: Some(o.register_timeout),
        };
        let mut tries = policy.tries();
        let response: proto::RegisterTaskResponse = loop {
            // A coordinator that is reached answers at its own registration deadline, naming the
            // processes that never came: the call waits a little past this process's deadline
            // for that answer.
            let remaining = tries.remaining().unwrap_or_default() + REGISTRATION_ANSWER_GRACE;
            let request = proto::RegisterTaskRequest { incarnation: self.incarnation, source_task_id: o.process_id };
            let result = self.block_on(unary(self.grpc.clone(), o, path!("RegisterTask"), request, Some(remaining)));
            match result {
                Ok(response) => break response,
                // The service refused: final. (JAX also retries ABORTED, for a restarted process
                // waiting for a restarted coordinator; a maxrs job restarts as a whole.)
                Err(status) if proto::is_coordination_error(&status) => {
                    bail!("process {} could not join the job: {}", o.process_id, status.message())
                }
                Err(status) if tries.last() => bail!(
                    "process {}: registration with the coordinator at {} did not complete within {:.0} s \
                     (jax_distributed_initialization_timeout): {}",
                    o.process_id,
                    o.address,
                    o.register_timeout.as_secs_f64(),
                    status.message()
                ),
                Err(status) => {
                    tracing::debug!("registration attempt {}: {}", tries.attempt(), status.message());
                    std::thread::sleep(tries.next(None));
                }
            }
        };
        self.service_incarnation.store(response.service_incarnation, Ordering::Relaxed);
        self.connected.store(true, Ordering::Relaxed);
        self.start_heartbeats();
        self.start_error_polling();
        Ok(start.elapsed())
    }

    fn start_heartbeats(&self) {
        let grpc = self.grpc.clone();
        let options = self.options.clone();
        let failure = self.failure.clone();
        let service_incarnation = self.service_incarnation.clone();
        let mut stop = self.stop.subscribe();
        let request = proto::HeartbeatRequest {
            incarnations: self.incarnations(),
            incarnation: self.incarnation,
            source_task_id: options.process_id,
        };
        self.runtime.spawn(async move {
            let interval = options.heartbeat_timeout / 2;
            let mut last_ok = Instant::now();
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(interval) => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
                let result: Result<proto::HeartbeatResponse, Status> =
                    unary(grpc.clone(), &options, path!("Heartbeat"), request.clone(), Some(interval)).await;
                if *stop.borrow() {
                    return;
                }
                match result {
                    Ok(response) if response.service_incarnation != service_incarnation.load(Ordering::Relaxed) => {
                        failure.raise(format!(
                            "the coordinator at {} restarted (new instance {:#x}); this job cannot continue",
                            options.address, response.service_incarnation
                        ));
                        return;
                    }
                    Ok(_) => last_ok = Instant::now(),
                    Err(status) if proto::is_coordination_error(&status) => {
                        failure.raise(status.message().to_string());
                        return;
                    }
                    Err(status) if last_ok.elapsed() >= options.heartbeat_timeout => {
                        failure.raise(format!(
                            "the coordinator at {} (process 0) answered no heartbeat for {:.1} s \
                             (heartbeat_timeout_seconds={}): it died, hangs or the network failed ({})",
                            options.address,
                            last_ok.elapsed().as_secs_f64(),
                            options.heartbeat_timeout.as_secs_f64(),
                            status.message()
                        ));
                        return;
                    }
                    Err(status) => tracing::debug!("heartbeat failed, will retry: {}", status.message()),
                }
            }
        });
    }

    fn start_error_polling(&self) {
        let grpc = self.grpc.clone();
        let options = self.options.clone();
        let failure = self.failure.clone();
        let mut stop = self.stop.subscribe();
        let request =
            proto::PollForErrorRequest { incarnations: self.incarnations(), source_task_id: options.process_id };
        self.runtime.spawn(async move {
            loop {
                let call = unary::<_, proto::PollForErrorResponse>(
                    grpc.clone(),
                    &options,
                    path!("PollForError"),
                    request.clone(),
                    None,
                );
                let result = tokio::select! {
                    result = call => result,
                    _ = stop.wait_for(|s| *s) => return,
                };
                if *stop.borrow() {
                    return;
                }
                match result {
                    Ok(_) => {
                        failure.raise("the coordinator answered an error poll without an error".into());
                        return;
                    }
                    Err(status) if status.code() == Code::Cancelled => return,
                    Err(status) if proto::is_coordination_error(&status) => {
                        failure.raise(status.message().to_string());
                        return;
                    }
                    // The connection broke: the heartbeats decide whether the coordinator is gone.
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        });
    }

    fn call<Req, Resp>(
        &self,
        path: http::uri::PathAndQuery,
        request: Req,
        timeout: Option<Duration>,
    ) -> Result<Resp, Status>
    where
        Req: WireMessage,
        Resp: WireMessage + Default,
    {
        self.block_on(unary(self.grpc.clone(), &self.options, path, request, timeout))
    }

    /// Default deadline of the calls that do not wait for anything.
    fn rpc_timeout(&self) -> Option<Duration> {
        Some(Duration::from_secs(60))
    }

    /// Sets `key`; with `allow_overwrite` false an existing key is an error.
    pub fn key_value_set(&self, key: &str, value: &[u8], allow_overwrite: bool) -> Result<()> {
        let request = proto::InsertKeyValueRequest {
            incarnations: self.incarnations(),
            kv: Some(proto::KeyValueEntry { key: key.to_string(), value: value.to_vec() }),
            allow_overwrite,
        };
        self.call::<_, proto::InsertKeyValueResponse>(path!("InsertKeyValue"), request, self.rpc_timeout())
            .map(|_| ())
            .map_err(|s| anyhow!("key-value set of {key}: {}", s.message()))
    }

    /// Waits up to `timeout` for `key` to be set.
    pub fn blocking_key_value_get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let _activity = diagnostics::waiting_for(format!("key-value get {key}"));
        let request = proto::GetKeyValueRequest { incarnations: self.incarnations(), key: key.to_string() };
        match self.call::<_, proto::GetKeyValueResponse>(path!("GetKeyValue"), request, Some(timeout)) {
            Ok(response) => Ok(response.kv.map(|kv| kv.value).unwrap_or_default()),
            Err(s) if s.code() == Code::DeadlineExceeded => {
                bail!("key-value get of {key}: not set within {:.1} s", timeout.as_secs_f64())
            }
            Err(s) => bail!("key-value get of {key}: {}", s.message()),
        }
    }

    /// The value of `key`, `None` if it is not set.
    pub fn key_value_try_get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let request = proto::TryGetKeyValueRequest { incarnations: self.incarnations(), key: key.to_string() };
        match self.call::<_, proto::TryGetKeyValueResponse>(path!("TryGetKeyValue"), request, self.rpc_timeout()) {
            Ok(response) => Ok(Some(response.kv.map(|kv| kv.value).unwrap_or_default())),
            Err(s) if s.code() == Code::NotFound => Ok(None),
            Err(s) => bail!("key-value try-get of {key}: {}", s.message()),
        }
    }

    /// Every entry under the directory `key/`.
    pub fn key_value_dir_get(&self, directory: &str) -> Result<Vec<(String, Vec<u8>)>> {
        let request =
            proto::GetKeyValueDirRequest { incarnations: self.incarnations(), directory_key: directory.to_string() };
        self.call::<_, proto::GetKeyValueDirResponse>(path!("GetKeyValueDir"), request, self.rpc_timeout())
            .map(|r| r.kv.into_iter().map(|kv| (kv.key, kv.value)).collect())
            .map_err(|s| anyhow!("key-value directory get of {directory}: {}", s.message()))
    }

    /// Deletes `key` and everything under `key/`.
    pub fn key_value_delete(&self, key: &str) -> Result<()> {
        let request = proto::DeleteKeyValueRequest {
            incarnations: self.incarnations(),
            key: key.to_string(),
            is_directory: true,
        };
        self.call::<_, proto::DeleteKeyValueResponse>(path!("DeleteKeyValue"), request, self.rpc_timeout())
            .map(|_| ())
            .map_err(|s| anyhow!("key-value delete of {key}: {}", s.message()))
    }

    /// Adds `increment` to the integer at `key` (0 when unset); returns the new value.
    pub fn key_value_increment(&self, key: &str, increment: i64) -> Result<i64> {
        let request =
            proto::IncrementKeyValueRequest { incarnations: self.incarnations(), key: key.to_string(), increment };
        let response = self
            .call::<_, proto::IncrementKeyValueResponse>(path!("IncrementKeyValue"), request, self.rpc_timeout())
            .map_err(|s| anyhow!("key-value increment of {key}: {}", s.message()))?;
        let value = response.kv.map(|kv| kv.value).unwrap_or_default();
        std::str::from_utf8(&value)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| anyhow!("key-value increment of {key}: the coordinator answered {value:?}"))
    }

    /// Waits until every process in `processes` (empty: all) reached barrier `id`, at most
    /// `timeout`. Each call with the same id is the next instance of that barrier.
    pub fn wait_at_barrier(&self, id: &str, timeout: Duration, processes: &[i32]) -> Result<()> {
        let _activity = diagnostics::waiting_for(format!("barrier {id}"));
        let counter = {
            let mut counters = self.barrier_counters.lock().unwrap_or_else(|p| p.into_inner());
            let counter = counters.entry(id.to_string()).or_insert(-1);
            *counter += 1;
            *counter
        };
        let request = proto::BarrierRequest {
            incarnations: self.incarnations(),
            barrier_id: id.to_string(),
            barrier_timeout_in_ms: timeout.as_millis().min(i64::MAX as u128) as i64,
            task_ids: processes.to_vec(),
            source_task_id: self.options.process_id,
            counter,
        };
        // The service decides the timeout; give its answer time to arrive.
        let deadline = timeout.max(Duration::from_secs(1)) + Duration::from_secs(5);
        self.call::<_, proto::BarrierResponse>(path!("Barrier"), request, Some(deadline))
            .map(|_| ())
            .map_err(|s| anyhow!("barrier {id}: {}", s.message()))
    }

    /// Tells the service this process failed: every process of the job stops.
    pub fn report_error(&self, message: &str) -> Result<()> {
        let request = proto::ReportErrorToServiceRequest {
            incarnations: self.incarnations(),
            source_task_id: self.options.process_id,
            error_code: Code::Internal as i32,
            error_message: message.to_string(),
        };
        self.call::<_, proto::ReportErrorToServiceResponse>(path!("ReportErrorToService"), request, self.rpc_timeout())
            .map(|_| ())
            .map_err(|s| anyhow!("reporting an error to the coordinator: {}", s.message()))
    }

    /// The shutdown barrier: waits (up to `shutdown_timeout_seconds`) for every process to
    /// shut down, then stops heartbeats and error polling.
    pub fn shutdown(&self) -> Result<()> {
        if !self.connected.swap(false, Ordering::Relaxed) {
            return Ok(());
        }
        let _activity = diagnostics::waiting_for("the shutdown barrier (every process finishing)".to_string());
        let request =
            proto::ShutdownTaskRequest { incarnations: self.incarnations(), source_task_id: self.options.process_id };
        let timeout = self.options.shutdown_timeout + Duration::from_secs(5);
        let result = self.call::<_, proto::ShutdownTaskResponse>(path!("ShutdownTask"), request, Some(timeout));
        self.stop.send_replace(true);
        result.map(|_| ()).map_err(|s| anyhow!("shutting down: {}", s.message()))
    }
}

impl Drop for CoordinationClient {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

/// The GPU plugin's view of the store: its keys (`local_topology/cuda/0`, NCCL ids) under `pjrt/`,
/// apart from everything else in the job's store.
impl crate::pjrt::KeyValueStore for CoordinationClient {
    fn get(&self, key: &str, timeout: Duration) -> std::result::Result<Vec<u8>, String> {
        self.blocking_key_value_get(&format!("pjrt/{key}"), timeout).map_err(|e| e.to_string())
    }

    fn try_get(&self, key: &str) -> std::result::Result<Option<Vec<u8>>, String> {
        self.key_value_try_get(&format!("pjrt/{key}")).map_err(|e| e.to_string())
    }

    fn put(&self, key: &str, value: &[u8]) -> std::result::Result<(), String> {
        self.key_value_set(&format!("pjrt/{key}"), value, true).map_err(|e| e.to_string())
    }
}
