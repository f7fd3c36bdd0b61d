//! Reading documents (the text of one column per row) out of the files Hugging Face datasets are
//! distributed in, one file at a time, in row order:
//!
//! - `.parquet`: the column's values, row group after row group (Snappy, Zstd, Gzip and LZ4
//!   pages); the column must hold strings (a `BYTE_ARRAY` leaf at the top level).
//! - `.jsonl` / `.json` (JSON Lines): one JSON object per non-empty line, the column's string.
//! - `.txt` / `.md`: one document per paragraph (lines up to a blank line), as Hugging Face's
//!   `text` builder with `sample_by="paragraph"`.
//!
//! A row whose text cannot be decoded (bytes that are not UTF-8, a line that is not JSON, a
//! null) is a [`Doc::Undecodable`] row: counted and reported by the pipeline, not fatal. A
//! missing column or a non-string column is an error naming the file and listing the columns.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use parquet::basic::Type as PhysicalType;
use parquet::column::reader::ColumnReader;
use parquet::data_type::ByteArray;
use parquet::file::reader::{FileReader, SerializedFileReader};

use super::error::DataError;
use super::storage::Storage;

/// One row of a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Doc {
    Text(String),
    Undecodable,
}

/// The formats, by file name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Parquet,
    JsonLines,
    Text,
}

impl Format {
    pub fn of(path: &Path) -> Result<Format, DataError> {
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
        match ext.as_str() {
            "parquet" => Ok(Format::Parquet),
            "jsonl" | "json" | "ndjson" => Ok(Format::JsonLines),
            "txt" | "md" | "text" => Ok(Format::Text),
            _ => Err(DataError::UnknownFormat { path: path.to_path_buf() }),
        }
    }
}

/// The rows of one file, in order.
pub type Rows = Box<dyn Iterator<Item = Result<Doc, DataError>> + Send>;

/// Opens `path` and reads column `column` of each row.
pub fn read_file(storage: &dyn Storage, path: &Path, column: &str) -> Result<Rows, DataError> {
    let file = storage.open(path)?;
    match Format::of(path)? {
        Format::Parquet => Ok(Box::new(ParquetRows::open(file, path, column)?)),
        Format::JsonLines => {
            Ok(Box::new(JsonRows { lines: BufReader::new(file), path: path.to_path_buf(), column: column.into() }))
        }
        Format::Text => {
            let mut bytes = Vec::new();
            BufReader::new(file).read_to_end(&mut bytes).map_err(|e| DataError::io(path, e))?;
            Ok(Box::new(paragraphs(&bytes).into_iter().map(Ok)))
        }
    }
}

/// Checks that `path` opens and its first row has `column` (errors list the columns there are).
pub fn check_file(storage: &dyn Storage, path: &Path, column: &str) -> Result<(), DataError> {
    let mut rows = read_file(storage, path, column)?;
    rows.next().transpose().map(|_| ())
}

struct JsonRows {
    lines: BufReader<File>,
    path: PathBuf,
    column: String,
}

impl Iterator for JsonRows {
    type Item = Result<Doc, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        let mut line = Vec::new();
        loop {
            line.clear();
            match self.lines.read_until(b'\n', &mut line) {
                Ok(0) => return None,
                Ok(_) if line.iter().all(u8::is_ascii_whitespace) => continue,
                Ok(_) => break,
                Err(e) => return Some(Err(DataError::io(&self.path, e))),
            }
        }
        let Ok(serde_json::Value::Object(object)) = serde_json::from_slice::<serde_json::Value>(&line) else {
            return Some(Ok(Doc::Undecodable));
        };
        Some(match object.get(&self.column) {
            Some(serde_json::Value::String(text)) => Ok(Doc::Text(text.clone())),
            Some(serde_json::Value::Null) => Ok(Doc::Undecodable),
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
        })
    }
}

/// Paragraphs of a text file: runs of non-blank lines, joined by `\n`.
fn paragraphs(bytes: &[u8]) -> Vec<Doc> {
    let mut docs = Vec::new();
    let mut current: Vec<&[u8]> = Vec::new();
    let flush = |current: &mut Vec<&[u8]>, docs: &mut Vec<Doc>| {
        if !current.is_empty() {
            let joined = current.join(&b'\n');
            docs.push(String::from_utf8(joined).map(Doc::Text).unwrap_or(Doc::Undecodable));
            current.clear();
        }
    };
    for line in bytes.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            flush(&mut current, &mut docs);
        } else {
            current.push(line);
        }
    }
    flush(&mut current, &mut docs);
    docs
}

/// Records read from a Parquet column chunk per call.
const PARQUET_BATCH: usize = 1024;

struct ParquetRows {
    reader: SerializedFileReader<File>,
    path: PathBuf,
    column: usize,
    max_def: i16,
    row_group: usize,
    chunk: Option<ColumnReader>,
    buffered: std::vec::IntoIter<Doc>,
}

impl ParquetRows {
    fn open(file: File, path: &Path, column: &str) -> Result<ParquetRows, DataError> {
        let corrupt = |e: parquet::errors::ParquetError| DataError::CorruptParquet {
            path: path.to_path_buf(),
            message: e.to_string(),
        };
        let reader = SerializedFileReader::new(file).map_err(corrupt)?;
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
            let docs: Vec<Doc> = (0..records)
                .map(|i| {
                    let present = self.max_def == 0 || defs.get(i).is_some_and(|&d| d == self.max_def);
                    match present.then(|| values.next()).flatten() {
                        Some(v) => {
                            std::str::from_utf8(v.data()).map(|s| Doc::Text(s.to_string())).unwrap_or(Doc::Undecodable)
                        }
                        None => Doc::Undecodable,
                    }
                })
                .collect();
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
