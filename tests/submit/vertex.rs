//! Vertex AI: the custom job body, the REST calls against a loopback server (body, headers,
//! token; success, 403, 429 with retry, 500), Application Default Credentials through gcp_auth,
//! `--status`, `--logs`, and the `--dry-run` output.

use std::time::{Duration, Instant};

use maxrs::net::credentials::AccessToken;
use maxrs::net::retry::RetryPolicy;
use maxrs::submit::vertex::{custom_job, CustomJob, VertexOptions};
use maxrs::submit::vertex_api::{JobRef, VertexApi};
use serde_json::Value;

use super::common::{maxrs, seed_job, with_seed, IMAGE, VERTEX_2_NODES};
use super::http::{FakeServer, Reply};

const CREATED: &str = r#"{"name": "projects/123456/locations/us-central1/customJobs/4567", "displayName": "maxrs-llama2-7b", "state": "JOB_STATE_PENDING", "createTime": "2026-11-23T10:00:00Z"}"#;

fn seed_custom_job() -> CustomJob {
    let job = seed_job();
    let opts = VertexOptions { project: "my-project".into(), region: "us-central1".into(), ..Default::default() };
    custom_job(&job, &opts).unwrap()
}

fn api(server: &FakeServer, retry: RetryPolicy) -> VertexApi {
    let http = reqwest::blocking::Client::builder().no_proxy().build().unwrap();
    VertexApi::with_endpoints(http, AccessToken::new("test-token-123".into()), &server.url, &server.url, retry).unwrap()
}

fn quick_retry() -> RetryPolicy {
    RetryPolicy {
        attempts: 3,
        base_delay: Duration::from_millis(10),
        max_delay: Duration::from_millis(50),
        ..RetryPolicy::default()
    }
}

/// What the Vertex AI reference requires of a CustomJob, checked on the JSON as sent.
fn check_custom_job_shape(body: &Value, nodes: u64) {
    assert!(body["displayName"].as_str().is_some_and(|s| !s.is_empty()), "{body}");
    let pools = body["jobSpec"]["workerPoolSpecs"].as_array().expect("workerPoolSpecs");
    assert_eq!(pools[0]["replicaCount"], "1", "worker pool 0 is the single primary replica");
    let replicas: u64 = pools.iter().map(|p| p["replicaCount"].as_str().unwrap().parse::<u64>().unwrap()).sum();
    assert_eq!(replicas, nodes);
    for pool in pools {
        assert_eq!(pool["machineSpec"]["machineType"], "a3-megagpu-8g");
        assert_eq!(pool["machineSpec"]["acceleratorType"], "NVIDIA_H100_MEGA_80GB");
        assert_eq!(pool["machineSpec"]["acceleratorCount"], 8);
        assert_eq!(pool["containerSpec"]["imageUri"], IMAGE);
        let env = pool["containerSpec"]["env"].as_array().unwrap();
        let get = |name: &str| env.iter().find(|e| e["name"] == name).map(|e| e["value"].as_str().unwrap().to_string());
        // Vertex AI's CLUSTER_SPEC describes the cluster; an A3-recipe variable would take precedence over it.
        for name in ["NNODES", "NODE_RANK", "JAX_COORDINATOR_ADDRESS", "JAX_COORDINATOR_PORT"] {
            assert_eq!(get(name), None, "{name}");
        }
        assert_eq!(get("NCCL_FASTRAK_IFNAME").as_deref(), Some("eth1,eth2,eth3,eth4,eth5,eth6,eth7,eth8"));
        assert!(get("XLA_FLAGS").unwrap().contains("--xla_gpu_all_reduce_combine_threshold_bytes=67108864"));
        let args = pool["containerSpec"]["args"].as_array().unwrap();
        assert_eq!(args[0], "train");
        assert!(args.iter().any(|a| a == "dcn_data_parallelism=2"));
    }
}

#[test]
fn create_sends_the_body_with_json_headers_and_the_token() {
    let server = FakeServer::start(|_, _| Reply::json(200, CREATED));
    let job = seed_custom_job();
    let info = api(&server, quick_retry()).create_custom_job("my-project", "us-central1", &job).unwrap();
    assert_eq!((info.id(), info.state.as_str()), ("4567", "JOB_STATE_PENDING"));

    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    let r = &requests[0];
    assert_eq!(r.method, "POST");
    assert_eq!(r.path, "/v1/projects/my-project/locations/us-central1/customJobs");
    assert_eq!(r.header("authorization"), Some("Bearer test-token-123"));
    assert!(r.header("content-type").unwrap().starts_with("application/json"), "{:?}", r.headers);
    let body: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(body, serde_json::to_value(&job).unwrap());
    check_custom_job_shape(&body, 2);
}

#[test]
fn a_403_is_an_error_with_the_apis_message() {
    let server = FakeServer::start(|_, _| {
        Reply::google_error(403, "PERMISSION_DENIED", "Permission 'aiplatform.customJobs.create' denied on resource")
    });
    let e = api(&server, quick_retry()).create_custom_job("my-project", "us-central1", &seed_custom_job()).unwrap_err();
    let e = e.to_string();
    assert!(e.contains("HTTP 403 PERMISSION_DENIED: Permission 'aiplatform.customJobs.create' denied"), "{e}");
    assert!(e.contains("roles/aiplatform.user"), "{e}");
    assert!(!e.contains("test-token-123"), "{e}");
    assert_eq!(server.requests().len(), 1, "a 403 is not retried");
}

#[test]
fn a_429_is_retried_after_the_wait_the_api_asks_for() {
    let server = FakeServer::start(|n, _| {
        if n == 0 {
            let mut r = Reply::google_error(429, "RESOURCE_EXHAUSTED", "Quota exceeded for CustomJob create requests");
            r.headers.push(("Retry-After", "0".into()));
            r
        } else {
            Reply::json(200, CREATED)
        }
    });
    // A backoff of 3 s would show: the answer's Retry-After (0) must be the wait.
    let slow = RetryPolicy {
        attempts: 3,
        base_delay: Duration::from_secs(3),
        max_delay: Duration::from_secs(3),
        ..RetryPolicy::default()
    };
    let start = Instant::now();
    let info = api(&server, slow).create_custom_job("my-project", "us-central1", &seed_custom_job()).unwrap();
    assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
    assert_eq!(info.id(), "4567");
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].body, requests[1].body);
    assert_eq!(requests[1].header("authorization"), Some("Bearer test-token-123"));
}

#[test]
fn a_429_that_persists_fails_after_the_last_attempt() {
    let server = FakeServer::start(|_, _| Reply::google_error(429, "RESOURCE_EXHAUSTED", "Quota exceeded"));
    let e = api(&server, quick_retry()).create_custom_job("my-project", "us-central1", &seed_custom_job()).unwrap_err();
    assert!(e.to_string().contains("still refused after 3 attempts"), "{e}");
    assert_eq!(server.requests().len(), 3);
}

#[test]
fn a_500_on_create_is_not_retried_because_the_job_may_exist() {
    let server = FakeServer::start(|_, _| Reply::google_error(500, "INTERNAL", "Internal error encountered."));
    let e = api(&server, quick_retry()).create_custom_job("my-project", "us-central1", &seed_custom_job()).unwrap_err();
    let e = e.to_string();
    assert!(
        e.contains("HTTP 500 INTERNAL: Internal error encountered.") && e.contains("may or may not have been created"),
        "{e}"
    );
    assert_eq!(server.requests().len(), 1);
}

#[test]
fn reads_retry_server_errors_and_follow_log_pages() {
    let server = FakeServer::start(|n, r| match (n, r.path.as_str()) {
        (0, _) => Reply::google_error(500, "INTERNAL", "try again"),
        (1, _) => Reply::json(
            200,
            r#"{"name": "projects/123456/locations/us-central1/customJobs/4567", "state": "JOB_STATE_RUNNING"}"#,
        ),
        (_, "/v2/entries:list") if !r.body.contains("pageToken") => Reply::json(
            200,
            r#"{"entries": [{"timestamp": "t1", "textPayload": "completed step: 0", "labels": {"ml.googleapis.com/task_name": "workerpool0-0"}}], "nextPageToken": "p2"}"#,
        ),
        _ => Reply::json(200, r#"{"entries": [{"timestamp": "t2", "jsonPayload": {"message": "completed step: 1"}}]}"#),
    });
    let api = api(&server, quick_retry());
    let job = JobRef::parse("4567", Some("my-project"), Some("us-central1")).unwrap();
    assert_eq!(api.get_custom_job(&job).unwrap().state, "JOB_STATE_RUNNING");
    let lines = api.logs(&job, 100).unwrap();
    assert_eq!(
        lines.iter().map(|l| l.message.as_str()).collect::<Vec<_>>(),
        ["completed step: 0", "completed step: 1"]
    );
    assert_eq!(lines[0].task, "workerpool0-0");

    let requests = server.requests();
    assert_eq!(requests[1].method, "GET");
    assert_eq!(requests[1].path, "/v1/projects/my-project/locations/us-central1/customJobs/4567");
    let list: Value = serde_json::from_str(&requests[2].body).unwrap();
    assert_eq!(list["resourceNames"][0], "projects/my-project");
    assert_eq!(list["filter"], r#"resource.type="ml_job" AND resource.labels.job_id="4567""#);
    assert_eq!(serde_json::from_str::<Value>(&requests[3].body).unwrap()["pageToken"], "p2");
}

#[test]
fn the_cli_submits_with_the_token_and_never_prints_it() {
    let home = tempfile::tempdir().unwrap();
    let server = FakeServer::start(|_, _| Reply::json(200, CREATED));
    let token = "ya29.secret-token-never-shown";
    let env =
        [("GOOGLE_OAUTH_ACCESS_TOKEN", token), ("CLOUDSDK_API_ENDPOINT_OVERRIDES_AIPLATFORM", server.url.as_str())];
    let args = with_seed(VERTEX_2_NODES);
    let run = maxrs(&args, home.path(), &env);
    assert!(run.ok, "{}", run.all());
    assert!(
        run.stdout.contains(
            "submitted maxrs-llama2-7b: projects/123456/locations/us-central1/customJobs/4567 (JOB_STATE_PENDING)"
        ),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("maxrs submit vertex --status 4567 --project my-project --region us-central1"),
        "{}",
        run.stdout
    );
    assert!(!run.all().contains(token));
    let requests = server.requests();
    assert_eq!(requests[0].header("authorization"), Some(format!("Bearer {token}").as_str()));
    check_custom_job_shape(&serde_json::from_str(&requests[0].body).unwrap(), 2);

    let denied = FakeServer::start(|_, _| {
        Reply::google_error(403, "PERMISSION_DENIED", "Vertex AI API has not been used in project my-project")
    });
    let env =
        [("GOOGLE_OAUTH_ACCESS_TOKEN", token), ("CLOUDSDK_API_ENDPOINT_OVERRIDES_AIPLATFORM", denied.url.as_str())];
    let run = maxrs(&args, home.path(), &env);
    assert!(!run.ok);
    assert!(run.stderr.contains("Vertex AI API has not been used in project my-project"), "{}", run.stderr);
    assert!(!run.all().contains(token));
}

#[test]
fn status_and_logs_from_the_cli() {
    let home = tempfile::tempdir().unwrap();
    let server = FakeServer::start(|_, r| {
        if r.path.starts_with("/v1/") {
            Reply::json(
                200,
                r#"{"name": "projects/123456/locations/us-central1/customJobs/4567", "displayName": "maxrs-llama2-7b", "state": "JOB_STATE_FAILED", "error": {"code": 3, "message": "replica workerpool1-0 exited with a non-zero status of 1"}}"#,
            )
        } else {
            Reply::json(
                200,
                r#"{"entries": [{"timestamp": "2026-11-23T10:05:00Z", "textPayload": "completed step: 12, loss: 4.0", "labels": {"ml.googleapis.com/task_name": "workerpool0-0"}}]}"#,
            )
        }
    });
    let env = [
        ("GOOGLE_OAUTH_ACCESS_TOKEN", "tok"),
        ("CLOUDSDK_API_ENDPOINT_OVERRIDES_AIPLATFORM", server.url.as_str()),
        ("CLOUDSDK_API_ENDPOINT_OVERRIDES_LOGGING", server.url.as_str()),
    ];
    let run = maxrs(
        &["submit", "vertex", "--status", "projects/my-project/locations/us-central1/customJobs/4567"],
        home.path(),
        &env,
    );
    assert!(run.ok, "{}", run.all());
    assert!(run.stdout.contains("state    JOB_STATE_FAILED"), "{}", run.stdout);
    assert!(run.stdout.contains("replica workerpool1-0 exited"), "{}", run.stdout);
    let run = maxrs(
        &["submit", "vertex", "--logs", "4567", "--project", "my-project", "--region", "us-central1"],
        home.path(),
        &env,
    );
    assert!(run.ok, "{}", run.all());
    assert_eq!(run.stdout.trim(), "2026-11-23T10:05:00Z [workerpool0-0] completed step: 12, loss: 4.0");
}

#[test]
fn without_credentials_the_error_says_how_to_get_them() {
    let home = tempfile::tempdir().unwrap();
    let empty_path = home.path().join("empty-bin");
    std::fs::create_dir(&empty_path).unwrap();
    let args = with_seed(&[
        "submit",
        "vertex",
        "--nodes",
        "2",
        "--image",
        IMAGE,
        "--project",
        "my-project",
        "--region",
        "us-central1",
    ]);
    let run = maxrs(&args, home.path(), &[("PATH", empty_path.to_str().unwrap())]);
    assert!(!run.ok);
    assert!(run.stderr.contains("no Google Cloud credentials found"), "{}", run.stderr);
    assert!(run.stderr.contains("gcloud auth application-default login"), "{}", run.stderr);
    assert!(run.stderr.contains("GOOGLE_APPLICATION_CREDENTIALS (unset)"), "{}", run.stderr);

    let run = maxrs(&args, home.path(), &[("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent/key.json")]);
    assert!(!run.ok);
    assert!(run.stderr.contains("GOOGLE_APPLICATION_CREDENTIALS=/nonexistent/key.json"), "{}", run.stderr);
}

/// The service-account path of Application Default Credentials, end to end through gcp_auth: a
/// key file (a fresh RSA key from openssl) whose token endpoint is the loopback server.
#[test]
fn a_service_account_key_gets_a_token_through_gcp_auth() {
    use base64::Engine;
    let dir = tempfile::tempdir().unwrap();
    let key_pem = dir.path().join("key.pem");
    let made = std::process::Command::new("openssl")
        .args(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out"])
        .arg(&key_pem)
        .output();
    if !made.as_ref().is_ok_and(|o| o.status.success()) {
        eprintln!("skipped: openssl cannot make a test RSA key ({made:?})");
        return;
    }
    let server = FakeServer::start(|_, r| {
        if r.path == "/token" {
            let assertion = r.body.split('&').find_map(|kv| kv.strip_prefix("assertion=")).expect("a JWT assertion");
            // The form body percent-encodes the JWT's base64 padding, if any.
            let claims = assertion.split('.').nth(1).unwrap().replace("%3D", "");
            let claims: Value =
                serde_json::from_slice(&base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(claims).unwrap())
                    .unwrap();
            assert_eq!(claims["iss"], "trainer@my-project.iam.gserviceaccount.com");
            assert_eq!(claims["scope"], "https://www.googleapis.com/auth/cloud-platform");
            Reply::json(200, r#"{"access_token": "sa-access-token-1", "expires_in": 3600, "token_type": "Bearer"}"#)
        } else {
            Reply::json(200, CREATED)
        }
    });
    let key = serde_json::json!({
        "type": "service_account",
        "project_id": "my-project",
        "private_key_id": "k1",
        "private_key": std::fs::read_to_string(&key_pem).unwrap(),
        "client_email": "trainer@my-project.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": format!("{}token", server.url),
    });
    let key_file = dir.path().join("key.json");
    std::fs::write(&key_file, key.to_string()).unwrap();
    let env = [
        ("GOOGLE_APPLICATION_CREDENTIALS", key_file.to_str().unwrap()),
        ("CLOUDSDK_API_ENDPOINT_OVERRIDES_AIPLATFORM", server.url.as_str()),
    ];
    let args = with_seed(VERTEX_2_NODES);
    let run = maxrs(&args, dir.path(), &env);
    assert!(run.ok, "{}", run.all());
    let requests = server.requests();
    assert_eq!(
        requests.iter().map(|r| r.path.as_str()).collect::<Vec<_>>(),
        ["/token", "/v1/projects/my-project/locations/us-central1/customJobs"]
    );
    assert_eq!(requests[1].header("authorization"), Some("Bearer sa-access-token-1"));
    assert!(!run.all().contains("sa-access-token-1") && !run.all().contains("PRIVATE KEY"));
}

#[test]
fn dry_run_prints_the_body_and_sends_nothing() {
    let home = tempfile::tempdir().unwrap();
    let args = with_seed(&[VERTEX_2_NODES, &["--dry-run"]].concat());
    // No credentials and no endpoint: a dry run needs neither.
    let run = maxrs(&args, home.path(), &[]);
    assert!(run.ok, "{}", run.all());
    let body: Value = serde_json::from_str(&run.stdout).unwrap();
    check_custom_job_shape(&body, 2);
    assert_eq!(body, serde_json::to_value(seed_custom_job()).unwrap(), "the dry run prints what create sends");
    assert!(run.stderr.contains(
        "https://us-central1-aiplatform.googleapis.com/v1/projects/my-project/locations/us-central1/customJobs"
    ));
    insta::assert_snapshot!("vertex_dry_run_seed_2_nodes", run.stdout);
}
