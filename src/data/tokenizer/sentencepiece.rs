//! SentencePiece `.model` files (Llama 2, Mistral v0.1, Gemma, T5 ...) as a Hugging Face
//! `tokenizers` pipeline, built the way `transformers` converts them into the `tokenizer.json`
//! files the Hub serves (its `SpmConverter`/`LlamaConverter`), so no C++ SentencePiece library
//! (and no cmake) is needed. The ids equal the `sentencepiece` library's: `tests/data_tokenizer.rs`
//! checks them against ids it produced on a test corpus.
//!
//! The model file is a `sentencepiece.ModelProto` (sentencepiece `src/sentencepiece_model.proto`);
//! the prost structs below declare only the fields maxrs reads, with the proto's field numbers
//! and defaults. The mapping:
//! - normalizer: the precompiled character map when the model has one (`nmt_nfkc` models);
//!   with `remove_extra_whitespaces`, leading/trailing spaces stripped and runs of spaces
//!   collapsed; with `add_dummy_prefix`, a `▁` in front; with `escape_whitespaces`, spaces as `▁`.
//! - model `BPE`: the vocabulary by id, and merges `(left, right)` for every normal piece that
//!   splits into two pieces of the vocabulary, ranked by the piece's score (SentencePiece merges
//!   the adjacent pair whose union scores highest); byte fallback as the model says.
//! - model `UNIGRAM`: the pieces with their scores (control and unused pieces never chosen).
//! - user-defined pieces: matched whole before the model, as SentencePiece does.
//!
//! Control pieces (`<s>`, `</s>`) are never produced from text; BOS/EOS are added by the caller.

use std::collections::HashMap;

use prost::Message;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::strip::Strip as DecodeStrip;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::models::unigram::Unigram;
use tokenizers::normalizers::replace::ReplacePattern;
use tokenizers::normalizers::{Precompiled, Prepend, Replace, Sequence};
use tokenizers::{AddedToken, DecoderWrapper, NormalizerWrapper, Tokenizer};

#[derive(Clone, PartialEq, Message)]
pub struct ModelProto {
    #[prost(message, repeated, tag = "1")]
    pub pieces: Vec<SentencePiece>,
    #[prost(message, optional, tag = "2")]
    pub trainer_spec: Option<TrainerSpec>,
    #[prost(message, optional, tag = "3")]
    pub normalizer_spec: Option<NormalizerSpec>,
}

#[derive(Clone, PartialEq, Message)]
pub struct SentencePiece {
    #[prost(string, optional, tag = "1")]
    pub piece: Option<String>,
    #[prost(float, optional, tag = "2")]
    pub score: Option<f32>,
    /// NORMAL = 1 (the default), UNKNOWN = 2, CONTROL = 3, USER_DEFINED = 4, UNUSED = 5, BYTE = 6.
    #[prost(int32, optional, tag = "3")]
    pub r#type: Option<i32>,
}

#[derive(Clone, PartialEq, Message)]
pub struct TrainerSpec {
    /// UNIGRAM = 1 (the default), BPE = 2, WORD = 3, CHAR = 4.
    #[prost(int32, optional, tag = "3")]
    pub model_type: Option<i32>,
    #[prost(bool, optional, tag = "24")]
    pub treat_whitespace_as_suffix: Option<bool>,
    #[prost(bool, optional, tag = "35")]
    pub byte_fallback: Option<bool>,
    #[prost(int32, optional, tag = "40")]
    pub unk_id: Option<i32>,
    #[prost(int32, optional, tag = "41")]
    pub bos_id: Option<i32>,
    #[prost(int32, optional, tag = "42")]
    pub eos_id: Option<i32>,
    #[prost(int32, optional, tag = "43")]
    pub pad_id: Option<i32>,
}

#[derive(Clone, PartialEq, Message)]
pub struct NormalizerSpec {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(bytes = "vec", optional, tag = "2")]
    pub precompiled_charsmap: Option<Vec<u8>>,
    #[prost(bool, optional, tag = "3")]
    pub add_dummy_prefix: Option<bool>,
    #[prost(bool, optional, tag = "4")]
    pub remove_extra_whitespaces: Option<bool>,
    #[prost(bool, optional, tag = "5")]
    pub escape_whitespaces: Option<bool>,
}

/// Prefix of the control pieces' spelling in a unigram vocabulary: a Unicode noncharacter pair
/// that text does not carry.
const UNMATCHABLE: &str = "\u{FFFF}\u{FFFE}";

const NORMAL: i32 = 1;
const UNKNOWN: i32 = 2;
const USER_DEFINED: i32 = 4;
const BYTE: i32 = 6;
const UNIGRAM: i32 = 1;
const BPE_TYPE: i32 = 2;

/// A loaded SentencePiece model: the pipeline and the special ids the model file declares
/// (negative ids mean "none", as in SentencePiece).
pub struct Loaded {
    pub tokenizer: Tokenizer,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub pad: Option<u32>,
    pub unk: Option<u32>,
}

/// Builds the tokenizer from a `.model` file's bytes; errors are one-line reasons.
pub fn load(bytes: &[u8]) -> Result<Loaded, String> {
    let proto = ModelProto::decode(bytes).map_err(|e| format!("not a SentencePiece model file ({e})"))?;
    if proto.pieces.is_empty() {
        return Err("not a SentencePiece model file (it has no pieces)".into());
    }
    let trainer = proto.trainer_spec.clone().unwrap_or_default();
    let norm = proto.normalizer_spec.clone().unwrap_or_default();
    if trainer.treat_whitespace_as_suffix.unwrap_or(false) {
        return Err("treat_whitespace_as_suffix=true models are not supported yet".into());
    }
    let kind = |p: &SentencePiece| p.r#type.unwrap_or(NORMAL);
    let text = |p: &SentencePiece| p.piece.clone().unwrap_or_default();
    let byte_fallback = trainer.byte_fallback.unwrap_or(false);
    let unk = proto.pieces.iter().position(|p| kind(p) == UNKNOWN);

    let mut tokenizer = match trainer.model_type.unwrap_or(UNIGRAM) {
        BPE_TYPE => {
            let vocab: HashMap<String, u32> =
                proto.pieces.iter().enumerate().map(|(i, p)| (text(p), i as u32)).collect();
            // Merges: every normal piece made of two vocabulary pieces, best score first; within
            // one piece, splits in id order of (left, right), as transformers' extractor does.
            let mut merges: Vec<(f32, u32, u32, u32, String, String)> = Vec::new();
            for (id, p) in proto.pieces.iter().enumerate() {
                if kind(p) != NORMAL && kind(p) != USER_DEFINED {
                    continue;
                }
                let piece = text(p);
                for (split, _) in piece.char_indices().skip(1) {
                    let (l, r) = piece.split_at(split);
                    if let (Some(&li), Some(&ri)) = (vocab.get(l), vocab.get(r)) {
                        merges.push((p.score.unwrap_or(0.0), id as u32, li, ri, l.to_string(), r.to_string()));
                    }
                }
            }
            merges.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)).then(a.3.cmp(&b.3)));
            let merges: Vec<(String, String)> = merges.into_iter().map(|m| (m.4, m.5)).collect();
            let vocab: Vocab = vocab.into_iter().collect();
            let mut builder = BPE::builder().vocab_and_merges(vocab, merges).byte_fallback(byte_fallback);
            if let Some(u) = unk {
                builder = builder.unk_token(text(&proto.pieces[u])).fuse_unk(true);
            }
            Tokenizer::new(builder.build().map_err(|e| format!("cannot build its BPE model: {e}"))?)
        }
        UNIGRAM => {
            // Control, unknown and unused pieces exist for their ids only: SentencePiece never matches
            // them in text, so they get a spelling no normalized text contains (a large negative
            // score instead would shift the unknown-piece penalty, which is relative to the
            // lowest score).
            let vocab: Vec<(String, f64)> = proto
                .pieces
                .iter()
                .map(|p| {
                    // Byte pieces keep their `<0xNN>` spelling: byte fallback looks them up by it.
                    let usable = matches!(kind(p), NORMAL | USER_DEFINED | BYTE);
                    let piece = if usable { text(p) } else { format!("{UNMATCHABLE}{}", text(p)) };
                    (piece, p.score.unwrap_or(0.0) as f64)
                })
                .collect();
            Tokenizer::new(
                Unigram::from(vocab, unk, byte_fallback).map_err(|e| format!("cannot build its unigram model: {e}"))?,
            )
        }
        other => {
            return Err(format!(
                "model_type {} is not supported yet (BPE and UNIGRAM SentencePiece models are)",
                match other {
                    3 => "WORD".to_string(),
                    4 => "CHAR".to_string(),
                    n => n.to_string(),
                }
            ))
        }
    };

    let mut steps: Vec<NormalizerWrapper> = Vec::new();
    if let Some(map) = norm.precompiled_charsmap.as_deref().filter(|m| !m.is_empty()) {
        let precompiled =
            Precompiled::from(map).map_err(|e| format!("cannot read its precompiled normalization map: {e}"))?;
        steps.push(NormalizerWrapper::Precompiled(precompiled));
    }
    let replace = |pattern: ReplacePattern, with: &str| {
        Replace::new(pattern, with).map(NormalizerWrapper::Replace).map_err(|e| e.to_string())
    };
    if norm.remove_extra_whitespaces.unwrap_or(true) {
        // SentencePiece trims and collapses the space character only (not tabs or newlines).
        steps.push(replace(ReplacePattern::Regex("^ +| +$".into()), "")?);
        steps.push(replace(ReplacePattern::Regex(" {2,}".into()), " ")?);
    }
    if norm.add_dummy_prefix.unwrap_or(true) {
        steps.push(NormalizerWrapper::Prepend(Prepend::new(" ".into())));
    }
    if norm.escape_whitespaces.unwrap_or(true) {
        steps.push(replace(ReplacePattern::String(" ".into()), "\u{2581}")?);
    }
    tokenizer.with_normalizer(Some(Sequence::new(steps)));
    // Decoding: `▁` back to spaces, byte pieces back to bytes, the dummy prefix's space dropped.
    let mut decoders = vec![
        DecoderWrapper::Replace(Replace::new("\u{2581}", " ").map_err(|e| e.to_string())?),
        DecoderWrapper::ByteFallback(ByteFallback::new()),
        DecoderWrapper::Fuse(Fuse::new()),
    ];
    if norm.add_dummy_prefix.unwrap_or(true) {
        decoders.push(DecoderWrapper::Strip(DecodeStrip::new(' ', 1, 0)));
    }
    tokenizer.with_decoder(Some(tokenizers::decoders::sequence::Sequence::new(decoders)));

    let user_defined: Vec<AddedToken> = proto
        .pieces
        .iter()
        .filter(|p| kind(p) == USER_DEFINED)
        .map(|p| AddedToken::from(text(p), false).normalized(false))
        .collect();
    tokenizer.add_tokens(&user_defined);

    let id = |v: Option<i32>, default: i32| {
        let v = v.unwrap_or(default);
        (v >= 0 && (v as usize) < proto.pieces.len()).then_some(v as u32)
    };
    Ok(Loaded {
        tokenizer,
        bos: id(trainer.bos_id, 1),
        eos: id(trainer.eos_id, 2),
        pad: id(trainer.pad_id, -1),
        unk: unk.map(|u| u as u32),
    })
}
