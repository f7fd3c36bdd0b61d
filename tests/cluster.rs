//! The multi-process runtime on loopback, with real processes where processes matter: a
//! 4-process `maxrs launch -- cluster-check`, a killed and a stopped (hung) process taking the
//! job down within the heartbeat timeout, a process that never starts failing registration by
//! name; and in-process: foreign job identities refused, hostile bytes on the port, 16
//! concurrent clients x 1000 key-value operations.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use maxrs::cluster::{proto, ClientOptions, CoordinationClient, Coordinator, ErrorHandler, ServiceConfig};
use rand::{Rng, SeedableRng};

const MAXRS: &str = env!("CARGO_BIN_EXE_maxrs");

fn free_port() -> u16 {
    maxrs::cluster::launch::free_port().unwrap()
}

/// One rank of a job started directly (not through `launch`), its output in files.
struct Rank {
    rank: usize,
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Rank {
    fn start(dir: &Path, rank: usize, n: usize, port: u16, args: &[&str]) -> Rank {
        let stdout = dir.join(format!("rank{rank}.out"));
        let stderr = dir.join(format!("rank{rank}.err"));
        let child = Command::new(MAXRS)
            .args(args)
            .env("JAX_COORDINATOR_ADDRESS", format!("127.0.0.1:{port}"))
            .env("NNODES", n.to_string())
            .env("NODE_RANK", rank.to_string())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        Rank { rank, child, stdout, stderr }
    }

    fn output(&self) -> String {
        let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
        format!("{}{}", read(&self.stdout), read(&self.stderr))
    }

    fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill on our own child's pid.
        assert_eq!(unsafe { libc::kill(self.child.id() as libc::pid_t, signal) }, 0);
    }
}

impl Drop for Rank {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

const HOLD: &[&str] = &["cluster-check", "--hold-seconds", "120", "heartbeat_timeout_seconds=5"];

/// Starts a held 4-process job, applies `signal` to rank `victim`, and checks that every other
/// rank exits non-zero within 15 s naming the victim. Returns the slowest survivor's latency.
fn failure_is_detected(signal: libc::c_int, victim: usize) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut ranks: Vec<Rank> = (0..4).map(|r| Rank::start(dir.path(), r, 4, port, HOLD)).collect();
    wait_until("every rank to pass the checks", Duration::from_secs(90), || {
        ranks.iter().all(|r| r.output().contains("holding for"))
    });
    let start = Instant::now();
    ranks[victim].signal(signal);
    let mut latency: f64 = 0.0;
    for rank in ranks.iter_mut().filter(|r| r.rank != victim) {
        let status = loop {
            if let Some(status) = rank.child.try_wait().unwrap() {
                break status;
            }
            assert!(start.elapsed() < Duration::from_secs(15), "rank {} still runs 15 s after the failure", rank.rank);
            std::thread::sleep(Duration::from_millis(20));
        };
        latency = latency.max(start.elapsed().as_secs_f64());
        assert!(!status.success(), "rank {} exited successfully", rank.rank);
        let output = rank.output();
        assert!(output.contains(&format!("process {victim} (host 127.0.0.1)")), "rank {}: {output}", rank.rank);
    }
    // A stopped process is still there: end it.
    ranks[victim].signal(libc::SIGKILL);
    latency
}

#[test]
fn launch_runs_a_four_process_cluster_check() {
    let output = Command::new(MAXRS)
        .args(["launch", "--num-processes", "4", "--", "cluster-check"])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).to_string() + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{text}");
    for rank in 0..4 {
        assert!(text.contains(&format!("[rank {rank}] cluster-check: OK: 4 process(es)")), "{text}");
    }
    assert!(text.contains("[rank 0]    3  "), "process 0 prints every host: {text}");
}

#[test]
fn launch_stops_the_other_ranks_when_one_fails() {
    let dir = tempfile::tempdir().unwrap();
    let (out, err) = (dir.path().join("out"), dir.path().join("err"));
    let mut launch = Command::new(MAXRS)
        .args(["launch", "--num-processes", "3", "--", "cluster-check", "--hold-seconds", "120"])
        .env("RUST_LOG", "warn")
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    wait_until("three ranks holding", Duration::from_secs(90), || read(&out).matches("holding for").count() == 3);
    let children = std::fs::read_to_string(format!("/proc/{}/task/{}/children", launch.id(), launch.id())).unwrap();
    let victim: libc::pid_t = children.split_whitespace().next().unwrap().parse().unwrap();
    // SAFETY: kill on a child of our own child.
    assert_eq!(unsafe { libc::kill(victim, libc::SIGKILL) }, 0);
    let start = Instant::now();
    let status = launch.wait().unwrap();
    // Launch notices the exit itself: far sooner than the heartbeat timeout (100 s here).
    assert!(start.elapsed() < Duration::from_secs(10), "{}", read(&err));
    assert_eq!(status.code(), Some(1));
    let text = read(&err);
    assert!(text.contains("was killed by signal 9; stopping the other 2 rank(s)"), "{text}");
    assert!(text.contains("maxrs launch: failed: rank"), "{text}");
}

#[test]
fn a_standalone_coordinator_serves_a_job_and_exits_when_it_ends() {
    let port = free_port();
    let mut coordinator = Command::new(MAXRS)
        .args(["coordinator", "--port", &port.to_string(), "--num-processes", "2"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let output = Command::new(MAXRS)
        .args(["launch", "--num-processes", "2", "--coordinator-port", &port.to_string(), "--"])
        .args(["cluster-check", "external_coordinator=true"])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).to_string() + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{text}");
    let status = coordinator.wait().unwrap();
    let mut said = String::new();
    coordinator.stdout.take().unwrap().read_to_string(&mut said).unwrap();
    assert!(status.success(), "{said}");
    assert!(said.contains("every process shut down"), "{said}");
}

#[test]
fn a_multi_process_train_on_the_cpu_plugin_stops_at_start() {
    let output = Command::new(MAXRS)
        .args(["launch", "--num-processes", "2", "--", "train", "steps=2"])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(!output.status.success());
    assert!(text.contains("the CPU plugin cannot run one program across processes"), "{text}");
}

#[test]
fn a_killed_process_stops_every_other_within_15_s() {
    let latency = failure_is_detected(libc::SIGKILL, 2);
    println!("kill of rank 2 of 4 (heartbeat_timeout_seconds=5): every other rank stopped after {latency:.1} s");
}

#[test]
fn a_hung_process_stops_every_other_within_15_s() {
    let latency = failure_is_detected(libc::SIGSTOP, 1);
    println!("SIGSTOP of rank 1 of 4 (heartbeat_timeout_seconds=5): every other rank stopped after {latency:.1} s");
}

#[test]
fn a_process_that_never_starts_fails_registration_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let args = ["cluster-check", "jax_distributed_initialization_timeout=3"];
    let mut ranks: Vec<Rank> = (0..2).map(|r| Rank::start(dir.path(), r, 3, port, &args)).collect();
    for rank in ranks.iter_mut() {
        let status = rank.child.wait().unwrap();
        assert!(!status.success());
        let output = rank.output();
        assert!(output.contains("process 2 of 3 never registered"), "rank {}: {output}", rank.rank);
    }
}

// ---- in-process: a coordinator and clients on loopback ----

fn config(n: usize) -> ServiceConfig {
    ServiceConfig {
        num_processes: n,
        job_name: "test-job".into(),
        heartbeat_timeout: Duration::from_secs(10),
        register_timeout: Duration::from_secs(20),
        shutdown_timeout: Duration::from_secs(20),
    }
}

fn options(coordinator: &Coordinator, rank: i32, n: usize) -> ClientOptions {
    ClientOptions {
        address: coordinator.address().to_string().replace("0.0.0.0", "127.0.0.1"),
        process_id: rank,
        num_processes: n,
        job_name: "test-job".into(),
        heartbeat_timeout: Duration::from_secs(10),
        register_timeout: Duration::from_secs(20),
        shutdown_timeout: Duration::from_secs(20),
    }
}

/// An error handler that records instead of ending the test process.
fn recorder() -> (ErrorHandler, Arc<std::sync::Mutex<Vec<String>>>) {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = seen.clone();
    (Arc::new(move |m: &str| sink.lock().unwrap().push(m.to_string())), seen)
}

fn start(n: usize) -> Coordinator {
    Coordinator::start("127.0.0.1:0".parse().unwrap(), config(n)).unwrap()
}

#[test]
fn foreign_job_identities_are_refused() {
    let coordinator = start(2);
    let (handler, _) = recorder();
    // Another job's name, another process count, a process id outside the job: each refused at
    // registration, immediately and by name.
    let mut other_job = options(&coordinator, 0, 2);
    other_job.job_name = "another-job".into();
    let err = CoordinationClient::new(other_job, handler.clone()).unwrap().connect().unwrap_err().to_string();
    assert!(err.contains("serves job `test-job`, but the request comes from job `another-job`"), "{err}");
    let err = CoordinationClient::new(options(&coordinator, 0, 3), handler.clone())
        .unwrap()
        .connect()
        .unwrap_err()
        .to_string();
    assert!(err.contains("job of 2 processes, but the request comes from a job of 3"), "{err}");
    let err = CoordinationClient::new(options(&coordinator, 5, 2), handler.clone())
        .unwrap()
        .connect()
        .unwrap_err()
        .to_string();
    assert!(err.contains("process 5 is not part of this job"), "{err}");

    // The job still forms.
    let (h0, failures0) = recorder();
    let (h1, failures1) = recorder();
    let a = CoordinationClient::new(options(&coordinator, 0, 2), h0).unwrap();
    let b = CoordinationClient::new(options(&coordinator, 1, 2), h1).unwrap();
    let joiner = std::thread::spawn(move || b.connect().map(|_| b));
    a.connect().unwrap();
    let b = joiner.join().unwrap().unwrap();
    a.key_value_set("k", b"v", false).unwrap();
    assert_eq!(b.blocking_key_value_get("k", Duration::from_secs(5)).unwrap(), b"v");

    // Another incarnation claiming process 1 (a restart, or a second process with its rank) is
    // refused, and the job stops: every member hears which process it was.
    let (h2, _) = recorder();
    let err = CoordinationClient::new(options(&coordinator, 1, 2), h2).unwrap().connect().unwrap_err().to_string();
    assert!(err.contains("process 1 (host 127.0.0.1) registered again with a new incarnation"), "{err}");
    wait_until("both members to hear of the failure", Duration::from_secs(10), || {
        !failures0.lock().unwrap().is_empty() && !failures1.lock().unwrap().is_empty()
    });
    assert!(failures0.lock().unwrap()[0].contains("registered again with a new incarnation"));
}

/// A codec that sends raw bytes as a gRPC message and reads any answer as raw bytes.
#[derive(Default)]
struct RawCodec;

struct RawEncoder;
struct RawDecoder;

impl tonic::codec::Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), tonic::Status> {
        use bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawDecoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        use bytes::Buf;
        let mut out = vec![0; src.remaining()];
        src.copy_to_slice(&mut out);
        Ok(Some(out))
    }
}

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

#[test]
fn hostile_bytes_leave_the_coordinator_serving() {
    let coordinator = start(2);
    let address = coordinator.address();
    let mut rng = rand::rngs::StdRng::seed_from_u64(12);
    // 1. Random byte strings, and truncated HTTP/2 frames after a valid preface, each on its own
    //    connection.
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    for i in 0..10_000 {
        let mut bytes: Vec<u8> = if i % 4 == 0 {
            // A frame header announcing more payload than follows.
            let mut frame = PREFACE.to_vec();
            let len: u32 = rng.gen_range(16..1 << 20);
            frame.extend_from_slice(&len.to_be_bytes()[1..]);
            frame.push(rng.gen_range(0..10)); // type
            frame.push(rng.gen());
            frame.extend_from_slice(&rng.gen::<u32>().to_be_bytes());
            frame.extend((0..rng.gen_range(0..16)).map(|_| rng.gen::<u8>()));
            frame
        } else {
            (0..rng.gen_range(1..256)).map(|_| rng.gen::<u8>()).collect()
        };
        if i % 4 == 1 {
            bytes.splice(0..0, PREFACE.iter().copied());
        }
        if let Ok(mut stream) = TcpStream::connect(address) {
            let _ = stream.write_all(&bytes);
            let _ = stream.shutdown(std::net::Shutdown::Write);
            if i % 100 == 0 {
                // Sometimes read what the server answers (a GOAWAY, or nothing). Waiting for it
                // also keeps the flood within the listen backlog (128 connections): beyond it the
                // kernel drops connections, each retried a second later, and the 10,000 took 35 s
                // (longer than the job's 20 s registration deadline) instead of 0.4 s.
                let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
                let _ = stream.read_to_end(&mut Vec::new());
            }
        }
    }
    // 2. Well-formed gRPC calls whose bodies are random bytes, to every method but
    //    registration (a random body can be a valid registration, which is not hostile).
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let channel =
            tonic::transport::Endpoint::from_shared(format!("http://{address}")).unwrap().connect().await.unwrap();
        let methods = [
            "Heartbeat",
            "ShutdownTask",
            "WatchTasks",
            "InsertKeyValue",
            "GetKeyValue",
            "TryGetKeyValue",
            "IncrementKeyValue",
            "GetKeyValueDir",
            "DeleteKeyValue",
            "Barrier",
            "CancelBarrier",
            "GetAliveTasks",
            "PollForError",
            "ReportErrorToService",
            "NoSuchMethod",
        ];
        for method in methods {
            for _ in 0..40 {
                let body: Vec<u8> = (0..rng.gen_range(0..64)).map(|_| rng.gen::<u8>()).collect();
                let mut grpc = tonic::client::Grpc::new(channel.clone());
                grpc.ready().await.unwrap();
                let path = format!("/{}/{method}", proto::SERVICE_NAME).parse().unwrap();
                let mut request = tonic::Request::new(body);
                request.set_timeout(Duration::from_millis(50));
                let call = grpc.unary::<_, Vec<u8>, _>(request, path, RawCodec);
                let _ = tokio::time::timeout(Duration::from_millis(200), call).await;
            }
        }
    });
    // 3. The job forms and works.
    let (h0, failures) = recorder();
    let (h1, _) = recorder();
    let a = CoordinationClient::new(options(&coordinator, 0, 2), h0).unwrap();
    let b = CoordinationClient::new(options(&coordinator, 1, 2), h1).unwrap();
    let joiner = std::thread::spawn(move || b.connect().map(|_| b));
    a.connect().unwrap();
    let b = joiner.join().unwrap().unwrap();
    a.key_value_set("after/fuzz", b"still serving", true).unwrap();
    assert_eq!(b.blocking_key_value_get("after/fuzz", Duration::from_secs(5)).unwrap(), b"still serving");
    let waiter = std::thread::spawn(move || b.wait_at_barrier("after-fuzz", Duration::from_secs(10), &[]));
    a.wait_at_barrier("after-fuzz", Duration::from_secs(10), &[]).unwrap();
    waiter.join().unwrap().unwrap();
    assert!(failures.lock().unwrap().is_empty(), "{:?}", failures.lock().unwrap());
}

#[test]
fn sixteen_clients_times_250_key_value_operations_lose_nothing() {
    use crate::common::key_value_load::{connect_all, run};
    const CLIENTS: usize = 16;
    const OPS: usize = 250;
    let coordinator = start(CLIENTS);
    let clients: Vec<Arc<CoordinationClient>> = (0..CLIENTS)
        .map(|r| Arc::new(CoordinationClient::new(options(&coordinator, r as i32, CLIENTS), recorder().0).unwrap()))
        .collect();
    connect_all(&clients);
    let seconds = run(&clients, "stress", OPS).as_secs_f64();
    let entries = clients[0].key_value_dir_get("stress").unwrap();
    assert_eq!(entries.len(), CLIENTS * OPS / 2);
    for (key, value) in &entries {
        let parts: Vec<&str> = key.split('/').collect();
        assert_eq!(value, format!("{}:{}", parts[1], parts[2]).as_bytes());
    }
    assert_eq!(clients[3].key_value_try_get("stress_count").unwrap().as_deref(), Some(b"16".as_slice()));
    println!(
        "{} key-value operations from {CLIENTS} clients in {seconds:.2} s: {:.0} ops/s",
        CLIENTS * OPS,
        (CLIENTS * OPS) as f64 / seconds
    );
}
