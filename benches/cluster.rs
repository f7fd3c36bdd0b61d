//! `cargo bench --bench cluster`: the multi-process runtime's figures on loopback, as a table.
//!
//! - registration: `maxrs launch --num-processes N -- cluster-check` for N = 2, 4, 8 (CPU
//!   plugin); each rank reports how long its registration call took; the shortest is the
//!   registration barrier's own latency (the last rank to arrive), the longest adds the start-up
//!   skew between ranks (plugin loading);
//! - key-value operations per second: 16 in-process clients x 1000 operations (set, try-get,
//!   blocking get, increment; tests/common/key_value_load.rs), and one client's sequential set +
//!   get round trips;
//! - failure detection: 4 held processes, heartbeat_timeout_seconds=5; one is killed (SIGKILL)
//!   or hung (SIGSTOP); the time until the last other rank has exited.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use maxrs::cluster::{ClientOptions, CoordinationClient, Coordinator, ServiceConfig};

#[path = "../tests/common/key_value_load.rs"]
mod key_value_load;

/// Operations per client.
const OPS: usize = 1000;

const MAXRS: &str = env!("CARGO_BIN_EXE_maxrs");

fn registration(n: usize) -> (f64, f64, f64) {
    let start = Instant::now();
    let output = Command::new(MAXRS)
        .args(["launch", "--num-processes", &n.to_string(), "--", "cluster-check"])
        .env("RUST_LOG", "warn")
        .output()
        .expect("runs maxrs launch");
    let wall = start.elapsed().as_secs_f64();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}{}", String::from_utf8_lossy(&output.stderr));
    let times: Vec<f64> = text
        .lines()
        .filter_map(|l| l.split("registered (").nth(1))
        .filter_map(|rest| rest.split(' ').next()?.parse().ok())
        .collect();
    assert_eq!(times.len(), n, "{text}");
    let min = times.iter().copied().fold(f64::INFINITY, f64::min);
    let max = times.iter().copied().fold(0.0, f64::max);
    (min, max, wall)
}

fn key_value_rates() -> (f64, f64) {
    const CLIENTS: usize = 16;
    let config = |n| ServiceConfig {
        num_processes: n,
        job_name: "bench".into(),
        heartbeat_timeout: Duration::from_secs(30),
        register_timeout: Duration::from_secs(30),
        shutdown_timeout: Duration::from_secs(30),
    };
    let coordinator = Coordinator::start("127.0.0.1:0".parse().unwrap(), config(CLIENTS)).unwrap();
    let options = |r: usize| ClientOptions {
        address: coordinator.address().to_string(),
        process_id: r as i32,
        num_processes: CLIENTS,
        job_name: "bench".into(),
        heartbeat_timeout: Duration::from_secs(30),
        register_timeout: Duration::from_secs(30),
        shutdown_timeout: Duration::from_secs(30),
    };
    let clients: Vec<Arc<CoordinationClient>> = (0..CLIENTS)
        .map(|r| Arc::new(CoordinationClient::new(options(r), Arc::new(|m: &str| panic!("{m}"))).unwrap()))
        .collect();
    key_value_load::connect_all(&clients);
    let concurrent = (CLIENTS * OPS) as f64 / key_value_load::run(&clients, "bench", OPS).as_secs_f64();
    let one = &clients[0];
    let start = Instant::now();
    for i in 0..1000 {
        one.key_value_set(&format!("seq/{i}"), b"v", false).unwrap();
        one.key_value_try_get(&format!("seq/{i}")).unwrap();
    }
    let sequential = 2000.0 / start.elapsed().as_secs_f64();
    (concurrent, sequential)
}

struct Held(Vec<Child>);

impl Drop for Held {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn detection(signal: libc::c_int) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let port = maxrs::cluster::launch::free_port().unwrap();
    let outs: Vec<_> = (0..4).map(|r| dir.path().join(format!("{r}.out"))).collect();
    let mut held = Held(
        (0..4)
            .map(|r| {
                Command::new(MAXRS)
                    .args(["cluster-check", "--hold-seconds", "120", "heartbeat_timeout_seconds=5"])
                    .env("JAX_COORDINATOR_ADDRESS", format!("127.0.0.1:{port}"))
                    .env("NNODES", "4")
                    .env("NODE_RANK", r.to_string())
                    .env("RUST_LOG", "warn")
                    .stdout(std::fs::File::create(&outs[r]).unwrap())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap()
            })
            .collect(),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while !outs.iter().all(|o| std::fs::read_to_string(o).unwrap_or_default().contains("holding")) {
        assert!(Instant::now() < deadline, "the ranks did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let victim = 2;
    let start = Instant::now();
    // SAFETY: kill on our own child's pid.
    unsafe { libc::kill(held.0[victim].id() as libc::pid_t, signal) };
    for (r, child) in held.0.iter_mut().enumerate() {
        if r != victim {
            child.wait().unwrap();
        }
    }
    start.elapsed().as_secs_f64()
}

fn main() {
    println!("{:<58} {:>10}", "measure", "value");
    for n in [2, 4, 8] {
        let (min, max, wall) = registration(n);
        println!("{:<58} {:>8.3} s", format!("registration, {n} processes: barrier (last to arrive)"), min);
        println!("{:<58} {:>8.3} s", format!("registration, {n} processes: incl. start-up skew (first)"), max);
        println!("{:<58} {:>8.3} s", format!("launch + cluster-check, {n} processes, wall"), wall);
    }
    let (concurrent, sequential) = key_value_rates();
    println!("{:<58} {:>8.0} /s", "key-value ops, 16 clients x 1000 concurrent", concurrent);
    println!("{:<58} {:>8.0} /s", "key-value ops, 1 client sequential (set + try-get)", sequential);
    println!("{:<58} {:>8.2} s", "failure detection, SIGKILL of 1 of 4, heartbeat 5 s", detection(libc::SIGKILL));
    println!("{:<58} {:>8.2} s", "failure detection, SIGSTOP of 1 of 4, heartbeat 5 s", detection(libc::SIGSTOP));
}
