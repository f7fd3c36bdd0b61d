//! The gRPC glue: each method of `xla.coordination.CoordinationService` decoded, checked
//! (`identity`) and routed to the service, and [`Coordinator`], the server that runs it
//! on its own threads.

// `tonic::Status` (the gRPC layer's error) is large; it is what every call returns anyway.
#![allow(clippy::result_large_err)]

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::{Context as _, Result};
use prost::Message;
use tokio::sync::oneshot;
use tonic::codec::{CompressionEncoding, ProstCodec};
use tonic::{Request, Response, Status};

use super::{Service, ServiceConfig};
use crate::cluster::proto::{self, Incarnations};

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
