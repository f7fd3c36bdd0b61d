//! `dataset_type=hf`: Parquet, JSON Lines and text files tokenized in the background and packed.
//! Every document lands in exactly one process's batches once per epoch for any process count,
//! packing follows MaxText's arrays, the stream resumes exactly from its state, undecodable rows
//! are counted, and each bad input is a clear error.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use maxrs::config::{self, Config};
use maxrs::data::{
    self, Batch, BatchIterator, DataError, DataState, Packing, ProcessShare, Split, TextBatches, TextState,
    TextTokenizer,
};
use parquet::basic::{Compression, ZstdLevel};
use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;

const SEQ: usize = 64;
const ROWS: usize = 4;

fn tokenizer_path() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/shakespeare-bpe512.model").display().to_string()
}

/// Document `i`: its number first (it survives truncation), then a varying amount of words.
fn doc_text(i: usize) -> String {
    let words = ["thou", "art", "more", "lovely", "and", "temperate", "rough", "winds", "do", "shake"];
    let n = 1 + (i * 7) % 11;
    format!("doc {i} {}", (0..n).map(|k| words[(i + k) % words.len()]).collect::<Vec<_>>().join(" "))
}

/// Writes `texts` as a Parquet file with columns `id` and `text`, `per_group` rows per row group.
fn write_parquet(path: &Path, texts: &[String], per_group: usize) {
    let schema =
        Arc::new(parse_message_type("message doc { REQUIRED INT64 id; OPTIONAL BYTE_ARRAY text (UTF8); }").unwrap());
    let props = WriterProperties::builder().set_compression(Compression::ZSTD(ZstdLevel::default())).build();
    let mut writer = SerializedFileWriter::new(File::create(path).unwrap(), schema, Arc::new(props)).unwrap();
    for (g, chunk) in texts.chunks(per_group).enumerate() {
        let mut group = writer.next_row_group().unwrap();
        let mut col = group.next_column().unwrap().unwrap();
        let ids: Vec<i64> = (0..chunk.len() as i64).map(|i| g as i64 * per_group as i64 + i).collect();
        col.typed::<Int64Type>().write_batch(&ids, None, None).unwrap();
        col.close().unwrap();
        let mut col = group.next_column().unwrap().unwrap();
        let values: Vec<ByteArray> = chunk.iter().map(|t| ByteArray::from(t.as_str())).collect();
        col.typed::<ByteArrayType>().write_batch(&values, Some(&vec![1; chunk.len()]), None).unwrap();
        col.close().unwrap();
        group.close().unwrap();
    }
    writer.close().unwrap();
}

fn write_jsonl(path: &Path, texts: &[String]) {
    let lines: Vec<String> = texts.iter().map(|t| serde_json::json!({"text": t, "meta": 1}).to_string()).collect();
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

/// 75 documents in four files of three formats.
fn corpus(dir: &Path) -> usize {
    let docs: Vec<String> = (0..75).map(doc_text).collect();
    write_parquet(&dir.join("a.parquet"), &docs[0..20], 20);
    write_jsonl(&dir.join("b.jsonl"), &docs[20..35]);
    write_parquet(&dir.join("c.parquet"), &docs[35..65], 12);
    std::fs::write(dir.join("d.txt"), docs[65..75].join("\n\n") + "\n").unwrap();
    docs.len()
}

fn cfg(dir: &Path, extra: &[&str]) -> Config {
    let mut args = vec![
        "dataset_type=hf".to_string(),
        format!("hf_train_files={}/*.*", dir.display()),
        format!("tokenizer_path={}", tokenizer_path()),
        format!("max_target_length={SEQ}"),
        "data_shuffle_seed=11".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    config::load(None, &args).unwrap()
}

fn tokenizer() -> TextTokenizer {
    TextTokenizer::load(&tokenizer_path(), "sentencepiece", true, true).unwrap()
}

/// The document numbers of a batch's segments, row by row, checking MaxText's array rules.
fn documents(batch: &Batch, tok: &TextTokenizer) -> Vec<usize> {
    let get = |t: &maxrs::host::HostTensor| t.to_i32().chunks(SEQ).map(|c| c.to_vec()).collect::<Vec<_>>();
    let (ids, segs, pos, tgt, tseg) = (
        get(&batch.inputs),
        get(&batch.inputs_segmentation),
        get(&batch.inputs_position),
        get(&batch.targets),
        get(&batch.targets_segmentation),
    );
    let mut found = Vec::new();
    for r in 0..ids.len() {
        let mut current: Vec<i32> = Vec::new();
        for t in 0..SEQ {
            // Targets: the next input; the last target is padding; BOS and padding targets do not count.
            let (next_id, next_seg) = if t + 1 < SEQ { (ids[r][t + 1], segs[r][t + 1]) } else { (0, 0) };
            assert_eq!(tgt[r][t], next_id);
            let counted = next_seg != 0 && next_id != 0 && next_id != 1;
            assert_eq!(tseg[r][t], if counted { next_seg } else { 0 }, "row {r} t {t}");
            if segs[r][t] == 0 {
                assert_eq!((ids[r][t], pos[r][t]), (0, 0), "padding");
                continue;
            }
            let starts = t == 0 || segs[r][t] != segs[r][t - 1];
            if starts {
                assert_eq!(segs[r][t], if t == 0 { 1 } else { segs[r][t - 1] + 1 }, "segments count up");
                assert_eq!((ids[r][t], pos[r][t]), (1, 0), "a document starts with BOS at position 0");
                if !current.is_empty() {
                    found.push(std::mem::take(&mut current));
                }
            } else {
                assert_eq!(pos[r][t], pos[r][t - 1] + 1);
            }
            current.push(ids[r][t]);
        }
        if !current.is_empty() {
            found.push(current);
        }
    }
    found
        .iter()
        .map(|ids| {
            let text = tok.decode(ids).unwrap();
            text.strip_prefix("doc ")
                .and_then(|s| s.split(' ').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("{text:?}"))
        })
        .collect()
}

fn one_epoch(c: &Config, processes: usize, packing: bool) -> Vec<Vec<Batch>> {
    (0..processes)
        .map(|p| {
            let share = ProcessShare { index: p, count: processes };
            let mut spec = data::text_spec(c, Split::Train, data::load_tokenizer(c).unwrap(), share).unwrap();
            spec.repeat = false;
            let packing = if packing { Packing::On { max_segments: None } } else { Packing::Off };
            let mut it = TextBatches::start(spec, TextState::default(), ROWS, SEQ, packing).unwrap();
            std::iter::from_fn(|| it.next_batch().unwrap()).collect()
        })
        .collect()
}

#[test]
fn every_document_once_per_epoch_for_any_process_count() {
    let dir = tempfile::tempdir().unwrap();
    let n = corpus(dir.path());
    let tok = tokenizer();
    let c = cfg(dir.path(), &[]);
    let mut orders = Vec::new();
    // 1-4 processes share out the 4 files; 5 and 6 share the rows of each file.
    for processes in [1, 2, 3, 5, 6] {
        let mut all: Vec<usize> = Vec::new();
        for batches in one_epoch(&c, processes, true) {
            for b in &batches {
                all.extend(documents(b, &tok));
            }
        }
        if processes == 1 {
            orders.push(all.clone());
        }
        all.sort();
        assert_eq!(all, (0..n).collect::<Vec<_>>(), "{processes} processes");
    }
    assert_ne!(orders[0], (0..n).collect::<Vec<_>>(), "files and windows are shuffled");
    // Without packing: one document per row.
    let unpacked: Vec<usize> = one_epoch(&c, 1, false)[0].iter().flat_map(|b| documents(b, &tok)).collect();
    assert_eq!(unpacked.len().div_ceil(ROWS), one_epoch(&c, 1, false)[0].len());
    let packed_batches = one_epoch(&c, 1, true)[0].len();
    assert!(packed_batches * 2 < unpacked.len().div_ceil(ROWS), "packing fills rows: {packed_batches} batches");
}

fn train_stream(c: &Config, resume: Option<DataState>) -> BatchIterator {
    data::open_train(c, ROWS, ProcessShare::SINGLE, resume).unwrap()
}

#[test]
fn the_stream_is_deterministic_repeats_epochs_and_resumes_from_its_state() {
    let dir = tempfile::tempdir().unwrap();
    corpus(dir.path());
    let c = cfg(dir.path(), &[]);
    let mut a = train_stream(&c, None);
    let mut first: Vec<(Batch, DataState)> = Vec::new();
    // Enough batches to cross into the third epoch.
    while !matches!(first.last(), Some((_, DataState::Hf(s))) if s.epoch == 2) {
        let batch = a.next_batch().unwrap().unwrap();
        first.push((batch, a.state()));
    }
    let mut b = train_stream(&c, None);
    for (batch, _) in first.iter().take(5) {
        assert_eq!(&b.next_batch().unwrap().unwrap(), batch, "same seed, same batches");
    }
    let per_epoch: BTreeMap<u64, usize> = first.iter().fold(BTreeMap::new(), |mut m, (_, s)| {
        let DataState::Hf(s) = s else { unreachable!() };
        *m.entry(s.epoch).or_default() += 1;
        m
    });
    assert!(per_epoch[&0] > 3 && per_epoch[&1] > 3, "{per_epoch:?}");
    // Resume after every batch, including across the epoch boundary: the rest is the same.
    for k in [1, 3, per_epoch[&0] - 1, per_epoch[&0], per_epoch[&0] + 2] {
        let (_, state) = &first[k - 1];
        let state_json = serde_json::to_string(state).unwrap();
        let restored: DataState = serde_json::from_str(&state_json).unwrap();
        let mut resumed = train_stream(&c, Some(restored));
        for (i, (batch, _)) in first[k..k + 3].iter().enumerate() {
            assert_eq!(
                &resumed.next_batch().unwrap().unwrap(),
                batch,
                "resumed after batch {k} (+{i}), state {state_json}"
            );
        }
    }
    let other = cfg(dir.path(), &["data_shuffle_seed=12"]);
    assert_ne!(train_stream(&other, None).next_batch().unwrap().unwrap(), first[0].0);
}

#[test]
fn undecodable_rows_are_counted_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = b"{\"text\": \"doc 0 thou art\"}\nnot json at all\n{\"text\": null}\n".to_vec();
    bytes.extend_from_slice(b"{\"text\": \"doc 1 \xff\xfe broken utf8\"}\n\n{\"text\": \"doc 2 more lovely\"}\n");
    std::fs::write(dir.path().join("x.jsonl"), bytes).unwrap();
    let c = cfg(dir.path(), &["enable_data_shuffling=false"]);
    let mut it = train_stream(&c, None);
    let batch = it.next_batch().unwrap().unwrap();
    let docs = documents(&batch, &tokenizer());
    assert_eq!(&docs[..2], [0, 2]);
    let (_, undecodable, _) = it.text_stats().unwrap();
    assert!(undecodable >= 3, "{undecodable}");
}

fn open_error(c: &Config) -> String {
    data::open_train(c, ROWS, ProcessShare::SINGLE, None).err().expect("an error").to_string()
}

#[test]
fn bad_inputs_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    corpus(dir.path());
    let d = dir.path().display();
    let e = open_error(&cfg(dir.path(), &[&format!("hf_train_files={d}/*.arrow")]));
    assert!(e.contains("hf_train_files=") && e.contains("matches no file"), "{e}");
    let e = open_error(&cfg(dir.path(), &[&format!("hf_train_files={d}/a.parquet"), "train_data_columns=[content]"]));
    assert!(e.contains("a.parquet") && e.contains("no column `content`") && e.contains("id, text"), "{e}");
    let e = open_error(&cfg(dir.path(), &[&format!("hf_train_files={d}/b.jsonl"), "train_data_columns=[content]"]));
    assert!(e.contains("b.jsonl") && e.contains("no column `content`") && e.contains("meta, text"), "{e}");
    let e = open_error(&cfg(dir.path(), &[&format!("hf_train_files={d}/a.parquet"), "train_data_columns=[id]"]));
    assert!(e.contains("column `id` holds INT64 values"), "{e}");
    std::fs::write(dir.path().join("broken.parquet"), b"PAR1 this is not parquet").unwrap();
    let e = open_error(&cfg(dir.path(), &[&format!("hf_train_files={d}/broken.parquet")]));
    assert!(e.contains("broken.parquet") && e.contains("not a readable Parquet file"), "{e}");
    std::fs::write(dir.path().join("notes.csv"), b"text\nhi\n").unwrap();
    let e = open_error(&cfg(dir.path(), &[&format!("hf_train_files={d}/notes.csv")]));
    assert!(e.contains("notes.csv") && e.contains("unknown file type"), "{e}");
    let e = open_error(&cfg(dir.path(), &["vocab_size=100"]));
    assert!(e.contains("has 512 tokens") && e.contains("vocab_size is 100"), "{e}");
    let e = open_error(&cfg(dir.path(), &["tokenizer_path=/no/such/tokenizer.model"]));
    assert!(e.contains("/no/such/tokenizer.model") && e.contains("no such file"), "{e}");
    // gs:// is read through the storage seam: no bucket there (or no credentials) is one error
    // naming the key and the location (tests/data_gcs.rs reads from an emulator). The emulator
    // first: the process's GCS endpoint is fixed at its first use, and without the emulator
    // that would be "no credentials" for the emulator tests after this one.
    let _ = crate::common::gcs_emulator::start(&[]);
    let e = open_error(&cfg(dir.path(), &["hf_train_files=gs://bucket/*.parquet"]));
    assert!(e.starts_with("hf_train_files: ") && e.contains("gs://bucket/"), "{e}");
    assert!(matches!(
        data::open_train(&cfg(dir.path(), &["hf_train_files="]), ROWS, ProcessShare::SINGLE, None).err().unwrap(),
        DataError::NoFilesKey { key: "hf_train_files" }
    ));
}
