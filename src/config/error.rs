//! Configuration errors. Each names the culprit key (and where it came from) and, when the
//! mistake looks like a typo, the closest valid spelling.

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("malformed argument {}: expected key=value, e.g. steps=100", quote(.0))]
    Malformed(String),

    #[error(
        "unknown key {} {origin}{}",
        quote(key),
        suggestion.as_ref().map_or("; configs/base.yml lists the keys maxrs accepts".to_string(), |s| format!("; did you mean `{s}`?"))
    )]
    UnknownKey { key: String, origin: String, suggestion: Option<String> },

    #[error("`{key}` {origin} is MaxText's, but not supported yet: {reason}")]
    NotSupported { key: String, origin: String, reason: String },

    #[error("`{key}` {origin} expects {expected}, got {}", quote(value))]
    WrongType { key: String, origin: String, expected: String, value: String },

    #[error(
        "`{key}` {origin} is {}, expected one of: {}{}",
        quote(value),
        allowed.join(", "),
        hint(suggestion)
    )]
    NotAChoice { key: String, origin: String, value: String, allowed: Vec<String>, suggestion: Option<String> },

    /// MaxText's loader (OmegaConf's `from_cli`) keeps the last of a repeated `key=value`
    /// silently; maxrs refuses two different values, since one of them is a mistake.
    #[error("`{key}` is given twice on the command line, as {} and as {}; give it once", quote(first), quote(second))]
    Repeated { key: String, first: String, second: String },

    /// A config or model file that is not a readable regular file of sane size.
    #[error(transparent)]
    Input(#[from] crate::input::InputError),

    #[error("cannot use the YAML {origin}: {message}")]
    Yaml { origin: String, message: String },

    #[error(
        "unknown model {}{} (looked in {searched}); available models: {}",
        quote(name),
        hint(suggestion),
        available.iter().map(|a| escape(a)).collect::<Vec<_>>().join(", ")
    )]
    UnknownModel { name: String, suggestion: Option<String>, searched: String, available: Vec<String> },

    #[error(
        "`{key}` is set to {} by {model_origin} and to {} on the command line; \
         as in MaxText, add override_model_config=true to change a model's keys",
        quote(model_value),
        quote(cli_value)
    )]
    ModelOverride { key: String, model_origin: String, model_value: String, cli_value: String },

    #[error(
        "{} in {model_origin} is not a model key; a model file sets only the model's shape \
         (the keys docs/src/reference/keys.md marks \"model file\"): put run settings in the config file or on the command line",
        quote(key)
    )]
    NotAModelKey { key: String, model_origin: String },

    /// Values that are each well-typed but do not fit together (or with the devices).
    #[error("{keys}: {message}")]
    Invalid { keys: String, message: String },
}

impl ConfigError {
    pub(crate) fn invalid(keys: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError::Invalid { keys: keys.into(), message: message.into() }
    }
}

fn hint(suggestion: &Option<String>) -> String {
    match suggestion {
        Some(s) => format!("; did you mean `{s}`?"),
        None => String::new(),
    }
}

/// A value the user wrote, quoted for an error message: `` `value` ``, or, when it holds a
/// character a terminal would not show as itself (a control character such as ESC, CR or NUL,
/// or an invisible formatting one such as a bidirectional override), Rust's debug quoting
/// (`"3\u{1b}[2J"`), so that the value is visible and cannot rewrite the terminal line.
pub fn quote(value: &str) -> String {
    if value.chars().any(hidden) {
        format!("{value:?}")
    } else {
        format!("`{value}`")
    }
}

/// [`quote`]'s escaping without the quotes, for values shown inside a larger text (a list, a
/// `key=value`).
pub fn escape(value: &str) -> String {
    if value.chars().any(hidden) {
        let quoted = format!("{value:?}");
        quoted[1..quoted.len() - 1].to_string()
    } else {
        value.to_string()
    }
}

/// Characters a terminal does not print as themselves: control characters and the invisible
/// format characters (zero-width spaces and joiners, bidirectional marks, overrides and
/// isolates, the byte-order mark).
fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}')
}

/// The candidate closest to `word` by edit distance, if it is close enough to be a likely typo:
/// within a third of the word's length (and at least 2 edits).
pub(crate) fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let budget = (word.chars().count() / 3).max(2);
    candidates
        .into_iter()
        .map(|c| (strsim::levenshtein(word, c), c))
        .filter(|(d, _)| *d <= budget)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c.to_string())
}

#[cfg(test)]
mod tests {
    use super::{closest, escape, quote};

    #[test]
    fn quote_shows_hidden_characters_escaped() {
        assert_eq!(quote("steps"), "`steps`");
        assert_eq!(quote("über"), "`über`");
        assert_eq!(quote("3\u{1b}[2J"), "\"3\\u{1b}[2J\"");
        assert_eq!(quote("a\rb\0"), "\"a\\rb\\0\"");
        assert_eq!(quote("x\u{202e}y"), "\"x\\u{202e}y\"");
        assert_eq!(escape("a\nb"), "a\\nb");
        assert_eq!(escape("plain"), "plain");
    }

    #[test]
    fn closest_finds_typos_and_rejects_strangers() {
        let keys = ["per_device_batch_size", "max_target_length", "steps"];
        assert_eq!(closest("per_device_batchsize", keys).as_deref(), Some("per_device_batch_size"));
        assert_eq!(closest("step", keys).as_deref(), Some("steps"));
        assert_eq!(closest("attention", keys), None);
    }
}
