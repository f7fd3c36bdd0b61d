//! Supervised fine-tuning (`use_sft=true`): conversations rendered with the tokenizer's own chat
//! template and tokenized into ids plus the targets the loss sees.
//!
//! # The template
//! The Jinja template comes from `chat_template` (the template itself), else `chat_template_path`
//! (a `.jinja`/`.j2`/`.txt` file, or a `.json` file with a `chat_template` entry, local or
//! `gs://`: maxtext
//! `src/maxtext/input_pipeline/instruction_data_processing.py` `load_chat_template_from_file`,
//! e591f30), else the `chat_template` of the `tokenizer_config.json` beside the tokenizer (a
//! string, or a list of named templates of which `default` is taken, as transformers does). It is
//! rendered by minijinja set up as transformers' `apply_chat_template` sets up Jinja2
//! (`transformers/utils/chat_template_utils.py` `_compile_jinja_template`, v5.24.0):
//! `trim_blocks`, `lstrip_blocks`, loop controls, `raise_exception(msg)`, a `tojson` that writes
//! Python's `json.dumps(ensure_ascii=False)`, Python's string methods (`.strip()`,
//! `.startswith()`, ... through minijinja-contrib's pycompat), and the variables `messages`,
//! `add_generation_prompt`, `bos_token`, `eos_token`, `unk_token`, `pad_token`. A rendering may
//! run [`TEMPLATE_FUEL`] instructions (minijinja's fuel), so a runaway template fails within
//! seconds instead of hanging the run. Errors name the template (`chat template
//! chat_template_path="t.jinja": ...`); the first conversation is rendered before training.
//!
//! # Conversations to ids, as MaxText does
//! maxtext `src/maxtext/input_pipeline/input_pipeline_utils.py` (`apply_chat_template`,
//! `_get_completion_in_chat_template`, `SFTPromptMasking`, e591f30): the messages are cut into
//! rounds (an optional leading system message, user messages, up to an assistant reply). Each
//! user message gives a prompt segment: the round so far rendered with the generation prompt.
//! Each assistant message gives a completion segment: the ids of the round rendered without the
//! generation prompt past their longest common prefix with the ids of the prompt. Segments are
//! tokenized without special tokens added (BOS/EOS come from the template) and concatenated;
//! the targets are the ids, except on prompt segments with `sft_train_on_completion_only`, where
//! they are the pad id (MaxText's `unk_id`, its pad id), which the shift into targets then keeps
//! out of the loss ([`super::batch`]). The conversation is truncated to `max_target_length`.
//! MaxText re-tokenizes the decoded completion; here its ids are kept as they are (the same ids
//! for the recorded templates: tests/data/chat/golden.json).
//!
//! # Rows
//! `train_data_columns` names the columns (MaxText's `validate_and_configure_sft_columns`):
//! `[messages]` (a list of `{role, content}`), `[prompt, completion]` (lists of messages,
//! interleaved turn by turn as MaxText's `combine_columns`; plain strings are taken as one user
//! and one assistant message) or `[question, answer]` (strings: one user and one assistant
//! message, MaxText's `math_qa_formatting` without a template). A conversation without a user
//! or assistant message (ShareGPT's `human`/`gpt` roles, an empty list) gives MaxText an empty
//! row; here it is an undecodable row with the reason: skipped and counted, and files of only
//! such rows are refused, naming the first file, its row and the valid roles.

use std::path::Path;

use minijinja::{Environment, Error, ErrorKind, Value};
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use super::error::DataError;
use super::tokenizer::TextTokenizer;
use crate::input;

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

/// The column layouts SFT reads (see the module docs).
pub const SFT_COLUMNS: &[&[&str]] = &[&["messages"], &["prompt", "completion"], &["question", "answer"]];

/// Checks `columns` is one of [`SFT_COLUMNS`] (in any order).
pub fn check_columns(key: &'static str, columns: &[String]) -> Result<(), DataError> {
    let mut have: Vec<&str> = columns.iter().map(String::as_str).collect();
    have.sort_unstable();
    let known = SFT_COLUMNS.iter().any(|layout| {
        let mut want = layout.to_vec();
        want.sort_unstable();
        want == have
    });
    if known {
        return Ok(());
    }
    Err(DataError::Invalid(format!(
        "{key}={columns:?}: use_sft=true reads the columns [messages], [prompt, completion] or [question, answer]"
    )))
}

/// The conversation of one row (a JSON object), or why it has none.
pub fn conversation(row: &serde_json::Map<String, Json>, columns: &[String]) -> Result<Vec<Message>, String> {
    let field =
        |name: &str| row.get(name).ok_or_else(|| format!("no `{name}` (it has {:?})", row.keys().collect::<Vec<_>>()));
    let messages = |name: &str, value: &Json, role: &str| -> Result<Vec<Message>, String> {
        match value {
            Json::String(text) => Ok(vec![Message { role: role.into(), content: text.clone() }]),
            Json::Array(items) => items
                .iter()
                .map(|m| serde_json::from_value::<Message>(m.clone()))
                .collect::<Result<_, _>>()
                .map_err(|e| format!("`{name}` is not a list of {{role, content}} messages ({e})")),
            Json::Null => Err(format!("`{name}` is null")),
            other => Err(format!("`{name}` is {}, not a list of messages", kind(other))),
        }
    };
    let conversation = match columns {
        [one] => messages(one, field(one)?, "user")?,
        [a, b] => {
            let (first, second) = if a == "completion" || a == "answer" { (b, a) } else { (a, b) };
            let prompt = messages(first, field(first)?, "user")?;
            let reply = messages(second, field(second)?, "assistant")?;
            // MaxText's combine_columns: prompt[i], completion[i], for i over the prompt's turns.
            let mut out = Vec::with_capacity(prompt.len() + reply.len());
            for (i, p) in prompt.into_iter().enumerate() {
                out.push(p);
                out.extend(reply.get(i).cloned());
            }
            out
        }
        _ => return Err(format!("cannot read the columns {columns:?}")),
    };
    trainable(&columns.join(", "), conversation)
}

/// `messages` when it has a message MaxText trains on: its `apply_chat_template`
/// (input_pipeline_utils.py, e591f30) makes segments of the `user` and `assistant` messages only
/// and skips every other role, so a conversation without either gives an empty row.
fn trainable(columns: &str, messages: Vec<Message>) -> Result<Vec<Message>, String> {
    if messages.iter().any(|m| m.role == "user" || m.role == "assistant") {
        return Ok(messages);
    }
    if messages.is_empty() {
        return Err(format!("`{columns}` holds no message; a conversation needs a user or an assistant message"));
    }
    let mut roles: Vec<&str> = Vec::new();
    for message in &messages {
        if !roles.contains(&message.role.as_str()) {
            roles.push(&message.role);
        }
    }
    Err(format!(
        "`{columns}` has no user or assistant message (its roles: {roles:?}); SFT trains on the roles user and \
         assistant (with an optional first system message), as MaxText does; rename ShareGPT's human/gpt to \
         user/assistant"
    ))
}

fn kind(v: &Json) -> &'static str {
    match v {
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::Object(_) => "an object",
        _ => "a value",
    }
}

/// What an SFT stream needs beyond a text stream: the template, the columns, and whether the
/// loss skips the prompts (`sft_train_on_completion_only`).
#[derive(Debug)]
pub struct Sft {
    pub template: ChatTemplate,
    pub columns: Vec<String>,
    pub completion_only: bool,
}

/// Renders and tokenizes the first conversation of the files, so that a template that cannot
/// render the data (or never finishes, [`TEMPLATE_FUEL`]) fails before training, naming the
/// template, the file and why.
pub fn check_first(
    sft: &Sft,
    tokenizer: &TextTokenizer,
    storage: &dyn super::storage::Storage,
    files: &[std::path::PathBuf],
) -> Result<(), DataError> {
    for path in files {
        for doc in super::documents::read_conversations(storage, path, &sft.columns)? {
            if let super::documents::Doc::Chat(messages) = doc? {
                return sft.template.encode(tokenizer, &messages, sft.completion_only, usize::MAX).map(|_| ()).map_err(
                    |why| sft.template.error(format!("cannot render the first conversation of {path:?}: {why}")),
                );
            }
        }
    }
    Ok(())
}

/// Template instructions one rendering may run (minijinja's fuel). The recorded templates
/// (tests/data/chat: Llama 3, Qwen3, Gemma 3, Mistral) spend 25-65 a message, so this renders
/// conversations of tens of thousands of messages, while nested `range(100000)` loops, which
/// would run for hours, stop in about a second (1.2 s in a debug build).
pub const TEMPLATE_FUEL: u64 = 5_000_000;

/// The origin of a template given as text.
const INLINE: &str = "in chat_template";

/// A chat template ready to render, with the tokenizer's special tokens.
pub struct ChatTemplate {
    env: Environment<'static>,
    specials: Vec<(&'static str, Option<String>)>,
    /// Where it came from, for errors: `chat_template_path="t.jinja"`.
    origin: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("origin", &self.origin).field("specials", &self.specials).finish()
    }
}

impl ChatTemplate {
    /// The template the keys name (see the module docs); `tokenizer_path` is where the
    /// tokenizer's files are.
    pub fn load(
        chat_template: &str,
        chat_template_path: &str,
        tokenizer_path: &str,
    ) -> Result<ChatTemplate, DataError> {
        let folder = Path::new(tokenizer_path);
        let folder = if folder.is_dir() { folder } else { folder.parent().unwrap_or(Path::new(".")) };
        let config_path = folder.join("tokenizer_config.json");
        let config = read_json(&config_path)?;
        let (origin, source) = if !chat_template.is_empty() {
            (INLINE.to_string(), chat_template.to_string())
        } else if !chat_template_path.is_empty() {
            (format!("chat_template_path={chat_template_path:?}"), template_file(chat_template_path)?)
        } else {
            match config.as_ref().map(|c| template_of(c, &config_path)).transpose()?.flatten() {
                Some(t) => (format!("of {config_path:?}"), t),
                None => {
                    return Err(DataError::Invalid(format!(
                        "use_sft=true needs a chat template: set chat_template or chat_template_path, or give a \
                         tokenizer whose tokenizer_config.json has one ({} has none)",
                        folder.display()
                    )))
                }
            }
        };
        let special = |key: &str| -> Option<String> {
            match config.as_ref()?.get(key)? {
                Json::String(s) => Some(s.clone()),
                Json::Object(o) => o.get("content")?.as_str().map(str::to_string),
                _ => None,
            }
        };
        let specials = vec![
            ("bos_token", special("bos_token")),
            ("eos_token", special("eos_token")),
            ("unk_token", special("unk_token")),
            ("pad_token", special("pad_token")),
        ];
        Self::compile(origin, source, specials)
    }

    /// The template `source` given as text (as the `chat_template` key gives it), with the special
    /// tokens (name, text).
    pub fn new(source: String, specials: Vec<(&'static str, Option<String>)>) -> Result<ChatTemplate, DataError> {
        Self::compile(INLINE.to_string(), source, specials)
    }

    fn compile(
        origin: String,
        source: String,
        specials: Vec<(&'static str, Option<String>)>,
    ) -> Result<ChatTemplate, DataError> {
        let mut env = Environment::new();
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |message: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, message))
        });
        env.add_filter("tojson", tojson);
        if let Err(e) = env.add_template_owned("chat", source) {
            return Err(DataError::Template { origin, message: format!("not valid Jinja ({e})") });
        }
        Ok(ChatTemplate { env, specials, origin })
    }

    /// An error about this template.
    pub fn error(&self, message: String) -> DataError {
        DataError::Template { origin: self.origin.clone(), message }
    }

    /// transformers' `apply_chat_template(messages, add_generation_prompt=..., tokenize=False)`.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String, String> {
        let mut ctx: Vec<(&str, Value)> = vec![
            ("messages", Value::from_serialize(messages)),
            ("add_generation_prompt", Value::from(add_generation_prompt)),
        ];
        for (name, text) in &self.specials {
            ctx.extend(text.as_ref().map(|t| (*name, Value::from(t.as_str()))));
        }
        let ctx: std::collections::BTreeMap<&str, Value> = ctx.into_iter().collect();
        let template = self.env.get_template("chat").map_err(|e| e.to_string())?;
        template.render(ctx).map_err(|e| match e.kind() {
            ErrorKind::InvalidOperation => format!("the chat template refused it: {}", e.detail().unwrap_or("")),
            ErrorKind::OutOfFuel => format!(
                "the chat template ran more than {TEMPLATE_FUEL} instructions without finishing (a runaway loop?); \
                 chat templates spend under a hundred a message"
            ),
            _ => format!("the chat template failed: {e}"),
        })
    }

    /// MaxText's segments of a conversation: (ids, is the prompt), see the module docs.
    pub fn segments(&self, tokenizer: &TextTokenizer, messages: &[Message]) -> Result<Vec<(Vec<i32>, bool)>, String> {
        self.segments_within(tokenizer, messages, usize::MAX)
    }

    /// The first [`Self::segments`], until they hold `max_len` ids: the rest would be truncated,
    /// and a row of a million messages costs what the run keeps of it.
    fn segments_within(
        &self,
        tokenizer: &TextTokenizer,
        messages: &[Message],
        max_len: usize,
    ) -> Result<Vec<(Vec<i32>, bool)>, String> {
        // Checked over the whole conversation, as MaxText checks it before truncating.
        if let Some(i) = messages.iter().skip(1).position(|m| m.role == "system") {
            return Err(format!("message {} is a system message; only message 0 may be", i + 1));
        }
        let (mut segments, mut held) = (Vec::new(), 0);
        let mut round: Vec<Message> = Vec::new();
        for (i, message) in messages.iter().enumerate() {
            if held >= max_len {
                break;
            }
            let segment = match message.role.as_str() {
                "system" => {
                    round.push(message.clone());
                    continue;
                }
                "user" => {
                    round.push(message.clone());
                    (tokenizer.encode_text(&self.render(&round, true)?)?, true)
                }
                "assistant" => {
                    round.push(message.clone());
                    let full = tokenizer.encode_text(&self.render(&round, false)?)?;
                    let prompt = tokenizer.encode_text(&self.render(&round[..round.len() - 1], true)?)?;
                    let common = full.iter().zip(&prompt).take_while(|(a, b)| a == b).count();
                    if common == 0 {
                        return Err(format!(
                            "message {i}: the rendered reply shares no prefix with the rendered prompt, so where the \
                             completion starts is unknown"
                        ));
                    }
                    round.clear();
                    (full[common..].to_vec(), false)
                }
                // MaxText skips the other roles (tool, ...).
                _ => continue,
            };
            held += segment.0.len();
            segments.push(segment);
        }
        Ok(segments)
    }

    /// A conversation's `(ids, targets)`: targets are the ids, or `pad` on prompt tokens when
    /// `completion_only`; both truncated to `max_len`. Empty when it has no message MaxText uses.
    pub fn encode(
        &self,
        tokenizer: &TextTokenizer,
        messages: &[Message],
        completion_only: bool,
        max_len: usize,
    ) -> Result<(Vec<i32>, Vec<i32>), String> {
        let (mut ids, mut targets) = (Vec::new(), Vec::new());
        for (segment, prompt) in self.segments_within(tokenizer, messages, max_len)? {
            if completion_only && prompt {
                targets.extend(std::iter::repeat_n(tokenizer.pad_id(), segment.len()));
            } else {
                targets.extend_from_slice(&segment);
            }
            ids.extend(segment);
        }
        ids.truncate(max_len);
        targets.truncate(max_len);
        Ok((ids, targets))
    }
}

/// Python's `json.dumps(value, ensure_ascii=False, indent=indent)`, transformers' `tojson`:
/// `", "` and `": "` separators on one line, keys in their order, no HTML escaping.
fn tojson(value: Value, indent: Option<usize>) -> Result<Value, Error> {
    let json: Json =
        serde_json::to_value(&value).map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let mut out = String::new();
    write_json(&json, indent, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

fn write_json(v: &Json, indent: Option<usize>, depth: usize, out: &mut String) {
    let (open_sep, item_sep, close_sep) = match indent {
        Some(n) => (
            format!("\n{}", " ".repeat(n * (depth + 1))),
            format!(",\n{}", " ".repeat(n * (depth + 1))),
            format!("\n{}", " ".repeat(n * depth)),
        ),
        None => (String::new(), ", ".to_string(), String::new()),
    };
    match v {
        Json::Array(items) if !items.is_empty() => {
            out.push('[');
            out.push_str(&open_sep);
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&item_sep);
                }
                write_json(item, indent, depth + 1, out);
            }
            out.push_str(&close_sep);
            out.push(']');
        }
        Json::Object(map) if !map.is_empty() => {
            out.push('{');
            out.push_str(&open_sep);
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(&item_sep);
                }
                out.push_str(&Json::String(k.clone()).to_string());
                out.push_str(": ");
                write_json(item, indent, depth + 1, out);
            }
            out.push_str(&close_sep);
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

fn read_json(path: &Path) -> Result<Option<Json>, DataError> {
    match input::read("tokenizer_path", path, input::SETTINGS) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| DataError::Invalid(format!("{}: not valid JSON ({e})", path.display()))),
        Err(e) if e.is_missing() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The `chat_template` of a tokenizer_config.json: a string, or the `default` of a list of
/// `{name, template}`.
fn template_of(config: &Json, path: &Path) -> Result<Option<String>, DataError> {
    match config.get("chat_template") {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) => Ok(Some(s.clone())),
        Some(Json::Array(named)) => {
            let default = named.iter().find(|t| t.get("name").and_then(Json::as_str) == Some("default"));
            Ok(default.and_then(|t| t.get("template")).and_then(Json::as_str).map(str::to_string))
        }
        Some(_) => Err(DataError::Invalid(format!("{}: chat_template is neither a string nor a list", path.display()))),
    }
}

/// MaxText's `load_chat_template_from_file`: a template file, or a JSON file's `chat_template`;
/// local or `gs://` ([`super::storage::read_whole`]).
fn template_file(path: &str) -> Result<String, DataError> {
    let key = "chat_template_path";
    let bad = |why: String| DataError::Invalid(format!("{key}={path:?}: {why}"));
    let ext = Path::new(path).extension().and_then(|e| e.to_str()).unwrap_or("");
    if !matches!(ext, "jinja" | "j2" | "txt" | "json") {
        return Err(bad("a .jinja, .j2, .txt or .json file (with a chat_template entry)".into()));
    }
    let bytes = super::storage::read_whole(key, path, input::SETTINGS)?;
    let text = String::from_utf8(bytes).map_err(|_| bad("not UTF-8".into()))?;
    if ext != "json" {
        return Ok(text);
    }
    let json: Json = serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON ({e})")))?;
    template_of(&json, Path::new(path))?.ok_or_else(|| bad("the JSON has no chat_template".into()))
}
