//! Which process of which job this is: the configuration keys first (`coordinator_address`,
//! `num_processes`, `process_id`), each filling what it names, then the cluster environments,
//! each value from the first of them that has it, in this order:
//!
//! | environment | coordinator | processes | this process | local devices |
//! |---|---|---|---|---|
//! | JAX / A3 recipe | `JAX_COORDINATOR_ADDRESS` (`host` or `host:port`) or `JAX_COORDINATOR_IP`, port `JAX_COORDINATOR_PORT` | `NNODES` | `NODE_RANK` | `GPUS_PER_NODE` (checked) |
//! | Vertex AI | `CLUSTER_SPEC` (first host of the first worker pool), else `MASTER_ADDR`:`MASTER_PORT` (2222) | hosts in `CLUSTER_SPEC`, else `WORLD_SIZE` | position in `CLUSTER_SPEC`, else `RANK` | |
//! | Slurm | first node of `SLURM_STEP_NODELIST`, port derived from `SLURM_JOB_ID` as JAX does | `SLURM_NTASKS` | `SLURM_PROCID` | `SLURM_STEP_GPUS` (when `CUDA_VISIBLE_DEVICES` is unset) |
//! | GKE JobSet (indexed Job) | `<JOBSET_NAME>-<REPLICATED_JOB_NAME>-0-0.<JOBSET_NAME>` (the headless service), port `JAX_COORDINATOR_PORT` | `NNODES` | `JOB_COMPLETION_INDEX` | |
//!
//! The default port is 8476 (JAX's). `skip_jax_distributed_system=true` makes every process a
//! job of its own, as in MaxText. Nothing found means one process.

use std::fmt;

use anyhow::{anyhow, bail, Context, Result};

use crate::config::{Config, Hardware};

/// The coordinator port when none is given (JAX's default for its cluster environments).
pub const DEFAULT_PORT: u16 = 8476;

/// What this process knows about its job.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterSettings {
    pub num_processes: usize,
    pub process_id: usize,
    /// `host:port` of the coordinator (empty for one process).
    pub coordinator: String,
    /// GPUs this process drives (the plugin's `visible_devices`); `None`: all it sees.
    pub local_device_ids: Option<Vec<i64>>,
    /// Devices per process the environment promises (`GPUS_PER_NODE`), checked at start.
    pub expected_local_devices: Option<usize>,
    /// Where each value came from, for the start-up line.
    pub source: String,
}

impl ClusterSettings {
    pub fn single() -> ClusterSettings {
        ClusterSettings {
            num_processes: 1,
            process_id: 0,
            coordinator: String::new(),
            local_device_ids: None,
            expected_local_devices: None,
            source: "one process".into(),
        }
    }

    pub fn is_multi_process(&self) -> bool {
        self.num_processes > 1
    }

    /// The address process 0's coordinator listens on: every interface, the coordinator's port.
    pub fn bind_address(&self) -> Result<std::net::SocketAddr> {
        let port = self
            .coordinator
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse::<u16>().ok())
            .ok_or_else(|| anyhow!("coordinator address {:?} has no port", self.coordinator))?;
        Ok(std::net::SocketAddr::from(([0, 0, 0, 0], port)))
    }
}

impl fmt::Display for ClusterSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.is_multi_process() {
            return write!(f, "cluster: one process ({})", self.source);
        }
        write!(
            f,
            "cluster: process {} of {}, coordinator {} ({})",
            self.process_id, self.num_processes, self.coordinator, self.source
        )?;
        if let Some(ids) = &self.local_device_ids {
            write!(f, ", local devices {ids:?}")?;
        }
        if let Some(n) = self.expected_local_devices {
            write!(f, ", {n} devices per process expected")?;
        }
        Ok(())
    }
}

/// What one environment family says; any field may be missing.
#[derive(Default)]
struct Found {
    name: &'static str,
    coordinator: Option<(String, &'static str)>,
    num_processes: Option<(usize, &'static str)>,
    process_id: Option<(usize, &'static str)>,
    local_device_ids: Option<Vec<i64>>,
    expected_local_devices: Option<usize>,
}

fn parse<T: std::str::FromStr>(env: &dyn Fn(&str) -> Option<String>, name: &str, what: &str) -> Result<Option<T>> {
    match env(name) {
        None => Ok(None),
        Some(text) => text.trim().parse().map(Some).map_err(|_| anyhow!("{name}={text:?}: expected {what}")),
    }
}

/// `host` with its port, or with `port` (default 8476) when it has none; a bare IPv6 address is
/// bracketed.
fn with_port(host: &str, port: Option<u16>) -> String {
    let port = port.unwrap_or(DEFAULT_PORT);
    if host.matches(':').count() > 1 && !host.starts_with('[') {
        return format!("[{host}]:{port}");
    }
    match host.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok() => host.to_string(),
        _ => format!("{host}:{port}"),
    }
}

fn jax_env(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<Found>> {
    let present =
        ["JAX_COORDINATOR_ADDRESS", "JAX_COORDINATOR_IP", "NNODES", "NODE_RANK"].iter().any(|v| env(v).is_some());
    if !present {
        return Ok(None);
    }
    let port: Option<u16> = parse(env, "JAX_COORDINATOR_PORT", "a port number")?;
    let coordinator = match (env("JAX_COORDINATOR_ADDRESS"), env("JAX_COORDINATOR_IP")) {
        (Some(address), _) => Some((with_port(address.trim(), port), "JAX_COORDINATOR_ADDRESS")),
        (None, Some(ip)) => Some((with_port(ip.trim(), port), "JAX_COORDINATOR_IP")),
        (None, None) => None,
    };
    Ok(Some(Found {
        name: "JAX_COORDINATOR_ADDRESS/NNODES/NODE_RANK",
        coordinator,
        num_processes: parse(env, "NNODES", "a number of processes")?.map(|n| (n, "NNODES")),
        process_id: parse(env, "NODE_RANK", "a process index")?.map(|n| (n, "NODE_RANK")),
        local_device_ids: None,
        expected_local_devices: parse(env, "GPUS_PER_NODE", "a number of GPUs")?,
    }))
}

/// Vertex AI's `CLUSTER_SPEC`: `{"cluster": {"workerpool0": ["host:port"], ...}, "task":
/// {"type": "workerpool1", "index": 0}}`; processes are numbered pool by pool.
fn vertex_env(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<Found>> {
    if let Some(spec) = env("CLUSTER_SPEC") {
        let value: serde_json::Value = serde_json::from_str(&spec).context("CLUSTER_SPEC is not JSON")?;
        let cluster = value["cluster"].as_object().ok_or_else(|| anyhow!("CLUSTER_SPEC has no \"cluster\" object"))?;
        let mut pools: Vec<(&String, Vec<String>)> = cluster
            .iter()
            .map(|(name, hosts)| {
                let hosts = hosts.as_array().map(|a| a.iter().filter_map(|h| h.as_str().map(String::from)).collect());
                (name, hosts.unwrap_or_default())
            })
            .collect();
        pools.sort_by(|a, b| a.0.cmp(b.0));
        let task_pool = value["task"]["type"].as_str().ok_or_else(|| anyhow!("CLUSTER_SPEC has no task.type"))?;
        let index = value["task"]["index"].as_u64().ok_or_else(|| anyhow!("CLUSTER_SPEC has no task.index"))? as usize;
        let mut rank = None;
        let mut offset = 0;
        for (name, hosts) in &pools {
            if name.as_str() == task_pool {
                rank = Some(offset + index);
            }
            offset += hosts.len();
        }
        let rank =
            rank.ok_or_else(|| anyhow!("CLUSTER_SPEC: task.type {task_pool:?} is not one of its worker pools"))?;
        let first =
            pools.iter().find_map(|(_, h)| h.first().cloned()).ok_or_else(|| anyhow!("CLUSTER_SPEC lists no hosts"))?;
        return Ok(Some(Found {
            name: "Vertex AI",
            coordinator: Some((with_port(&first, Some(2222)), "CLUSTER_SPEC")),
            num_processes: Some((offset, "CLUSTER_SPEC")),
            process_id: Some((rank, "CLUSTER_SPEC")),
            ..Found::default()
        }));
    }
    let Some(master) = env("MASTER_ADDR") else { return Ok(None) };
    let port: Option<u16> = parse(env, "MASTER_PORT", "a port number")?;
    Ok(Some(Found {
        name: "Vertex AI",
        coordinator: Some((with_port(master.trim(), Some(port.unwrap_or(2222))), "MASTER_ADDR")),
        num_processes: parse(env, "WORLD_SIZE", "a number of processes")?.map(|n| (n, "WORLD_SIZE")),
        process_id: parse(env, "RANK", "a process index")?.map(|n| (n, "RANK")),
        ..Found::default()
    }))
}

/// The first host of a Slurm node list: `node001`, `node[001-004,007],other` -> `node001`.
pub fn first_slurm_node(list: &str) -> Option<String> {
    let list = list.trim();
    let end = list.find([',', '[']).unwrap_or(list.len());
    let prefix = &list[..end];
    if list[end..].starts_with('[') {
        let inner = &list[end + 1..];
        let first = inner.split([',', '-', ']']).next()?;
        Some(format!("{prefix}{first}"))
    } else if prefix.is_empty() {
        None
    } else {
        Some(prefix.to_string())
    }
}

fn slurm_env(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<Found>> {
    let (Some(job), Some(nodes)) = (env("SLURM_JOB_ID"), env("SLURM_STEP_NODELIST")) else { return Ok(None) };
    let job: u64 = job.trim().parse().map_err(|_| anyhow!("SLURM_JOB_ID={job:?}: expected a number"))?;
    let host = first_slurm_node(&nodes).ok_or_else(|| anyhow!("SLURM_STEP_NODELIST={nodes:?} names no node"))?;
    // JAX's choice (jax/_src/clusters/slurm_cluster.py): a port in the top 4096, from the job id.
    let port: Option<u16> = parse(env, "JAX_COORDINATOR_PORT", "a port number")?;
    let port = port.unwrap_or((job % 4096 + (65535 - 4096 + 1)) as u16);
    let gpus = match (env("CUDA_VISIBLE_DEVICES"), env("SLURM_STEP_GPUS")) {
        (None, Some(list)) => Some(
            list.split(',')
                .filter(|s| !s.trim().is_empty())
                .map(|s| s.trim().parse::<i64>().map_err(|_| anyhow!("SLURM_STEP_GPUS={list:?}: expected GPU indices")))
                .collect::<Result<Vec<_>>>()?,
        ),
        _ => None,
    };
    Ok(Some(Found {
        name: "Slurm",
        coordinator: Some((format!("{host}:{port}"), "SLURM_STEP_NODELIST")),
        num_processes: parse(env, "SLURM_NTASKS", "a number of tasks")?.map(|n| (n, "SLURM_NTASKS")),
        process_id: parse(env, "SLURM_PROCID", "a task index")?.map(|n| (n, "SLURM_PROCID")),
        local_device_ids: gpus,
        ..Found::default()
    }))
}

fn jobset_env(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<Found>> {
    let (Some(jobset), Some(replicated), Some(_)) =
        (env("JOBSET_NAME"), env("REPLICATED_JOB_NAME"), env("JOB_COMPLETION_INDEX"))
    else {
        return Ok(None);
    };
    let port: Option<u16> = parse(env, "JAX_COORDINATOR_PORT", "a port number")?;
    Ok(Some(Found {
        name: "GKE JobSet",
        coordinator: Some((
            format!("{jobset}-{replicated}-0-0.{jobset}:{}", port.unwrap_or(DEFAULT_PORT)),
            "JOBSET_NAME",
        )),
        num_processes: parse(env, "NNODES", "a number of processes")?.map(|n| (n, "NNODES")),
        process_id: parse(env, "JOB_COMPLETION_INDEX", "a pod index")?.map(|n| (n, "JOB_COMPLETION_INDEX")),
        ..Found::default()
    }))
}

/// The settings of this process from `c` and the environment `env` (a lookup, so tests can
/// pass their own).
pub fn detect(c: &Config, env: &dyn Fn(&str) -> Option<String>) -> Result<ClusterSettings> {
    if c.skip_jax_distributed_system {
        return Ok(ClusterSettings { source: "skip_jax_distributed_system=true".into(), ..ClusterSettings::single() });
    }
    // Each value comes from the first environment that has it (a launcher may set NNODES and
    // GPUS_PER_NODE itself and leave the rank to Slurm or Vertex AI).
    let families: Vec<Found> =
        [jax_env(env)?, vertex_env(env)?, slurm_env(env)?, jobset_env(env)?].into_iter().flatten().collect();
    let first = |field: fn(&Found) -> bool| families.iter().find(|f| field(f));
    let found = Found {
        name: "",
        coordinator: first(|f| f.coordinator.is_some()).and_then(|f| f.coordinator.clone()),
        num_processes: first(|f| f.num_processes.is_some()).and_then(|f| f.num_processes),
        process_id: first(|f| f.process_id.is_some()).and_then(|f| f.process_id),
        local_device_ids: first(|f| f.local_device_ids.is_some()).and_then(|f| f.local_device_ids.clone()),
        expected_local_devices: first(|f| f.expected_local_devices.is_some()).and_then(|f| f.expected_local_devices),
    };
    let names: Vec<&str> = families.iter().map(|f| f.name).collect();
    let mut sources = Vec::new();
    let mut pick = |key: &'static str, configured: Option<String>, from_env: Option<(String, &'static str)>| match (
        configured, from_env,
    ) {
        (Some(v), _) => {
            sources.push(format!("{key} from config"));
            Some(v)
        }
        (None, Some((v, var))) => {
            sources.push(format!("{key} from {var}"));
            Some(v)
        }
        (None, None) => None,
    };
    let coordinator = pick(
        "coordinator",
        (!c.coordinator_address.is_empty()).then(|| with_port(&c.coordinator_address, None)),
        found.coordinator,
    );
    let num_processes = pick(
        "num_processes",
        (c.num_processes >= 0).then(|| c.num_processes.to_string()),
        found.num_processes.map(|(n, v)| (n.to_string(), v)),
    );
    let process_id = pick(
        "process_id",
        (c.process_id >= 0).then(|| c.process_id.to_string()),
        found.process_id.map(|(n, v)| (n.to_string(), v)),
    );
    let environment = if names.is_empty() { String::new() } else { format!("{}: ", names.join(" + ")) };
    let source = format!("{environment}{}", sources.join(", "));

    let num_processes: usize = num_processes.map(|n| n.parse().expect("a formatted usize")).unwrap_or(1);
    if num_processes == 0 {
        bail!("num_processes=0 ({source}): a job has at least one process");
    }
    if num_processes == 1 {
        if c.hardware == Hardware::GpuMultiprocess {
            bail!(
                "hardware=gpu_multiprocess, but no multi-process environment was found: set NNODES, NODE_RANK and \
                 JAX_COORDINATOR_ADDRESS (or run under Slurm, Vertex AI or a GKE JobSet, or set num_processes, \
                 process_id and coordinator_address)"
            );
        }
        let source = if sources.is_empty() { "no cluster environment found".to_string() } else { source };
        return Ok(ClusterSettings {
            source,
            expected_local_devices: found.expected_local_devices,
            ..ClusterSettings::single()
        });
    }
    let process_id: usize = process_id.map(|n| n.parse().expect("a formatted usize")).ok_or_else(|| {
        anyhow!("{num_processes} processes ({source}), but not which one this is: set NODE_RANK (or process_id=N)")
    })?;
    if process_id >= num_processes {
        bail!("process_id {process_id} is not below num_processes {num_processes} ({source})");
    }
    let coordinator = coordinator.ok_or_else(|| {
        anyhow!(
            "{num_processes} processes ({source}), but no coordinator address: set JAX_COORDINATOR_ADDRESS=host:port \
             (or coordinator_address=host:port)"
        )
    })?;
    Ok(ClusterSettings {
        num_processes,
        process_id,
        coordinator,
        local_device_ids: found.local_device_ids,
        expected_local_devices: found.expected_local_devices,
        source,
    })
}

/// [`detect`] with the process environment.
pub fn from_environment(c: &Config) -> Result<ClusterSettings> {
    detect(c, &|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(overrides: &[&str]) -> Config {
        let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        crate::config::load(None, &overrides).unwrap()
    }

    fn detect_with(c: &Config, vars: &[(&str, &str)]) -> Result<ClusterSettings> {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        detect(c, &|name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
    }

    #[test]
    fn a3_recipe_variables() {
        let s = detect_with(
            &config(&[]),
            &[
                ("JAX_COORDINATOR_ADDRESS", "10.0.0.2"),
                ("JAX_COORDINATOR_PORT", "1234"),
                ("NNODES", "2"),
                ("NODE_RANK", "1"),
                ("GPUS_PER_NODE", "8"),
            ],
        )
        .unwrap();
        assert_eq!((s.num_processes, s.process_id, s.coordinator.as_str()), (2, 1, "10.0.0.2:1234"));
        assert_eq!(s.expected_local_devices, Some(8));
        assert!(s.source.contains("process_id from NODE_RANK"), "{}", s.source);
    }

    #[test]
    fn config_keys_win_over_the_environment() {
        let c = config(&["process_id=0", "coordinator_address=127.0.0.1:9999"]);
        let s =
            detect_with(&c, &[("JAX_COORDINATOR_ADDRESS", "10.0.0.2:1"), ("NNODES", "4"), ("NODE_RANK", "3")]).unwrap();
        assert_eq!((s.num_processes, s.process_id, s.coordinator.as_str()), (4, 0, "127.0.0.1:9999"));
        assert!(s.source.contains("process_id from config") && s.source.contains("num_processes from NNODES"));
    }

    #[test]
    fn slurm_first_node_and_port() {
        assert_eq!(first_slurm_node("node[001-004,007],other").as_deref(), Some("node001"));
        assert_eq!(first_slurm_node("gpu7,gpu8").as_deref(), Some("gpu7"));
        assert_eq!(first_slurm_node("a3-[12,15]").as_deref(), Some("a3-12"));
        let s = detect_with(
            &config(&[]),
            &[
                ("SLURM_JOB_ID", "4097"),
                ("SLURM_STEP_NODELIST", "node[3-4]"),
                ("SLURM_NTASKS", "2"),
                ("SLURM_PROCID", "1"),
                ("SLURM_STEP_GPUS", "0,1"),
            ],
        )
        .unwrap();
        // JAX: SLURM_JOB_ID % 4096 + 61440.
        assert_eq!(s.coordinator, "node3:61441");
        assert_eq!(s.local_device_ids, Some(vec![0, 1]));
    }

    #[test]
    fn vertex_cluster_spec() {
        let spec = r#"{"cluster": {"workerpool0": ["h0:2222"], "workerpool1": ["h1:2222", "h2:2222"]}, "task": {"type": "workerpool1", "index": 1}}"#;
        let s = detect_with(&config(&[]), &[("CLUSTER_SPEC", spec)]).unwrap();
        assert_eq!((s.num_processes, s.process_id, s.coordinator.as_str()), (3, 2, "h0:2222"));
        let s = detect_with(&config(&[]), &[("MASTER_ADDR", "h0"), ("RANK", "1"), ("WORLD_SIZE", "2")]).unwrap();
        assert_eq!((s.num_processes, s.process_id, s.coordinator.as_str()), (2, 1, "h0:2222"));
    }

    #[test]
    fn values_come_from_the_first_environment_that_has_them() {
        // A launcher sets NNODES and GPUS_PER_NODE; Vertex AI gives the coordinator and rank.
        let spec = r#"{"cluster": {"workerpool0": ["h0:2222"], "workerpool1": ["h1:2222"]}, "task": {"type": "workerpool1", "index": 0}}"#;
        let s = detect_with(&config(&[]), &[("NNODES", "2"), ("GPUS_PER_NODE", "8"), ("CLUSTER_SPEC", spec)]).unwrap();
        assert_eq!((s.num_processes, s.process_id, s.coordinator.as_str()), (2, 1, "h0:2222"));
        assert_eq!(s.expected_local_devices, Some(8));
        assert!(
            s.source.contains("num_processes from NNODES") && s.source.contains("process_id from CLUSTER_SPEC"),
            "{}",
            s.source
        );
    }

    #[test]
    fn jobset_headless_service_name() {
        let s = detect_with(
            &config(&[]),
            &[
                ("JOBSET_NAME", "llama"),
                ("REPLICATED_JOB_NAME", "workers"),
                ("JOB_COMPLETION_INDEX", "3"),
                ("NNODES", "4"),
            ],
        )
        .unwrap();
        assert_eq!((s.num_processes, s.process_id, s.coordinator.as_str()), (4, 3, "llama-workers-0-0.llama:8476"));
    }

    #[test]
    fn incomplete_or_skipped_settings() {
        let err = detect_with(&config(&[]), &[("NNODES", "2"), ("NODE_RANK", "0")]).unwrap_err().to_string();
        assert!(err.contains("no coordinator address"), "{err}");
        let err = detect_with(&config(&[]), &[("NNODES", "2"), ("NODE_RANK", "2"), ("JAX_COORDINATOR_ADDRESS", "h")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("process_id 2 is not below num_processes 2"), "{err}");
        let err = detect_with(&config(&[]), &[("NNODES", "two")]).unwrap_err().to_string();
        assert!(err.contains("NNODES=\"two\""), "{err}");
        let s = detect_with(&config(&["skip_jax_distributed_system=true"]), &[("NNODES", "2")]).unwrap();
        assert!(!s.is_multi_process());
        let err = detect_with(&config(&["hardware=gpu_multiprocess", "plugin=cuda12"]), &[]).unwrap_err().to_string();
        assert!(err.contains("gpu_multiprocess"), "{err}");
    }
}
