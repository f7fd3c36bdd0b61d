//! Synthetic data: reproducible, predictable, host-sliceable. Token files: round trip,
//! file order, wrap-around, and each error.

use std::path::{Path, PathBuf};

use maxrs::pjrt::ElementType;
use maxrs::train::data::{host_rows, write_tokens_file, BatchLoader, DataError, DataSource, Synthetic, TokensFile};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("maxrs-train-data-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn rows_of(t: &maxrs::pjrt::HostTensor) -> Vec<Vec<i32>> {
    let s = t.dims[1] as usize;
    t.to_i32().chunks(s).map(|c| c.to_vec()).collect()
}

fn loader(source: DataSource, global_batch: usize) -> BatchLoader {
    BatchLoader::new(source, global_batch, 0, 1).unwrap()
}

#[test]
fn synthetic_is_reproducible_and_varies_by_step_and_seed() {
    let a = loader(DataSource::open("synthetic", None, 7, 16, 100).unwrap(), 4).batch(3).unwrap();
    let b = loader(DataSource::open("synthetic", None, 7, 16, 100).unwrap(), 4).batch(3).unwrap();
    assert_eq!(a, b);
    let other_step = loader(DataSource::open("synthetic", None, 7, 16, 100).unwrap(), 4).batch(4).unwrap();
    let other_seed = loader(DataSource::open("synthetic", None, 8, 16, 100).unwrap(), 4).batch(3).unwrap();
    assert_ne!(a.inputs, other_step.inputs);
    assert_ne!(a.inputs, other_seed.inputs);

    for (name, t) in a.named() {
        assert_eq!((t.ty, t.dims.as_slice()), (ElementType::S32, &[4i64, 16][..]), "{name}");
    }
    assert_eq!(rows_of(&a.inputs_position)[2], (0..16).collect::<Vec<i32>>());
    assert!(a.inputs_segmentation.to_i32().iter().chain(&a.targets_segmentation.to_i32()).all(|&v| v == 1));
    assert_eq!(a.total_weights(), 64);
}

#[test]
fn synthetic_next_token_is_determined_by_the_previous_two() {
    let vocab = 37;
    let source = Synthetic::new(1, vocab, 64).unwrap();
    let mut strides = std::collections::BTreeSet::new();
    for step in 0..5 {
        for row in 0..16 {
            let ids = source.row(step, row);
            assert_eq!(ids.len(), 65);
            assert!(ids.iter().all(|&t| (0..vocab as i32).contains(&t)));
            for t in 2..ids.len() {
                assert_eq!(
                    ids[t],
                    (2 * ids[t - 1] - ids[t - 2]).rem_euclid(vocab as i32),
                    "step {step} row {row} t {t}"
                );
            }
            let stride = (ids[1] - ids[0]).rem_euclid(vocab as i32);
            assert!((1..=8).contains(&stride), "stride {stride}");
            strides.insert(stride);
        }
    }
    assert!(strides.len() > 4, "strides vary: {strides:?}");

    // Targets are the inputs shifted by one.
    let batch = loader(DataSource::Synthetic(source), 2).batch(0).unwrap();
    for (inputs, targets) in rows_of(&batch.inputs).iter().zip(rows_of(&batch.targets)) {
        assert_eq!(inputs[1..], targets[..63]);
    }
    // A two-token vocabulary still works (stride 1: alternating tokens).
    assert_eq!(Synthetic::new(0, 2, 4).unwrap().row(0, 0).windows(2).filter(|w| w[0] == w[1]).count(), 0);
}

#[test]
fn hosts_feed_disjoint_blocks_that_make_up_the_global_batch() {
    assert_eq!(host_rows(8, 0, 2).unwrap(), 0..4);
    assert_eq!(host_rows(8, 1, 2).unwrap(), 4..8);
    assert!(matches!(host_rows(6, 0, 4), Err(DataError::UnevenHosts { global_batch: 6, process_count: 4 })));
    assert!(matches!(host_rows(8, 2, 2), Err(DataError::BadProcessIndex { .. })));

    let whole = loader(DataSource::open("synthetic", None, 3, 8, 50).unwrap(), 8).batch(5).unwrap();
    let mut parts = Vec::new();
    for host in 0..4 {
        let mut l = BatchLoader::new(DataSource::open("synthetic", None, 3, 8, 50).unwrap(), 8, host, 4).unwrap();
        assert_eq!(l.rows(), host * 2..host * 2 + 2);
        parts.extend(rows_of(&l.batch(5).unwrap().inputs));
    }
    assert_eq!(parts, rows_of(&whole.inputs));
}

fn file_rows(n: i32, len: usize) -> Vec<Vec<i32>> {
    (0..n).map(|r| (0..len as i32).map(|t| r * 10 + t).collect()).collect()
}

#[test]
fn tokens_file_round_trip_in_file_order_with_wrap_around() {
    let dir = temp_dir("order");
    let path = dir.join("tokens.bin");
    let rows = file_rows(5, 4); // max_target_length 3
    write_tokens_file(&path, &rows).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 5 * 4 * 4);
    let mut file = TokensFile::open(&path, 3, 100).unwrap();
    assert_eq!(file.num_rows(), 5);
    assert_eq!(file.row(4).unwrap(), rows[4]);

    let mut l = loader(DataSource::open("tokens", Some(&path), 0, 3, 100).unwrap(), 2);
    let b0 = l.batch(0).unwrap();
    assert_eq!(rows_of(&b0.inputs), [vec![0, 1, 2], vec![10, 11, 12]]);
    assert_eq!(rows_of(&b0.targets), [vec![1, 2, 3], vec![11, 12, 13]]);
    assert_eq!(rows_of(&l.batch(1).unwrap().inputs), [vec![20, 21, 22], vec![30, 31, 32]]);
    // Step 2 uses rows 4 and 5 = row 0 again; step 3 rows 6, 7 = 1, 2.
    assert_eq!(rows_of(&l.batch(2).unwrap().inputs), [vec![40, 41, 42], vec![0, 1, 2]]);
    assert_eq!(rows_of(&l.batch(3).unwrap().inputs), [vec![10, 11, 12], vec![20, 21, 22]]);

    // Two hosts read their halves of the same global rows.
    let mut h1 = BatchLoader::new(DataSource::open("tokens", Some(&path), 0, 3, 100).unwrap(), 2, 1, 2).unwrap();
    assert_eq!(rows_of(&h1.batch(1).unwrap().inputs), [vec![30, 31, 32]]);
    std::fs::remove_dir_all(&dir).unwrap();
}

fn message(e: DataError) -> String {
    e.to_string()
}

#[test]
fn tokens_file_errors_name_the_culprit() {
    let dir = temp_dir("errors");
    let missing = dir.join("missing.bin");
    let e = DataSource::open("tokens", Some(&missing), 0, 3, 100).unwrap_err();
    assert!(matches!(e, DataError::Io { .. }));
    assert!(message(e).contains("missing.bin"));

    let e = DataSource::open("tokens", None, 0, 3, 100).unwrap_err();
    assert!(matches!(e, DataError::MissingPath), "{e}");
    let e = DataSource::open("tokens", Some(Path::new("")), 0, 3, 100).unwrap_err();
    assert!(matches!(e, DataError::MissingPath), "{e}");
    let e = DataSource::open("c4", None, 0, 3, 100).unwrap_err();
    assert_eq!(message(e), "dataset_type=c4: expected `synthetic` or `tokens`");

    let ragged = dir.join("ragged.bin");
    std::fs::write(&ragged, vec![0u8; 4 * 4 + 4]).unwrap();
    let m = message(TokensFile::open(&ragged, 3, 100).unwrap_err());
    assert!(m.contains("size 20 bytes") && m.contains("row size 16 bytes") && m.contains("max_target_length 3"), "{m}");

    let empty = dir.join("empty.bin");
    std::fs::write(&empty, b"").unwrap();
    assert!(matches!(TokensFile::open(&empty, 3, 100).unwrap_err(), DataError::EmptyFile { .. }));

    let bad = dir.join("bad.bin");
    let mut rows = file_rows(3, 4);
    rows[2][1] = 100;
    write_tokens_file(&bad, &rows).unwrap();
    let mut l = loader(DataSource::open("tokens", Some(&bad), 0, 3, 100).unwrap(), 1);
    l.batch(1).unwrap();
    let e = l.batch(2).unwrap_err();
    assert!(matches!(e, DataError::TokenOutOfRange { row: 2, position: 1, value: 100, vocab: 100, .. }), "{e}");
    assert!(message(e).contains("row 2, position 1: token id 100 is outside [0, 100)"));
    rows[2][1] = -1;
    write_tokens_file(&bad, &rows).unwrap();
    let e = TokensFile::open(&bad, 3, 100).unwrap().row(2).unwrap_err();
    assert!(matches!(e, DataError::TokenOutOfRange { value: -1, .. }), "{e}");

    let e = write_tokens_file(&dir.join("uneven.bin"), &[vec![1, 2], vec![3]]).unwrap_err();
    assert!(e.to_string().contains("row 1 has 1 ids, row 0 has 2"), "{e}");
    assert!(matches!(Synthetic::new(0, 1, 4).unwrap_err(), DataError::VocabTooSmall(1)));
    std::fs::remove_dir_all(&dir).unwrap();
}
