//! Hang diagnostics (MaxText's `collect_stack_trace`): a report of what this process is waiting
//! for (train step and phase, the coordination calls in flight: key-value gets, barriers,
//! registration) and the stack of every thread, the plugin's included, logged to stderr:
//!
//! - on `SIGUSR1` (`kill -USR1 PID`; `maxrs launch` forwards it to every rank);
//! - once per step when a step runs longer than `slow_step_stack_trace_factor` x the median
//!   step so far (in a hung collective every process is in the same step, so every process
//!   logs);
//! - every `stack_trace_interval_seconds` with `collect_stack_trace=true`;
//! - before a process stops because the job failed.
//!
//! Stacks of other threads are taken by signalling each thread (`tgkill`); its handler walks its
//! own stack into a fixed buffer (no allocation, no locks) and the reporting thread symbolizes
//! the addresses. A thread that does not answer within 200 ms (signal blocked) is listed with
//! its kernel state instead.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

/// What the process is doing right now, besides the in-flight waits.
struct Phase {
    step: Option<u64>,
    what: String,
    since: Instant,
}

static PHASE: Mutex<Option<Phase>> = Mutex::new(None);
static WAITS: Mutex<Vec<(u64, String, Instant)>> = Mutex::new(Vec::new());
/// The last wait that ended, and when.
static LAST_WAIT: Mutex<Option<(String, Instant)>> = Mutex::new(None);
static NEXT_WAIT: AtomicU64 = AtomicU64::new(0);

/// Marks the end of a wait when dropped.
pub struct Waiting(u64);

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut waits = WAITS.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = waits.iter().position(|(id, _, _)| *id == self.0) {
            let (_, what, _) = waits.remove(i);
            *LAST_WAIT.lock().unwrap_or_else(|p| p.into_inner()) = Some((what, Instant::now()));
        }
    }
}

/// Records that this process waits for `what` (a key, a barrier) until the guard is dropped.
pub fn waiting_for(what: String) -> Waiting {
    let id = NEXT_WAIT.fetch_add(1, Ordering::Relaxed);
    WAITS.lock().unwrap_or_else(|p| p.into_inner()).push((id, what, Instant::now()));
    Waiting(id)
}

/// Records the training loop's step and phase (`"feeding the batch"`, `"running the step"`).
pub fn set_phase(step: Option<u64>, what: &str) {
    *PHASE.lock().unwrap_or_else(|p| p.into_inner()) =
        Some(Phase { step, what: what.to_string(), since: Instant::now() });
}

/// The report: phase, waits and every thread's stack.
pub fn report(reason: &str) -> String {
    let mut out = format!("==== maxrs diagnostics (pid {}): {reason}\n", std::process::id());
    out.push_str(&summary());
    out.push_str(&thread_stacks());
    out.push_str("==== end of diagnostics\n");
    out
}

/// What the process is doing and waiting for, without stacks.
pub fn summary() -> String {
    let mut out = String::new();
    match &*PHASE.lock().unwrap_or_else(|p| p.into_inner()) {
        Some(p) => {
            let step = p.step.map(|s| format!("step {s}, ")).unwrap_or_default();
            let _ = writeln!(out, "phase: {step}{} (for {:.1} s)", p.what, p.since.elapsed().as_secs_f64());
        }
        None => out.push_str("phase: start-up\n"),
    }
    let waits = WAITS.lock().unwrap_or_else(|p| p.into_inner()).clone();
    if waits.is_empty() {
        out.push_str("waiting for: nothing from the coordinator (XLA's own collectives are not tracked)\n");
    }
    for (_, what, since) in waits {
        let _ = writeln!(out, "waiting for: {what} (for {:.1} s)", since.elapsed().as_secs_f64());
    }
    if let Some((what, ended)) = &*LAST_WAIT.lock().unwrap_or_else(|p| p.into_inner()) {
        let _ = writeln!(out, "last finished wait: {what} ({:.1} s ago)", ended.elapsed().as_secs_f64());
    }
    out
}

/// Logs the report to stderr.
pub fn log_report(reason: &str) {
    eprint!("{}", report(reason));
}

// ---- slow steps ----

struct Steps {
    current: Option<(u64, Instant)>,
    durations: Vec<f64>,
    reported: Option<u64>,
}

static STEPS: Mutex<Steps> = Mutex::new(Steps { current: None, durations: Vec::new(), reported: None });

pub fn step_started(step: u64) {
    STEPS.lock().unwrap_or_else(|p| p.into_inner()).current = Some((step, Instant::now()));
}

pub fn step_finished(step: u64) {
    let mut steps = STEPS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((s, start)) = steps.current.take() {
        // The first step compiles and warms up: it says nothing about the others.
        if s == step && step > 0 {
            steps.durations.push(start.elapsed().as_secs_f64());
        }
    }
}

/// The running step and how long it has run, when it exceeds `factor` x the median step.
fn slow_step(factor: f64) -> Option<(u64, f64, f64)> {
    let mut steps = STEPS.lock().unwrap_or_else(|p| p.into_inner());
    let (step, start) = steps.current?;
    if steps.durations.is_empty() || steps.reported == Some(step) {
        return None;
    }
    let mut sorted = steps.durations.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    let elapsed = start.elapsed().as_secs_f64();
    if elapsed > factor * median && elapsed > 1.0 {
        steps.reported = Some(step);
        return Some((step, elapsed, median));
    }
    None
}

/// Starts the watchers: `SIGUSR1`, slow steps (`factor` > 0) and the periodic report
/// (`interval`). Once per process.
pub fn install(slow_step_factor: f64, interval: Option<Duration>) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        match signal_hook::iterator::Signals::new([signal_hook::consts::SIGUSR1]) {
            Ok(mut signals) => {
                let spawned = std::thread::Builder::new().name("maxrs-sigusr1".into()).spawn(move || {
                    for _ in signals.forever() {
                        log_report("SIGUSR1");
                    }
                });
                if let Err(e) = spawned {
                    tracing::warn!("no SIGUSR1 diagnostics: {e}");
                }
            }
            Err(e) => tracing::warn!("no SIGUSR1 diagnostics: {e}"),
        }
        let spawned = std::thread::Builder::new().name("maxrs-watchdog".into()).spawn(move || {
            let mut last_periodic = Instant::now();
            loop {
                std::thread::sleep(Duration::from_millis(250));
                if slow_step_factor > 0.0 {
                    if let Some((step, elapsed, median)) = slow_step(slow_step_factor) {
                        log_report(&format!(
                            "step {step} has run {elapsed:.1} s, more than slow_step_stack_trace_factor={slow_step_factor} x \
                             the median step ({median:.3} s)"
                        ));
                    }
                }
                if let Some(interval) = interval {
                    if last_periodic.elapsed() >= interval {
                        last_periodic = Instant::now();
                        log_report("collect_stack_trace (every stack_trace_interval_seconds)");
                    }
                }
            }
        });
        if let Err(e) = spawned {
            tracing::warn!("no slow-step diagnostics: {e}");
        }
    });
}

// ---- other threads' stacks ----

const MAX_FRAMES: usize = 48;

/// The one capture in flight: the target thread id and where its handler writes.
static TARGET: AtomicI32 = AtomicI32::new(0);
static FRAMES: [AtomicUsize; MAX_FRAMES] = [const { AtomicUsize::new(0) }; MAX_FRAMES];
static FRAME_COUNT: AtomicUsize = AtomicUsize::new(0);
static DONE: AtomicBool = AtomicBool::new(false);
static CAPTURE: Mutex<()> = Mutex::new(());

/// A signal nothing else in maxrs or XLA uses, for "walk your stack".
fn capture_signal() -> libc::c_int {
    libc::SIGRTMIN() + 7
}

extern "C" fn capture_handler(_: libc::c_int) {
    // SAFETY: gettid has no preconditions and is async-signal-safe.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
    if tid != TARGET.load(Ordering::Acquire) {
        return;
    }
    let mut n = 0;
    // SAFETY: the unwinder only reads this thread's stack and the loaded objects' unwind
    // tables; the closure touches atomics only (no allocation, no locks), which is what a
    // signal handler may do.
    unsafe {
        backtrace::trace_unsynchronized(|frame| {
            FRAMES[n].store(frame.ip() as usize, Ordering::Relaxed);
            n += 1;
            n < MAX_FRAMES
        });
    }
    FRAME_COUNT.store(n, Ordering::Relaxed);
    DONE.store(true, Ordering::Release);
}

fn install_capture_handler() -> bool {
    static INSTALLED: Once = Once::new();
    static OK: AtomicBool = AtomicBool::new(false);
    INSTALLED.call_once(|| {
        // SAFETY: a zeroed sigaction is valid; the handler is an `extern "C" fn(c_int)` that
        // only does async-signal-safe work, and SA_RESTART keeps interrupted calls going.
        let ok = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = capture_handler as extern "C" fn(libc::c_int) as usize;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(capture_signal(), &action, std::ptr::null_mut()) == 0
        };
        OK.store(ok, Ordering::Relaxed);
    });
    OK.load(Ordering::Relaxed)
}

fn read_proc(tid: i32, file: &str) -> String {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/{file}")).map(|s| s.trim().to_string()).unwrap_or_default()
}

/// The instruction addresses of thread `tid`'s stack, or `None` if it did not answer.
fn capture(tid: i32) -> Option<Vec<usize>> {
    DONE.store(false, Ordering::Release);
    TARGET.store(tid, Ordering::Release);
    // SAFETY: tgkill with this process's id and one of its thread ids; the handler is installed.
    let sent = unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, capture_signal()) } == 0;
    let deadline = Instant::now() + Duration::from_millis(200);
    let answered = sent
        && loop {
            if DONE.load(Ordering::Acquire) {
                break true;
            }
            if Instant::now() > deadline {
                break false;
            }
            std::thread::sleep(Duration::from_micros(200));
        };
    TARGET.store(0, Ordering::Release);
    answered.then(|| (0..FRAME_COUNT.load(Ordering::Relaxed)).map(|i| FRAMES[i].load(Ordering::Relaxed)).collect())
}

fn symbolize(ips: &[usize]) -> String {
    let mut out = String::new();
    for (i, &ip) in ips.iter().enumerate() {
        let mut line = format!("    #{i:<2} {ip:#x}");
        let mut named = false;
        backtrace::resolve(ip as *mut std::ffi::c_void, |symbol| {
            if named {
                return;
            }
            named = true;
            if let Some(name) = symbol.name() {
                let _ = write!(line, " {name:#}");
            }
            if let (Some(file), Some(no)) = (symbol.filename(), symbol.lineno()) {
                let _ = write!(line, " at {}:{no}", file.display());
            }
        });
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// Every thread: name, kernel state and stack.
pub fn thread_stacks() -> String {
    let _one_at_a_time = CAPTURE.lock().unwrap_or_else(|p| p.into_inner());
    let can_signal = install_capture_handler();
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
    let mut tids: Vec<i32> = std::fs::read_dir("/proc/self/task")
        .map(|d| d.flatten().filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok())).collect())
        .unwrap_or_default();
    tids.sort_unstable();
    let mut out = String::new();
    for tid in tids {
        let name = read_proc(tid, "comm");
        let stat = read_proc(tid, "stat");
        if stat.is_empty() {
            continue; // it ended since the listing
        }
        // The state is the field after the parenthesized name.
        let state = stat.rsplit_once(") ").and_then(|(_, rest)| rest.split(' ').next()).unwrap_or("?");
        let wchan = read_proc(tid, "wchan");
        let _ = writeln!(
            out,
            "  thread {tid} \"{name}\" state {state}{}",
            if wchan.is_empty() || wchan == "0" { String::new() } else { format!(" in {wchan}") }
        );
        let ips = if tid == me {
            let mut ips = Vec::new();
            backtrace::trace(|frame| {
                ips.push(frame.ip() as usize);
                ips.len() < MAX_FRAMES
            });
            Some(ips)
        } else if can_signal {
            capture(tid)
        } else {
            None
        };
        match ips {
            Some(ips) => out.push_str(&symbolize(&ips)),
            None => out.push_str("    (no stack: the thread did not answer)\n"),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_names_phase_waits_and_other_threads_stacks() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let parked = std::thread::Builder::new()
            .name("parked-worker".into())
            .spawn(move || {
                let _ = rx.recv();
            })
            .unwrap();
        set_phase(Some(7), "running the step");
        drop(waiting_for("barrier start".into()));
        let wait = waiting_for("key-value get gpu:nccl_id".into());
        let text = report("test");
        drop(wait);
        tx.send(()).unwrap();
        parked.join().unwrap();
        assert!(text.contains("phase: step 7, running the step"), "{text}");
        assert!(text.contains("waiting for: key-value get gpu:nccl_id"), "{text}");
        assert!(text.contains("last finished wait: barrier start"), "{text}");
        let worker = text.split("\"parked-worker\"").nth(1).expect("the worker thread is listed");
        let worker_stack = worker.split("  thread ").next().unwrap();
        assert!(worker_stack.contains("recv"), "the parked thread's stack was captured: {text}");
    }
}
