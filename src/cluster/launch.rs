//! `maxrs launch --num-processes N [--coordinator-port P] -- <maxrs arguments>`: runs N local
//! processes of one job, the way several GPUs of one machine run as separate processes and the
//! way the tests run clusters on loopback.
//!
//! Rank `i` gets `JAX_COORDINATOR_ADDRESS=127.0.0.1:P`, `NNODES=N`, `NODE_RANK=i` (and with
//! `--gpus-per-process K`, `CUDA_VISIBLE_DEVICES` = its K GPUs). Every output line is prefixed
//! with `[rank i]`. SIGINT, SIGTERM and SIGUSR1 are forwarded to every rank. As soon as a rank
//! fails, the others are stopped (SIGTERM, then SIGKILL after 5 s) and `launch` exits with status
//! 1 naming the rank; it exits 0 when every rank did. The counts are bounded ([`MAX_PROCESSES`],
//! [`MAX_GPUS`]); a rank or thread that cannot be started stops the ranks already running and
//! is one error.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

/// The most ranks on one machine: one per GPU is at most 16 (Google Cloud's largest GPU machine,
/// a2-megagpu-16g), CPU test clusters use a few; and each rank costs `launch` two pipes, so 256
/// ranks stay within the default limit of 1024 open files.
pub const MAX_PROCESSES: usize = 256;
/// The most GPUs `--gpus-per-process` may hand out in all (ranks x GPUs each): four times the
/// largest GPU machine.
pub const MAX_GPUS: usize = 64;

#[derive(Clone, Debug)]
pub struct LaunchOptions {
    pub num_processes: usize,
    /// `None` picks a free port.
    pub coordinator_port: Option<u16>,
    pub gpus_per_process: Option<usize>,
    /// The program to run (normally this maxrs binary) and its arguments.
    pub program: PathBuf,
    pub args: Vec<String>,
}

/// A free TCP port on loopback (free when this returns; a race with other programs is possible
/// but harmless here: the coordinator's bind error would say so).
pub fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).context("finding a free port")?;
    Ok(listener.local_addr()?.port())
}

fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        _ => "ended".to_string(),
    }
}

/// A thread named `name`; a thread that cannot be started (too many threads) is an error.
fn spawn<T: Send + 'static>(
    name: String,
    body: impl FnOnce() -> T + Send + 'static,
) -> Result<std::thread::JoinHandle<T>> {
    std::thread::Builder::new()
        .name(name.clone())
        .spawn(body)
        .map_err(|e| anyhow!("cannot start the thread {name}: {e}"))
}

/// Copies `from` line by line to stdout or stderr, each line prefixed.
fn forward(
    from: impl Read + Send + 'static,
    prefix: String,
    to_stderr: bool,
    lock: Arc<Mutex<()>>,
) -> Result<std::thread::JoinHandle<()>> {
    spawn(format!("{prefix}output"), move || {
        let mut reader = BufReader::new(from);
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let _guard = lock.lock().unwrap_or_else(|p| p.into_inner());
            let text = String::from_utf8_lossy(&line);
            let text = text.trim_end_matches('\n');
            let _ = if to_stderr {
                writeln!(std::io::stderr(), "{prefix}{text}")
            } else {
                writeln!(std::io::stdout(), "{prefix}{text}")
            };
        }
    })
}

fn signal_all(children: &Mutex<Vec<(usize, Child)>>, signal: libc::c_int) {
    for (_, child) in children.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        // SAFETY: kill has no memory-safety preconditions; the pid is our own child's.
        unsafe { libc::kill(child.id() as libc::pid_t, signal) };
    }
}

/// Ends every rank now (SIGKILL) and reaps it.
fn kill_all(children: &Mutex<Vec<(usize, Child)>>) {
    for (_, child) in children.lock().unwrap_or_else(|p| p.into_inner()).iter_mut() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Checks the counts before anything starts.
fn check(o: &LaunchOptions) -> Result<()> {
    if o.num_processes == 0 || o.num_processes > MAX_PROCESSES {
        bail!(
            "--num-processes {}: give 1 to {MAX_PROCESSES} (the processes of one machine; a job across machines runs \
             one launcher per machine, or a cluster launcher: maxrs submit)",
            o.num_processes
        );
    }
    if let Some(k) = o.gpus_per_process {
        if k == 0 || k.saturating_mul(o.num_processes) > MAX_GPUS {
            bail!(
                "--gpus-per-process {k}: give 1 or more, at most {MAX_GPUS} GPUs in all ({} processes x {k})",
                o.num_processes
            );
        }
    }
    if o.coordinator_port == Some(0) {
        bail!("--coordinator-port 0: give a port from 1 to 65535, or leave it out for a free one");
    }
    Ok(())
}

/// Runs the ranks; returns the exit status `launch` should end with.
pub fn launch(o: &LaunchOptions) -> Result<i32> {
    check(o)?;
    let port = match o.coordinator_port {
        Some(p) => p,
        None => free_port()?,
    };
    let address = format!("127.0.0.1:{port}");
    println!("maxrs launch: {} processes, coordinator {address}", o.num_processes);
    let lock = Arc::new(Mutex::new(()));
    let children: Arc<Mutex<Vec<(usize, Child)>>> = Arc::new(Mutex::new(Vec::new()));
    let mut forwarders = Vec::new();
    if let Err(e) = start_ranks(o, &address, &children, &lock, &mut forwarders) {
        kill_all(&children);
        return Err(e);
    }
    supervise(o, children, forwarders)
}

/// Starts every rank, each with its two output forwarders.
fn start_ranks(
    o: &LaunchOptions,
    address: &str,
    children: &Mutex<Vec<(usize, Child)>>,
    lock: &Arc<Mutex<()>>,
    forwarders: &mut Vec<std::thread::JoinHandle<()>>,
) -> Result<()> {
    for rank in 0..o.num_processes {
        let mut command = Command::new(&o.program);
        command
            .args(&o.args)
            .env("JAX_COORDINATOR_ADDRESS", address)
            .env("NNODES", o.num_processes.to_string())
            .env("NODE_RANK", rank.to_string())
            .env_remove("JAX_COORDINATOR_IP")
            .env_remove("JAX_COORDINATOR_PORT")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group: a terminal's Ctrl-C reaches the ranks once, through us.
            .process_group(0);
        if let Some(k) = o.gpus_per_process {
            let gpus: Vec<String> = (rank * k..(rank + 1) * k).map(|g| g.to_string()).collect();
            command.env("CUDA_VISIBLE_DEVICES", gpus.join(","));
        }
        // SAFETY: runs in the forked child before exec; prctl is async-signal-safe and touches
        // no memory of the parent.
        unsafe {
            command.pre_exec(|| {
                // The rank dies with `launch`, even if `launch` is killed with SIGKILL.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = command.spawn().with_context(|| format!("starting rank {rank}: {}", o.program.display()))?;
        let (out, err) = (child.stdout.take(), child.stderr.take());
        children.lock().unwrap_or_else(|p| p.into_inner()).push((rank, child));
        let prefix = format!("[rank {rank}] ");
        if let Some(out) = out {
            forwarders.push(forward(out, prefix.clone(), false, lock.clone())?);
        }
        if let Some(err) = err {
            forwarders.push(forward(err, prefix, true, lock.clone())?);
        }
    }
    Ok(())
}

/// Forwards signals to the ranks and waits for them; stops the others when one fails.
fn supervise(
    o: &LaunchOptions,
    children: Arc<Mutex<Vec<(usize, Child)>>>,
    forwarders: Vec<std::thread::JoinHandle<()>>,
) -> Result<i32> {
    let forwarded = children.clone();
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGUSR1,
    ])
    .context("installing signal handlers")
    .inspect_err(|_| kill_all(&children))?;
    let signal_handle = signals.handle();
    let signal_thread = spawn("signals".into(), move || {
        for signal in signals.forever() {
            signal_all(&forwarded, signal);
        }
    })
    .inspect_err(|_| kill_all(&children))?;

    let mut failed: Option<(usize, ExitStatus)> = None;
    let mut remaining = o.num_processes;
    while remaining > 0 && failed.is_none() {
        std::thread::sleep(Duration::from_millis(20));
        let mut list = children.lock().unwrap_or_else(|p| p.into_inner());
        let mut i = 0;
        while i < list.len() {
            match list[i].1.try_wait() {
                Ok(Some(status)) => {
                    let (rank, _) = list.remove(i);
                    remaining -= 1;
                    if !status.success() && failed.is_none() {
                        failed = Some((rank, status));
                    }
                }
                Ok(None) => i += 1,
                Err(e) => bail!("waiting for rank {}: {e}", list[i].0),
            }
        }
    }
    if let Some((rank, status)) = failed {
        let left = children.lock().unwrap_or_else(|p| p.into_inner()).len();
        eprintln!("maxrs launch: rank {rank} {}; stopping the other {left} rank(s)", describe(status));
        signal_all(&children, libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let mut list = children.lock().unwrap_or_else(|p| p.into_inner());
            list.retain_mut(|(_, child)| !matches!(child.try_wait(), Ok(Some(_))));
            if list.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                for (_, child) in list.iter_mut() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                break;
            }
            drop(list);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    signal_handle.close();
    let _ = signal_thread.join();
    for forwarder in forwarders {
        let _ = forwarder.join();
    }
    Ok(match failed {
        Some((rank, status)) => {
            eprintln!("maxrs launch: failed: rank {rank} {}", describe(status));
            1
        }
        None => 0,
    })
}
