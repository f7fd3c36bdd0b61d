//! `maxrs cluster-check`: what a team runs before burning a day of cluster time. Under any
//! launcher it registers with the coordinator, exchanges key-value entries (set, blocking get,
//! try-get, directory get, increment), passes barriers, prints every host's devices, and where
//! one program can span the devices (GPU and TPU clusters; several devices of one process on any
//! plugin) measures all-reduce, all-gather and reduce-scatter across message sizes and prints
//! nccl-tests' table (size, time, algbw, busbw), checking each result. A CPU cluster of several
//! processes checks everything but the collectives, which the CPU plugin cannot run across
//! processes.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde::{Deserialize, Serialize};

use super::{diagnostics, exit_on_cluster_error, Cluster};
use crate::config::Config;
use crate::host::HostTensor;
use crate::pjrt::{self, Buffer, Client, CompileOptions};

/// What `cluster-check` does besides the checks.
#[derive(Clone, Debug)]
pub struct CheckOptions {
    /// Stay registered (heartbeating) this long after the checks.
    pub hold: Duration,
    /// Largest collective message, in bytes (sizes go up by 4x from 64 KiB).
    pub max_bytes: usize,
    /// Timed runs per size (after one warm-up run).
    pub iterations: usize,
}

/// One host as the others see it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HostInfo {
    pub rank: usize,
    pub hostname: String,
    pub pid: u32,
    pub platform: String,
    /// (id, kind) of each device this process drives.
    pub devices: Vec<(i32, String)>,
}

/// One row of the bandwidth table.
#[derive(Clone, Debug)]
pub struct BandwidthRow {
    pub collective: &'static str,
    pub bytes: usize,
    pub seconds: f64,
    pub algbw_gbps: f64,
    pub busbw_gbps: f64,
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_string()).unwrap_or_else(|_| "?".into())
}

/// Runs the check for the job `c` describes; prints as it goes (process 0 prints the tables).
pub fn cluster_check(c: &Config, o: &CheckOptions) -> Result<()> {
    diagnostics::install(c.slow_step_stack_trace_factor, None);
    let cluster = Cluster::join(c, exit_on_cluster_error())?;
    match check(c, o, &cluster) {
        Ok(()) => {
            let (n, registration) = (cluster.process_count(), cluster.registration_seconds);
            cluster.shutdown()?;
            println!("cluster-check: OK: {n} process(es), registration {registration:.3} s");
            Ok(())
        }
        Err(e) => {
            cluster.report_failure(&e);
            Err(e)
        }
    }
}

fn check(c: &Config, o: &CheckOptions, cluster: &Cluster) -> Result<()> {
    let (rank, n) = (cluster.process_index(), cluster.process_count());
    // A CPU cluster cannot make one PJRT client across processes: each checks its own devices.
    let client = if c.plugin == "cpu" {
        let count =
            usize::try_from(c.cpu_device_count).ok().filter(|&k| k > 0).context("cpu_device_count must be positive")?;
        cluster.check_local_devices(count, &format!("the CPU plugin with cpu_device_count={count}"))?;
        pjrt::cpu_client(count)?
    } else {
        cluster.pjrt_client(c)?
    };
    let platform = client.platform_name()?;
    let local = client.addressable_devices()?;
    let me = HostInfo {
        rank,
        hostname: hostname(),
        pid: std::process::id(),
        platform: platform.clone(),
        devices: local.iter().map(|d| (d.id, d.kind.clone())).collect(),
    };
    let hosts = match cluster.client() {
        Some(kv) => exchange(kv, &me, n)?,
        None => vec![me],
    };
    if cluster.is_logger() {
        println!("{}", host_table(&hosts));
    }

    let cross_process = n > 1;
    let global = client.devices()?.len();
    if cross_process && platform == "cpu" {
        println!("collectives: skipped: the CPU plugin cannot run collectives across processes");
    } else if global < 2 {
        println!("collectives: skipped: one device");
    } else {
        let rows = bandwidth(&client, o)?;
        if cluster.is_logger() {
            println!("{}", bandwidth_table(&rows, global));
        }
    }
    if !o.hold.is_zero() {
        println!("holding for {:.0} s (heartbeats continue)", o.hold.as_secs_f64());
        std::thread::sleep(o.hold);
    }
    if let Some(kv) = cluster.client() {
        kv.wait_at_barrier("cluster_check/done", Duration::from_secs(c.shutdown_timeout_seconds.max(1) as u64), &[])?;
    }
    println!("devices: {global} on {platform}");
    Ok(())
}

/// Publishes this host, reads every other one with each kind of key-value read, checks a
/// counter that every process increments, and passes two barriers.
fn exchange(kv: &super::CoordinationClient, me: &HostInfo, n: usize) -> Result<Vec<HostInfo>> {
    let timeout = Duration::from_secs(60);
    let rank = me.rank;
    let start = Instant::now();
    kv.key_value_set(&format!("cluster_check/hosts/{rank}"), &serde_json::to_vec(me)?, false)?;
    kv.key_value_increment("cluster_check/arrived", 1)?;
    let mut hosts = Vec::with_capacity(n);
    for other in 0..n {
        let bytes = kv.blocking_key_value_get(&format!("cluster_check/hosts/{other}"), timeout)?;
        let host: HostInfo =
            serde_json::from_slice(&bytes).with_context(|| format!("the entry of process {other} does not parse"))?;
        ensure!(host.rank == other, "process {other} published itself as rank {}", host.rank);
        hosts.push(host);
    }
    kv.wait_at_barrier("cluster_check/published", timeout, &[])?;
    let dir = kv.key_value_dir_get("cluster_check/hosts")?;
    ensure!(dir.len() == n, "the directory cluster_check/hosts has {} entries, expected {n}", dir.len());
    let arrived = kv.key_value_try_get("cluster_check/arrived")?.unwrap_or_default();
    ensure!(
        arrived == n.to_string().as_bytes(),
        "the shared counter reads {:?}, expected {n}",
        String::from_utf8_lossy(&arrived)
    );
    ensure!(kv.key_value_try_get(&format!("cluster_check/absent/{rank}"))?.is_none(), "an unset key reads as set");
    kv.wait_at_barrier("cluster_check/read", timeout, &[])?;
    println!("key-value store and barriers: OK ({} operations in {:.3} s)", 2 * n + 6, start.elapsed().as_secs_f64());
    Ok(hosts)
}

fn host_table(hosts: &[HostInfo]) -> String {
    let mut out = format!("{:>4}  {:<24} {:>8}  {:<8} devices\n", "rank", "host", "pid", "platform");
    for h in hosts {
        let kinds: std::collections::BTreeSet<&str> = h.devices.iter().map(|(_, k)| k.as_str()).collect();
        let ids: Vec<String> = h.devices.iter().map(|(id, _)| id.to_string()).collect();
        let _ = writeln!(
            out,
            "{:>4}  {:<24} {:>8}  {:<8} {} x {} (ids {})",
            h.rank,
            h.hostname,
            h.pid,
            h.platform,
            h.devices.len(),
            kinds.into_iter().collect::<Vec<_>>().join(", "),
            ids.join(",")
        );
    }
    out
}

/// StableHLO for one collective over `replicas` devices (one replica each) on f32 arrays of
/// `elements` per device (the input of all-reduce and all-gather, the output of reduce-scatter).
fn collective_program(collective: &str, replicas: usize, elements: usize) -> String {
    let group: Vec<String> = (0..replicas).map(|r| r.to_string()).collect();
    let groups = format!("dense<[[{}]]> : tensor<1x{replicas}xi64>", group.join(", "));
    let sum = "({\n    ^bb0(%a: tensor<f32>, %b: tensor<f32>):\n      %s = stablehlo.add %a, %b : tensor<f32>\n      stablehlo.return %s : tensor<f32>\n    })";
    let (input, output, body) = match collective {
        "all_reduce" => (
            elements,
            elements,
            format!("\"stablehlo.all_reduce\"(%arg0) {sum} {{replica_groups = {groups}}} : (tensor<{elements}xf32>) -> tensor<{elements}xf32>"),
        ),
        "all_gather" => (
            elements,
            elements * replicas,
            format!(
                "\"stablehlo.all_gather\"(%arg0) {{all_gather_dim = 0 : i64, replica_groups = {groups}}} : (tensor<{elements}xf32>) -> tensor<{}xf32>",
                elements * replicas
            ),
        ),
        _ => (
            elements * replicas,
            elements,
            format!(
                "\"stablehlo.reduce_scatter\"(%arg0) {sum} {{scatter_dimension = 0 : i64, replica_groups = {groups}}} : (tensor<{}xf32>) -> tensor<{elements}xf32>",
                elements * replicas
            ),
        ),
    };
    format!(
        "module @{collective} attributes {{mhlo.num_replicas = {replicas} : i32, mhlo.num_partitions = 1 : i32}} {{\n  \
         func.func public @main(%arg0: tensor<{input}xf32>) -> tensor<{output}xf32> {{\n    %0 = {body}\n    \
         return %0 : tensor<{output}xf32>\n  }}\n}}\n"
    )
}

/// Element `index` of every device's result when replica `r` feeds `r + 1` everywhere: the
/// gathered blocks in replica order, or the sum over replicas.
fn expected(collective: &str, replicas: usize, index: usize, elements: usize) -> f32 {
    match collective {
        "all_gather" => (index / elements + 1) as f32,
        _ => (replicas * (replicas + 1) / 2) as f32,
    }
}

/// Times each collective at each size on every device of the job (one replica per device, in
/// global device order) and checks the results on this process's devices.
pub fn bandwidth(client: &Client, o: &CheckOptions) -> Result<Vec<BandwidthRow>> {
    let devices = client.devices()?;
    let replicas = devices.len();
    let ids: Vec<i64> = devices.iter().map(|d| d.id as i64).collect();
    let mut sizes = Vec::new();
    let mut bytes = 64 << 10;
    while bytes <= o.max_bytes.max(64 << 10) {
        sizes.push(bytes);
        bytes *= 4;
    }
    let mut rows = Vec::new();
    for collective in ["all_reduce", "all_gather", "reduce_scatter"] {
        for &bytes in &sizes {
            // `bytes` is nccl-tests' size: the per-device buffer of all-reduce, the gathered
            // output of all-gather, the scattered input of reduce-scatter.
            let elements = match collective {
                "all_reduce" => bytes / 4,
                _ => (bytes / 4 / replicas).max(1),
            };
            let options = CompileOptions {
                num_replicas: replicas as i64,
                device_assignment: Some(ids.clone()),
                ..CompileOptions::single_device()
            };
            let executable = client
                .compile(&collective_program(collective, replicas, elements), &options)
                .with_context(|| format!("compiling the {collective} test"))?;
            let order = executable.addressable_devices().to_vec();
            let input_elements = if collective == "reduce_scatter" { elements * replicas } else { elements };
            let inputs: Vec<Buffer> = order
                .iter()
                .map(|d| {
                    let replica = ids.iter().position(|&id| id == d.id as i64).expect("a device of the client");
                    client.to_device(
                        &HostTensor::from_f32(&[input_elements as i64], &vec![(replica + 1) as f32; input_elements]),
                        d,
                    )
                })
                .collect::<pjrt::Result<_>>()?;
            let args: Vec<Vec<&Buffer>> = inputs.iter().map(|b| vec![b]).collect();
            let outputs = executable.execute(&args)?;
            for (d, out) in order.iter().zip(&outputs) {
                let values = out[0].to_host()?.to_f32();
                for (index, v) in values.iter().enumerate().step_by((values.len() / 7).max(1)) {
                    let want = expected(collective, replicas, index, elements);
                    if *v != want {
                        bail!("{collective} of {bytes} bytes: device {} element {index} is {v}, expected {want}", d.id);
                    }
                }
            }
            let start = Instant::now();
            for _ in 0..o.iterations.max(1) {
                executable.execute(&args)?;
            }
            let seconds = start.elapsed().as_secs_f64() / o.iterations.max(1) as f64;
            let algbw = bytes as f64 / seconds / 1e9;
            let factor = match collective {
                "all_reduce" => 2.0 * (replicas - 1) as f64 / replicas as f64,
                _ => (replicas - 1) as f64 / replicas as f64,
            };
            rows.push(BandwidthRow { collective, bytes, seconds, algbw_gbps: algbw, busbw_gbps: algbw * factor });
        }
    }
    Ok(rows)
}

pub fn bandwidth_table(rows: &[BandwidthRow], devices: usize) -> String {
    let mut out = format!(
        "collectives over {devices} devices (nccl-tests' definitions: size per rank for all_reduce, total for all_gather and reduce_scatter)\n{:<15} {:>12} {:>12} {:>13} {:>13}\n",
        "collective", "size (B)", "time (us)", "algbw (GB/s)", "busbw (GB/s)"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:<15} {:>12} {:>12.1} {:>13.2} {:>13.2}",
            r.collective,
            r.bytes,
            r.seconds * 1e6,
            r.algbw_gbps,
            r.busbw_gbps
        );
    }
    out
}
