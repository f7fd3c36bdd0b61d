//! Issue 25, network and cluster runtime: names that would move a bearer token to another host
//! are refused before any request; every wait on the network has a printed, honoured deadline;
//! a malformed coordinator address is refused at once; every count has an upper bound; and
//! `GPUS_PER_NODE` is checked against the devices present. Loopback only; each former hang runs
//! under a deadline, so that the test fails instead of hanging.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use maxrs::cluster::launch::{free_port, launch, LaunchOptions};
use maxrs::net::credentials::AccessToken;
use maxrs::net::retry::RetryPolicy;
use maxrs::submit::vertex_api::{JobRef, VertexApi};

use crate::submit::common::{maxrs as submit_maxrs, with_seed, IMAGE, VERTEX_2_NODES};
use crate::submit::http::{FakeServer, Reply};

const MAXRS: &str = env!("CARGO_BIN_EXE_maxrs");

/// What a run of the binary left.
struct Ran {
    ok: bool,
    stdout: String,
    stderr: String,
    took: Duration,
}

/// Runs `maxrs args` with `env`; kills it and fails the test if it still runs after `deadline`.
fn run(args: &[&str], env: &[(&str, &str)], deadline: Duration) -> Ran {
    let dir = tempfile::tempdir().unwrap();
    let (out, err) = (dir.path().join("out"), dir.path().join("err"));
    let mut cmd = Command::new(MAXRS);
    cmd.args(args).env_remove("MAXRS_PJRT_PLUGIN").env("RUST_LOG", "warn");
    for var in ["JAX_COORDINATOR_ADDRESS", "JAX_COORDINATOR_IP", "JAX_COORDINATOR_PORT", "NNODES", "NODE_RANK"] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let start = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{args:?} still ran after {deadline:?}: {}", std::fs::read_to_string(&err).unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap();
    Ran { ok: status.success(), stdout: read(&out), stderr: read(&err), took: start.elapsed() }
}

/// The one `error:` line of a run that must fail (no panic, no signal death).
fn one_error(ran: &Ran, what: &str) -> String {
    assert!(!ran.ok, "{what} must fail:\n{}\n{}", ran.stdout, ran.stderr);
    assert!(!ran.stderr.contains("panicked"), "{what} panicked:\n{}", ran.stderr);
    let errors: Vec<&str> = ran.stderr.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 1, "{what}: one error line expected:\n{}", ran.stderr);
    errors[0].to_string()
}

/// A command refused within 10 s: its error line.
fn refused(args: &[&str], env: &[(&str, &str)]) -> String {
    one_error(&run(args, env, Duration::from_secs(10)), &format!("{args:?}"))
}

/// An HTTP proxy on loopback that records the first line (`CONNECT host:443 ...`) of every
/// connection and closes it: where a request would have gone.
fn recording_proxy() -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut line = String::new();
            let _ = BufReader::new(stream).read_line(&mut line);
            record.lock().unwrap().push(line.trim().to_string());
        }
    });
    (url, seen)
}

#[test]
fn a_region_or_project_that_would_move_the_token_is_refused_before_any_request() {
    let home = tempfile::tempdir().unwrap();
    let (proxy, seen) = recording_proxy();
    let token = "ya29.secret-token-for-the-test";
    let env = [
        ("GOOGLE_OAUTH_ACCESS_TOKEN", token),
        ("HTTPS_PROXY", proxy.as_str()),
        ("HTTP_PROXY", proxy.as_str()),
        ("ALL_PROXY", proxy.as_str()),
    ];
    let vertex = |flags: &[&'static str]| {
        let mut args = vec!["submit", "vertex", "--nodes", "2", "--image", IMAGE];
        args.extend_from_slice(flags);
        args
    };
    let settings = home.path().join("submit.yml");
    std::fs::write(&settings, "submit:\n  project: my-project\n  region: evil.example.com/x?\n").unwrap();
    let settings_arg = settings.to_str().unwrap();
    let cases: Vec<(Vec<&str>, String)> = vec![
        (
            vertex(&["--project", "my-project", "--region", "evil.example.com/x?"]),
            "error: --region \"evil.example.com/x?\" is not a Google Cloud region".into(),
        ),
        (
            vertex(&["--project", "", "--region", "us-central1"]),
            "error: --project \"\" is not a Google Cloud project".into(),
        ),
        (
            vertex(&["--project", "../../evil", "--region", "us-central1"]),
            "error: --project \"../../evil\" is not a Google Cloud project".into(),
        ),
        (
            vec!["submit", "vertex", "--nodes", "2", "--image", IMAGE, "--submit-config", settings_arg],
            format!("error: {settings_arg}: `region:` \"evil.example.com/x?\" is not a Google Cloud region"),
        ),
        (
            vec!["submit", "vertex", "--status", "42", "--project", "my-project", "--region", "a.b/c?"],
            "error: --region \"a.b/c?\" is not a Google Cloud region".into(),
        ),
        (
            vec!["submit", "vertex", "--logs", "projects/my-project/locations/evil.com?/customJobs/42"],
            "error: the region of job \"projects/my-project/locations/evil.com?/customJobs/42\": \"evil.com?\" is not a \
             Google Cloud region"
                .into(),
        ),
    ];
    for (args, expected) in cases {
        let run = submit_maxrs(&with_seed(&args), home.path(), &env);
        assert!(!run.ok, "{args:?} must fail:\n{}", run.all());
        let errors: Vec<&str> = run.stderr.lines().filter(|l| l.starts_with("error: ")).collect();
        assert_eq!(errors.len(), 1, "{args:?}:\n{}", run.stderr);
        assert!(errors[0].starts_with(&expected), "{args:?}: expected {expected:?}, got {:?}", errors[0]);
        assert!(!run.all().contains(token), "the token was printed:\n{}", run.all());
    }
    assert_eq!(*seen.lock().unwrap(), Vec::<String>::new(), "a request left for another host");

    // A valid region still makes the endpoint maxrs derives, built from escaped segments.
    let mut args = VERTEX_2_NODES.to_vec();
    args.push("--dry-run");
    let run = submit_maxrs(&with_seed(&args), home.path(), &[]);
    assert!(run.ok, "{}", run.all());
    let url = "https://us-central1-aiplatform.googleapis.com/v1/projects/my-project/locations/us-central1/customJobs";
    assert!(run.stderr.contains(&format!("POST to {url}\n")), "{}", run.stderr);
}

#[test]
fn gcs_locations_with_invalid_bucket_names_are_refused() {
    for (location, bucket) in
        [("gs://evil.com:443/run", "evil.com:443"), ("gs://Bucket/run", "Bucket"), ("gs://b?x=/run", "b?x=")]
    {
        let e = refused(&["train", &format!("base_output_directory={location}")], &[]);
        assert!(e.contains(&format!("{bucket:?} is not a Cloud Storage bucket name")), "{location}: {e}");
    }
}

#[test]
fn a_standalone_coordinator_gives_up_at_its_registration_deadline() {
    let port = free_port().unwrap().to_string();
    let args = ["coordinator", "--port", &port, "--num-processes", "2", "jax_distributed_initialization_timeout=2"];
    let ran = run(&args, &[], Duration::from_secs(15));
    let e = one_error(&ran, "a coordinator nobody registers with");
    assert!(ran.stdout.contains("waiting up to 2 s for all of them to register"), "{}", ran.stdout);
    assert!(
        e.contains("registration timed out after 2 s (jax_distributed_initialization_timeout)")
            && e.contains("processes 0, 1 of 2 never registered"),
        "{e}"
    );
    assert!(ran.took >= Duration::from_secs(2) && ran.took < Duration::from_secs(8), "took {:?}", ran.took);
}

#[test]
fn a_malformed_coordinator_address_is_refused_at_once() {
    // The default registration timeout is 300 s: a refusal within 10 s is not a timeout.
    for (var, value) in [
        ("JAX_COORDINATOR_ADDRESS", "garbage!!"),
        ("JAX_COORDINATOR_ADDRESS", "10.0.0.2:http"),
        ("JAX_COORDINATOR_ADDRESS", "10.0.0.2:0"),
        ("JAX_COORDINATOR_IP", "a/b"),
    ] {
        let e = refused(&["cluster-check"], &[(var, value), ("NNODES", "2"), ("NODE_RANK", "1")]);
        assert!(e.starts_with(&format!("error: {var}={value:?}: expected HOST:PORT")), "{e}");
    }
    let e = refused(&["cluster-check", "coordinator_address=garbage!!", "num_processes=2", "process_id=1"], &[]);
    assert!(e.starts_with("error: coordinator_address=\"garbage!!\": expected HOST:PORT"), "{e}");
    let e = refused(&["cluster-check"], &[("MASTER_ADDR", "h0"), ("MASTER_PORT", "99999")]);
    assert!(e.starts_with("error: MASTER_PORT=\"99999\": expected a port number from 1 to 65535"), "{e}");
}

#[test]
fn an_unreachable_coordinator_fails_at_the_printed_deadline() {
    // A closed loopback port: nobody listens there.
    let address = format!("127.0.0.1:{}", free_port().unwrap());
    let env = [("JAX_COORDINATOR_ADDRESS", address.as_str()), ("NNODES", "2"), ("NODE_RANK", "1")];
    let ran = run(&["cluster-check", "jax_distributed_initialization_timeout=2"], &env, Duration::from_secs(15));
    let e = one_error(&ran, "a process whose coordinator is not there");
    let waiting = format!(
        "cluster: waiting up to 2 s for all 2 processes to register with the coordinator at {address} \
         (jax_distributed_initialization_timeout)"
    );
    assert_eq!(ran.stdout.matches(&waiting).count(), 1, "{}", ran.stdout);
    assert!(
        e.starts_with(&format!(
            "error: process 1: registration with the coordinator at {address} did not complete within 2 s"
        )),
        "{e}"
    );
    assert!(ran.took >= Duration::from_secs(2) && ran.took < Duration::from_secs(6), "took {:?}", ran.took);
}

#[test]
fn counts_from_the_user_have_upper_bounds() {
    for (args, env, expected) in [
        (vec!["launch", "--num-processes", "100000", "--", "devices"], vec![], "--num-processes 100000: give 1 to 256"),
        (vec!["launch", "--num-processes", "0", "--", "devices"], vec![], "--num-processes 0: give 1 to 256"),
        (
            vec!["launch", "--num-processes", "2", "--gpus-per-process", "18446744073709551615", "--", "devices"],
            vec![],
            "--gpus-per-process 18446744073709551615: give 1 or more, at most 64 GPUs in all",
        ),
        (
            vec!["launch", "--num-processes", "2", "--coordinator-port", "0", "--", "devices"],
            vec![],
            "--coordinator-port 0: give a port from 1 to 65535",
        ),
        (vec!["coordinator", "--port", "1", "--num-processes", "0"], vec![], "--num-processes 0: give 1 to 1048576"),
        (
            vec!["coordinator", "--port", "1", "--num-processes", "2000000"],
            vec![],
            "--num-processes 2000000: give 1 to 1048576",
        ),
        (vec!["cluster-check", "--hold-seconds", "inf"], vec![], "--hold-seconds inf: give 0 to 31536000 seconds"),
        (vec!["cluster-check", "--hold-seconds=-1"], vec![], "--hold-seconds -1.0: give 0 to"),
        (
            vec!["cluster-check", "--max-mib", "1e30"],
            vec![],
            "--max-mib 1e30: give a size above 0 and at most 8192 MiB",
        ),
        (vec!["cluster-check", "--iterations", "0"], vec![], "--iterations 0: give 1 to 10000"),
        (
            vec!["cluster-check"],
            vec![("NNODES", "99999999999")],
            "NNODES=\"99999999999\": expected a number of processes from 0 to 1048576",
        ),
        (vec!["cluster-check"], vec![("GPUS_PER_NODE", "100000")], "GPUS_PER_NODE=\"100000\": expected a number"),
    ] {
        let e = refused(&args, &env);
        assert!(e.starts_with(&format!("error: {expected}")), "{args:?}: {e}");
    }
    let home = tempfile::tempdir().unwrap();
    let args = ["submit", "vertex", "--nodes", "99999999", "--image", IMAGE, "--project", "my-project", "--dry-run"];
    let run = submit_maxrs(&with_seed(&args), home.path(), &[]);
    assert!(!run.ok && run.stderr.contains("error: --nodes 99999999: give 1 to 1048576 machines"), "{}", run.all());
    let run = submit_maxrs(&["submit", "vertex", "--logs", "42", "--limit", "0"], home.path(), &[]);
    assert!(!run.ok && run.stderr.contains("error: --limit 0: give 1 to 100000 log lines"), "{}", run.all());
}

#[test]
fn a_rank_that_cannot_start_is_an_error_not_a_panic() {
    let options = LaunchOptions {
        num_processes: 2,
        coordinator_port: None,
        gpus_per_process: None,
        program: "/nonexistent/maxrs".into(),
        args: vec!["devices".into()],
    };
    let e = format!("{:#}", launch(&options).unwrap_err());
    assert!(e.starts_with("starting rank 0: /nonexistent/maxrs"), "{e}");
}

#[test]
fn log_paging_stops_at_its_bound() {
    // A server that always has one more (empty) page.
    let server = FakeServer::start(|_, _| Reply::json(200, r#"{"entries": [], "nextPageToken": "more"}"#));
    let http = reqwest::blocking::Client::builder().no_proxy().build().unwrap();
    let api =
        VertexApi::with_endpoints(http, AccessToken::new("t".into()), &server.url, &server.url, RetryPolicy::default())
            .unwrap();
    let job = JobRef::parse("42", Some("my-project"), Some("us-central1")).unwrap();
    let start = Instant::now();
    assert!(api.logs(&job, 10).unwrap().is_empty());
    assert_eq!(server.requests().len(), 200);
    assert!(start.elapsed() < Duration::from_secs(30), "took {:?}", start.elapsed());
}

#[test]
fn gpus_per_node_is_checked_against_the_devices_present() {
    // The multi-host guide: GPUS_PER_NODE is "the devices each process must see (checked)".
    let e = refused(&["train", "steps=1"], &[("GPUS_PER_NODE", "8")]);
    assert!(
        e.starts_with("error: GPUS_PER_NODE=8, but process 0 has 1 device (the CPU plugin with cpu_device_count=1)"),
        "{e}"
    );
    let e = refused(&["cluster-check", "cpu_device_count=2"], &[("GPUS_PER_NODE", "4")]);
    assert!(e.starts_with("error: GPUS_PER_NODE=4, but process 0 has 2 devices"), "{e}");
    let args = ["cluster-check", "--max-mib", "0.0625", "--iterations", "1", "cpu_device_count=2"];
    let ran = run(&args, &[("GPUS_PER_NODE", "2")], Duration::from_secs(120));
    assert!(ran.ok && ran.stdout.contains("cluster-check: OK"), "{}\n{}", ran.stdout, ran.stderr);
}
