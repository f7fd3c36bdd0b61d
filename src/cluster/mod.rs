//! Multi-process jobs: one maxrs process per host (or per GPU group), together running one SPMD
//! program whose collectives XLA runs over NCCL, as `jax.distributed` does for JAX.
//!
//! - `proto`, `service`, `client`: XLA's coordination service (gRPC
//!   `xla.coordination.CoordinationService`), hosted by process 0 (or `maxrs coordinator`), and
//!   the client every process runs: registration, heartbeats and failure propagation, the
//!   key-value store, barriers, shutdown. JAX 0.11 processes and maxrs processes can share a job.
//! - `settings`: which process of which job this is, from config keys and the environment.
//! - `launch`: `maxrs launch`, N local processes with that environment set.
//! - `preemption`: the step at which every process stops after a preemption notice.
//! - `check`: `maxrs cluster-check`.
//! - `diagnostics`: what a process waits for, and its threads' stacks (SIGUSR1, slow steps).
//!
//! # The environment contract
//! A launcher (Slurm, Vertex AI, GKE, `maxrs launch`, `maxrs submit`) starts the same command on
//! every host with these variables (or the config keys in parentheses):
//!
//! | variable | meaning |
//! |---|---|
//! | `JAX_COORDINATOR_ADDRESS` (`coordinator_address`) | `host:port` of process 0 (or of `maxrs coordinator` with `external_coordinator=true`); `JAX_COORDINATOR_IP` + `JAX_COORDINATOR_PORT` also work; port 8476 by default |
//! | `NNODES` (`num_processes`) | number of processes |
//! | `NODE_RANK` (`process_id`) | this process, `0..NNODES` |
//! | `GPUS_PER_NODE` | optional: devices each process must see (checked at start) |
//!
//! Slurm, Vertex AI and JobSet variables are understood too (see `settings`). Process 0 hosts the
//! coordinator on the address's port on every interface. Every process must start within
//! `jax_distributed_initialization_timeout` seconds; one that dies or hangs stops all of them
//! within `heartbeat_timeout_seconds`, each with an error naming its rank and host.

pub mod check;
pub mod client;
pub mod diagnostics;
pub mod launch;
pub mod preemption;
pub mod proto;
pub mod service;
pub mod settings;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

pub use client::{ClientOptions, CoordinationClient, ErrorHandler};
pub use service::{Coordinator, ServiceConfig};
pub use settings::ClusterSettings;

use crate::config::Config;
use crate::pjrt::gpu_memory;
use crate::pjrt::{self, Value};

/// The processes of a CPU job whose processes are the pipeline's stage groups
/// (`dcn_pipeline_parallelism` = the process count > 1): the one multi-process job the CPU
/// plugin runs, as no program spans processes. Each process's CPU client then has the devices
/// of every process (`cpu_device_count` each) and uses its own group's: the stages' programs
/// run on their own process's devices, arrays cross between processes through the relay
/// (`train::pipeline::relay`), and the initializer runs over all of them in every process (the
/// same values in each), which is what makes the process's part of the state without a program
/// across processes.
pub fn cpu_pipeline_processes(c: &Config, processes: usize) -> Option<usize> {
    (c.plugin == "cpu" && processes > 1 && c.dcn_pipeline_parallelism == processes as i64).then_some(processes)
}

/// The job name every maxrs process and coordinator of a run agree on.
pub fn job_name(c: &Config) -> String {
    if c.run_name.is_empty() {
        "maxrs".to_string()
    } else {
        c.run_name.clone()
    }
}

/// The service configuration a run's keys give.
pub fn service_config(c: &Config, num_processes: usize) -> ServiceConfig {
    ServiceConfig {
        num_processes,
        job_name: job_name(c),
        heartbeat_timeout: Duration::from_secs(c.heartbeat_timeout_seconds.max(1) as u64),
        register_timeout: Duration::from_secs(c.jax_distributed_initialization_timeout.max(1) as u64),
        shutdown_timeout: Duration::from_secs(c.shutdown_timeout_seconds.max(1) as u64),
    }
}

/// This process's place in its job: alone, or connected to the coordinator (and hosting it on
/// process 0).
pub struct Cluster {
    pub settings: ClusterSettings,
    client: Option<Arc<CoordinationClient>>,
    // Dropped after the client: process 0's own client talks to it until the end.
    coordinator: Option<Coordinator>,
    /// Seconds registration took (the registration barrier), for the start-up line.
    pub registration_seconds: f64,
}

impl Cluster {
    /// One process, no coordinator.
    pub fn single() -> Cluster {
        Cluster { settings: ClusterSettings::single(), client: None, coordinator: None, registration_seconds: 0.0 }
    }

    /// Detects the settings (config keys, then the environment), prints them, and for a
    /// multi-process job starts the coordinator (process 0) and registers. A failure of the job
    /// later on calls `on_error` (see [`exit_on_cluster_error`]).
    pub fn join(c: &Config, on_error: ErrorHandler) -> Result<Cluster> {
        let settings = settings::from_environment(c)?;
        println!("{settings}");
        if !settings.is_multi_process() {
            return Ok(Cluster { settings, ..Cluster::single() });
        }
        let coordinator = if settings.process_id == 0 && !c.external_coordinator {
            let bind = settings.bind_address()?;
            let coordinator = Coordinator::start(bind, service_config(c, settings.num_processes))?;
            tracing::info!("coordination service listening on {}", coordinator.address());
            Some(coordinator)
        } else {
            None
        };
        let config = service_config(c, settings.num_processes);
        let on_error = match &coordinator {
            Some(coordinator) => {
                hold_service_until_told(coordinator.service().clone(), config.heartbeat_timeout, on_error)
            }
            None => on_error,
        };
        let client = CoordinationClient::new(
            ClientOptions {
                address: settings.coordinator.clone(),
                process_id: settings.process_id as i32,
                num_processes: settings.num_processes,
                job_name: config.job_name,
                heartbeat_timeout: config.heartbeat_timeout,
                register_timeout: config.register_timeout,
                shutdown_timeout: config.shutdown_timeout,
            },
            on_error,
        )?;
        println!(
            "cluster: waiting up to {} s for all {} processes to register with the coordinator at {} \
             (jax_distributed_initialization_timeout)",
            config.register_timeout.as_secs(),
            settings.num_processes,
            settings.coordinator
        );
        let took = client.connect()?;
        println!(
            "cluster: all {} processes registered ({:.3} s after this one started registering)",
            settings.num_processes,
            took.as_secs_f64()
        );
        Ok(Cluster { settings, client: Some(Arc::new(client)), coordinator, registration_seconds: took.as_secs_f64() })
    }

    pub fn process_index(&self) -> usize {
        self.settings.process_id
    }

    pub fn process_count(&self) -> usize {
        self.settings.num_processes
    }

    /// Process 0 logs and writes metrics files.
    pub fn is_logger(&self) -> bool {
        self.settings.process_id == 0
    }

    pub fn client(&self) -> Option<&Arc<CoordinationClient>> {
        self.client.as_ref()
    }

    /// The PJRT client of `c.plugin` for this process: on GPU with several processes, with
    /// `node_id`/`num_nodes` and the coordinator's key-value store, through which the plugin
    /// builds the global device list (its `devices()`) and exchanges NCCL ids. A CUDA client gets
    /// the allocator JAX's variables set, and its usable memory per GPU is printed.
    pub fn pjrt_client(&self, c: &Config) -> Result<pjrt::Client> {
        // Every key on its own first: a huge cpu_device_count would crash the plugin.
        crate::config::check(c)?;
        // `xla_flags_file=a3mega` picks the set for the job's node count (one process a host).
        pjrt::xla_flags::apply_flags_file(&c.xla_flags_file, self.process_count() as u32)?;
        if c.plugin == "cpu" {
            let n = usize::try_from(c.cpu_device_count).ok().filter(|&n| n > 0).with_context(|| {
                format!("cpu_device_count={}: must be a positive number of devices", c.cpu_device_count)
            })?;
            if let Some(processes) = cpu_pipeline_processes(c, self.process_count()) {
                self.check_local_devices(n, &format!("the CPU plugin with cpu_device_count={n}"))?;
                return pjrt::cpu_client(n * processes);
            }
            if self.settings.is_multi_process() {
                bail!(
                    "this is process {} of {} ({}), but the CPU plugin cannot run one program across processes: it has \
                     no cross-process collectives. Train on GPUs or TPUs (plugin=cuda12, cuda13 or tpu), or on one CPU \
                     process (cpu_device_count=N for several devices); `maxrs cluster-check` checks a CPU cluster's \
                     coordination without collectives",
                    self.settings.process_id, self.settings.num_processes, self.settings.source
                );
            }
            self.check_local_devices(n, &format!("the CPU plugin with cpu_device_count={n}"))?;
            return pjrt::cpu_client(n);
        }
        let (_, plugin) = pjrt::load_plugin(Some(&c.plugin))?;
        let mut options: Vec<(String, Value)> = Vec::new();
        let mut store: Option<Arc<dyn pjrt::KeyValueStore>> = None;
        if let Some(client) = &self.client {
            options.push(("node_id".into(), Value::I64(self.settings.process_id as i64)));
            options.push(("num_nodes".into(), Value::I64(self.settings.num_processes as i64)));
            store = Some(client.clone());
        }
        if let Some(ids) = &self.settings.local_device_ids {
            options.push(("visible_devices".into(), Value::I64List(ids.clone())));
        }
        let client = {
            let _wait =
                diagnostics::waiting_for("the PJRT client (devices of every process, via the key-value store)".into());
            // A CUDA client's allocator follows JAX's variables (`XLA_PYTHON_CLIENT_MEM_FRACTION`, ...).
            gpu_memory::create_client(&plugin, options, store)?
        };
        if let Some(line) = gpu_memory::describe_client(&client)? {
            println!("{line}");
        }
        let local = client.addressable_devices()?.len();
        // A CPU plugin given by path takes cpu_device_count as the named one does.
        let n = c.cpu_device_count as usize;
        if client.platform_name()? == "cpu" && !self.settings.is_multi_process() && local != n {
            drop(client);
            self.check_local_devices(n, &format!("the CPU plugin {} with cpu_device_count={n}", c.plugin))?;
            let count = [("cpu_device_count".to_string(), Value::I64(n as i64))];
            return pjrt::Client::create(&plugin, &count, None)
                .with_context(|| format!("cpu_device_count={n} on the CPU plugin {}", c.plugin));
        }
        self.check_local_devices(local, &format!("plugin={}", c.plugin))?;
        Ok(client)
    }

    /// Checks the devices this process drives (`local`, on `what`) against `GPUS_PER_NODE`, when
    /// the launcher set it: a wrong GPU allocation stops the job at start, not in a collective.
    pub fn check_local_devices(&self, local: usize, what: &str) -> Result<()> {
        match self.settings.expected_local_devices {
            Some(expected) if expected != local => bail!(
                "GPUS_PER_NODE={expected}, but process {} has {local} device{} ({what}): set GPUS_PER_NODE to the \
                 devices each process drives, or check CUDA_VISIBLE_DEVICES and the launcher's GPU allocation",
                self.settings.process_id,
                if local == 1 { "" } else { "s" }
            ),
            _ => Ok(()),
        }
    }

    /// Tells the coordinator this process failed with `error`, so that every other process stops
    /// now with that message instead of at the heartbeat timeout.
    pub fn report_failure(&self, error: &anyhow::Error) {
        if let Some(client) = &self.client {
            if let Err(e) = client.report_error(&format!("{error:#}")) {
                tracing::warn!("could not tell the other processes about the failure: {e:#}");
            }
        }
    }

    /// The shutdown barrier (every process finishing), then the coordinator stops.
    pub fn shutdown(mut self) -> Result<()> {
        let result = match &self.client {
            Some(client) => client.shutdown(),
            None => Ok(()),
        };
        self.client = None;
        self.coordinator = None;
        result
    }
}

/// Wraps the error handler of the process that hosts the coordination service: before it ends
/// the process (and the service with it), the other processes are given up to `within` to
/// receive the job's error, so each stops naming the process that failed rather than reporting
/// a lost coordinator.
fn hold_service_until_told(service: Arc<service::Service>, within: Duration, on_error: ErrorHandler) -> ErrorHandler {
    Arc::new(move |message: &str| {
        let deadline = Instant::now() + within;
        while !service.error_delivered(0) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        // The answers are handed to the network after they are recorded.
        std::thread::sleep(Duration::from_millis(200));
        on_error(message)
    })
}

/// The devices of a one-process run: the plugin's client.
pub fn client_for(c: &Config) -> Result<pjrt::Client> {
    Cluster::single().pjrt_client(c)
}

/// The error handler of a maxrs process: log the failure and what this process was waiting for,
/// then end the process at once (exit status 1). Waiting for anything else could mean waiting
/// forever in a collective whose peer is gone, and running destructors while the plugin's
/// threads are busy can crash or hang, so the process ends with `_exit`.
pub fn exit_on_cluster_error() -> ErrorHandler {
    Arc::new(|message: &str| {
        eprint!("{}", diagnostics::summary());
        eprintln!("error: the job failed: {message}");
        use std::io::Write;
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().flush();
        // SAFETY: `_exit` ends the process without running destructors or atexit handlers;
        // everything worth keeping was flushed above.
        unsafe { libc::_exit(1) }
    })
}
