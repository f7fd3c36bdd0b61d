//! `dataset_type=synthetic`: a learnable sequence, so the loss falls. Each row is an arithmetic
//! progression modulo the vocabulary, `x[t] = (a + d * t) mod vocab`, with a start `a` uniform
//! in `[0, vocab)` and a stride `d` uniform in `[1, min(vocab - 1, 8)]`. From the third token on,
//! the next token is determined by the previous two (`x[t+1] = 2 x[t] - x[t-1] mod vocab`). `a`
//! and `d` come from a SplitMix64 stream keyed by (seed, step, global row): reproducible across
//! runs, machines and host counts (each host computes only its own rows, and they equal the
//! single-host rows). The iterator's state is the next step.

use std::ops::Range;

use super::batch::Batch;
use super::error::DataError;
use super::shuffle::{mix, uniform};
use super::DataState;

/// Largest stride of the synthetic progressions: small strides make the next token easy to
/// guess from one token (a few candidates) and exact from two, so even tiny models learn fast.
const SYNTHETIC_MAX_STRIDE: u64 = 8;

/// The learnable synthetic sequence (see the module docs).
#[derive(Debug, Clone)]
pub struct Synthetic {
    seed: u64,
    vocab: u32,
    seq_len: usize,
}

impl Synthetic {
    pub fn new(seed: u64, vocab: u32, max_target_length: usize) -> Result<Synthetic, DataError> {
        if vocab < 2 {
            return Err(DataError::VocabTooSmall(vocab));
        }
        if max_target_length == 0 {
            return Err(DataError::ZeroLength);
        }
        Ok(Synthetic { seed, vocab, seq_len: max_target_length })
    }

    /// Row `global_row` of step `step`: `max_target_length + 1` ids.
    pub fn row(&self, step: u64, global_row: u64) -> Vec<i32> {
        let vocab = self.vocab as u64;
        let mut state = mix(mix(self.seed ^ mix(step)) ^ global_row);
        let start = uniform(&mut state, vocab);
        let stride = 1 + uniform(&mut state, SYNTHETIC_MAX_STRIDE.min(vocab - 1));
        (0..=self.seq_len as u64).map(|t| ((start + stride * (t % vocab)) % vocab) as i32).collect()
    }
}

/// This host's batches of the synthetic sequence.
#[derive(Debug)]
pub struct SyntheticBatches {
    source: Synthetic,
    rows: Range<usize>,
    step: u64,
}

impl SyntheticBatches {
    pub fn new(source: Synthetic, rows: Range<usize>, step: u64) -> SyntheticBatches {
        SyntheticBatches { source, rows, step }
    }

    pub fn next_batch(&mut self) -> Batch {
        let rows: Vec<Vec<i32>> = self.rows.clone().map(|r| self.source.row(self.step, r as u64)).collect();
        self.step += 1;
        Batch::from_sequences(&rows, self.source.seq_len)
    }

    pub fn state(&self) -> DataState {
        DataState::Synthetic { step: self.step }
    }
}
