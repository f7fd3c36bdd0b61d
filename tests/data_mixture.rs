//! Weighted mixtures of text datasets (`hf_train_files="glob,weight;glob,weight"`, MaxText's
//! `grain_train_files` syntax mixed as grain's `IterDataset.mix`):
//! - without shuffling the documents come in grain's interleaving (weights 3:1: three of the
//!   first, one of the second, again and again), each component in its own order, and a component
//!   that runs out starts its next epoch while the other goes on;
//! - the stream resumes from its saved position (also through JSON, also shuffled) with the same
//!   batches as the uninterrupted one;
//! - MaxText's mixture file (`grain_train_mixture_config_path`) may change on resume: each
//!   dataset resumes by name;
//! - `maxrs train` trains on a mixture and reports the mixture's position; mixtures it cannot read
//!   are refused naming the keys.

use std::path::Path;

use maxrs::config::{self, Config};
use maxrs::data::{self, Batch, BatchIterator, DataState, ProcessShare, TextTokenizer};
use maxrs::pjrt::cpu_client;
use maxrs::train::run::train;

const SEQ: usize = 16;
const ROWS: usize = 4;

fn tokenizer_path() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/shakespeare-bpe512.model").display().to_string()
}

fn write_jsonl(path: &Path, texts: impl Iterator<Item = String>) {
    let lines: Vec<String> = texts.map(|t| serde_json::json!({ "text": t }).to_string()).collect();
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

/// Component `a`: 40 documents in one file; component `b`: 20 in two files.
fn corpus(dir: &Path) {
    write_jsonl(&dir.join("a.jsonl"), (0..40).map(|i| format!("alpha {i}")));
    write_jsonl(&dir.join("b1.jsonl"), (0..10).map(|i| format!("beta {i}")));
    write_jsonl(&dir.join("b2.jsonl"), (10..20).map(|i| format!("beta {i}")));
}

/// The mixture of [`corpus`] with weights 0.75 and 0.25, `extra` keys after (later ones win).
fn cfg(dir: &Path, extra: &[&str]) -> Config {
    let mixture = format!("hf_train_files={0}/a.jsonl,0.75;{0}/b*.jsonl,0.25", dir.display());
    let tokenizer = format!("tokenizer_path={}", tokenizer_path());
    let length = format!("max_target_length={SEQ}");
    let base = ["dataset_type=hf", &mixture, &tokenizer, &length, "vocab_size=512"];
    let args: Vec<String> = base.iter().chain(extra).map(|s| s.to_string()).collect();
    config::load(None, &args).unwrap()
}

fn stream(c: &Config, resume: Option<DataState>) -> BatchIterator {
    data::open_train(c, ROWS, ProcessShare::SINGLE, resume).unwrap()
}

/// The documents of an unpacked batch (one per row), as text.
fn texts(batch: &Batch, tok: &TextTokenizer) -> Vec<String> {
    let ids = batch.inputs.to_i32();
    let segments = batch.inputs_segmentation.to_i32();
    ids.chunks(SEQ)
        .zip(segments.chunks(SEQ))
        .map(|(row, seg)| {
            let kept: Vec<i32> = row.iter().zip(seg).filter(|(_, &s)| s != 0).map(|(&id, _)| id).collect();
            tok.decode(&kept).unwrap().trim().to_string()
        })
        .collect()
}

/// `n` documents mixed 3 : 1 (two components: the first `k` hold ceil(3k / 4) of the first, so
/// a, a, a, b, repeated), the `i`-th of each component named by `a` and `b`.
fn three_to_one(n: usize, a: impl Fn(usize) -> String, b: impl Fn(usize) -> String) -> Vec<String> {
    (0..n).map(|k| if k % 4 == 3 { b(k / 4) } else { a(k / 4 * 3 + k % 4) }).collect()
}

/// [`corpus`] mixed in file order, one document per row, and the tokenizer to read it back.
fn unshuffled() -> (tempfile::TempDir, Config, TextTokenizer) {
    let dir = tempfile::tempdir().unwrap();
    corpus(dir.path());
    let c = cfg(dir.path(), &["enable_data_shuffling=false", "packing=false"]);
    (dir, c, TextTokenizer::load(&tokenizer_path(), "sentencepiece", true, true).unwrap())
}

#[test]
fn documents_come_in_grains_interleaving_and_components_repeat_their_epochs() {
    let (_dir, c, tok) = unshuffled();
    let mut it = stream(&c, None);
    let got: Vec<String> = (0..25).flat_map(|_| texts(&it.next_batch().unwrap().unwrap(), &tok)).collect();
    // Weights 0.75 / 0.25 are proportions 300 : 100; with two components the first `k` documents
    // hold ceil(3k / 4) of the first: a, a, a, b, repeated. `a` ends its first epoch after 40
    // documents, `b` after 20, and each starts over on its own.
    let want = three_to_one(100, |i| format!("alpha {}", i % 40), |i| format!("beta {}", i % 20));
    assert_eq!(got, want);
    match it.state() {
        DataState::HfMixture(m) => {
            assert_eq!(m.index, 100);
            assert_eq!((m.components[0].epoch, m.components[1].epoch), (1, 1), "{m:?}");
        }
        other => panic!("{other:?}"),
    }
}

/// Each of 2 processes mixes its own share of each component (as MaxText shards each component
/// before mixing): `a`'s one file is shared by rows (process `p` keeps rows `r % 2 == p`), `b`'s
/// two files go one to each process.
#[test]
fn each_process_mixes_its_own_share_of_every_component() {
    let (_dir, c, tok) = unshuffled();
    for p in 0..2 {
        let share = ProcessShare { index: p, count: 2 };
        let mut it = data::open_train(&c, 2 * ROWS, share, None).unwrap();
        let got: Vec<String> = (0..4).flat_map(|_| texts(&it.next_batch().unwrap().unwrap(), &tok)).collect();
        let want = three_to_one(16, |i| format!("alpha {}", 2 * i + p), |i| format!("beta {}", 10 * p + i));
        assert_eq!(got, want, "process {p}");
    }
}

#[test]
fn a_mixture_resumes_from_its_position_with_the_same_batches() {
    let dir = tempfile::tempdir().unwrap();
    corpus(dir.path());
    for extra in [&["packing=false"][..], &["data_shuffle_seed=5"]] {
        let c = cfg(dir.path(), extra);
        let mut a = stream(&c, None);
        let first: Vec<(Batch, DataState)> = (0..30)
            .map(|_| {
                let batch = a.next_batch().unwrap().unwrap();
                (batch, a.state())
            })
            .collect();
        for k in [1, 7, 13, 26] {
            let saved = serde_json::to_string(&first[k - 1].1).unwrap();
            let mut resumed = stream(&c, Some(serde_json::from_str(&saved).unwrap()));
            for (i, (batch, _)) in first[k..k + 3].iter().enumerate() {
                assert_eq!(
                    &resumed.next_batch().unwrap().unwrap(),
                    batch,
                    "{extra:?}: after batch {k} (+{i}), {saved}"
                );
            }
        }
        // A single dataset's position cannot resume a mixture.
        let single = DataState::Hf(Default::default());
        let e = data::open_train(&c, ROWS, ProcessShare::SINGLE, Some(single)).err().unwrap().to_string();
        assert!(e.contains("cannot resume"), "{e}");
    }
}

/// MaxText's mixture file: a resumed run may bring another mixture. Here `a` and `b` (3:1) are
/// resumed with `b`, `c` and `a` (1:1:2, listed out of order: grain sorts the names): `a` and `b`
/// go on where they stood, `c` starts at its beginning, at the saved index of the interleaving.
#[test]
fn a_mixture_file_may_change_on_resume() {
    let dir = tempfile::tempdir().unwrap();
    corpus(dir.path());
    write_jsonl(&dir.path().join("c.jsonl"), (0..30).map(|i| format!("gamma {i}")));
    let tok = TextTokenizer::load(&tokenizer_path(), "sentencepiece", true, true).unwrap();
    let file = |name: &str, json: serde_json::Value| {
        let path = dir.path().join(name);
        std::fs::write(&path, json.to_string()).unwrap();
        let keys = ["hf_train_files=", &format!("grain_train_mixture_config_path={}", path.display())];
        cfg(dir.path(), &[&keys[..], &["enable_data_shuffling=false", "packing=false"]].concat())
    };
    let component = |glob: &str, weight: f64| serde_json::json!({ "path": dir.path().join(glob), "weight": weight });
    let first = file("m1.json", serde_json::json!({ "a": component("a.jsonl", 3.0), "b": component("b*.jsonl", 1.0) }));
    let mut it = stream(&first, None);
    let before: Vec<String> = (0..3).flat_map(|_| texts(&it.next_batch().unwrap().unwrap(), &tok)).collect();
    assert_eq!(before[..4], ["alpha 0", "alpha 1", "alpha 2", "beta 0"]);
    assert_eq!(before[8..], ["alpha 6", "alpha 7", "alpha 8", "beta 2"]);

    let second = file(
        "m2.json",
        serde_json::json!({ "b": component("b*.jsonl", 1.0), "c": component("c.jsonl", 1.0), "a": component("a.jsonl", 2.0) }),
    );
    let mut resumed = stream(&second, Some(it.state()));
    let after: Vec<String> = texts(&resumed.next_batch().unwrap().unwrap(), &tok);
    // Proportions a : b : c = 200 : 100 : 100; documents 12..16 of that interleaving come from
    // a, b, a, c (grain's rule, as `select` computes it; its order is checked against grain's
    // recorded mixes in the unit tests).
    let order: Vec<usize> = (12..16).map(|k| maxrs::data::mixture::select(k, &[200, 100, 100]).0).collect();
    assert_eq!(order, [0, 1, 0, 2]);
    assert_eq!(after, ["alpha 9", "beta 3", "alpha 10", "gamma 0"]);
}

#[test]
fn maxrs_trains_on_a_mixture_and_refuses_mixtures_it_cannot_read() {
    let dir = tempfile::tempdir().unwrap();
    corpus(dir.path());
    let tiny: Vec<&str> =
        crate::common::TINY_DECODER.iter().copied().chain(["per_device_batch_size=4", "steps=2"]).collect();
    let report = train(&cfg(dir.path(), &tiny), &cpu_client(1).unwrap()).expect("trains on the mixture");
    assert_eq!(report.losses.len(), 2);
    let Some(DataState::HfMixture(m)) = &report.data_state else { panic!("{:?}", report.data_state) };
    assert!(m.index >= 8 && m.components.iter().all(|s| s.taken > 0), "both components were read: {m:?}");

    let invalid = |extra: &[&str]| config::validate(&cfg(dir.path(), extra), 1, 1).map(drop).unwrap_err().to_string();
    let e = invalid(&["grain_train_mixture_config_path=m.json"]);
    assert!(e.starts_with("grain_train_mixture_config_path, hf_train_files:") && e.contains("not both"), "{e}");
    let e = invalid(&["grain_train_mixture_config_path=m.json", "dataset_type=synthetic"]);
    assert!(e.starts_with("grain_train_mixture_config_path, dataset_type:"), "{e}");
    let eval = cfg(dir.path(), &["eval_interval=1", "hf_eval_files=a,1;b,1"]);
    let e = data::EvalData::open(&eval, ROWS, ProcessShare::SINGLE).err().unwrap().to_string();
    assert!(e.contains("hf_eval_files=\"a,1;b,1\"") && e.contains("training only"), "{e}");
    let unweighted = cfg(dir.path(), &["hf_train_files=a.jsonl;b.jsonl,1"]);
    let e = data::open_train(&unweighted, ROWS, ProcessShare::SINGLE, None).err().unwrap().to_string();
    assert!(e.starts_with("hf_train_files=\"a.jsonl;b.jsonl,1\": ") && e.contains("has no weight"), "{e}");
}
