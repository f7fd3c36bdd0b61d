//! One step's arrays for one host, MaxText's names, all `s32[rows, S]` (`S` = `max_target_length`):
//!
//! - `inputs`: token ids;
//! - `inputs_segmentation`: which document of the row each token belongs to (1, 2, ... in
//!   packing order), 0 on padding; attention never crosses segments;
//! - `inputs_position`: the token's position within its document (0, 1, ...), the RoPE position;
//! - `targets`: the next token of the row (`inputs` shifted left by one);
//! - `targets_segmentation`: non-zero where the loss counts the target. The loss is the
//!   cross-entropy averaged over those tokens, which is also MaxText's `total_weights`.
//!
//! Rows of a token file or of `synthetic_progression` hold one unbroken sequence of `S + 1` ids
//! ([`Batch::from_sequences`]): segmentation all ones, positions `0..S`; MaxText's synthetic batch
//! may cut its rows into segments ([`super::synthetic`]). Rows of tokenized
//! documents ([`Batch::from_documents`]) are built as MaxText's Hugging Face pipeline builds them
//! (maxtext `src/maxtext/input_pipeline/hf_data_processing.py` and `input_pipeline_utils.py`
//! `ShiftData`/`shift_and_refine`, main e591f30): the targets are the inputs shifted left with
//! the pad id at the end, `targets_segmentation` is `inputs_segmentation` shifted left with 0 at
//! the end, and it is zeroed where the target is the pad id or the BOS id. The last rule keeps
//! the loss off the step from one packed document to the next, whose first token is BOS. The
//! targets are shifted from the rows' targets column, which SFT's completion-only loss sets to
//! the pad id on prompt tokens ([`super::chat`]): those targets are the pad id and carry no loss.

use crate::host::HostTensor;

/// One step's arrays for one host (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub inputs: HostTensor,
    pub inputs_position: HostTensor,
    pub inputs_segmentation: HostTensor,
    pub targets: HostTensor,
    pub targets_segmentation: HostTensor,
}

/// One row of packed (or padded) documents before the shift: ids, segment per token, position
/// per token, and the targets column (the ids, except where SFT masks a prompt with the pad id:
/// MaxText's `SFTPromptMasking`), each of length `S`; padding has segment 0.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PackedRow {
    pub ids: Vec<i32>,
    pub segments: Vec<i32>,
    pub positions: Vec<i32>,
    pub targets: Vec<i32>,
}

impl Batch {
    /// Rows of `S + 1` ids each: `inputs = ids[..S]`, `targets = ids[1..]`, one segment per row.
    pub fn from_sequences(rows: &[Vec<i32>], seq_len: usize) -> Batch {
        let dims = [rows.len() as i64, seq_len as i64];
        let inputs: Vec<i32> = rows.iter().flat_map(|r| r[..seq_len].iter().copied()).collect();
        let targets: Vec<i32> = rows.iter().flat_map(|r| r[1..].iter().copied()).collect();
        let positions: Vec<i32> = rows.iter().flat_map(|_| 0..seq_len as i32).collect();
        let ones = vec![1i32; rows.len() * seq_len];
        Batch {
            inputs: HostTensor::from_i32(&dims, &inputs),
            inputs_position: HostTensor::from_i32(&dims, &positions),
            inputs_segmentation: HostTensor::from_i32(&dims, &ones),
            targets: HostTensor::from_i32(&dims, &targets),
            targets_segmentation: HostTensor::from_i32(&dims, &ones),
        }
    }

    /// Rows of packed or padded documents (each field of length `seq_len`), shifted into
    /// targets as MaxText does (see the module docs). `bos` is the tokenizer's BOS id, if any.
    pub fn from_documents(rows: &[PackedRow], seq_len: usize, pad_id: i32, bos: Option<i32>) -> Batch {
        let n = rows.len() * seq_len;
        let (mut inputs, mut segs, mut pos) = (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
        let (mut targets, mut target_segs) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for row in rows {
            debug_assert!(row.ids.len() == seq_len && row.segments.len() == seq_len && row.positions.len() == seq_len);
            inputs.extend_from_slice(&row.ids);
            segs.extend_from_slice(&row.segments);
            pos.extend_from_slice(&row.positions);
            debug_assert_eq!(row.targets.len(), seq_len);
            for t in 0..seq_len {
                let (target, seg) =
                    if t + 1 < seq_len { (row.targets[t + 1], row.segments[t + 1]) } else { (pad_id, 0) };
                let ignored = target == pad_id || Some(target) == bos;
                targets.push(target);
                target_segs.push(if ignored { 0 } else { seg });
            }
        }
        let dims = [rows.len() as i64, seq_len as i64];
        Batch {
            inputs: HostTensor::from_i32(&dims, &inputs),
            inputs_position: HostTensor::from_i32(&dims, &pos),
            inputs_segmentation: HostTensor::from_i32(&dims, &segs),
            targets: HostTensor::from_i32(&dims, &targets),
            targets_segmentation: HostTensor::from_i32(&dims, &target_segs),
        }
    }

    /// The arrays under MaxText's names, in a fixed order.
    pub fn named(&self) -> [(&'static str, &HostTensor); 5] {
        [
            ("inputs", &self.inputs),
            ("inputs_position", &self.inputs_position),
            ("inputs_segmentation", &self.inputs_segmentation),
            ("targets", &self.targets),
            ("targets_segmentation", &self.targets_segmentation),
        ]
    }

    /// The array named `name` (one of [`Batch::named`]'s).
    pub fn get(&self, name: &str) -> Option<&HostTensor> {
        self.named().into_iter().find(|(n, _)| *n == name).map(|(_, t)| t)
    }

    /// Target tokens the loss counts on this host (MaxText's `total_weights`).
    pub fn total_weights(&self) -> u64 {
        self.targets_segmentation.to_i64().iter().filter(|&&v| v != 0).count() as u64
    }
}
