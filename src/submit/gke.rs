//! The GKE JobSet manifest for a [`Job`] (`jobset.x-k8s.io/v1alpha2`): one replicated job of N
//! indexed pods, one per A3 Mega node with all 8 GPUs. JobSet creates the headless Service
//! (`spec.network.enableDNSHostnames`), so pod `i` is reachable as
//! `<name>-workers-0-<i>.<name>`; pod 0 hosts the coordinator, and each pod's rank is its Job
//! completion index (kubernetes-sigs/jobset `api/jobset/v1alpha2/jobset_types.go` at 0336a8fd).
//!
//! The environment follows xpk's GPU JobSets (AI-Hypercomputer/xpk `src/xpk/core/docker_resources.py`
//! at 04bad80d: `JAX_COORDINATOR_ADDRESS`, `JAX_COORDINATOR_PORT=6002`, `NNODES`, `NODE_RANK` from the
//! completion index, `GPUS_PER_NODE`), and the GPUDirect-TCPXO pieces follow xpk's
//! `tcpxo_decorator.py` (at 01706daf): the RxDM daemon beside the trainer (here a native sidecar, so
//! that the pod completes when maxrs exits), its device annotation, the multi-network interfaces,
//! the host library and aperture-device volumes.
//! `kubectl apply -f -` submits it with `--apply`.

use anyhow::{anyhow, bail, Result};
use serde_yaml::{Mapping, Value};

use super::{run_tool, shown_value, Job, TOOL_TIMEOUT};

/// The replicated job's name: pods are `<jobset>-workers-0-<index>`.
pub const REPLICATED_JOB: &str = "workers";
/// xpk's JAX coordinator port on GPU JobSets.
pub const COORDINATOR_PORT: u16 = 6002;
/// The GPUDirect-TCPXO receive-datapath manager xpk deploys (its `rxdm` version at 01706daf).
pub const RXDM_IMAGE: &str = "us-docker.pkg.dev/gce-ai-infra/gpudirect-tcpxo/tcpgpudmarxd-dev:v1.0.12";
/// GKE's example multi-network names: the default VPC on eth0, `vpc1`..`vpc8` on eth1..eth8.
pub fn default_networks() -> Vec<String> {
    (1..=8).map(|i| format!("vpc{i}")).collect()
}

#[derive(Clone, Debug, Default)]
pub struct GkeOptions {
    pub namespace: Option<String>,
    /// Kueue LocalQueue.
    pub queue: Option<String>,
    /// GKE Network objects for eth1..eth8; empty: [`default_networks`].
    pub networks: Vec<String>,
}

/// The host name of the coordinator pod (index 0).
pub fn coordinator_host(job: &Job) -> String {
    format!("{0}-{REPLICATED_JOB}-0-0.{0}", job.name)
}

/// The manifest as applied.
pub fn manifest(job: &Job, opts: &GkeOptions) -> Result<String> {
    render(job, opts, false)
}

/// The manifest as printed: secret environment values replaced by `<redacted>`.
pub fn display_manifest(job: &Job, opts: &GkeOptions) -> Result<String> {
    render(job, opts, true)
}

fn render(job: &Job, opts: &GkeOptions, redact: bool) -> Result<String> {
    let value = jobset(job, opts, redact)?;
    let yaml = serde_yaml::to_string(&value).map_err(|e| anyhow!("cannot write the manifest: {e}"))?;
    Ok(format!("# maxrs submit gke: {}\n{yaml}", job.summary))
}

fn jobset(job: &Job, opts: &GkeOptions, redact: bool) -> Result<Value> {
    let image = job.require_image("GKE")?;
    let networks = if opts.networks.is_empty() { default_networks() } else { opts.networks.clone() };
    if networks.len() != 8 {
        bail!("GPUDirect-TCPXO uses 8 GPU NICs (eth1..eth8): give 8 GKE networks, got {}", networks.len());
    }
    let gpus = job.machine.gpus_per_node;

    let cluster = vec![
        ("JAX_COORDINATOR_ADDRESS".to_string(), coordinator_host(job)),
        ("JAX_COORDINATOR_PORT".to_string(), COORDINATOR_PORT.to_string()),
        ("NNODES".to_string(), job.nodes.to_string()),
        ("GPUS_PER_NODE".to_string(), gpus.to_string()),
    ];
    let mut env: Vec<Value> = Vec::new();
    for (name, value) in job.env(job.machine.container_env(), cluster) {
        let value = if redact { shown_value(&name, &value).to_string() } else { value };
        env.push(map([("name", s(&name)), ("value", s(&value))]));
        if name == "NNODES" {
            // The rank: the pod's completion index in its indexed Job.
            let field = "metadata.annotations['batch.kubernetes.io/job-completion-index']";
            env.push(map([
                ("name", s("NODE_RANK")),
                ("valueFrom", map([("fieldRef", map([("fieldPath", s(field))]))])),
            ]));
        }
    }

    let device_paths: String = (0..gpus)
        .map(|i| format!("/dev/nvidia{i}"))
        .chain(["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/dmabuf_import_helper"].map(String::from))
        .map(|p| format!("- path: {p}\n"))
        .collect();
    let interfaces: Vec<String> = std::iter::once("default".to_string())
        .chain(networks)
        .enumerate()
        .map(|(i, n)| format!(r#"{{"interfaceName":"eth{i}","network":"{n}"}}"#))
        .collect();
    let annotations = map([
        ("devices.gke.io/container.tcpxo-daemon", s(&device_paths)),
        ("networking.gke.io/default-interface", s("eth0")),
        ("networking.gke.io/interfaces", s(&format!("[{}]", interfaces.join(",")))),
    ]);

    let host_path = |name: &str, path: &str| map([("name", s(name)), ("hostPath", map([("path", s(path))]))]);
    let mount = |name: &str, path: &str| map([("name", s(name)), ("mountPath", s(path))]);
    let volumes = seq([
        host_path("libraries", "/home/kubernetes/bin/nvidia"),
        host_path("sys", "/sys"),
        host_path("proc-sys", "/proc/sys"),
        host_path("aperture-devices", "/dev/aperture_devices"),
        map([("name", s("dshm")), ("emptyDir", map([("medium", s("Memory"))]))]),
    ]);
    let rxdm = map([
        ("name", s("tcpxo-daemon")),
        ("image", s(RXDM_IMAGE)),
        ("restartPolicy", s("Always")),
        ("command", seq([s("/bin/sh"), s("-c")])),
        (
            "args",
            seq([s("set -ex\nchmod 755 /fts/entrypoint_rxdm_container.sh\n\
                    /fts/entrypoint_rxdm_container.sh --num_hops=2 --num_nics=8 --uid= --alsologtostderr\n")]),
        ),
        ("securityContext", map([("capabilities", map([("add", seq([s("NET_ADMIN"), s("NET_BIND_SERVICE")]))]))])),
        (
            "volumeMounts",
            seq([
                mount("libraries", "/usr/local/nvidia"),
                mount("sys", "/hostsysfs"),
                mount("proc-sys", "/hostprocsysfs"),
            ]),
        ),
        ("env", seq([map([("name", s("LD_LIBRARY_PATH")), ("value", s("/usr/local/nvidia/lib64"))])])),
    ]);
    let trainer = map([
        ("name", s("maxrs")),
        ("image", s(image)),
        ("command", seq([s(&job.program)])),
        ("args", Value::Sequence(job.args.iter().map(|a| s(a)).collect())),
        ("ports", seq([map([("containerPort", Value::from(COORDINATOR_PORT))])])),
        // A quantity is a string in the Kubernetes API.
        ("resources", map([("limits", map([("nvidia.com/gpu", s(&gpus.to_string()))]))])),
        ("env", Value::Sequence(env)),
        (
            "volumeMounts",
            seq([
                mount("aperture-devices", "/dev/aperture_devices"),
                mount("libraries", "/usr/local/nvidia"),
                mount("dshm", "/dev/shm"),
            ]),
        ),
    ]);
    let pod_spec = map([
        ("restartPolicy", s("Never")),
        ("nodeSelector", map([("cloud.google.com/gke-accelerator", s(job.machine.gke_accelerator))])),
        (
            "tolerations",
            seq([map([("key", s("nvidia.com/gpu")), ("operator", s("Exists")), ("effect", s("NoSchedule"))])]),
        ),
        ("volumes", volumes),
        ("initContainers", seq([rxdm])),
        ("containers", seq([trainer])),
    ]);
    let job_spec = map([
        ("parallelism", Value::from(job.nodes as u64)),
        ("completions", Value::from(job.nodes as u64)),
        ("completionMode", s("Indexed")),
        ("backoffLimit", Value::from(0)),
        ("template", map([("metadata", map([("annotations", annotations)])), ("spec", pod_spec)])),
    ]);

    let mut metadata = vec![("name", s(&job.name))];
    if let Some(ns) = &opts.namespace {
        metadata.push(("namespace", s(ns)));
    }
    if let Some(q) = &opts.queue {
        metadata.push(("labels", map([("kueue.x-k8s.io/queue-name", s(q))])));
    }
    Ok(map([
        ("apiVersion", s("jobset.x-k8s.io/v1alpha2")),
        ("kind", s("JobSet")),
        ("metadata", map(metadata)),
        (
            "spec",
            map([
                // One failed process fails the run: the others cannot go on without it.
                ("failurePolicy", map([("maxRestarts", Value::from(0))])),
                (
                    "network",
                    map([
                        ("enableDNSHostnames", Value::Bool(true)),
                        ("subdomain", s(&job.name)),
                        ("publishNotReadyAddresses", Value::Bool(true)),
                    ]),
                ),
                (
                    "replicatedJobs",
                    seq([map([
                        ("name", s(REPLICATED_JOB)),
                        ("replicas", Value::from(1)),
                        ("template", map([("spec", job_spec)])),
                    ])]),
                ),
            ]),
        ),
    ]))
}

/// Applies `manifest` with `kubectl apply -f -` (within [`TOOL_TIMEOUT`]); kubectl's own report.
pub fn apply(manifest: &str) -> Result<String> {
    let out = run_tool(
        "kubectl",
        &["apply", "-f", "-"],
        manifest,
        TOOL_TIMEOUT,
        "install it (and `gcloud container clusters get-credentials CLUSTER`), or save the manifest \
         (maxrs submit gke ... > jobset.yaml) and run `kubectl apply -f jobset.yaml`",
    )?;
    if !out.status.success() {
        bail!("kubectl apply failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn s(text: &str) -> Value {
    Value::String(text.to_string())
}

fn map<'a>(pairs: impl IntoIterator<Item = (&'a str, Value)>) -> Value {
    Value::Mapping(pairs.into_iter().map(|(k, v)| (s(k), v)).collect::<Mapping>())
}

fn seq(items: impl IntoIterator<Item = Value>) -> Value {
    Value::Sequence(items.into_iter().collect())
}
