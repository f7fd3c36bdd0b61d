//! GKE: the JobSet manifest parses as YAML, matches the JobSet v1alpha2 API (kubernetes-sigs/jobset
//! `api/jobset/v1alpha2/jobset_types.go` at 0336a8fd, mirrored below with unknown fields refused)
//! and, inside it, Kubernetes' own batch/v1 JobTemplateSpec (the k8s-openapi types: a field they do
//! not know would be lost in the round trip); pods find the coordinator and their rank; `--apply`
//! hands it to kubectl.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::JobTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_json::Value;

use super::common::{fake_bin, maxrs, path_with, with_seed, IMAGE};

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct JobSet {
    api_version: String,
    kind: String,
    metadata: ObjectMeta,
    spec: JobSetSpec,
}

// The mirrors list every field of the API so that valid ones are accepted; the tests read some.
#[allow(dead_code)]
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct JobSetSpec {
    replicated_jobs: Vec<ReplicatedJob>,
    network: Option<Network>,
    failure_policy: Option<FailurePolicy>,
    success_policy: Option<Value>,
    startup_policy: Option<Value>,
    suspend: Option<bool>,
    coordinator: Option<Value>,
    managed_by: Option<String>,
    ttl_seconds_after_finished: Option<i32>,
}

#[allow(dead_code)]
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ReplicatedJob {
    name: String,
    group_name: Option<String>,
    template: Value,
    replicas: Option<i32>,
    depends_on: Option<Value>,
}

#[allow(dead_code)]
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Network {
    #[serde(rename = "enableDNSHostnames")]
    enable_dns_hostnames: Option<bool>,
    subdomain: Option<String>,
    #[serde(rename = "publishNotReadyAddresses")]
    publish_not_ready_addresses: Option<bool>,
}

#[allow(dead_code)]
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct FailurePolicy {
    max_restarts: Option<i32>,
    restart_strategy: Option<String>,
    rules: Option<Vec<Value>>,
}

fn manifest(extra: &[&str]) -> String {
    let home = tempfile::tempdir().unwrap();
    let mut args = vec!["submit", "gke", "--nodes", "2", "--image", IMAGE];
    args.extend_from_slice(extra);
    let run = maxrs(&with_seed(&args), home.path(), &[]);
    assert!(run.ok, "{}", run.all());
    run.stdout
}

/// Parses and checks the manifest against the API types; the pod template of the one replicated job.
fn checked(text: &str) -> (JobSet, JobTemplateSpec) {
    let json: Value = serde_yaml::from_str(text).expect("the manifest is YAML");
    let jobset: JobSet = serde_json::from_value(json).expect("a JobSet v1alpha2 with no unknown fields");
    assert_eq!((jobset.api_version.as_str(), jobset.kind.as_str()), ("jobset.x-k8s.io/v1alpha2", "JobSet"));
    assert_eq!(jobset.spec.replicated_jobs.len(), 1);
    let raw = jobset.spec.replicated_jobs[0].template.clone();
    let template: JobTemplateSpec = serde_json::from_value(raw.clone()).expect("a batch/v1 JobTemplateSpec");
    assert_eq!(serde_json::to_value(&template).unwrap(), raw, "every field of the template is a Kubernetes field");
    (jobset, template)
}

#[test]
fn the_jobset_is_valid_and_wires_the_cluster() {
    let text = manifest(&["--namespace", "training", "--queue", "a3mega-queue"]);
    let (jobset, template) = checked(&text);
    let name = jobset.metadata.name.clone().unwrap();
    assert_eq!(name, "maxrs-llama2-7b");
    assert_eq!(jobset.metadata.namespace.as_deref(), Some("training"));
    assert_eq!(jobset.metadata.labels.unwrap()["kueue.x-k8s.io/queue-name"], "a3mega-queue");
    let network = jobset.spec.network.unwrap();
    assert_eq!(network.enable_dns_hostnames, Some(true), "JobSet's headless service gives pods host names");
    assert_eq!(network.subdomain.as_deref(), Some(name.as_str()));
    assert_eq!(jobset.spec.failure_policy.unwrap().max_restarts, Some(0));
    let rjob = &jobset.spec.replicated_jobs[0];
    assert_eq!(rjob.replicas, Some(1));

    let spec = template.spec.unwrap();
    assert_eq!((spec.parallelism, spec.completions), (Some(2), Some(2)));
    assert_eq!(spec.completion_mode.as_deref(), Some("Indexed"), "the completion index is the rank");
    let pod = spec.template.spec.unwrap();
    assert_eq!(pod.node_selector.unwrap()["cloud.google.com/gke-accelerator"], "nvidia-h100-mega-80gb");
    let sidecar = &pod.init_containers.unwrap()[0];
    assert_eq!(sidecar.restart_policy.as_deref(), Some("Always"), "the TCPXO daemon is a native sidecar");
    let trainer = &pod.containers[0];
    assert_eq!(trainer.image.as_deref(), Some(IMAGE));
    assert_eq!(trainer.resources.as_ref().unwrap().limits.as_ref().unwrap()["nvidia.com/gpu"].0, "8");
    let env: BTreeMap<String, _> = trainer.env.clone().unwrap().into_iter().map(|e| (e.name.clone(), e)).collect();
    let value = |n: &str| env[n].value.clone().unwrap();
    // JobSet's pod host names: <jobset>-<replicatedJob>-<job index>-<pod index>.<subdomain>.
    assert_eq!(value("JAX_COORDINATOR_ADDRESS"), format!("{name}-{}-0-0.{name}", rjob.name));
    assert!(format!("{name}-{}-0-1", rjob.name).len() <= 63, "pod host names are DNS labels");
    assert_eq!(value("JAX_COORDINATOR_PORT"), "6002");
    assert_eq!(trainer.ports.as_ref().unwrap()[0].container_port, 6002);
    assert_eq!(value("NNODES"), "2");
    assert_eq!(value("GPUS_PER_NODE"), "8");
    let rank = env["NODE_RANK"].value_from.as_ref().unwrap().field_ref.as_ref().unwrap();
    assert_eq!(rank.field_path, "metadata.annotations['batch.kubernetes.io/job-completion-index']");
    assert!(value("XLA_FLAGS").contains("--xla_gpu_all_reduce_combine_threshold_bytes=67108864"));
    let annotations = spec.template.metadata.unwrap().annotations.unwrap();
    let interfaces: Value = serde_json::from_str(&annotations["networking.gke.io/interfaces"]).unwrap();
    assert_eq!(interfaces.as_array().unwrap().len(), 9, "eth0 plus the 8 GPU NICs");
}

#[test]
fn dry_run_snapshot_and_secret_values_hidden() {
    let text = manifest(&["--dry-run"]);
    checked(&text);
    insta::assert_snapshot!("gke_dry_run_seed_2_nodes", text);
    let shown = manifest(&["--env", "WANDB_API_KEY=wandb-secret", "--dry-run"]);
    assert!(!shown.contains("wandb-secret") && shown.contains("<redacted>"), "{shown}");
}

#[test]
fn apply_hands_the_manifest_to_kubectl() {
    let home = tempfile::tempdir().unwrap();
    let saved = home.path().join("applied.yaml");
    let bin = fake_bin(
        home.path(),
        &[(
            "kubectl",
            &format!(
                r#"[ "$*" = "apply -f -" ] && cat > {} && echo "jobset.jobset.x-k8s.io/maxrs-llama2-7b created""#,
                saved.display()
            ),
        )],
    );
    let path = path_with(&bin);
    let args = with_seed(&[
        "submit",
        "gke",
        "--nodes",
        "2",
        "--image",
        IMAGE,
        "--env",
        "WANDB_API_KEY=wandb-secret",
        "--apply",
    ]);
    let run = maxrs(&args, home.path(), &[("PATH", &path)]);
    assert!(run.ok, "{}", run.all());
    assert!(run.stdout.contains("jobset.jobset.x-k8s.io/maxrs-llama2-7b created"), "{}", run.stdout);
    let applied = std::fs::read_to_string(&saved).unwrap();
    let (_, template) = checked(&applied);
    let env = template.spec.unwrap().template.spec.unwrap().containers[0].env.clone().unwrap();
    assert!(env.iter().any(|e| e.name == "WANDB_API_KEY" && e.value.as_deref() == Some("wandb-secret")));
    assert!(!run.all().contains("wandb-secret"));
}
