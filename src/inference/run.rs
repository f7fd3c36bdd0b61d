//! `maxrs decode`'s job, start to end: validated config and mesh -> prompts as token ids (through
//! `tokenizer_path`'s tokenizer, written as ids, or, for the default prompt without a tokenizer,
//! its bytes) -> the compiled session with its parameters -> prefill and generate -> the prompts'
//! outputs and the timings printed (MaxText's `decode.py` prints `Input `...` -> `...``).

use anyhow::{anyhow, bail, Result};

use crate::config::{self, quote, Config};
use crate::data::{load_tokenizer, TextTokenizer};
use crate::pjrt::Client;

use super::session::{DecodeStartup, Generation, ParamSource, Session};

/// Tokens per sequence per generate call of `maxrs decode`: one call per token, read back (and
/// checked for EOS) after each, which measured faster on CPU than a compiled multi-token loop
/// (docs/src/guides/decoding.md).
pub const STEPS_PER_CALL: i64 = 1;

/// What `maxrs decode` did.
#[derive(Clone, Debug)]
pub struct DecodeReport {
    /// The prompts' token ids.
    pub prompts: Vec<Vec<i32>>,
    pub generation: Generation,
    pub startup: DecodeStartup,
}

/// Who chose the prompt: the user (config file or command line), or nobody, so it is
/// `configs/base.yml`'s default, MaxText's `prompt: "I love to"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PromptOrigin {
    User,
    Default,
}

/// How the prompts become token ids.
#[derive(Clone, Copy)]
pub enum Encoding<'a> {
    /// `tokenizer_path`'s tokenizer: text in, text out.
    Tokenizer(&'a TextTokenizer),
    /// Each prompt is token ids, and so is the output.
    Ids,
    /// Each prompt's UTF-8 bytes are its token ids; the output is token ids.
    Bytes,
}

impl<'a> Encoding<'a> {
    /// The encoding for `c`'s prompts. MaxText's `decode.py` reads its default prompt, "I love
    /// to", with the tokenizer base.yml names; maxrs ships no tokenizer, and its built-in default
    /// model is trained on token ids (the synthetic data), so a bare `maxrs decode` has text and
    /// nothing to encode it with. Its UTF-8 bytes are ids every vocabulary of 256 or more has (the
    /// default model's has 512), so the default prompt goes in as bytes, and the start-up line
    /// says so. A prompt the user wrote stays token ids without a tokenizer: text there most
    /// likely means a forgotten `tokenizer_path`, which the error names, rather than bytes no
    /// real model was trained on.
    pub fn of(c: &Config, tokenizer: Option<&'a TextTokenizer>, origin: PromptOrigin) -> Encoding<'a> {
        match (tokenizer, origin) {
            (Some(t), _) => Encoding::Tokenizer(t),
            (None, PromptOrigin::Default) if c.vocab_size >= 256 => Encoding::Bytes,
            (None, _) => Encoding::Ids,
        }
    }
}

/// Decodes the configured prompts on `client`'s devices (one process) and prints the results;
/// `origin` says whether the user chose the prompts ([`Encoding::of`]).
pub fn decode(c: &Config, client: &Client, origin: PromptOrigin) -> Result<DecodeReport> {
    let devices = client.devices()?;
    let derived = config::validate(c, devices.len(), 1)?;
    if let Some(plan) = &derived.pipeline {
        bail!(
            "ici_pipeline_parallelism={}: pipeline stages are for training; decoding with them is not supported yet, set \
             ici_pipeline_parallelism=1 (fsdp or tensor parallelism shard the model for decoding)",
            plan.stages
        );
    }
    config::validate_decode(c)?;
    crate::pjrt::compile_cache::configure(&c.jax_cache_dir)?;
    let tokenizer = if c.tokenizer_path.is_empty() { None } else { Some(load_tokenizer(c)?) };
    let encoding = Encoding::of(c, tokenizer.as_deref(), origin);
    let prompts = prompt_ids(c, derived.micro_batch_size, encoding)?;
    if let Encoding::Bytes = encoding {
        println!(
            "prompt: no tokenizer_path, so the default prompt {} goes in as its UTF-8 bytes (token ids {}) and the \
             output is token ids; give prompt=\"1 2 3\" (token ids), or tokenizer_path for text",
            c.prompt.iter().map(|p| quote(p)).collect::<Vec<_>>().join(", "),
            prompts.iter().map(|ids| join(ids)).collect::<Vec<_>>().join(", ")
        );
    }
    let mut ids: Vec<i64> = devices.iter().map(|d| d.id as i64).collect();
    ids.sort_unstable();
    let mesh = derived.mesh.step_mesh(&[ids])?;
    let source = match c.load_parameters_path.as_str() {
        "" => {
            println!(
                "no load_parameters_path: decoding with random parameters (init_weights_seed={})",
                c.init_weights_seed
            );
            ParamSource::Init(c.init_weights_seed as u32)
        }
        path => ParamSource::Load(path),
    };
    let session = Session::new(c, &derived, mesh, client, source, STEPS_PER_CALL)?;
    let e = &session.engine;
    println!("model: {} ({} parameters)", c.model_name, e.model.num_params());
    println!(
        "decode: batch {} (int({} devices x per_device_batch_size {})), prompts padded to {}, cache of {} positions, \
         sampling {:?}",
        e.batch, derived.num_devices, c.per_device_batch_size, e.prefill_len, e.cache_len, e.sampling
    );
    let s = &session.startup;
    println!(
        "start-up: trace {:.3} s, lower {:.3} s, compile {:.3} s, parameters {:.3} s",
        s.trace, s.lower, s.compile, s.params
    );

    let eos = tokenizer.as_ref().and_then(|t| t.eos_id());
    let generation = session.generate(&prompts, eos)?;
    let show = |ids: &[i32]| -> Result<String> {
        match encoding {
            Encoding::Tokenizer(t) => {
                t.decode(ids).map_err(|e| anyhow!("tokenizer_path={}: decoding {ids:?}: {e}", c.tokenizer_path))
            }
            Encoding::Ids | Encoding::Bytes => Ok(join(ids)),
        }
    };
    let mut outputs = Vec::new();
    for (i, output) in generation.tokens.iter().enumerate() {
        let input = match encoding {
            Encoding::Ids => join(&prompts[i]),
            Encoding::Tokenizer(_) | Encoding::Bytes => c.prompt[i].clone(),
        };
        outputs.push(show(output)?);
        println!("Input `{input}` -> `{}`", outputs[i]);
    }
    print_timings(&generation, prompts.len());
    if !c.autoregressive_decode_assert.is_empty() {
        let first = &outputs[0];
        if !first.starts_with(&c.autoregressive_decode_assert) {
            bail!(
                "autoregressive_decode_assert: the first prompt's output {} does not start with {}",
                quote(first),
                quote(&c.autoregressive_decode_assert)
            );
        }
    }
    Ok(DecodeReport { prompts, generation, startup: session.startup.clone() })
}

fn print_timings(g: &Generation, sequences: usize) {
    println!("prefill: {:.2} ms ({sequences} prompts)", g.prefill_seconds * 1e3);
    match (g.per_token_seconds(), g.tokens_per_second()) {
        (Some(latency), Some(rate)) => println!(
            "generate: {} steps, per-token latency {:.2} ms (median), {:.1} tokens/s ({sequences} sequences)",
            g.call_seconds.len() as i64 * g.steps_per_call,
            latency * 1e3,
            rate
        ),
        _ => println!("generate: no steps (max_target_length = max_prefill_predict_length)"),
    }
}

/// Ids as `decode.py` shows text: separated by spaces.
fn join(ids: &[i32]) -> String {
    ids.iter().map(i32::to_string).collect::<Vec<_>>().join(" ")
}

/// The configured prompts as token ids, checked: each 1..=max_prefill_predict_length ids below
/// vocab_size, at most `batch` prompts. With a tokenizer each prompt is text, encoded with BOS
/// first when `add_bos` (MaxText's `decode.py` encodes with `is_bos=True`; `add_eos` is for
/// training documents and never ends a prompt); otherwise it is ids, or its bytes.
pub fn prompt_ids(c: &Config, batch: usize, encoding: Encoding) -> Result<Vec<Vec<i32>>> {
    if c.prompt.is_empty() {
        bail!("prompt: no prompt given; e.g. prompt=\"1 2 3\" (token ids; a list decodes several)");
    }
    if c.prompt.len() > batch {
        bail!(
            "prompt: {} prompts, but the decode batch is int(devices x per_device_batch_size {}) = {batch} sequences; \
             raise per_device_batch_size or give fewer prompts",
            c.prompt.len(),
            c.per_device_batch_size
        );
    }
    c.prompt
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let ids = match encoding {
                Encoding::Tokenizer(t) => encode(c, t, text)?,
                Encoding::Ids => parse_ids(c, i, text)?,
                Encoding::Bytes => text.bytes().map(i32::from).collect(),
            };
            check_length(c, i, text, ids)
        })
        .collect()
}

/// A text prompt's ids: BOS (with `add_bos`), then the text's.
fn encode(c: &Config, tokenizer: &TextTokenizer, text: &str) -> Result<Vec<i32>> {
    let mut ids: Vec<i32> = tokenizer.bos_id().filter(|_| c.add_bos).into_iter().collect();
    let text_ids = tokenizer
        .encode_text(text)
        .map_err(|e| anyhow!("tokenizer_path={}: prompt {}: {e}", c.tokenizer_path, quote(text)))?;
    ids.extend(text_ids);
    Ok(ids)
}

fn which(c: &Config, index: usize, text: &str) -> String {
    if c.prompt.len() > 1 {
        format!("prompt {index} ({})", quote(text))
    } else {
        format!("prompt {}", quote(text))
    }
}

/// A prompt's ids have 1..=max_prefill_predict_length tokens.
fn check_length(c: &Config, index: usize, text: &str, ids: Vec<i32>) -> Result<Vec<i32>> {
    let which = which(c, index, text);
    if ids.is_empty() {
        bail!("{which} is empty: give at least one token");
    }
    let limit = c.max_prefill_predict_length as usize;
    if ids.len() > limit {
        bail!(
            "{which} has {} tokens, more than max_prefill_predict_length={limit}; shorten it or raise \
             max_prefill_predict_length (below max_target_length={})",
            ids.len(),
            c.max_target_length
        );
    }
    Ok(ids)
}

/// One prompt's ids, written as integers separated by spaces or commas.
fn parse_ids(c: &Config, index: usize, text: &str) -> Result<Vec<i32>> {
    let which = which(c, index, text);
    text.split(|ch: char| ch.is_whitespace() || ch == ',')
        .filter(|word| !word.is_empty())
        .map(|word| {
            word.parse::<i64>().ok().filter(|id| (0..c.vocab_size).contains(id)).map(|id| id as i32).ok_or_else(|| {
                anyhow!(
                    "{which}: {} is not a token id in 0..{}; without tokenizer_path the prompt is token ids \
                     separated by spaces or commas, e.g. prompt=\"1 2 3\" (set tokenizer_path for text)",
                    quote(word),
                    c.vocab_size
                )
            })
        })
        .collect::<Result<Vec<i32>>>()
}
