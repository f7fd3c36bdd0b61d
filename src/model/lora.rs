//! LoRA as MaxText has it (`lora:` keys, `src/maxtext/utils/lora_utils.py` at e591f30, which
//! hands them to Qwix's `LoraProvider`, qwix 0.1.8 `_src/providers/lora.py`):
//!
//! - **Which products**: every `DenseGeneral` product (`blocks::dense`) whose module path —
//!   the parameter's name without its last part, `/`-separated, `decoder/layers/mlp/wi_0` —
//!   `lora_module_path` matches as a whole (Qwix's `re.fullmatch`). An empty path takes the
//!   model's entry of MaxText's `configs/post_train/lora_module_path.yml` ([`DEFAULT_PATHS`]),
//!   with the layer index made optional as `_get_lora_module_path` does.
//! - **The adapters** (Qwix's `_create_lora_layer_shapes`): a kernel whose first `c` axes are
//!   contracted gets `kernel_lora_a: [prod(contracted), r]` (`he_uniform`) and
//!   `kernel_lora_b: [r, prod(other axes)]` (zeros), stacked like the kernel; they are
//!   replicated, as `apply_lora_to_model` replicates every `LoRAParam`.
//! - **The product**: `x @ W + (x @ A) @ B * alpha / r` (Qwix's `dot_general`). Qwix computes the
//!   adapters' part in their dtype (`weight_dtype`), which promotes a bf16 product's sum to f32;
//!   maxrs adds it in f32 too and casts the sum back to `dtype`, where MaxText's layer output
//!   stays f32.
//! - **Training**: every other parameter is frozen (Tunix's optimizer is built with
//!   `wrt=nnx.LoRAParam`): no gradient and no optimizer state for them (`ParamDef::frozen`).

use anyhow::{bail, Context};
use regex::Regex;

use crate::config::Config;
use crate::ir::DType;
use crate::tensor::{Tensor, Tree};

use super::params::{ParamDef, ParamInit};

/// MaxText's `configs/post_train/lora_module_path.yml` at e591f30: the module-path regex of each
/// model-name prefix, tried in this order (`model_name.startswith(prefix)`), else `default`.
pub const DEFAULT_PATHS: &[(&str, &str)] = &[
    ("llama3.1", "decoder/layers/.*(self_attention/(query|key|value|out)|mlp/(wi_0|wi_1|wo))"),
    ("qwen3", "decoder/layers/.*(self_attention/(query|key|value|out)|mlp/(wi_0|wi_1|wo))"),
    ("mistral", "decoder/layers/.*(attention/(query|key|value|out)|mlp/(wi_0|wi_1|wo))"),
    (
        "deepseek2",
        "decoder/(dense_layers|moe_stack)/self_attention/(query|out|wkv_a|wkv_b)|decoder/(dense_layers|moe_stack)/(mlp|shared_experts)/(wi_0|wi_1|wo)",
    ),
    (
        "gemma2",
        "decoder/(scanned_blocks|layers_remainder|layers)/(self_attention_local|self_attention_global)/(query|key|value|out)|decoder/(scanned_blocks|layers_remainder|layers)/(mlp_local|mlp_global)/(wi_0|wi_1|wo)",
    ),
    (
        "gemma3",
        "decoder/(scanned_blocks|layers_remainder|layers)/.*(self_attention/(query|key|value|out)|mlp/(wi_0|wi_1|wo|gate|up|down))",
    ),
    ("gemma4", "decoder/((scanned_blocks|layers_remainder)/)?layers.*/.*(self_attention/(query|key|value|out)|mlp/.*(wi_0|wi_1|wo))"),
    ("olmo3", "decoder/layers/.*(attention/(query|key|value|out)|mlp/(wi_0|wi_1|wo))"),
    ("gpt3", "decoder/layers/(self_attention/(qkv_proj|out)|mlp/(wi|wo))"),
    ("gpt-oss", "decoder/layers/.*(GptOssAttention/(query|key|value|out)|GptOssMlp/(wi_0|wi_1|wo))"),
];

/// `lora_module_path.yml`'s `default`, for the model names it does not list.
pub const DEFAULT_PATH: &str = "decoder/layers/.*(self_attention/(query|key|value|out)|mlp/(wi_0|wi_1|wo))";

/// The run's LoRA settings (`lora.*` keys).
#[derive(Clone, Debug, PartialEq)]
pub struct Lora {
    pub rank: i64,
    pub alpha: f64,
    /// The module-path regex, the model's default already filled in.
    pub module_path: String,
}

impl Lora {
    /// The settings `c` asks for; none without `lora.enable_lora`.
    pub fn from_config(c: &Config) -> Option<Lora> {
        let module_path = match c.lora_module_path.as_str() {
            "" => default_module_path(&c.model_name),
            given => given.to_string(),
        };
        c.lora_enable_lora.then_some(Lora { rank: c.lora_rank, alpha: c.lora_alpha, module_path })
    }

    /// Refuses what a run cannot train with adapters: rank 0, alpha 0 (MaxText's defaults,
    /// which leave the adapters out of the product), pipeline stages, quantized products.
    pub fn check(c: &Config) -> anyhow::Result<()> {
        if !c.lora_enable_lora {
            return Ok(());
        }
        if c.lora_rank == 0 {
            bail!("lora.lora_rank is 0 with lora.enable_lora=true: give the adapters' rank (MaxText's LoRA config says 'Set >0 when LoRA is enabled'), e.g. lora.lora_rank=16");
        }
        if c.lora_alpha == 0.0 {
            bail!("lora.lora_alpha is 0 with lora.enable_lora=true: the adapters' product is scaled by alpha / rank = 0, so they would change and learn nothing; give lora.lora_alpha, e.g. lora.lora_alpha={}", 2 * c.lora_rank);
        }
        if c.ici_pipeline_parallelism != 1 || c.dcn_pipeline_parallelism != 1 {
            bail!("lora.enable_lora=true with pipeline parallelism: LoRA on pipeline stages is not supported yet");
        }
        if c.quantization != crate::config::Quantization::None {
            bail!(
                "lora.enable_lora=true with quantization={}: LoRA on quantized products is not supported yet",
                c.quantization
            );
        }
        Ok(())
    }

    /// What the adapters' product is multiplied by: `alpha / rank`.
    pub fn scale(&self) -> f64 {
        self.alpha / self.rank as f64
    }

    /// The adapters of the parameters `defs` (a model's, with their full names): for each
    /// `DenseGeneral` kernel whose module this LoRA matches, `lora_a` and `lora_b`, in `defs`'
    /// order. Refused: a path that is no regex, one that matches nothing (as MaxText's
    /// `_verify_lora_parameters`), one that matches a module whose weights are not a
    /// `DenseGeneral` kernel (MoE experts, the embedding, the logits).
    pub fn adapters(&self, defs: &[ParamDef]) -> anyhow::Result<Vec<ParamDef>> {
        let regex = Regex::new(&format!("^(?:{})$", self.module_path))
            .with_context(|| format!("lora.lora_module_path {:?} is not a regular expression", self.module_path))?;
        let mut adapters = Vec::new();
        for def in defs {
            let Some((module, weight)) = def.name.rsplit_once('.') else { continue };
            let module = module.replace('.', "/");
            if !regex.is_match(&module) {
                continue;
            }
            match def.dense {
                Some(dims) if weight == "kernel" => {
                    let stack = def.shape.len() - dims.contract - dims.out;
                    let (stacked, kernel) = def.shape.split_at(stack);
                    let (contract, out) = kernel.split_at(dims.contract);
                    let (fan_in, outputs) = (contract.iter().product::<i64>(), out.iter().product::<i64>());
                    let stacked_axes = &def.logical[..stack];
                    let adapter = |suffix: &str, dims: [i64; 2], init: ParamInit| {
                        let shape: Vec<i64> = stacked.iter().copied().chain(dims).collect();
                        let logical: Vec<&'static str> = stacked_axes.iter().copied().chain(["", ""]).collect();
                        ParamDef::new(&format!("{}_{suffix}", def.name), &shape, &logical, init)
                    };
                    adapters.push(adapter("lora_a", [fan_in, self.rank], ParamInit::HeUniform(fan_in)));
                    adapters.push(adapter("lora_b", [self.rank, outputs], ParamInit::Zeros));
                }
                // Norm scales and biases take part in no product with the input.
                _ if matches!(weight, "scale" | "bias") => {}
                _ => bail!(
                    "lora.lora_module_path {:?} matches {module}, whose {weight} is not a DenseGeneral kernel: LoRA on it (MoE experts, embeddings, the logits) is not supported yet",
                    self.module_path
                ),
            }
        }
        if adapters.is_empty() {
            let mut modules: Vec<String> = defs
                .iter()
                .filter(|d| d.dense.is_some())
                .filter_map(|d| d.name.rsplit_once('.').map(|(m, _)| m.replace('.', "/")))
                .collect();
            modules.dedup();
            modules.truncate(4);
            bail!(
                "lora.lora_module_path {:?} matches no projection of this model (as a whole path); its projections are e.g. {}",
                self.module_path,
                modules.join(", ")
            );
        }
        Ok(adapters)
    }
}

/// The module path MaxText's `_get_lora_module_path` picks for `model_name`: the first entry of
/// [`DEFAULT_PATHS`] it starts with, else [`DEFAULT_PATH`], with `layers/` made to match an
/// unscanned layer's `layers_<i>/` too.
pub fn default_module_path(model_name: &str) -> String {
    let name = model_name.to_lowercase();
    let path = DEFAULT_PATHS.iter().find(|(prefix, _)| name.starts_with(prefix)).map_or(DEFAULT_PATH, |(_, p)| p);
    path.replace("layers/", "layers(?:_[0-9]+|/[0-9]+)?/")
}

/// The adapters' part of the product of `x` with `<op>.kernel` (its last `axes` dims contracted,
/// `out` the kernel's output dims) when `p` holds adapters for it: `((x @ A) @ B) * scale` in
/// f32, shaped as the product.
pub fn delta(p: &Tree, op: &str, x: &Tensor, axes: usize, out: &[i64], scale: f64) -> Option<Tensor> {
    let a = p.get(&format!("{op}.kernel_lora_a"))?.astype(DType::F32);
    let b = &p[format!("{op}.kernel_lora_b").as_str()].astype(DType::F32);
    let lead = &x.shape()[..x.rank() - axes];
    let flat: Vec<i64> = lead.iter().copied().chain([a.shape()[0]]).collect();
    let low = x.astype(DType::F32).reshape(&flat).matmul(&a);
    let shaped: Vec<i64> = lead.iter().chain(out).copied().collect();
    Some(low.matmul(b).reshape(&shaped) * scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_path_follows_the_model_name_and_any_layer_naming() {
        let llama = Regex::new(&format!("^(?:{})$", default_module_path("llama2-7b"))).unwrap();
        for module in
            ["decoder/layers/self_attention/query", "decoder/layers_3/mlp/wo", "decoder/layers/3/self_attention/out"]
        {
            assert!(llama.is_match(module), "{module}");
        }
        for module in
            ["decoder/layers/pre_self_attention_layer_norm", "decoder/logits_dense", "decoder/layers/MoeBlock_0"]
        {
            assert!(!llama.is_match(module), "{module}");
        }
        assert!(default_module_path("mistral-7b").contains("(attention/"));
        assert_eq!(default_module_path("deepseek3-671b"), default_module_path("llama2-7b"));
    }
}
