//! `dataset_type=synthetic`: MaxText's synthetic batch, or (maxrs's own `synthetic_progression`)
//! a learnable sequence.
//!
//! MaxText's (`input_pipeline/synthetic_data_processing.py`, `SyntheticDataIterator`, at MaxText
//! e591f30) is one batch, drawn once and fed at every step (MaxText's eval iterator is the same
//! batch too; maxrs's eval reads `hf_eval_files` only):
//!
//! - tokens: `jax.random.randint(PRNGKey(0), (global_batch, max_target_length + 1), 0,
//!   vocab_size, int32)`; `inputs` are a row's first `S` tokens, `targets` its last `S`;
//! - `inputs_position`: `0..S` in every row, with or without packing;
//! - `inputs_segmentation` = `targets_segmentation`: all ones, except with `packing=true` and
//!   `max_segments_per_seq >= 2` (and `S >= 2`), where `_make_packed_segment_ids` cuts each row
//!   into `n` segments numbered from 1: `n` is `randint(k1, (global_batch, 1), 2,
//!   min(max_segments_per_seq, S) + 1)` and the `n - 1` segment starts are the positions `1..S`
//!   whose `uniform(k2, (global_batch, S - 1))` scores rank lowest (ties to the lower position,
//!   as a stable argsort ranks them), with `k1, k2 = split(PRNGKey(42))`. Positions do not
//!   restart at the cuts and every target counts in the loss, as in MaxText.
//!
//! Those are the draws under JAX's default PRNG (threefry). MaxText's trainer switches JAX to
//! `unsafe_rbg` before building the iterator (`jax_default_prng_impl`,
//! `trainers/pre_train/train.py` at e591f30), so a MaxText run's tokens are XLA `RngBitGenerator`
//! draws instead, which maxrs does not reproduce yet (issue 47's resumption check found it).
//!
//! `data_shuffle_seed` does not enter it (MaxText's keys are fixed). The draws use JAX's
//! threefry ([`super::threefry`]), whose partitionable layout makes an element a function of its
//! flat index only: each host computes only its own rows, and they equal the single-host rows.
//! With the same batch at every step a model memorizes it, so the loss falls steeply.
//!
//! With `synthetic_progression=true` (maxrs's own, which the default model's quick start sets)
//! each row is instead an arithmetic progression modulo the vocabulary, `x[t] = (a + d * t) mod
//! vocab`, new at every step: a start `a` uniform in `[0, vocab)` and a stride `d` uniform in `[1,
//! min(vocab - 1, 8)]` from a SplitMix64 stream keyed by (`data_shuffle_seed`, step, global row).
//! From the third token on the next token follows from the previous two (`x[t+1] = 2 x[t] -
//! x[t-1] mod vocab`), so the loss falls by learning a rule rather than one batch. Its rows are
//! one segment each, whatever `packing` says.
//!
//! The iterator's state is the next step (MaxText's batch is the same at every step, so resuming
//! it is trivially exact).

use std::ops::Range;

use super::batch::Batch;
use super::error::DataError;
use super::shuffle::{mix, uniform};
use super::threefry::{self, RandInt};
use super::DataState;
use crate::config::Config;
use crate::host::HostTensor;

/// MaxText's seed of the synthetic tokens (`PRNGKey(0)`).
const TOKENS_SEED: u64 = 0;
/// MaxText's seed of the synthetic segment ids (`PRNGKey(42)` in `_make_packed_segment_ids`).
const SEGMENTS_SEED: u64 = 42;

/// Row `row` of MaxText's synthetic tokens: `max_target_length + 1` ids of the draw
/// `randint(PRNGKey(0), (global_batch, max_target_length + 1), 0, vocab)` (any global batch).
pub fn maxtext_tokens(vocab: i32, max_target_length: usize, row: usize) -> Vec<i32> {
    let draw = RandInt::new(threefry::key(TOKENS_SEED), 0, vocab);
    let width = max_target_length as u64 + 1;
    (0..width).map(|t| draw.at(row as u64 * width + t)).collect()
}

/// Row `row` of MaxText's synthetic segment ids for `packing=true` (`_make_packed_segment_ids`,
/// see the module docs): all ones when `max_segments_per_seq < 2` or `max_target_length < 2`.
pub fn maxtext_segments(max_target_length: usize, max_segments_per_seq: i64, row: usize) -> Vec<i32> {
    let len = max_target_length;
    if max_segments_per_seq < 2 || len < 2 {
        return vec![1; len];
    }
    let max_segments = max_segments_per_seq.min(len as i64) as i32;
    let key = threefry::key(SEGMENTS_SEED);
    let (k1, k2) = (threefry::split(key, 0), threefry::split(key, 1));
    let cuts = (RandInt::new(k1, 2, max_segments + 1).at(row as u64) - 1) as usize;
    let scored = len - 1;
    let mut order: Vec<(f32, usize)> =
        (0..scored).map(|j| (threefry::uniform_f32(k2, (row * scored + j) as u64), j)).collect();
    // Scores are finite, so `total_cmp` is their order; the index breaks ties as a stable sort.
    order.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut starts = vec![false; len];
    for &(_, j) in &order[..cuts] {
        starts[j + 1] = true;
    }
    let mut segment = 1;
    (0..len)
        .map(|t| {
            segment += (t > 0 && starts[t]) as i32;
            segment
        })
        .collect()
}

/// What `dataset_type=synthetic` gives (see the module docs).
#[derive(Debug, Clone)]
pub enum Synthetic {
    /// MaxText's one batch; `segments` is `max_segments_per_seq` when `packing=true`.
    MaxText { vocab: i32, seq_len: usize, segments: Option<i64> },
    /// maxrs's learnable progressions (`synthetic_progression=true`).
    Progression(Progression),
}

impl Synthetic {
    /// The synthetic data `c` selects.
    pub fn of(c: &Config) -> Result<Synthetic, DataError> {
        let seq_len = c.max_target_length as usize;
        if seq_len == 0 {
            return Err(DataError::ZeroLength);
        }
        if c.synthetic_progression {
            return Ok(Synthetic::Progression(Progression::new(
                c.data_shuffle_seed as u64,
                c.vocab_size as u32,
                seq_len,
            )?));
        }
        let segments = c.packing.then_some(c.max_segments_per_seq);
        Ok(Synthetic::MaxText { vocab: c.vocab_size as i32, seq_len, segments })
    }

    /// The rows `rows` of the global batch of step `step`.
    pub fn batch(&self, step: u64, rows: Range<usize>) -> Batch {
        match self {
            Synthetic::Progression(p) => {
                let ids: Vec<Vec<i32>> = rows.map(|r| p.row(step, r as u64)).collect();
                Batch::from_sequences(&ids, p.seq_len)
            }
            &Synthetic::MaxText { vocab, seq_len, segments } => {
                let n = rows.len() * seq_len;
                let (mut inputs, mut targets, mut segs) =
                    (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
                for r in rows.clone() {
                    let tokens = maxtext_tokens(vocab, seq_len, r);
                    inputs.extend_from_slice(&tokens[..seq_len]);
                    targets.extend_from_slice(&tokens[1..]);
                    match segments {
                        Some(max) => segs.extend(maxtext_segments(seq_len, max, r)),
                        None => segs.extend(std::iter::repeat_n(1, seq_len)),
                    }
                }
                let positions: Vec<i32> = rows.flat_map(|_| 0..seq_len as i32).collect();
                let dims = [(n / seq_len) as i64, seq_len as i64];
                Batch {
                    inputs: HostTensor::from_i32(&dims, &inputs),
                    inputs_position: HostTensor::from_i32(&dims, &positions),
                    inputs_segmentation: HostTensor::from_i32(&dims, &segs),
                    targets: HostTensor::from_i32(&dims, &targets),
                    targets_segmentation: HostTensor::from_i32(&dims, &segs),
                }
            }
        }
    }
}

/// Largest stride of the progressions: small strides make the next token easy to guess from
/// one token (a few candidates) and exact from two, so even tiny models learn fast.
const PROGRESSION_MAX_STRIDE: u64 = 8;

/// maxrs's learnable synthetic sequence (see the module docs).
#[derive(Debug, Clone)]
pub struct Progression {
    seed: u64,
    vocab: u32,
    seq_len: usize,
}

impl Progression {
    pub fn new(seed: u64, vocab: u32, max_target_length: usize) -> Result<Progression, DataError> {
        if vocab < 2 {
            return Err(DataError::VocabTooSmall(vocab));
        }
        if max_target_length == 0 {
            return Err(DataError::ZeroLength);
        }
        Ok(Progression { seed, vocab, seq_len: max_target_length })
    }

    /// Row `global_row` of step `step`: `max_target_length + 1` ids.
    pub fn row(&self, step: u64, global_row: u64) -> Vec<i32> {
        let vocab = self.vocab as u64;
        let mut state = mix(mix(self.seed ^ mix(step)) ^ global_row);
        let start = uniform(&mut state, vocab);
        let stride = 1 + uniform(&mut state, PROGRESSION_MAX_STRIDE.min(vocab - 1));
        (0..=self.seq_len as u64).map(|t| ((start + stride * (t % vocab)) % vocab) as i32).collect()
    }
}

/// This host's synthetic batches.
#[derive(Debug)]
pub struct SyntheticBatches {
    source: Synthetic,
    rows: Range<usize>,
    step: u64,
    /// MaxText's batch, computed once: it is the same at every step.
    fixed: Option<Batch>,
}

impl SyntheticBatches {
    pub fn new(source: Synthetic, rows: Range<usize>, step: u64) -> SyntheticBatches {
        let fixed = matches!(source, Synthetic::MaxText { .. }).then(|| source.batch(step, rows.clone()));
        SyntheticBatches { source, rows, step, fixed }
    }

    pub fn next_batch(&mut self) -> Batch {
        let batch = match &self.fixed {
            Some(batch) => batch.clone(),
            None => self.source.batch(self.step, self.rows.clone()),
        };
        self.step += 1;
        batch
    }

    pub fn state(&self) -> DataState {
        DataState::Synthetic { step: self.step }
    }
}
