//! Rows from tokenized documents. With `packing=true` (MaxText's default) documents are placed
//! first-fit into the batch's rows, as grain's `PackAndBatchOperation` that MaxText's Hugging
//! Face pipeline uses (maxtext `src/maxtext/input_pipeline/hf_data_processing.py`, main
//! e591f30): a document goes into the first row with room for it; when no row has room and the
//! batch has all its rows, the batch is complete and the document starts the next one. Each
//! document is a segment of its row (ids 1, 2, ... in placement order) with positions restarting
//! at 0; with `max_segments_per_seq` a row takes at most that many documents (grain's
//! `max_sequences_per_bin`). With `packing=false` each document gets a row of its own, padded.
//! Documents are at most a row long (the tokenizer truncates them), and a complete batch's unused
//! room is padding (segment 0, the pad id). With `use_dpo` each row is a preference pair, its
//! chosen and rejected rows side by side (`super::preference`).

use super::batch::{Batch, PackedRow};
use super::preference::{self, Pair};
use crate::config::Config;

/// How documents share the batch's rows: MaxText's `packing` and `max_segments_per_seq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Packing {
    /// A row per document, padded.
    Off,
    /// First-fit, at most `max_segments` documents a row when given.
    On { max_segments: Option<usize> },
    /// `use_dpo`: a preference pair per row, its prompt cut to `max_prompt_length` ids.
    Pairs { max_prompt_length: usize },
}

impl Packing {
    pub fn of(c: &Config) -> Packing {
        match c.packing {
            _ if c.use_dpo => Packing::Pairs { max_prompt_length: preference::max_prompt_length(c) },
            false => Packing::Off,
            true => Packing::On { max_segments: c.max_documents_per_row().map(|n| n as usize) },
        }
    }

    /// Whether rows hold several documents.
    pub fn is_on(self) -> bool {
        matches!(self, Packing::On { .. })
    }
}

/// A tokenized document: its ids, and its targets column where it differs from the ids (SFT's
/// prompt tokens masked with the pad id, [`super::chat`]); or a preference pair (its `ids`
/// all of the pair's, for the counts).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Encoded {
    pub ids: Vec<i32>,
    pub targets: Option<Vec<i32>>,
    pub pair: Option<Pair>,
}

impl Encoded {
    /// A document whose targets are its ids.
    pub fn plain(ids: Vec<i32>) -> Encoded {
        Encoded { ids, targets: None, pair: None }
    }

    /// A preference pair.
    pub fn pair(pair: Pair) -> Encoded {
        let ids = pair.prompt.iter().chain(&pair.chosen).chain(&pair.rejected).copied().collect();
        Encoded { ids, targets: None, pair: Some(pair) }
    }
}

/// Fills one batch of `rows` rows of `seq_len` tokens.
#[derive(Debug)]
pub struct Packer {
    seq_len: usize,
    rows: usize,
    packing: Packing,
    pad_id: i32,
    building: Vec<PackedRow>,
    /// `Packing::Pairs`: the batch's pairs so far.
    pairs: Vec<Pair>,
}

impl Packer {
    pub fn new(seq_len: usize, rows: usize, packing: Packing, pad_id: i32) -> Packer {
        Packer { seq_len, rows, packing, pad_id, building: Vec::with_capacity(rows), pairs: Vec::new() }
    }

    pub fn is_empty(&self) -> bool {
        self.building.is_empty() && self.pairs.is_empty()
    }

    /// Adds `doc` (non-empty, at most `seq_len` ids) if the batch has room for it; false when
    /// it does not (the batch is then complete: take it with [`Packer::finish`]).
    pub fn add(&mut self, encoded: &Encoded) -> bool {
        if let Packing::Pairs { .. } = self.packing {
            let room = self.pairs.len() < self.rows;
            if room {
                self.pairs.push(encoded.pair.clone().expect("use_dpo's documents are pairs"));
            }
            return room;
        }
        let doc = encoded.ids.as_slice();
        debug_assert!(!doc.is_empty() && doc.len() <= self.seq_len);
        let row = match self.packing {
            Packing::On { .. } => self
                .building
                .iter()
                .position(|r| self.seq_len - r.ids.len() >= doc.len() && !self.holds_max_documents(r)),
            Packing::Off | Packing::Pairs { .. } => None,
        };
        let row = match row {
            Some(r) => r,
            None if self.building.len() < self.rows => {
                self.building.push(PackedRow::default());
                self.building.len() - 1
            }
            None => return false,
        };
        let r = &mut self.building[row];
        let segment = r.segments.last().copied().unwrap_or(0) + 1;
        r.ids.extend_from_slice(doc);
        r.targets.extend_from_slice(encoded.targets.as_deref().unwrap_or(doc));
        r.segments.extend(std::iter::repeat_n(segment, doc.len()));
        r.positions.extend(0..doc.len() as i32);
        true
    }

    /// Whether row `r` holds as many documents as a row may.
    fn holds_max_documents(&self, r: &PackedRow) -> bool {
        let documents = r.segments.last().copied().unwrap_or(0) as usize;
        matches!(self.packing, Packing::On { max_segments: Some(max) } if documents >= max)
    }

    /// True when no further document of any length fits.
    pub fn is_full(&self) -> bool {
        if let Packing::Pairs { .. } = self.packing {
            return self.pairs.len() == self.rows;
        }
        self.building.len() == self.rows
            && self
                .building
                .iter()
                .all(|r| !self.packing.is_on() || r.ids.len() == self.seq_len || self.holds_max_documents(r))
    }

    /// The batch (missing rows are all padding), shifted into targets (`Batch::from_documents`,
    /// `bos` the tokenizer's BOS id); resets the packer. Pairs make rows of `2 * seq_len`.
    pub fn batch(&mut self, bos: Option<i32>) -> Batch {
        if let Packing::Pairs { max_prompt_length } = self.packing {
            let mut pairs = std::mem::take(&mut self.pairs);
            pairs.resize(self.rows, Pair { prompt: vec![], chosen: vec![], rejected: vec![] });
            return preference::batch(&pairs, max_prompt_length, self.seq_len, self.pad_id);
        }
        Batch::from_documents(&self.finish(), self.seq_len, self.pad_id, bos)
    }

    /// The batch's rows, padded to `seq_len` (missing rows are all padding); resets the packer.
    pub fn finish(&mut self) -> Vec<PackedRow> {
        let mut rows = std::mem::take(&mut self.building);
        rows.resize_with(self.rows, PackedRow::default);
        for r in &mut rows {
            let pad = self.seq_len - r.ids.len();
            r.ids.extend(std::iter::repeat_n(self.pad_id, pad));
            r.targets.extend(std::iter::repeat_n(self.pad_id, pad));
            r.segments.extend(std::iter::repeat_n(0, pad));
            r.positions.extend(std::iter::repeat_n(0, pad));
        }
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(ids: &[i32]) -> Encoded {
        Encoded::plain(ids.to_vec())
    }

    #[test]
    fn first_fit_packs_segments_with_restarting_positions() {
        let mut p = Packer::new(6, 2, Packing::On { max_segments: None }, 0);
        assert!(p.add(&doc(&[1, 2, 3])));
        assert!(p.add(&doc(&[4, 5, 6, 7]))); // does not fit row 0 (3 left): opens row 1
        assert!(p.add(&Encoded { ids: vec![8, 9], targets: Some(vec![0, 9]), pair: None })); // fits row 0
        assert!(!p.add(&doc(&[10, 11, 12]))); // no room: batch complete
        let rows = p.finish();
        assert_eq!(rows[0].ids, [1, 2, 3, 8, 9, 0]);
        assert_eq!(rows[0].segments, [1, 1, 1, 2, 2, 0]);
        // Each document keeps its own targets (a masked prompt stays masked where it lands).
        assert_eq!(rows[0].targets, [1, 2, 3, 0, 9, 0]);
        assert_eq!(rows[1].targets, [4, 5, 6, 7, 0, 0]);
        assert_eq!(rows[0].positions, [0, 1, 2, 0, 1, 0]);
        assert_eq!(rows[1].ids, [4, 5, 6, 7, 0, 0]);
        assert_eq!(rows[1].segments, [1, 1, 1, 1, 0, 0]);
        assert!(p.is_empty());
    }

    /// grain's `max_sequences_per_bin`: a row with that many documents takes no more, though it
    /// has room.
    #[test]
    fn a_row_takes_at_most_max_segments_documents() {
        let mut p = Packer::new(8, 2, Packing::On { max_segments: Some(2) }, 0);
        assert!(p.add(&doc(&[1])));
        assert!(p.add(&doc(&[2])));
        assert!(p.add(&doc(&[3]))); // row 0 has 2 documents: row 1
        assert!(p.add(&doc(&[4])));
        assert!(p.is_full());
        assert!(!p.add(&doc(&[5])));
        let rows = p.finish();
        assert_eq!(rows[0].segments, [1, 2, 0, 0, 0, 0, 0, 0]);
        assert_eq!(rows[1].ids, [3, 4, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn without_packing_each_document_has_its_row() {
        let mut p = Packer::new(4, 2, Packing::Off, 9);
        assert!(p.add(&doc(&[1])));
        assert!(p.add(&doc(&[2, 3])));
        assert!(p.is_full());
        assert!(!p.add(&doc(&[4])));
        let rows = p.finish();
        assert_eq!(rows[0].ids, [1, 9, 9, 9]);
        assert_eq!(rows[1].segments, [1, 1, 0, 0]);
    }
}
