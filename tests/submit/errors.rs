//! Errors name the problem before anything is submitted: machine type, node count against the
//! mesh, missing image/project/nodes, malformed settings, names maxrs owns. And the settings
//! file: its values are used, flags win over them.

use serde_json::Value;

use super::common::{maxrs, with_seed, IMAGE};

fn fails(args: &[&str], expected: &[&str]) {
    let home = tempfile::tempdir().unwrap();
    let run = maxrs(&with_seed(args), home.path(), &[]);
    assert!(!run.ok, "{args:?} should fail:\n{}", run.all());
    for e in expected {
        assert!(run.stderr.contains(e), "{args:?}: expected {e:?} in:\n{}", run.stderr);
    }
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
}

const VERTEX: &[&str] =
    &["submit", "vertex", "--image", IMAGE, "--project", "my-project", "--region", "us-central1", "--dry-run"];

fn vertex(extra: &[&'static str]) -> Vec<&'static str> {
    let mut v = VERTEX.to_vec();
    v.extend_from_slice(extra);
    v
}

#[test]
fn machine_type_and_node_count_are_checked_first() {
    fails(
        &vertex(&["--nodes", "2", "--machine-type", "a3-megagpu-4g"]),
        &["unknown machine type `a3-megagpu-4g`", "a3-megagpu-8g"],
    );
    fails(
        &vertex(&["--nodes", "4"]),
        &["does not fit --nodes 4 x a3-megagpu-8g", "dcn_data_parallelism=2", "4 slices"],
    );
    fails(&vertex(&[]), &["give --nodes N"]);
    fails(&["submit", "gke", "--nodes", "2", "--dry-run"], &["give --image IMAGE"]);
    fails(&["submit", "vertex", "--nodes", "2", "--image", IMAGE, "--dry-run"], &["give --project"]);
    fails(&vertex(&["--nodes", "2", "--env", "NODE_RANK=1"]), &["NODE_RANK is set by maxrs submit"]);
    fails(
        &vertex(&["--nodes", "2", "--reservation", "a3mega-pool"]),
        &["projects/PROJECT/zones/ZONE/reservations/NAME"],
    );
    fails(&vertex(&["--nodes", "2", "--network", "my-vpc"]), &["projects/PROJECT_NUMBER/global/networks/NAME"]);
    fails(&vertex(&["--nodes", "2", "--name", "Bad_Name"]), &["--name \"Bad_Name\""]);
}

#[test]
fn the_command_is_a_valid_train_command() {
    let home = tempfile::tempdir().unwrap();
    let run = maxrs(&["submit", "slurm", "--nodes", "2", "--", "devices"], home.path(), &[]);
    assert!(!run.ok && run.stderr.contains("got `devices`"), "{}", run.stderr);
    let run = maxrs(&["submit", "slurm", "--nodes", "2"], home.path(), &[]);
    assert!(!run.ok && run.stderr.contains("nothing to run"), "{}", run.stderr);
    let bad_key = ["submit", "slurm", "--nodes", "2", "--", "train", "configs/base.yml", "ici_fsdp_parallelsm=8"];
    let run = maxrs(&bad_key, home.path(), &[]);
    assert!(!run.ok && run.stderr.contains("ici_fsdp_parallelsm"), "{}", run.stderr);
    let cpu = ["submit", "slurm", "--nodes", "1", "--", "train", "hardware=cpu"];
    let run = maxrs(&cpu, home.path(), &[]);
    assert!(!run.ok && run.stderr.contains("hardware=cpu cannot run on a3-megagpu-8g"), "{}", run.stderr);
}

#[test]
fn the_settings_file_supplies_defaults_and_flags_win() {
    let home = tempfile::tempdir().unwrap();
    let file = home.path().join("team.yml");
    std::fs::write(
        &file,
        "submit:\n  project: team-project\n  region: us-east4\n  image: team/maxrs:1\n  nodes: 2\n  \
         network: projects/42/global/networks/team-vpc\n  \
         reservation: projects/team-project/zones/us-east4-a/reservations/a3mega\n  env: {WANDB_MODE: offline}\n",
    )
    .unwrap();
    let file = file.to_str().unwrap();
    let run = maxrs(
        &with_seed(&["submit", "vertex", "--submit-config", file, "--region", "us-central1", "--dry-run"]),
        home.path(),
        &[],
    );
    assert!(run.ok, "{}", run.all());
    let body: Value = serde_json::from_str(&run.stdout).unwrap();
    let pool = &body["jobSpec"]["workerPoolSpecs"][0];
    assert_eq!(pool["containerSpec"]["imageUri"], "team/maxrs:1");
    assert_eq!(body["jobSpec"]["network"], "projects/42/global/networks/team-vpc");
    let affinity = &pool["machineSpec"]["reservationAffinity"];
    assert_eq!(affinity["reservationAffinityType"], "SPECIFIC_RESERVATION");
    assert_eq!(affinity["values"][0], "projects/team-project/zones/us-east4-a/reservations/a3mega");
    assert!(pool["containerSpec"]["env"].as_array().unwrap().iter().any(|e| e["name"] == "WANDB_MODE"));
    // --region beat the file's us-east4.
    assert!(run.stderr.contains("/projects/team-project/locations/us-central1/customJobs"), "{}", run.stderr);

    // The same file through $MAXRS_SUBMIT_CONFIG.
    let run = maxrs(&with_seed(&["submit", "vertex", "--dry-run"]), home.path(), &[("MAXRS_SUBMIT_CONFIG", file)]);
    assert!(run.ok && run.stderr.contains("/locations/us-east4/customJobs"), "{}", run.all());

    let typo = home.path().join("typo.yml");
    std::fs::write(&typo, "submit:\n  regoin: us-east4\n").unwrap();
    let run = maxrs(
        &with_seed(&["submit", "vertex", "--submit-config", typo.to_str().unwrap(), "--dry-run"]),
        home.path(),
        &[],
    );
    assert!(
        !run.ok && run.stderr.contains("unknown field `regoin`") && run.stderr.contains("typo.yml"),
        "{}",
        run.stderr
    );
}
