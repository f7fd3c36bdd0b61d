//! `maxrs submit vertex|slurm|gke [options] -- train <config> key=value ...`: the local train
//! command, run on a cluster. `--dry-run` prints exactly what would be submitted and exits;
//! `--output FILE` (Slurm, GKE) writes it through `output::check` and `files::write_atomic`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use maxrs::files::Kind;
use maxrs::files::Location;
use maxrs::net::google;
use maxrs::net::retry::RetryPolicy;
use maxrs::output::{self, Input, Output};
use maxrs::submit::settings::Settings;
use maxrs::submit::vertex_api::{self, JobRef, VertexApi};
use maxrs::submit::{self, gke, machine, slurm, vertex, Job, Request};

/// `println!` through [`emit`].
macro_rules! outln {
    ($($arg:tt)*) => {
        emit(&format!("{}\n", format_args!($($arg)*)))?
    };
}
#[derive(clap::Args)]
pub struct SubmitArgs {
    #[command(subcommand)]
    target: Target,
}

#[derive(clap::Subcommand)]
enum Target {
    /// A Vertex AI custom job (A3 Mega), created through the Vertex AI REST API.
    Vertex(VertexArgs),
    /// An sbatch script; printed, or submitted with --submit.
    Slurm(SlurmArgs),
    /// A GKE JobSet manifest; printed, or applied with --apply.
    Gke(GkeArgs),
}

/// Options every launcher takes.
#[derive(clap::Args)]
struct Common {
    /// Number of machines (one maxrs process each); the config's dcn_* parallelism must multiply to it.
    #[arg(long)]
    nodes: Option<usize>,
    /// Container image with maxrs on its PATH and the config files the command names.
    #[arg(long)]
    image: Option<String>,
    /// Machine type (default a3-megagpu-8g).
    #[arg(long)]
    machine_type: Option<String>,
    /// Job name (default maxrs-<run_name or model_name>).
    #[arg(long)]
    name: Option<String>,
    /// Extra environment for every process (repeatable).
    #[arg(long = "env", value_name = "NAME=VALUE")]
    env: Vec<String>,
    /// The maxrs program on the nodes (default: maxrs, from PATH).
    #[arg(long, value_name = "PATH")]
    maxrs: Option<String>,
    /// YAML file whose `submit:` section holds defaults (default: $MAXRS_SUBMIT_CONFIG).
    #[arg(long, value_name = "FILE")]
    submit_config: Option<PathBuf>,
    /// Print exactly what would be submitted, and exit.
    #[arg(long)]
    dry_run: bool,
    /// The maxrs command to run: `train <config> key=value ...`.
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

#[derive(clap::Args)]
struct VertexArgs {
    #[command(flatten)]
    common: Common,
    /// Google Cloud project.
    #[arg(long)]
    project: Option<String>,
    /// Vertex AI region, e.g. us-central1.
    #[arg(long)]
    region: Option<String>,
    /// VPC to peer with: projects/PROJECT_NUMBER/global/networks/NAME.
    #[arg(long)]
    network: Option<String>,
    /// Reservation to run in: projects/PROJECT/zones/ZONE/reservations/NAME.
    #[arg(long)]
    reservation: Option<String>,
    /// Service account the job runs as.
    #[arg(long)]
    service_account: Option<String>,
    /// Show a job's state instead of submitting (its id or full name).
    #[arg(long, value_name = "JOB", conflicts_with = "logs")]
    status: Option<String>,
    /// Print a job's logs (from Cloud Logging) instead of submitting.
    #[arg(long, value_name = "JOB")]
    logs: Option<String>,
    /// With --logs: at most this many lines, oldest first (at most 100000).
    #[arg(long, default_value_t = 1000)]
    limit: usize,
}

#[derive(clap::Args)]
struct SlurmArgs {
    #[command(flatten)]
    common: Common,
    #[arg(long)]
    partition: Option<String>,
    /// Wall-clock limit (sbatch --time), e.g. 24:00:00.
    #[arg(long)]
    time: Option<String>,
    #[arg(long)]
    account: Option<String>,
    /// `module load` before the run (repeatable).
    #[arg(long = "module", value_name = "MODULE")]
    modules: Vec<String>,
    /// Extra container mount with --image (pyxis src:dst, repeatable).
    #[arg(long = "container-mount", value_name = "SRC:DST")]
    container_mounts: Vec<String>,
    /// Write the script to FILE.
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Replace FILE if it exists.
    #[arg(long, requires = "output")]
    force: bool,
    /// Submit the script with sbatch.
    #[arg(long)]
    submit: bool,
}

#[derive(clap::Args)]
struct GkeArgs {
    #[command(flatten)]
    common: Common,
    #[arg(long)]
    namespace: Option<String>,
    /// Kueue LocalQueue for the JobSet.
    #[arg(long)]
    queue: Option<String>,
    /// GKE Network objects for the 8 GPU NICs, comma-separated (default vpc1,...,vpc8).
    #[arg(long, value_delimiter = ',')]
    networks: Vec<String>,
    /// Write the manifest to FILE.
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Replace FILE if it exists.
    #[arg(long, requires = "output")]
    force: bool,
    /// Apply the manifest with `kubectl apply -f -`.
    #[arg(long)]
    apply: bool,
}

pub fn run(args: SubmitArgs) -> Result<()> {
    match args.target {
        Target::Vertex(a) => run_vertex(a),
        Target::Slurm(a) => run_slurm(a),
        Target::Gke(a) => run_gke(a),
    }
}

/// `--submit-config`, else `$MAXRS_SUBMIT_CONFIG`.
fn settings_path(common: &Common) -> Option<PathBuf> {
    common.submit_config.clone().or_else(|| std::env::var_os("MAXRS_SUBMIT_CONFIG").map(PathBuf::from))
}

fn settings(common: &Common) -> Result<Settings> {
    match settings_path(common) {
        Some(p) => Settings::load(&p),
        None => Ok(Settings::default()),
    }
}

/// Flags over the settings file, checked and prepared.
fn prepare(common: &Common, s: &Settings) -> Result<Job> {
    let machine_type = common.machine_type.clone().or(s.machine_type.clone());
    let machine_type = machine_type.unwrap_or_else(|| machine::DEFAULT_MACHINE_TYPE.to_string());
    let nodes = common.nodes.or(s.nodes).ok_or_else(|| {
        anyhow!(
            "give --nodes N: the number of {machine_type} machines (the config's dcn_* parallelism must multiply to N)"
        )
    })?;
    let mut env: Vec<(String, String)> = s.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    for e in &common.env {
        env.push(submit::parse_env(e)?);
    }
    let job = Job::prepare(Request {
        nodes,
        machine_type,
        name: common.name.clone().or(s.name.clone()),
        image: common.image.clone().or(s.image.clone()),
        maxrs: common.maxrs.clone().or(s.maxrs.clone()).unwrap_or_else(|| "maxrs".into()),
        env,
        command: common.command.clone(),
    })?;
    eprintln!("job {}: {}", job.name, job.summary);
    if !job.added_args.is_empty() {
        eprintln!("added for the GPU nodes: {}", job.added_args.join(" "));
    }
    let secrets: Vec<&str> =
        job.user_env.iter().map(|(n, _)| n.as_str()).filter(|n| submit::is_secret_name(n)).collect();
    if !secrets.is_empty() {
        eprintln!("the values of {} are submitted but printed as {}", secrets.join(", "), submit::REDACTED);
    }
    Ok(job)
}

fn require(value: Option<String>, flag: &str, what: &str) -> Result<String> {
    value.ok_or_else(|| anyhow!("give {flag} ({what}), or `{}:` in the submit settings file", &flag[2..]))
}

fn run_vertex(a: VertexArgs) -> Result<()> {
    let s = settings(&a.common)?;
    // They go into the request URLs (the region into the host name): checked before anything else.
    if let Some(p) = &a.project {
        google::check_project("--project", p)?;
    }
    if let Some(r) = &a.region {
        google::check_region("--region", r)?;
    }
    if a.limit == 0 || a.limit > vertex_api::MAX_LOG_LINES {
        bail!("--limit {}: give 1 to {} log lines", a.limit, vertex_api::MAX_LOG_LINES);
    }
    let project = a.project.clone().or(s.project.clone());
    let region = a.region.clone().or(s.region.clone());
    if let Some(job) = a.status.as_deref().or(a.logs.as_deref()) {
        let job = JobRef::parse(job, project.as_deref(), region.as_deref())?;
        let api = VertexApi::new(http_client()?, vertex_api::access_token()?, &job.region, RetryPolicy::default())?;
        return if a.status.is_some() { print_status(&api, &job) } else { print_logs(&api, &job, a.limit) };
    }

    let job = prepare(&a.common, &s)?;
    let opts = vertex::VertexOptions {
        project: require(project, "--project", "the Google Cloud project")?,
        region: require(region, "--region", "the Vertex AI region, e.g. us-central1")?,
        network: a.network.or(s.network.clone()),
        reservation: a.reservation.or(s.reservation.clone()),
        service_account: a.service_account.or(s.service_account.clone()),
    };
    let body = vertex::custom_job(&job, &opts)?;
    if a.common.dry_run {
        let url =
            vertex_api::create_url(&vertex_api::aiplatform_endpoint(&opts.region)?.url, &opts.project, &opts.region);
        eprintln!("dry run: this is the body maxrs would POST to {url}");
        emit(&format!("{}\n", body.to_display_json()))?;
        return Ok(());
    }
    let api = VertexApi::new(http_client()?, vertex_api::access_token()?, &opts.region, RetryPolicy::default())?;
    let created = api.create_custom_job(&opts.project, &opts.region, &body)?;
    let job_ref = JobRef { project: opts.project.clone(), region: opts.region.clone(), id: created.id().to_string() };
    let again = format!("--project {} --region {}", opts.project, opts.region);
    outln!("submitted {}: {} ({})", job.name, created.name, created.state);
    outln!("  status:  maxrs submit vertex --status {} {again}", job_ref.id);
    outln!("  logs:    maxrs submit vertex --logs {} {again}", job_ref.id);
    outln!("  console: {}", job_ref.console_url());
    Ok(())
}

fn print_status(api: &VertexApi, job: &JobRef) -> Result<()> {
    let info = api.get_custom_job(job)?;
    outln!("job      {} ({})", info.id(), info.display_name);
    outln!("state    {}", info.state);
    for (label, time) in [("created", &info.create_time), ("started", &info.start_time), ("ended", &info.end_time)] {
        if let Some(t) = time {
            outln!("{label:<8} {t}");
        }
    }
    if let Some(e) = &info.error {
        outln!("error    {} (code {})", e.message, e.code);
    }
    outln!("console  {}", job.console_url());
    Ok(())
}

fn print_logs(api: &VertexApi, job: &JobRef, limit: usize) -> Result<()> {
    let lines = api.logs(job, limit)?;
    if lines.is_empty() {
        eprintln!("no log entries yet for job {} (they reach Cloud Logging once the replicas start)", job.id);
    }
    for l in lines {
        let task = if l.task.is_empty() { String::new() } else { format!(" [{}]", l.task) };
        outln!("{}{task} {}", l.timestamp, l.message);
    }
    Ok(())
}

/// The Vertex AI and Cloud Logging calls' client: each connect and read within 2 minutes.
fn http_client() -> Result<reqwest::blocking::Client> {
    maxrs::net::client(Duration::from_secs(120))
}

fn run_slurm(a: SlurmArgs) -> Result<()> {
    check_output(a.output.as_deref(), a.force, &a.common)?;
    let s = settings(&a.common)?;
    let job = prepare(&a.common, &s)?;
    let mut modules = s.slurm.modules.clone();
    modules.extend(a.modules);
    let mut container_mounts = s.slurm.container_mounts.clone();
    container_mounts.extend(a.container_mounts);
    let opts = slurm::SlurmOptions {
        partition: a.partition.or(s.slurm.partition.clone()),
        time: a.time.or(s.slurm.time.clone()),
        account: a.account.or(s.slurm.account.clone()),
        modules,
        container_mounts,
    };
    let script = slurm::script(&job, &opts)?;
    if let Some(path) = &a.output {
        write_file(path, &script)?;
        eprintln!("wrote {}", path.display());
    }
    if a.submit && !a.common.dry_run {
        let id = slurm::submit(&script)?;
        outln!("submitted batch job {id} ({}); follow it with `squeue -j {id}`", job.name);
    } else if a.output.is_none() {
        emit(&slurm::display_script(&job, &opts)?)?;
        if !a.common.dry_run {
            eprintln!("submit it with --submit (runs sbatch), or save it and run `sbatch FILE` on the cluster");
        }
    }
    Ok(())
}

fn run_gke(a: GkeArgs) -> Result<()> {
    check_output(a.output.as_deref(), a.force, &a.common)?;
    let s = settings(&a.common)?;
    let job = prepare(&a.common, &s)?;
    let opts = gke::GkeOptions {
        namespace: a.namespace.or(s.gke.namespace.clone()),
        queue: a.queue.or(s.gke.queue.clone()),
        networks: if a.networks.is_empty() { s.gke.networks.clone() } else { a.networks },
    };
    let manifest = gke::manifest(&job, &opts)?;
    if let Some(path) = &a.output {
        write_file(path, &manifest)?;
        eprintln!("wrote {}", path.display());
    }
    if a.apply && !a.common.dry_run {
        outln!("{}", gke::apply(&manifest)?);
        outln!(
            "follow it with `kubectl get jobset {0}` and `kubectl logs -f {0}-{1}-0-0-<suffix>`",
            job.name,
            gke::REPLICATED_JOB
        );
    } else if a.output.is_none() {
        emit(&gke::display_manifest(&job, &opts)?)?;
        if !a.common.dry_run {
            eprintln!("apply it with --apply (runs kubectl apply -f -), or save it and run `kubectl apply -f FILE`");
        }
    }
    Ok(())
}

/// Writes to stdout; a reader that closed the pipe early (`| head`) is not an error.
fn emit(text: &str) -> Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(anyhow!("cannot write to stdout: {e}")),
        _ => Ok(()),
    }
}

/// `--output FILE`, before anything is prepared: a new file, or an existing one with `--force`
/// (as gzip, xz and zstd ask: the path may name any file of the user's, such as the config the
/// job trains with), and never the submit settings file it reads.
fn check_output(path: Option<&Path>, force: bool, common: &Common) -> Result<()> {
    let Some(path) = path else { return Ok(()) };
    let settings = settings_path(common).map(|p| Input {
        name: "--submit-config",
        location: Location::Local(p),
        directory: false,
    });
    let write = Output { name: "--output", location: Location::Local(path.to_owned()), kind: Kind::File { force } };
    output::check(settings.as_slice(), &[write])
}

/// Writes a file that may hold secret values: readable by its owner only (narrowed before
/// anything is written to it).
fn write_file(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    maxrs::files::write_atomic(path, |file| {
        #[cfg(unix)]
        file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        file.write_all(text.as_bytes())
    })
}
