//! The input pipeline: everything between the configuration's data keys and the arrays of one
//! train or eval step. The train loop asks a [`BatchIterator`] for the next [`Batch`] and, to
//! save it with a checkpoint, for its [`DataState`].
//!
//! - [`batch`]: the step's arrays (MaxText's names) and how rows become them.
//! - [`synthetic`]: `dataset_type=synthetic`, a learnable sequence.
//! - [`tokens`]: `dataset_type=tokens`, a memory-mapped file of token ids, shuffled by row.
//! - [`text`]: `dataset_type=hf`, Parquet / JSON Lines / text files tokenized by background
//!   workers ([`documents`] reads the files, [`tokenizer`] turns text into ids, [`packing`]
//!   fills rows), shuffled by file and by window; with `use_sft` the rows are conversations
//!   rendered by the tokenizer's chat template ([`chat`]), with their prompts masked; several
//!   datasets can be mixed by weight ([`mixture`], MaxText's / grain's mixtures).
//! - [`prepare`]: `maxrs tokenize`, text files to the `tokens` format.
//! - [`shuffle`]: the seeded permutations all of them use; [`storage`]: the file-system seam
//!   (local files, and `gs://` read in ranges).
//!
//! A run's start refuses a stream whose first batches give the loss no target to count
//! ([`BatchIterator::check_loss_tokens`]).
//!
//! Sharding: each process produces only its own rows of the global batch (`process_index` of
//! `process_count`): for `synthetic` and `tokens` a contiguous block of the global batch's rows,
//! for `hf` its share of the files (or of the rows, with fewer files than processes).

pub mod batch;
pub mod chat;
pub mod documents;
pub mod error;
pub mod mixture;
pub mod packing;
pub mod prepare;
pub mod shuffle;
pub mod storage;
pub mod synthetic;
pub mod text;
pub mod tokenizer;
pub mod tokens;

use std::ops::Range;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::config::{Config, DatasetType};

pub use batch::{Batch, PackedRow};
pub use error::DataError;
pub use packing::Packing;
pub use synthetic::Synthetic;
pub use text::{TextBatches, TextSpec, TextState};
pub use tokenizer::TextTokenizer;
pub use tokens::{write_tokens_file, TokensFile};

/// Where a data stream is: enough to resume it exactly (a checkpoint saves it as JSON).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "dataset_type", rename_all = "snake_case")]
pub enum DataState {
    /// The next step of the synthetic sequence.
    Synthetic { step: u64 },
    /// Rows of the token file's global stream consumed by all processes.
    Tokens { position: u64 },
    /// The next document of this process's text stream.
    Hf(TextState),
    /// The next document of this process's mixture of text streams (`hf_train_files` with `;`).
    HfMixture(mixture::MixtureState),
}

/// Which of the processes of a job this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessShare {
    pub index: usize,
    pub count: usize,
}

impl ProcessShare {
    pub const SINGLE: ProcessShare = ProcessShare { index: 0, count: 1 };
}

/// The rows `process_index` feeds out of a global batch of `global_batch` rows: the
/// `process_index`-th of `process_count` equal contiguous blocks.
pub fn host_rows(global_batch: usize, process_index: usize, process_count: usize) -> Result<Range<usize>, DataError> {
    if process_index >= process_count {
        return Err(DataError::BadProcessIndex { process_index, process_count });
    }
    if !global_batch.is_multiple_of(process_count) {
        return Err(DataError::UnevenHosts { global_batch, process_count });
    }
    let per_host = global_batch / process_count;
    Ok(process_index * per_host..(process_index + 1) * per_host)
}

/// This process's batches, whatever the source.
pub enum BatchIterator {
    Synthetic(synthetic::SyntheticBatches),
    Tokens(tokens::TokensBatches),
    Text(TextBatches),
}

impl BatchIterator {
    /// The next batch; `None` only when a non-repeating (eval) stream has ended.
    pub fn next_batch(&mut self) -> Result<Option<Batch>, DataError> {
        match self {
            BatchIterator::Synthetic(s) => Ok(Some(s.next_batch())),
            BatchIterator::Tokens(t) => t.next_batch().map(Some),
            BatchIterator::Text(t) => t.next_batch(),
        }
    }

    /// The position after the last delivered batch.
    pub fn state(&self) -> DataState {
        match self {
            BatchIterator::Synthetic(s) => s.state(),
            BatchIterator::Tokens(t) => t.state(),
            BatchIterator::Text(t) => t.state(),
        }
    }

    /// For text streams: documents packed, undecodable rows, tokens packed so far.
    pub fn text_stats(&self) -> Option<(u64, u64, u64)> {
        match self {
            BatchIterator::Text(t) => Some(t.stats()),
            _ => None,
        }
    }

    /// Refuses a stream of which none of the first [`LOSS_CHECK_BATCHES`] batches has a target
    /// that carries loss: a run on it would log `total_weights: 0, loss: 0.000` and learn
    /// nothing. The batches read stay to be delivered. Token files and the synthetic sequence
    /// count every target. `rows` is the rows of each batch.
    pub fn check_loss_tokens(&mut self, c: &Config, rows: usize) -> Result<(), DataError> {
        let BatchIterator::Text(text) = self else { return Ok(()) };
        if text.carries_loss_within(LOSS_CHECK_BATCHES)? {
            return Ok(());
        }
        Err(DataError::NoLossTokens {
            batches: LOSS_CHECK_BATCHES,
            rows: LOSS_CHECK_BATCHES * rows,
            seq: c.max_target_length as usize,
            cause: no_loss_cause(c),
        })
    }
}

/// Batches a run's start reads ahead, at most, for one whose targets carry loss
/// ([`BatchIterator::check_loss_tokens`]): normally the first has, and the check waits for it only.
pub const LOSS_CHECK_BATCHES: usize = text::PREFETCH_BATCHES;

/// Why no target of a run's batches carries loss, and what to change, from its settings.
pub fn no_loss_cause(c: &Config) -> String {
    if c.use_sft && c.sft_train_on_completion_only {
        return format!(
            "with sft_train_on_completion_only=true only the assistant replies carry loss, and these rows hold none \
             within max_target_length={} (user-only conversations, or prompts that fill the row); give \
             conversations with assistant replies, raise max_target_length, or set sft_train_on_completion_only=false",
            c.max_target_length
        );
    }
    "every document is a single token (a target needs the next token of its document); give longer documents, or \
     raise max_target_length"
        .to_string()
}

/// Tokenizer threads: one per core, at most 8 (the packer and reader are light).
pub fn default_workers() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).clamp(1, 8)
}

/// Loads `tokenizer_path` and checks it against `vocab_size`.
pub fn load_tokenizer(c: &Config) -> Result<Arc<TextTokenizer>, DataError> {
    if c.tokenizer_path.is_empty() {
        return Err(DataError::NoTokenizer { dataset_type: c.dataset_type.to_string() });
    }
    // SFT's BOS/EOS come from the chat template (MaxText loads the tokenizer with
    // add_bos_token=False, add_eos_token=False: hf_data_processing.py, e591f30).
    let (add_bos, add_eos) = if c.use_sft { (false, false) } else { (c.add_bos, c.add_eos) };
    let tokenizer = TextTokenizer::load(&c.tokenizer_path, c.tokenizer_type.as_str(), add_bos, add_eos)?;
    if tokenizer.vocab_size() > c.vocab_size as usize {
        return Err(DataError::VocabMismatch {
            path: tokenizer.path().to_path_buf(),
            tokenizer: tokenizer.vocab_size(),
            vocab: c.vocab_size as usize,
        });
    }
    Ok(Arc::new(tokenizer))
}

/// Which files a text stream reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// `hf_train_files` / `train_data_columns`, shuffled when `enable_data_shuffling`, epochs
    /// repeating.
    Train,
    /// `hf_eval_files` / `eval_data_columns`, in file order, one pass.
    Eval,
}

/// The text stream of `split` for `process`: its files found and checked (the first file must
/// have the column, and some file a row with text).
pub fn text_spec(
    c: &Config,
    split: Split,
    tokenizer: Arc<TextTokenizer>,
    process: ProcessShare,
) -> Result<TextSpec, DataError> {
    let (files_key, pattern) = match split {
        Split::Train => ("hf_train_files", &c.hf_train_files),
        Split::Eval => ("hf_eval_files", &c.hf_eval_files),
    };
    if pattern.is_empty() {
        return Err(DataError::NoFilesKey { key: files_key });
    }
    if split == Split::Eval && pattern.contains(';') {
        return Err(DataError::BadMixture {
            key: files_key,
            value: pattern.clone(),
            message: "mixtures (`;`) are read for training only; give the eval files as one file or glob".into(),
        });
    }
    text_spec_of(c, split, tokenizer, process, files_key, pattern)
}

/// [`text_spec`] of the files `pattern` gives (the whole key, or one component of a mixture).
fn text_spec_of(
    c: &Config,
    split: Split,
    tokenizer: Arc<TextTokenizer>,
    process: ProcessShare,
    files_key: &'static str,
    pattern: &str,
) -> Result<TextSpec, DataError> {
    let (columns_key, columns) = match split {
        Split::Train => ("train_data_columns", &c.train_data_columns),
        Split::Eval => ("eval_data_columns", &c.eval_data_columns),
    };
    let storage: Arc<dyn storage::Storage> = storage::storage_for(pattern).into();
    let files = storage.glob(files_key, pattern)?;
    for path in &files {
        documents::Format::of(path)?;
    }
    let (column, sft) = if c.use_sft {
        chat::check_columns(columns_key, columns)?;
        let template = chat::ChatTemplate::load(&c.chat_template, &c.chat_template_path, &c.tokenizer_path)?;
        let sft = chat::Sft { template, columns: columns.clone(), completion_only: c.sft_train_on_completion_only };
        documents::check_conversations(storage.as_ref(), &files, columns)?;
        chat::check_first(&sft, tokenizer.as_ref(), storage.as_ref(), &files)?;
        (String::new(), Some(Arc::new(sft)))
    } else {
        let column = match columns.as_slice() {
            [one] => one.clone(),
            other => {
                return Err(DataError::Invalid(format!(
                    "{columns_key}: pre-training reads one text column, got {other:?}"
                )))
            }
        };
        documents::check_files(storage.as_ref(), &files, &column)?;
        (column, None)
    };
    if process.index >= process.count {
        return Err(DataError::BadProcessIndex { process_index: process.index, process_count: process.count });
    }
    let train = split == Split::Train;
    Ok(TextSpec {
        files,
        column,
        sft,
        storage,
        tokenizer,
        max_doc_len: c.max_target_length as usize,
        shuffle_seed: (train && c.enable_data_shuffling).then_some(c.data_shuffle_seed as u64),
        process_index: process.index,
        process_count: process.count,
        repeat: train,
        workers: default_workers(),
    })
}

/// The training stream of this process for a global batch of `global_batch` rows, from the
/// start or from `resume`.
pub fn open_train(
    c: &Config,
    global_batch: usize,
    process: ProcessShare,
    resume: Option<DataState>,
) -> Result<BatchIterator, DataError> {
    let rows = host_rows(global_batch, process.index, process.count)?;
    let seq = c.max_target_length as usize;
    let seed = c.data_shuffle_seed as u64;
    let mismatch =
        |state: DataState| DataError::BadState(format!("{state:?} cannot resume dataset_type={}", c.dataset_type));
    match c.dataset_type {
        DatasetType::Synthetic => {
            let step = match resume {
                None => 0,
                Some(DataState::Synthetic { step }) => step,
                Some(other) => return Err(mismatch(other)),
            };
            let source = Synthetic::new(seed, c.vocab_size as u32, seq)?;
            Ok(BatchIterator::Synthetic(synthetic::SyntheticBatches::new(source, rows, step)))
        }
        DatasetType::Tokens => {
            if c.dataset_path.is_empty() {
                return Err(DataError::MissingPath);
            }
            let position = match resume {
                None => 0,
                Some(DataState::Tokens { position }) => position,
                Some(other) => return Err(mismatch(other)),
            };
            let file = TokensFile::open_at(&c.dataset_path, seq, c.vocab_size as u32)?;
            let shuffle = c.enable_data_shuffling.then_some(seed);
            Ok(BatchIterator::Tokens(tokens::TokensBatches::new(file, global_batch, rows, shuffle, position)))
        }
        DatasetType::Hf => match mixture::Mixture::of(c)? {
            None => {
                let at = match resume {
                    None => TextState::default(),
                    Some(DataState::Hf(at)) => at,
                    Some(other) => return Err(mismatch(other)),
                };
                let spec = text_spec(c, Split::Train, load_tokenizer(c)?, process)?;
                Ok(BatchIterator::Text(TextBatches::start(spec, at, rows.len(), seq, Packing::of(c))?))
            }
            Some(mix) => {
                let at = match resume {
                    None => mix.start_at(None)?,
                    Some(DataState::HfMixture(saved)) => mix.start_at(Some(saved))?,
                    Some(other) => return Err(mismatch(other)),
                };
                let tokenizer = load_tokenizer(c)?;
                let specs = mix
                    .components
                    .iter()
                    .map(|m| text_spec_of(c, Split::Train, tokenizer.clone(), process, mix.key, &m.pattern))
                    .collect::<Result<Vec<_>, _>>()?;
                let docs = mixture::MixedDocs::start(&specs, mix.proportions, at.clone())?;
                let state = DataState::HfMixture(at);
                Ok(BatchIterator::Text(TextBatches::from_stream(
                    docs,
                    state,
                    &tokenizer,
                    rows.len(),
                    seq,
                    Packing::of(c),
                )?))
            }
        },
    }
}

/// The eval data: a fresh pass over `hf_eval_files` in file order for each eval.
pub struct EvalData {
    spec: TextSpec,
    rows: usize,
    seq: usize,
    packing: Packing,
}

impl EvalData {
    /// `None` when eval is off (`eval_interval <= 0`).
    pub fn open(c: &Config, global_batch: usize, process: ProcessShare) -> Result<Option<EvalData>, DataError> {
        if c.eval_interval <= 0 {
            return Ok(None);
        }
        let rows = host_rows(global_batch, process.index, process.count)?;
        let spec = text_spec(c, Split::Eval, load_tokenizer(c)?, process)?;
        Ok(Some(EvalData { spec, rows: rows.len(), seq: c.max_target_length as usize, packing: Packing::of(c) }))
    }

    /// Whether its batches are packed (`packing`).
    pub fn packed(&self) -> bool {
        self.packing.is_on()
    }

    /// A new pass over the eval files.
    pub fn batches(&self) -> Result<BatchIterator, DataError> {
        let batches = TextBatches::start(self.spec.clone(), TextState::default(), self.rows, self.seq, self.packing)?;
        Ok(BatchIterator::Text(batches))
    }
}
