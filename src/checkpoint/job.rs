//! One checkpoint saved by every process of a job: each process writes the blocks it owns
//! ([`super::dir::write_part`]) into the directory being staged, and process 0 writes the
//! manifest and commits the directory only once every process has reported its files written
//! and closed, through the coordination service's key-value store. A checkpoint is visible only
//! once committed, so a process dying mid-save (which stops the whole job through the
//! coordination service) leaves the previous checkpoint as the newest valid one.
//!
//! The order is Orbax's (google/orbax
//! `checkpoint/orbax/checkpoint/_src/checkpointers/async_checkpointer.py`, commit 0776ad2:
//! every process writes, the `async_write_complete` barrier, the primary host's commit, the
//! `async_commit_complete` barrier). Here each step is a key every process waits on rather than
//! a barrier, so a failure is handed on as the reason (`{"error": ...}`) and every process of the
//! job returns the same error for a failed save, instead of timing out:
//!
//! 1. `maxrs_checkpoint/<step>/staged`: process 0 made the staging directory (removing what an
//!    interrupted save left there).
//! 2. `maxrs_checkpoint/<step>/part/<p>`: process p wrote its files ([`Part`]: files with sizes
//!    and CRC32C, slices, data position).
//! 3. `maxrs_checkpoint/<step>/committed`: process 0 wrote the manifest and committed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};

use super::dir::{manifest_of, write_manifest, write_part, Part, Saved, Share};
use super::manifest::MANIFEST_FILE;
use crate::cluster::CoordinationClient;
use crate::files::Location;
use crate::storage::StagedDir;

/// How long a process waits for the others' parts of a save (maxrs's own bound: a save of a
/// llama2-7b state's share to GCS takes about a minute).
pub const SAVE_TIMEOUT: Duration = Duration::from_secs(600);

/// The processes that save a checkpoint together.
#[derive(Clone)]
pub struct Job {
    pub process: usize,
    pub processes: usize,
    /// The coordination service (a job of several processes).
    client: Option<Arc<CoordinationClient>>,
    pub timeout: Duration,
}

impl Job {
    pub fn single() -> Job {
        Job { process: 0, processes: 1, client: None, timeout: SAVE_TIMEOUT }
    }

    /// Process `process` of `processes`, which meet at `client`'s coordination service.
    pub fn new(process: usize, processes: usize, client: Arc<CoordinationClient>) -> Job {
        Job { process, processes, client: Some(client), timeout: SAVE_TIMEOUT }
    }

    /// Whether this process writes manifests and deletes checkpoints.
    pub fn is_primary(&self) -> bool {
        self.process == 0
    }
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Job(process {} of {})", self.process, self.processes)
    }
}

/// Saves this process's `share` of the checkpoint `target` (every process of `job` calls it with
/// its own share, for the same step); returns when the checkpoint is committed, or the error
/// that stopped it (the same on every process).
pub fn save(target: &Location, share: &Share, job: &Job) -> Result<Saved> {
    let started = Instant::now();
    let client = match &job.client {
        Some(client) if job.processes > 1 => client,
        _ => {
            let (location, manifest_bytes) = StagedDir::write_whole(target, MANIFEST_FILE, |dir| {
                let part = write_part(dir, share, 0, 1)?;
                write_manifest(dir, &manifest_of(share, 1, vec![part])?)
            })?;
            return Ok(saved(location, share, manifest_bytes, started));
        }
    };
    let step = share.step.ok_or_else(|| anyhow!("a job's checkpoint has a step"))?;
    let key = |what: &str| format!("maxrs_checkpoint/{step}/{what}");
    let exchange = Exchange { client, timeout: job.timeout };

    let staged = if job.is_primary() {
        let staged = StagedDir::start(target, MANIFEST_FILE);
        exchange
            .publish(&key("staged"), staged.as_ref().map(|_| serde_json::Value::Null).map_err(|e| format!("{e:#}")))?;
        Some(staged?)
    } else {
        exchange.wait(&key("staged"), "process 0 preparing the checkpoint directory")?;
        None
    };
    let dir = StagedDir::staging_of(target);
    let part = write_part(&dir, share, job.process, job.processes);
    let value =
        part.as_ref().map(|p| serde_json::to_value(p).expect("a part serializes")).map_err(|e| format!("{e:#}"));
    exchange.publish(&key(&format!("part/{}", job.process)), value)?;

    let Some(staged) = staged else {
        part?;
        exchange.wait(&key("committed"), "process 0 committing the checkpoint")?;
        return Ok(saved(target.clone(), share, 0, started));
    };
    let commit = || -> Result<(Location, u64)> {
        let mut parts = vec![part?];
        for p in 1..job.processes {
            let value = exchange.wait(&key(&format!("part/{p}")), &format!("process {p} writing its files"))?;
            parts.push(serde_json::from_value::<Part>(value).map_err(|e| anyhow!("process {p}'s part: {e}"))?);
        }
        let manifest_bytes = write_manifest(&dir, &manifest_of(share, job.processes, parts)?)?;
        Ok((staged.commit()?, manifest_bytes))
    };
    let committed = commit();
    exchange.publish(
        &key("committed"),
        committed.as_ref().map(|_| serde_json::Value::Null).map_err(|e| format!("{e:#}")),
    )?;
    let (location, manifest_bytes) = committed?;
    Ok(saved(location, share, manifest_bytes, started))
}

fn saved(location: Location, share: &Share, manifest_bytes: u64, started: Instant) -> Saved {
    Saved {
        location,
        step: share.step,
        bytes: share.bytes() + manifest_bytes,
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// The outcomes of a save's steps, through the key-value store.
struct Exchange<'a> {
    client: &'a CoordinationClient,
    timeout: Duration,
}

impl Exchange<'_> {
    /// Sets `key` to `{"ok": value}` or `{"error": reason}`.
    fn publish(&self, key: &str, outcome: std::result::Result<serde_json::Value, String>) -> Result<()> {
        let value = match outcome {
            Ok(v) => serde_json::json!({ "ok": v }),
            Err(e) => serde_json::json!({ "error": e }),
        };
        self.client.key_value_set(key, value.to_string().as_bytes(), false)
    }

    /// Waits for `key` (set by [`Exchange::publish`]; `what` says who sets it): its value, or
    /// its error.
    fn wait(&self, key: &str, what: &str) -> Result<serde_json::Value> {
        let bytes =
            self.client.blocking_key_value_get(key, self.timeout).map_err(|e| anyhow!("waiting for {what}: {e:#}"))?;
        let mut value: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| anyhow!("{key}: not a checkpoint outcome: {e}"))?;
        if let Some(error) = value.get("error") {
            bail!("{what} failed: {}", error.as_str().unwrap_or_default());
        }
        Ok(value["ok"].take())
    }
}
