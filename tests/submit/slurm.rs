//! Slurm: the script passes `bash -n`, its `#SBATCH` lines say one task per node with all GPUs,
//! and run under stand-in `srun`/`scontrol` it starts one maxrs per node with the cluster
//! environment of its rank; `--submit` hands it to sbatch.

use std::collections::BTreeMap;
use std::path::Path;

use super::common::{fake_bin, maxrs, path_with, with_seed};

fn seed_script(extra: &[&str]) -> String {
    let home = tempfile::tempdir().unwrap();
    let mut args = vec!["submit", "slurm", "--nodes", "2"];
    args.extend_from_slice(extra);
    let run = maxrs(&with_seed(&args), home.path(), &[]);
    assert!(run.ok, "{}", run.all());
    run.stdout
}

/// `#SBATCH` options as sbatch reads them: only from the comment block before the first command.
fn sbatch_options(script: &str) -> BTreeMap<String, String> {
    let mut options = BTreeMap::new();
    for line in script.lines().skip(1) {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if !line.starts_with('#') {
            break;
        }
        if let Some(opt) = line.strip_prefix("#SBATCH ") {
            let (k, v) = opt.split_once('=').unwrap_or((opt, ""));
            options.insert(k.to_string(), v.to_string());
        }
    }
    options
}

fn bash_n(script: &str) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("job.sh");
    std::fs::write(&file, script).unwrap();
    let out = std::process::Command::new("bash").arg("-n").arg(&file).output().unwrap();
    assert!(out.status.success(), "bash -n: {}\n{script}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn the_script_is_valid_bash_with_one_task_per_node() {
    let script = seed_script(&["--partition", "a3mega", "--time", "04:00:00", "--module", "cuda/12.4"]);
    assert!(script.starts_with("#!/bin/bash\n"));
    bash_n(&script);
    let o = sbatch_options(&script);
    assert_eq!(o["--nodes"], "2");
    assert_eq!(o["--ntasks-per-node"], "1");
    assert_eq!(o["--gpus-per-node"], "8");
    assert_eq!(o["--partition"], "a3mega");
    assert_eq!(o["--time"], "04:00:00");
    assert_eq!(o["--job-name"], "maxrs-llama2-7b");
    assert!(o.contains_key("--exclusive"));
    assert!(script.contains("\nmodule load cuda/12.4\n"), "{script}");
    insta::assert_snapshot!("slurm_dry_run_seed_2_nodes", seed_script(&["--partition", "a3mega", "--dry-run"]));
}

#[test]
fn with_an_image_srun_runs_the_container_with_the_nccl_plugin_mounted() {
    let script = seed_script(&["--image", "docker://us-docker.pkg.dev/p/maxrs/maxrs:1"]);
    bash_n(&script);
    assert!(script.contains("--container-image=docker://us-docker.pkg.dev/p/maxrs/maxrs:1"), "{script}");
    assert!(script.contains("--container-mounts=/var/lib/tcpxo/lib64"), "{script}");
    assert!(script.contains(r#"--container-env="$CONTAINER_ENV""#), "{script}");
}

/// Runs the script with stand-ins: `scontrol` lists two hosts, `srun` starts the command once per
/// node with that task's Slurm variables, `maxrs` records its arguments and environment.
#[test]
fn each_task_gets_the_cluster_environment_of_its_rank() {
    let script = seed_script(&["--env", "WANDB_MODE=offline"]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    // The node's GPUDirect-TCPXO directory, here a stand-in with an empty profile.
    let tcpxo = dir.path().join("tcpxo");
    std::fs::create_dir(&tcpxo).unwrap();
    std::fs::write(tcpxo.join("nccl-env-profile.sh"), "export NCCL_FROM_PROFILE=1\n").unwrap();
    let script = script.replace("/var/lib/tcpxo/lib64", tcpxo.to_str().unwrap());
    let bin = fake_bin(
        dir.path(),
        &[
            ("scontrol", r#"[ "$1 $2" = "show hostnames" ] && printf 'a3m-node-7\na3m-node-9\n'"#),
            (
                "srun",
                // Skip srun's options, then run the command once per node as task i.
                r#"while [[ "$1" == --* ]]; do shift; done
for ((i = 0; i < SLURM_JOB_NUM_NODES; i++)); do SLURM_PROCID=$i "$@" || exit 1; done"#,
            ),
            ("maxrs", &format!(r#"{{ printf '%s\n' "$@"; echo ---; env; }} > {}/rank-$NODE_RANK.txt"#, out.display())),
        ],
    );
    let file = dir.path().join("job.sh");
    std::fs::write(&file, &script).unwrap();
    let run = std::process::Command::new("bash")
        .arg(&file)
        .env("PATH", path_with(&bin))
        .env("SLURM_JOB_ID", "51790")
        .env("SLURM_JOB_NUM_NODES", "2")
        .env("SLURM_JOB_NODELIST", "a3m-node-[7,9]")
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));

    for rank in 0..2 {
        let dump = std::fs::read_to_string(out.join(format!("rank-{rank}.txt"))).unwrap();
        let (args, env) = dump.split_once("---\n").unwrap();
        let env: BTreeMap<&str, &str> = env.lines().filter_map(|l| l.split_once('=')).collect();
        check_task_env(&env, rank, Path::new(&file));
        assert!(
            args.lines().eq(super::common::SEED.iter().copied().chain(["hardware=gpu", "plugin=cuda12"])),
            "{args}"
        );
    }
}

fn check_task_env(env: &BTreeMap<&str, &str>, rank: usize, script: &Path) {
    let ctx = format!("rank {rank} of {}", script.display());
    assert_eq!(env["JAX_COORDINATOR_ADDRESS"], "a3m-node-7", "{ctx}");
    // JAX's Slurm port rule: SLURM_JOB_ID % 4096 + 61440 = 51790 - 12 * 4096 + 61440.
    assert_eq!(env["JAX_COORDINATOR_PORT"], "64078", "{ctx}");
    assert_eq!(env["NNODES"], "2", "{ctx}");
    assert_eq!(env["NODE_RANK"], rank.to_string(), "{ctx}");
    assert_eq!(env["GPUS_PER_NODE"], "8", "{ctx}");
    assert_eq!(env["NCCL_FROM_PROFILE"], "1", "{ctx}");
    assert_eq!(env["NCCL_FASTRAK_CTRL_DEV"], "enp0s12", "{ctx}");
    assert_eq!(env["WANDB_MODE"], "offline", "{ctx}");
    assert!(env["XLA_FLAGS"].contains("--xla_gpu_all_reduce_combine_threshold_bytes=67108864"), "{ctx}");
}

#[test]
fn submit_hands_the_script_to_sbatch() {
    let home = tempfile::tempdir().unwrap();
    let bin = fake_bin(
        home.path(),
        &[(
            "sbatch",
            &format!(
                r#"[ "$1" = --parsable ] && cat > {}/submitted.sh && echo "4242;cluster-a""#,
                home.path().display()
            ),
        )],
    );
    let path = path_with(&bin);
    let args = with_seed(&["submit", "slurm", "--nodes", "2", "--env", "HF_TOKEN=hf_secret_value", "--submit"]);
    let run = maxrs(&args, home.path(), &[("PATH", &path)]);
    assert!(run.ok, "{}", run.all());
    assert!(run.stdout.contains("submitted batch job 4242"), "{}", run.stdout);
    let submitted = std::fs::read_to_string(home.path().join("submitted.sh")).unwrap();
    // The job gets the secret; the terminal never sees it.
    assert!(submitted.contains("export HF_TOKEN=hf_secret_value"), "{submitted}");
    assert!(!run.all().contains("hf_secret_value"));
    bash_n(&submitted);

    let empty = home.path().join("no-bin");
    std::fs::create_dir(&empty).unwrap();
    let run = maxrs(&args, home.path(), &[("PATH", empty.to_str().unwrap())]);
    assert!(!run.ok);
    assert!(run.stderr.contains("sbatch is not on PATH"), "{}", run.stderr);
}
