//! The SPMD step's eval: the compiled eval step (forward and loss only) over the `hf_eval_files`
//! batches, reading the parameters from the train state on the devices.

use anyhow::{anyhow, bail, Context, Result};

use crate::data::{Batch, BatchIterator, EvalData};
use crate::pjrt::Client;
use crate::runtime::{self, Compiled, DeviceArray};
use crate::train_state::Group;

use super::dpo::METRICS;
use super::metrics::EvalMetrics;
use super::step::{batch_inputs, TrainStep};

/// The compiled eval step and its data.
pub(super) struct Evaluator {
    compiled: Compiled,
    data: EvalData,
    /// For each eval input: the train state slot holding it (parameters), or `None` (batch).
    from_state: Vec<Option<usize>>,
    batch_names: Vec<&'static str>,
    batch_slots: Vec<usize>,
    outputs: [usize; 3],
    /// The load-balancing loss's output, for models with experts.
    lb_output: Option<usize>,
    /// The preference metrics' sums over the batch's pairs (`metrics.sums.<metric>`, in
    /// `dpo::METRICS` order), where the step has them (`use_dpo`).
    preference: [Option<usize>; 7],
}

impl Evaluator {
    pub fn new(client: &Client, step: &TrainStep, train: &Compiled, data: EvalData, rows: usize) -> Result<Evaluator> {
        // Eval batches are text (`hf_eval_files`): packed whenever `packing` is on.
        let packed = data.packed();
        let program = step.eval_step(rows as i64, packed).map_err(|e| anyhow!("tracing the eval step: {e}"))?;
        let compiled = runtime::compile(client, &program).context("compiling the eval step")?;
        let from_state = compiled
            .program
            .inputs
            .iter()
            .map(|i| match Group::of(&i.name).is_some_and(|(group, _)| group.read_by_forward()) {
                true => train.input_index(&i.name).map(Some),
                false => Ok(None),
            })
            .collect::<Result<_>>()?;
        let batch_names = match step.dpo {
            Some(_) => step.batch_names().0,
            None => batch_inputs(packed),
        };
        let batch_slots =
            batch_names.iter().map(|n| compiled.input_index(&format!("batch.{n}"))).collect::<Result<_>>()?;
        let out = |n: &str| compiled.output_index(&format!("metrics.{n}"));
        let outputs = [out("total_loss")?, out("total_weights")?, out("z_loss")?];
        let lb_output = out("moe_lb_loss").ok();
        let preference = METRICS.map(|(name, _)| out(&format!("sums.{name}")).ok());
        Ok(Evaluator { compiled, data, from_state, batch_names, batch_slots, outputs, lb_output, preference })
    }

    /// One pass over the eval files (at most `eval_steps` batches when positive) with the
    /// current parameters.
    pub fn run(
        &self,
        client: &Client,
        state: &[Option<DeviceArray>],
        after_step: u64,
        eval_steps: i64,
    ) -> Result<EvalMetrics> {
        // This process's rows of the global eval batch.
        let first_row = self.compiled.local_rows(self.batch_slots[0])?.start as i64;
        let mut metrics = EvalMetrics { step: after_step, ..EvalMetrics::default() };
        let mut batches: BatchIterator = self.data.batches()?;
        let mut slots: Vec<Option<DeviceArray>> = self.compiled.program.inputs.iter().map(|_| None).collect();
        while eval_steps <= 0 || (metrics.eval_steps as i64) < eval_steps {
            let Some(batch) = batches.next_batch()? else { break };
            put_batch(client, &self.compiled, &self.batch_slots, &self.batch_names, &batch, first_row, &mut slots)?;
            let args: Vec<&DeviceArray> = slots
                .iter()
                .zip(&self.from_state)
                .map(|(own, train_slot)| match train_slot {
                    Some(t) => state[*t].as_ref().expect("the train state is set"),
                    None => own.as_ref().expect("every batch input is set"),
                })
                .collect();
            let outputs = self.compiled.execute(&args)?;
            let scalar = |i: usize| -> Result<f64> { Ok(self.compiled.fetch(i, &outputs[i])?.to_f64()[0]) };
            metrics.total_loss += scalar(self.outputs[0])?;
            metrics.total_weights += scalar(self.outputs[1])?;
            metrics.z_loss_sum += scalar(self.outputs[2])?;
            if let Some(i) = self.lb_output {
                *metrics.moe_lb_loss_sum.get_or_insert(0.0) += scalar(i)?;
            }
            for (sum, output) in metrics.preference_sums.iter_mut().zip(&self.preference) {
                if let Some(i) = output {
                    *sum.get_or_insert(0.0) += scalar(*i)?;
                }
            }
            metrics.eval_steps += 1;
        }
        if metrics.eval_steps == 0 {
            bail!("eval after step {after_step}: hf_eval_files gave no batch (no decodable documents)");
        }
        Ok(metrics)
    }
}

/// Copies a batch's arrays `names` (this process's rows, from `first_row` of the global batch)
/// into the step's input `slots`.
fn put_batch(
    client: &Client,
    compiled: &Compiled,
    slots: &[usize],
    names: &[&str],
    batch: &Batch,
    first_row: i64,
    state: &mut [Option<DeviceArray>],
) -> Result<()> {
    for (slot, name) in slots.iter().zip(names) {
        let host = batch.get(name).expect("a Batch has every input");
        state[*slot] = Some(compiled.put_rows(client, *slot, host, first_row)?);
    }
    Ok(())
}
