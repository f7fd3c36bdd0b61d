//! The routed mixture-of-experts block (MaxText's `RoutedMoE`, `src/maxtext/layers/moe.py` at
//! main e591f30), which replaces a decoder layer's MLP in MoE families such as Mixtral.
//!
//! Every token is routed by a gate (`x @ gate.kernel`: one logit per expert) to its
//! `num_experts_per_tok` best experts (`top_k` of the logits; ties go to the lower expert), with
//! weights `softmax` over those k logits — the same as renormalizing the softmax over all experts
//! to the chosen ones (`get_topk`). Each expert is a SwiGLU MLP (`wi_0`, `wi_1`, `wo`); the block's
//! output is the weighted sum of its token's experts' outputs. Three computations, as MaxText's
//! keys select them:
//!
//! - `sparse_matmul=true` (the default): dropless. The `tokens x k` assignments are sorted by
//!   expert, each expert's rows meet its weights in one grouped matmul (`ragged_dot`), and the
//!   results are put back in token order (`permute` / `sparse_matmul` / `unpermute`). On a mesh
//!   each batch shard does this with its own tokens and the gathered kernels, as MaxText's
//!   `shard_map` does (`dropless_per_shard`).
//! - `sparse_matmul=false`, `capacity_factor > 0`: token dropping (`dense_matmul`'s dispatch
//!   path). Each expert takes at most `C = max(ceil(S k / E) x capacity_factor, capacity_factor)`
//!   tokens of each sequence, first come first served in (position, choice) order; the others
//!   skip that expert. Tokens move to `[E, B, C, emb]` buffers by a one-hot dispatch einsum and
//!   back by the weighted combine einsum; with the expert axis sharding the experts, the
//!   partitioner turns these into all-to-alls.
//! - `sparse_matmul=false`, `capacity_factor <= 0`: every expert on every token, weighted by the
//!   (mostly zero) routing weights (`dense_matmul` without capacity).
//!
//! With `quantization=fp8` (Mixtral) the gate and the `sparse_matmul=false` paths' einsums are
//! fp8 products ([`Products::Fp8`]).
//!
//! With `load_balance_loss_weight > 0` the block also returns the Switch Transformer auxiliary
//! loss (`load_balance_loss`): per sequence, the fraction of assignments each expert receives
//! times its mean router probability, averaged, times `E^2 x weight`.
//!
//! Parameters, relative to the block (`MoeBlock_0.` in a Mixtral layer), as MaxText names them:
//!
//! | name | shape | logical axes | init |
//! |---|---|---|---|
//! | `gate.kernel` | [emb, experts] | embed, - | fan_in (emb) |
//! | `wi_0` | [experts, emb, mlp] | exp, embed_moe, mlp_moe | fan_in (experts x mlp) |
//! | `wi_1` | [experts, emb, mlp] | exp, embed_moe, mlp_moe | fan_in (experts x mlp) |
//! | `wo` | [experts, mlp, emb] | exp, mlp_moe, embed_moe | fan_in (experts x emb) |
//!
//! The experts' fan-in is MaxText's: its `RoutedMoE` initializes the stacked kernels with
//! `in_axis=0, out_axis=1`, so JAX's `variance_scaling` counts `experts x (the remaining dim)` as
//! the fan-in.
//!
//! DeepSeek-V3's router ([`Router::DeepSeek`], MaxText's `GateLogit`, `deepseek_routing`,
//! `expert_group_mask` and `deepseek_scale_weights` in `layers/moe.py` at e591f30) scores the
//! logits (`routed_score_func`: sigmoid for DeepSeek-V3), adds a learned per-expert bias
//! (`routed_bias`: `gate.bias`, [experts], zeros, logical axis none) to choose the experts only,
//! optionally only from the `topk_routing_group` best of `n_routing_groups` equal groups (a
//! group's score: the sum of its two best biased scores; the other groups' experts are masked to
//! -inf), takes the top k of the biased scores, and weighs them with the UNBIASED scores —
//! divided by their sum plus 1e-20 for sigmoid scores — times `routed_scaling_factor`. The bias
//! gets a zero gradient (it only moves the choice), as in MaxText; MaxText's update rule
//! (`routed_bias_update_rate` > 0) is not supported yet (0, MaxText's default and DeepSeek-V3's
//! model file's, keeps the bias as loaded).
//!
//! MaxText routes this way only when `model_name` starts with `deepseek3` or `deepseek4`
//! (`get_topk`, `layers/moe.py` at e591f30). For any other name with `decoder_block=deepseek`
//! (`kimi-k2-1t`, `deepseek2-*`, a custom model) it takes the top k of the biased scores AS the
//! weights (the bias then has a gradient), normalized and scaled the same way, and it never
//! groups: maxrs does the same ([`DeepSeekRouter::v3`]), and refuses `n_routing_groups` there
//! rather than ignore it. Without a bias both ways choose and weigh alike.
//!
//! gpt-oss's block ([`GptOssExperts`], MaxText's `RoutedMoE` under `decoder_block=gpt_oss`,
//! `layers/moe.py` at e591f30) adds a learned bias to the gate logits (`routed_bias`: `gate.bias`,
//! [experts], zeros, logical axis none; it both chooses and weighs, through the softmax), biases
//! to the experts' projections (`mlp_bias`: `wi_0_bias`, `wi_1_bias` [experts, mlp], logical axes
//! `exp, activation_mlp`, and `wo_bias` [experts, emb], `exp, activation_embed`; zeros), added
//! right after each product, and replaces SwiGLU by its clamped GLU (`apply_ffn_activation`):
//! with `l = mlp_activations_limit`, `g = min(x wi_0, l)`, `u = clamp(x wi_1, -l, l)`, the expert's
//! hidden value is `g act(1.702 g) (u + 1)`, `act` the first of `mlp_activations` (sigmoid).
//!
//! Gemma 4's router ([`Router::Gemma4`], `get_topk` under `decoder_block=gemma4`, `layers/moe.py`
//! at e591f30) reads its own input (`gate_inputs`, [`moe_block_gated`]), takes the top k of the
//! logits, weighs them with their probabilities of the softmax over ALL experts (in f32), divided
//! by their sum with `norm_topk_prob`, times a learned per-expert scale (`per_expert_scale`:
//! [experts], ones, logical axis `exp`); its experts are GeGLU (`gelu` instead of `silu`).
//!
//! DeepSeek's block is MaxText's `RoutedAndSharedMoE` ([`routed_and_shared_block`]): the routed
//! block under `MoeBlock_0.` (its gate kernel's logical axes `embed_moe, -`) plus a shared
//! SwiGLU MLP `shared_experts.{wi_0,wi_1,wo}.kernel`, `shared_experts x` the experts' width.
//!
//! Llama 4's router ([`Router::Llama4`], MaxText's `RoutedMoE` under `decoder_block=llama4`:
//! `get_topk`, `sparse_matmul` and `dense_matmul` in `layers/moe.py` at e591f30) takes the top k
//! (one) of the logits and scales the token going into its expert by the sigmoid of that logit,
//! in f32 cast to `dtype`; the experts' outputs are then summed with weights of one. Its block is
//! a `RoutedAndSharedMoE` too.

use super::blocks::{Activation, Mlp};
use super::family::constrain;
use super::fp8;
use super::{ModelConfig, ParamDef, ParamInit};
use crate::config::{Config, RoutedScoreFunc};
use crate::ir::{DType, DotDims};
use crate::sharding::PartitionSpec;
use crate::tensor::{einsum, fence_cotangents, manual_computation, where_, Tensor, Tree};

/// What the block needs from the run's configuration besides `ModelConfig` (MaxText's key
/// names).
#[derive(Clone, Debug)]
pub struct MoeConfig {
    pub num_experts: i64,
    pub num_experts_per_tok: i64,
    pub capacity_factor: f64,
    pub sparse_matmul: bool,
    pub load_balance_loss_weight: f64,
    /// Sum the experts' weighted outputs in f32 (dropless and all-experts paths).
    pub float32_weight_sum: bool,
    /// Compute the gate logits in f32.
    pub float32_gate_logits: bool,
    /// `moe_dispatch_no_expert_sharding`: keep the `expert` mesh axis off the batch dim of the
    /// dispatched tokens, so the expert matmuls stay expert-parallel (all-to-all).
    pub dispatch_no_expert_sharding: bool,
    /// How each token's experts are chosen and weighed.
    pub router: Router,
    /// `shared_experts`: the shared MLP of [`routed_and_shared_block`] is this many experts wide.
    pub shared_experts: i64,
    /// `norm_topk_prob` ([`Router::Softmax`]): the top-k weights are divided by their sum in
    /// `dtype` after the softmax, as MaxText's `get_topk` does.
    pub norm_topk_prob: bool,
    /// gpt-oss's biases and clamped GLU (see the module header); `None`: plain SwiGLU experts.
    pub gpt_oss: Option<GptOssExperts>,
}

/// What `decoder_block=gpt_oss` changes in the block (see the module header).
#[derive(Clone, Debug, PartialEq)]
pub struct GptOssExperts {
    /// `routed_bias`: `gate.bias`, added to the gate logits.
    pub gate_bias: bool,
    /// `mlp_bias`: `wi_0_bias`, `wi_1_bias`, `wo_bias`.
    pub expert_bias: bool,
    /// `mlp_activations_limit`: the clamp of the two up-projections.
    pub limit: f64,
    /// The first of `mlp_activations`, applied to `1.702 g`.
    pub activation: Activation,
}

/// The slope gpt-oss's GLU scales its gate by inside the activation (`apply_ffn_activation`).
const GPT_OSS_ALPHA: f64 = 1.702;

/// How the router picks each token's experts and weighs them.
#[derive(Clone, Debug, PartialEq)]
pub enum Router {
    /// MaxText's default (Mixtral, Qwen3 MoE): `top_k` of the logits, weights `softmax` over them.
    Softmax,
    /// DeepSeek-V3's (see the module header).
    DeepSeek(DeepSeekRouter),
    /// Llama 4's: top-1 of the logits, the expert's input scaled by the logit's sigmoid.
    Llama4,
    /// Gemma 4's (see the module header).
    Gemma4,
}

/// DeepSeek-V3's routing keys.
#[derive(Clone, Debug, PartialEq)]
pub struct DeepSeekRouter {
    /// `routed_score_func`.
    pub score_func: RoutedScoreFunc,
    /// `routed_bias`: the `gate.bias` parameter, added to the scores to choose the experts.
    pub bias: bool,
    /// `(n_routing_groups, topk_routing_group)`, when the experts are grouped.
    pub groups: Option<(i64, i64)>,
    /// `routed_scaling_factor`.
    pub scaling_factor: f64,
    /// DeepSeek-V3's routing (the bias chooses only; groups), which MaxText applies for a
    /// `model_name` starting with `deepseek3` or `deepseek4`; else the biased scores are the
    /// weights (see the module header).
    pub v3: bool,
}

/// Whether MaxText routes a `decoder_block=deepseek` model named `model_name` as DeepSeek-V3
/// (`get_topk`, `layers/moe.py` at e591f30: a name starting with deepseek3 or deepseek4).
pub fn routes_as_deepseek_v3(model_name: &str) -> bool {
    model_name.starts_with("deepseek3") || model_name.starts_with("deepseek4")
}

/// The valid `model_name` prefixes of [`routes_as_deepseek_v3`], for messages.
pub const DEEPSEEK_V3_PREFIXES: &str = "deepseek3 or deepseek4";

/// What `model_name` decides of a DeepSeek model's routing, in words, where it decides anything:
/// the model has routed layers and a routing bias or groups (without both, MaxText's two
/// routings choose and weigh alike; `get_topk`, `layers/moe.py` at MaxText e591f30).
pub fn routing_by_name(model_name: &str, routed_layers: bool, bias: bool, groups: bool) -> Option<String> {
    (routed_layers && (bias || groups)).then(|| match routes_as_deepseek_v3(model_name) {
        true => format!(
            "DeepSeek-V3's routing, the experts weighed by their unbiased scores (a name starting with {DEEPSEEK_V3_PREFIXES})"
        ),
        false => format!(
            "the experts weighed by their biased scores (a name not starting with {DEEPSEEK_V3_PREFIXES})"
        ),
    })
}

impl MoeConfig {
    pub fn from_config(c: &Config) -> MoeConfig {
        MoeConfig {
            num_experts: c.num_experts,
            num_experts_per_tok: c.num_experts_per_tok,
            capacity_factor: c.capacity_factor,
            sparse_matmul: c.sparse_matmul,
            load_balance_loss_weight: c.load_balance_loss_weight,
            float32_weight_sum: c.float32_weight_sum,
            float32_gate_logits: c.float32_gate_logits,
            dispatch_no_expert_sharding: c.moe_dispatch_no_expert_sharding,
            router: Router::Softmax,
            shared_experts: 0,
            norm_topk_prob: c.norm_topk_prob,
            gpt_oss: None,
        }
    }

    /// The block of a DeepSeek-V3 layer (MaxText's `RoutedAndSharedMoE`): DeepSeek's router and
    /// `shared_experts`, with the routing keys checked; an error names the key and what is valid.
    /// The family calls this, then [`routed_and_shared_param_defs`] and
    /// [`routed_and_shared_block`].
    pub fn deepseek(c: &Config) -> anyhow::Result<MoeConfig> {
        let (e, k) = (c.num_experts, c.num_experts_per_tok);
        if c.routed_bias_update_rate > 0.0 {
            return Err(anyhow::anyhow!(
                "routed_bias_update_rate={}: updating the routing bias after each step is not supported yet; use 0 (the bias stays as loaded, as in MaxText's deepseek3 model files)",
                c.routed_bias_update_rate
            ));
        }
        if k > e {
            return Err(anyhow::anyhow!("num_experts_per_tok={k}: more than num_experts={e}; use at most {e}"));
        }
        let v3 = routes_as_deepseek_v3(&c.model_name);
        let groups = match (c.n_routing_groups, c.topk_routing_group) {
            (-1, -1) => None,
            (g, _) if !v3 => {
                return Err(anyhow::anyhow!(
                    "n_routing_groups={g}: MaxText groups the experts only for a model_name starting with {DEEPSEEK_V3_PREFIXES} (get_topk, layers/moe.py at e591f30) and ignores the key for model_name={}; use such a model_name (e.g. deepseek3-671b with override_model_config=true) or n_routing_groups=-1",
                    c.model_name
                ))
            }
            (-1, t) => {
                return Err(anyhow::anyhow!(
                    "topk_routing_group={t}: needs n_routing_groups (-1: no groups); set both or neither"
                ))
            }
            (g, _) if e % g != 0 || e / g < 2 => {
                return Err(anyhow::anyhow!(
                    "n_routing_groups={g}: num_experts={e} must split into groups of at least 2 experts (a group scores by its top 2); use a divisor of {e} up to {}",
                    e / 2
                ));
            }
            (g, t) if t < 1 || t > g || t * (e / g) < k => {
                return Err(anyhow::anyhow!(
                    "topk_routing_group={t}: must be in [1, n_routing_groups={g}] and leave num_experts_per_tok={k} experts to choose from ({} per group)",
                    e / g
                ));
            }
            (g, t) => Some((g, t)),
        };
        let router = DeepSeekRouter {
            score_func: c.routed_score_func,
            bias: c.routed_bias,
            groups,
            scaling_factor: c.routed_scaling_factor,
            v3,
        };
        Ok(MoeConfig {
            router: Router::DeepSeek(router),
            shared_experts: c.shared_experts,
            ..MoeConfig::from_config(c)
        })
    }

    /// The block of a Llama 4 MoE layer (MaxText's `RoutedAndSharedMoE` under `decoder_block=llama4`):
    /// Llama 4's router and `shared_experts`. MaxText scales each token's input by its one chosen
    /// logit's sigmoid, a product that broadcasts only with `num_experts_per_tok=1`.
    pub fn llama4(c: &Config) -> anyhow::Result<MoeConfig> {
        if c.num_experts_per_tok != 1 {
            return Err(anyhow::anyhow!(
                "num_experts_per_tok={}: llama4 routes each token to one expert, whose input it scales by the logit's sigmoid (MaxText's RoutedMoE, layers/moe.py at e591f30); more than one is not supported yet; use 1",
                c.num_experts_per_tok
            ));
        }
        Ok(MoeConfig { router: Router::Llama4, shared_experts: c.shared_experts, ..MoeConfig::from_config(c) })
    }

    /// Per-sequence expert capacity of the dropping path (MaxText's `generate_masks`).
    pub fn capacity(&self, seq: i64) -> i64 {
        let (cf, e, k) = (self.capacity_factor, self.num_experts as f64, self.num_experts_per_tok as f64);
        ((seq as f64 * k / e).ceil() * cf).max(cf) as i64
    }
}

/// MaxText's "float32" for router softmaxes, sums and losses: f32, or f64 for an f64 model.
fn wide(c: &ModelConfig) -> DType {
    match c.dtype {
        DType::F64 => DType::F64,
        DType::F32
        | DType::BF16
        | DType::F16
        | DType::F8E4M3FN
        | DType::F8E5M2
        | DType::S8
        | DType::S32
        | DType::S64
        | DType::U8
        | DType::U32
        | DType::Pred => DType::F32,
    }
}

/// The block's parameters, relative to it, for `emb`-wide tokens and `mlp`-wide experts.
pub fn param_defs(m: &MoeConfig, emb: i64, mlp: i64) -> Vec<ParamDef> {
    let e = m.num_experts;
    let def = |name: &str, shape: &[i64], logical: &[&'static str], init| ParamDef::new(name, shape, logical, init);
    let (gate_axes, bias) = match &m.router {
        Router::Softmax => (["embed", ""], false),
        Router::DeepSeek(r) => (["embed_moe", ""], r.bias),
        Router::Llama4 => (["embed_moe", ""], false),
        Router::Gemma4 => (["embed_moe", ""], false),
    };
    let bias = bias || m.gpt_oss.as_ref().is_some_and(|g| g.gate_bias);
    let gate_bias = bias.then(|| def("gate.bias", &[e], &[""], ParamInit::Zeros));
    let mut defs = vec![def("gate.kernel", &[emb, e], &gate_axes, ParamInit::FanIn(emb))];
    defs.extend(gate_bias);
    defs.extend([
        def("wi_0", &[e, emb, mlp], &["exp", "embed_moe", "mlp_moe"], ParamInit::FanIn(e * mlp)),
        def("wi_1", &[e, emb, mlp], &["exp", "embed_moe", "mlp_moe"], ParamInit::FanIn(e * mlp)),
        def("wo", &[e, mlp, emb], &["exp", "mlp_moe", "embed_moe"], ParamInit::FanIn(e * emb)),
    ]);
    if m.router == Router::Gemma4 {
        defs.push(def("per_expert_scale", &[e], &["exp"], ParamInit::Ones));
    }
    if m.gpt_oss.as_ref().is_some_and(|g| g.expert_bias) {
        defs.extend([
            def("wi_0_bias", &[e, mlp], &["exp", "activation_mlp"], ParamInit::Zeros),
            def("wi_1_bias", &[e, mlp], &["exp", "activation_mlp"], ParamInit::Zeros),
            def("wo_bias", &[e, emb], &["exp", "activation_embed"], ParamInit::Zeros),
        ]);
    }
    defs
}

/// The parameters of [`routed_and_shared_block`], relative to it: the routed block's under
/// `MoeBlock_0.` (experts `moe_mlp` wide) and the shared MLP's under `shared_experts.`, as a
/// MaxText DeepSeek checkpoint names them (`DeepSeekMoeBlock_0.{MoeBlock_0,shared_experts}`).
pub fn routed_and_shared_param_defs(c: &ModelConfig, m: &MoeConfig, emb: i64, moe_mlp: i64) -> Vec<ParamDef> {
    let mut defs: Vec<ParamDef> = param_defs(m, emb, moe_mlp)
        .into_iter()
        .map(|def| ParamDef { name: format!("MoeBlock_0.{}", def.name), ..def })
        .collect();
    if m.shared_experts > 0 {
        defs.extend(shared_mlp(c).params("shared_experts", emb, m.shared_experts * moe_mlp));
    }
    defs
}

/// The shared experts: MaxText's `MlpBlock` without biases.
fn shared_mlp(c: &ModelConfig) -> Mlp {
    Mlp::new(c, false, None)
}

/// MaxText's `RoutedAndSharedMoE` on `x: [batch, seq, emb]`: the routed block
/// (`p["MoeBlock_0.*"]`) plus the shared MLP (`p["shared_experts.*"]`); the load-balancing loss
/// is the routed block's.
pub fn routed_and_shared_block(c: &ModelConfig, m: &MoeConfig, p: &Tree, x: &Tensor) -> MoeOutput {
    let routed = moe_block(c, m, &p.subtree("MoeBlock_0"), x);
    let output = match m.shared_experts {
        0 => routed.output,
        _ => routed.output + &shared_mlp(c).apply(c, p, "shared_experts", x),
    };
    MoeOutput { output, load_balance_loss: routed.load_balance_loss }
}

/// The weight FLOPs of [`routed_and_shared_block`] on `tokens` tokens, as MaxText counts them
/// (`calculate_routed_and_shared_ffn_tflops_per_device`): the router, the `k` chosen experts and
/// the shared MLP, each SwiGLU expert `2 x tokens x emb x moe_mlp x 3`.
pub fn routed_and_shared_flops(m: &MoeConfig, emb: i64, moe_mlp: i64, tokens: f64) -> f64 {
    let (e, mlp) = (emb as f64, moe_mlp as f64);
    let router = 2.0 * tokens * e * m.num_experts as f64;
    let expert = 2.0 * tokens * e * mlp * 3.0;
    router + expert * (m.num_experts_per_tok + m.shared_experts) as f64
}

/// The block's result: its output and, with `load_balance_loss_weight > 0`, the weighted
/// load-balancing loss (an f32 scalar).
pub struct MoeOutput {
    pub output: Tensor,
    pub load_balance_loss: Option<Tensor>,
}

impl MoeOutput {
    /// The layer's auxiliary losses: MaxText adds the load-balancing loss only with several
    /// experts (`loss_fn`), and logs it (as 0 when its weight is 0) in that case only.
    pub fn aux_losses(&self, m: &MoeConfig) -> Tree {
        let mut aux = Tree::new();
        if m.num_experts > 1 {
            let loss = self.load_balance_loss.clone().unwrap_or_else(|| self.output.trace().scalar(0.0, DType::F32));
            aux.insert("moe_lb_loss", loss);
        }
        aux
    }
}

/// Where the router sends each token: `[batch, seq, k]` weights (in `dtype`) and s32 expert ids.
struct Routes {
    weights: Tensor,
    experts: Tensor,
}

/// The experts' kernels, in `dtype`: `wi_0`, `wi_1` `[E, emb, mlp]`, `wo` `[E, mlp, emb]`, and
/// their biases `[E, mlp]`, `[E, mlp]`, `[E, emb]` (gpt-oss's `mlp_bias`).
struct Kernels {
    wi_0: Tensor,
    wi_1: Tensor,
    wo: Tensor,
    biases: Option<[Tensor; 3]>,
}

/// How the block multiplies by its weights.
#[derive(Clone, Copy)]
pub enum Products<'a> {
    Plain,
    /// `quantization=fp8` as MaxText's `RoutedMoE` has it (`layers/moe.py` at e591f30, with
    /// `Fp8Quantization` from `layers/quantizations.py`): the gate is an fp8 product (`GateLogit`'s
    /// `Fp8DirectDotGeneralOp_0`, `fp8::dot`, state `gate.*` in the block's parameters) and every
    /// einsum `dense_matmul` takes from `get_einsum` is flax's `Fp8Einsum` (`fp8::einsum`), one
    /// scale per operand over all experts. Those are `_Fp8EinsumWrapper` linen modules created
    /// while the layer runs, so linen names them in the layer's scope in call order:
    /// `_Fp8EinsumWrapper_<i>.fp8_einsum.*` ([`fp8_einsums`]), whose state is in this tree (the
    /// layer's parameters and state). The weighted sum of the experts' outputs is a plain einsum
    /// there; the dispatch and combine einsums are fp8 ones (`get_einsum` keeps them plain only
    /// with `model_call_mode=inference`). The dropless path has none: MaxText's fails with fp8
    /// (its `gmm` reads `quant_dg`, which `Fp8Quantization` lacks), and `config` refuses it.
    Fp8(&'a Tree),
}

impl Products<'_> {
    /// The `i`-th einsum of `dense_matmul` with a quantized form, `spec` on `x` and `kernel`.
    fn einsum(&self, i: usize, spec: &str, x: &Tensor, kernel: &Tensor) -> Tensor {
        match self {
            Products::Plain => einsum(spec, &[x, kernel]),
            Products::Fp8(state) => fp8::einsum(state, &fp8_einsum(i), spec, x, kernel),
        }
    }
}

/// The name of the `i`-th fp8 einsum, relative to the layer (MaxText's module path).
fn fp8_einsum(i: usize) -> String {
    format!("_Fp8EinsumWrapper_{i}.fp8_einsum")
}

/// The fp8 einsums of a block with [`Products::Fp8`], relative to the layer, in MaxText's call
/// order: with a capacity dispatch, `wi_0`, `wi_1`, `wo`, combine; without, `wi_0`, `wi_1`, `wo`.
pub fn fp8_einsums(m: &MoeConfig) -> Vec<String> {
    let count = match (m.sparse_matmul, m.capacity_factor > 0.0) {
        (true, _) => 0,
        (false, true) => 5,
        (false, false) => 3,
    };
    (0..count).map(fp8_einsum).collect()
}

/// The block on `x: [batch, seq, emb]` (in `dtype`) with its parameters `p`.
pub fn moe_block(c: &ModelConfig, m: &MoeConfig, p: &Tree, x: &Tensor) -> MoeOutput {
    moe_block_with(c, m, p, x, Products::Plain)
}

/// [`moe_block`] with its products multiplied as `products` says.
pub fn moe_block_with(c: &ModelConfig, m: &MoeConfig, p: &Tree, x: &Tensor, products: Products) -> MoeOutput {
    routed(c, m, p, x, x, products)
}

/// [`moe_block`] with the gate reading `gate_input` (`[batch, seq, emb]`) instead of `x`:
/// MaxText's `gate_inputs` (`RoutedMoE.__call__`, `layers/moe.py` at e591f30), Gemma 4's.
pub fn moe_block_gated(c: &ModelConfig, m: &MoeConfig, p: &Tree, x: &Tensor, gate_input: &Tensor) -> MoeOutput {
    routed(c, m, p, x, gate_input, Products::Plain)
}

/// The block on `x`, routed by the gate on `gate_input`.
fn routed(c: &ModelConfig, m: &MoeConfig, p: &Tree, x: &Tensor, gate_input: &Tensor, products: Products) -> MoeOutput {
    let gate_dtype = if m.float32_gate_logits { wide(c) } else { c.dtype };
    let (gate_x, gate_kernel) = (gate_input.astype(gate_dtype), p["gate.kernel"].astype(gate_dtype));
    let logits = match products {
        Products::Plain => gate_x.matmul(&gate_kernel),
        Products::Fp8(_) => {
            let dims = DotDims { lhs_batch: vec![], rhs_batch: vec![], lhs_contract: vec![2], rhs_contract: vec![0] };
            fp8::dot(p, "gate", &gate_x, &gate_kernel, &dims)
        }
    };
    let logits = match &m.gpt_oss {
        Some(g) if g.gate_bias => logits + &p["gate.bias"].astype(gate_dtype),
        _ => logits,
    };
    let logits = constrain(c, logits, &["activation_batch_moe", "activation_length_moe", ""]);
    let (routes, scores) = match &m.router {
        Router::Softmax => {
            let (top_logits, experts) = logits.top_k(m.num_experts_per_tok);
            let mut weights = top_logits.astype(wide(c)).softmax(-1).astype(c.dtype);
            if m.norm_topk_prob {
                weights = &weights / &weights.sum_keepdims(&[-1]);
            }
            (Routes { weights, experts }, logits)
        }
        Router::DeepSeek(r) => deepseek_routes(c, m, r, p, &logits),
        Router::Llama4 => {
            let (top_logits, experts) = logits.top_k(m.num_experts_per_tok);
            let weights = top_logits.astype(wide(c)).sigmoid().astype(c.dtype);
            (Routes { weights, experts }, logits)
        }
        Router::Gemma4 => {
            let probs = logits.astype(wide(c)).softmax(-1);
            let (_, experts) = logits.top_k(m.num_experts_per_tok);
            let mut weights = probs.take_along_axis(&experts, -1).astype(c.dtype);
            if m.norm_topk_prob {
                weights = &weights / &weights.sum_keepdims(&[-1]);
            }
            let scale = p["per_expert_scale"].astype(c.dtype).take(&experts);
            (Routes { weights: weights * &scale, experts }, logits)
        }
    };
    // Llama 4 scales each token's input by its weight and sums the outputs with weights of one.
    let (x, routes) = match m.router {
        Router::Llama4 => {
            let ones = routes.weights.ones_like();
            (x * &routes.weights, Routes { weights: ones, experts: routes.experts })
        }
        Router::Softmax | Router::DeepSeek(_) | Router::Gemma4 => (x.clone(), routes),
    };
    let x = &x;
    // MaxText's load-balancing loss takes the softmax of the gate's output, which for DeepSeek's
    // router is the biased scores (`GateLogit` returns them).
    let load_balance_loss =
        (m.load_balance_loss_weight > 0.0).then(|| load_balance_loss(c, m, &scores, &routes.experts));
    let w = |name: &str| p[name].astype(c.dtype);
    let biases =
        m.gpt_oss.as_ref().is_some_and(|g| g.expert_bias).then(|| [w("wi_0_bias"), w("wi_1_bias"), w("wo_bias")]);
    let kernels = Kernels { wi_0: w("wi_0"), wi_1: w("wi_1"), wo: w("wo"), biases };
    let output = if m.sparse_matmul {
        dropless_per_shard(c, m, x, &routes, &kernels)
    } else if m.capacity_factor > 0.0 {
        dropping(c, m, x, &routes, &kernels, products)
    } else {
        every_expert(c, m, x, &routes, &kernels, products)
    };
    MoeOutput { output, load_balance_loss }
}

/// DeepSeek's routes from the gate logits `[batch, seq, E]` (in the gate's dtype), and the
/// biased scores that choose the experts. The weights are the chosen experts' unbiased scores
/// (DeepSeek-V3's routing) or biased ones (MaxText's for other model names), normalized
/// (sigmoid scores) and scaled, in `dtype`.
fn deepseek_routes(c: &ModelConfig, m: &MoeConfig, r: &DeepSeekRouter, p: &Tree, logits: &Tensor) -> (Routes, Tensor) {
    let scores = match r.score_func {
        RoutedScoreFunc::Logits => logits.clone(),
        RoutedScoreFunc::Sigmoid => logits.sigmoid(),
        RoutedScoreFunc::Softmax => logits.softmax(-1),
    };
    let biased = match r.bias {
        true => &scores + &p["gate.bias"].astype(scores.dtype()),
        false => scores.clone(),
    };
    // The choice (the bias and the group mask) has no gradient: the bias reaches the loss only
    // through the biased weights of a model not routed as DeepSeek-V3.
    let choice = match r.groups {
        None => biased.stop_gradient(),
        Some((groups, top_groups)) => in_best_groups(c, m, &biased.stop_gradient(), groups, top_groups),
    };
    let (_, experts) = choice.top_k(m.num_experts_per_tok);
    let mut weights = match r.v3 {
        true => scores.take_along_axis(&experts, -1),
        false => biased.take_along_axis(&experts, -1),
    };
    if r.score_func == RoutedScoreFunc::Sigmoid {
        weights = &weights / &(weights.sum_keepdims(&[-1]) + 1e-20);
    }
    let weights = (weights * r.scaling_factor).astype(c.dtype);
    (Routes { weights, experts }, biased)
}

/// `scores` `[batch, seq, E]` with the experts outside each token's `top_groups` best of
/// `groups` equal groups set to -inf; a group scores the sum of its two best scores (in f32).
fn in_best_groups(c: &ModelConfig, m: &MoeConfig, scores: &Tensor, groups: i64, top_groups: i64) -> Tensor {
    let (b, s, e) = (scores.shape()[0], scores.shape()[1], m.num_experts);
    let grouped = scores.reshape(&[b, s, groups, e / groups]);
    let (top2, _) = grouped.top_k(2);
    let (_, best) = top2.astype(wide(c)).sum(&[-1]).top_k(top_groups);
    let chosen = best.one_hot(groups, DType::S32).sum(&[-2]).gt(0);
    let mask = chosen.expand_dims(-1).broadcast_to(&[b, s, groups, e / groups]).reshape(&[b, s, e]);
    where_(&mask, scores, f64::NEG_INFINITY)
}

/// `mean_{b,e}(density[b,e] x probability[b,e]) x E^2 x weight`, where `density` is the fraction
/// of sequence `b`'s tokens assigned to expert `e` (counting each of the k choices) and
/// `probability` the mean softmax probability of `e` over the sequence.
fn load_balance_loss(c: &ModelConfig, m: &MoeConfig, logits: &Tensor, experts: &Tensor) -> Tensor {
    let probs = logits.astype(wide(c)).softmax(-1).astype(c.dtype).astype(wide(c));
    let assigned = experts.one_hot(m.num_experts, wide(c)).sum(&[2]);
    let density = assigned.mean(&[1]);
    let density_prob = probs.mean(&[1]);
    let e = m.num_experts as f64;
    (density * &density_prob).mean_all() * (e * e * m.load_balance_loss_weight)
}

/// The experts' activation on the two up-projections, in `dtype`: SwiGLU, or gpt-oss's clamped
/// GLU.
fn activation(c: &ModelConfig, m: &MoeConfig, gate: &Tensor, up: &Tensor) -> Tensor {
    match &m.gpt_oss {
        None if m.router == Router::Gemma4 => (gate.gelu() * up).astype(c.dtype),
        None => (gate.silu() * up).astype(c.dtype),
        Some(g) => {
            let gate = gate.minimum(g.limit);
            let up = up.clamp(-g.limit, g.limit);
            (&gate * &g.activation.apply(&(&gate * GPT_OSS_ALPHA)) * &(up + 1.0)).astype(c.dtype)
        }
    }
}

/// `y` plus each row's expert's bias: `bias: [E, n]` taken by `experts` (any shape), broadcast
/// over `y`'s trailing dim.
fn plus_bias(y: Tensor, bias: &Tensor, experts: &Tensor) -> Tensor {
    y + &bias.take(experts)
}

/// [`dropless`] on each batch shard's own tokens (MaxText's `sparse_matmul` in a `shard_map` over
/// the batch axes): sorting the whole batch's assignments on every device would hold
/// `global tokens x k` rows per device, growing with the mesh. Each device gets the experts'
/// kernels whole (MaxText's all-gather), as one slice of a copy per batch shard, so that their
/// gradients are per-shard values which the partitioner sums outside. Without batch shards (or a
/// batch they do not divide) the block runs as traced.
fn dropless_per_shard(c: &ModelConfig, m: &MoeConfig, x: &Tensor, routes: &Routes, kernels: &Kernels) -> Tensor {
    let Some(mesh) = x.trace().mesh().cloned() else { return dropless(c, m, x, routes, kernels) };
    let axes: Vec<String> = c.rules.spec(&["activation_batch_moe"], &mesh).dim(0).to_vec();
    let axes: Vec<String> = axes.into_iter().filter(|a| mesh.axis_size(a).is_some_and(|n| n > 1)).collect();
    let shards: i64 = axes.iter().map(|a| mesh.axis_size(a).unwrap_or(1) as i64).product();
    if shards == 1 || x.shape()[0] % shards != 0 {
        return dropless(c, m, x, routes, kernels);
    }
    let split = |rank: usize| {
        PartitionSpec::from_axes(std::iter::once(axes.clone()).chain(std::iter::repeat_n(vec![], rank - 1)).collect())
    };
    let copies = |w: &Tensor| {
        let shape: Vec<i64> = std::iter::once(shards).chain(w.shape().iter().copied()).collect();
        w.expand_dims(0).broadcast_to(&shape)
    };
    let (wi_0, wi_1, wo) = (copies(&kernels.wi_0), copies(&kernels.wi_1), copies(&kernels.wo));
    let biases: Vec<Tensor> = kernels.biases.iter().flatten().map(copies).collect();
    let mut operands = vec![x, &routes.weights, &routes.experts, &wi_0, &wi_1, &wo];
    operands.extend(&biases);
    let mut specs = vec![split(3), split(3), split(3), split(4), split(4), split(4)];
    specs.extend(biases.iter().map(|_| split(3)));
    let out = manual_computation(&operands, &specs, &[split(3)], |local| {
        let whole = |w: &Tensor| w.reshape(&w.shape()[1..]);
        let routes = Routes { weights: local[1].clone(), experts: local[2].clone() };
        let biases = (local.len() == 9).then(|| [whole(&local[6]), whole(&local[7]), whole(&local[8])]);
        let kernels = Kernels { wi_0: whole(&local[3]), wi_1: whole(&local[4]), wo: whole(&local[5]), biases };
        vec![dropless(c, m, &local[0], &routes, &kernels)]
    });
    out[0].clone()
}

/// Sorts the `tokens x k` assignments by expert, runs each expert on its rows, and sums each
/// token's k results with its routing weights.
fn dropless(c: &ModelConfig, m: &MoeConfig, x: &Tensor, routes: &Routes, kernels: &Kernels) -> Tensor {
    let (weights, experts) = (&routes.weights, &routes.experts);
    let (wi_0, wi_1, wo) = (&kernels.wi_0, &kernels.wi_1, &kernels.wo);
    let (b, s, emb) = (x.shape()[0], x.shape()[1], x.shape()[2]);
    let k = m.num_experts_per_tok;
    let tokens = x.reshape(&[b * s, emb]);
    let flat = experts.reshape(&[b * s * k]);
    // Assignment `i` is token `i / k`'s choice `i % k`; `order` lists them grouped by expert.
    let order = flat.argsort(0);
    let sorted = tokens.take(&(&order / k as i32));
    let group_sizes = flat.one_hot(m.num_experts, DType::S32).sum(&[0]);
    // The expert of each sorted row, for the biases.
    let row_experts = flat.take(&order);
    let bias = |y: Tensor, i: usize| match &kernels.biases {
        Some(biases) => plus_bias(y, &biases[i], &row_experts),
        None => y,
    };
    let gate = bias(sorted.ragged_dot(wi_0, &group_sizes), 0).checkpoint_name("moe_mlpwi_0");
    let up = bias(sorted.ragged_dot(wi_1, &group_sizes), 1).checkpoint_name("moe_mlpwi_1");
    let out = bias(activation(c, m, &gate, &up).ragged_dot(wo, &group_sizes), 2).checkpoint_name("moe_mlpwo");
    let unsorted = out.take(&order.argsort(0)).reshape(&[b * s, k, emb]);
    let sum_dtype = if m.float32_weight_sum { wide(c) } else { c.dtype };
    let combined =
        einsum("tke,tk->te", &[&unsorted.astype(sum_dtype), &weights.reshape(&[b * s, k]).astype(sum_dtype)]);
    combined.reshape(&[b, s, emb]).astype(c.dtype)
}

/// The routing weights as a dense `[batch, seq, experts]` array (zero for unchosen experts).
fn dense_weights(c: &ModelConfig, m: &MoeConfig, weights: &Tensor, experts: &Tensor) -> Tensor {
    (experts.one_hot(m.num_experts, c.dtype) * &weights.expand_dims(-1)).sum(&[2])
}

/// Capacity-limited experts: per sequence, expert `e` takes the first `C` assignments to it in
/// (position, choice) order; a dropped assignment contributes nothing.
fn dropping(
    c: &ModelConfig,
    m: &MoeConfig,
    x: &Tensor,
    routes: &Routes,
    kernels: &Kernels,
    products: Products,
) -> Tensor {
    let (weights, experts) = (&routes.weights, &routes.experts);
    let (wi_0, wi_1, wo) = (&kernels.wi_0, &kernels.wi_1, &kernels.wo);
    let (b, s) = (x.shape()[0], x.shape()[1]);
    let (e, k) = (m.num_experts, m.num_experts_per_tok);
    let cap = m.capacity(s);
    // 1-based arrival order of each assignment at its expert, counted over (position, choice).
    let chosen = experts.one_hot(e, DType::S32);
    let arrivals = chosen.reshape(&[b, s * k, e]).cumsum(1).reshape(&[b, s, k, e]);
    let kept = &chosen * &arrivals.le(cap as i32).astype(DType::S32);
    let kept_any = kept.sum(&[2]);
    let slot = (&chosen * &arrivals).sum(&[2]) * &kept_any;
    // Slot 0 means "not taken"; slots 1..=C are the capacity positions.
    let position = slot.one_hot(cap + 1, c.dtype).slice_axis(-1, 1, cap + 1);
    let routed = dense_weights(c, m, weights, experts) * &kept_any.astype(c.dtype);
    let mask_axes = ["activation_batch_moe", "activation_norm_length_moe", "", ""];
    let combine = constrain(c, routed.expand_dims(-1) * &position, &mask_axes);
    let dispatch = constrain(c, combine.ne(0.0).astype(c.dtype), &mask_axes);
    let expert_axes = |last: &'static str| ["activation_exp", "activation_batch_moe", "", last];
    let tokens = products.einsum(0, "bsm,bsec->ebcm", x, &dispatch);
    let tokens = constrain_dispatch(c, m, tokens, &expert_axes("activation_embed_moe"));
    // With expert parallelism, MaxText pins the kernels to their expert sharding here, so the
    // partitioner gathers their embed dim rather than moving the experts
    // (`maybe_all_gather_kernel_weight_in_expert_parallelism`).
    let expert_parallel = x.trace().mesh().and_then(|m| m.axis_size("expert")).is_some_and(|n| n > 1);
    let kernel = |w: &Tensor, axes: &[&str]| match expert_parallel {
        true => constrain(c, w.clone(), axes),
        false => w.clone(),
    };
    let wi_0 = kernel(wi_0, &["exp", "", "mlp"]);
    let wi_1 = kernel(wi_1, &["exp", "", "mlp"]);
    let wo = kernel(wo, &["exp", "mlp", ""]);
    let [tokens, wi_0, wi_1, wo] = fence_expert_gradients(x, [tokens, wi_0, wi_1, wo]);
    // A bias `[E, n]` on `[E, B, C, n]` (dropped slots get it too; their combine weight is 0).
    let bias = |y: Tensor, i: usize| match &kernels.biases {
        Some(biases) => {
            let n = biases[i].shape()[1];
            y + &biases[i].reshape(&[e, 1, 1, n])
        }
        None => y,
    };
    let up_projection = |i: usize, w: &Tensor| {
        let y = bias(products.einsum(i, "ebcm,emh->ebch", &tokens, w), i - 1);
        constrain_dispatch(c, m, y, &expert_axes("activation_mlp"))
    };
    let gate = up_projection(1, &wi_0).checkpoint_name("moe_mlpwi_0");
    let up = up_projection(2, &wi_1).checkpoint_name("moe_mlpwi_1");
    let out = bias(products.einsum(3, "ebch,ehm->ebcm", &activation(c, m, &gate, &up), &wo), 2);
    let out = constrain(c, out, &expert_axes("activation_embed_moe")).checkpoint_name("moe_mlpwo");
    products.einsum(4, "ebcm,bsec->bsm", &out, &combine)
}

/// The dispatched tokens and the experts' kernels of [`dropping`], their cotangents fenced together
/// on a mesh of several devices (`fence_cotangents`): the backward pass computes the three kernels'
/// gradients before the tokens' cotangent goes on to the dispatch, the router and attention. The
/// partitioner gathers each layer's kernels whole (`[E, emb, mlp]`, every expert) and sums their
/// gradients across the batch shards; left free in a scanned stack, XLA defers a layer's
/// gradient products and their reduce-scatters to the next iteration and prefetches the next
/// layer's kernels while this layer's are still read, so that both layers' gathered kernels and
/// unreduced gradients are alive at once (issue 46: on MaxText's Mixtral 8x7B test recipe with
/// expert parallelism 8, 3.2 GiB more than MaxText's own step, which XLA schedules otherwise from
/// the same products). Fenced, each layer's gradients are reduced before the next layer's kernels
/// arrive. The values are unchanged; on one device nothing is gathered, and nothing is fenced.
fn fence_expert_gradients(x: &Tensor, operands: [Tensor; 4]) -> [Tensor; 4] {
    if x.trace().mesh().is_none_or(|mesh| mesh.size() <= 1) {
        return operands;
    }
    fence_cotangents(&operands.iter().collect::<Vec<_>>()).try_into().expect("four fenced operands")
}

/// Every expert on every token, weighted by the routing weights.
fn every_expert(
    c: &ModelConfig,
    m: &MoeConfig,
    x: &Tensor,
    routes: &Routes,
    kernels: &Kernels,
    products: Products,
) -> Tensor {
    let (weights, experts) = (&routes.weights, &routes.experts);
    let (wi_0, wi_1, wo) = (&kernels.wi_0, &kernels.wi_1, &kernels.wo);
    let x = constrain(c, x.clone(), &["activation_batch_moe", "activation_norm_length_moe", "activation_embed_moe"]);
    // A bias `[E, n]` broadcasts over `[batch, seq, E, n]`.
    let bias = |y: Tensor, i: usize| match &kernels.biases {
        Some(biases) => y + &biases[i],
        None => y,
    };
    let gate = bias(products.einsum(0, "bsm,emh->bseh", &x, wi_0), 0).checkpoint_name("mlpwi_0");
    let up = bias(products.einsum(1, "bsm,emh->bseh", &x, wi_1), 1).checkpoint_name("mlpwi_1");
    let out = bias(products.einsum(2, "bseh,ehm->bsem", &activation(c, m, &gate, &up), wo), 2).checkpoint_name("mlpwo");
    let sum_dtype = if m.float32_weight_sum { wide(c) } else { c.dtype };
    let dense = dense_weights(c, m, weights, experts);
    einsum("bsem,bse->bsm", &[&out.astype(sum_dtype), &dense.astype(sum_dtype)]).astype(c.dtype)
}

/// `constrain` for the dispatched tokens `[E, B, C, ...]`. With `dispatch_no_expert_sharding`
/// each dim is resolved on its own and the `expert` mesh axis is taken off the batch dim
/// (MaxText's `_maybe_shard_moe_dispatch`), leaving it to the experts; otherwise the joint
/// resolution gives `expert` to the batch, whose rule comes first.
fn constrain_dispatch(c: &ModelConfig, m: &MoeConfig, x: Tensor, logical: &[&str]) -> Tensor {
    if !m.dispatch_no_expert_sharding {
        return constrain(c, x, logical);
    }
    let Some(mesh) = x.trace().mesh().cloned() else { return x };
    let dims = logical
        .iter()
        .enumerate()
        .map(|(d, name)| {
            let axes = c.rules.spec(&[name], &mesh).dim(0).to_vec();
            axes.into_iter().filter(|a| d != 1 || a != "expert").collect()
        })
        .collect();
    x.with_sharding_constraint(&PartitionSpec::from_axes(dims))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::model::Model;

    fn load(keys: &[&str]) -> Config {
        let mut all = vec!["num_experts=16".to_string(), "num_experts_per_tok=4".to_string()];
        all.extend(keys.iter().map(|k| k.to_string()));
        crate::config::load(None, &all).expect("the keys load")
    }

    /// [`load`] under a DeepSeek-V3 model name, whose MoE MaxText routes as DeepSeek-V3.
    fn load_v3(keys: &[&str]) -> Config {
        load(&[&["model_name=deepseek3-test", "override_model_config=true"], keys].concat())
    }

    #[test]
    fn deepseek_routing_reads_its_keys() {
        let c = load_v3(&[
            "n_routing_groups=4",
            "topk_routing_group=2",
            "routed_score_func=sigmoid",
            "routed_bias=true",
            "routed_scaling_factor=2.5",
            "shared_experts=2",
        ]);
        let m = MoeConfig::deepseek(&c).expect("valid routing");
        let want = DeepSeekRouter {
            score_func: RoutedScoreFunc::Sigmoid,
            bias: true,
            groups: Some((4, 2)),
            scaling_factor: 2.5,
            v3: true,
        };
        assert_eq!((m.router, m.shared_experts), (Router::DeepSeek(want), 2));
        let ungrouped = MoeConfig::deepseek(&load_v3(&["routed_bias=false"])).expect("valid routing");
        assert!(matches!(ungrouped.router, Router::DeepSeek(DeepSeekRouter { groups: None, bias: false, .. })));
    }

    /// MaxText's `get_topk` (`layers/moe.py` at e591f30) routes as DeepSeek-V3 only for a
    /// `model_name` starting with deepseek3 or deepseek4: other names weigh by the biased scores
    /// and have no groups, which are refused rather than ignored.
    #[test]
    fn only_deepseek3_and_deepseek4_names_route_as_deepseek_v3() {
        let route = |c: &Config| match MoeConfig::deepseek(c).expect("valid routing").router {
            Router::DeepSeek(r) => r.v3,
            Router::Softmax | Router::Llama4 | Router::Gemma4 => unreachable!("deepseek routes"),
        };
        assert!(route(&load_v3(&[])));
        assert!(!route(&load(&["routed_bias=true"])));
        let kimi = load(&["model_name=kimi-k2-1t", "override_model_config=true"]);
        assert!(kimi.routed_bias && !route(&kimi));
        let err = MoeConfig::deepseek(&load(&["n_routing_groups=4", "topk_routing_group=2"]))
            .expect_err("no groups outside deepseek3 names")
            .to_string();
        assert!(err.starts_with("n_routing_groups=4: MaxText groups the experts only for"), "{err}");
        assert!(err.contains("model_name=default"), "{err}");
    }

    /// Each invalid combination is refused naming its key and value.
    #[test]
    fn deepseek_routing_refuses_by_name() {
        let cases: [(&[&str], &str); 6] = [
            (&["routed_bias_update_rate=0.001"], "routed_bias_update_rate=0.001: "),
            (&["topk_routing_group=2"], "topk_routing_group=2: needs n_routing_groups"),
            (&["n_routing_groups=3", "topk_routing_group=1"], "n_routing_groups=3: "),
            (&["n_routing_groups=16", "topk_routing_group=1"], "n_routing_groups=16: "),
            (&["n_routing_groups=4", "topk_routing_group=5"], "topk_routing_group=5: "),
            // 2 groups of 2 experts leave fewer than 4 to choose from.
            (&["n_routing_groups=8", "topk_routing_group=1"], "topk_routing_group=1: "),
        ];
        for (keys, culprit) in cases {
            let err = MoeConfig::deepseek(&load_v3(keys)).expect_err(culprit).to_string();
            assert!(err.starts_with(culprit), "{keys:?}: {err}");
        }
    }

    /// DeepSeek-V3's MoE layer per token, by MaxText's
    /// `calculate_routed_and_shared_ffn_tflops_per_device` (maxtext_utils.py, e591f30): the gate
    /// `2 x 7168 x 256`, and 8 routed + 1 shared SwiGLU experts of `2 x 7168 x 2048 x 3` each.
    #[test]
    fn routed_and_shared_flops_are_maxtexts() {
        let c = load(&["num_experts=256", "num_experts_per_tok=8", "shared_experts=1"]);
        let m = MoeConfig::deepseek(&c).expect("valid routing");
        let want = 2.0 * 7168.0 * 256.0 + 9.0 * (2.0 * 7168.0 * 2048.0 * 3.0);
        assert_eq!(routed_and_shared_flops(&m, 7168, 2048, 1.0), want);
    }

    /// Only deepseek (and gpt_oss, `routed_bias`) reads the DeepSeek routing keys: a non-default
    /// value is refused elsewhere.
    #[test]
    fn other_families_refuse_the_routing_keys() {
        let c = load(&["decoder_block=mixtral", "routed_bias=true"]);
        let err = Model::from_config(&c).expect_err("mixtral does not route with a bias").to_string();
        assert!(err.starts_with("routed_bias=true: decoder_block=mixtral does not use routed_bias"), "{err}");
        assert!(err.ends_with("it applies to decoder_block deepseek, gpt_oss"), "{err}");
    }
}
