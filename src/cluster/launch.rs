//! `maxrs launch --num-processes N [--coordinator-port P] -- <maxrs arguments>`: runs N local
//! processes of one job, the way several GPUs of one machine run as separate processes and the
//! way the tests run clusters on loopback.
//!
//! Rank `i` gets `JAX_COORDINATOR_ADDRESS=127.0.0.1:P`, `NNODES=N`, `NODE_RANK=i` (and with
//! `--gpus-per-process K`, `CUDA_VISIBLE_DEVICES` = its K GPUs). Every output line is prefixed
//! with `[rank i]`. SIGINT, SIGTERM and SIGUSR1 are forwarded to every rank. As soon as a rank
//! fails, the others are stopped (SIGTERM, then SIGKILL after 5 s) and `launch` exits with status
//! 1 naming the rank; it exits 0 when every rank did.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

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

/// Copies `from` line by line to stdout or stderr, each line prefixed.
fn forward(
    from: impl Read + Send + 'static,
    prefix: String,
    to_stderr: bool,
    lock: Arc<Mutex<()>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
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

/// Runs the ranks; returns the exit status `launch` should end with.
pub fn launch(o: &LaunchOptions) -> Result<i32> {
    if o.num_processes == 0 {
        bail!("--num-processes must be at least 1");
    }
    let port = match o.coordinator_port {
        Some(p) => p,
        None => free_port()?,
    };
    let address = format!("127.0.0.1:{port}");
    println!("maxrs launch: {} processes, coordinator {address}", o.num_processes);
    let lock = Arc::new(Mutex::new(()));
    let children: Arc<Mutex<Vec<(usize, Child)>>> = Arc::new(Mutex::new(Vec::new()));
    let mut forwarders = Vec::new();
    for rank in 0..o.num_processes {
        let mut command = Command::new(&o.program);
        command
            .args(&o.args)
            .env("JAX_COORDINATOR_ADDRESS", &address)
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
        let prefix = format!("[rank {rank}] ");
        if let Some(out) = child.stdout.take() {
            forwarders.push(forward(out, prefix.clone(), false, lock.clone()));
        }
        if let Some(err) = child.stderr.take() {
            forwarders.push(forward(err, prefix, true, lock.clone()));
        }
        children.lock().unwrap_or_else(|p| p.into_inner()).push((rank, child));
    }

    let forwarded = children.clone();
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGUSR1,
    ])
    .context("installing signal handlers")?;
    let signal_handle = signals.handle();
    let signal_thread = std::thread::spawn(move || {
        for signal in signals.forever() {
            signal_all(&forwarded, signal);
        }
    });

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
