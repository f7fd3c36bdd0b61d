//! Running the `maxrs` binary as a user would, for the tests of what it refuses: one error
//! line naming the culprit, before any compile, within a deadline (a command that would hang
//! is killed and fails its test instead of hanging the suite).

use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Far more than any refusal takes, even in a debug build on a busy machine.
pub const DEADLINE: Duration = Duration::from_secs(120);

/// `maxrs args` with `env` added and the caller's `MAXRS_PJRT_PLUGIN` removed. `XLA_FLAGS` is
/// the test binary's (its cheapest-compile flags, see tests/main.rs, unless the caller set it).
pub fn command(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_maxrs"));
    cmd.args(args).env_remove("MAXRS_PJRT_PLUGIN");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// Runs `cmd` to its end; past [`DEADLINE`] it is killed and the test fails.
pub fn finish(mut cmd: Command) -> Output {
    let mut child =
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("maxrs starts");
    // Read while it runs, so that a full pipe cannot stop it.
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            pipe.read_to_end(&mut bytes).map(|_| bytes).expect("read maxrs's output")
        })
    };
    let stdout = drain(Box::new(child.stdout.take().expect("piped")));
    let stderr = drain(Box::new(child.stderr.take().expect("piped")));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for maxrs") {
            break status;
        }
        if started.elapsed() > DEADLINE {
            child.kill().expect("kill maxrs");
            child.wait().expect("reap maxrs");
            panic!("{cmd:?} did not finish within {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output { status, stdout: stdout.join().expect("stdout"), stderr: stderr.join().expect("stderr") }
}

pub fn maxrs(args: &[&str], env: &[(&str, &str)]) -> Output {
    finish(command(args, env))
}

/// Runs a command that must fail before training; returns its error line.
pub fn refused_by(cmd: Command) -> String {
    let shown = format!("{cmd:?}");
    let out = finish(cmd);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "{shown} must fail:\n{stdout}\n{stderr}");
    assert!(!stdout.contains("start-up:"), "{shown} must fail before compiling:\n{stdout}");
    assert!(!stderr.contains("panicked"), "{shown} panicked:\n{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 1, "{shown}: one error line expected:\n{stderr}");
    errors[0].to_string()
}

/// `maxrs launch --num-processes N -- train args` on loopback, within [`DEADLINE`]; fails the test
/// if the job fails. Returns the lines of its metrics file `metrics` (written by rank 0; `args`
/// must not name another) and its output.
pub fn launch_train(processes: usize, args: &[String], metrics: &std::path::Path) -> (Vec<serde_json::Value>, String) {
    let n = processes.to_string();
    let mut all: Vec<&str> = vec!["launch", "--num-processes", &n, "--", "train"];
    all.extend(args.iter().map(String::as_str));
    let file = format!("metrics_file={}", metrics.display());
    all.push(&file);
    let out = finish(command(&all, &[("RUST_LOG", "warn")]));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "maxrs {all:?}:\n{stdout}\n{stderr}");
    let lines = std::fs::read_to_string(metrics).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    (lines, stdout.into_owned())
}

pub fn refused(args: &[&str], env: &[(&str, &str)]) -> String {
    refused_by(command(args, env))
}

/// `maxrs train args` with XLA's default optimization (`XLA_FLAGS` empty) in a scratch output
/// directory, for models large enough that running XLA's unoptimized code costs more than
/// optimizing it (the JaxPP tiny Llama 2 on two stages: 17.8 CPU-s, 23.2 with the test binary's
/// cheapest-compile flags, its initializer alone 13 s). Returns the `completed step` losses and
/// stdout; fails the test if the run fails.
pub fn train_optimized(args: &[&str]) -> (Vec<f64>, String) {
    train_with_env(args, &[("XLA_FLAGS", "")])
}

/// [`train_optimized`] with the test binary's cheapest-compile flags, for small models (a
/// 2-layer width-64 MoE: 7.6 CPU-s, 12.8 with XLA's default optimization).
pub fn train(args: &[&str]) -> (Vec<f64>, String) {
    train_with_env(args, &[])
}

fn train_with_env(args: &[&str], env: &[(&str, &str)]) -> (Vec<f64>, String) {
    let dir = tempfile::tempdir().unwrap();
    let output = format!("base_output_directory={}", dir.path().display());
    let all: Vec<&str> =
        ["train", output.as_str(), "enable_checkpointing=false"].into_iter().chain(args.iter().copied()).collect();
    let out = maxrs(&all, env);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "maxrs {all:?}:\n{stdout}\n{stderr}");
    (losses(&stdout), stdout.into_owned())
}

/// The `loss` of each `completed step` line of a run's stdout (not `moe_lb_loss`).
pub fn losses(stdout: &str) -> Vec<f64> {
    stdout
        .lines()
        .filter(|l| l.starts_with("completed step: "))
        .map(|l| l.split(", ").find_map(|f| f.strip_prefix("loss: ")).unwrap().parse().unwrap())
        .collect()
}
