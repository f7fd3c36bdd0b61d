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
//!
//! Every value is checked where it is read, the error naming the variable or key: a coordinator
//! is `host:port` (a host name or IP address, a port 1-65535), counts are bounded
//! ([`MAX_PROCESSES`], [`MAX_LOCAL_DEVICES`]).

use std::fmt;

use anyhow::{anyhow, bail, Context, Result};

use crate::config::{Config, Hardware};

/// The coordinator port when none is given (JAX's default for its cluster environments).
pub const DEFAULT_PORT: u16 = 8476;

/// The most processes a job may have: the `num_processes` key's bound (the coordinator keeps a
/// record per process).
pub fn max_processes() -> usize {
    crate::config::range("num_processes").map_or(1 << 20, |r| r.max as usize)
}

/// The most devices one process may expect (`GPUS_PER_NODE`): no machine holds more, and the CPU
/// plugin's `cpu_device_count` stops there too.
pub const MAX_LOCAL_DEVICES: usize = 1024;

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

/// The number in variable `name`, if set: `what` (e.g. "a number of processes") from 0 to `max`.
fn parse(env: &dyn Fn(&str) -> Option<String>, name: &str, what: &str, max: usize) -> Result<Option<usize>> {
    match env(name) {
        None => Ok(None),
        Some(text) => match text.trim().parse::<usize>() {
            Ok(n) if n <= max => Ok(Some(n)),
            _ => bail!("{name}={text:?}: expected {what} from 0 to {max}"),
        },
    }
}

/// A count of processes (or a process index) in variable `name`.
fn parse_count(env: &dyn Fn(&str) -> Option<String>, name: &str, what: &str) -> Result<Option<usize>> {
    parse(env, name, what, max_processes())
}

/// The port in variable `name`, if set.
fn parse_port(env: &dyn Fn(&str) -> Option<String>, name: &str) -> Result<Option<u16>> {
    match env(name) {
        None => Ok(None),
        Some(text) => match text.trim().parse::<u16>() {
            Ok(port) if port > 0 => Ok(Some(port)),
            _ => bail!("{name}={text:?}: expected a port number from 1 to 65535"),
        },
    }
}

/// A host name: dot-separated labels of letters, digits, `-` and `_` (cluster node names), or an
/// IPv4 address.
fn is_host_name(host: &str) -> bool {
    host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        })
}

/// The coordinator `text` (from the variable or key `name`) as `host:port`: its own port, else
/// `port` (default 8476); a bare IPv6 address is bracketed. Anything else is refused here, at
/// once, rather than retried until the registration deadline.
fn coordinator_address(name: &str, text: &str, port: Option<u16>) -> Result<String> {
    let refuse = || {
        anyhow!(
            "{name}={text:?}: expected HOST:PORT or HOST (a host name or IP address, a port from 1 to 65535), \
             e.g. 10.0.0.2:1234"
        )
    };
    let default_port = port.unwrap_or(DEFAULT_PORT);
    let text = text.trim();
    let port_of = |p: &str| p.parse::<u16>().ok().filter(|&p| p > 0).ok_or_else(refuse);
    if let Some(rest) = text.strip_prefix('[') {
        let (ip, after) = rest.split_once(']').ok_or_else(refuse)?;
        ip.parse::<std::net::Ipv6Addr>().map_err(|_| refuse())?;
        let port = match after {
            "" => default_port,
            _ => port_of(after.strip_prefix(':').ok_or_else(refuse)?)?,
        };
        return Ok(format!("[{ip}]:{port}"));
    }
    if text.matches(':').count() > 1 {
        let ip: std::net::Ipv6Addr = text.parse().map_err(|_| refuse())?;
        return Ok(format!("[{ip}]:{default_port}"));
    }
    let (host, port) = match text.split_once(':') {
        Some((host, p)) => (host, port_of(p)?),
        None => (text, default_port),
    };
    if !is_host_name(host) {
        return Err(refuse());
    }
    Ok(format!("{host}:{port}"))
}

fn jax_env(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<Found>> {
    // GPUS_PER_NODE alone counts: a one-process run checks it too.
    let present = ["JAX_COORDINATOR_ADDRESS", "JAX_COORDINATOR_IP", "NNODES", "NODE_RANK", "GPUS_PER_NODE"]
        .iter()
        .any(|v| env(v).is_some());
    if !present {
        return Ok(None);
    }
    let port = parse_port(env, "JAX_COORDINATOR_PORT")?;
    let coordinator = match (env("JAX_COORDINATOR_ADDRESS"), env("JAX_COORDINATOR_IP")) {
        (Some(address), _) => {
            Some((coordinator_address("JAX_COORDINATOR_ADDRESS", &address, port)?, "JAX_COORDINATOR_ADDRESS"))
        }
        (None, Some(ip)) => Some((coordinator_address("JAX_COORDINATOR_IP", &ip, port)?, "JAX_COORDINATOR_IP")),
        (None, None) => None,
    };
    let gpus = parse(env, "GPUS_PER_NODE", "a number of devices per process", MAX_LOCAL_DEVICES)?;
    if gpus == Some(0) {
        bail!("GPUS_PER_NODE=0: expected a number of devices per process from 1 to {MAX_LOCAL_DEVICES}");
    }
    Ok(Some(Found {
        name: "JAX_COORDINATOR_ADDRESS/NNODES/NODE_RANK",
        coordinator,
        num_processes: parse_count(env, "NNODES", "a number of processes")?.map(|n| (n, "NNODES")),
        process_id: parse_count(env, "NODE_RANK", "a process index")?.map(|n| (n, "NODE_RANK")),
        local_device_ids: None,
        expected_local_devices: gpus,
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
        let index = value["task"]["index"].as_u64().ok_or_else(|| anyhow!("CLUSTER_SPEC has no task.index"))?;
        let index = usize::try_from(index).unwrap_or(usize::MAX);
        let mut rank = None;
        let mut offset = 0usize;
        for (name, hosts) in &pools {
            if name.as_str() == task_pool {
                rank = Some(offset.saturating_add(index));
            }
            offset += hosts.len();
        }
        let rank =
            rank.ok_or_else(|| anyhow!("CLUSTER_SPEC: task.type {task_pool:?} is not one of its worker pools"))?;
        let first =
            pools.iter().find_map(|(_, h)| h.first().cloned()).ok_or_else(|| anyhow!("CLUSTER_SPEC lists no hosts"))?;
        return Ok(Some(Found {
            name: "Vertex AI",
            coordinator: Some((coordinator_address("CLUSTER_SPEC (first host)", &first, Some(2222))?, "CLUSTER_SPEC")),
            num_processes: Some((offset, "CLUSTER_SPEC")),
            process_id: Some((rank, "CLUSTER_SPEC")),
            ..Found::default()
        }));
    }
    let Some(master) = env("MASTER_ADDR") else { return Ok(None) };
    let port = parse_port(env, "MASTER_PORT")?;
    Ok(Some(Found {
        name: "Vertex AI",
        coordinator: Some((coordinator_address("MASTER_ADDR", &master, Some(port.unwrap_or(2222)))?, "MASTER_ADDR")),
        num_processes: parse_count(env, "WORLD_SIZE", "a number of processes")?.map(|n| (n, "WORLD_SIZE")),
        process_id: parse_count(env, "RANK", "a process index")?.map(|n| (n, "RANK")),
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
    let port = parse_port(env, "JAX_COORDINATOR_PORT")?;
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
        coordinator: Some((
            coordinator_address("SLURM_STEP_NODELIST (first node)", &host, Some(port))?,
            "SLURM_STEP_NODELIST",
        )),
        num_processes: parse_count(env, "SLURM_NTASKS", "a number of tasks")?.map(|n| (n, "SLURM_NTASKS")),
        process_id: parse_count(env, "SLURM_PROCID", "a task index")?.map(|n| (n, "SLURM_PROCID")),
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
    let port = parse_port(env, "JAX_COORDINATOR_PORT")?;
    let host = format!("{jobset}-{replicated}-0-0.{jobset}");
    Ok(Some(Found {
        name: "GKE JobSet",
        coordinator: Some((coordinator_address("JOBSET_NAME/REPLICATED_JOB_NAME", &host, port)?, "JOBSET_NAME")),
        num_processes: parse_count(env, "NNODES", "a number of processes")?.map(|n| (n, "NNODES")),
        process_id: parse_count(env, "JOB_COMPLETION_INDEX", "a pod index")?.map(|n| (n, "JOB_COMPLETION_INDEX")),
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
    let configured = match c.coordinator_address.as_str() {
        "" => None,
        address => Some(coordinator_address("coordinator_address", address, None)?),
    };
    let coordinator = pick("coordinator", configured, found.coordinator);
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
    if num_processes == 0 || num_processes > max_processes() {
        bail!("num_processes={num_processes} ({source}): a job has 1 to {} processes", max_processes());
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
    fn coordinator_addresses_are_host_port_and_counts_are_bounded() {
        for (text, port, expected) in [
            ("10.0.0.2", None, "10.0.0.2:8476"),
            ("10.0.0.2:1234", Some(9), "10.0.0.2:1234"),
            ("node_01.cluster.local", Some(9), "node_01.cluster.local:9"),
            ("fe80::1", None, "[fe80::1]:8476"),
            ("[fe80::1]:77", None, "[fe80::1]:77"),
        ] {
            assert_eq!(coordinator_address("X", text, port).unwrap(), expected);
        }
        for bad in ["garbage!!", "host:abc", "host:0", "host:70000", "", "a/b:1", "[::1", "http://h:1", "h:1:2"] {
            let e = coordinator_address("JAX_COORDINATOR_ADDRESS", bad, None).unwrap_err().to_string();
            assert!(e.starts_with(&format!("JAX_COORDINATOR_ADDRESS={bad:?}: expected HOST:PORT")), "{e}");
        }
        let e = detect_with(&config(&["coordinator_address=a b"]), &[]).unwrap_err().to_string();
        assert!(e.starts_with("coordinator_address=\"a b\""), "{e}");
        let e = detect_with(&config(&[]), &[("NNODES", "99999999999")]).unwrap_err().to_string();
        assert!(e.contains("NNODES=\"99999999999\": expected a number of processes from 0 to 1048576"), "{e}");
        let e = detect_with(&config(&[]), &[("GPUS_PER_NODE", "0")]).unwrap_err().to_string();
        assert!(e.starts_with("GPUS_PER_NODE=0"), "{e}");
        let e = detect_with(&config(&[]), &[("MASTER_ADDR", "h0"), ("MASTER_PORT", "0")]).unwrap_err().to_string();
        assert!(e.starts_with("MASTER_PORT=\"0\""), "{e}");
        // GPUS_PER_NODE alone is kept for the device check of a one-process run.
        let s = detect_with(&config(&[]), &[("GPUS_PER_NODE", "8")]).unwrap();
        assert_eq!((s.num_processes, s.expected_local_devices), (1, Some(8)));
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
