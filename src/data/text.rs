//! `dataset_type=hf`: documents from Parquet / JSON Lines / text files, tokenized on the fly by
//! background workers and packed into batches, with a small resumable position.
//!
//! # The document stream
//! Epoch `e` visits the files (`hf_train_files`, sorted) in an order shuffled by
//! (`data_shuffle_seed`, `e`) when `enable_data_shuffling` is on (the file-level shuffle), and
//! splits them between processes: with at least as many files as processes, process `p` reads
//! files `p, p + P, p + 2P, ...` of that order; with fewer, every process reads every file and
//! keeps the rows `r` with `r % P == p`. Either way each row is read by exactly one process
//! once per epoch. The kept rows are cut into windows of [`SHUFFLE_WINDOW`] documents and each
//! window is shuffled by (`data_shuffle_seed`, `e`, where the window starts) (the window-level
//! shuffle, like a shuffle buffer, but reproducible from the window's start alone). Training
//! repeats epochs with new orders; eval reads one epoch in file order.
//!
//! # Threads
//! A [`Pool`] of threads (`workers`, one per core up to 8, and one more) reads and tokenizes
//! windows: each stream keeps a few of its next windows requested, and a request is a job that
//! reads the stream's next window (streams are read in order, one window at a time) and
//! tokenizes it. A
//! packer thread takes the tokenized documents in order, packs them ([`super::packing`]) and
//! keeps [`PREFETCH_BATCHES`] batches ready in a bounded queue (the packer reads any
//! [`DocStream`]: one dataset's [`CheckedDocs`], or a mixture's, `super::mixture`, whose
//! datasets all share one pool: the threads are `workers + 2` however many datasets a mixture
//! has). The train loop only takes the next batch. Dropping the iterator closes the queues and
//! every thread ends; a thread that cannot be started is an error naming the machine's limit.
//! An epoch in which no row gives a document (all undecodable or empty) ends the stream with an
//! error: repeating it could never fill a batch.
//!
//! # The position
//! [`TextState`] names the next document not yet in a delivered batch: epoch, file (index in this
//! process's files of that epoch), the row where its window starts, and how many documents of
//! that window are already used. Restarting from it re-reads that window and skips them, so a
//! resumed stream continues exactly where the saved one stopped.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread;

use serde::{Deserialize, Serialize};

use super::batch::Batch;
use super::chat::Sft;
use super::documents::{read_conversations, read_file, read_pairs, Doc, Rows};
use super::error::DataError;
use super::packing::{Encoded, Packer, Packing};
use super::preference::Pairs;
use super::shuffle::{key, shuffle};
use super::storage::Storage;
use super::tokenizer::TextTokenizer;
use super::DataState;

/// Documents per shuffled window (Hugging Face datasets' default shuffle buffer is 1000).
pub const SHUFFLE_WINDOW: usize = 1000;
/// Documents per unit of tokenizer work when not shuffling.
const PLAIN_WINDOW: usize = 64;
/// Batches the packer keeps ready ahead of the train loop.
pub const PREFETCH_BATCHES: usize = 4;

/// Where the stream is (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TextState {
    pub epoch: u64,
    pub file: u64,
    pub row: u64,
    pub taken: u64,
}

/// What a text stream reads and how it cuts it.
#[derive(Clone)]
pub struct TextSpec {
    /// Every file of the dataset, sorted (the same list on every process).
    pub files: Vec<PathBuf>,
    pub column: String,
    /// `use_sft=true`: rows are conversations, rendered with the chat template (`column` unused).
    pub sft: Option<Arc<Sft>>,
    /// `use_dpo=true`: rows are preference pairs (`column` unused).
    pub pairs: Option<Arc<Pairs>>,
    pub storage: Arc<dyn Storage>,
    pub tokenizer: Arc<TextTokenizer>,
    /// Longest document kept, in tokens (longer ones are truncated): `max_target_length`.
    pub max_doc_len: usize,
    /// `Some(data_shuffle_seed)` to shuffle.
    pub shuffle_seed: Option<u64>,
    pub process_index: usize,
    pub process_count: usize,
    /// Start a new epoch at the end (training) or end the stream (eval, `maxrs tokenize`).
    pub repeat: bool,
    /// Tokenizer threads.
    pub workers: usize,
}

/// Counters shared with the background threads.
#[derive(Debug, Default)]
pub struct Stats {
    pub documents: AtomicU64,
    pub undecodable: AtomicU64,
    pub tokens: AtomicU64,
}

impl Stats {
    pub fn get(&self) -> (u64, u64, u64) {
        (
            self.documents.load(Ordering::Relaxed),
            self.undecodable.load(Ordering::Relaxed),
            self.tokens.load(Ordering::Relaxed),
        )
    }
}

/// The files process `p` reads in `epoch`, and the row filter when files are shared.
fn epoch_files(spec: &TextSpec, epoch: u64) -> (Vec<usize>, Option<(u64, u64)>) {
    let mut order: Vec<usize> = (0..spec.files.len()).collect();
    if let Some(seed) = spec.shuffle_seed {
        shuffle(&mut order, key(&[seed, epoch, 0xF11E]));
    }
    let (p, n) = (spec.process_index, spec.process_count);
    if order.len() >= n {
        (order.into_iter().skip(p).step_by(n).collect(), None)
    } else {
        (order, Some((p as u64, n as u64)))
    }
}

/// Reads this process's rows in stream order from a position.
struct Cursor {
    spec: Arc<TextSpec>,
    epoch: u64,
    files: Vec<usize>,
    filter: Option<(u64, u64)>,
    file: u64,
    row: u64,
    rows: Option<Rows>,
    /// Rows to skip in the first file opened (resuming inside a file).
    skip: u64,
}

impl Cursor {
    fn new(spec: Arc<TextSpec>, at: TextState) -> Cursor {
        let (files, filter) = epoch_files(&spec, at.epoch);
        Cursor { spec, epoch: at.epoch, files, filter, file: at.file, row: 0, rows: None, skip: at.row }
    }

    fn position(&self) -> TextState {
        TextState { epoch: self.epoch, file: self.file, row: self.row + self.skip, taken: 0 }
    }

    /// The next kept row of this epoch, or `None` at the epoch's end.
    fn next(&mut self) -> Result<Option<Doc>, DataError> {
        loop {
            if self.file as usize >= self.files.len() {
                return Ok(None);
            }
            if self.rows.is_none() {
                let path = &self.spec.files[self.files[self.file as usize]];
                let storage = self.spec.storage.as_ref();
                let mut rows = match (&self.spec.sft, &self.spec.pairs) {
                    (Some(sft), _) => read_conversations(storage, path, &sft.columns)?,
                    (None, Some(pairs)) => read_pairs(storage, path, &pairs.columns)?,
                    (None, None) => read_file(storage, path, &self.spec.column)?,
                };
                self.row = 0;
                while self.skip > 0 {
                    self.skip -= 1;
                    match rows.next().transpose()? {
                        Some(_) => self.row += 1,
                        None => break,
                    }
                }
                self.skip = 0;
                self.rows = Some(rows);
            }
            let row = self.row;
            match self.rows.as_mut().expect("opened above").next().transpose()? {
                Some(doc) => {
                    self.row += 1;
                    if self.filter.is_none_or(|(p, n)| row % n == p) {
                        return Ok(Some(doc));
                    }
                }
                None => {
                    self.rows = None;
                    self.file += 1;
                    self.row = 0;
                }
            }
        }
    }

    fn next_epoch(&mut self) {
        self.epoch += 1;
        (self.files, self.filter) = epoch_files(&self.spec, self.epoch);
        (self.file, self.row, self.rows, self.skip) = (0, 0, None, 0);
    }
}

/// A window of documents for the pool's threads.
struct Window {
    start: TextState,
    docs: Vec<Doc>,
}

/// A tokenized window: `None` for a row that could not be decoded or tokenized.
struct Tokenized {
    start: TextState,
    docs: Vec<Option<Encoded>>,
}

/// What a request for a stream's next window gets: the window tokenized, or `None` at the end
/// of the stream.
type WindowResult = Result<Option<Tokenized>, DataError>;
type WindowDocs = std::vec::IntoIter<Option<Encoded>>;
/// A unit of work for a [`Pool`]'s threads.
type Job = Box<dyn FnOnce() + Send>;

/// Starts a named thread; a failure (the machine's thread limit) is an error, not a panic.
pub(super) fn spawn(name: String, body: impl FnOnce() + Send + 'static) -> Result<(), DataError> {
    match thread::Builder::new().name(name.clone()).spawn(body) {
        Ok(_) => Ok(()),
        Err(source) => Err(DataError::Spawn { what: name, source }),
    }
}

/// The threads that read and tokenize the windows of one pipeline's streams: `workers + 1`
/// however many streams share them (a mixture of 10,000 datasets runs as many threads as one
/// dataset). The one more than the tokenizers stands for a reader: while a thread waits for a
/// window's bytes (a `gs://` range), the others keep tokenizing. The queue has no bound of its
/// own: each stream keeps at most its `ahead` windows requested ([`TokenizedDocs`]). The threads
/// end when every stream holding the pool is dropped.
pub struct Pool {
    jobs: Sender<Job>,
    workers: usize,
}

impl Pool {
    /// A pool for `workers` tokenizer threads (`spec.workers`).
    pub fn start(workers: usize) -> Result<Arc<Pool>, DataError> {
        let workers = workers.max(1);
        let (jobs, queue) = channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        for i in 0..=workers {
            let queue = queue.clone();
            spawn(format!("maxrs-data-{i}"), move || run_jobs(&queue))?;
        }
        Ok(Arc::new(Pool { jobs, workers }))
    }

    /// Windows each of `streams` streams keeps requested: twice the threads between them, at
    /// least one each (its next window is read while the current one is consumed).
    pub fn ahead(&self, streams: usize) -> usize {
        (2 * self.workers / streams.max(1)).max(1)
    }

    fn run(&self, job: Job) -> Result<(), DataError> {
        self.jobs.send(job).map_err(|_| DataError::Worker("the data threads have stopped".into()))
    }
}

fn run_jobs(queue: &Mutex<Receiver<Job>>) {
    loop {
        let job = match queue.lock() {
            Ok(queue) => queue.recv(),
            Err(_) => return,
        };
        let Ok(job) = job else { return };
        job();
    }
}

/// A stream's windows, read in order by whichever pool thread serves its next request.
struct WindowSource {
    cursor: Cursor,
    epoch_had_rows: bool,
    finished: bool,
    /// The requests not yet served, oldest first: the k-th window read answers the k-th.
    waiting: VecDeque<SyncSender<WindowResult>>,
}

impl WindowSource {
    /// The next window of the stream (shuffled), or `None` at its end: an eval stream's after one
    /// epoch; a training stream's never, unless an epoch gave no rows (then an error).
    fn next_window(&mut self) -> Result<Option<Window>, DataError> {
        let spec = self.cursor.spec.clone();
        let size = if spec.shuffle_seed.is_some() { SHUFFLE_WINDOW } else { PLAIN_WINDOW };
        while !self.finished {
            let start = self.cursor.position();
            let mut docs = Vec::with_capacity(size);
            let mut at_end = false;
            while docs.len() < size {
                match self.cursor.next() {
                    Ok(Some(doc)) => docs.push(doc),
                    Ok(None) => {
                        at_end = true;
                        break;
                    }
                    Err(e) => {
                        self.finished = true;
                        return Err(e);
                    }
                }
            }
            self.epoch_had_rows |= !docs.is_empty();
            if at_end {
                self.end_epoch()?;
            }
            if !docs.is_empty() {
                if let Some(seed) = spec.shuffle_seed {
                    shuffle(&mut docs, key(&[seed, start.epoch, start.file, start.row]));
                }
                return Ok(Some(Window { start, docs }));
            }
        }
        Ok(None)
    }

    /// At the end of an epoch: the stream ends (eval), or the next epoch starts (training).
    fn end_epoch(&mut self) -> Result<(), DataError> {
        let spec = &self.cursor.spec;
        if !spec.repeat {
            self.finished = true;
            return Ok(());
        }
        if !self.epoch_had_rows {
            self.finished = true;
            return Err(DataError::Worker(format!(
                "epoch {} gave this process (index {} of {}) no rows; the files are empty",
                self.cursor.epoch, spec.process_index, spec.process_count
            )));
        }
        self.cursor.next_epoch();
        self.epoch_had_rows = false;
        Ok(())
    }
}

/// The tokenized documents of a stream, in order, read and tokenized by a [`Pool`]'s threads a
/// window at a time, `ahead` windows ahead of the one handed out. Each item is `(position of
/// the document, its ids or None)`.
pub struct TokenizedDocs {
    spec: Arc<TextSpec>,
    source: Arc<Mutex<WindowSource>>,
    pool: Arc<Pool>,
    ahead: usize,
    /// The answers to the windows requested, in stream order.
    requested: VecDeque<Receiver<WindowResult>>,
    /// The window being handed out: its start, its remaining documents, the next one's index.
    current: Option<(TextState, WindowDocs, u64)>,
    skip: u64,
    ended: bool,
}

impl TokenizedDocs {
    /// The stream of `spec` from `at`, with a pool of `spec.workers` threads of its own.
    pub fn start(spec: &TextSpec, at: TextState) -> Result<TokenizedDocs, DataError> {
        let pool = Pool::start(spec.workers)?;
        let ahead = pool.ahead(1);
        Ok(TokenizedDocs::on(&pool, ahead, spec, at))
    }

    /// The stream of `spec` from `at`, served by `pool`. Nothing is read before the first
    /// [`Self::next_doc`].
    pub fn on(pool: &Arc<Pool>, ahead: usize, spec: &TextSpec, at: TextState) -> TokenizedDocs {
        let spec = Arc::new(spec.clone());
        let cursor = Cursor::new(spec.clone(), at);
        let source = WindowSource { cursor, epoch_had_rows: false, finished: false, waiting: VecDeque::new() };
        TokenizedDocs {
            spec,
            source: Arc::new(Mutex::new(source)),
            pool: pool.clone(),
            ahead,
            requested: VecDeque::new(),
            current: None,
            skip: at.taken,
            ended: false,
        }
    }

    /// The next document: its position (`taken` = its index in its window) and its ids.
    #[allow(clippy::type_complexity)]
    pub fn next_doc(&mut self) -> Result<Option<(TextState, Option<Encoded>)>, DataError> {
        loop {
            if let Some((start, docs, index)) = self.current.as_mut() {
                if let Some(doc) = docs.next() {
                    let at = TextState { taken: *index, ..*start };
                    *index += 1;
                    if self.skip > 0 {
                        self.skip -= 1;
                        continue;
                    }
                    return Ok(Some((at, doc)));
                }
                self.current = None;
            }
            if self.ended {
                return Ok(None);
            }
            self.request()?;
            let answer = self.requested.pop_front().expect("request() keeps `ahead` (>= 1) windows requested");
            match answer.recv() {
                Ok(Ok(Some(window))) => self.current = Some((window.start, window.docs.into_iter(), 0)),
                Ok(Ok(None)) => self.ended = true,
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(DataError::Worker("a data thread stopped before reading a window".into())),
            }
        }
    }

    /// Requests windows until `ahead` are: each request queues a job that reads the stream's
    /// next window and tokenizes it.
    fn request(&mut self) -> Result<(), DataError> {
        while self.requested.len() < self.ahead {
            let (answer, answered) = sync_channel(1);
            lock(&self.source).waiting.push_back(answer);
            let (source, spec) = (self.source.clone(), self.spec.clone());
            self.pool.run(Box::new(move || {
                let (answer, window) = {
                    let mut source = lock(&source);
                    let answer = source.waiting.pop_front().expect("one waiting request per job");
                    (answer, source.next_window())
                };
                let tokenized = window.map(|w| {
                    w.map(|w| Tokenized { start: w.start, docs: w.docs.iter().map(|doc| encode(&spec, doc)).collect() })
                });
                // The stream may have been dropped meanwhile; then no one waits for the window.
                let _ = answer.send(tokenized);
            }))?;
            self.requested.push_back(answered);
        }
        Ok(())
    }
}

/// The stream's source, even after a job panicked holding it: the panicking job's request
/// fails (its answer is dropped), and the stream stops at that window.
fn lock(source: &Mutex<WindowSource>) -> std::sync::MutexGuard<'_, WindowSource> {
    source.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One row's ids (and targets), or `None` when it gives no document (undecodable, a template or
/// tokenizer error).
fn encode(spec: &TextSpec, doc: &Doc) -> Option<Encoded> {
    let (tokenizer, max_len) = (spec.tokenizer.as_ref(), spec.max_doc_len);
    match (doc, &spec.sft) {
        (Doc::Text(text), None) => tokenizer.encode_document(text, max_len).ok().map(Encoded::plain),
        (Doc::Chat(messages), Some(sft)) => {
            let (ids, targets) = sft.template.encode(tokenizer, messages, sft.completion_only, max_len).ok()?;
            Some(Encoded { targets: (targets != ids).then_some(targets), ids, pair: None })
        }
        (Doc::Pair(sides), None) => spec.pairs.as_ref()?.encode(tokenizer, sides, max_len).map(Encoded::pair),
        _ => None,
    }
}

/// Rows that gave no document (undecodable, or tokenized to nothing), counted per epoch. An
/// epoch of only such rows means every epoch is: a repeating stream would read the files
/// forever without filling a batch, so it stops with an error instead.
struct Unused {
    /// The epoch of the last row that gave a document (or of the start).
    last_document_epoch: u64,
    /// The epoch counted.
    epoch: u64,
    rows: u64,
    undecodable: u64,
    /// The process reading (`process_index`, `process_count`), for the error.
    process: (usize, usize),
}

impl Unused {
    /// Called with each row's epoch before it is counted: fails when a whole epoch before it
    /// gave no document.
    fn check(&mut self, epoch: u64) -> Result<(), DataError> {
        if epoch > self.last_document_epoch + 1 {
            return Err(DataError::NoDocuments {
                epoch: self.epoch,
                process_index: self.process.0,
                process_count: self.process.1,
                rows: self.rows,
                undecodable: self.undecodable,
            });
        }
        if epoch != self.epoch {
            (self.epoch, self.rows, self.undecodable) = (epoch, 0, 0);
        }
        Ok(())
    }
}

/// A stream of documents for the packer: each with the stream's position at it (resuming there
/// reads it again) and after it, and its ids (`None`: the row gave no document).
pub trait DocStream: Send + 'static {
    #[allow(clippy::type_complexity)]
    fn next_doc(&mut self) -> Result<Option<(DataState, DataState, Option<Encoded>)>, DataError>;
}

/// One dataset's tokenized documents, failing once a whole epoch gave none (`Unused`).
pub struct CheckedDocs {
    docs: TokenizedDocs,
    unused: Unused,
}

impl CheckedDocs {
    /// The stream of `spec` from `at`, served by `pool` ([`TokenizedDocs::on`]).
    pub fn on(pool: &Arc<Pool>, ahead: usize, spec: &TextSpec, at: TextState) -> CheckedDocs {
        let unused = Unused {
            last_document_epoch: at.epoch,
            epoch: at.epoch,
            rows: 0,
            undecodable: 0,
            process: (spec.process_index, spec.process_count),
        };
        CheckedDocs { docs: TokenizedDocs::on(pool, ahead, spec, at), unused }
    }

    /// The next document: its position and its ids.
    pub fn next_doc(&mut self) -> Result<Option<(TextState, Option<Encoded>)>, DataError> {
        let Some((position, ids)) = self.docs.next_doc()? else { return Ok(None) };
        self.unused.check(position.epoch)?;
        match &ids {
            None => {
                self.unused.rows += 1;
                self.unused.undecodable += 1;
            }
            Some(e) if e.ids.is_empty() => self.unused.rows += 1,
            Some(_) => self.unused.last_document_epoch = position.epoch,
        }
        Ok(Some((position, ids)))
    }
}

impl DocStream for CheckedDocs {
    fn next_doc(&mut self) -> Result<Option<(DataState, DataState, Option<Encoded>)>, DataError> {
        Ok(CheckedDocs::next_doc(self)?.map(|(position, ids)| {
            let after = TextState { taken: position.taken + 1, ..position };
            (DataState::Hf(position), DataState::Hf(after), ids)
        }))
    }
}

/// A delivered batch and the stream position after it.
type Delivery = Result<(Batch, DataState), DataError>;

/// This process's batches of a text dataset (see the module docs), or of a mixture of them
/// ([`super::mixture`]).
pub struct TextBatches {
    batches: Receiver<Delivery>,
    /// Batches read ahead of the train loop ([`Self::carries_loss_within`]), delivered first.
    read_ahead: VecDeque<(Batch, DataState)>,
    state: DataState,
    stats: Arc<Stats>,
    finished: bool,
}

impl TextBatches {
    /// Starts the background threads at `at` (the default state is the beginning). `rows` is
    /// this process's rows per batch, `seq_len` = `max_target_length`.
    pub fn start(
        spec: TextSpec,
        at: TextState,
        rows: usize,
        seq_len: usize,
        packing: Packing,
    ) -> Result<TextBatches, DataError> {
        let pool = Pool::start(spec.workers)?;
        let docs = CheckedDocs::on(&pool, pool.ahead(1), &spec, at);
        TextBatches::from_stream(docs, DataState::Hf(at), &spec.tokenizer, rows, seq_len, packing)
    }

    /// Packs the documents of `docs` (which stands at `at`) into batches on a background thread.
    pub fn from_stream(
        mut docs: impl DocStream,
        at: DataState,
        tokenizer: &TextTokenizer,
        rows: usize,
        seq_len: usize,
        packing: Packing,
    ) -> Result<TextBatches, DataError> {
        let stats = Arc::new(Stats::default());
        let (tx, rx) = sync_channel::<Delivery>(PREFETCH_BATCHES);
        let thread_stats = stats.clone();
        let (pad, bos) = (tokenizer.pad_id(), tokenizer.bos_id());
        let state = at.clone();
        spawn("maxrs-packer".into(), move || {
            let mut packer = Packer::new(seq_len, rows, packing, pad);
            let deliver = |packer: &mut Packer, after: DataState| tx.send(Ok((packer.batch(bos), after))).is_ok();
            let mut last = at;
            loop {
                match docs.next_doc() {
                    Ok(Some((position, after, ids))) => {
                        last = after;
                        let Some(ids) = ids else {
                            thread_stats.undecodable.fetch_add(1, Ordering::Relaxed);
                            continue;
                        };
                        if ids.ids.is_empty() {
                            continue;
                        }
                        if !packer.add(&ids) {
                            if !deliver(&mut packer, position) {
                                return;
                            }
                            packer.add(&ids);
                        }
                        thread_stats.documents.fetch_add(1, Ordering::Relaxed);
                        thread_stats.tokens.fetch_add(ids.ids.len() as u64, Ordering::Relaxed);
                        if packer.is_full() && !deliver(&mut packer, last.clone()) {
                            return;
                        }
                    }
                    Ok(None) => {
                        if !packer.is_empty() {
                            deliver(&mut packer, last);
                        }
                        return;
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                }
            }
        })?;
        Ok(TextBatches { batches: rx, read_ahead: VecDeque::new(), state, stats, finished: false })
    }

    /// Whether a target of the next `n` batches carries loss, reading them ahead (they are still
    /// delivered, in order): stops at the first batch that has one. An error of the stream is
    /// returned at once.
    pub fn carries_loss_within(&mut self, n: usize) -> Result<bool, DataError> {
        if self.read_ahead.iter().any(|(batch, _)| batch.total_weights() > 0) {
            return Ok(true);
        }
        while self.read_ahead.len() < n {
            match self.batches.recv() {
                Ok(Ok((batch, after))) => {
                    let carries = batch.total_weights() > 0;
                    self.read_ahead.push_back((batch, after));
                    if carries {
                        return Ok(true);
                    }
                }
                Ok(Err(e)) => {
                    self.finished = true;
                    return Err(e);
                }
                Err(_) => return Ok(false),
            }
        }
        Ok(false)
    }

    /// The next batch, or `None` when a non-repeating stream has ended (its last batch is
    /// padded with empty rows).
    pub fn next_batch(&mut self) -> Result<Option<Batch>, DataError> {
        if self.finished {
            return Ok(None);
        }
        match self.read_ahead.pop_front().map_or_else(|| self.batches.recv(), |ahead| Ok(Ok(ahead))) {
            Ok(Ok((batch, after))) => {
                self.state = after;
                Ok(Some(batch))
            }
            Ok(Err(e)) => {
                self.finished = true;
                Err(e)
            }
            Err(_) => {
                self.finished = true;
                Ok(None)
            }
        }
    }

    /// The position after the last delivered batch.
    pub fn state(&self) -> DataState {
        self.state.clone()
    }

    /// Documents packed, rows that could not be decoded, tokens packed, so far (the packer
    /// runs ahead of the delivered batches by up to the prefetch).
    pub fn stats(&self) -> (u64, u64, u64) {
        self.stats.get()
    }
}
