//! Tokenizer ids equal the reference libraries' ids on a test corpus
//! (`tests/data/tokenizer_corpus.jsonl`: plain and odd whitespace, digits, accents, CJK, emoji,
//! code, control-token text, empty strings). The golden ids in `tests/data/tokenizer_golden.json`
//! were produced once by `tools/data/golden_ids.py` with the Python `sentencepiece` 0.2.3
//! (`EncodeAsIds`) and `tokenizers` 0.23.3 (`encode(add_special_tokens=False)`) libraries, never
//! by maxrs. Models: Mistral 7B v0.1's 32 000-piece SentencePiece BPE (fetched from the
//! `mistral-common` 1.13.1 wheel through maxrs's wheel provisioning: needs the network), and three
//! 512-token tokenizers trained on Shakespeare's comedies (SentencePiece BPE with byte fallback,
//! SentencePiece unigram with NFKC normalization, byte-level BPE `tokenizer.json`).

use std::path::{Path, PathBuf};

use maxrs::data::TextTokenizer;
use maxrs::pjrt::provision::{Provisioner, WheelPin};

use crate::common::provision::skip_offline;

pub(crate) const MISTRAL: WheelPin =
    WheelPin { package: "mistral-common", version: "1.13.1", member: "mistral_common/data/tokenizer.model.v1" };

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

fn corpus() -> Vec<String> {
    std::fs::read_to_string(data("tokenizer_corpus.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["text"].as_str().unwrap().to_string())
        .collect()
}

fn golden(name: &str) -> Vec<Vec<i32>> {
    let all: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data("tokenizer_golden.json")).unwrap()).unwrap();
    serde_json::from_value(all[name].clone()).unwrap()
}

fn check(name: &str, path: &Path, kind: &str) -> TextTokenizer {
    let tokenizer = TextTokenizer::load(path.to_str().unwrap(), kind, false, false).unwrap();
    let want = golden(name);
    let texts = corpus();
    assert_eq!(want.len(), texts.len());
    let mismatches: Vec<String> = texts
        .iter()
        .zip(&want)
        .filter_map(|(text, want)| {
            let got = tokenizer.encode_text(text).unwrap();
            (&got != want).then(|| format!("{text:?}:\n  got  {got:?}\n  want {want:?}"))
        })
        .collect();
    assert!(
        mismatches.is_empty(),
        "{name}: {} of {} texts differ:\n{}",
        mismatches.len(),
        texts.len(),
        mismatches.join("\n")
    );
    tokenizer
}

#[test]
fn sentencepiece_bpe_with_byte_fallback_matches_the_library() {
    let t = check("shakespeare-bpe512", &data("shakespeare-bpe512.model"), "sentencepiece");
    assert_eq!((t.vocab_size(), t.bos_id(), t.eos_id(), t.pad_id()), (512, Some(1), Some(2), 0));
}

#[test]
fn sentencepiece_unigram_with_nfkc_matches_the_library() {
    check("shakespeare-unigram512", &data("shakespeare-unigram512.model"), "sentencepiece");
}

#[test]
fn huggingface_tokenizer_json_matches_the_library() {
    let t = check("shakespeare-bytelevel512", &data("shakespeare-bytelevel512"), "huggingface");
    // No tokenizer_config.json: BOS/EOS found by their usual names.
    assert_eq!((t.bos_id(), t.eos_id()), (Some(0), Some(1)));
}

#[test]
fn mistral_7b_sentencepiece_matches_the_library() {
    let path = match Provisioner::from_env().wheel_file(&MISTRAL) {
        Ok(path) => path,
        Err(e) => return skip_offline(&format!("cannot fetch the Mistral tokenizer: {e:#}")),
    };
    let t = check("mistral-v1", &path, "sentencepiece");
    assert_eq!((t.vocab_size(), t.bos_id(), t.eos_id()), (32000, Some(1), Some(2)));
}

#[test]
fn bos_eos_and_truncation_follow_maxtext() {
    let path = data("shakespeare-bpe512.model");
    let both = TextTokenizer::load(path.to_str().unwrap(), "sentencepiece", true, true).unwrap();
    let text = "To be, or not to be, that is the question:";
    let ids = both.encode_text(text).unwrap();
    let doc = both.encode_document(text, usize::MAX).unwrap();
    assert_eq!(doc, [&[1][..], &ids, &[2]].concat());
    // Truncation keeps BOS and EOS, as Hugging Face's tokenizer(truncation=True, max_length=n).
    let short = both.encode_document(text, 5).unwrap();
    assert_eq!(short, [&[1][..], &ids[..3], &[2]].concat());
    let bos_only = TextTokenizer::load(path.to_str().unwrap(), "sentencepiece", true, false).unwrap();
    assert_eq!(bos_only.encode_document(text, 4).unwrap(), [&[1][..], &ids[..3]].concat());
    assert_eq!(both.decode(&doc).unwrap(), text);
}

#[test]
fn tokenizer_errors_name_the_file_and_the_fix() {
    let err = |path: &str, kind: &str| TextTokenizer::load(path, kind, true, true).unwrap_err().to_string();
    let missing = err("/nonexistent/tokenizer.model", "sentencepiece");
    assert!(missing.contains("/nonexistent/tokenizer.model") && missing.contains("no such file"), "{missing}");
    let json_as_spm = err(data("shakespeare-bytelevel512/tokenizer.json").to_str().unwrap(), "sentencepiece");
    assert!(json_as_spm.contains("tokenizer_type=huggingface"), "{json_as_spm}");
    let spm_as_json = err(data("shakespeare-bpe512.model").to_str().unwrap(), "huggingface");
    assert!(spm_as_json.contains("tokenizer_type=sentencepiece"), "{spm_as_json}");
    let tiktoken = err(data("shakespeare-bpe512.model").to_str().unwrap(), "tiktoken");
    assert!(tiktoken.contains("not supported yet"), "{tiktoken}");
    let corpus = err(data("tokenizer_corpus.jsonl").to_str().unwrap(), "sentencepiece");
    assert!(corpus.contains("not a SentencePiece model"), "{corpus}");
}
