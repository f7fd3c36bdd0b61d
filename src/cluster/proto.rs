//! XLA's coordination service protocol (`xla.coordination.CoordinationService`), written by hand
//! as prost messages so that building maxrs needs no `protoc`.
//!
//! The package name, message names and field numbers are those of the service jaxlib 0.11.2
//! speaks (the XLA build that the CPU plugin `lammps-jax-pjrt-cpu==0.11.2` and JAX 0.11.2 come
//! from). They were read from the `FileDescriptorProto` of
//! `xla/pjrt/distributed/coordination/coordination_service.proto` embedded in jaxlib 0.11.2's
//! `libjax_common.so` (`tools/coordination_proto_from_jaxlib.py` prints it), which is what a
//! JAX process actually sends; openxla/xla's source moved the service from
//! `xla/tsl/protobuf` (package `tensorflow`) to this file and renumbered most requests when it
//! added `Incarnations`, so older copies of the `.proto` do not match.
//!
//! Errors carry XLA's status payloads: gRPC's `grpc-status-details-bin` holds a
//! `tensorflow.distributed_runtime.GrpcPayloadContainer` (the map XLA's `ToGrpcStatus` writes),
//! and a coordination error has a `tensorflow.CoordinationServiceError` entry. JAX's agent uses
//! that entry to tell "the service refused this" (final) from "the network failed" (retry).

use std::collections::HashMap;

use prost::Message;

/// The gRPC service path prefix: `/xla.coordination.CoordinationService/<Method>`.
pub const SERVICE_NAME: &str = "xla.coordination.CoordinationService";

/// Payload key of a [`CoordinationServiceError`] in a status (XLA's `CoordinationErrorPayloadKey`).
pub const COORDINATION_ERROR_KEY: &str = "type.googleapis.com/tensorflow.CoordinationServiceError";
/// Payload key of a [`ServiceMismatchError`]: the request was for another service instance.
pub const SERVICE_MISMATCH_KEY: &str = "type.googleapis.com/tensorflow.ServiceMismatchError";
/// Payload key of a [`BarrierError`].
pub const BARRIER_ERROR_KEY: &str = "type.googleapis.com/tensorflow.BarrierError";

/// `xla.coordination.TaskState`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub enum TaskState {
    Unspecified = 0,
    Uninitialized = 1,
    Disconnected = 2,
    Connected = 3,
    Error = 4,
}

#[derive(Clone, PartialEq, Message)]
pub struct CoordinationServiceError {
    #[prost(bool, tag = "3")]
    pub is_reported_error: bool,
    #[prost(int32, tag = "4")]
    pub source_task_id: i32,
}

#[derive(Clone, PartialEq, Message)]
pub struct BarrierError {
    #[prost(string, tag = "1")]
    pub barrier_id: String,
    #[prost(int64, tag = "2")]
    pub counter: i64,
}

/// Who sends a request: the task, its incarnation (a random id per process start) and the
/// incarnation of the service it registered with.
#[derive(Clone, PartialEq, Message)]
pub struct Incarnations {
    #[prost(int32, tag = "1")]
    pub task_id: i32,
    #[prost(fixed64, tag = "2")]
    pub task_incarnation: u64,
    #[prost(fixed64, tag = "3")]
    pub service_incarnation: u64,
}

#[derive(Clone, PartialEq, Message)]
pub struct ServiceMismatchError {
    #[prost(fixed64, tag = "1")]
    pub service_incarnation: u64,
}

#[derive(Clone, PartialEq, Message)]
pub struct TaskInfo {
    #[prost(int32, tag = "1")]
    pub task_id: i32,
    #[prost(fixed64, tag = "6")]
    pub incarnation: u64,
    #[prost(enumeration = "TaskState", tag = "2")]
    pub state: i32,
    #[prost(int32, tag = "3")]
    pub error_code: i32,
    #[prost(string, tag = "4")]
    pub error_message: String,
    #[prost(message, optional, tag = "5")]
    pub error_payload: Option<CoordinationServiceError>,
}

#[derive(Clone, PartialEq, Message)]
pub struct RegisterTaskRequest {
    #[prost(fixed64, tag = "3")]
    pub incarnation: u64,
    #[prost(int32, tag = "5")]
    pub source_task_id: i32,
}

#[derive(Clone, PartialEq, Message)]
pub struct RegisterTaskResponse {
    #[prost(fixed64, tag = "1")]
    pub service_incarnation: u64,
}

#[derive(Clone, PartialEq, Message)]
pub struct HeartbeatRequest {
    #[prost(message, optional, tag = "1")]
    pub incarnations: Option<Incarnations>,
    #[prost(fixed64, tag = "2")]
    pub incarnation: u64,
    #[prost(int32, tag = "3")]
    pub source_task_id: i32,
}

#[derive(Clone, PartialEq, Message)]
pub struct HeartbeatResponse {
    #[prost(fixed64, tag = "1")]
    pub service_incarnation: u64,
}

#[derive(Clone, PartialEq, Message)]
pub struct PollForErrorRequest {
    #[prost(message, optional, tag = "1")]
    pub incarnations: Option<Incarnations>,
    #[prost(int32, tag = "2")]
    pub source_task_id: i32,
}

#[derive(Clone, PartialEq, Message)]
pub struct PollForErrorResponse {}

#[derive(Clone, PartialEq, Message)]
pub struct ReportErrorToServiceRequest {
    #[prost(message, optional, tag = "1")]
    pub incarnations: Option<Incarnations>,
    #[prost(int32, tag = "2")]
    pub source_task_id: i32,
    #[prost(int32, tag = "3")]
    pub error_code: i32,
    #[prost(string, tag = "4")]
    pub error_message: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct ReportErrorToServiceResponse {}

#[derive(Clone, PartialEq, Message)]
pub struct ShutdownTaskRequest {
    #[prost(message, optional, tag = "1")]
    pub incarnations: Option<Incarnations>,
    #[prost(int32, tag = "2")]
    pub source_task_id: i32,
}

#[derive(Clone, PartialEq, Message)]
pub struct ShutdownTaskResponse {}

#[derive(Clone, PartialEq, Message)]
pub struct WatchTasksRequest {
    #[prost(message, optional, tag = "1")]
    pub incarnations: Option<Incarnations>,
    #[prost(int64, tag = "2")]
    pub version_number: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct WatchTasksResponse {
    #[prost(message, repeated, tag = "1")]
    pub task_state: Vec<TaskInfo>,
    #[prost(int64, tag = "2")]
    pub version_number: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct KeyValueEntry {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

#[derive(Clone, PartialEq, Message)]
pub struct InsertKeyValueRequest {
    #[prost(message, optional, tag = "1")]
    pub incarnations: Option<Incarnations>,
    #[prost(message, optional, tag = "2")]
    pub kv: Option<KeyValueEntry>,
    #[prost(bool, tag = "3")]
    pub allow_overwrite: bool,
}

#[derive(Clone, PartialEq, Message)]
pub struct InsertKeyValueResponse {}

#[derive(Clone, PartialEq, Message)]
pub struct GetKeyValueRequest {
    #[prost(message, optional, tag = "1")]
    pub incarnations: Option<Incarnations>,
    #[prost(string, tag = "2")]
    pub key: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct GetKeyValueResponse {
    #[prost(message, optional, tag = "1")]
    pub kv: Option<KeyValueEntry>,
}

#[derive(Clone, PartialEq, Message)]
pub struct TryGetKeyValueRequest {
    #[prost(message, optional, tag = "1")]
    pub incarnations: Option<Incarnations>,
    #[prost(string, tag = "2")]
    pub key: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct TryGetKeyValueResponse {
    #[prost(message, optional, tag = "1")]
    pub kv: Option<KeyValueEntry>,
}

#[derive(Clone, PartialEq, Message)]
pub struct IncrementKeyValueRequest {
    #[prost(message, optional, tag = "1")]
    pub incarnations: Option<Incarnations>,
    #[prost(string, tag = "2")]
    pub key: String,
    #[prost(int64, tag = "3")]
    pub increment: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct IncrementKeyValueResponse {
    #[prost(message, optional, tag = "1")]
    pub kv: Option<KeyValueEntry>,
}

#[derive(Clone, PartialEq, Message)]
pub struct GetKeyValueDirRequest {
    #[prost(message, optional, tag = "1")]
    pub incarnations: Option<Incarnations>,
    #[prost(string, tag = "2")]
    pub directory_key: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct GetKeyValueDirResponse {
    #[prost(string, tag = "1")]
    pub directory_key: String,
    #[prost(message, repeated, tag = "2")]
    pub kv: Vec<KeyValueEntry>,
}

#[derive(Clone, PartialEq, Message)]
pub struct DeleteKeyValueRequest {
    #[prost(message, optional, tag = "1")]
    pub incarnations: Option<Incarnations>,
    #[prost(string, tag = "2")]
    pub key: String,
    #[prost(bool, tag = "3")]
    pub is_directory: bool,
}

#[derive(Clone, PartialEq, Message)]
pub struct DeleteKeyValueResponse {}

#[derive(Clone, PartialEq, Message)]
pub struct BarrierRequest {
    #[prost(message, optional, tag = "1")]
    pub incarnations: Option<Incarnations>,
    #[prost(string, tag = "2")]
    pub barrier_id: String,
    #[prost(int64, tag = "3")]
    pub barrier_timeout_in_ms: i64,
    #[prost(int32, repeated, tag = "4")]
    pub task_ids: Vec<i32>,
    #[prost(int32, tag = "5")]
    pub source_task_id: i32,
    #[prost(int64, tag = "6")]
    pub counter: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct BarrierResponse {
    #[prost(int64, tag = "1")]
    pub counter: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct CancelBarrierRequest {
    #[prost(message, optional, tag = "1")]
    pub incarnations: Option<Incarnations>,
    #[prost(string, tag = "2")]
    pub barrier_id: String,
    #[prost(int64, tag = "3")]
    pub counter: i64,
    #[prost(int32, tag = "4")]
    pub source_task_id: i32,
}

#[derive(Clone, PartialEq, Message)]
pub struct CancelBarrierResponse {}

#[derive(Clone, PartialEq, Message)]
pub struct GetAliveTasksRequest {
    #[prost(message, optional, tag = "1")]
    pub incarnations: Option<Incarnations>,
    #[prost(int32, tag = "2")]
    pub requesting_task_id: i32,
    #[prost(int32, repeated, tag = "3")]
    pub task_ids: Vec<i32>,
}

#[derive(Clone, PartialEq, Message)]
pub struct GetAliveTasksResponse {
    #[prost(int32, repeated, tag = "1")]
    pub alive_task_ids: Vec<i32>,
    #[prost(fixed64, repeated, tag = "2")]
    pub incarnations: Vec<u64>,
}

/// `tensorflow.distributed_runtime.GrpcPayloadContainer`: how XLA carries an `absl::Status`'s
/// payloads in gRPC's status details.
#[derive(Clone, PartialEq, Message)]
pub struct GrpcPayloadContainer {
    #[prost(map = "string, bytes", tag = "1")]
    pub payloads: HashMap<String, Vec<u8>>,
}

/// A gRPC status carrying the coordination-error payload (and optionally more), as XLA's
/// `MakeCoordinationError` builds it: JAX treats such errors as final instead of retrying.
pub fn coordination_status(code: tonic::Code, message: impl Into<String>, source_task: Option<i32>) -> tonic::Status {
    with_payloads(code, message, &[(COORDINATION_ERROR_KEY, coordination_payload(source_task))])
}

pub fn coordination_payload(source_task: Option<i32>) -> Vec<u8> {
    CoordinationServiceError { is_reported_error: false, source_task_id: source_task.unwrap_or(0) }.encode_to_vec()
}

/// A status whose details hold `payloads` (key, serialized message).
pub fn with_payloads(code: tonic::Code, message: impl Into<String>, payloads: &[(&str, Vec<u8>)]) -> tonic::Status {
    let container =
        GrpcPayloadContainer { payloads: payloads.iter().map(|(k, v)| (k.to_string(), v.clone())).collect() };
    tonic::Status::with_details(code, message, container.encode_to_vec().into())
}

/// The payload keys a status carries (empty when it has none or they do not parse).
pub fn payload_keys(status: &tonic::Status) -> Vec<String> {
    GrpcPayloadContainer::decode(status.details()).map(|c| c.payloads.into_keys().collect()).unwrap_or_default()
}

/// Whether the service itself refused the request (a coordination error), as opposed to the
/// transport failing: only the latter is worth retrying.
pub fn is_coordination_error(status: &tonic::Status) -> bool {
    payload_keys(status).iter().any(|k| k == COORDINATION_ERROR_KEY)
}
