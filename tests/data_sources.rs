//! maxrs's synthetic progressions (`synthetic_progression`) and the token-file source:
//! reproducible, predictable, sharded by process, shuffled by epoch with every row once per
//! epoch, resumable from their state; and each error.

use std::path::PathBuf;

use maxrs::config::{self, Config};
use maxrs::data::{
    self, host_rows, write_tokens_file, BatchIterator, DataError, DataState, ProcessShare, Progression, TokensFile,
};
use maxrs::host::{DType, HostTensor};

fn cfg(overrides: &[&str]) -> Config {
    let args: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    config::load(None, &args).unwrap()
}

fn rows_of(t: &HostTensor) -> Vec<Vec<i32>> {
    let s = t.dims[1] as usize;
    t.to_i32().chunks(s).map(|c| c.to_vec()).collect()
}

fn share(index: usize, count: usize) -> ProcessShare {
    ProcessShare { index, count }
}

fn next(it: &mut BatchIterator) -> data::Batch {
    it.next_batch().unwrap().unwrap()
}

/// maxrs's synthetic progressions (MaxText's synthetic batch: tests/data_synthetic.rs).
fn synthetic(seed: i64, vocab: i64, seq: i64) -> Config {
    cfg(&[
        "synthetic_progression=true",
        &format!("data_shuffle_seed={seed}"),
        &format!("vocab_size={vocab}"),
        &format!("max_target_length={seq}"),
    ])
}

#[test]
fn synthetic_is_reproducible_and_varies_by_step_and_seed() {
    let c = synthetic(7, 100, 16);
    let mut a = data::open_train(&c, 4, ProcessShare::SINGLE, None).unwrap();
    let mut b = data::open_train(&c, 4, ProcessShare::SINGLE, None).unwrap();
    let (a0, b0) = (next(&mut a), next(&mut b));
    assert_eq!(a0, b0);
    let a1 = next(&mut a);
    let mut other_seed = data::open_train(&synthetic(8, 100, 16), 4, ProcessShare::SINGLE, None).unwrap();
    assert_ne!(a0.inputs, a1.inputs);
    assert_ne!(a0.inputs, next(&mut other_seed).inputs);
    for (name, t) in a0.named() {
        assert_eq!((t.ty, t.dims.as_slice()), (DType::S32, &[4i64, 16][..]), "{name}");
    }
    assert_eq!(rows_of(&a0.inputs_position)[2], (0..16).collect::<Vec<i32>>());
    assert!(a0.inputs_segmentation.to_i32().iter().chain(&a0.targets_segmentation.to_i32()).all(|&v| v == 1));
    assert_eq!(a0.total_weights(), 64);
    // The state resumes the stream: a stream opened at step 1 gives step 1's batch.
    assert_eq!(a.state(), DataState::Synthetic { step: 2 });
    let mut resumed = data::open_train(&c, 4, ProcessShare::SINGLE, Some(DataState::Synthetic { step: 1 })).unwrap();
    assert_eq!(next(&mut resumed), a1);
}

#[test]
fn synthetic_next_token_is_determined_by_the_previous_two() {
    let vocab = 37;
    let source = Progression::new(1, vocab, 64).unwrap();
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
    let batch = next(&mut data::open_train(&synthetic(1, 37, 64), 2, ProcessShare::SINGLE, None).unwrap());
    for (inputs, targets) in rows_of(&batch.inputs).iter().zip(rows_of(&batch.targets)) {
        assert_eq!(inputs[1..], targets[..63]);
    }
    assert_eq!(Progression::new(0, 2, 4).unwrap().row(0, 0).windows(2).filter(|w| w[0] == w[1]).count(), 0);
}

#[test]
fn hosts_feed_disjoint_blocks_that_make_up_the_global_batch() {
    assert_eq!(host_rows(8, 0, 2).unwrap(), 0..4);
    assert_eq!(host_rows(8, 1, 2).unwrap(), 4..8);
    assert!(matches!(host_rows(6, 0, 4), Err(DataError::UnevenHosts { global_batch: 6, process_count: 4 })));
    assert!(matches!(host_rows(8, 2, 2), Err(DataError::BadProcessIndex { .. })));
    let c = synthetic(3, 50, 8);
    let mut whole = data::open_train(&c, 8, ProcessShare::SINGLE, None).unwrap();
    next(&mut whole);
    let whole = rows_of(&next(&mut whole).inputs);
    let mut parts = Vec::new();
    for host in 0..4 {
        let mut it = data::open_train(&c, 8, share(host, 4), None).unwrap();
        next(&mut it);
        parts.extend(rows_of(&next(&mut it).inputs));
    }
    assert_eq!(parts, whole);
}

fn file_rows(n: i32, len: usize) -> Vec<Vec<i32>> {
    (0..n).map(|r| (0..len as i32).map(|t| r * 10 + t).collect()).collect()
}

fn tokens_config(path: &std::path::Path, shuffle: bool) -> Config {
    cfg(&[
        "dataset_type=tokens",
        &format!("dataset_path={}", path.display()),
        "max_target_length=3",
        "vocab_size=1000",
        &format!("enable_data_shuffling={shuffle}"),
        "data_shuffle_seed=5",
    ])
}

#[test]
fn tokens_file_in_file_order_wraps_around() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.bin");
    let rows = file_rows(5, 4);
    write_tokens_file(&path, &rows).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 5 * 4 * 4);
    let file = TokensFile::open(&path, 3, 100).unwrap();
    assert_eq!((file.num_rows(), file.row(4).unwrap()), (5, rows[4].clone()));

    let mut it = data::open_train(&tokens_config(&path, false), 2, ProcessShare::SINGLE, None).unwrap();
    let b0 = next(&mut it);
    assert_eq!(rows_of(&b0.inputs), [vec![0, 1, 2], vec![10, 11, 12]]);
    assert_eq!(rows_of(&b0.targets), [vec![1, 2, 3], vec![11, 12, 13]]);
    assert_eq!(rows_of(&next(&mut it).inputs), [vec![20, 21, 22], vec![30, 31, 32]]);
    assert_eq!(rows_of(&next(&mut it).inputs), [vec![40, 41, 42], vec![0, 1, 2]]);
    assert_eq!(it.state(), DataState::Tokens { position: 6 });
    let mut h1 = data::open_train(&tokens_config(&path, false), 2, share(1, 2), None).unwrap();
    next(&mut h1);
    assert_eq!(rows_of(&next(&mut h1).inputs), [vec![30, 31, 32]]);
}

/// Every row exactly once per epoch, a new order each epoch, for 1, 2 and 4 processes.
#[test]
fn shuffled_tokens_visit_every_row_once_per_epoch_on_any_process_count() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.bin");
    let n = 48;
    write_tokens_file(&path, &file_rows(n, 4)).unwrap();
    let c = tokens_config(&path, true);
    let epoch_orders = |processes: usize| -> Vec<Vec<i32>> {
        let mut its: Vec<_> =
            (0..processes).map(|p| data::open_train(&c, 8, share(p, processes), None).unwrap()).collect();
        let mut stream = Vec::new();
        for _ in 0..(2 * n as usize / 8) {
            for it in &mut its {
                stream.extend(rows_of(&next(it).inputs).into_iter().map(|r| r[0] / 10));
            }
        }
        stream.chunks(n as usize).map(|c| c.to_vec()).collect()
    };
    let one = epoch_orders(1);
    for epoch in &one {
        let mut sorted = epoch.clone();
        sorted.sort();
        assert_eq!(sorted, (0..n).collect::<Vec<_>>());
    }
    assert_ne!(one[0], one[1], "each epoch has its own order");
    assert_ne!(one[0], (0..n).collect::<Vec<_>>(), "shuffled");
    assert_eq!(epoch_orders(2), one);
    assert_eq!(epoch_orders(4), one);
    // Resuming from a state continues the same stream.
    let mut it = data::open_train(&c, 8, ProcessShare::SINGLE, None).unwrap();
    let batches: Vec<_> = (0..7).map(|_| next(&mut it)).collect();
    let mut resumed = data::open_train(&c, 8, ProcessShare::SINGLE, Some(DataState::Tokens { position: 32 })).unwrap();
    assert_eq!(next(&mut resumed), batches[4]);
}

#[test]
fn tokens_file_errors_name_the_culprit() {
    let dir = tempfile::tempdir().unwrap();
    let open =
        |path: PathBuf| data::open_train(&tokens_config(&path, false), 1, ProcessShare::SINGLE, None).err().unwrap();
    let e = open(dir.path().join("missing.bin"));
    assert!(matches!(e, DataError::Input(_)) && e.to_string().contains("missing.bin"), "{e}");

    let ragged = dir.path().join("ragged.bin");
    std::fs::write(&ragged, vec![0u8; 4 * 4 + 4]).unwrap();
    let m = open(ragged).to_string();
    assert!(m.contains("size 20 bytes") && m.contains("row size 16 bytes") && m.contains("max_target_length 3"), "{m}");
    let empty = dir.path().join("empty.bin");
    std::fs::write(&empty, b"").unwrap();
    assert!(matches!(open(empty), DataError::EmptyFile { .. }));
    // The emulator answers, so the error is the missing bucket's, not a refused connection's.
    let _ = crate::common::gcs_emulator::start(&[]);
    let e = data::open_train(
        &cfg(&["dataset_type=tokens", "dataset_path=gs://bucket/t.bin"]),
        1,
        ProcessShare::SINGLE,
        None,
    )
    .err()
    .unwrap();
    // Read in ranges through the storage seam (tests/data_gcs.rs): here no such bucket.
    assert!(e.to_string().starts_with("dataset_path: ") && e.to_string().contains("gs://bucket/t.bin"), "{e}");

    let bad = dir.path().join("bad.bin");
    let mut rows = file_rows(3, 4);
    rows[2][1] = 1000;
    write_tokens_file(&bad, &rows).unwrap();
    let mut it = data::open_train(&tokens_config(&bad, false), 1, ProcessShare::SINGLE, None).unwrap();
    next(&mut it);
    next(&mut it);
    let e = it.next_batch().unwrap_err();
    assert!(matches!(e, DataError::TokenOutOfRange { row: 2, position: 1, value: 1000, vocab: 1000, .. }), "{e}");
    assert!(e.to_string().contains("row 2, position 1: token id 1000 is outside [0, 1000)"));

    let e = write_tokens_file(&dir.path().join("uneven.bin"), &[vec![1, 2], vec![3]]).unwrap_err();
    assert!(e.to_string().contains("row 1 has 1 ids, row 0 has 2"), "{e}");
    assert!(matches!(Progression::new(0, 1, 4).unwrap_err(), DataError::VocabTooSmall(1)));
    // A resume state of another dataset type is refused.
    let e = data::open_train(&synthetic(0, 10, 4), 1, ProcessShare::SINGLE, Some(DataState::Tokens { position: 3 }))
        .err()
        .unwrap();
    assert!(e.to_string().contains("cannot resume dataset_type=synthetic"), "{e}");
}

#[test]
fn data_keys_are_validated_with_maxtext_names() {
    let invalid = |args: &[&str]| -> String {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        match config::load(None, &args) {
            Err(e) => e.to_string(),
            Ok(c) => config::validate(&c, 1, 1).unwrap_err().to_string(),
        }
    };
    let e = invalid(&["dataset_type=hf", "tokenizer_path=t.model"]);
    assert!(e.contains("hf_train_files") && e.contains("empty"), "{e}");
    let e = invalid(&["dataset_type=hf", "hf_train_files=a.parquet"]);
    assert!(e.contains("tokenizer_path") && e.contains("empty"), "{e}");
    let e = invalid(&["tokenizer_type=tiktoken"]);
    assert!(e.contains("tiktoken is not supported yet"), "{e}");
    let e = invalid(&["eval_interval=10"]);
    assert!(e.contains("hf_eval_files") && e.contains("eval_interval=10"), "{e}");
    let e = invalid(&["dataset_type=hf", "hf_train_files=a.parquet", "tokenizer_path=t", "train_data_columns=[a, b]"]);
    assert!(e.contains("train_data_columns") && e.contains("exactly one"), "{e}");
    let e = invalid(&["dataset_type=tfds"]);
    assert!(e.starts_with("dataset_type: tfds is not supported yet") && e.contains("use synthetic, tokens"), "{e}");
    let e = invalid(&["dataset_type=c4"]);
    assert!(e.contains("synthetic, tokens, hf, tfds, grain"), "{e}");
    for key in ["eval_split=test", "tokenize_train_data=false", "grain_train_files=x", "num_epoch=2"] {
        let e = invalid(&[key]);
        assert!(e.contains("is MaxText's, but not supported yet"), "{key}: {e}");
    }
    let e = invalid(&["per_device_batch_size=2", "eval_per_device_batch_size=0.5", "cpu_device_count=1"]);
    assert!(e.contains("eval_per_device_batch_size"), "{e}");
    let c = config::load(None, &["eval_per_device_batch_size=3".to_string()]).unwrap();
    assert_eq!(config::validate(&c, 1, 1).unwrap().eval_batch_size, 3);
}
