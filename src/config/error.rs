//! Configuration errors. Each names the culprit key (and where it came from) and, when the
//! mistake looks like a typo, the closest valid spelling.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("malformed argument `{0}`: expected key=value, e.g. steps=100")]
    Malformed(String),

    #[error(
        "unknown key `{key}` {origin}{}",
        suggestion.as_ref().map_or("; configs/base.yml lists the keys maxrs accepts".to_string(), |s| format!("; did you mean `{s}`?"))
    )]
    UnknownKey { key: String, origin: String, suggestion: Option<String> },

    #[error("`{key}` {origin} is MaxText's, but not supported yet: {reason}")]
    NotSupported { key: String, origin: String, reason: &'static str },

    #[error("`{key}` {origin} expects {expected}, got `{value}`")]
    WrongType { key: String, origin: String, expected: String, value: String },

    #[error(
        "`{key}` {origin} is `{value}`, expected one of: {}{}",
        allowed.join(", "),
        hint(suggestion)
    )]
    NotAChoice { key: String, origin: String, value: String, allowed: Vec<String>, suggestion: Option<String> },

    #[error("cannot read {}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },

    #[error("cannot use the YAML {origin}: {message}")]
    Yaml { origin: String, message: String },

    #[error(
        "unknown model `{name}`{} (looked in {searched}); available models: {}",
        hint(suggestion),
        available.join(", ")
    )]
    UnknownModel { name: String, suggestion: Option<String>, searched: String, available: Vec<String> },

    #[error(
        "`{key}` is set to {model_value} by {model_origin} and to {cli_value} on the command line; \
         as in MaxText, add override_model_config=true to change a model's keys"
    )]
    ModelOverride { key: String, model_origin: String, model_value: String, cli_value: String },

    #[error(
        "`{key}` in {model_origin} is not a model key; a model file sets only the model's shape \
         (the keys config::MODEL_KEYS lists): put run settings in the config file or on the command line"
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
    use super::closest;

    #[test]
    fn closest_finds_typos_and_rejects_strangers() {
        let keys = ["per_device_batch_size", "max_target_length", "steps"];
        assert_eq!(closest("per_device_batchsize", keys).as_deref(), Some("per_device_batch_size"));
        assert_eq!(closest("step", keys).as_deref(), Some("steps"));
        assert_eq!(closest("attention", keys), None);
    }
}
