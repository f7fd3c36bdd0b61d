//! The input pipeline: everything between the configuration's data keys and the arrays of one
//! train or eval step. The train loop asks a [`BatchIterator`] for the next [`Batch`] and, to
//! save it with a checkpoint, for its [`DataState`].
//!
//! - [`batch`]: the step's arrays (MaxText's names) and how rows become them.
//! - [`synthetic`]: `dataset_type=synthetic`, MaxText's fixed random batch (drawn with JAX's
//!   PRNG, [`threefry`]) or maxrs's learnable sequence (`synthetic_progression`).
//! - [`tokens`]: `dataset_type=tokens`, a memory-mapped file of token ids, shuffled by row.
//! - [`text`]: `dataset_type=hf`, Parquet / JSON Lines / text files tokenized by background
//!   workers ([`documents`] reads the files, [`tokenizer`] turns text into ids, [`packing`]
//!   fills rows), shuffled by file and by window; with `use_sft` the rows are conversations
//!   rendered by the tokenizer's chat template ([`chat`]), with their prompts masked; several
//!   datasets can be mixed by weight ([`mixture`], MaxText's / grain's mixtures). `hf_path` picks
//!   how the files are found and read, as MaxText's `datasets.load_dataset` call does: `''` by
//!   file name (maxrs's own), a builder (`json`, `parquet`, `csv`, `text`, `arrow`: [`formats`]),
//!   or a Hub dataset ([`hub`]), its split's files chosen as the library chooses them ([`splits`]).
//! - [`prepare`]: `maxrs tokenize`, text files to the `tokens` format.
//! - [`preference`]: preference pairs (`use_dpo`) cut into the chosen and rejected rows.
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
pub mod formats;
pub mod hub;
pub mod mixture;
pub mod packing;
pub mod preference;
pub mod prepare;
pub mod shuffle;
pub mod splits;
pub mod storage;
pub mod synthetic;
pub mod text;
pub mod threefry;
pub mod tokenizer;
pub mod tokens;

use std::ops::Range;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::config::{Config, DatasetType};

pub use batch::{Batch, PackedRow};
pub use error::DataError;
pub use packing::Packing;
pub use synthetic::{Progression, Synthetic};
pub use text::{TextBatches, TextSpec, TextState};
pub use tokenizer::TextTokenizer;
pub use tokens::{write_tokens_file, TokensFile};

/// Where a data stream is: enough to resume it exactly (a checkpoint saves it as JSON).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "dataset_type", rename_all = "snake_case")]
pub enum DataState {
    /// The next step of the synthetic data.
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
    /// nothing. The batches read stay to be delivered. Token files and the synthetic data
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
    let (files, storage) = split_files(c, split, files_key, pattern)?;
    let mut pairs = None;
    let (column, sft) = if c.use_dpo {
        // Conversational pairs are rendered with the chat template, which must then load.
        let template = match documents::check_pairs(storage.as_ref(), &files, columns)? {
            true => Some(chat::ChatTemplate::load(&c.chat_template, &c.chat_template_path, &c.tokenizer_path)?),
            false => None,
        };
        pairs = Some(Arc::new(preference::Pairs { columns: columns.clone(), template }));
        (String::new(), None)
    } else if c.use_sft {
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
        pairs,
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

/// The files of `split` and the storage that reads them, as `hf_path` says (MaxText passes
/// `hf_path`, `hf_name`, `hf_data_dir`, `pattern` as `data_files` and the split to
/// `datasets.load_dataset(..., streaming=True)`: `input_pipeline/hf_data_processing.py` at MaxText
/// e591f30). `pattern` is `hf_train_files` / `hf_eval_files` (or one component of a mixture).
fn split_files(
    c: &Config,
    split: Split,
    files_key: &'static str,
    pattern: &str,
) -> Result<(Vec<std::path::PathBuf>, Arc<dyn storage::Storage>), DataError> {
    // MaxText sets hf_eval_split to "train" when hf_eval_files is given (configs/types.py at
    // MaxText e591f30): a data_files string is the split `train`.
    let (split_key, split_name) = match split {
        Split::Train => ("train_split", c.train_split.as_str()),
        Split::Eval if !c.hf_eval_files.is_empty() => ("hf_eval_split", "train"),
        Split::Eval => ("hf_eval_split", c.hf_eval_split.as_str()),
    };
    let culprit = |message: String| DataError::Invalid(format!("hf_path={}: {message}", c.hf_path));
    if !pattern.is_empty() && split_name != "train" {
        return Err(DataError::Invalid(format!(
            "{split_key}={split_name}: the files of {files_key} are the one split 'train' (as the datasets library \
             names a data_files string); set {split_key}=train"
        )));
    }
    if c.hf_path.is_empty() {
        if pattern.is_empty() {
            return Err(DataError::NoFilesKey { key: files_key });
        }
        let storage: Arc<dyn storage::Storage> = storage::storage_for(pattern).into();
        let files = storage.glob(files_key, pattern)?;
        for path in &files {
            storage.format(path)?;
        }
        return Ok((files, storage));
    }
    if let Some(format) = documents::Format::builder(&c.hf_path) {
        let data_dir = c.hf_data_dir.trim_end_matches('/');
        if !pattern.is_empty() {
            // The library resolves relative data_files under data_dir.
            let relative = !pattern.starts_with('/') && !pattern.starts_with('~') && !pattern.contains("://");
            let pattern =
                if relative && !data_dir.is_empty() { format!("{data_dir}/{pattern}") } else { pattern.to_string() };
            let inner = storage::storage_for(&pattern);
            let files = inner.glob(files_key, &pattern)?;
            return Ok((files, Arc::new(storage::Typed { inner, format })));
        }
        if data_dir.is_empty() {
            return Err(culprit(format!(
                "the {} builder needs files: give {files_key} (a file or glob), or a folder with hf_data_dir",
                c.hf_path
            )));
        }
        let listing = storage::local_listing("hf_data_dir", std::path::Path::new(data_dir))?;
        let request = splits::Request { name: &c.hf_name, data_dir: "", data_files: "", split: split_name };
        let chosen =
            splits::choose(&listing, None, &request).map_err(|e| culprit(format!("hf_data_dir={data_dir}: {e}")))?;
        let files = chosen.files.iter().map(|f| std::path::Path::new(data_dir).join(f)).collect();
        return Ok((files, Arc::new(storage::Typed { inner: Box::new(storage::LocalFiles), format })));
    }
    let folder = std::path::Path::new(&c.hf_path);
    if folder.is_dir() {
        // A local folder, read as a Hub repository's files would be (load.py's
        // LocalDatasetModuleFactory): its card's configs, else the default patterns.
        let listing = storage::local_listing("hf_path", folder)?;
        let readme = std::fs::read_to_string(folder.join("README.md")).ok();
        let request =
            splits::Request { name: &c.hf_name, data_dir: &c.hf_data_dir, data_files: pattern, split: split_name };
        let chosen = splits::choose(&listing, readme.as_deref(), &request).map_err(culprit)?;
        let files = chosen.files.iter().map(|f| folder.join(f)).collect();
        return Ok((files, Arc::new(storage::Typed { inner: Box::new(storage::LocalFiles), format: chosen.format })));
    }
    if !hub::is_repo(&c.hf_path) {
        return Err(culprit(
            "not a builder (json, parquet, csv, text, arrow), a local folder nor a Hub dataset `org/name`; '' reads \
             hf_train_files by file extension"
                .into(),
        ));
    }
    let hub = hub::Hub::new(&c.hf_path, &c.hf_access_token)?;
    let listing = hub.list()?;
    let readme = match listing.iter().any(|(p, _)| p == "README.md") {
        true => hub.small_file("README.md")?,
        false => None,
    };
    let names: Vec<String> = listing.iter().map(|(p, _)| p.clone()).collect();
    let request =
        splits::Request { name: &c.hf_name, data_dir: &c.hf_data_dir, data_files: pattern, split: split_name };
    let chosen = splits::choose(&names, readme.as_deref(), &request).map_err(culprit)?;
    let (storage, files) = hub::HubFiles::new(hub, listing, &chosen.files, chosen.format);
    Ok((files, Arc::new(storage)))
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
            Ok(BatchIterator::Synthetic(synthetic::SyntheticBatches::new(Synthetic::of(c)?, rows, step)))
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
        // Refused by the config's checks (`validate::check_data`) before any run reads data.
        DatasetType::Tfds | DatasetType::Grain => {
            Err(DataError::Invalid(format!("dataset_type={} is not supported yet", c.dataset_type)))
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
