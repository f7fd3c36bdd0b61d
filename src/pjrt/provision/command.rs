//! Running a helper program (`python3`, `ptxas`) with a deadline, so that a hung or very slow
//! interpreter never stalls maxrs's start-up.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `cmd` and returns its stdout when it exits successfully within `timeout`; `None` when
/// the program is missing, fails, or is too slow (it is killed then). Only for short outputs:
/// stdout is read after the exit, so more than a pipe buffer (64 KiB) would stall the child.
pub(super) fn stdout_within(mut cmd: Command, timeout: Duration) -> Option<String> {
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().ok()?;
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                // Best effort: the child may have exited between the checks.
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    };
    if !status.success() {
        return None;
    }
    let mut out = String::new();
    child.stdout.take()?.read_to_string(&mut out).ok()?;
    Some(out)
}
