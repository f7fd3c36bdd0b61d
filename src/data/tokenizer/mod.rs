//! Text to token ids, as MaxText's `tokenizer_path` / `tokenizer_type` / `add_bos` / `add_eos`
//! (maxtext `src/maxtext/input_pipeline/tokenizer.py` and `hf_data_processing.py`, main e591f30).
//!
//! - `tokenizer_type=sentencepiece`: a SentencePiece `.model` file ([`sentencepiece`]).
//! - `tokenizer_type=huggingface`: a `tokenizer.json` file, or a folder holding one (Llama 3,
//!   Mistral, Gemma and most Hub models); its special tokens come from the
//!   `tokenizer_config.json` beside it when there is one (`bos_token`, `eos_token`, `pad_token`,
//!   `unk_token`), else from the usual names (`<s>`, `</s>`, `<|begin_of_text|>`, ...).
//! - `tokenizer_type=tiktoken` is refused as not supported yet.
//!
//! A document becomes `[BOS] + ids(text) + [EOS]` (BOS with `add_bos`, EOS with `add_eos`), and
//! is truncated to `max_target_length` the way MaxText's Hugging Face pipeline truncates
//! (`tokenizer(text, truncation=True, max_length=...)`): the text's ids are cut so that BOS and
//! EOS still fit. The padding id is the tokenizer's pad token, else its unknown token, else 0
//! (MaxText uses -1 when both are missing, which is not a valid row of the embedding).
//!
//! MaxText tokenizes a document whole and then truncates it (`tokenization` in
//! `src/maxtext/input_pipeline/input_pipeline_utils.py`, commit 9e49beb, calls the Hugging Face
//! tokenizer with `truncation=True, max_length=...`, which cuts the ids after encoding all of
//! the text), so one 50 MB line stalls the pipeline (issue 25: no training step in 90 s) to keep
//! a few thousand ids. Here a document far longer than its kept tokens can span is cut first
//! (`TextTokenizer::encode_leading`): the work is bounded by `max_target_length`, and the
//! kept ids are the same.

pub mod sentencepiece;

use std::path::{Path, PathBuf};

use super::error::DataError;
use crate::input;

/// The config key the tokenizer's files are named by, for errors.
const KEY: &str = "tokenizer_path";

/// A loaded tokenizer with MaxText's BOS/EOS handling.
pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
    bos: Option<i32>,
    eos: Option<i32>,
    pad: i32,
    add_bos: bool,
    add_eos: bool,
    vocab_size: usize,
    /// The longest token's text in bytes: how much text one id can stand for (before
    /// normalization).
    max_token_bytes: usize,
}

/// Tokens a cut document's prefix must give beyond those kept, so that where the cut falls
/// (inside a word, inside a merge) cannot change the kept ones.
const CUT_MARGIN: usize = 64;
/// A document is cut only when longer than this many times the text its kept tokens (plus the
/// margin) can span: documents of ordinary length are tokenized whole, exactly as before.
const CUT_SLACK: usize = 4;

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("path", &self.path)
            .field("vocab_size", &self.vocab_size)
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("pad", &self.pad)
            .finish()
    }
}

/// The special tokens a tokenizer declares.
#[derive(Default)]
struct Specials {
    bos: Option<u32>,
    eos: Option<u32>,
    pad: Option<u32>,
    unk: Option<u32>,
}

impl TextTokenizer {
    /// Loads `tokenizer_path` as `tokenizer_type` (`sentencepiece` | `huggingface` | `tiktoken`).
    pub fn load(path: &str, tokenizer_type: &str, add_bos: bool, add_eos: bool) -> Result<TextTokenizer, DataError> {
        if let Some(rest) = path.strip_prefix("gs://") {
            return Err(DataError::RemoteNotSupported { what: "tokenizer_path".into(), rest: rest.into() });
        }
        let path = PathBuf::from(path);
        let fail = |message: String| DataError::Tokenizer { path: path.clone(), message };
        if std::fs::symlink_metadata(&path).is_err() {
            return Err(fail("no such file or folder".into()));
        }
        let (inner, specials) = match tokenizer_type {
            "sentencepiece" => {
                if path.is_dir() {
                    return Err(fail(
                        "is a folder; tokenizer_type=sentencepiece needs the .model file (a folder with a tokenizer.json \
                         needs tokenizer_type=huggingface)"
                            .into(),
                    ));
                }
                let bytes = input::read(KEY, &path, input::TOKENIZER)?;
                let loaded = sentencepiece::load(&bytes).map_err(|m| {
                    let hint = if bytes.first() == Some(&b'{') {
                        "; it looks like JSON: use tokenizer_type=huggingface for a tokenizer.json"
                    } else {
                        ""
                    };
                    fail(format!("{m}{hint}"))
                })?;
                let specials = Specials { bos: loaded.bos, eos: loaded.eos, pad: loaded.pad, unk: loaded.unk };
                (loaded.tokenizer, specials)
            }
            "huggingface" => load_huggingface(&path)?,
            "tiktoken" => {
                return Err(fail(
                    "tokenizer_type=tiktoken is not supported yet; use the model's tokenizer.json with \
                     tokenizer_type=huggingface (Llama 3 ships one)"
                        .into(),
                ))
            }
            other => {
                return Err(fail(format!("tokenizer_type={other} is not one of sentencepiece, huggingface, tiktoken")))
            }
        };
        let as_i32 = |v: Option<u32>| v.map(|v| v as i32);
        if add_bos && specials.bos.is_none() {
            return Err(fail("the tokenizer declares no BOS token; set add_bos=false".into()));
        }
        if add_eos && specials.eos.is_none() {
            return Err(fail("the tokenizer declares no EOS token; set add_eos=false".into()));
        }
        let vocab = inner.get_vocab(true);
        let vocab_size = vocab.values().map(|&id| id as usize + 1).max().unwrap_or(0);
        let max_token_bytes = vocab.keys().map(String::len).max().unwrap_or(1).max(1);
        Ok(TextTokenizer {
            inner,
            path,
            bos: as_i32(specials.bos),
            eos: as_i32(specials.eos),
            pad: specials.pad.or(specials.unk).map(|v| v as i32).unwrap_or(0),
            add_bos,
            add_eos,
            vocab_size,
            max_token_bytes,
        })
    }

    /// One more than the largest id the tokenizer can produce.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn pad_id(&self) -> i32 {
        self.pad
    }

    pub fn bos_id(&self) -> Option<i32> {
        self.bos
    }

    pub fn eos_id(&self) -> Option<i32> {
        self.eos
    }

    /// The text's ids alone: no BOS/EOS, no truncation.
    pub fn encode_text(&self, text: &str) -> Result<Vec<i32>, String> {
        let encoding = self.inner.encode_fast(text, false).map_err(|e| e.to_string())?;
        Ok(encoding.get_ids().iter().map(|&id| id as i32).collect())
    }

    /// A document's ids: BOS/EOS as configured, truncated to `max_len` tokens keeping them
    /// (see the module docs); `max_len = usize::MAX` keeps everything.
    pub fn encode_document(&self, text: &str, max_len: usize) -> Result<Vec<i32>, String> {
        let bos = self.bos.filter(|_| self.add_bos);
        let eos = self.eos.filter(|_| self.add_eos);
        let room = max_len.saturating_sub(bos.is_some() as usize + eos.is_some() as usize);
        let ids = self.encode_leading(text, room)?;
        let mut doc = Vec::with_capacity(ids.len().min(room) + 2);
        doc.extend(bos);
        doc.extend_from_slice(&ids[..ids.len().min(room)]);
        doc.extend(eos);
        doc.truncate(max_len);
        Ok(doc)
    }

    /// Ids of which the first `want` equal those of the whole text's, tokenizing only a
    /// prefix of a long text: one `CUT_SLACK` times what `want + CUT_MARGIN` tokens can span,
    /// doubled until it gives that many tokens (a normalizer may shrink text, e.g. collapse
    /// runs of spaces) or is the whole text. The work is at most about twice the prefix that
    /// holds the tokens, whatever the text's length.
    fn encode_leading(&self, text: &str, want: usize) -> Result<Vec<i32>, String> {
        let enough = want.saturating_add(CUT_MARGIN);
        let mut budget = enough.saturating_mul(self.max_token_bytes).saturating_mul(CUT_SLACK);
        loop {
            if text.len() <= budget {
                return self.encode_text(text);
            }
            let ids = self.encode_text(&text[..text.floor_char_boundary(budget)])?;
            if ids.len() >= enough {
                return Ok(ids);
            }
            budget = budget.saturating_mul(2);
        }
    }

    /// Ids back to text (BOS, EOS, padding and special tokens skipped).
    pub fn decode(&self, ids: &[i32]) -> Result<String, String> {
        let skip = [self.bos, self.eos, Some(self.pad)];
        let ids: Vec<u32> = ids.iter().filter(|&&i| !skip.contains(&Some(i))).map(|&i| i as u32).collect();
        self.inner.decode(&ids, true).map_err(|e| e.to_string())
    }
}

/// The names special tokens usually have, when no `tokenizer_config.json` says.
const BOS_NAMES: &[&str] = &["<s>", "<|begin_of_text|>", "<bos>", "<|startoftext|>", "[BOS]"];
const EOS_NAMES: &[&str] = &["</s>", "<|end_of_text|>", "<eos>", "<|endoftext|>", "[EOS]"];
const PAD_NAMES: &[&str] = &["<pad>", "[PAD]", "<|pad|>"];
const UNK_NAMES: &[&str] = &["<unk>", "[UNK]", "<|unk|>"];

fn load_huggingface(path: &Path) -> Result<(tokenizers::Tokenizer, Specials), DataError> {
    let fail = |message: String| DataError::Tokenizer { path: path.to_path_buf(), message };
    let file = if path.is_dir() { path.join("tokenizer.json") } else { path.to_path_buf() };
    if path.is_dir() && std::fs::symlink_metadata(&file).is_err() {
        return Err(fail(format!("is a folder without a tokenizer.json ({} does not exist)", file.display())));
    }
    let bytes = input::read(KEY, &file, input::TOKENIZER)?;
    let inner = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| {
        let hint = if bytes.first() != Some(&b'{') {
            "; a SentencePiece .model needs tokenizer_type=sentencepiece"
        } else {
            ""
        };
        fail(format!("not a Hugging Face tokenizer.json ({e}){hint}"))
    })?;
    let config_path = file.with_file_name("tokenizer_config.json");
    let config: Option<serde_json::Value> = match input::read(KEY, &config_path, input::SETTINGS) {
        Ok(bytes) => Some(
            serde_json::from_slice(&bytes)
                .map_err(|e| fail(format!("{}: not valid JSON ({e})", config_path.display())))?,
        ),
        Err(e) if e.is_missing() => None,
        Err(e) => return Err(e.into()),
    };
    let id_of = |key: &str, names: &[&str]| -> Option<u32> {
        let configured = config.as_ref().and_then(|c| c.get(key)).and_then(|v| match v {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Object(o) => o.get("content").and_then(|c| c.as_str()).map(str::to_string),
            _ => None,
        });
        match configured {
            Some(name) => inner.token_to_id(&name),
            None if config.is_some() => None,
            None => names.iter().find_map(|n| inner.token_to_id(n)),
        }
    };
    let specials = Specials {
        bos: id_of("bos_token", BOS_NAMES),
        eos: id_of("eos_token", EOS_NAMES),
        pad: id_of("pad_token", PAD_NAMES),
        unk: id_of("unk_token", UNK_NAMES),
    };
    Ok((inner, specials))
}
