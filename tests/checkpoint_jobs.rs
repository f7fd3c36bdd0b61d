//! Checkpoints of multi-process jobs, with real processes on loopback and the real coordination
//! service (`maxrs checkpoint-check`: each process holds its shards of a synthetic sharded state,
//! so no XLA program runs and many seeds stay cheap):
//! - 50 seeds: a 2-process job saving every 2 steps is SIGKILLed (or, every fifth seed, sent
//!   SIGTERM with `enable_autocheckpoint`) at a random moment, often in the middle of a save;
//!   the newest committed checkpoint then restores onto 1, 2 or 4 processes and other meshes,
//!   bit for bit, and uncommitted saves are never taken for checkpoints;
//! - a process dying mid-save stops the other one, and the job then resumes to the end.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use maxrs::checkpoint::dir::SLOW_WRITE_ENV;
use rand::{Rng, SeedableRng};

const MAXRS: &str = env!("CARGO_BIN_EXE_maxrs");

/// The processes of one job, each with its output in `dir/<name>.<rank>.out`.
struct Ranks {
    children: Vec<Child>,
}

fn spawn(dir: &Path, name: &str, processes: usize, args: &[String], env: &[(&str, &str)]) -> Ranks {
    let port = maxrs::cluster::launch::free_port().unwrap();
    let children = (0..processes)
        .map(|rank| {
            let out = std::fs::File::create(dir.join(format!("{name}.{rank}.out"))).unwrap();
            let err = out.try_clone().unwrap();
            Command::new(MAXRS)
                .arg("checkpoint-check")
                .args(args)
                .env("JAX_COORDINATOR_ADDRESS", format!("127.0.0.1:{port}"))
                .env("NNODES", processes.to_string())
                .env("NODE_RANK", rank.to_string())
                .env("RUST_LOG", "warn")
                .envs(env.iter().copied())
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err)
                .spawn()
                .unwrap()
        })
        .collect();
    Ranks { children }
}

impl Ranks {
    fn signal(&self, rank: usize, signal: libc::c_int) {
        // SAFETY: kill has no memory-safety preconditions; the pid is our own child's.
        unsafe { libc::kill(self.children[rank].id() as libc::pid_t, signal) };
    }

    /// Every rank's exit code (`None`: killed by a signal), waiting at most `limit`.
    fn wait(mut self, limit: Duration) -> Vec<Option<i32>> {
        let deadline = Instant::now() + limit;
        self.children
            .iter_mut()
            .map(|child| loop {
                if let Some(status) = child.try_wait().unwrap() {
                    break status.code();
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("a rank did not end within {limit:?}");
                }
                std::thread::sleep(Duration::from_millis(10));
            })
            .collect()
    }
}

/// Waits until every rank of job `name` has joined and begun its steps (said where it starts).
fn started(dir: &Path, name: &str, processes: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    for rank in 0..processes {
        while !output(dir, name, rank).contains(": starting at step 0") {
            assert!(Instant::now() < deadline, "rank {rank} did not start within 60 s:\n{}", output(dir, name, rank));
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn output(dir: &Path, name: &str, rank: usize) -> String {
    std::fs::read_to_string(dir.join(format!("{name}.{rank}.out"))).unwrap_or_default()
}

fn args(base: &Path, extra: &[&str]) -> Vec<String> {
    let mut a = vec![
        format!("base_output_directory={}", base.display()),
        "run_name=job".to_string(),
        "enable_checkpointing=true".to_string(),
        "heartbeat_timeout_seconds=10".to_string(),
    ];
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// The committed checkpoints' steps (a local checkpoint is committed once renamed to its step).
fn committed(base: &Path) -> Vec<u64> {
    let mut steps: Vec<u64> = std::fs::read_dir(base.join("job/checkpoints"))
        .map(|entries| entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
        .unwrap_or_default();
    steps.sort_unstable();
    steps
}

/// Restores the newest checkpoint on `processes` processes with `--devices-per-process` and
/// `--fsdp` as given; returns the step every rank restored (all must agree and say identical),
/// `None` when every rank failed for want of a checkpoint.
fn verify(base: &Path, name: &str, processes: usize, devices: usize, fsdp: usize, seed: u64) -> Option<u64> {
    let extra = [
        "--verify-only".to_string(),
        format!("--devices-per-process={devices}"),
        format!("--fsdp={fsdp}"),
        format!("--seed={seed}"),
    ];
    let mut a = args(base, &[]);
    a.extend(extra);
    let codes = spawn(base, name, processes, &a, &[]).wait(Duration::from_secs(60));
    let outputs: Vec<String> = (0..processes).map(|r| output(base, name, r)).collect();
    // Each rank says so, or that the job failed as another rank said so first.
    if outputs.iter().all(|out| out.contains("--verify-only: no checkpoint in")) {
        assert!(codes.iter().all(|&c| c == Some(1)), "{name}: {codes:?}\n{}", outputs.join("\n"));
        return None;
    }
    assert!(codes.iter().all(|&c| c == Some(0)), "{name}: {codes:?}\n{}", outputs.join("\n"));
    let steps: Vec<Option<u64>> = outputs
        .iter()
        .map(|out| {
            let line = out.lines().find(|l| l.starts_with("restored the checkpoint of step "))?;
            assert!(line.ends_with(": identical"), "{line}");
            line["restored the checkpoint of step ".len()..].split(' ').next()?.parse().ok()
        })
        .collect();
    assert!(steps.iter().all(|s| *s == steps[0]), "{name}: the ranks restored different steps: {steps:?}");
    steps[0]
}

#[test]
fn random_kills_of_a_two_process_job_leave_the_newest_committed_checkpoint_restorable_anywhere() {
    let tmp = tempfile::tempdir().unwrap();
    // (processes, devices per process, fsdp) of the restoring job; the saving one is 2 x 4,
    // replicated across the two processes and split 4 ways within each.
    let restores = [(1, 1, 1), (2, 4, 8), (4, 2, 4), (4, 4, 16)];
    let mut killed_mid_save = 0;
    for seed in 0..50u64 {
        let base = tmp.path().join(format!("seed{seed}"));
        std::fs::create_dir_all(&base).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let preempt = seed % 5 == 0;
        let asynchronous = if seed % 2 == 0 { "async_checkpointing=true" } else { "async_checkpointing=false" };
        let autocheckpoint = if preempt { "enable_autocheckpoint=true" } else { "enable_autocheckpoint=false" };
        let mut a = args(&base, &["steps=100000", "checkpoint_period=2", asynchronous, autocheckpoint]);
        a.extend(["--step-ms=2".to_string(), format!("--seed={seed}")]);
        // Each data file write pauses, so that kills land inside saves.
        let ranks = spawn(&base, "save", 2, &a, &[(SLOW_WRITE_ENV, "3")]);
        // The random moment counts from when both ranks run their steps: a signal before a
        // rank has installed its SIGTERM handler (a loaded machine starts processes slowly)
        // would kill it outright, which no preemption notice does on a running job.
        started(&base, "save", 2);
        std::thread::sleep(Duration::from_millis(rng.gen_range(50..700)));
        let codes = if preempt {
            ranks.signal(0, libc::SIGTERM);
            ranks.signal(1, libc::SIGTERM);
            ranks.wait(Duration::from_secs(30))
        } else {
            let victim = rng.gen_range(0..2);
            ranks.signal(victim, libc::SIGKILL);
            ranks.signal(1 - victim, libc::SIGKILL);
            ranks.wait(Duration::from_secs(30))
        };
        let saved = committed(&base);
        let staging = std::fs::read_dir(base.join("job/checkpoints")).into_iter().flatten();
        killed_mid_save += staging
            .filter(|e| e.as_ref().is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".maxrs-tmp")))
            .count();
        if preempt {
            let outputs: Vec<String> = (0..2).map(|r| output(&base, "save", r)).collect();
            assert_eq!(
                codes,
                [Some(0), Some(0)],
                "seed {seed}: SIGTERM ends every rank with 0\n{}",
                outputs.join("\n")
            );
            let stops: Vec<&str> = outputs
                .iter()
                .map(|o| o.lines().find(|l| l.starts_with("preempted: stopped before step")).unwrap_or(""))
                .collect();
            assert!(!stops[0].is_empty() && stops[0] == stops[1], "seed {seed}: {stops:?}");
            let stop: u64 =
                stops[0]["preempted: stopped before step ".len()..].split(',').next().unwrap().parse().unwrap();
            if stop > 0 {
                assert_eq!(saved.last(), Some(&(stop - 1)), "seed {seed}: the preemption saves the last step run");
            }
        }
        let (processes, devices, fsdp) = restores[seed as usize % restores.len()];
        let restored = verify(&base, "restore", processes, devices, fsdp, seed);
        assert_eq!(restored, saved.last().copied(), "seed {seed}: the newest committed checkpoint is restored");
    }
    assert!(killed_mid_save >= 10, "only {killed_mid_save} of 40 kills landed inside a save");
}

#[test]
fn a_process_dying_mid_save_stops_the_job_and_the_job_resumes_from_the_previous_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path();
    let a = args(base, &["steps=40", "checkpoint_period=10", "async_checkpointing=true", "--step-ms=20"]);
    // Each file write of a save pauses 400 ms: rank 1 dies inside the save of step 10.
    let ranks = spawn(base, "first", 2, &a, &[(SLOW_WRITE_ENV, "400")]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !output(base, "first", 1).contains("started an asynchronous checkpoint save for step 10") {
        assert!(Instant::now() < deadline, "{}", output(base, "first", 1));
        std::thread::sleep(Duration::from_millis(5));
    }
    ranks.signal(1, libc::SIGKILL);
    let codes = ranks.wait(Duration::from_secs(30));
    assert_eq!(codes[0], Some(1), "the other process stops with an error:\n{}", output(base, "first", 0));
    assert_eq!(committed(base), [0], "the interrupted save of step 10 is not a checkpoint");
    // The same job again: it resumes after step 0, saves on to the end, and the last checkpoint
    // restores on one process.
    let codes = spawn(base, "second", 2, &a, &[]).wait(Duration::from_secs(60));
    assert_eq!(codes, [Some(0), Some(0)], "{}", output(base, "second", 0));
    assert!(output(base, "second", 0).contains("restored the checkpoint of step 0 (2 processes wrote it"));
    assert_eq!(committed(base), [0, 10, 20, 30, 39]);
    assert_eq!(verify(base, "restore", 1, 1, 1, 0), Some(39));
}
