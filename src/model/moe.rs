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
//!   results are put back in token order (`permute` / `sparse_matmul` / `unpermute`).
//! - `sparse_matmul=false`, `capacity_factor > 0`: token dropping (`dense_matmul`'s dispatch
//!   path). Each expert takes at most `C = max(ceil(S k / E) x capacity_factor, capacity_factor)`
//!   tokens of each sequence, first come first served in (position, choice) order; the others
//!   skip that expert. Tokens move to `[E, B, C, emb]` buffers by a one-hot dispatch einsum and
//!   back by the weighted combine einsum; with the expert axis sharding the experts, the
//!   partitioner turns these into all-to-alls.
//! - `sparse_matmul=false`, `capacity_factor <= 0`: every expert on every token, weighted by the
//!   (mostly zero) routing weights (`dense_matmul` without capacity).
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

use super::decoder::constrain;
use super::{ModelConfig, ParamDef, ParamInit};
use crate::config::Config;
use crate::ir::DType;
use crate::sharding::PartitionSpec;
use crate::tensor::{einsum, Tensor, Tree};

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
        }
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
        | DType::S32
        | DType::U32
        | DType::Pred => DType::F32,
    }
}

/// The block's parameters, relative to it, for `emb`-wide tokens and `mlp`-wide experts.
pub fn param_defs(m: &MoeConfig, emb: i64, mlp: i64) -> Vec<ParamDef> {
    let e = m.num_experts;
    let def = |name: &str, shape: &[i64], logical: &[&'static str], init| ParamDef {
        name: name.to_string(),
        shape: shape.to_vec(),
        logical: logical.to_vec(),
        init,
    };
    vec![
        def("gate.kernel", &[emb, e], &["embed", ""], ParamInit::FanIn(emb)),
        def("wi_0", &[e, emb, mlp], &["exp", "embed_moe", "mlp_moe"], ParamInit::FanIn(e * mlp)),
        def("wi_1", &[e, emb, mlp], &["exp", "embed_moe", "mlp_moe"], ParamInit::FanIn(e * mlp)),
        def("wo", &[e, mlp, emb], &["exp", "mlp_moe", "embed_moe"], ParamInit::FanIn(e * emb)),
    ]
}

/// The block's result: its output and, with `load_balance_loss_weight > 0`, the weighted
/// load-balancing loss (an f32 scalar).
pub struct MoeOutput {
    pub output: Tensor,
    pub load_balance_loss: Option<Tensor>,
}

/// Where the router sends each token: `[batch, seq, k]` weights (in `dtype`) and s32 expert ids.
struct Routes {
    weights: Tensor,
    experts: Tensor,
}

/// The experts' kernels, in `dtype`: `wi_0`, `wi_1` `[E, emb, mlp]`, `wo` `[E, mlp, emb]`.
struct Kernels {
    wi_0: Tensor,
    wi_1: Tensor,
    wo: Tensor,
}

/// The block on `x: [batch, seq, emb]` (in `dtype`) with its parameters `p`.
pub fn moe_block(c: &ModelConfig, m: &MoeConfig, p: &Tree, x: &Tensor) -> MoeOutput {
    let gate_dtype = if m.float32_gate_logits { wide(c) } else { c.dtype };
    let logits = x.astype(gate_dtype).matmul(&p["gate.kernel"].astype(gate_dtype));
    let logits = constrain(c, logits, &["activation_batch_moe", "activation_length_moe", ""]);
    let (top_logits, experts) = logits.top_k(m.num_experts_per_tok);
    let weights = top_logits.astype(wide(c)).softmax(-1).astype(c.dtype);
    let load_balance_loss = (m.load_balance_loss_weight > 0.0).then(|| load_balance_loss(c, m, &logits, &experts));
    let w = |name: &str| p[name].astype(c.dtype);
    let kernels = Kernels { wi_0: w("wi_0"), wi_1: w("wi_1"), wo: w("wo") };
    let routes = Routes { weights, experts };
    let output = if m.sparse_matmul {
        dropless(c, m, x, &routes, &kernels)
    } else if m.capacity_factor > 0.0 {
        dropping(c, m, x, &routes, &kernels)
    } else {
        every_expert(c, m, x, &routes, &kernels)
    };
    MoeOutput { output, load_balance_loss }
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

/// SwiGLU on the two up-projections, in `dtype`.
fn activation(c: &ModelConfig, gate: &Tensor, up: &Tensor) -> Tensor {
    (gate.silu() * up).astype(c.dtype)
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
    let gate = sorted.ragged_dot(wi_0, &group_sizes).checkpoint_name("moe_mlpwi_0");
    let up = sorted.ragged_dot(wi_1, &group_sizes).checkpoint_name("moe_mlpwi_1");
    let out = activation(c, &gate, &up).ragged_dot(wo, &group_sizes).checkpoint_name("moe_mlpwo");
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
fn dropping(c: &ModelConfig, m: &MoeConfig, x: &Tensor, routes: &Routes, kernels: &Kernels) -> Tensor {
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
    let tokens =
        constrain_dispatch(c, m, einsum("bsm,bsec->ebcm", &[x, &dispatch]), &expert_axes("activation_embed_moe"));
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
    let gate = constrain_dispatch(c, m, einsum("ebcm,emh->ebch", &[&tokens, &wi_0]), &expert_axes("activation_mlp"))
        .checkpoint_name("moe_mlpwi_0");
    let up = constrain_dispatch(c, m, einsum("ebcm,emh->ebch", &[&tokens, &wi_1]), &expert_axes("activation_mlp"))
        .checkpoint_name("moe_mlpwi_1");
    let out = einsum("ebch,ehm->ebcm", &[&activation(c, &gate, &up), &wo]);
    let out = constrain(c, out, &expert_axes("activation_embed_moe")).checkpoint_name("moe_mlpwo");
    einsum("ebcm,bsec->bsm", &[&out, &combine])
}

/// Every expert on every token, weighted by the routing weights.
fn every_expert(c: &ModelConfig, m: &MoeConfig, x: &Tensor, routes: &Routes, kernels: &Kernels) -> Tensor {
    let (weights, experts) = (&routes.weights, &routes.experts);
    let (wi_0, wi_1, wo) = (&kernels.wi_0, &kernels.wi_1, &kernels.wo);
    let x = constrain(c, x.clone(), &["activation_batch_moe", "activation_norm_length_moe", "activation_embed_moe"]);
    let gate = einsum("bsm,emh->bseh", &[&x, wi_0]).checkpoint_name("mlpwi_0");
    let up = einsum("bsm,emh->bseh", &[&x, wi_1]).checkpoint_name("mlpwi_1");
    let out = einsum("bseh,ehm->bsem", &[&activation(c, &gate, &up), wo]).checkpoint_name("mlpwo");
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
