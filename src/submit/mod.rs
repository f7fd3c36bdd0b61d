//! `maxrs submit`: the same `maxrs train ...` command a team runs locally, submitted to a cluster
//! of GPU machines: a Vertex AI custom job (`vertex`), an sbatch script (`slurm`) or a GKE JobSet
//! (`gke`).
//!
//! [`Job::prepare`] turns the request into what every launcher needs: the train command (checked
//! against the config before anything is submitted: the node count must be the mesh's DCN product),
//! the machine type, and the environment every process gets. Each launcher module then renders it:
//! [`vertex`] the custom job body (sent by [`vertex_api`] with a token from
//! [`crate::net::credentials`]), [`slurm`] the batch script, [`gke`] the JobSet manifest; `sbatch`
//! and `kubectl` run through [`run_tool`], which gives them a deadline (they wait on the cluster's
//! controller over the network).
//!
//! The cluster environment each launcher sets is the one maxrs's multi-process runtime reads
//! (../shared/REFERENCE.md §2, MaxText's A3 Mega recipe): `JAX_COORDINATOR_ADDRESS`,
//! `JAX_COORDINATOR_PORT`, `NNODES`, `NODE_RANK`, `GPUS_PER_NODE` (Slurm, GKE); on Vertex AI none of
//! them: the runtime reads Vertex's own `CLUSTER_SPEC` (or `MASTER_ADDR` / `RANK`) instead.

pub mod gke;
pub mod machine;
pub mod settings;
pub mod slurm;
pub mod vertex;
pub mod vertex_api;

use std::io::{Read, Write};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use crate::config;
use machine::MachineType;

/// The maxrs subcommands a cluster job may run.
pub const SUBMITTABLE: &[&str] = &["train"];

/// The cluster variables the launchers set; `--env` may not override them.
pub const RESERVED_ENV: &[&str] =
    &["JAX_COORDINATOR_ADDRESS", "JAX_COORDINATOR_IP", "JAX_COORDINATOR_PORT", "NNODES", "NODE_RANK", "GPUS_PER_NODE"];

/// What the user asked for, after flags and the settings file are merged.
#[derive(Clone, Debug)]
pub struct Request {
    pub nodes: usize,
    pub machine_type: String,
    /// Job name; default `maxrs-<run_name or model_name>`.
    pub name: Option<String>,
    pub image: Option<String>,
    /// The maxrs program on the nodes.
    pub maxrs: String,
    /// Extra environment, in order; later entries win.
    pub env: Vec<(String, String)>,
    /// The maxrs command after `--`: `train <config> key=value ...`.
    pub command: Vec<String>,
}

/// A validated job, ready to be rendered by a launcher.
#[derive(Clone, Debug)]
pub struct Job {
    /// Lowercase letters, digits and `-`, at most [`MAX_NAME_LEN`]: valid for every launcher.
    pub name: String,
    pub nodes: usize,
    pub machine: &'static MachineType,
    pub image: Option<String>,
    pub program: String,
    /// `train <config> key=value ...`, with the keys maxrs added for the GPU nodes at the end.
    pub args: Vec<String>,
    /// The `key=value` arguments maxrs added (shown to the user).
    pub added_args: Vec<String>,
    /// `XLA_FLAGS` for this machine type and node count.
    pub xla_flags: String,
    pub user_env: Vec<(String, String)>,
    /// One line saying what will run: model, devices, mesh, batch.
    pub summary: String,
}

/// JobSet pod host names (`<name>-workers-<i>-<j>`) must stay within a 63-character DNS label.
pub const MAX_NAME_LEN: usize = 40;

impl Job {
    /// Checks the request (command, machine type, node count against the config's mesh) and
    /// derives the job.
    pub fn prepare(req: Request) -> Result<Job> {
        let machine = machine::machine_type(&req.machine_type)?;
        // One process per node: the same bound as the num_processes key.
        let max_nodes = config::range("num_processes").map_or(1 << 20, |r| r.max as usize);
        if req.nodes == 0 || req.nodes > max_nodes {
            bail!("--nodes {}: give 1 to {max_nodes} machines (one maxrs process each)", req.nodes);
        }
        let mut command = req.command.clone();
        if command.first().is_some_and(|c| c == "maxrs" || c.ends_with("/maxrs")) {
            command.remove(0);
        }
        let Some(sub) = command.first() else {
            bail!(
                "nothing to run: give the maxrs command after `--`, e.g. `maxrs submit vertex --nodes 2 ... -- train \
                 configs/base.yml model_name=llama2-7b ici_fsdp_parallelism=8 dcn_data_parallelism=2`"
            );
        };
        if !SUBMITTABLE.contains(&sub.as_str()) {
            bail!("`maxrs submit` runs `maxrs {}` on the cluster; got `{sub}` after `--`", SUBMITTABLE.join(" | "));
        }
        for (name, _) in &req.env {
            check_env_name(name)?;
            if RESERVED_ENV.contains(&name.as_str()) {
                bail!("{name} is set by maxrs submit for each process (the cluster settings); leave it out of --env");
            }
        }

        let mut train_args: Vec<String> = command[1..].to_vec();
        let explicit = |key: &str| train_args.iter().any(|a| a.starts_with(&format!("{key}=")));
        let loaded = config::load_args(&train_args).context("the train command's config")?;
        // A GPU job needs hardware=gpu and a CUDA plugin: added where the user left the key out,
        // refused where the user set it to something else.
        // MaxText's A3 recipes run with `hardware: gpu` (maxtext src/maxtext/configs/gpu/models/llama2_7b.yml at
        // 23be6e4f).
        let gpu = loaded.hardware.is_gpu();
        let cuda = loaded.plugin.starts_with("cuda") || loaded.plugin.contains('/');
        let mut added_args = Vec::new();
        for (fits, key, value, added, valid) in [
            (
                gpu,
                "hardware",
                loaded.hardware.to_string(),
                "gpu",
                "use hardware=gpu (MaxText's value for one process per GPU node)",
            ),
            (cuda, "plugin", loaded.plugin.clone(), "cuda12", "use plugin=cuda12 or plugin=cuda13"),
        ] {
            if fits {
                continue;
            }
            if explicit(key) {
                bail!("{key}={value} cannot run on {} GPU nodes; {valid}", machine.name);
            }
            added_args.push(format!("{key}={added}"));
        }
        train_args.extend(added_args.iter().cloned());
        let config = config::load_args(&train_args).context("the train command's config")?;
        let devices = req.nodes * machine.gpus_per_node;
        let derived = config::validate(&config, devices, req.nodes).with_context(|| {
            format!(
                "the config does not fit --nodes {} x {} ({} GPUs, {} per node; the dcn_* parallelism must multiply to {}, \
                 the ici_* parallelism to {})",
                req.nodes,
                machine.name,
                devices,
                machine.gpus_per_node,
                req.nodes,
                machine.gpus_per_node
            )
        })?;

        let base_name = if config.run_name.is_empty() { &config.model_name } else { &config.run_name };
        let name = match &req.name {
            Some(n) => check_name(n)?,
            None => default_name(base_name),
        };
        let axes = |size: fn(&config::MeshAxis) -> usize| {
            let used: Vec<String> =
                derived.mesh.axes.iter().filter(|a| size(a) > 1).map(|a| format!("{}={}", a.name, size(a))).collect();
            if used.is_empty() {
                "none".to_string()
            } else {
                used.join(" ")
            }
        };
        let summary = format!(
            "{} on {} x {} ({} GPUs), mesh {} (across nodes: {}), global batch {}",
            derived.model_name,
            req.nodes,
            machine.name,
            devices,
            axes(|a| a.size()),
            axes(|a| a.dcn),
            derived.global_batch_size
        );
        let mut args = vec![sub.clone()];
        args.extend(train_args);
        Ok(Job {
            name,
            nodes: req.nodes,
            machine,
            image: req.image,
            program: req.maxrs,
            args,
            added_args,
            xla_flags: machine.xla_flags(req.nodes).to_env_string(),
            user_env: req.env,
            summary,
        })
    }

    /// The environment of every process: the machine's NCCL settings (launcher-specific, given),
    /// `XLA_FLAGS`, the cluster variables, then the user's (which win over everything before).
    pub fn env(&self, nccl: Vec<(String, String)>, cluster: Vec<(String, String)>) -> Vec<(String, String)> {
        let mut env = nccl;
        env.push(("XLA_FLAGS".into(), self.xla_flags.clone()));
        env.extend(cluster);
        for (name, value) in &self.user_env {
            match env.iter_mut().find(|(n, _)| n == name) {
                Some(slot) => slot.1 = value.clone(),
                None => env.push((name.clone(), value.clone())),
            }
        }
        env
    }

    /// The image, required by container launchers.
    pub fn require_image(&self, launcher: &str) -> Result<&str> {
        self.image.as_deref().ok_or_else(|| {
            anyhow::anyhow!(
                "{launcher} runs a container: give --image IMAGE (an image with maxrs on its PATH and your config files), \
                 or `image:` in the submit settings file"
            )
        })
    }

    /// The command line as one string, shell-quoted.
    pub fn command_line(&self) -> String {
        shell_join(std::iter::once(self.program.as_str()).chain(self.args.iter().map(String::as_str)))
    }
}

/// `maxrs-<base>` made a valid DNS label: lowercase, `[a-z0-9-]`, at most [`MAX_NAME_LEN`].
pub fn default_name(base: &str) -> String {
    let cleaned: String =
        base.to_lowercase().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    let mut name = format!("maxrs-{}", cleaned.trim_matches('-'));
    name.truncate(MAX_NAME_LEN);
    name.trim_end_matches('-').to_string()
}

fn check_name(name: &str) -> Result<String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !ok {
        bail!(
            "--name {name:?}: a job name is 1 to {MAX_NAME_LEN} lowercase letters, digits or `-`, starting with a letter \
             and not ending with `-` (it names the JobSet, its pods' host names and the Slurm job)"
        );
    }
    Ok(name.to_string())
}

fn check_env_name(name: &str) -> Result<()> {
    let ok = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !ok {
        bail!(
            "environment variable name {name:?} is not valid: use letters, digits and `_`, not starting with a digit"
        );
    }
    Ok(())
}

/// Parses `NAME=VALUE` (`--env`).
pub fn parse_env(arg: &str) -> Result<(String, String)> {
    let (name, value) = arg.split_once('=').with_context(|| format!("--env {arg:?}: expected NAME=VALUE"))?;
    check_env_name(name)?;
    Ok((name.to_string(), value.to_string()))
}

/// Names whose values are secrets: they are submitted, but never printed.
pub fn is_secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    ["TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "API_KEY", "PRIVATE_KEY"].iter().any(|s| upper.contains(s))
        || upper.ends_with("_KEY")
}

/// What is printed in place of a secret value.
pub const REDACTED: &str = "<redacted>";

/// `value`, or [`REDACTED`] when `name` names a secret.
pub fn shown_value<'a>(name: &str, value: &'a str) -> &'a str {
    if is_secret_name(name) {
        REDACTED
    } else {
        value
    }
}

/// Words joined into one POSIX shell line, each quoted when it needs it.
pub fn shell_join<'a>(words: impl IntoIterator<Item = &'a str>) -> String {
    words.into_iter().map(shell_quote).collect::<Vec<_>>().join(" ")
}

/// One word for a POSIX shell, quoted only when needed.
pub fn shell_quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c))
        && !word.starts_with('=');
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// How long `sbatch` or `kubectl apply` may take: Slurm retries a busy controller on its own, and
/// kubectl waits for an API server that does not answer, both without end.
pub const TOOL_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs `program args` with `input` on its standard input, for at most `timeout` (printed
/// first); its output. `missing` says what to do when the program is not on PATH. A program
/// still running at the deadline is killed, and that is the error.
pub fn run_tool(program: &str, args: &[&str], input: &str, timeout: Duration, missing: &str) -> Result<Output> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => anyhow!("{program} is not on PATH: {missing}"),
            _ => anyhow!("cannot run {program}: {e}"),
        })?;
    eprintln!("running `{program} {}` (waiting up to {} s)", args.join(" "), timeout.as_secs());
    // The input, stdout and stderr move on their own threads, so that neither side blocks on a
    // full pipe while the other waits.
    let mut stdin = child.stdin.take().expect("piped");
    let input = input.as_bytes().to_vec();
    let writer = std::thread::Builder::new().name(format!("{program} input")).spawn(move || stdin.write_all(&input));
    let read = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::Builder::new().name(format!("{program} output")).spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = read(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let stderr = read(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let (writer, stdout, stderr) = match (writer, stdout, stderr) {
        (Ok(w), Ok(o), Ok(e)) => (w, o, e),
        _ => {
            let _ = child.kill();
            let _ = child.wait();
            bail!("cannot start the threads that talk to {program}");
        }
    };
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().with_context(|| format!("waiting for {program}"))? {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "{program} did not finish within {} s and was stopped: the cluster's controller does not answer; \
                 nothing was submitted unless `{program}` says so later (check the cluster before trying again)",
                timeout.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let written = writer.join().unwrap_or(Ok(()));
    let output =
        Output { status, stdout: stdout.join().unwrap_or_default(), stderr: stderr.join().unwrap_or_default() };
    if output.status.success() {
        written.with_context(|| format!("cannot send the input to {program}"))?;
    }
    Ok(output)
}

/// The candidate closest to `word`, if it looks like a typo of it.
pub(crate) fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(word, c), c))
        .filter(|(score, _)| *score >= 0.85)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(nodes: usize, command: &[&str]) -> Request {
        Request {
            nodes,
            machine_type: "a3-megagpu-8g".into(),
            name: None,
            image: Some("img".into()),
            maxrs: "maxrs".into(),
            env: vec![],
            command: command.iter().map(|s| s.to_string()).collect(),
        }
    }

    const SEED: &[&str] = &[
        "train",
        "model_name=llama2-7b",
        "per_device_batch_size=4",
        "max_target_length=4096",
        "ici_fsdp_parallelism=8",
        "dcn_data_parallelism=2",
    ];

    #[test]
    fn the_seed_recipe_gets_gpu_keys_and_a_name() {
        let job = Job::prepare(request(2, SEED)).unwrap();
        assert_eq!(job.added_args, ["hardware=gpu", "plugin=cuda12"]);
        assert_eq!(job.args.last().unwrap(), "plugin=cuda12");
        assert_eq!(job.name, "maxrs-llama2-7b");
        assert!(job.summary.contains("16 GPUs"), "{}", job.summary);
        assert!(job.xla_flags.contains("--xla_gpu_all_reduce_combine_threshold_bytes=67108864"));
    }

    #[test]
    fn node_count_must_match_the_dcn_product() {
        let e = format!("{:#}", Job::prepare(request(4, SEED)).unwrap_err());
        assert!(e.contains("--nodes 4") && e.contains("dcn_data_parallelism=2"), "{e}");
    }

    #[test]
    fn wrong_commands_are_refused() {
        let e = Job::prepare(request(2, &[])).unwrap_err().to_string();
        assert!(e.contains("nothing to run"), "{e}");
        let e = Job::prepare(request(2, &["devices"])).unwrap_err().to_string();
        assert!(e.contains("`devices`"), "{e}");
        let mut cpu = SEED.to_vec();
        cpu.push("hardware=cpu");
        let e = Job::prepare(request(2, &cpu)).unwrap_err().to_string();
        assert!(e.contains("hardware=cpu cannot run"), "{e}");
    }

    #[test]
    fn user_env_wins_and_secrets_are_recognised() {
        let mut req = request(2, SEED);
        req.env = vec![("NCCL_DEBUG".into(), "INFO".into()), ("NCCL_ALGO".into(), "Ring".into())];
        let job = Job::prepare(req).unwrap();
        let env = job.env(vec![("NCCL_ALGO".into(), "Ring,Tree".into())], vec![("NNODES".into(), "2".into())]);
        let names: Vec<&str> = env.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["NCCL_ALGO", "XLA_FLAGS", "NNODES", "NCCL_DEBUG"]);
        assert_eq!(env[0].1, "Ring");
        assert!(is_secret_name("HF_TOKEN") && is_secret_name("WANDB_API_KEY") && !is_secret_name("NNODES"));
    }

    #[test]
    fn a_tool_that_hangs_is_stopped_at_its_deadline() {
        let start = Instant::now();
        let e = run_tool("sleep", &["30"], "", Duration::from_secs(1), "").unwrap_err().to_string();
        assert!(start.elapsed() < Duration::from_secs(10), "took {:?}", start.elapsed());
        assert!(e.starts_with("sleep did not finish within 1 s"), "{e}");
        let out = run_tool("cat", &[], "the input", Duration::from_secs(30), "").unwrap();
        assert_eq!(out.stdout, b"the input");
        let e = run_tool("maxrs-no-such-tool", &[], "", Duration::from_secs(1), "install it").unwrap_err();
        assert_eq!(e.to_string(), "maxrs-no-such-tool is not on PATH: install it");
    }

    #[test]
    fn names_and_quoting() {
        assert_eq!(default_name("My_Run.1"), "maxrs-my-run-1");
        assert!(check_name("Bad").is_err() && check_name("ok-1").is_ok());
        assert_eq!(shell_quote("a b'c"), r"'a b'\''c'");
        assert_eq!(shell_quote("configs/base.yml"), "configs/base.yml");
        assert_eq!(shell_quote(""), "''");
    }
}
