//! The environment each launcher gives a process, fed to maxrs's own cluster detection
//! (`cluster::settings::detect`): every process must find the same coordinator, the node count
//! and its own rank.

use std::collections::BTreeMap;

use maxrs::cluster::settings::{detect, ClusterSettings};
use maxrs::submit::{gke, vertex, Job};

use super::common::{fake_bin, maxrs, path_with, seed_job, with_seed};

fn detected(job: &Job, env: &BTreeMap<String, String>) -> ClusterSettings {
    let config = maxrs::config::load_args(&job.args[1..]).unwrap();
    detect(&config, &|name| env.get(name).cloned()).unwrap_or_else(|e| panic!("{e:#}\n{env:#?}"))
}

fn check(s: &ClusterSettings, rank: usize, coordinator: &str) {
    assert_eq!((s.num_processes, s.process_id, s.coordinator.as_str()), (2, rank, coordinator), "{s}");
}

#[test]
fn vertex_replicas_find_their_cluster_in_cluster_spec() {
    let job = seed_job();
    let body = vertex::custom_job(
        &job,
        &vertex::VertexOptions { project: "p".into(), region: "r".into(), ..Default::default() },
    )
    .unwrap();
    for (rank, (pool, index)) in [("workerpool0", 0), ("workerpool1", 0)].into_iter().enumerate() {
        let spec = &body.job_spec.worker_pool_specs[rank.min(1)];
        let mut env: BTreeMap<String, String> =
            spec.container_spec.env.iter().map(|e| (e.name.clone(), e.value.clone())).collect();
        // What Vertex AI adds (its distributed-training documentation's CLUSTER_SPEC format).
        env.insert(
            "CLUSTER_SPEC".into(),
            serde_json::json!({
                "cluster": {"workerpool0": ["cmle-training-workerpool0-ab-0:2222"], "workerpool1": ["cmle-training-workerpool1-ab-0:2222"]},
                "environment": "cloud",
                "task": {"type": pool, "index": index},
            })
            .to_string(),
        );
        check(&detected(&job, &env), rank, "cmle-training-workerpool0-ab-0:2222");
    }
}

#[test]
fn gke_pods_find_the_coordinator_pod() {
    let job = seed_job();
    let text = gke::manifest(&job, &gke::GkeOptions::default()).unwrap();
    let manifest: serde_json::Value = serde_yaml::from_str(&text).unwrap();
    let pod = &manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"];
    for rank in 0..2 {
        let mut env = BTreeMap::new();
        for e in pod["containers"][0]["env"].as_array().unwrap() {
            let value = match e.get("value") {
                Some(v) => v.as_str().unwrap().to_string(),
                // The completion-index annotation Kubernetes fills in.
                None => rank.to_string(),
            };
            env.insert(e["name"].as_str().unwrap().to_string(), value);
        }
        // What Kubernetes and JobSet add to an indexed Job's pod.
        env.insert("JOB_COMPLETION_INDEX".into(), rank.to_string());
        check(&detected(&job, &env), rank, "maxrs-llama2-7b-workers-0-0.maxrs-llama2-7b:6002");
    }
}

#[test]
fn slurm_tasks_find_the_first_node() {
    let home = tempfile::tempdir().unwrap();
    let run = maxrs(&with_seed(&["submit", "slurm", "--nodes", "2"]), home.path(), &[]);
    assert!(run.ok, "{}", run.all());
    let dir = tempfile::tempdir().unwrap();
    let tcpxo = dir.path().join("tcpxo");
    std::fs::create_dir(&tcpxo).unwrap();
    std::fs::write(tcpxo.join("nccl-env-profile.sh"), "").unwrap();
    let script = run.stdout.replace("/var/lib/tcpxo/lib64", tcpxo.to_str().unwrap());
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let bin = fake_bin(
        dir.path(),
        &[
            ("scontrol", r#"printf 'a3m-node-7\na3m-node-9\n'"#),
            (
                "srun",
                r#"while [[ "$1" == --* ]]; do shift; done
for ((i = 0; i < SLURM_JOB_NUM_NODES; i++)); do SLURM_PROCID=$i SLURM_NTASKS=2 SLURM_STEP_NODELIST="$SLURM_JOB_NODELIST" "$@" || exit 1; done"#,
            ),
            ("maxrs", &format!(r#"env > {}/rank-$NODE_RANK.txt"#, out.display())),
        ],
    );
    let file = dir.path().join("job.sh");
    std::fs::write(&file, script).unwrap();
    let status = std::process::Command::new("bash")
        .arg(&file)
        .env("PATH", path_with(&bin))
        .env("SLURM_JOB_ID", "51790")
        .env("SLURM_JOB_NUM_NODES", "2")
        .env("SLURM_JOB_NODELIST", "a3m-node-[7,9]")
        .status()
        .unwrap();
    assert!(status.success());
    let job = seed_job();
    for rank in 0..2 {
        let dump = std::fs::read_to_string(out.join(format!("rank-{rank}.txt"))).unwrap();
        let env: BTreeMap<String, String> =
            dump.lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let s = detected(&job, &env);
        check(&s, rank, "a3m-node-7:64078");
        assert_eq!(s.expected_local_devices, Some(8));
    }
}
