//! The sbatch script for a [`Job`]: one task per node with all its GPUs, the machine's NCCL set-up,
//! the tuned XLA flags, Slurm's variables mapped to the cluster settings maxrs reads, and
//! `srun maxrs train ...` (inside a pyxis/enroot container with `--image`, after `module load`
//! lines with `modules`). `--submit` pipes it to `sbatch`.
//!
//! The mapping follows JAX's own Slurm support (jax-ml/jax `jax/_src/clusters/slurm_cluster.py` at
//! 01f4709d): the first node of the job hosts the coordinator, on port
//! `SLURM_JOB_ID % 4096 + 61440`, and a task's rank is its `SLURM_PROCID`. The A3 Mega NCCL lines
//! are Cluster Toolkit's (see `machine.rs`).

use anyhow::{bail, Result};

use super::{run_tool, shell_join, shell_quote, shown_value, Job, TOOL_TIMEOUT};

#[derive(Clone, Debug, Default)]
pub struct SlurmOptions {
    pub partition: Option<String>,
    /// sbatch's `--time` (`24:00:00`).
    pub time: Option<String>,
    pub account: Option<String>,
    /// Environment modules loaded before the run.
    pub modules: Vec<String>,
    /// Extra pyxis `--container-mounts` entries.
    pub container_mounts: Vec<String>,
}

/// The cluster variables every task gets (shell expressions, evaluated in the batch script).
const CLUSTER_LINES: &[&str] = &[
    r#"export JAX_COORDINATOR_ADDRESS="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)""#,
    "export JAX_COORDINATOR_PORT=$(( SLURM_JOB_ID % 4096 + 61440 ))",
    r#"export NNODES="$SLURM_JOB_NUM_NODES""#,
];

/// The script as submitted.
pub fn script(job: &Job, opts: &SlurmOptions) -> Result<String> {
    render(job, opts, false)
}

/// The script as printed: secret environment values replaced by `<redacted>`.
pub fn display_script(job: &Job, opts: &SlurmOptions) -> Result<String> {
    render(job, opts, true)
}

fn render(job: &Job, opts: &SlurmOptions, redact: bool) -> Result<String> {
    for (flag, value) in [("partition", &opts.partition), ("time", &opts.time), ("account", &opts.account)] {
        if let Some(v) = value {
            if v.is_empty() || v.chars().any(|c| c.is_whitespace() || c == '\'' || c == '"') {
                bail!("Slurm {flag} {v:?}: no spaces or quotes allowed");
            }
        }
    }
    let gpus = job.machine.gpus_per_node;
    let mut s = String::new();
    let mut line = |l: &str| {
        s.push_str(l);
        s.push('\n');
    };
    line("#!/bin/bash");
    line(&format!("# maxrs submit slurm: {}", job.summary));
    line(&format!("#SBATCH --job-name={}", job.name));
    line(&format!("#SBATCH --nodes={}", job.nodes));
    line("#SBATCH --ntasks-per-node=1");
    line(&format!("#SBATCH --gpus-per-node={gpus}"));
    line("#SBATCH --exclusive");
    line("#SBATCH --mem=0");
    if let Some(p) = &opts.partition {
        line(&format!("#SBATCH --partition={p}"));
    }
    if let Some(t) = &opts.time {
        line(&format!("#SBATCH --time={t}"));
    }
    if let Some(a) = &opts.account {
        line(&format!("#SBATCH --account={a}"));
    }
    // Not -u: the NCCL profile reads variables that may be unset.
    line("set -eo pipefail");
    line("");
    line(&format!("# NCCL over GPUDirect-TCPXO on {} (Cluster Toolkit's Slurm image).", job.machine.name));
    for l in job.machine.slurm_nccl_lines() {
        line(&l);
    }
    line("");
    line(&format!("# XLA flags tuned for {} nodes.", job.nodes));
    line(&format!("export XLA_FLAGS={}", shell_quote(&job.xla_flags)));
    line("");
    line("# One maxrs process per node; the first node hosts the coordinator; each task's rank is its SLURM_PROCID.");
    for l in CLUSTER_LINES {
        line(l);
    }
    line(&format!("export GPUS_PER_NODE={gpus}"));
    if !job.user_env.is_empty() {
        line("");
        for (name, value) in &job.user_env {
            let value = if redact { shown_value(name, value) } else { value.as_str() };
            line(&format!("export {name}={}", shell_quote(value)));
        }
    }
    if !opts.modules.is_empty() {
        line("");
        for m in &opts.modules {
            line(&format!("module load {}", shell_quote(m)));
        }
    }
    line("");
    let mut srun: Vec<String> = vec![
        "srun".into(),
        r#"--nodes="$SLURM_JOB_NUM_NODES""#.into(),
        "--ntasks-per-node=1".into(),
        "--kill-on-bad-exit=1".into(),
    ];
    if let Some(image) = &job.image {
        let mounts: Vec<String> = job
            .machine
            .slurm_container_mounts()
            .into_iter()
            .map(String::from)
            .chain(opts.container_mounts.iter().cloned())
            .collect();
        let mut names = vec!["XLA_FLAGS", "JAX_COORDINATOR_ADDRESS", "JAX_COORDINATOR_PORT", "NNODES", "GPUS_PER_NODE"];
        names.extend(["LD_LIBRARY_PATH", "CUDA_DEVICE_MAX_CONNECTIONS"]);
        names.extend(job.user_env.iter().map(|(n, _)| n.as_str()));
        line("# Pass the NCCL and cluster variables into the container, over the image's own values.");
        line(&format!(r#"CONTAINER_ENV="$(IFS=,; echo "${{!NCCL*}}"),{}""#, names.join(",")));
        srun.push(format!("--container-image={}", shell_quote(image)));
        srun.push(format!("--container-mounts={}", shell_quote(&mounts.join(","))));
        srun.push(r#"--container-env="$CONTAINER_ENV""#.into());
    }
    srun.push(r#"bash -c 'export NODE_RANK="$SLURM_PROCID"; exec "$@"' maxrs-rank"#.into());
    let command = shell_join(std::iter::once(job.program.as_str()).chain(job.args.iter().map(String::as_str)));
    line(&format!("{} \\\n  {command}", srun.join(" \\\n  ")));
    Ok(s)
}

/// Submits `script` with `sbatch` (read from its standard input, within [`TOOL_TIMEOUT`]); the
/// job id it reports.
pub fn submit(script: &str) -> Result<String> {
    let out = run_tool(
        "sbatch",
        &["--parsable"],
        script,
        TOOL_TIMEOUT,
        "run this on a Slurm login node, or save the script (maxrs submit slurm ... > job.sh) and submit it there \
         with `sbatch job.sh`",
    )?;
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() {
        bail!("sbatch refused the job ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    // `--parsable` prints `jobid` or `jobid;cluster`.
    let id = stdout.split(';').next().unwrap_or_default().trim().to_string();
    if id.is_empty() {
        bail!("sbatch printed no job id (stdout: {stdout:?})");
    }
    Ok(id)
}
