//! Running `maxrs submit` as a user would, in a clean environment (no credentials, no proxy, an
//! empty home, no metadata-server probe), from the repository root so `configs/base.yml` resolves.

use std::path::{Path, PathBuf};
use std::process::Command;

use maxrs::submit::{Job, Request};

/// Seed 000's recipe on 2 A3 Mega nodes.
pub const SEED: &[&str] = &[
    "train",
    "configs/base.yml",
    "model_name=llama2-7b",
    "per_device_batch_size=4",
    "max_target_length=4096",
    "ici_fsdp_parallelism=8",
    "dcn_data_parallelism=2",
    "steps=400",
];

pub const IMAGE: &str = "us-docker.pkg.dev/my-project/maxrs/maxrs:latest";

/// The seed recipe as `maxrs submit` prepares it for 2 A3 Mega nodes running [`IMAGE`].
pub fn seed_job() -> Job {
    Job::prepare(Request {
        nodes: 2,
        machine_type: "a3-megagpu-8g".into(),
        name: None,
        image: Some(IMAGE.into()),
        maxrs: "maxrs".into(),
        env: vec![],
        command: SEED.iter().map(|s| s.to_string()).collect(),
    })
    .unwrap()
}

/// `maxrs submit vertex` for the seed's 2 nodes in `my-project`, `us-central1` (before `--` and
/// any extra flags such as `--dry-run`).
pub const VERTEX_2_NODES: &[&str] =
    &["submit", "vertex", "--nodes", "2", "--image", IMAGE, "--project", "my-project", "--region", "us-central1"];

pub struct Run {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn all(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `maxrs <args>` with `home` as HOME and `env` added.
pub fn maxrs(args: &[&str], home: &Path, env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_maxrs"));
    cmd.args(args).current_dir(repo()).env("HOME", home).env("NO_GCE_CHECK", "true");
    for var in [
        "GOOGLE_OAUTH_ACCESS_TOKEN",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_AIPLATFORM",
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_LOGGING",
        "MAXRS_SUBMIT_CONFIG",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run maxrs");
    Run {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `args` followed by `--` and the seed recipe.
pub fn with_seed<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut all = args.to_vec();
    all.push("--");
    all.extend_from_slice(SEED);
    all
}

/// A directory with executable stand-ins for commands (`name`, shell body), placed so that
/// they run at once while other tests start processes (`maxrs::files::place_executable`).
pub fn fake_bin(dir: &Path, programs: &[(&str, &str)]) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for (name, body) in programs {
        let script = dir.join(format!("{name}.sh"));
        std::fs::write(&script, format!("#!/bin/bash\n{body}\n")).unwrap();
        maxrs::files::place_executable(&script, &bin.join(name)).unwrap();
    }
    bin
}

/// PATH with `first` in front of the system's.
pub fn path_with(first: &Path) -> String {
    format!("{}:{}", first.display(), std::env::var("PATH").unwrap_or_default())
}
