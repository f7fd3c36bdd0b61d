//! Reading documents (the text of one column per row) out of the files Hugging Face datasets are
//! distributed in, one file at a time, in row order, streamed (a file is never read whole):
//!
//! - `.parquet`: the column's values, row group after row group (Snappy, Zstd, Gzip and LZ4
//!   pages); the column must hold strings (a `BYTE_ARRAY` leaf at the top level).
//! - `.jsonl` / `.json` (JSON Lines): one JSON object per non-empty line, the column's string.
//!   A file whose first line opens a JSON array (`[`) is refused: it is one JSON document, not
//!   JSON Lines.
//! - `.txt` / `.md`: one document per paragraph (lines up to a blank line), as Hugging Face's
//!   `text` builder with `sample_by="paragraph"`.
//!
//! Those are the formats by file name (`hf_path=''`, maxrs's own). `hf_path` names a builder of
//! the `datasets` library instead, which reads every file in its format whatever the name
//! ([`Format::builder`]; a Hub dataset's is inferred by [`super::splits`]):
//!
//! - `json`: JSON Lines as above, or a file that is one JSON list of objects (the builder reads a
//!   file that is not JSON Lines whole, as one JSON document); `parquet`: as above.
//! - `text`: one row per line, blank lines included as empty rows, line breaks dropped (the
//!   builder's defaults `sample_by="line"`, `keep_linebreaks=False`: `str.splitlines` of the file).
//! - `csv`: the header row names the columns, each later record is a row (pandas' `read_csv`
//!   defaults: `,`, `"` quoting, `.tsv` files `\t`); an empty field is a null.
//! - `arrow`: an Arrow IPC stream (what `datasets` writes as `.arrow`); the column must hold
//!   strings (`utf8` / `large_utf8`).
//!
//! A row whose text cannot be decoded (bytes that are not UTF-8, a line that is not JSON, a
//! null) is a [`Doc::Undecodable`] row, with the reason: counted and reported by the pipeline,
//! not fatal. A missing column or a non-string column is an error naming the file and listing
//! the columns. [`check_files`] runs before training: the files must hold at least one row with
//! text, or the stream would read them forever without filling a batch.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use parquet::basic::Type as PhysicalType;
use parquet::column::reader::ColumnReader;
use parquet::data_type::ByteArray;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::reader::RowIter;

use super::chat::{self, Message};
use super::error::DataError;
use super::formats;
use super::storage::{DataFile, Storage};

/// One column of a preference row: text, or a conversation (a list of `{role, content}`
/// messages), which the tokenizer's chat template renders as SFT renders it
/// (`data::preference`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Side {
    Text(String),
    Chat(Vec<Message>),
}

/// One row of a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Doc {
    Text(String),
    /// A conversation (`use_sft=true`: [`read_conversations`]).
    Chat(Vec<Message>),
    /// A preference row's columns, in their order (`use_dpo=true`: [`read_pairs`]).
    Pair(Vec<Side>),
    /// Why the row has no text, with its place: "line 3: not JSON (...)".
    Undecodable(String),
}

/// The formats, by file name or by `hf_path`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Parquet,
    JsonLines,
    /// JSON Lines, or a file that is one JSON list of objects (`hf_path=json`: the builder reads
    /// a file that is not JSON Lines whole, as one JSON document).
    Json,
    /// Paragraphs (`.txt` / `.md` by file name).
    Text,
    /// Lines (`hf_path=text`).
    Lines,
    /// Comma- (or, `tab`, tab-) separated values with a header row.
    Csv {
        tab: bool,
    },
    /// An Arrow IPC stream.
    Arrow,
}

impl Format {
    /// The format a file name says; an unknown extension is an error listing the known ones.
    pub fn of(path: &Path) -> Result<Format, DataError> {
        let named = if gzipped(path) { Path::new(path.file_stem().unwrap_or_default()) } else { path };
        let ext = named.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
        match ext.as_str() {
            "parquet" => Ok(Format::Parquet),
            "jsonl" | "json" | "ndjson" => Ok(Format::JsonLines),
            "txt" | "md" | "text" => Ok(Format::Text),
            _ => Err(DataError::UnknownFormat { path: path.to_path_buf() }),
        }
    }

    /// The format of `hf_path`'s packaged builder (`datasets`' `packaged_modules`), if it names one.
    pub fn builder(hf_path: &str) -> Option<Format> {
        Some(match hf_path {
            "json" => Format::Json,
            "parquet" => Format::Parquet,
            "text" => Format::Lines,
            "csv" => Format::Csv { tab: false },
            "arrow" => Format::Arrow,
            _ => return None,
        })
    }
}

/// The rows of one file, in order.
pub type Rows = Box<dyn Iterator<Item = Result<Doc, DataError>> + Send>;

/// Opens `path` and reads column `column` of each row.
pub fn read_file(storage: &dyn Storage, path: &Path, column: &str) -> Result<Rows, DataError> {
    let format = storage.format(path)?;
    let file = storage.open(path)?;
    match format {
        Format::Parquet => Ok(Box::new(ParquetRows::open(file, path, column)?)),
        Format::JsonLines | Format::Json => {
            Ok(Box::new(JsonRows::new(stream(file, path), path, column, None, format == Format::Json)))
        }
        Format::Text => {
            Ok(Box::new(Paragraphs { lines: BufReader::new(stream(file, path)), path: path.to_path_buf(), count: 0 }))
        }
        Format::Lines => Ok(Box::new(Lines::new(stream(file, path), path))),
        Format::Csv { tab } => Ok(Box::new(formats::csv_rows(stream(file, path), path, column, tab)?)),
        Format::Arrow => Ok(Box::new(formats::arrow_rows(stream(file, path), path, column)?)),
    }
}

/// Whether `path` is gzip-compressed (`.gz`): read through a decompressor, as the `datasets`
/// library opens compressed data files (`.jsonl.gz`, `.txt.gz`, `.csv.gz`).
fn gzipped(path: &Path) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gz"))
}

/// `file` from its start, decompressed when [`gzipped`].
fn stream(file: DataFile, path: &Path) -> Box<dyn Read + Send> {
    match gzipped(path) {
        true => Box::new(flate2::read::MultiGzDecoder::new(BufReader::new(file.reader()))),
        false => file.reader(),
    }
}

/// How a row of several columns is read: the row's JSON object, the columns, and the document or
/// why there is none.
type Record = fn(&serde_json::Map<String, serde_json::Value>, &[String]) -> Result<Doc, String>;

/// Opens `path` and reads the conversation of each row from `columns` (see [`chat`]): JSON Lines
/// objects, or Parquet rows (any nesting: lists of `{role, content}` structs); text files hold no
/// conversations and are refused.
pub fn read_conversations(storage: &dyn Storage, path: &Path, columns: &[String]) -> Result<Rows, DataError> {
    read_records(storage, path, columns, "use_sft=true reads conversations", |row, columns| {
        chat::conversation(row, columns).map(Doc::Chat)
    })
}

/// Opens `path` and reads the preference pair of each row: `columns` (MaxText's `[chosen,
/// rejected]` or `[prompt, chosen, rejected]`), each a string or a list of `{role, content}`
/// messages, from JSON Lines or Parquet files.
pub fn read_pairs(storage: &dyn Storage, path: &Path, columns: &[String]) -> Result<Rows, DataError> {
    read_records(storage, path, columns, "use_dpo=true reads preference pairs", |row, columns| {
        let side = |name: &String| match row.get(name) {
            Some(serde_json::Value::String(text)) => Ok(Side::Text(text.clone())),
            Some(serde_json::Value::Array(items)) => items
                .iter()
                .map(|m| serde_json::from_value::<Message>(m.clone()))
                .collect::<Result<_, _>>()
                .map(Side::Chat)
                .map_err(|e| format!("`{name}` is not a list of {{role, content}} messages ({e})")),
            Some(serde_json::Value::Null) | None => Err(format!("`{name}` is missing or null")),
            Some(_) => Err(format!("`{name}` is neither a string nor a list of messages")),
        };
        columns.iter().map(side).collect::<Result<_, _>>().map(Doc::Pair)
    })
}

/// The rows of `path` read by `record` from `columns` of JSON Lines objects or Parquet rows
/// (`what` names the reader in the error for other files).
fn read_records(
    storage: &dyn Storage,
    path: &Path,
    columns: &[String],
    what: &str,
    record: Record,
) -> Result<Rows, DataError> {
    let format = storage.format(path)?;
    let file = storage.open(path)?;
    match format {
        Format::JsonLines | Format::Json => {
            let whole = format == Format::Json;
            Ok(Box::new(JsonRows::new(stream(file, path), path, &columns[0], Some((columns.to_vec(), record)), whole)))
        }
        Format::Parquet => {
            let reader = parquet_reader(file, path)?;
            let fields = reader.metadata().file_metadata().schema_descr().root_schema().get_fields().to_vec();
            let available: Vec<String> = fields.iter().map(|f| f.name().to_string()).collect();
            if let Some(missing) = columns.iter().find(|c| !available.contains(c)) {
                return Err(DataError::NoColumn { path: path.to_path_buf(), column: missing.clone(), available });
            }
            let rows = RowIter::from_file_into(reader);
            let (path, columns) = (path.to_path_buf(), columns.to_vec());
            Ok(Box::new(rows.enumerate().map(move |(i, row)| {
                let row = row.map_err(|e| DataError::CorruptParquet { path: path.clone(), message: e.to_string() })?;
                Ok(match row.to_json_value() {
                    serde_json::Value::Object(object) => {
                        record(&object, &columns).unwrap_or_else(|why| Doc::Undecodable(format!("row {i}: {why}")))
                    }
                    _ => Doc::Undecodable(format!("row {i}: not a record")),
                })
            })))
        }
        Format::Text | Format::Lines | Format::Csv { .. } | Format::Arrow => Err(DataError::Invalid(format!(
            "{}: {what} from JSON Lines or Parquet files, not {format:?} files",
            path.display()
        ))),
    }
}

/// Checks that the files open, that the first has `column` (errors list the columns there
/// are), and that some row of them has text: files of only undecodable rows (a JSON array
/// pretty-printed over many lines, every line invalid, every value null) or of no rows at all
/// are refused, naming the first file and its first bad row. Reading stops at the first row
/// with text, normally the first row of the first file.
pub fn check_files(storage: &dyn Storage, files: &[PathBuf], column: &str) -> Result<(), DataError> {
    check_rows(storage, files, column, |path| read_file(storage, path, column)).map(drop)
}

/// [`check_files`] for preference pairs ([`read_pairs`]): some row must hold one. Returns
/// whether the first is a conversation (it needs the chat template).
pub fn check_pairs(storage: &dyn Storage, files: &[PathBuf], columns: &[String]) -> Result<bool, DataError> {
    let first = check_rows(storage, files, &columns.join(", "), |path| read_pairs(storage, path, columns))?;
    Ok(matches!(first, Some(Doc::Pair(sides)) if sides.iter().any(|s| matches!(s, Side::Chat(_)))))
}

/// [`check_files`] for conversations ([`read_conversations`]): some row must hold one.
pub fn check_conversations(storage: &dyn Storage, files: &[PathBuf], columns: &[String]) -> Result<(), DataError> {
    check_rows(storage, files, &columns.join(", "), |path| read_conversations(storage, path, columns)).map(drop)
}

fn check_rows(
    storage: &dyn Storage,
    files: &[PathBuf],
    column: &str,
    read: impl Fn(&Path) -> Result<Rows, DataError>,
) -> Result<Option<Doc>, DataError> {
    let mut first_file = None;
    for path in files {
        let mut rows = 0u64;
        let mut first_problem = None;
        for doc in read(path)? {
            match doc? {
                Doc::Undecodable(why) => first_problem = first_problem.or(Some(why)),
                doc => return Ok(Some(doc)),
            }
            rows += 1;
        }
        first_file = first_file.or(Some((path, rows, first_problem)));
    }
    let Some((path, rows, first_problem)) = first_file else {
        return Ok(None);
    };
    Err(DataError::NoText {
        path: path.clone(),
        format: storage.format(path)?,
        column: column.to_string(),
        rows,
        first_problem: first_problem.unwrap_or_default(),
        other_files: files.len() - 1,
    })
}

/// A Parquet file's reader, local or read in ranges.
fn parquet_reader(file: DataFile, path: &Path) -> Result<Box<dyn FileReader>, DataError> {
    let corrupt = |e: parquet::errors::ParquetError| DataError::CorruptParquet {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    Ok(match file {
        DataFile::Local(file) => Box::new(SerializedFileReader::new(file).map_err(corrupt)?),
        DataFile::Remote(remote) => Box::new(SerializedFileReader::new(remote).map_err(corrupt)?),
        DataFile::Hub(hub) => Box::new(SerializedFileReader::new(hub).map_err(corrupt)?),
    })
}

struct JsonRows {
    lines: BufReader<Box<dyn Read + Send>>,
    path: PathBuf,
    column: String,
    /// `Some((columns, record))`: rows are records of these columns (conversations, pairs).
    records: Option<(Vec<String>, Record)>,
    /// Lines read so far, blank ones included (for the reasons of undecodable rows); items of
    /// `list` handed out so far.
    line: u64,
    seen_row: bool,
    /// Whether a file that opens a JSON list is read as one (else it is refused).
    whole: bool,
    /// The items of a file that is one JSON list.
    list: Option<std::vec::IntoIter<serde_json::Value>>,
}

impl JsonRows {
    fn new(
        file: Box<dyn Read + Send>,
        path: &Path,
        column: &str,
        records: Option<(Vec<String>, Record)>,
        whole: bool,
    ) -> JsonRows {
        JsonRows {
            lines: BufReader::new(file),
            path: path.to_path_buf(),
            column: column.into(),
            records,
            line: 0,
            seen_row: false,
            whole,
            list: None,
        }
    }

    /// The next item of a JSON list file.
    fn next_item(&mut self) -> Option<Result<Doc, DataError>> {
        let value = self.list.as_mut()?.next()?;
        self.line += 1;
        let at = format!("item {}", self.line);
        Some(self.row(value, &at, self.line == 1))
    }

    /// The row of one JSON value (`at` says where it is); `first`: the file's first row, which
    /// decides whether the file has the record's columns at all.
    fn row(&self, value: serde_json::Value, at: &str, first: bool) -> Result<Doc, DataError> {
        let object = match value {
            serde_json::Value::Object(object) => object,
            _ => return Ok(Doc::Undecodable(format!("{at}: not a JSON object"))),
        };
        if let Some((columns, record)) = &self.records {
            if let Some(missing) = columns.iter().find(|c| !object.contains_key(*c)).filter(|_| first) {
                let available = object.keys().cloned().collect();
                return Err(DataError::NoColumn { path: self.path.clone(), column: missing.clone(), available });
            }
            return Ok(record(&object, columns).unwrap_or_else(|why| Doc::Undecodable(format!("{at}: {why}"))));
        }
        match object.get(&self.column) {
            Some(serde_json::Value::String(text)) => Ok(Doc::Text(text.clone())),
            Some(serde_json::Value::Null) => Ok(Doc::Undecodable(format!("{at}: `{}` is null", self.column))),
            Some(other) => Err(DataError::NotText {
                path: self.path.clone(),
                column: self.column.clone(),
                found: match other {
                    serde_json::Value::Number(_) => "numbers",
                    serde_json::Value::Bool(_) => "booleans",
                    serde_json::Value::Array(_) => "lists",
                    _ => "objects",
                }
                .into(),
            }),
            None => Err(DataError::NoColumn {
                path: self.path.clone(),
                column: self.column.clone(),
                available: object.keys().cloned().collect(),
            }),
        }
    }
}

impl Iterator for JsonRows {
    type Item = Result<Doc, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.list.is_some() {
            return self.next_item();
        }
        let mut line = Vec::new();
        loop {
            line.clear();
            match self.lines.read_until(b'\n', &mut line) {
                Ok(0) => return None,
                Ok(_) => self.line += 1,
                Err(e) => return Some(Err(DataError::io(&self.path, e))),
            }
            if !line.iter().all(u8::is_ascii_whitespace) {
                break;
            }
        }
        let first = !std::mem::replace(&mut self.seen_row, true);
        if first && line.trim_ascii_start().starts_with(b"[") {
            if !self.whole {
                return Some(Err(DataError::JsonArray { path: self.path.clone() }));
            }
            if let Err(e) = self.lines.read_to_end(&mut line) {
                return Some(Err(DataError::io(&self.path, e)));
            }
            return match serde_json::from_slice::<Vec<serde_json::Value>>(&line) {
                Ok(items) => {
                    (self.line, self.list) = (0, Some(items.into_iter()));
                    self.next_item()
                }
                Err(e) => Some(Err(DataError::Invalid(format!(
                    "{}: neither JSON Lines nor one JSON list of objects: {e}",
                    self.path.display()
                )))),
            };
        }
        let at = format!("line {}", self.line);
        Some(match serde_json::from_slice::<serde_json::Value>(&line) {
            Ok(value) => self.row(value, &at, first),
            Err(e) => Ok(Doc::Undecodable(format!("{at}: {e}"))),
        })
    }
}

/// The paragraphs of a text file, read line by line: runs of non-blank lines, joined by `\n`.
struct Paragraphs {
    lines: BufReader<Box<dyn Read + Send>>,
    path: PathBuf,
    /// Paragraphs handed out so far.
    count: u64,
}

impl Iterator for Paragraphs {
    type Item = Result<Doc, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        let mut paragraph: Vec<u8> = Vec::new();
        let mut line = Vec::new();
        loop {
            line.clear();
            match self.lines.read_until(b'\n', &mut line) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => return Some(Err(DataError::io(&self.path, e))),
            }
            let text = line.strip_suffix(b"\n").unwrap_or(&line);
            let text = text.strip_suffix(b"\r").unwrap_or(text);
            if text.iter().all(u8::is_ascii_whitespace) {
                if paragraph.is_empty() {
                    continue;
                }
                break;
            }
            if !paragraph.is_empty() {
                paragraph.push(b'\n');
            }
            paragraph.extend_from_slice(text);
        }
        if paragraph.is_empty() {
            return None;
        }
        self.count += 1;
        let at = self.count;
        Some(Ok(String::from_utf8(paragraph).map(Doc::Text).unwrap_or_else(|e| {
            Doc::Undecodable(format!("paragraph {at}: not UTF-8 (byte {})", e.utf8_error().valid_up_to()))
        })))
    }
}

/// The lines of a text file as `str.splitlines` cuts them (`\n`, `\r\n`, `\r` and Unicode's
/// other line boundaries), blank ones included: the `text` builder's rows.
struct Lines {
    lines: BufReader<Box<dyn Read + Send>>,
    path: PathBuf,
    /// Rows of the current physical line not handed out yet.
    pending: std::collections::VecDeque<Doc>,
    /// Lines read so far.
    count: u64,
}

impl Lines {
    fn new(file: Box<dyn Read + Send>, path: &Path) -> Lines {
        Lines { lines: BufReader::new(file), path: path.to_path_buf(), pending: Default::default(), count: 0 }
    }
}

/// Python's line boundaries besides `\n` (`str.splitlines`).
fn is_line_boundary(c: char) -> bool {
    matches!(c, '\r' | '\x0b' | '\x0c' | '\x1c' | '\x1d' | '\x1e' | '\u{85}' | '\u{2028}' | '\u{2029}')
}

impl Iterator for Lines {
    type Item = Result<Doc, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(doc) = self.pending.pop_front() {
            return Some(Ok(doc));
        }
        let mut line = Vec::new();
        match self.lines.read_until(b'\n', &mut line) {
            Ok(0) => return None,
            Ok(_) => self.count += 1,
            Err(e) => return Some(Err(DataError::io(&self.path, e))),
        }
        let text = line.strip_suffix(b"\n").unwrap_or(&line);
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        let at = self.count;
        match std::str::from_utf8(text) {
            Ok(text) => self.pending.extend(text.split(is_line_boundary).map(|s| Doc::Text(s.to_string()))),
            Err(e) => {
                self.pending.push_back(Doc::Undecodable(format!("line {at}: not UTF-8 (byte {})", e.valid_up_to())))
            }
        }
        self.pending.pop_front().map(Ok)
    }
}

/// Records read from a Parquet column chunk per call.
const PARQUET_BATCH: usize = 1024;

struct ParquetRows {
    reader: Box<dyn FileReader>,
    path: PathBuf,
    column: usize,
    max_def: i16,
    row_group: usize,
    /// Rows handed out so far (for the reasons of undecodable rows).
    rows: u64,
    chunk: Option<ColumnReader>,
    buffered: std::vec::IntoIter<Doc>,
}

impl ParquetRows {
    fn open(file: DataFile, path: &Path, column: &str) -> Result<ParquetRows, DataError> {
        let reader = parquet_reader(file, path)?;
        let schema = reader.metadata().file_metadata().schema_descr_ptr();
        let top_level: Vec<String> = schema.root_schema().get_fields().iter().map(|f| f.name().to_string()).collect();
        let index = schema.columns().iter().position(|c| c.path().parts() == [column.to_string()]);
        let Some(index) = index else {
            return Err(DataError::NoColumn { path: path.to_path_buf(), column: column.into(), available: top_level });
        };
        let descr = schema.column(index);
        if descr.physical_type() != PhysicalType::BYTE_ARRAY || descr.max_rep_level() > 0 {
            return Err(DataError::NotText {
                path: path.to_path_buf(),
                column: column.into(),
                found: if descr.max_rep_level() > 0 {
                    "lists".into()
                } else {
                    format!("{} values", descr.physical_type())
                },
            });
        }
        Ok(ParquetRows {
            max_def: descr.max_def_level(),
            reader,
            path: path.to_path_buf(),
            column: index,
            row_group: 0,
            rows: 0,
            chunk: None,
            buffered: Vec::new().into_iter(),
        })
    }

    /// Fills `buffered` with the next records; false at the end of the file.
    fn refill(&mut self) -> Result<bool, DataError> {
        let corrupt = |e: parquet::errors::ParquetError, path: &Path| DataError::CorruptParquet {
            path: path.to_path_buf(),
            message: e.to_string(),
        };
        loop {
            if self.chunk.is_none() {
                if self.row_group >= self.reader.num_row_groups() {
                    return Ok(false);
                }
                let group = self.reader.get_row_group(self.row_group).map_err(|e| corrupt(e, &self.path))?;
                self.chunk = Some(group.get_column_reader(self.column).map_err(|e| corrupt(e, &self.path))?);
                self.row_group += 1;
            }
            let Some(ColumnReader::ByteArrayColumnReader(reader)) = self.chunk.as_mut() else {
                unreachable!("the column was checked to be BYTE_ARRAY");
            };
            let (mut defs, mut values): (Vec<i16>, Vec<ByteArray>) = (Vec::new(), Vec::new());
            let (records, _, _) = reader
                .read_records(PARQUET_BATCH, Some(&mut defs), None, &mut values)
                .map_err(|e| corrupt(e, &self.path))?;
            if records == 0 {
                self.chunk = None;
                continue;
            }
            let mut values = values.into_iter();
            let first = self.rows;
            let docs: Vec<Doc> = (0..records)
                .map(|i| {
                    let row = first + i as u64;
                    let present = self.max_def == 0 || defs.get(i).is_some_and(|&d| d == self.max_def);
                    match present.then(|| values.next()).flatten() {
                        Some(v) => {
                            std::str::from_utf8(v.data()).map(|s| Doc::Text(s.to_string())).unwrap_or_else(|e| {
                                Doc::Undecodable(format!("row {row}: not UTF-8 (byte {})", e.valid_up_to()))
                            })
                        }
                        None => Doc::Undecodable(format!("row {row}: null")),
                    }
                })
                .collect();
            self.rows += records as u64;
            self.buffered = docs.into_iter();
            return Ok(true);
        }
    }
}

impl Iterator for ParquetRows {
    type Item = Result<Doc, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(doc) = self.buffered.next() {
            return Some(Ok(doc));
        }
        match self.refill() {
            Ok(true) => self.buffered.next().map(Ok),
            Ok(false) => None,
            Err(e) => Some(Err(e)),
        }
    }
}
