//! A pipelined run's eval: each eval batch goes through the stages as a train step's batch does
//! (split into the same microbatches, the schedule's forward tasks in its order, one thread per
//! stage), without backward or update. The last chunk runs `eval.head` (its forward and the loss,
//! no gradients), so the train state is untouched. The sums come out as the unpipelined eval
//! step's (`train::eval`): the summed loss and weights of the batch, the batch's masked mean z
//! loss, and each auxiliary loss as its mean over layers and microbatches (as the pipelined step
//! reports it; for `moe_lb_loss`, computed per microbatch rather than over the whole batch).

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Context, Result};

use super::executor::{split_batch, Pipeline, Weights};
use crate::data::Batch;
use crate::runtime;

/// What an eval batch gives, summed as the unpipelined eval step's metrics are.
#[derive(Clone, Debug, Default)]
pub struct EvalSums {
    pub total_loss: f64,
    pub total_weights: f64,
    /// The batch's masked mean z loss.
    pub z_loss: f64,
    /// Each auxiliary loss of the layers (`moe_lb_loss`), averaged over layers and microbatches.
    pub aux_losses: BTreeMap<String, f64>,
}

impl Pipeline {
    /// Traces and compiles the last stage's `eval.head` (in the process that runs that stage).
    pub fn open_eval(&mut self) -> Result<()> {
        let last = self.step.layout.stages - 1;
        if self.local_stage_mut(last).is_none() {
            return Ok(());
        }
        let program = self.step.eval_head().map_err(|e| anyhow!("tracing the pipeline's eval: {e}"))?;
        let compiled = runtime::compile(&self.client, &program).context("compiling the pipeline's eval")?;
        self.local_stage_mut(last).expect("checked above").eval_head = Some(compiled);
        Ok(())
    }

    /// The forward passes over one eval batch (a whole number of the schedule's passes of
    /// microbatches) with the current parameters.
    pub fn eval(&mut self, batch: &Batch) -> Result<EvalSums> {
        let rows = batch.inputs.dims[0] as usize;
        let pass_rows = self.schedule.microbatches * self.step.microbatch as usize;
        if rows == 0 || !rows.is_multiple_of(pass_rows) {
            bail!(
                "an eval batch of {rows} sequences does not split into passes of {} microbatches of {} sequences",
                self.schedule.microbatches,
                self.step.microbatch
            );
        }
        let passes = rows / pass_rows;
        let micro = split_batch(batch, passes * self.schedule.microbatches, self.step.packed)?;
        let ran = self.run_passes(&micro, passes, Weights::default(), true)?;
        let mut sums = [0.0f64; 3];
        for l in &ran.every_stage.last().expect("a pipeline has stages").losses {
            for k in 0..3 {
                sums[k] += l[k];
            }
        }
        let per_layer = micro.len() as f64 * self.step.model.config.layers as f64;
        let mut aux_losses = BTreeMap::new();
        for (name, sum) in ran.every_stage.iter().flat_map(|r| &r.aux) {
            *aux_losses.entry(name.clone()).or_insert(0.0) += sum / per_layer;
        }
        let [total_loss, total_weights, z_loss_sum] = sums;
        Ok(EvalSums { total_loss, total_weights, z_loss: z_loss_sum / total_weights.max(1.0), aux_losses })
    }
}
