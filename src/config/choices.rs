//! The value types of the configuration keys: the string keys' closed sets of values (one enum
//! each, whose `VALUES` feed the registry's choices and error suggestions), MaxText's optional
//! integers, and the rows of `logical_axis_rules`.

use serde::{Deserialize, Serialize};

use super::error::quote;
use super::registry::{KeyType, Kind};

/// Declares a string-valued key's closed set of values; `VALUES` feeds error suggestions.
macro_rules! string_enum {
    ($(#[$meta:meta])* $name:ident { $($variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
        pub enum $name {
            $(#[serde(rename = $text)] $variant),+
        }

        impl $name {
            /// Every accepted spelling, in declaration order.
            pub const VALUES: &'static [&'static str] = &[$($text),+];

            /// Every value, in declaration order.
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $text),+
                }
            }
        }

        impl KeyType for $name {
            const KIND: Kind = Kind::Choice(Self::VALUES);
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}
string_enum!(
    /// `dtype` (activations) and `weight_dtype` (parameters, optimizer state).
    DType { Bfloat16 = "bfloat16", Float32 = "float32", Float16 = "float16" }
);

impl DType {
    /// The element type the traced program computes in.
    pub fn ir(self) -> crate::ir::DType {
        match self {
            DType::Bfloat16 => crate::ir::DType::BF16,
            DType::Float32 => crate::ir::DType::F32,
            DType::Float16 => crate::ir::DType::F16,
        }
    }
}

string_enum!(
    /// `routed_score_func`: what the DeepSeek router applies to its logits (MaxText's
    /// `GateLogit.score_func`, layers/moe.py at e591f30; "" keeps the logits).
    RoutedScoreFunc { Logits = "", Sigmoid = "sigmoid", Softmax = "softmax" }
);

string_enum!(
    /// What the backward pass recomputes instead of keeping from the forward pass.
    RematPolicy {
        Full = "full",
        Minimal = "minimal",
        MinimalWithContext = "minimal_with_context",
        MinimalFlash = "minimal_flash",
        SaveDotWithContextExceptMlp = "save_dot_with_context_except_mlp",
        SaveDotExceptMlpwi = "save_dot_except_mlpwi",
        SaveDotExceptMlp = "save_dot_except_mlp",
        SaveQkvProj = "save_qkv_proj",
        SaveOutProj = "save_out_proj",
        None = "none",
        SaveEverything = "save_everything",
    }
);

string_enum!(
    /// MaxText's `attention`: how attention is computed (see `model::kernel::AttentionImpl`
    /// for what each kind maps to in maxrs).
    AttentionKernel {
        Autoselected = "autoselected",
        DotProduct = "dot_product",
        Flash = "flash",
        CudnnFlashTe = "cudnn_flash_te",
        CudnnFlashJax = "cudnn_flash_jax",
    }
);

string_enum!(
    /// `context_parallel_strategy`: how attention's keys and values reach the queries when the
    /// sequence is split over the `context` mesh axis (`model::context_parallel`).
    ContextParallelStrategy { AllGather = "all_gather", Ring = "ring", Ulysses = "ulysses", Usp = "usp" }
);

string_enum!(
    /// `context_parallel_reorder_strategy`: the load-balancing permutation of the sequence
    /// (MaxText's `ReorderStrategy`, `common/common_types.py` at e591f30); `auto` resolves per run.
    ReorderStrategy { Auto = "auto", DualChunkSwap = "dual_chunk_swap", Striped = "striped" }
);

string_enum!(
    /// MaxText's `profiler`: none, an XPlane trace (TensorBoard's profile plugin), or the CUDA
    /// profiler API around the profiled steps (for Nsight Systems).
    ProfilerKind { None = "", Xplane = "xplane", Nsys = "nsys" }
);

string_enum!(
    /// MaxText's `lr_schedule_type`: warmup then cosine decay, or warmup-stable-decay.
    LrScheduleType { Cosine = "cosine", Wsd = "wsd" }
);

string_enum!(
    /// MaxText's `wsd_decay_style`: the shape of the WSD schedule's decay.
    WsdDecayStyle { Linear = "linear", Cosine = "cosine" }
);

string_enum!(
    /// MaxText's `dpo.algo`: the preference loss of `use_dpo` (`train::dpo`).
    DpoAlgo { Dpo = "dpo", Orpo = "orpo" }
);

string_enum!(
    /// MaxText's `hardware` key.
    Hardware { Cpu = "cpu", Gpu = "gpu", GpuMultiprocess = "gpu_multiprocess", Tpu = "tpu" }
);

impl Hardware {
    /// `gpu` or `gpu_multiprocess`.
    pub fn is_gpu(self) -> bool {
        matches!(self, Hardware::Gpu | Hardware::GpuMultiprocess)
    }
}

string_enum!(
    /// Where training batches come from. MaxText's tfds (its base.yml default) and grain are
    /// read, so that a layer above can replace them, and refused when a run keeps them.
    DatasetType { Synthetic = "synthetic", Tokens = "tokens", Hf = "hf", Tfds = "tfds", Grain = "grain" }
);

string_enum!(
    /// MaxText's `tokenizer_type`.
    TokenizerType { SentencePiece = "sentencepiece", HuggingFace = "huggingface", Tiktoken = "tiktoken" }
);

string_enum!(
    /// The order in which each pipeline stage runs its forward and backward work (`pipeline_schedule`,
    /// the JaxPP fork's `schedule`): all forwards then all backwards, or one forward one backward
    /// after a warm-up (interleaved over the repeats when `num_pipeline_repeats` > 1).
    PipelineSchedule { Gpipe = "gpipe", OneFOneB = "1f1b", Interleaved1F1B = "interleaved_1f1b" }
);

string_enum!(
    /// maxrs's `on_checkpoint_error`: what a failed checkpoint save does to the run.
    OnCheckpointError { Stop = "stop", Continue = "continue" }
);

string_enum!(
    /// MaxText's decoder block styles that maxrs implements, one family file each under
    /// `src/model/`; mixtral is llama2's with a routed MoE block for the MLP, qwen2 llama2's with
    /// query/key/value biases, qwen3 llama2's with QK-norm, qwen3_moe qwen3's with a routed MoE
    /// block, qwen3_custom_moe qwen3's attention into a narrower latent with a routed MoE block
    /// there, deepseek DeepSeek-V3's layer (multi-head latent attention), olmo3 OLMo 3's
    /// post-norm layers with a whole-width QK-norm, 3 sliding-window layers to 1 global, gpt_oss
    /// gpt-oss's layers (attention sinks, sliding and global layers in turn, biased experts), llama4
    /// Llama 4's text layers (chunked attention with NoPE global layers, top-1 sigmoid experts),
    /// gemma4 Gemma 4's text layers (5 sliding to 1 global with its own head size and partial
    /// RoPE, value norms, a scaled residual; gemma4-26b's routed experts beside a shared MLP),
    /// gemma4_small Gemma 4 E2B/E4B's (gemma4's layers with per-layer input embeddings and the last
    /// layers reusing earlier layers' keys and values).
    DecoderBlock {
        Llama2 = "llama2",
        Mistral = "mistral",
        Gemma = "gemma",
        Gemma2 = "gemma2",
        Gemma3 = "gemma3",
        Gpt3 = "gpt3",
        Mixtral = "mixtral",
        Qwen2 = "qwen2",
        Qwen3 = "qwen3",
        Qwen3Moe = "qwen3_moe",
        Qwen3CustomMoe = "qwen3_custom_moe",
        Deepseek = "deepseek",
        Olmo3 = "olmo3",
        GptOss = "gpt_oss",
        Llama4 = "llama4",
        Gemma4 = "gemma4",
        Gemma4Small = "gemma4_small",
    }
);

impl DecoderBlock {
    /// The blocks whose MLP is a routed mixture of experts (`num_experts` and the MoE keys).
    pub fn has_experts(self) -> bool {
        matches!(
            self,
            DecoderBlock::Mixtral
                | DecoderBlock::Qwen3Moe
                | DecoderBlock::Qwen3CustomMoe
                | DecoderBlock::Deepseek
                | DecoderBlock::GptOss
                | DecoderBlock::Llama4
                | DecoderBlock::Gemma4
        )
    }
}

string_enum!(
    /// MaxText's `decode_sampling_strategy`: how `maxrs decode` picks each next token.
    SamplingStrategy {
        Greedy = "greedy",
        Weighted = "weighted",
        Nucleus = "nucleus",
        Topk = "topk",
        Composite = "composite",
    }
);

string_enum!(
    /// MaxText's `rope_type`: `default` (half-split RoPE), `llama3.1` (Llama 3.1's scaled
    /// frequencies on interleaved pairs) or `yarn` (YaRN's frequencies; deepseek's multi-head
    /// latent attention and olmo3 only, validation refuses it for the other families as not supported yet).
    RopeType { Default = "default", Llama31 = "llama3.1", Yarn = "yarn" }
);

string_enum!(
    /// MaxText's `attention_type` (`AttentionType` in `src/maxtext/common/common_types.py`,
    /// e591f30): maxrs's families compute `global` attention (their sliding windows come from
    /// their own keys), deepseek's `mla`; the others are refused as not supported yet.
    AttentionType {
        Global = "global",
        LocalSliding = "local_sliding",
        Chunk = "chunk",
        Mla = "mla",
        Full = "full",
        Compressed = "compressed",
        BlockDiffusion = "block_diffusion",
    }
);

string_enum!(
    /// MaxText's `quantization` values (`_get_quant_config` and `get_quantization_rule` in
    /// `src/maxtext/layers/quantizations.py`, e591f30). maxrs implements "" (none), `fp8` (flax's
    /// XLA-native fp8 with delayed scaling, `model::fp8`) and `te_fp8_currentscaling` (current
    /// scaling); validation refuses the others as not supported yet.
    Quantization {
        None = "",
        Fp8 = "fp8",
        Int8 = "int8",
        Intmp = "intmp",
        NanooFp8 = "nanoo_fp8",
        AqtFp8 = "aqt_fp8",
        AqtFp8Full = "aqt_fp8_full",
        Fp8Full = "fp8_full",
        Fp8Gpu = "fp8_gpu",
        Fp8Nanoo = "fp8_nanoo",
        TeFp8DelayedScaling = "te_fp8_delayedscaling",
        TeFp8CurrentScaling = "te_fp8_currentscaling",
        TeMxfp8 = "te_mxfp8",
        TeNvfp4 = "te_nvfp4",
        TeNvfp4NoRht = "te_nvfp4_no_rht",
    }
);

/// The MLP activations maxrs implements (`mlp_activations` entries; MaxText's names: `gelu` is
/// flax's tanh approximation).
pub const MLP_ACTIVATIONS: &[&str] = &["silu", "gelu", "relu", "sigmoid", "linear"];

/// An optional integer written as MaxText does: `None` (a string to YAML), `null`, or a number.
pub(crate) fn none_or_int<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<i64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Int(i64),
        Text(String),
        Null,
    }
    match Option::<Raw>::deserialize(deserializer)? {
        None | Some(Raw::Null) => Ok(None),
        Some(Raw::Int(n)) => Ok(Some(n)),
        Some(Raw::Text(t)) if matches!(t.trim(), "None" | "none" | "null" | "") => Ok(None),
        Some(Raw::Text(t)) => t
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| serde::de::Error::custom(format!("{} is not an integer or None", quote(&t)))),
    }
}

/// The mesh axes of one logical axis rule: MaxText writes either one name or a list.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RuleAxes {
    One(String),
    Many(Vec<String>),
}

impl RuleAxes {
    pub fn to_vec(&self) -> Vec<String> {
        match self {
            RuleAxes::One(axis) => vec![axis.clone()],
            RuleAxes::Many(axes) => axes.clone(),
        }
    }
}

/// One row of `logical_axis_rules`: `[logical name, mesh axes]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LogicalAxisRule(pub String, pub RuleAxes);
