//! A run's checkpoints directory (`base_output_directory/run_name/checkpoints/<step>/`): which
//! steps are there, restoring the newest good one (falling back past bad ones, saying why),
//! saving on MaxText's schedule synchronously or from a background thread, and keeping the
//! newest `max_num_checkpoints_to_keep`.
//!
//! Schedule (maxtext `src/maxtext/common/checkpointing.py` `_should_save_checkpoint_at_step`
//! and `trainers/pre_train/train.py`, commit e591f30): after step `s` when
//! `s % checkpoint_period == 0` (step 0 only with `save_checkpoint_on_start`), and after the
//! last step with `save_checkpoint_on_completion`. With `async_checkpointing` the state is
//! copied to the host by the caller, then written by a background thread while training goes
//! on; the next save (and the end of the run) first waits for it.
//!
//! Errors: a failed save leaves the earlier checkpoints as they were (a checkpoint is only
//! visible once complete, and old ones are deleted only after a newer one is committed). With
//! `on_checkpoint_error=stop` the failure ends the run; with `continue` it is reported and
//! training goes on.

use std::collections::BTreeMap;
use std::thread::JoinHandle;

use anyhow::{anyhow, Result};

use super::dir::{self, Expected, Loaded, Saved, Share, Snapshot};
use super::job::{self, Job};
use super::manifest::MANIFEST_FILE;
use super::orbax;
use crate::files::Location;
use crate::storage::{self, STAGING_SUFFIX};

/// Who wrote a step of a run's checkpoints folder: maxrs (with its manifest) or a MaxText run
/// (an Orbax step, [`orbax`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writer {
    Maxrs,
    MaxText,
}

/// What to do when a save fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnError {
    Stop,
    Continue,
}

/// When and how to save (from the config).
#[derive(Clone, Debug)]
pub struct Policy {
    pub period: u64,
    pub on_start: bool,
    pub on_completion: bool,
    pub asynchronous: bool,
    /// `None`: keep every checkpoint.
    pub keep: Option<usize>,
    pub on_error: OnError,
}

/// The checkpoints directory of a run.
#[derive(Clone, Debug)]
pub struct Checkpoints {
    pub dir: Location,
}

impl Checkpoints {
    pub fn new(dir: Location) -> Checkpoints {
        Checkpoints { dir }
    }

    pub fn step_dir(&self, step: u64) -> Location {
        self.dir.join(&step.to_string())
    }

    /// The steps with a committed checkpoint, oldest first, maxrs's or a MaxText run's (Orbax's:
    /// [`orbax`]). A local directory is committed once renamed to its step number; on GCS once
    /// it has its manifest, or Orbax's commit file.
    pub fn steps(&self) -> Result<Vec<u64>> {
        let mut steps = Vec::new();
        for entry in storage::list_dir(&self.dir)? {
            let Ok(step) = entry.name.parse::<u64>() else { continue };
            if !entry.is_dir {
                continue;
            }
            let dir = self.step_dir(step);
            if self.dir.is_local() || storage::is_file(&dir.join(MANIFEST_FILE))? || orbax::is_committed_step(&dir)? {
                steps.push(step);
            }
        }
        steps.sort_unstable();
        Ok(steps)
    }

    /// Deletes what interrupted saves left: local `<step>.maxrs-tmp` directories, GCS step
    /// directories without a manifest (not Orbax's: an unfinished one of those is the MaxText
    /// run's to clean up, [`orbax::incomplete_steps`] names it). Called by the run that owns the
    /// directory, before it saves.
    pub fn remove_incomplete(&self) -> Result<()> {
        for entry in storage::list_dir(&self.dir)? {
            let stale = match entry.name.strip_suffix(STAGING_SUFFIX) {
                Some(step) => step.parse::<u64>().is_ok(),
                None => {
                    !self.dir.is_local()
                        && entry.name.parse::<u64>().is_ok()
                        && !storage::is_file(&self.dir.join(&entry.name).join(MANIFEST_FILE))?
                        && !orbax::is_step_folder(&self.dir.join(&entry.name))?
                }
            };
            if stale {
                println!("removing the incomplete checkpoint {} (an interrupted save)", self.dir.join(&entry.name));
                storage::remove_all(&self.dir.join(&entry.name))?;
            }
        }
        Ok(())
    }

    /// The newest checkpoint that loads and passes every check, trying older ones when the newest
    /// is refused: its manifest does not match its folder (step, data position), a file is
    /// missing, short or fails its checksum, or it does not fit the run. Each refusal is one
    /// warning line naming the folder and why; a refused checkpoint is only read, never changed.
    /// `Ok(None)` when there are none; an error when there are some but none is usable.
    pub fn restore_latest(
        &self,
        expected: &[Expected],
        model: &BTreeMap<String, serde_json::Value>,
    ) -> Result<Option<Loaded>> {
        self.restore_latest_by(|dir, _| dir::load(dir, expected, model, false))
    }

    /// [`Checkpoints::restore_latest`] with `load` reading a checkpoint directory (whose
    /// manifest matches its folder), e.g. only the blocks one process of a job needs, told who
    /// wrote it. A MaxText (Orbax) step has no manifest: `load` gets it as it is, the newest step
    /// winning whichever wrote it.
    pub fn restore_latest_by<T>(&self, load: impl Fn(&Location, Writer) -> Result<T>) -> Result<Option<T>> {
        let steps = self.steps()?;
        let mut refusals = Vec::new();
        for &step in steps.iter().rev() {
            let dir = self.step_dir(step);
            let checked = match orbax::Checkpoint::is_orbax(&dir) {
                Ok(true) => load(&dir, Writer::MaxText),
                Ok(false) => dir::read_manifest(&dir)
                    .and_then(|manifest| manifest.check_step(step).map_err(|why| anyhow!(why)))
                    .and_then(|()| load(&dir, Writer::Maxrs)),
                Err(e) => Err(e),
            };
            match checked {
                Ok(loaded) => {
                    if !refusals.is_empty() {
                        println!("falling back to the checkpoint of step {step}");
                    }
                    return Ok(Some(loaded));
                }
                Err(e) => {
                    tracing::warn!("skipping the invalid checkpoint {dir}: {e:#}");
                    refusals.push(format!("step {step}: {e:#}"));
                }
            }
        }
        if refusals.is_empty() {
            return Ok(None);
        }
        Err(anyhow!(
            "{}: none of the {} checkpoints can be restored ({}); fix or move them away, or use another run_name",
            self.dir,
            refusals.len(),
            refusals.join("; ")
        ))
    }

    /// Deletes the oldest checkpoints so that `keep` remain.
    fn keep_newest(&self, keep: usize) -> Result<()> {
        let steps = self.steps()?;
        for step in steps.iter().take(steps.len().saturating_sub(keep)) {
            storage::remove_all(&self.step_dir(*step))?;
        }
        Ok(())
    }
}

/// Saves a run's checkpoints on its policy, one at a time.
pub struct CheckpointManager {
    pub checkpoints: Checkpoints,
    pub policy: Policy,
    /// The processes that save together (process 0 alone deletes checkpoints).
    job: Job,
    in_flight: Option<(u64, JoinHandle<Result<Saved>>)>,
    /// Every completed save, for reports.
    pub saved: Vec<Saved>,
    /// Saves that failed under `on_checkpoint_error=continue`.
    pub failures: Vec<String>,
    last_step: Option<u64>,
}

impl CheckpointManager {
    /// The manager of a job's checkpoints (`Job::single()` for a one-process run).
    pub fn new(checkpoints: Checkpoints, policy: Policy, job: Job) -> CheckpointManager {
        CheckpointManager {
            checkpoints,
            policy,
            job,
            in_flight: None,
            saved: vec![],
            failures: vec![],
            last_step: None,
        }
    }

    /// The processes that save together.
    pub fn job(&self) -> &Job {
        &self.job
    }

    /// Whether the schedule saves after step `step`.
    pub fn due(&self, step: u64) -> bool {
        step.is_multiple_of(self.policy.period) && (step != 0 || self.policy.on_start)
    }

    /// Whether the last saved (or saving) checkpoint is of `step`.
    pub fn has(&self, step: u64) -> bool {
        self.last_step == Some(step)
    }

    /// Saves `snapshot` (the whole state, already on the host) as the only process.
    pub fn save(&mut self, snapshot: Snapshot) -> Result<()> {
        self.save_share(snapshot.share())
    }

    /// Saves this process's `share` of the job's checkpoint (already on the host): waits for
    /// the previous save, then writes this one in the background (`async_checkpointing`) or now.
    /// Every process of the job saves the same steps.
    pub fn save_share(&mut self, share: Share) -> Result<()> {
        self.wait()?;
        let step = share.step.expect("a training checkpoint has a step");
        self.last_step = Some(step);
        let target = self.checkpoints.step_dir(step);
        let checkpoints = self.checkpoints.clone();
        let keep = self.policy.keep;
        let processes = self.job.clone();
        let job = move || -> Result<Saved> {
            // Restoring took the newest good checkpoint, so one already at this step was refused
            // (corrupt or incomplete): the new save replaces it. Process 0 replaces it, before
            // the others write (`job::save` waits for it).
            let refused = || -> Result<bool> {
                Ok(storage::list_dir(&target)?
                    .iter()
                    .any(|e| e.name == MANIFEST_FILE || e.name.ends_with(".safetensors")))
            };
            if processes.is_primary() && refused()? {
                println!("replacing the refused checkpoint {target}");
                storage::remove_all(&target)?;
            }
            let saved = job::save(&target, &share, &processes)
                .map_err(|e| anyhow!("saving the checkpoint of step {step}: {e:#}"))?;
            if let Some(keep) = keep.filter(|_| processes.is_primary()) {
                // A cleanup failure loses nothing: warn and keep training.
                if let Err(e) = checkpoints.keep_newest(keep) {
                    tracing::warn!("deleting old checkpoints (max_num_checkpoints_to_keep={keep}): {e:#}");
                }
            }
            Ok(saved)
        };
        if self.policy.asynchronous {
            let handle = std::thread::Builder::new()
                .name("maxrs-checkpoint".into())
                .spawn(job)
                .map_err(|e| anyhow!("cannot start the checkpoint writer thread: {e}"))?;
            self.in_flight = Some((step, handle));
            println!("started an asynchronous checkpoint save for step {step}");
            Ok(())
        } else {
            let result = job();
            self.settle(step, result)
        }
    }

    /// Waits for the save in flight, if any, and applies the error policy to its result.
    pub fn wait(&mut self) -> Result<()> {
        match self.in_flight.take() {
            None => Ok(()),
            Some((step, handle)) => {
                let result = handle.join().unwrap_or_else(|_| Err(anyhow!("the checkpoint writer thread panicked")));
                self.settle(step, result)
            }
        }
    }

    fn settle(&mut self, step: u64, result: Result<Saved>) -> Result<()> {
        match result {
            Ok(saved) => {
                println!(
                    "saved the checkpoint of step {step} to {} ({:.1} MiB in {:.2} s)",
                    saved.location,
                    saved.bytes as f64 / (1 << 20) as f64,
                    saved.seconds
                );
                self.saved.push(saved);
                Ok(())
            }
            Err(e) => {
                if self.last_step == Some(step) {
                    self.last_step = None;
                }
                match self.policy.on_error {
                    OnError::Stop => {
                        Err(e.context("the earlier checkpoints are kept; stopping (on_checkpoint_error=stop)"))
                    }
                    OnError::Continue => {
                        eprintln!("warning: {e:#}\nthe earlier checkpoints are kept; training continues (on_checkpoint_error=continue)");
                        self.failures.push(format!("{e:#}"));
                        Ok(())
                    }
                }
            }
        }
    }
}

impl Drop for CheckpointManager {
    fn drop(&mut self) {
        // A run that ends by an error still finishes (or reports) the save in flight.
        if let Err(e) = self.wait() {
            eprintln!("warning: {e:#}");
        }
    }
}
