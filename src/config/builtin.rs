//! The model files compiled into the binary, so that a bare `maxrs train` works from any
//! directory. The files on disk stay the source: these are `include_str!` copies of them. (The
//! built-in `configs/base.yml` is generated from the key declarations, `docs::base_yml`.)

/// `models/<name>.yml`, by name.
pub const MODELS: &[(&str, &str)] = &[
    ("default", include_str!("../../models/default.yml")),
    ("maxtext-default", include_str!("../../models/maxtext-default.yml")),
    ("llama2-7b", include_str!("../../models/llama2-7b.yml")),
    ("llama2-13b", include_str!("../../models/llama2-13b.yml")),
    ("llama2-70b", include_str!("../../models/llama2-70b.yml")),
    ("llama3-8b", include_str!("../../models/llama3-8b.yml")),
    ("llama3-70b", include_str!("../../models/llama3-70b.yml")),
    ("llama3-405b", include_str!("../../models/llama3-405b.yml")),
    ("llama3.1-8b", include_str!("../../models/llama3.1-8b.yml")),
    ("llama3.1-70b", include_str!("../../models/llama3.1-70b.yml")),
    ("llama3.1-405b", include_str!("../../models/llama3.1-405b.yml")),
    ("llama3.3-70b", include_str!("../../models/llama3.3-70b.yml")),
    ("mistral-7b", include_str!("../../models/mistral-7b.yml")),
    ("gemma-2b", include_str!("../../models/gemma-2b.yml")),
    ("gemma-7b", include_str!("../../models/gemma-7b.yml")),
    ("gemma2-2b", include_str!("../../models/gemma2-2b.yml")),
    ("gemma2-9b", include_str!("../../models/gemma2-9b.yml")),
    ("gemma2-27b", include_str!("../../models/gemma2-27b.yml")),
    ("gemma3-4b", include_str!("../../models/gemma3-4b.yml")),
    ("gemma3-12b", include_str!("../../models/gemma3-12b.yml")),
    ("gemma3-27b", include_str!("../../models/gemma3-27b.yml")),
    ("gpt3-175b", include_str!("../../models/gpt3-175b.yml")),
    ("gpt3-22b", include_str!("../../models/gpt3-22b.yml")),
    ("gpt3-6b", include_str!("../../models/gpt3-6b.yml")),
    ("gpt3-52k", include_str!("../../models/gpt3-52k.yml")),
    ("mixtral-8x7b", include_str!("../../models/mixtral-8x7b.yml")),
    ("mixtral-8x22b", include_str!("../../models/mixtral-8x22b.yml")),
    ("qwen2.5-1.5b", include_str!("../../models/qwen2.5-1.5b.yml")),
    ("qwen2.5-7b", include_str!("../../models/qwen2.5-7b.yml")),
    ("qwen2.5-14b", include_str!("../../models/qwen2.5-14b.yml")),
    ("qwen3-0.6b", include_str!("../../models/qwen3-0.6b.yml")),
    ("qwen3-1.7b", include_str!("../../models/qwen3-1.7b.yml")),
    ("qwen3-1.7b-base", include_str!("../../models/qwen3-1.7b-base.yml")),
    ("qwen3-4b", include_str!("../../models/qwen3-4b.yml")),
    ("qwen3-4b-base", include_str!("../../models/qwen3-4b-base.yml")),
    ("qwen3-4b-thinking-2507", include_str!("../../models/qwen3-4b-thinking-2507.yml")),
    ("qwen3-8b", include_str!("../../models/qwen3-8b.yml")),
    ("qwen3-8b-base", include_str!("../../models/qwen3-8b-base.yml")),
    ("qwen3-14b", include_str!("../../models/qwen3-14b.yml")),
    ("qwen3-14b-base", include_str!("../../models/qwen3-14b-base.yml")),
    ("qwen3-32b", include_str!("../../models/qwen3-32b.yml")),
    ("qwen3-30b-a3b", include_str!("../../models/qwen3-30b-a3b.yml")),
    ("qwen3-30b-a3b-base", include_str!("../../models/qwen3-30b-a3b-base.yml")),
    ("qwen3-235b-a22b", include_str!("../../models/qwen3-235b-a22b.yml")),
    ("qwen3-480b-a35b", include_str!("../../models/qwen3-480b-a35b.yml")),
    ("qwen3-custom-30b-a3b", include_str!("../../models/qwen3-custom-30b-a3b.yml")),
    ("deepseek3-671b", include_str!("../../models/deepseek3-671b.yml")),
    ("deepseek3-tiny", include_str!("../../models/deepseek3-tiny.yml")),
    ("deepseek3-test", include_str!("../../models/deepseek3-test.yml")),
    ("deepseek2-16b", include_str!("../../models/deepseek2-16b.yml")),
    ("deepseek2-236b", include_str!("../../models/deepseek2-236b.yml")),
    ("kimi-k2-1t", include_str!("../../models/kimi-k2-1t.yml")),
];

/// The built-in text of `models/<name>.yml`.
pub fn model(name: &str) -> Option<&'static str> {
    MODELS.iter().find(|(n, _)| *n == name).map(|(_, text)| *text)
}
