//! The checks every request goes through: the job it comes from (maxrs's metadata), a process
//! id inside the job, this service instance, and the incarnation the process registered as.

// `tonic::Status` (the gRPC layer's error) is large; it is what every call returns anyway.
#![allow(clippy::result_large_err)]

use prost::Message;
use tonic::{Code, Request, Status};

use super::{lock, Service, JOB_METADATA, NUM_PROCESSES_METADATA};
use crate::cluster::proto::{self, coordination_status, Incarnations};

impl Service {
    /// Refuses requests from another job (metadata), process ids outside the job, other
    /// service instances and restarted processes.
    pub(super) fn check_identity<T>(
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

    pub(super) fn check_task(&self, task: i32) -> Result<(), Status> {
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

    pub(super) fn stopped_error(what: &str) -> Status {
        coordination_status(Code::Internal, format!("the coordination service has stopped; {what} failed"), None)
    }
}
