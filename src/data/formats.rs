//! The rows of the `csv` and `arrow` builders' files ([`super::documents`] owns the rest and
//! the shared [`Doc`] rows): one text column read as the `datasets` library reads it
//! (`packaged_modules/csv/csv.py`, `packaged_modules/arrow/arrow.py` at huggingface/datasets
//! b7cb10b), streamed, a record at a time for CSV, a record batch at a time for Arrow.

use std::io::Read;
use std::path::{Path, PathBuf};

use arrow_array::{Array, LargeStringArray, StringArray};
use arrow_ipc::reader::StreamReader;

use super::documents::{Doc, Rows};
use super::error::DataError;

/// pandas' `read_csv` default `na_values` (`keep_default_na=True`, which the CSV builder keeps):
/// fields read as NaN.
pub const NA_VALUES: [&str; 19] = [
    "", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN", "<NA>", "N/A", "NA",
    "NULL", "NaN", "None", "n/a", "nan", "null",
];

/// The CSV builder's rows: the first record names the columns (pandas' `header="infer"`), each
/// later record is a row, blank lines skipped; fields are quoted with `"` (`""` inside a quoted
/// field is one quote) and may span lines. An empty field, one missing from a short record, and
/// pandas' default NA strings ([`NA_VALUES`]: `NA`, `null`, `nan`, ...) are nulls (pandas' NaN).
/// Values are read as text: pandas would type a column of only numbers as numbers, which
/// MaxText's tokenization refuses just the same.
pub fn csv_rows(file: Box<dyn Read + Send>, path: &Path, column: &str, tab: bool) -> Result<Rows, DataError> {
    let mut reader =
        csv::ReaderBuilder::new().delimiter(if tab { b'\t' } else { b',' }).flexible(true).from_reader(file);
    let bad = |e: csv::Error| DataError::Invalid(format!("{}: not readable CSV: {e}", path.display()));
    let header: Vec<String> = reader.headers().map_err(bad)?.iter().map(str::to_string).collect();
    let Some(index) = header.iter().position(|h| h == column) else {
        return Err(DataError::NoColumn { path: path.to_path_buf(), column: column.into(), available: header });
    };
    let path = path.to_path_buf();
    let mut records = reader.into_byte_records().enumerate();
    Ok(Box::new(std::iter::from_fn(move || {
        let (i, record) = records.next()?;
        Some(match record {
            Err(e) => Err(DataError::Invalid(format!("{}: row {i}: not readable CSV: {e}", path.display()))),
            Ok(record) => Ok(match record.get(index).filter(|f| !NA_VALUES.iter().any(|na| na.as_bytes() == *f)) {
                None => Doc::Undecodable(format!("row {i}: null")),
                Some(field) => std::str::from_utf8(field)
                    .map(|s| Doc::Text(s.to_string()))
                    .unwrap_or_else(|e| Doc::Undecodable(format!("row {i}: not UTF-8 (byte {})", e.valid_up_to()))),
            }),
        })
    })))
}

/// The Arrow builder's rows: an IPC stream (the `.arrow` files `datasets` writes), record batch
/// after record batch; the column must hold strings.
pub fn arrow_rows(file: Box<dyn Read + Send>, path: &Path, column: &str) -> Result<Rows, DataError> {
    let bad = |e: arrow_schema::ArrowError| {
        DataError::Invalid(format!("{}: not a readable Arrow IPC stream: {e}", path.display()))
    };
    let reader = StreamReader::try_new(file, None).map_err(bad)?;
    let schema = reader.schema();
    let Some((index, field)) = schema.fields().iter().enumerate().find(|(_, f)| f.name() == column) else {
        let available = schema.fields().iter().map(|f| f.name().clone()).collect();
        return Err(DataError::NoColumn { path: path.to_path_buf(), column: column.into(), available });
    };
    if !matches!(field.data_type(), arrow_schema::DataType::Utf8 | arrow_schema::DataType::LargeUtf8) {
        let found = format!("{} values", field.data_type());
        return Err(DataError::NotText { path: path.to_path_buf(), column: column.into(), found });
    }
    let path: PathBuf = path.to_path_buf();
    let mut batches = reader;
    let mut buffered = Vec::new().into_iter();
    let mut rows = 0u64;
    Ok(Box::new(std::iter::from_fn(move || loop {
        if let Some(doc) = buffered.next() {
            return Some(Ok(doc));
        }
        let batch = match batches.next()? {
            Ok(batch) => batch,
            Err(e) => {
                return Some(Err(DataError::Invalid(format!(
                    "{}: not a readable Arrow IPC stream: {e}",
                    path.display()
                ))))
            }
        };
        let values = batch.column(index);
        let text = |i: usize| -> Option<&str> {
            if values.is_null(i) {
                return None;
            }
            match values.as_any().downcast_ref::<StringArray>() {
                Some(strings) => Some(strings.value(i)),
                None => values.as_any().downcast_ref::<LargeStringArray>().map(|strings| strings.value(i)),
            }
        };
        let docs: Vec<Doc> = (0..batch.num_rows())
            .map(|i| match text(i) {
                Some(s) => Doc::Text(s.to_string()),
                None => Doc::Undecodable(format!("row {}: null", rows + i as u64)),
            })
            .collect();
        rows += batch.num_rows() as u64;
        buffered = docs.into_iter();
    })))
}
