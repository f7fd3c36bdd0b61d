//! Preference pairs (MaxText's `use_dpo` data) to the rows the DPO and ORPO losses read
//! (`train::dpo`): a pair is a prompt and two responses, chosen and rejected, as token ids.
//!
//! What is cut and kept follows MaxText's `DPODataFormatting`
//! (`src/maxtext/input_pipeline/dpo_utils.py` at e591f30):
//! - with three columns (`prompt`, `chosen`, `rejected`) the pair is given; with two (`chosen`,
//!   `rejected`: whole conversations, as Anthropic/hh-rlhf) the prompt is their longest common
//!   prefix of ids and the responses the rest ([`Pair::from_conversations`]);
//! - columns of text are tokenized as MaxText's DPO tokenizes them (no chat template). maxrs
//!   also reads conversational columns (lists of `{role, content}` messages, as TRL's
//!   preference datasets hold them), rendered by the tokenizer's chat template as SFT renders a
//!   conversation ([`Pairs::encode`]);
//! - the prompt keeps its last `max_prompt_length` ids (the context nearest the response), each
//!   response its first `max_target_length - max_prompt_length`.
//!
//! MaxText then left-pads the prompt to `max_prompt_length` and right-pads the responses; here
//! each side is one unpacked row, prompt then response then padding ([`Pair::rows`]), which gives
//! every real token the same position and context. (With an empty prompt MaxText predicts the
//! first response token from padding; here it has no token before it and is not counted.) The row's targets column masks the prompt
//! (`PackedRow::targets` is the pad id there), so `targets_segmentation` is non-zero exactly on
//! the response's non-pad ids, MaxText's `chosen_mask` / `rejected_mask`.

use super::batch::{Batch, PackedRow};
use super::chat::{ChatTemplate, Message};
use super::documents::Side;
use super::tokenizer::TextTokenizer;
use crate::config::Config;
use crate::host::HostTensor;

/// What a preference stream reads: its columns, and the chat template of conversational pairs
/// (loaded when the first pair of the files is one).
#[derive(Debug)]
pub struct Pairs {
    pub columns: Vec<String>,
    pub template: Option<ChatTemplate>,
}

impl Pairs {
    /// The pair of one row's columns, as ids: text columns are tokenized as documents (MaxText's
    /// DPO: BOS and EOS as `add_bos` / `add_eos` say, no template); conversations are rendered
    /// whole, the prompt's messages before each response's (`[prompt, chosen, rejected]`), and
    /// the pair cut at their common prefix. `None` for a row that gives no pair (columns of both
    /// kinds, a conversation without a template, a template or tokenizer error).
    pub fn encode(&self, tokenizer: &TextTokenizer, sides: &[Side], max_len: usize) -> Option<Pair> {
        let text = |t: &String| tokenizer.encode_document(t, max_len).ok();
        let chat = |messages: &[&[Message]]| {
            let all: Vec<Message> = messages.iter().flat_map(|m| m.iter().cloned()).collect();
            let (ids, _) = self.template.as_ref()?.encode(tokenizer, &all, false, max_len).ok()?;
            Some(ids)
        };
        match sides {
            [Side::Text(c), Side::Text(r)] => Some(Pair::from_conversations(&text(c)?, &text(r)?)),
            [Side::Text(p), Side::Text(c), Side::Text(r)] => {
                Some(Pair { prompt: text(p)?, chosen: text(c)?, rejected: text(r)? })
            }
            [Side::Chat(c), Side::Chat(r)] => Some(Pair::from_conversations(&chat(&[c])?, &chat(&[r])?)),
            [Side::Chat(p), Side::Chat(c), Side::Chat(r)] => {
                Some(Pair::from_conversations(&chat(&[p, c])?, &chat(&[p, r])?))
            }
            _ => None,
        }
    }
}

/// `dpo.max_prompt_length`, null read as MaxText reads it (`configs/types.py` at e591f30): half of
/// `max_target_length`.
pub fn max_prompt_length(c: &Config) -> usize {
    c.dpo_max_prompt_length.unwrap_or(c.max_target_length / 2) as usize
}

/// A prompt and its two responses, as token ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pair {
    pub prompt: Vec<i32>,
    pub chosen: Vec<i32>,
    pub rejected: Vec<i32>,
}

impl Pair {
    /// The pair of two whole conversations that share their prompt: the prompt is their longest
    /// common prefix, the responses what follows it.
    pub fn from_conversations(chosen: &[i32], rejected: &[i32]) -> Pair {
        let common = chosen.iter().zip(rejected).take_while(|(c, r)| c == r).count();
        Pair {
            prompt: chosen[..common].to_vec(),
            chosen: chosen[common..].to_vec(),
            rejected: rejected[common..].to_vec(),
        }
    }

    /// The chosen and rejected rows of `max_target_length` ids each (see the module docs).
    /// `max_prompt_length` must be below `max_target_length` (as MaxText checks).
    pub fn rows(&self, max_prompt_length: usize, max_target_length: usize, pad_id: i32) -> [PackedRow; 2] {
        assert!(max_prompt_length < max_target_length, "validation keeps the prompt shorter than the row");
        let prompt = &self.prompt[self.prompt.len().saturating_sub(max_prompt_length)..];
        let max_response = max_target_length - max_prompt_length;
        let row = |response: &[i32]| {
            let response = &response[..response.len().min(max_response)];
            let real = prompt.len() + response.len();
            let pad = max_target_length - real;
            let padding = || std::iter::repeat_n(pad_id, pad);
            let ids: Vec<i32> = prompt.iter().chain(response).copied().chain(padding()).collect();
            let masked_prompt = std::iter::repeat_n(pad_id, prompt.len());
            PackedRow {
                targets: masked_prompt.chain(response.iter().copied()).chain(padding()).collect(),
                segments: std::iter::repeat_n(1, real).chain(std::iter::repeat_n(0, pad)).collect(),
                positions: (0..real as i32).chain(std::iter::repeat_n(0, pad)).collect(),
                ids,
            }
        };
        [row(&self.chosen), row(&self.rejected)]
    }
}

/// The chosen and the rejected batch of `pairs` (row `i` of each is pair `i`), shifted into
/// targets as every batch is (`Batch::from_documents`). MaxText's masks are `ids != pad_id`
/// whatever the id, so no id is dropped as BOS here.
pub fn batches(pairs: &[Pair], max_prompt_length: usize, max_target_length: usize, pad_id: i32) -> [Batch; 2] {
    let rows: Vec<[PackedRow; 2]> =
        pairs.iter().map(|p| p.rows(max_prompt_length, max_target_length, pad_id)).collect();
    let side = |i: usize| {
        let side: Vec<PackedRow> = rows.iter().map(|r| r[i].clone()).collect();
        Batch::from_documents(&side, max_target_length, pad_id, None)
    };
    [side(0), side(1)]
}

/// The batch of a preference step: row `i` is pair `i`'s chosen row then its rejected row,
/// `2 * max_target_length` columns (see `train::step`).
pub fn batch(pairs: &[Pair], max_prompt_length: usize, max_target_length: usize, pad_id: i32) -> Batch {
    let [chosen, rejected] = batches(pairs, max_prompt_length, max_target_length, pad_id);
    let join = |a: &HostTensor, b: &HostTensor| {
        let (a, b) = (a.to_i64(), b.to_i64());
        let rows = a.chunks(max_target_length).zip(b.chunks(max_target_length));
        let joined: Vec<i32> = rows.flat_map(|(a, b)| a.iter().chain(b)).map(|&v| v as i32).collect();
        HostTensor::from_i32(&[pairs.len() as i64, 2 * max_target_length as i64], &joined)
    };
    Batch {
        inputs: join(&chosen.inputs, &rejected.inputs),
        inputs_position: join(&chosen.inputs_position, &rejected.inputs_position),
        inputs_segmentation: join(&chosen.inputs_segmentation, &rejected.inputs_segmentation),
        targets: join(&chosen.targets, &rejected.targets),
        targets_segmentation: join(&chosen.targets_segmentation, &rejected.targets_segmentation),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// MaxText's `_pad` keeps a prompt's last ids and a response's first; the common prefix of
    /// two conversations is the prompt.
    #[test]
    fn pairs_are_cut_as_maxtext_cuts_them() {
        let pair = Pair::from_conversations(&[1, 5, 6, 7, 8], &[1, 5, 6, 9]);
        assert_eq!(pair, Pair { prompt: vec![1, 5, 6], chosen: vec![7, 8], rejected: vec![9] });
        let [chosen, rejected] = pair.rows(2, 5, 0);
        assert_eq!(chosen.ids, [5, 6, 7, 8, 0], "the prompt keeps its last 2 ids, the response its first 3");
        assert_eq!(chosen.targets, [0, 0, 7, 8, 0]);
        assert_eq!(chosen.segments, [1, 1, 1, 1, 0]);
        assert_eq!(chosen.positions, [0, 1, 2, 3, 0]);
        assert_eq!(rejected.ids, [5, 6, 9, 0, 0]);
        let long = Pair { prompt: vec![3], chosen: vec![4, 5, 6, 7, 8], rejected: vec![] };
        let [chosen, rejected] = long.rows(2, 4, 0);
        assert_eq!(chosen.ids, [3, 4, 5, 0], "a response keeps max_target_length - max_prompt_length ids");
        assert_eq!(rejected.ids, [3, 0, 0, 0]);
    }

    /// The shifted batches count exactly the response's ids: the last prompt id predicts the
    /// first response id.
    #[test]
    fn batches_count_the_responses_only() {
        let pairs = [Pair { prompt: vec![2, 3], chosen: vec![4, 5], rejected: vec![6] }];
        let [chosen, rejected] = batches(&pairs, 3, 6, 0);
        assert_eq!(chosen.inputs.to_i64(), [2, 3, 4, 5, 0, 0]);
        assert_eq!(chosen.targets.to_i64(), [0, 4, 5, 0, 0, 0]);
        assert_eq!(chosen.targets_segmentation.to_i64(), [0, 1, 1, 0, 0, 0]);
        assert_eq!(chosen.inputs_segmentation.to_i64(), [1, 1, 1, 1, 0, 0]);
        assert_eq!(rejected.targets_segmentation.to_i64(), [0, 1, 0, 0, 0, 0]);
        assert_eq!(chosen.total_weights() + rejected.total_weights(), 3);
        let joined = batch(&pairs, 3, 6, 0);
        assert_eq!(joined.inputs.to_i64(), [2, 3, 4, 5, 0, 0, 2, 3, 6, 0, 0, 0]);
        assert_eq!(joined.total_weights(), 3);
    }
}
