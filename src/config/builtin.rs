//! The configuration files compiled into the binary, so that a bare `maxrs train` works from any
//! directory. The files on disk stay the source: these are `include_str!` copies of them.

/// `configs/base.yml`.
pub const BASE_YML: &str = include_str!("../../configs/base.yml");

/// `models/<name>.yml`, by name.
pub const MODELS: &[(&str, &str)] = &[
    ("default", include_str!("../../models/default.yml")),
    ("llama2-7b", include_str!("../../models/llama2-7b.yml")),
    ("llama2-13b", include_str!("../../models/llama2-13b.yml")),
    ("llama2-70b", include_str!("../../models/llama2-70b.yml")),
    ("llama3-8b", include_str!("../../models/llama3-8b.yml")),
    ("llama3-70b", include_str!("../../models/llama3-70b.yml")),
    ("mistral-7b", include_str!("../../models/mistral-7b.yml")),
    ("mixtral-8x7b", include_str!("../../models/mixtral-8x7b.yml")),
    ("mixtral-8x22b", include_str!("../../models/mixtral-8x22b.yml")),
];

/// The built-in text of `models/<name>.yml`.
pub fn model(name: &str) -> Option<&'static str> {
    MODELS.iter().find(|(n, _)| *n == name).map(|(_, text)| *text)
}
