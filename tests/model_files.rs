//! The built-in model files (`models/<name>.yml`) against the Hugging Face models they mirror,
//! and MaxText's own model files given as config files.
//!
//! Parameter counts: maxrs's (`Model::num_params`, the sum of the parameter shapes: nothing is
//! traced or compiled) equals a count written here from the values of the Hugging Face
//! `config.json` each file mirrors (the repository is named with its values), by the formulas of
//! `llama_count`, `deepseek_count`: Hugging Face's own modules, tensor by tensor. The only
//! differences are MaxText's padded vocabularies (its gemma files), stated per row.

use std::path::{Path, PathBuf};

use maxrs::config;
use maxrs::model::Model;

/// A Llama-like Hugging Face config (`LlamaForCausalLM`, `MistralForCausalLM`,
/// `MixtralForCausalLM`, `Qwen2ForCausalLM`, `Qwen3ForCausalLM`, `Qwen3MoeForCausalLM`, `GemmaForCausalLM`,
/// `Gemma2ForCausalLM`, Gemma 3's text model).
struct Llama {
    vocab: u64,
    hidden: u64,
    layers: u64,
    heads: u64,
    kv_heads: u64,
    head_dim: u64,
    /// `intermediate_size` (dense), or the experts' `moe_intermediate_size` / Mixtral's
    /// `intermediate_size` with `experts > 0`.
    mlp: u64,
    /// `num_local_experts` / `num_experts`; 0: a dense MLP.
    experts: u64,
    /// `tie_word_embeddings`: no separate `lm_head`.
    tied: bool,
    /// Qwen3's and Gemma 3's `q_norm`, `k_norm` (`head_dim` each).
    qk_norm: bool,
    /// OLMo 3's `q_norm` (`heads * head_dim`) and `k_norm` (`kv_heads * head_dim`).
    whole_qk_norm: bool,
    /// Qwen2's `q_proj`, `k_proj`, `v_proj` biases (`o_proj` has none).
    qkv_bias: bool,
    /// RMSNorms per layer: 2 (input, post-attention), 4 for Gemma 2 and 3 (pre/post feedforward).
    norms: u64,
}

/// Hugging Face's tensors: the embedding, per layer q/k/v/o (q/k/v biases for Qwen2), the norms, a gated MLP
/// (gate, up, down) or a router `[experts, hidden]` with that many gated experts; the final norm
/// and the `lm_head` unless tied.
fn llama_count(h: &Llama) -> u64 {
    let attention = h.hidden * h.head_dim * (2 * h.heads + 2 * h.kv_heads)
        + if h.qk_norm { 2 * h.head_dim } else { 0 }
        + if h.whole_qk_norm { (h.heads + h.kv_heads) * h.head_dim } else { 0 }
        + if h.qkv_bias { h.head_dim * (h.heads + 2 * h.kv_heads) } else { 0 };
    let ffn = match h.experts {
        0 => 3 * h.hidden * h.mlp,
        e => h.hidden * e + e * 3 * h.hidden * h.mlp,
    };
    let layer = attention + ffn + h.norms * h.hidden;
    let embeddings = h.vocab * h.hidden * if h.tied { 1 } else { 2 };
    h.layers * layer + embeddings + h.hidden
}

/// A DeepSeek-V2/V3 Hugging Face config (`DeepseekV2ForCausalLM`, `DeepseekV3ForCausalLM`; Kimi
/// K2 is the latter).
struct DeepSeek {
    vocab: u64,
    hidden: u64,
    layers: u64,
    /// `first_k_dense_replace`.
    dense_layers: u64,
    heads: u64,
    /// `q_lora_rank`; 0 for `null` (a plain `q_proj`).
    q_lora: u64,
    kv_lora: u64,
    nope: u64,
    rope: u64,
    v: u64,
    /// `intermediate_size` (the dense layers' MLP).
    mlp: u64,
    /// `moe_intermediate_size`.
    moe_mlp: u64,
    /// `n_routed_experts`.
    experts: u64,
    /// `n_shared_experts`.
    shared: u64,
    /// `topk_method: noaux_tc`: the gate's `e_score_correction_bias` `[experts]`.
    bias: bool,
}

/// Hugging Face's `DeepseekV3Attention` (q_a_proj, q_a_layernorm, q_b_proj or q_proj;
/// kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj; o_proj), two norms per layer, the dense MLP or
/// the gate, the routed experts and the shared MLP (`n_shared_experts x moe_intermediate_size`
/// wide); embedding, final norm, untied `lm_head`. The multi-token-prediction layer of the
/// checkpoints (`num_nextn_predict_layers`) is not one of `num_hidden_layers`, so not counted.
fn deepseek_count(h: &DeepSeek) -> u64 {
    let qk = h.nope + h.rope;
    let q = match h.q_lora {
        0 => h.hidden * h.heads * qk,
        r => h.hidden * r + r + r * h.heads * qk,
    };
    let kv = h.hidden * (h.kv_lora + h.rope) + h.kv_lora + h.kv_lora * h.heads * (h.nope + h.v);
    let attention = q + kv + h.heads * h.v * h.hidden + 2 * h.hidden;
    let dense = 3 * h.hidden * h.mlp;
    let routed = h.hidden * h.experts
        + if h.bias { h.experts } else { 0 }
        + h.experts * 3 * h.hidden * h.moe_mlp
        + 3 * h.hidden * h.shared * h.moe_mlp;
    h.layers * attention
        + h.dense_layers * dense
        + (h.layers - h.dense_layers) * routed
        + 2 * h.vocab * h.hidden
        + h.hidden
}

const fn dense(vocab: u64, hidden: u64, layers: u64, heads: u64, kv_heads: u64, mlp: u64, tied: bool) -> Llama {
    Llama {
        vocab,
        hidden,
        layers,
        heads,
        kv_heads,
        head_dim: 128,
        mlp,
        experts: 0,
        tied,
        qk_norm: false,
        whole_qk_norm: false,
        qkv_bias: false,
        norms: 2,
    }
}

const fn qwen2(vocab: u64, hidden: u64, layers: u64, heads: u64, kv_heads: u64, mlp: u64, tied: bool) -> Llama {
    Llama { qkv_bias: true, ..dense(vocab, hidden, layers, heads, kv_heads, mlp, tied) }
}

const fn qwen3(hidden: u64, layers: u64, heads: u64, kv_heads: u64, mlp: u64, tied: bool) -> Llama {
    Llama { qk_norm: true, ..dense(151936, hidden, layers, heads, kv_heads, mlp, tied) }
}

const fn qwen3_moe(hidden: u64, layers: u64, heads: u64, kv_heads: u64, moe_mlp: u64, experts: u64) -> Llama {
    Llama { experts, ..qwen3(hidden, layers, heads, kv_heads, moe_mlp, false) }
}

const fn gemma(hidden: u64, layers: u64, heads: u64, kv_heads: u64, head_dim: u64, mlp: u64, norms: u64) -> Llama {
    Llama { head_dim, norms, ..dense(256000, hidden, layers, heads, kv_heads, mlp, true) }
}

const fn gemma3(hidden: u64, layers: u64, heads: u64, kv_heads: u64, head_dim: u64, mlp: u64) -> Llama {
    Llama { vocab: 262208, qk_norm: true, ..gemma(hidden, layers, heads, kv_heads, head_dim, mlp, 4) }
}

/// OLMo 3 (`Olmo3ForCausalLM`): untied, vocabulary 100278, two norms per layer (after attention
/// and after the MLP).
const fn olmo3(hidden: u64, layers: u64, heads: u64, kv_heads: u64, mlp: u64) -> Llama {
    Llama { whole_qk_norm: true, ..dense(100278, hidden, layers, heads, kv_heads, mlp, false) }
}

/// A gpt-oss Hugging Face config (`GptOssForCausalLM`): head_dim 64, vocabulary 201088, width
/// 2880 for the embedding and the experts alike.
struct GptOss {
    layers: u64,
    /// `num_local_experts`.
    experts: u64,
}

/// Hugging Face's gpt-oss tensors per layer: q/k/v/o with biases, a sink per head, two norms, the
/// router (weight and bias) and the stacked experts (`gate_up_proj` `[X, E, 2M]`, `down_proj`
/// `[X, M, E]`, their biases); embedding, final norm, untied `lm_head`.
fn gpt_oss_count(h: &GptOss) -> u64 {
    let (vocab, hidden, heads, kv_heads, head_dim, mlp, x) = (201088, 2880, 64, 8, 64, 2880, h.experts);
    let attention = hidden * head_dim * (2 * heads + 2 * kv_heads) + head_dim * (heads + 2 * kv_heads) + hidden + heads;
    let experts = hidden * x + x + x * (hidden * 2 * mlp + 2 * mlp + mlp * hidden + hidden);
    h.layers * (attention + experts + 2 * hidden) + 2 * vocab * hidden + hidden
}

/// A Llama 4 Hugging Face text config (`Llama4ForCausalLM`'s `text_config` of Scout and Maverick):
/// width 5120, 48 layers, 40 heads, 8 key/value heads of 128, vocabulary 202048, experts and the
/// shared one `intermediate_size` 8192 wide, dense layers `intermediate_size_mlp` 16384 wide.
struct Llama4Text {
    /// `num_local_experts`.
    experts: u64,
    /// `interleave_moe_layer_step`: every such layer is an MoE layer.
    moe_step: u64,
}

/// Hugging Face's Llama 4 text tensors per layer: q/k/v/o, two norms, and the router `[X, E]`,
/// the stacked experts (`gate_up_proj` `[X, E, 2M]`, `down_proj` `[X, M, E]`) and the shared
/// expert (gate, up, down) in MoE layers, or a gated MLP of `intermediate_size_mlp`; embedding,
/// final norm, untied `lm_head`.
fn llama4_count(h: &Llama4Text) -> u64 {
    let (vocab, hidden, layers, heads, kv_heads, head_dim, moe_mlp, mlp) = (202048, 5120, 48, 40, 8, 128, 8192, 16384);
    let attention = hidden * head_dim * (2 * heads + 2 * kv_heads);
    let moe = hidden * h.experts + h.experts * 3 * hidden * moe_mlp + 3 * hidden * moe_mlp;
    let moe_layers = layers / h.moe_step;
    let ffn = moe_layers * moe + (layers - moe_layers) * 3 * hidden * mlp;
    layers * (attention + 2 * hidden) + ffn + 2 * vocab * hidden + hidden
}

/// A Gemma 4 Hugging Face text config (`Gemma4TextConfig` of google/gemma-4-31b-it and
/// google/gemma-4-26b-a4b-it): vocabulary 262144, heads of 256 in the sliding layers and of
/// `global_head_dim` 512 in every 6th (full) one, whose values are their keys
/// (`attention_k_eq_v`) with `num_global_key_value_heads`; with `num_experts`, experts
/// `moe_intermediate_size` wide beside the dense MLP.
struct Gemma4Text {
    hidden: u64,
    layers: u64,
    heads: u64,
    kv_heads: u64,
    global_kv_heads: u64,
    mlp: u64,
    experts: u64,
    moe_mlp: u64,
}

/// Hugging Face's Gemma 4 text tensors per layer: q/k/v/o (no v in a full layer), q_norm and
/// k_norm (the value norm has no weight), four norms, the MLP, `layer_scalar`; with experts the
/// router (`proj` `[X, E]`, `scale` `[E]`, `per_expert_scale` `[X]`), the stacked experts
/// (`gate_up_proj` `[X, 2M, E]`, `down_proj` `[X, E, M]`) and three more norms; the embedding
/// (tied) and the final norm.
fn gemma4_count(h: &Gemma4Text) -> u64 {
    let (vocab, head, global_head) = (262144, 256, 512);
    let attention = |d: u64, kv: u64, values: u64| h.hidden * d * (2 * h.heads + (1 + values) * kv) + 2 * d;
    let mut ffn = 3 * h.hidden * h.mlp + 4 * h.hidden + 1;
    if h.experts > 0 {
        ffn += h.hidden * h.experts + h.hidden + h.experts + h.experts * 3 * h.hidden * h.moe_mlp + 3 * h.hidden;
    }
    let globals = h.layers / 6;
    (h.layers - globals) * (attention(head, h.kv_heads, 1) + ffn)
        + globals * (attention(global_head, h.global_kv_heads, 0) + ffn)
        + vocab * h.hidden
        + h.hidden
}

/// A Gemma 4 small Hugging Face text config (`Gemma4TextConfig` of google/gemma-4-e2b-it and
/// google/gemma-4-e4b-it): 8 heads of 256 in the sliding layers and of 512 in every `period`-th
/// (full) one, the last `shared` layers without key/value projections (`num_kv_shared_layers`),
/// twice `mlp` wide with `use_double_wide_mlp`, per-layer inputs 256 wide from 262144 rows.
struct Gemma4SmallText {
    hidden: u64,
    layers: u64,
    kv_heads: u64,
    mlp: u64,
    period: u64,
    shared: u64,
    double_wide: bool,
}

/// Hugging Face's Gemma 4 small text tensors: per layer q/o and q_norm, k/v and k_norm (not in a
/// sharing layer), the MLP, four norms, `layer_scalar`, `per_layer_input_gate`,
/// `per_layer_projection` and `post_per_layer_input_norm`; the embedding (tied),
/// `embed_tokens_per_layer`, `per_layer_model_projection`, `per_layer_projection_norm`, the
/// final norm.
fn gemma4_small_count(h: &Gemma4SmallText) -> u64 {
    let (vocab, heads, width) = (262144, 8, 256);
    let mut n = vocab * h.hidden + vocab * h.layers * width + h.layers * width * h.hidden + width + h.hidden;
    for j in 0..h.layers {
        let d = if (j + 1) % h.period == 0 { 512 } else { 256 };
        let shares = j >= h.layers - h.shared;
        let mlp = if shares && h.double_wide { 2 * h.mlp } else { h.mlp };
        n += 2 * heads * d * h.hidden + d + 3 * h.hidden * mlp + 4 * h.hidden + 1 + 2 * width * h.hidden + h.hidden;
        if !shares {
            n += 2 * h.kv_heads * d * h.hidden + d;
        }
    }
    n
}

enum Hf {
    Llama(Llama),
    DeepSeek(DeepSeek),
    GptOss(GptOss),
    Llama4(Llama4Text),
    Gemma4(Gemma4Text),
    Gemma4Small(Gemma4SmallText),
}

/// Each model name, the Hugging Face repository whose `config.json` it mirrors, that config's
/// values, and MaxText's vocabulary where its file pads Hugging Face's (the embedding then has
/// `(padded - vocab) x hidden` more parameters).
fn mirrors() -> Vec<(&'static str, &'static str, Hf, Option<u64>)> {
    use Hf::{DeepSeek as D, GptOss as G, Llama as L, Llama4 as L4};
    let llama2 = |hidden, layers, heads, kv_heads, mlp| L(dense(32000, hidden, layers, heads, kv_heads, mlp, false));
    let llama3 = |hidden, layers, heads, mlp| L(dense(128256, hidden, layers, heads, 8, mlp, false));
    vec![
        ("llama2-7b", "meta-llama/Llama-2-7b-hf", llama2(4096, 32, 32, 32, 11008), None),
        ("llama2-13b", "meta-llama/Llama-2-13b-hf", llama2(5120, 40, 40, 40, 13824), None),
        ("llama2-70b", "meta-llama/Llama-2-70b-hf", llama2(8192, 80, 64, 8, 28672), None),
        ("llama3-8b", "meta-llama/Meta-Llama-3-8B", llama3(4096, 32, 32, 14336), None),
        ("llama3-70b", "meta-llama/Meta-Llama-3-70B", llama3(8192, 80, 64, 28672), None),
        ("llama3-405b", "meta-llama/Llama-3.1-405B", llama3(16384, 126, 128, 53248), None),
        ("llama3.1-8b", "meta-llama/Llama-3.1-8B", llama3(4096, 32, 32, 14336), None),
        ("llama3.1-70b", "meta-llama/Llama-3.1-70B", llama3(8192, 80, 64, 28672), None),
        ("llama3.1-405b", "meta-llama/Llama-3.1-405B", llama3(16384, 126, 128, 53248), None),
        ("llama3.3-70b", "meta-llama/Llama-3.3-70B-Instruct", llama3(8192, 80, 64, 28672), None),
        ("mistral-7b", "mistralai/Mistral-7B-v0.1", llama2(4096, 32, 32, 8, 14336), None),
        (
            "mixtral-8x7b",
            "mistralai/Mixtral-8x7B-v0.1",
            L(Llama { experts: 8, ..dense(32000, 4096, 32, 32, 8, 14336, false) }),
            None,
        ),
        (
            "mixtral-8x22b",
            "mistralai/Mixtral-8x22B-Instruct-v0.1",
            L(Llama { experts: 8, ..dense(32768, 6144, 56, 48, 8, 16384, false) }),
            None,
        ),
        ("gemma-2b", "google/gemma-2b", L(gemma(2048, 18, 8, 1, 256, 16384, 2)), Some(256128)),
        ("gemma-7b", "google/gemma-7b", L(gemma(3072, 28, 16, 16, 256, 24576, 2)), Some(256128)),
        ("gemma2-2b", "google/gemma-2-2b", L(gemma(2304, 26, 8, 4, 256, 9216, 4)), Some(256128)),
        ("gemma2-9b", "google/gemma-2-9b", L(gemma(3584, 42, 16, 8, 256, 14336, 4)), Some(256128)),
        ("gemma2-27b", "google/gemma-2-27b", L(gemma(4608, 46, 32, 16, 128, 36864, 4)), Some(256128)),
        // Gemma 3's `text_config` (the vision tower is not maxrs's).
        ("gemma3-4b", "google/gemma-3-4b-pt", L(gemma3(2560, 34, 8, 4, 256, 10240)), Some(262144)),
        ("gemma3-12b", "google/gemma-3-12b-pt", L(gemma3(3840, 48, 16, 8, 256, 15360)), Some(262144)),
        ("gemma3-27b", "google/gemma-3-27b-pt", L(gemma3(5376, 62, 32, 16, 128, 21504)), Some(262144)),
        // Qwen2.5-1.5B ties its embeddings (`tie_word_embeddings: true`), as MaxText's
        // qwen2.5-1.5b.yml does (`logits_via_embedding: true`): no `lm_head` there.
        ("qwen2.5-1.5b", "Qwen/Qwen2.5-1.5B", L(qwen2(151936, 1536, 28, 12, 2, 8960, true)), None),
        ("qwen2.5-7b", "Qwen/Qwen2.5-7B", L(qwen2(152064, 3584, 28, 28, 4, 18944, false)), None),
        ("qwen2.5-14b", "Qwen/Qwen2.5-14B", L(qwen2(152064, 5120, 48, 40, 8, 13824, false)), None),
        ("qwen3-0.6b", "Qwen/Qwen3-0.6B", L(qwen3(1024, 28, 16, 8, 3072, true)), None),
        ("qwen3-1.7b", "Qwen/Qwen3-1.7B", L(qwen3(2048, 28, 16, 8, 6144, true)), None),
        ("qwen3-1.7b-base", "Qwen/Qwen3-1.7B-Base", L(qwen3(2048, 28, 16, 8, 6144, true)), None),
        ("qwen3-4b", "Qwen/Qwen3-4B", L(qwen3(2560, 36, 32, 8, 9728, true)), None),
        ("qwen3-4b-base", "Qwen/Qwen3-4B-Base", L(qwen3(2560, 36, 32, 8, 9728, true)), None),
        ("qwen3-4b-thinking-2507", "Qwen/Qwen3-4B-Thinking-2507", L(qwen3(2560, 36, 32, 8, 9728, true)), None),
        ("qwen3-8b", "Qwen/Qwen3-8B", L(qwen3(4096, 36, 32, 8, 12288, false)), None),
        ("qwen3-8b-base", "Qwen/Qwen3-8B-Base", L(qwen3(4096, 36, 32, 8, 12288, false)), None),
        ("qwen3-14b", "Qwen/Qwen3-14B", L(qwen3(5120, 40, 40, 8, 17408, false)), None),
        ("qwen3-14b-base", "Qwen/Qwen3-14B-Base", L(qwen3(5120, 40, 40, 8, 17408, false)), None),
        ("qwen3-32b", "Qwen/Qwen3-32B", L(qwen3(5120, 64, 64, 8, 25600, false)), None),
        ("olmo3-7b", "allenai/Olmo-3-7B-Instruct", L(olmo3(4096, 32, 32, 32, 11008)), None),
        ("olmo3-7b-pt", "allenai/Olmo-3-1025-7B", L(olmo3(4096, 32, 32, 32, 11008)), None),
        ("olmo3-32b", "allenai/Olmo-3.1-32B-Instruct", L(olmo3(5120, 64, 40, 8, 27648)), None),
        ("qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B", L(qwen3_moe(2048, 48, 32, 4, 768, 128)), None),
        ("qwen3-30b-a3b-base", "Qwen/Qwen3-30B-A3B-Base", L(qwen3_moe(2048, 48, 32, 4, 768, 128)), None),
        ("qwen3-235b-a22b", "Qwen/Qwen3-235B-A22B", L(qwen3_moe(4096, 94, 64, 4, 1536, 128)), None),
        ("qwen3-480b-a35b", "Qwen/Qwen3-Coder-480B-A35B-Instruct", L(qwen3_moe(6144, 62, 96, 8, 2560, 160)), None),
        (
            "deepseek2-16b",
            "deepseek-ai/DeepSeek-V2-Lite",
            D(DeepSeek {
                vocab: 102400,
                hidden: 2048,
                layers: 27,
                dense_layers: 1,
                heads: 16,
                q_lora: 0,
                kv_lora: 512,
                nope: 128,
                rope: 64,
                v: 128,
                mlp: 10944,
                moe_mlp: 1408,
                experts: 64,
                shared: 2,
                bias: false,
            }),
            None,
        ),
        (
            "deepseek2-236b",
            "deepseek-ai/DeepSeek-V2",
            D(DeepSeek {
                vocab: 102400,
                hidden: 5120,
                layers: 60,
                dense_layers: 1,
                heads: 128,
                q_lora: 1536,
                kv_lora: 512,
                nope: 128,
                rope: 64,
                v: 128,
                mlp: 12288,
                moe_mlp: 1536,
                experts: 160,
                shared: 2,
                bias: false,
            }),
            None,
        ),
        ("deepseek3-671b", "deepseek-ai/DeepSeek-V3", D(v3(7168, 128, 256, 3)), None),
        ("kimi-k2-1t", "moonshotai/Kimi-K2-Instruct", D(DeepSeek { vocab: 163840, ..v3(7168, 64, 384, 1) }), None),
        ("gpt-oss-20b", "openai/gpt-oss-20b", G(GptOss { layers: 24, experts: 32 }), None),
        ("gpt-oss-120b", "openai/gpt-oss-120b", G(GptOss { layers: 36, experts: 128 }), None),
        // The text model of each (the vision tower is not maxrs's).
        ("llama4-17b-16e", "meta-llama/Llama-4-Scout-17B-16E", L4(Llama4Text { experts: 16, moe_step: 1 }), None),
        ("llama4-17b-128e", "meta-llama/Llama-4-Maverick-17B-128E", L4(Llama4Text { experts: 128, moe_step: 2 }), None),
        (
            "gemma4-31b",
            "google/gemma-4-31b-it",
            Hf::Gemma4(Gemma4Text {
                hidden: 5376,
                layers: 60,
                heads: 32,
                kv_heads: 16,
                global_kv_heads: 4,
                mlp: 21504,
                experts: 0,
                moe_mlp: 0,
            }),
            None,
        ),
        (
            "gemma4-26b",
            "google/gemma-4-26b-a4b-it",
            Hf::Gemma4(Gemma4Text {
                hidden: 2816,
                layers: 30,
                heads: 16,
                kv_heads: 8,
                global_kv_heads: 2,
                mlp: 2112,
                experts: 128,
                moe_mlp: 704,
            }),
            None,
        ),
        (
            "gemma4-e2b",
            "google/gemma-4-e2b-it",
            Hf::Gemma4Small(Gemma4SmallText {
                hidden: 1536,
                layers: 35,
                kv_heads: 1,
                mlp: 6144,
                period: 5,
                shared: 20,
                double_wide: true,
            }),
            None,
        ),
        (
            "gemma4-e4b",
            "google/gemma-4-e4b-it",
            Hf::Gemma4Small(Gemma4SmallText {
                hidden: 2560,
                layers: 42,
                kv_heads: 2,
                mlp: 10240,
                period: 6,
                shared: 18,
                double_wide: false,
            }),
            None,
        ),
    ]
}

/// DeepSeek-V3's config with `hidden`, `heads`, `experts` and `first_k_dense_replace` as given.
const fn v3(hidden: u64, heads: u64, experts: u64, dense_layers: u64) -> DeepSeek {
    DeepSeek {
        vocab: 129280,
        hidden,
        layers: 61,
        dense_layers,
        heads,
        q_lora: 1536,
        kv_lora: 512,
        nope: 128,
        rope: 64,
        v: 128,
        mlp: 18432,
        moe_mlp: 2048,
        experts,
        shared: 1,
        bias: true,
    }
}

/// The model files no Hugging Face model has: MaxText's test sizes of DeepSeek-V3 (counted by
/// the same formula with their files' values), GPT-3 (OpenAI published no checkpoint; MaxText's
/// sizes are its own), MaxText's qwen3-custom-30b-a3b (counted by its own formula below) and
/// maxrs's `default` / `maxtext-default` (MaxText's base.yml model).
const WITHOUT_HF: &[&str] = &[
    "deepseek3-tiny",
    "deepseek3-test",
    "gpt3-175b",
    "gpt3-22b",
    "gpt3-6b",
    "gpt3-52k",
    "qwen3-custom-30b-a3b",
    "default",
    "maxtext-default",
];

/// The model files MaxText runs only with `scan_layers=false` (`decoder_block: gemma4_small`,
/// `src/maxtext/configs/types.py:3945` at e591f30), loaded so here.
const UNSCANNED: &[&str] = &["gemma4-e2b", "gemma4-e4b"];

fn model(name: &str, overrides: &[&str]) -> Result<Model, String> {
    let mut keys = vec![format!("model_name={name}")];
    keys.extend(overrides.iter().map(|s| s.to_string()));
    let c = config::load(None, &keys).map_err(|e| e.to_string())?;
    config::validate(&c, 1, 1).map_err(|e| e.to_string())?;
    Model::from_config(&c).map_err(|e| e.to_string())
}

fn num_params(name: &str) -> u64 {
    let overrides: &[&str] = if UNSCANNED.contains(&name) { &["scan_layers=false"] } else { &[] };
    model(name, overrides).unwrap_or_else(|e| panic!("{name}: {e}")).num_params()
}

#[test]
fn every_model_file_has_its_hugging_face_parameter_count() {
    let rows = mirrors();
    let mut failures = Vec::new();
    for (name, repo, hf, padded) in &rows {
        let (mut want, hidden, vocab) = match hf {
            Hf::Llama(h) => (llama_count(h), h.hidden, h.vocab),
            Hf::DeepSeek(h) => (deepseek_count(h), h.hidden, h.vocab),
            Hf::GptOss(h) => (gpt_oss_count(h), 2880, 201088),
            Hf::Llama4(h) => (llama4_count(h), 5120, 202048),
            Hf::Gemma4(h) => (gemma4_count(h), h.hidden, 262144),
            Hf::Gemma4Small(h) => (gemma4_small_count(h), h.hidden, 262144),
        };
        // MaxText's gemma files pad the vocabulary to 256128 (Hugging Face: 256000); its gemma3
        // files take 262144 of Hugging Face's 262208 rows.
        if let Some(padded) = padded {
            want = want + padded * hidden - vocab * hidden;
        }
        let got = num_params(name);
        if got != want {
            failures.push(format!("{name} ({repo}): maxrs {got}, Hugging Face {want}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Every model file (models/*.yml, which the binary compiles in) is checked here or listed as
    // having no Hugging Face model.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("models");
    let mut unchecked: Vec<String> = std::fs::read_dir(&dir)
        .expect("models/ is listed")
        .map(|entry| entry.expect("a models/ entry").path())
        .filter_map(|path| Some(path.file_name()?.to_str()?.strip_suffix(".yml")?.to_string()))
        .filter(|name| !rows.iter().any(|r| r.0 == name) && !WITHOUT_HF.contains(&name.as_str()))
        .collect();
    unchecked.sort();
    assert!(unchecked.is_empty(), "model files without a parameter count check: {unchecked:?}");
}

/// The sizes the model cards state, as a check on the formulas' inputs: DeepSeek-V3 "671B total
/// parameters" (without its 14B multi-token-prediction module), Kimi K2 "1 trillion", DeepSeek-V2
/// "236B", V2-Lite "15.7B", Qwen3-30B-A3B "30.5B", Qwen3-235B-A22B "235B", Qwen3-Coder-480B
/// "480B", Llama 2 70B "70B", Qwen2.5-1.5B "1.54B", Qwen2.5-7B "7.61B", Qwen2.5-14B "14.7B",
/// gpt-oss-20b "21B", gpt-oss-120b "117B".
#[test]
fn model_card_sizes() {
    let billions = |name: &str| num_params(name) as f64 / 1e9;
    for (name, card, tolerance) in [
        ("deepseek3-671b", 671.0, 1.0),
        ("kimi-k2-1t", 1000.0, 30.0),
        ("deepseek2-236b", 236.0, 1.0),
        ("deepseek2-16b", 15.7, 0.1),
        ("qwen3-30b-a3b", 30.5, 0.1),
        ("qwen3-235b-a22b", 235.0, 0.5),
        ("qwen3-480b-a35b", 480.0, 1.0),
        ("llama2-70b", 70.0, 1.1),
        ("qwen2.5-1.5b", 1.54, 0.01),
        ("qwen2.5-7b", 7.61, 0.01),
        ("qwen2.5-14b", 14.7, 0.1),
        ("gpt-oss-20b", 21.0, 0.1),
        ("gpt-oss-120b", 117.0, 0.3),
    ] {
        let b = billions(name);
        assert!((b - card).abs() <= tolerance, "{name}: {b:.2}B, its card says {card}B");
    }
}

/// The DeepSeek-V3 test sizes by the formula with their files' values (MaxText's
/// `deepseek3-tiny.yml` and `deepseek3-test.yml` at e591f30: V3 with a smaller width, experts and
/// latent ranks).
#[test]
fn deepseek3_test_sizes() {
    let tiny = DeepSeek { q_lora: 32, kv_lora: 16, mlp: 64, moe_mlp: 64, ..v3(64, 4, 16, 3) };
    assert_eq!(num_params("deepseek3-tiny"), deepseek_count(&tiny));
    let test = DeepSeek { moe_mlp: 512, ..v3(512, 128, 256, 3) };
    assert_eq!(num_params("deepseek3-test"), deepseek_count(&test));
}

/// qwen3-custom-30b-a3b by a formula with its file's values (MaxText's
/// `qwen3-custom-30b-a3b.yml` at e591f30; the layer's parameters as `qwen3_custom.py` creates
/// them): per layer the pre-attention norm, query/key/value from emb, the output projection to
/// attention_output_dim, the QK-norms, the unused post-attention norm `AttentionWithNorm` creates,
/// `latent_norm`, the gate and experts on attention_output_dim, `layer_up_projection`; the
/// untied embedding and output projection and the final norm.
#[test]
fn qwen3_custom_size() {
    let (vocab, emb, layers, heads, kv_heads, head_dim) = (151936u64, 2048u64, 48u64, 16u64, 2u64, 256u64);
    let (latent, experts, moe_mlp) = (768u64, 128u64, 2048u64);
    let attention = emb * (heads + 2 * kv_heads) * head_dim + heads * head_dim * latent + 2 * head_dim;
    let moe = latent * experts + experts * 3 * latent * moe_mlp;
    let layer = emb + attention + emb + latent + moe + latent * emb;
    let want = 2 * vocab * emb + layers * layer + emb;
    assert_eq!(num_params("qwen3-custom-30b-a3b"), want);
    println!("qwen3-custom-30b-a3b: {:.2}B parameters", want as f64 / 1e9);
}

/// `base_moe_mlp_dim` sizes qwen3_moe's experts (MaxText's qwen3.py reads `moe_mlp_dim`), also
/// where it differs from `base_mlp_dim`; unset, the experts are `base_mlp_dim` wide. Mixtral's
/// experts are `base_mlp_dim` wide, which a set `base_moe_mlp_dim` must equal (types.py).
#[test]
fn base_moe_mlp_dim_sizes_the_experts() {
    let qwen3_moe = [
        "decoder_block=qwen3_moe",
        "base_emb_dim=64",
        "base_num_query_heads=4",
        "base_num_kv_heads=2",
        "head_dim=16",
        "base_num_decoder_layers=2",
        "base_mlp_dim=96",
        "num_experts=4",
        "num_experts_per_tok=2",
        "vocab_size=128",
        "use_qk_norm=true",
        "logits_via_embedding=false",
    ];
    let with = |extra: &[&str]| model("default", &[&qwen3_moe[..], extra].concat());
    let wi_0 = |m: &Model| m.param_defs().into_iter().find(|d| d.name.ends_with("moe_block.wi_0")).map(|d| d.shape);
    let routed = with(&["base_moe_mlp_dim=40"]).expect("qwen3_moe with base_moe_mlp_dim");
    assert_eq!(wi_0(&routed), Some(vec![2, 4, 64, 40]));
    let unset = with(&[]).expect("qwen3_moe without base_moe_mlp_dim");
    assert_eq!(wi_0(&unset), Some(vec![2, 4, 64, 96]));
    let count = |moe_mlp: u64| {
        llama_count(&Llama {
            vocab: 128,
            hidden: 64,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            mlp: moe_mlp,
            experts: 4,
            tied: false,
            qk_norm: true,
            whole_qk_norm: false,
            qkv_bias: false,
            norms: 2,
        })
    };
    assert_eq!((routed.num_params(), unset.num_params()), (count(40), count(96)));

    let mixtral = ["decoder_block=mixtral", "num_experts=4", "num_experts_per_tok=2", "base_mlp_dim=96"];
    let err = model("default", &[&mixtral[..], &["base_moe_mlp_dim=40"]].concat()).expect_err("mixtral refuses");
    assert!(err.starts_with("base_moe_mlp_dim: base_moe_mlp_dim=40: decoder_block=mixtral"), "{err}");
    assert!(model("default", &[&mixtral[..], &["base_moe_mlp_dim=96"]].concat()).is_ok());
}

/// `norm_topk_prob` is read where MaxText's `get_topk` reads it (mixtral, qwen3_moe); deepseek's
/// routing ignores it in MaxText, so maxrs refuses it there by name.
#[test]
fn norm_topk_prob_is_a_mixtral_and_qwen3_moe_key() {
    let moe = ["num_experts=4", "num_experts_per_tok=2", "norm_topk_prob=true"];
    for block in ["mixtral", "qwen3_moe"] {
        let block = format!("decoder_block={block}");
        model("default", &[&moe[..], &[block.as_str()]].concat()).unwrap_or_else(|e| panic!("{block}: {e}"));
    }
    let err = model("deepseek3-tiny", &["norm_topk_prob=true"]).expect_err("deepseek does not read it");
    assert!(err.contains("norm_topk_prob") && err.contains("decoder_block=deepseek"), "{err}");
}

fn maxtext_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/maxtext_models").join(format!("{name}.yml"))
}

/// MaxText's own model files (tests/data/maxtext_models/, copied verbatim from
/// `src/maxtext/configs/models/` at e591f30), given as the config file, load and give every key
/// they set the value `model_name=<name>` gives it, and the same model.
#[test]
fn maxtexts_model_files_load_as_config_files() {
    for name in ["deepseek2-16b", "kimi-k2-1t", "qwen3-480b-a35b"] {
        let path = maxtext_file(name);
        let from_file =
            config::resolve_args(&[path.display().to_string()]).unwrap_or_else(|e| panic!("{name}: {e}")).config;
        config::validate(&from_file, 1, 1).unwrap_or_else(|e| panic!("{name}: {e}"));
        let named = config::load(None, &[format!("model_name={name}")]).expect("the built-in model");
        let text = std::fs::read_to_string(&path).expect("the MaxText file");
        let set: serde_yaml::Mapping = serde_yaml::from_str(&text).expect("a YAML mapping");
        let (from_file_values, named_values) =
            (serde_yaml::to_value(&from_file).unwrap(), serde_yaml::to_value(&named).unwrap());
        for key in set.keys().map(|k| k.as_str().expect("a key")) {
            assert_eq!(from_file_values.get(key), named_values.get(key), "{name}: {key}");
            assert!(named_values.get(key).is_some(), "{name}: {key} is a maxrs key");
        }
        assert_eq!(Model::from_config(&from_file).expect(name).num_params(), num_params(name), "{name}");
    }
}

/// The same through the command line: `maxrs train <MaxText's file> --print-config`.
#[test]
fn maxtexts_model_file_prints_its_config() {
    let file = maxtext_file("deepseek2-16b").display().to_string();
    let out = crate::common::cli::finish(crate::common::cli::command(&["train", &file, "--print-config"], &[]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let line = stdout.lines().find(|l| l.starts_with("q_lora_rank ")).expect("q_lora_rank is printed");
    assert!(line.contains("= 0") && line.contains("deepseek2-16b.yml"), "{line}");
}

/// `norm_topk_prob` divides the top-k softmax weights by their sum (MaxText's `get_topk`,
/// layers/moe.py at e591f30): in f64 the block still matches the reference MoE of
/// `common/moe_ref.rs` (softmax over the chosen logits, which already sums to 1); in bf16 the
/// division of the rounded weights shows in the output.
#[test]
fn norm_topk_prob_renormalizes_the_rounded_weights() {
    use crate::common::moe_ref::{moe, MoeParams, Routing};
    use crate::common::{rng, run, uniform};
    use maxrs::host::HostTensor;
    use maxrs::ir::{DType, Signature};
    use maxrs::model::moe::{moe_block, param_defs, MoeConfig};
    use maxrs::model::ModelConfig;
    use maxrs::tensor::{trace, Tree};
    use ndarray::Array2;

    const EMB: usize = 16;
    const MLP: usize = 8;
    const EXPERTS: usize = 8;
    const K: usize = 3;
    const S: usize = 32;
    let config = config::load(None, &[format!("num_experts={EXPERTS}"), format!("num_experts_per_tok={K}")]).unwrap();
    let p = MoeParams::random(EMB, MLP, EXPERTS, 7);
    let x = uniform(&mut rng(8), S * EMB, -1.0, 1.0);
    // The block's output in `dtype`, from f64 inputs (f32 ones for a narrower dtype) cast to it.
    let output = |dtype: DType, norm: bool| {
        let host = if dtype == DType::F64 { DType::F64 } else { DType::F32 };
        let tensor = |dims: &[i64], v: &[f64]| match host {
            DType::F64 => HostTensor::from_f64(dims, v),
            _ => HostTensor::from_f32(dims, &v.iter().map(|&x| x as f32).collect::<Vec<_>>()),
        };
        let mut inputs: Tree<HostTensor> = p.named().into_iter().map(|(n, dims, v)| (n, tensor(&dims, &v))).collect();
        inputs.insert("x", tensor(&[1, S as i64, EMB as i64], &x));
        let mut c = ModelConfig::from_config(&config);
        c.dtype = dtype;
        let m = MoeConfig { norm_topk_prob: norm, ..MoeConfig::from_config(&config) };
        let mut sig = Signature::new(None);
        for def in param_defs(&m, EMB as i64, MLP as i64) {
            sig.input(&def.name, host, &def.shape);
        }
        sig.input("x", host, &[1, S as i64, EMB as i64]);
        let program = trace(&sig, |_ctx, inp| {
            let cast: Tree = inp.iter().map(|(n, t)| (n, t.astype(dtype))).collect();
            Tree::new().with("output", moe_block(&c, &m, &cast, &cast["x"]).output.astype(host))
        })
        .expect("the block traces");
        run(&program, &inputs)["output"].to_f64()
    };
    let want = moe(&p, &[Array2::from_shape_vec((S, EMB), x.clone()).unwrap()], K, Routing::Dropless);
    let got = output(DType::F64, true);
    let err = got.iter().zip(want.outputs[0].iter()).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    assert!(err < 1e-12, "norm_topk_prob=true against the reference: {err}");

    let (plain, normed) = (output(DType::BF16, false), output(DType::BF16, true));
    let changed = plain.iter().zip(&normed).filter(|(a, b)| a != b).count();
    let close = plain.iter().zip(&normed).all(|(a, b)| (a - b).abs() <= 0.02 * (1.0 + a.abs()));
    assert!(changed > 0 && close, "bf16: {changed} of {} outputs changed, all close: {close}", plain.len());
}
