//! The bad inputs of issue 25 (reading side): every file maxrs reads is refused when it is not a
//! regular file (a FIFO, a device, a directory, a symlink loop) and bounded where it is read
//! whole; data that can never fill a batch fails in seconds naming the file; a huge document
//! costs what the run keeps of it; a checkpoint index cannot name files outside its folder; and
//! a Hugging Face config is checked field by field. A case that used to hang runs the binary
//! under a deadline, so it fails instead of hanging the suite.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use maxrs::config;
use maxrs::data::{self, DataError, ProcessShare, TextTokenizer};
use maxrs::model::hf::config_from_hf;

use crate::common::cli::{maxrs, refused};

fn test_data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

fn tokenizer_arg() -> String {
    format!("tokenizer_path={}", test_data("shakespeare-bpe512.model").display())
}

fn mkfifo(path: &Path) {
    assert!(Command::new("mkfifo").arg(path).status().unwrap().success());
}

fn arg(key: &str, path: &Path) -> String {
    format!("{key}={}", path.display())
}

#[test]
fn hf_files_that_can_never_fill_a_batch_fail_in_seconds_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let train = |file: &Path| {
        refused(&["train", "dataset_type=hf", &arg("hf_train_files", file), &tokenizer_arg(), "steps=2"], &[])
    };
    let invalid = dir.path().join("invalid.jsonl");
    std::fs::write(&invalid, "not json\n{\"text\": \"unterminated\n").unwrap();
    assert_eq!(
        train(&invalid),
        format!(
            "error: no valid JSON line with a `text` field in {:?}: line 1: expected ident at line 1 column 2",
            invalid
        )
    );
    // A pretty-printed JSON array is one JSON document, not JSON Lines.
    let array = dir.path().join("array.json");
    std::fs::write(&array, "[\n  {\"text\": \"one\"},\n  {\"text\": \"two\"}\n]\n").unwrap();
    let e = train(&array);
    assert!(
        e.contains(&format!("{array:?} holds a JSON array, not JSON Lines")) && e.contains("one JSON object per line"),
        "{e}"
    );
    let nulls = dir.path().join("nulls.jsonl");
    std::fs::write(&nulls, "{\"text\": null}\n\n[1]\n").unwrap();
    let e = train(&nulls);
    assert!(e.ends_with(&format!("field in {nulls:?}: line 1: `text` is null")), "{e}");
    let blank = dir.path().join("blank.jsonl");
    std::fs::write(&blank, "\n  \n").unwrap();
    assert_eq!(train(&blank), format!("error: {blank:?} is empty: it has no JSON lines"));
    let latin1 = dir.path().join("latin1.txt");
    std::fs::write(&latin1, b"caf\xe9\n\nna\xefve\n").unwrap();
    let e = train(&latin1);
    assert!(e.ends_with(&format!("no paragraph of UTF-8 text in {latin1:?}: paragraph 1: not UTF-8 (byte 3)")), "{e}");
    // One good row anywhere (here in the second file) is enough: undecodable rows are skipped.
    std::fs::write(dir.path().join("z.jsonl"), "{\"text\": \"To be, or not to be\"}\n").unwrap();
    let both = format!("hf_train_files={}/[iz]*.jsonl", dir.path().display());
    let c = config::load(None, &["dataset_type=hf".to_string(), both, tokenizer_arg()]).unwrap();
    assert!(data::open_train(&c, 8, ProcessShare::SINGLE, None).is_ok());
}

#[test]
fn rows_that_tokenize_to_nothing_end_the_stream_with_an_error_instead_of_spinning() {
    let dir = tempfile::tempdir().unwrap();
    let empty_texts = dir.path().join("empty-texts.jsonl");
    std::fs::write(&empty_texts, "{\"text\": \"\"}\nnot json\n{\"text\": \"\"}\n").unwrap();
    let args = ["dataset_type=hf".to_string(), arg("hf_train_files", &empty_texts), tokenizer_arg()];
    let c = config::load(None, &[&args[..], &["add_bos=false".into(), "add_eos=false".into()]].concat()).unwrap();
    let mut batches = data::open_train(&c, 8, ProcessShare::SINGLE, None).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(batches.next_batch().map(|b| b.is_some()));
    });
    let result = rx.recv_timeout(Duration::from_secs(30)).expect("the stream must end within seconds");
    let e = result.expect_err("no batch can be filled");
    assert!(matches!(e, DataError::NoDocuments { epoch: 1, rows: 3, undecodable: 1, .. }), "{e:?}");
    assert!(e.to_string().contains("3 rows and none of them a document with tokens (1 could not be decoded"), "{e}");
}

#[test]
fn fifos_devices_and_folders_are_refused_by_what_they_are_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    mkfifo(&fifo);
    let f = fifo.to_str().unwrap();
    let is_fifo = "is a FIFO (named pipe), not a regular file: maxrs reads a regular file there";

    // The config file: a FIFO used to block forever, /dev/zero to grow without end.
    assert_eq!(refused(&["train", f], &[]), format!("error: config file {fifo:?} {is_fifo}"));
    assert_eq!(
        refused(&["train", "/dev/zero"], &[]),
        "error: config file \"/dev/zero\" is a device, not a regular file: maxrs reads a regular file there"
    );
    let e = refused(&["train", dir.path().to_str().unwrap()], &[]);
    assert!(e.contains("config file") && e.contains("is a directory, not a regular file"), "{e}");
    // A config file past the limit is refused unread (a sparse file: no 64 MiB written).
    let big = dir.path().join("big.yml");
    std::fs::File::create(&big).unwrap().set_len((64 << 20) + 1).unwrap();
    assert_eq!(
        refused(&["train", big.to_str().unwrap()], &[]),
        format!(
            "error: config file {big:?} is 67108865 bytes, more than the 64 MiB maxrs reads for a config, flags, \
             index or manifest file"
        )
    );

    // The tokenizer, as a file and inside a folder with tokenizer_type=huggingface.
    let hf = ["train", "dataset_type=hf", "hf_train_files=x.jsonl"];
    let e = refused(&[&hf[..], &[&format!("tokenizer_path={f}")]].concat(), &[]);
    assert_eq!(e, format!("error: tokenizer_path={fifo:?} {is_fifo}"));
    let folder = dir.path().join("tok");
    std::fs::create_dir(&folder).unwrap();
    mkfifo(&folder.join("tokenizer.json"));
    let e = refused(&[&hf[..], &[&arg("tokenizer_path", &folder), "tokenizer_type=huggingface"]].concat(), &[]);
    assert!(e.contains("tok/tokenizer.json\" is a FIFO"), "{e}");
    std::fs::remove_file(folder.join("tokenizer.json")).unwrap();
    std::fs::copy(test_data("shakespeare-bytelevel512/tokenizer.json"), folder.join("tokenizer.json")).unwrap();
    mkfifo(&folder.join("tokenizer_config.json"));
    let e = refused(&[&hf[..], &[&arg("tokenizer_path", &folder), "tokenizer_type=huggingface"]].concat(), &[]);
    assert!(e.contains("tok/tokenizer_config.json\" is a FIFO"), "{e}");

    // XLA flags: the config key and the environment variable.
    let e = refused(&["train", &format!("xla_flags_file={f}")], &[]);
    assert_eq!(e, format!("error: xla_flags_file={fifo:?} {is_fifo}"));
    let e = refused(&["train"], &[("XLA_FLAGS", f)]);
    assert!(
        e.starts_with(&format!("error: XLA_FLAGS={fifo:?} is a FIFO")) && e.contains("names a file of flags"),
        "{e}"
    );
}

#[test]
fn data_inputs_say_what_they_are_instead_of_matching_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo.jsonl");
    mkfifo(&fifo);
    let looped = dir.path().join("loop.jsonl");
    std::os::unix::fs::symlink(&looped, &looped).unwrap();
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let hf = |key: &str, value: &Path| refused(&["train", "dataset_type=hf", &arg(key, value), &tokenizer_arg()], &[]);
    let is_fifo = "is a FIFO (named pipe), not a regular file";
    assert_eq!(
        hf("hf_train_files", &fifo),
        format!("error: hf_train_files={fifo:?} {is_fifo}: maxrs reads a regular file there")
    );
    assert_eq!(
        hf("hf_train_files", &looped),
        format!("error: hf_train_files={looped:?} is a symlink loop (following its links comes back to it); point it at a file")
    );
    assert_eq!(
        hf("hf_train_files", &sub),
        format!("error: hf_train_files={sub:?} is a directory: give FILES or a glob like {}/*.jsonl", sub.display())
    );
    assert_eq!(
        hf("hf_train_files", Path::new("/dev/zero")),
        "error: hf_train_files=\"/dev/zero\" is a device, not a regular file: maxrs reads a regular file there"
    );
    // A glob that matches a FIFO names it; one that matches only folders says so.
    let glob = dir.path().join("*.jsonl");
    let e = hf("hf_train_files", &glob);
    assert!(e.starts_with(&format!("error: hf_train_files={:?} matches ", glob.display().to_string())), "{e}");
    assert!(e.contains(is_fifo) || e.contains("symlink loop"), "{e}");
    let e = hf("hf_train_files", &dir.path().join("s*"));
    assert!(e.contains("matches only directories") && e.contains(&format!("{}/*.jsonl", sub.display())), "{e}");
    let args = ["dataset_type=hf".into(), arg("hf_eval_files", &fifo), "eval_interval=5".into(), tokenizer_arg()];
    let e = data::EvalData::open(&config::load(None, &args).unwrap(), 8, ProcessShare::SINGLE).err().expect("refused");
    assert!(e.to_string().starts_with(&format!("hf_eval_files={fifo:?} {is_fifo}")), "{e}");

    let tokens = ["train", "dataset_type=tokens"];
    let e = refused(&[&tokens[..], &[&arg("dataset_path", &looped)]].concat(), &[]);
    assert!(e.contains(&format!("dataset_path={looped:?} is a symlink loop")), "{e}");

    // `maxrs tokenize` inputs, named as the argument they are.
    let out = dir.path().join("out.tokens");
    let tokenize = |input: &Path| {
        refused(&["tokenize", input.to_str().unwrap(), "--output", out.to_str().unwrap(), &tokenizer_arg()], &[])
    };
    assert_eq!(tokenize(&fifo), format!("error: INPUT={fifo:?} {is_fifo}: maxrs reads a regular file there"));
    assert!(tokenize(&sub).contains(&format!("INPUT={sub:?} is a directory: give FILES or a glob like")));
    assert!(tokenize(&looped).contains("is a symlink loop"));
    assert!(!out.exists());
}

#[test]
fn tokenize_refuses_inputs_that_give_no_row_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.tokens");
    std::fs::write(&out, b"previous").unwrap();
    // --force: an existing output may be replaced, but only by a complete token file.
    let tokenize = |input: &Path| {
        let output = out.to_str().unwrap();
        refused(&["tokenize", input.to_str().unwrap(), "--output", output, "--force", &tokenizer_arg()], &[])
    };
    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    assert_eq!(tokenize(&empty), format!("error: {empty:?} is empty: it has no JSON lines"));
    let invalid = dir.path().join("invalid.jsonl");
    std::fs::write(&invalid, "{oops}\n").unwrap();
    assert!(tokenize(&invalid).ends_with(&format!(
        "no valid JSON line with a `text` field in {invalid:?}: line 1: key must be a string at line 1 column 2"
    )));
    // Text too short for one row of max_target_length + 1 = 129 ids.
    let short = dir.path().join("short.jsonl");
    std::fs::write(&short, "{\"text\": \"To be\"}\nnot json\n").unwrap();
    let e = tokenize(&short);
    assert!(e.contains(&format!("input {short:?}: 1 documents (1 more undecodable) hold ")), "{e}");
    assert!(e.ends_with("fewer than one row of 129 ids (max_target_length + 1): nothing was written"), "{e}");
    assert_eq!(std::fs::read(&out).unwrap(), b"previous", "the old output is untouched");
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(leftovers.len(), 4, "no temporary file is left: {leftovers:?}");
}

/// A long text of the test corpus's documents, repeated with varying separators.
fn long_text(bytes: usize) -> String {
    let corpus = std::fs::read_to_string(test_data("tokenizer_corpus.jsonl")).unwrap();
    let docs: Vec<String> = corpus
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["text"].as_str().unwrap().into())
        .collect();
    let mut text = String::new();
    for i in 0.. {
        if text.len() >= bytes {
            break;
        }
        text.push_str(&docs[i % docs.len()]);
        text.push_str([" ", "\n", "  ", "\n\n", ""][i % 5]);
    }
    text
}

#[test]
fn a_long_document_is_cut_before_tokenizing_and_keeps_the_same_ids() {
    // Longer than the prefix `encode_document` tokenizes for 1000 ids (4 x 1064 x the longest
    // token's bytes: under 150 KB for these vocabularies), and than 2 of them for the spaces
    // (so the prefix doubles twice); each case is also tokenized whole for the reference, which
    // is the test's cost in a debug build (300 KB and 200,000 spaces took 10.5 CPU-s).
    let text = long_text(150_000);
    // Runs a normalizer shrinks (SentencePiece collapses spaces): the cut must grow to cover them.
    let spaces = format!("a{}b {}", " ".repeat(150_000), &text[..20_000]);
    for (file, kind) in [
        ("shakespeare-bpe512.model", "sentencepiece"),
        ("shakespeare-unigram512.model", "sentencepiece"),
        ("shakespeare-bytelevel512", "huggingface"),
    ] {
        let tok = TextTokenizer::load(test_data(file).to_str().unwrap(), kind, true, true).unwrap();
        for text in [&text, &spaces] {
            let all = tok.encode_text(text).unwrap();
            for max_len in [2, 3, 64, 129, 1000] {
                let want = [&[tok.bos_id().unwrap()][..], &all[..max_len - 2], &[tok.eos_id().unwrap()]].concat();
                assert_eq!(tok.encode_document(text, max_len).unwrap(), want, "{file} max_len={max_len}");
            }
        }
    }
    // 50 MB: the work is bounded by what is kept, not by the text.
    let tok = TextTokenizer::load(test_data("shakespeare-bpe512.model").to_str().unwrap(), "sentencepiece", true, true)
        .unwrap();
    let huge = text.repeat(50_000_000 / text.len());
    let started = Instant::now();
    let ids = tok.encode_document(&huge, 2048).unwrap();
    assert_eq!(ids.len(), 2048);
    assert_eq!(ids, tok.encode_document(&text, 2048).unwrap(), "the same prefix gives the same ids");
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
}

#[test]
fn a_50_mb_line_trains_a_step_within_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("huge.jsonl");
    let line = serde_json::json!({ "text": long_text(50_000_000) }).to_string();
    std::fs::write(&file, line + "\n").unwrap();
    let started = Instant::now();
    // The tests' tiniest decoder: the deadline is about reading the line, and the default model
    // cost a fifth of this test's CPU.
    let train = ["train", "dataset_type=hf", &arg("hf_train_files", &file), &tokenizer_arg(), "steps=1"];
    let run = maxrs(&[&train[..], crate::common::TINY_DECODER].concat(), &[]);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success() && stdout.contains("completed step: 0"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    // Tokenizing the whole line took longer than this before (issue 25).
    assert!(started.elapsed() < Duration::from_secs(90), "{:?}", started.elapsed());
}

/// A tiny Llama `config.json` that `config_from_hf` accepts.
fn llama_config() -> serde_json::Value {
    serde_json::json!({
        "model_type": "llama", "hidden_size": 8, "num_attention_heads": 2, "num_key_value_heads": 1,
        "intermediate_size": 16, "num_hidden_layers": 1, "vocab_size": 32, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": false, "rope_scaling": null,
    })
}

#[test]
fn hf_config_fields_are_checked_for_type_and_range() {
    let keys = |config: &serde_json::Value| config_from_hf(config).map_err(|e| e.to_string());
    let with = |field: &str, value: serde_json::Value| {
        let mut c = llama_config();
        c[field] = value;
        keys(&c)
    };
    let mistral = |window: serde_json::Value| {
        let mut c = llama_config();
        c["model_type"] = "mistral".into();
        c["sliding_window"] = window;
        keys(&c)
    };
    use serde_json::json;
    assert_eq!(
        mistral(json!(-5)).unwrap_err(),
        "`sliding_window` is -5; it must be null (no window) or an integer in [1, 16777216] (maxrs's sliding_window_size)"
    );
    assert!(mistral(json!(0)).is_err() && mistral(json!("4096")).is_err() && mistral(json!(4096.5)).is_err());
    let window = |r: Result<Vec<(String, String)>, String>| {
        r.unwrap().into_iter().find(|(k, _)| k == "sliding_window_size").unwrap().1
    };
    assert_eq!(window(mistral(json!(null))), "0", "null is no window, as in transformers");
    assert_eq!(window(mistral(json!(4096))), "4096");

    for (field, value, message) in [
        ("hidden_size", json!(0), "`hidden_size` is 0; it must be an integer in [1, 1048576] (maxrs's base_emb_dim)"),
        ("hidden_size", json!(null), "`hidden_size` is missing; it must be an integer in [1, 1048576]"),
        (
            "num_attention_heads",
            json!(0),
            "`num_attention_heads` is 0; it must be an integer in [1, 4096] (maxrs's base_num_query_heads)",
        ),
        (
            "num_attention_heads",
            json!(16),
            "`hidden_size` 8 is smaller than `num_attention_heads` 16: a head would have no dimensions",
        ),
        ("num_key_value_heads", json!(3), "`num_key_value_heads` is 3, which does not divide `num_attention_heads` 2"),
        ("head_dim", json!(-4), "`head_dim` is -4; it must be an integer in [1, 4096] (maxrs's head_dim)"),
        ("intermediate_size", json!("16"), "`intermediate_size` is \"16\"; it must be an integer in [1, 4194304]"),
        (
            "num_hidden_layers",
            json!(1e9),
            "`num_hidden_layers` is 1000000000.0; it must be an integer in [1, 4096] (maxrs's base_num_decoder_layers)",
        ),
        ("vocab_size", json!(1), "`vocab_size` is 1; it must be an integer in [2, 2147483647] (maxrs's vocab_size)"),
        (
            "rms_norm_eps",
            json!(-1e-5),
            "`rms_norm_eps` is -0.00001; it must be a number in (0, 1) (maxrs's normalization_layer_epsilon)",
        ),
        (
            "rope_theta",
            json!(1e4 + 0.5),
            "`rope_theta` is 10000.5; it must be an integer in [1, 9007199254740992] (maxrs's rope_max_timescale)",
        ),
        ("tie_word_embeddings", json!("yes"), "`tie_word_embeddings` is \"yes\"; it must be true or false"),
        ("attention_bias", json!(1), "`attention_bias` is 1; it must be true or false"),
        ("hidden_act", json!(7), "`hidden_act` is 7; it must be a string"),
        (
            "model_type",
            json!("gpt2"),
            "`model_type` is \"gpt2\"; maxrs converts \"llama\" (Llama 2, 3, 3.1, 3.3), \"mistral\", \"mixtral\"",
        ),
    ] {
        let got = with(field, value).unwrap_err();
        assert!(got.starts_with(message), "{field}: {got}");
    }
    // What transformers defaults: missing kv heads, head_dim and rope_theta.
    let mut c = llama_config();
    for field in ["num_key_value_heads", "rope_theta", "hidden_act"] {
        c.as_object_mut().unwrap().remove(field);
    }
    let got: std::collections::BTreeMap<String, String> = keys(&c).unwrap().into_iter().collect();
    assert_eq!((got["base_num_kv_heads"].as_str(), got["head_dim"].as_str()), ("2", "4"));
    assert_eq!(got["rope_max_timescale"], "10000");
}

/// An HF checkpoint folder with `config.json` and an index mapping one tensor to `shard`.
fn hf_folder(root: &Path, shard: serde_json::Value) -> PathBuf {
    let dir = root.join("hf");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), llama_config().to_string()).unwrap();
    let index = serde_json::json!({"metadata": {}, "weight_map": {"model.norm.weight": shard}});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    dir
}

#[test]
fn a_shard_index_cannot_name_files_outside_the_checkpoint() {
    let root = tempfile::tempdir().unwrap();
    let convert = |dir: &Path| {
        refused(&["convert", "from-hf", dir.to_str().unwrap(), root.path().join("out").to_str().unwrap()], &[])
    };
    for shard in ["../../../../etc/passwd", "/etc/passwd", "..", "sub/model.safetensors", ""] {
        let dir = hf_folder(root.path(), shard.into());
        let e = convert(&dir);
        let want = format!(
            "error: {}: weight_map[\"model.norm.weight\"] = {}: not a file of the checkpoint folder",
            dir.join("model.safetensors.index.json").display(),
            serde_json::Value::from(shard)
        );
        assert!(e.starts_with(&want), "{shard}: {e}");
    }
    let outside = root.path().join("elsewhere.safetensors");
    std::fs::write(&outside, b"not read").unwrap();
    let dir = hf_folder(root.path(), "model-00001-of-00001.safetensors".into());
    std::os::unix::fs::symlink("../elsewhere.safetensors", dir.join("model-00001-of-00001.safetensors")).unwrap();
    let e = convert(&dir);
    assert!(
        e.contains(&format!("a symlink to {:?}, outside the checkpoint folder", outside.canonicalize().unwrap())),
        "{e}"
    );
    let dir = hf_folder(root.path(), 7.into());
    let e = convert(&dir);
    assert!(e.ends_with("weight_map[\"model.norm.weight\"] = 7: not a file name"), "{e}");
    assert!(!root.path().join("out").exists());
}

#[test]
fn hf_config_errors_name_the_file_and_stop_before_the_weights_are_read() {
    let root = tempfile::tempdir().unwrap();
    let dir = hf_folder(root.path(), "model-00001-of-00001.safetensors".into());
    mkfifo(&dir.join("model-00001-of-00001.safetensors"));
    let mut config = llama_config();
    config["model_type"] = "mistral".into();
    config["sliding_window"] = (-5).into();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let out = root.path().join("out");
    let convert = || refused(&["convert", "from-hf", dir.to_str().unwrap(), out.to_str().unwrap()], &[]);
    assert_eq!(
        convert(),
        format!(
            "error: {}: `sliding_window` is -5; it must be null (no window) or an integer in [1, 16777216] (maxrs's \
             sliding_window_size)",
            dir.join("config.json").display()
        )
    );
    // With a good config the shard is opened: a FIFO there is refused, not waited on.
    config["sliding_window"] = serde_json::Value::Null;
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let e = convert();
    assert!(e.contains("model-00001-of-00001.safetensors\" is a FIFO (named pipe)"), "{e}");
    std::fs::remove_file(dir.join("config.json")).unwrap();
    mkfifo(&dir.join("config.json"));
    assert!(convert().contains("config.json\" is a FIFO (named pipe)"));
    assert!(!out.exists());
}

#[test]
fn the_other_files_maxrs_reads_are_refused_by_what_they_are() {
    let dir = tempfile::tempdir().unwrap();
    let is_fifo = "is a FIFO (named pipe), not a regular file: maxrs reads a regular file there";
    // A checkpoint's manifest (train and convert read it).
    let checkpoint = dir.path().join("ckpt");
    std::fs::create_dir(&checkpoint).unwrap();
    let manifest = checkpoint.join("manifest.json");
    mkfifo(&manifest);
    let e = refused(&["train", &arg("load_parameters_path", &checkpoint), "steps=1"], &[]);
    assert_eq!(
        e,
        format!(
            "error: load_parameters_path={}: {manifest:?} {is_fifo} (a checkpoint directory has manifest.json)",
            checkpoint.display()
        )
    );
    let e = refused(&["convert", "to-hf", checkpoint.to_str().unwrap(), dir.path().join("hf").to_str().unwrap()], &[]);
    assert!(e.starts_with(&format!("error: {manifest:?} {is_fifo}")), "{e}");
    // A model file beside the config file.
    std::fs::create_dir(dir.path().join("models")).unwrap();
    let model = dir.path().join("models/mine.yml");
    mkfifo(&model);
    let config = dir.path().join("run.yml");
    std::fs::write(&config, "model_name: mine\n").unwrap();
    assert_eq!(refused(&["train", config.to_str().unwrap()], &[]), format!("error: model file {model:?} {is_fifo}"));
    // `maxrs submit`'s settings file.
    let settings = dir.path().join("team.yml");
    mkfifo(&settings);
    let home = [("HOME", dir.path().to_str().unwrap())];
    let e = refused(
        &["submit", "vertex", "--submit-config", settings.to_str().unwrap(), "--dry-run", "--", "train"],
        &home,
    );
    assert_eq!(e, format!("error: submit settings file {settings:?} {is_fifo}"));
}

#[test]
fn a_safetensors_header_claiming_more_than_the_file_holds_is_an_error_not_an_allocation() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("params.safetensors");
    // One f32 tensor of 2^40 x 2^20 elements (4 EiB), and of 2^62 x 2^62 (overflows), in a tiny file.
    for shape in [[1u64 << 40, 1 << 20], [1 << 62, 1 << 62]] {
        let end = shape[0].saturating_mul(shape[1]).saturating_mul(4);
        let header = serde_json::json!({"w": {"dtype": "F32", "shape": shape, "data_offsets": [0, end]}}).to_string();
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend_from_slice(&[0u8; 16]);
        std::fs::write(&file, &bytes).unwrap();
        let e = refused(&["convert", "to-hf", file.to_str().unwrap(), dir.path().join("hf").to_str().unwrap()], &[]);
        assert!(e.contains("params.safetensors") && e.contains("tensor w"), "{e}");
    }
}
