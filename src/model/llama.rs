//! The Llama-2-style decoder (MaxText's `decoder_block: llama2`), top to bottom:
//!
//! 1. `LlamaConfig`: the sizes and numerics taken from the run's `Config`.
//! 2. Parameters: `param_defs` lists every parameter with MaxText's name, its shape, the logical
//!    axis name of each dimension (for the sharding rules) and its initializer; `init_params`
//!    draws them deterministically from `init_weights_seed`.
//! 3. The forward pass: token embedding -> `layers` x `decoder_layer` -> final RMSNorm -> logits.
//!    `decoder_layer` is RMSNorm -> q/k/v projections -> RoPE -> grouped-query causal attention
//!    -> out projection -> residual -> RMSNorm -> SwiGLU MLP -> residual.
//! 4. The loss: masked mean cross-entropy (+ optional z-loss), in f32.
//!
//! Parameter layout (the names are those of a MaxText checkpoint's `params` tree, joined by dots):
//!
//! | name | shape | logical axes | init |
//! |---|---|---|---|
//! | `token_embedder.embedding` | [vocab, emb] | vocab, embed | normal(1.0) |
//! | `decoder.layers.pre_self_attention_layer_norm.scale` | [emb] | norm | ones |
//! | `decoder.layers.self_attention.query.kernel` | [emb, heads, head_dim] | embed, heads, kv | fan_in |
//! | `decoder.layers.self_attention.key.kernel` | [emb, kv_heads, head_dim] | embed, kv_heads, kv | fan_in |
//! | `decoder.layers.self_attention.value.kernel` | [emb, kv_heads, head_dim] | embed, kv_heads, kv | fan_in |
//! | `decoder.layers.self_attention.out.kernel` | [heads, head_dim, emb] | heads, kv, embed | fan_in (heads x head_dim) |
//! | `decoder.layers.post_self_attention_layer_norm.scale` | [emb] | norm | ones |
//! | `decoder.layers.mlp.wi_0.kernel` | [emb, mlp] | embed, mlp | fan_in |
//! | `decoder.layers.mlp.wi_1.kernel` | [emb, mlp] | embed, mlp | fan_in |
//! | `decoder.layers.mlp.wo.kernel` | [mlp, emb] | mlp, embed | fan_in |
//! | `decoder.decoder_norm.scale` | [emb] | norm | ones |
//! | `decoder.logits_dense.kernel` | [emb, vocab] | embed, vocab | fan_in (absent with `logits_via_embedding`) |
//!
//! With `scan_layers=true` the per-layer parameters are stacked on a leading `layers` axis
//! (`[layers, ...]`, logical axis `layers`); with `scan_layers=false` layer `i`'s parameters are
//! `decoder.layers_{i}.…` without that axis (MaxText's unscanned names). All parameters have
//! `weight_dtype`. "fan_in" is MaxText's `variance_scaling(1.0, "fan_in", "truncated_normal")`:
//! a normal truncated to ±2 with stddev `sqrt(1 / fan_in) / 0.8796`, fan_in being the product of
//! the input dimensions (`emb` for the projections from the residual stream, `heads x head_dim`
//! for `out`, `mlp` for `wo`).
//!
//! **Query scaling.** Attention scales the queries by `1 / sqrt(head_dim)` explicitly in the
//! forward pass (after RoPE), and the query kernel is initialized like the other kernels. MaxText
//! instead folds `1 / sqrt(head_dim)` into the query kernel's initializer (and its checkpoint
//! converters fold it into the converted query weights) and does not scale at run time: to use a
//! MaxText-converted query kernel here, multiply it by `sqrt(head_dim)`.
//!
//! Numerics: weights are stored in `weight_dtype` and cast to `dtype` where used; activations
//! are `dtype`; RMSNorm statistics, RoPE, the softmax, the logits and the loss are f32.

use crate::config::{self, Config};
use crate::ir::{DType, Signature};
use crate::sharding::LogicalRules;
use crate::tensor::{checkpoint, concatenate, einsum, random, scan, stack, where_, RematPolicy, Tensor, Tree};

// ---------------------------------------------------------------------------------------------
// 1. Configuration
// ---------------------------------------------------------------------------------------------

/// What the model needs from the run's configuration.
#[derive(Clone, Debug)]
pub struct LlamaConfig {
    pub emb: i64,
    pub heads: i64,
    pub kv_heads: i64,
    pub head_dim: i64,
    pub mlp: i64,
    pub layers: i64,
    pub vocab: i64,
    pub eps: f64,
    pub rope_max_timescale: f64,
    pub logits_via_embedding: bool,
    /// Activations.
    pub dtype: DType,
    /// Parameters.
    pub weight_dtype: DType,
    pub scan_layers: bool,
    /// Per-layer rematerialization.
    pub remat: RematPolicy,
    /// Logical axis rules for activation sharding constraints (applied only when tracing on a mesh).
    pub rules: LogicalRules,
}

/// The names `checkpoint_name` gives the layer's weight matmul outputs (MaxText's names).
pub const MATMUL_NAMES: &[&str] = &["query_proj", "key_proj", "value_proj", "out_proj", "mlpwi_0", "mlpwi_1", "mlpwo"];

/// MaxText's `remat_policy` as a tracer policy. `minimal` is MaxText's
/// `checkpoint_dots_with_no_batch_dims` (keep every weight matmul output, recompute the rest);
/// the tracer has no dot-based policy, so it is `SaveNames` of the matmul outputs this model
/// tags (`MATMUL_NAMES`), which are exactly its dots without batch dimensions.
pub fn remat_policy(policy: config::RematPolicy) -> RematPolicy {
    let names = |ns: &[&str]| RematPolicy::SaveNames(ns.iter().map(|n| n.to_string()).collect());
    match policy {
        config::RematPolicy::Full => RematPolicy::Full,
        config::RematPolicy::None => RematPolicy::None,
        config::RematPolicy::SaveQkvProj => names(&["query_proj", "key_proj", "value_proj"]),
        config::RematPolicy::Minimal => names(MATMUL_NAMES),
    }
}

pub fn dtype(d: config::DType) -> DType {
    match d {
        config::DType::Bfloat16 => DType::BF16,
        config::DType::Float32 => DType::F32,
        config::DType::Float16 => DType::F16,
    }
}

impl LlamaConfig {
    pub fn from_config(c: &Config) -> LlamaConfig {
        LlamaConfig {
            emb: c.base_emb_dim,
            heads: c.base_num_query_heads,
            kv_heads: c.base_num_kv_heads,
            head_dim: c.head_dim,
            mlp: c.base_mlp_dim,
            layers: c.base_num_decoder_layers,
            vocab: c.vocab_size,
            eps: c.normalization_layer_epsilon,
            rope_max_timescale: c.rope_max_timescale as f64,
            logits_via_embedding: c.logits_via_embedding,
            dtype: dtype(c.dtype),
            weight_dtype: dtype(c.weight_dtype),
            scan_layers: c.scan_layers,
            remat: remat_policy(c.remat_policy),
            rules: config::logical_rules(c),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 2. Parameters
// ---------------------------------------------------------------------------------------------

/// How a parameter is initialized.
#[derive(Clone, Debug, PartialEq)]
pub enum ParamInit {
    Ones,
    /// `normal(stddev)`.
    Normal(f64),
    /// `variance_scaling(1.0, "fan_in", "truncated_normal")` with this fan-in.
    FanIn(i64),
}

/// One parameter: full dotted name, shape, logical axis name per dimension, initializer.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamDef {
    pub name: String,
    pub shape: Vec<i64>,
    pub logical: Vec<&'static str>,
    pub init: ParamInit,
}

/// One decoder layer's parameters, relative to the layer (`self_attention.query.kernel`, ...).
fn layer_param_defs(c: &LlamaConfig) -> Vec<ParamDef> {
    let (e, h, kv, d, m) = (c.emb, c.heads, c.kv_heads, c.head_dim, c.mlp);
    let def = |name: &str, shape: &[i64], logical: &[&'static str], init| ParamDef {
        name: name.to_string(),
        shape: shape.to_vec(),
        logical: logical.to_vec(),
        init,
    };
    vec![
        def("pre_self_attention_layer_norm.scale", &[e], &["norm"], ParamInit::Ones),
        def("self_attention.query.kernel", &[e, h, d], &["embed", "heads", "kv"], ParamInit::FanIn(e)),
        def("self_attention.key.kernel", &[e, kv, d], &["embed", "kv_heads", "kv"], ParamInit::FanIn(e)),
        def("self_attention.value.kernel", &[e, kv, d], &["embed", "kv_heads", "kv"], ParamInit::FanIn(e)),
        def("self_attention.out.kernel", &[h, d, e], &["heads", "kv", "embed"], ParamInit::FanIn(h * d)),
        def("post_self_attention_layer_norm.scale", &[e], &["norm"], ParamInit::Ones),
        def("mlp.wi_0.kernel", &[e, m], &["embed", "mlp"], ParamInit::FanIn(e)),
        def("mlp.wi_1.kernel", &[e, m], &["embed", "mlp"], ParamInit::FanIn(e)),
        def("mlp.wo.kernel", &[m, e], &["mlp", "embed"], ParamInit::FanIn(m)),
    ]
}

/// Every parameter of the model, in a fixed order (the order `init_params` draws them in).
pub fn param_defs(c: &LlamaConfig) -> Vec<ParamDef> {
    let mut defs = vec![ParamDef {
        name: "token_embedder.embedding".into(),
        shape: vec![c.vocab, c.emb],
        logical: vec!["vocab", "embed"],
        init: ParamInit::Normal(1.0),
    }];
    for layer in layer_param_defs(c) {
        if c.scan_layers {
            defs.push(ParamDef {
                name: format!("decoder.layers.{}", layer.name),
                shape: [&[c.layers][..], &layer.shape].concat(),
                logical: [&["layers"][..], &layer.logical].concat(),
                init: layer.init,
            });
        } else {
            for i in 0..c.layers {
                defs.push(ParamDef { name: format!("decoder.layers_{i}.{}", layer.name), ..layer.clone() });
            }
        }
    }
    defs.push(ParamDef {
        name: "decoder.decoder_norm.scale".into(),
        shape: vec![c.emb],
        logical: vec!["norm"],
        init: ParamInit::Ones,
    });
    if !c.logits_via_embedding {
        defs.push(ParamDef {
            name: "decoder.logits_dense.kernel".into(),
            shape: vec![c.emb, c.vocab],
            logical: vec!["embed", "vocab"],
            init: ParamInit::FanIn(c.emb),
        });
    }
    defs
}

/// Declares every parameter as an input `{prefix}.{name}` of `sig` (in `weight_dtype`), sharded
/// by the logical rules when the signature has a mesh.
pub fn declare_params(sig: &mut Signature, c: &LlamaConfig, prefix: &str) {
    let mesh = sig.mesh.clone();
    for def in param_defs(c) {
        let input = sig.input(&format!("{prefix}.{}", def.name), c.weight_dtype, &def.shape);
        if let Some(mesh) = &mesh {
            input.sharded(c.rules.spec(&def.logical, mesh));
        }
    }
}

/// Draws every parameter from `key` (a `u32[2]` key, e.g. `random::key(ctx, init_weights_seed)`):
/// parameter `i` of `param_defs` uses `fold_in(key, i)`.
pub fn init_params(c: &LlamaConfig, key: &Tensor) -> Tree {
    param_defs(c)
        .into_iter()
        .enumerate()
        .map(|(i, def)| {
            let k = random::fold_in(key, i as u32);
            let value = match def.init {
                ParamInit::Ones => key.trace().full(1.0, c.weight_dtype, &def.shape),
                ParamInit::Normal(std) => random::normal(&k, &def.shape, DType::F32) * std,
                ParamInit::FanIn(fan_in) => {
                    // The stddev of a standard normal truncated to (-2, 2) is 0.8796...
                    let std = (1.0 / fan_in as f64).sqrt() / 0.879_625_661_034_239_8;
                    random::truncated_normal(&k, -2.0, 2.0, &def.shape, DType::F32) * std
                }
            };
            (def.name, value.astype(c.weight_dtype))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// 3. The forward pass
// ---------------------------------------------------------------------------------------------

/// Pins an activation's sharding by logical axis names (no-op without a mesh).
fn constrain(c: &LlamaConfig, x: Tensor, logical: &[&str]) -> Tensor {
    match x.trace().mesh().cloned() {
        Some(mesh) => x.with_sharding_constraint(&c.rules.spec(logical, &mesh)),
        None => x,
    }
}

const BTE: &[&str] = &["activation_batch", "activation_length", "activation_embed"];

/// What the layers share: RoPE tables and the causal mask, built once per forward pass.
pub struct Shared {
    /// `[seq, head_dim / 2]`, f32.
    pub cos: Tensor,
    pub sin: Tensor,
    /// `[seq, seq]`, true where query position `t` may attend to key position `s` (`s <= t`).
    pub causal: Tensor,
}

impl Shared {
    /// Tables for positions `0..seq`. MaxText's timescales: `max_timescale^(2i / head_dim)` for
    /// `i < head_dim / 2`; the angle of position `p` is `p / timescale`.
    pub fn new(c: &LlamaConfig, like: &Tensor, seq: i64) -> Shared {
        let ctx = like.trace();
        let half = c.head_dim / 2;
        let inv_timescale: Vec<f64> =
            (0..half).map(|i| c.rope_max_timescale.powf(-2.0 * i as f64 / c.head_dim as f64)).collect();
        let angles = ctx.iota(DType::F32, &[seq, half], 0) * &ctx.constant(DType::F32, &[half], &inv_timescale);
        let causal = ctx.iota(DType::S32, &[seq, seq], 0).ge(ctx.iota(DType::S32, &[seq, seq], 1));
        Shared { cos: angles.cos(), sin: angles.sin(), causal }
    }
}

/// Rotary position embedding of `x: [batch, seq, heads, head_dim]`, MaxText's half-split
/// convention: with `x = [x1, x2]` split in halves of the head dimension,
/// `[x1 cos - x2 sin, x2 cos + x1 sin]`. Computed in f32, returned in `x`'s dtype.
pub fn rope(x: &Tensor, s: &Shared) -> Tensor {
    let (b, t, h, k) = (x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]);
    let table = |v: &Tensor| v.broadcast_in_dim(&[b, t, h, k / 2], &[1, 3]);
    let (cos, sin) = (table(&s.cos), table(&s.sin));
    let xf = x.astype(DType::F32);
    let (x1, x2) = (xf.slice_axis(3, 0, k / 2), xf.slice_axis(3, k / 2, k));
    concatenate(&[&(&x1 * &cos - &x2 * &sin), &(&x2 * &cos + &x1 * &sin)], 3).astype(x.dtype())
}

/// The large negative score masked positions get (MaxText's `DEFAULT_MASK_VALUE`).
pub const MASK_VALUE: f64 = -0.7 * f32::MAX as f64;

/// Grouped-query causal self-attention on the normed input `h: [batch, seq, emb]` with one
/// layer's parameters `p`; returns `[batch, seq, emb]`. Query head `i` uses key/value head
/// `i / (heads / kv_heads)`.
pub fn attention(c: &LlamaConfig, p: &Tree, h: &Tensor, s: &Shared) -> Tensor {
    let w = |name: &str| p[name].astype(c.dtype);
    let (b, t) = (h.shape()[0], h.shape()[1]);
    let group = c.heads / c.kv_heads;
    let q = einsum("btd,dhk->bthk", &[h, &w("self_attention.query.kernel")]).checkpoint_name("query_proj");
    let k = einsum("btd,dhk->bthk", &[h, &w("self_attention.key.kernel")]).checkpoint_name("key_proj");
    let v = einsum("btd,dhk->bthk", &[h, &w("self_attention.value.kernel")]).checkpoint_name("value_proj");
    // Explicit query scaling (see the module docs).
    let q = rope(&q, s) * (1.0 / (c.head_dim as f64).sqrt());
    let k = rope(&k, s);
    let q = q.reshape(&[b, t, c.kv_heads, group, c.head_dim]);
    let scores = einsum("btngk,bsnk->bngts", &[&q, &k]).astype(DType::F32);
    let mask = s.causal.broadcast_in_dim(scores.shape(), &[3, 4]);
    let probs = where_(&mask, &scores, MASK_VALUE).softmax(-1).astype(c.dtype);
    let out = einsum("bngts,bsnk->btngk", &[&probs, &v]).reshape(&[b, t, c.heads, c.head_dim]);
    einsum("bthk,hkd->btd", &[&out, &w("self_attention.out.kernel")]).checkpoint_name("out_proj")
}

/// SwiGLU: `(silu(h @ wi_0) * (h @ wi_1)) @ wo`.
pub fn mlp(c: &LlamaConfig, p: &Tree, h: &Tensor) -> Tensor {
    let w = |name: &str| p[name].astype(c.dtype);
    let gate = h.matmul(&w("mlp.wi_0.kernel")).checkpoint_name("mlpwi_0");
    let up = h.matmul(&w("mlp.wi_1.kernel")).checkpoint_name("mlpwi_1");
    (gate.silu() * &up).matmul(&w("mlp.wo.kernel")).checkpoint_name("mlpwo")
}

/// One decoder layer on the residual stream `x: [batch, seq, emb]` (in `dtype`).
pub fn decoder_layer(c: &LlamaConfig, p: &Tree, x: &Tensor, s: &Shared) -> Tensor {
    let h = x.rms_norm(&p["pre_self_attention_layer_norm.scale"], c.eps);
    let x = constrain(c, x + &attention(c, p, &h, s), BTE);
    let h = x.rms_norm(&p["post_self_attention_layer_norm.scale"], c.eps);
    constrain(c, &x + &mlp(c, p, &h), BTE)
}

/// The forward pass's results.
pub struct Forward {
    /// `[batch, seq, emb]` in `dtype`: the token embeddings (input of layer 0).
    pub embeddings: Tensor,
    /// `[layers, batch, seq, emb]`: each layer's output, when asked for.
    pub layer_outputs: Option<Tensor>,
    /// `[batch, seq, vocab]`, f32.
    pub logits: Tensor,
}

/// Embeds `tokens: s32[batch, seq]`, runs the decoder layers (scanned over the stacked
/// parameters with `scan_layers`, unrolled otherwise; each layer a `checkpoint` region under the
/// remat policy), applies the final norm and returns f32 logits. With `keep_layer_outputs` the
/// output of every layer is returned too (for tests; it costs memory).
pub fn forward(c: &LlamaConfig, params: &Tree, tokens: &Tensor, keep_layer_outputs: bool) -> Forward {
    let seq = tokens.shape()[1];
    let embedding = params["token_embedder.embedding"].astype(c.dtype);
    let x = constrain(c, embedding.take(tokens), BTE);
    let s = Shared::new(c, tokens, seq);
    let layer = |x: &Tensor, lp: &Tree| -> Tensor {
        let args = lp.clone().with("__x", x.clone());
        checkpoint(&c.remat, &args, |a| Tree::new().with("x", decoder_layer(c, a, &a["__x"], &s)))["x"].clone()
    };
    let (y, layer_outputs) = if c.scan_layers {
        let (carry, ys) = scan(&Tree::new().with("x", x.clone()), &params.subtree("decoder.layers"), |carry, lp| {
            let y = layer(&carry["x"], lp);
            let ys = if keep_layer_outputs { Tree::new().with("x", y.clone()) } else { Tree::new() };
            (Tree::new().with("x", y), ys)
        });
        (carry["x"].clone(), ys.get("x").cloned())
    } else {
        let mut outs = Vec::new();
        let mut y = x.clone();
        for i in 0..c.layers {
            y = layer(&y, &params.subtree(&format!("decoder.layers_{i}")));
            outs.push(y.clone());
        }
        let stacked = keep_layer_outputs.then(|| stack(&outs.iter().collect::<Vec<_>>(), 0));
        (y, stacked)
    };
    let y = y.rms_norm(&params["decoder.decoder_norm.scale"], c.eps);
    let logits = if c.logits_via_embedding {
        einsum("btd,vd->btv", &[&y, &embedding])
    } else {
        y.matmul(&params["decoder.logits_dense.kernel"].astype(c.dtype))
    };
    let logits =
        constrain(c, logits.astype(DType::F32), &["activation_batch", "activation_length", "activation_vocab"]);
    Forward { embeddings: x, layer_outputs, logits }
}

// ---------------------------------------------------------------------------------------------
// 4. The loss
// ---------------------------------------------------------------------------------------------

/// MaxText's loss on a batch tree with `inputs`, `targets` (s32 `[batch, seq]`) and
/// `targets_segmentation` (s32, 0 = padding): per token `logsumexp(logits) - logits[target]`
/// plus `z_loss_multiplier * logsumexp^2`, masked by `targets_segmentation != 0`, summed and
/// divided by the number of unmasked tokens. Returns the loss and an aux tree with
/// `total_loss` (the masked sum), `total_weights` (the token count) and `z_loss` (its masked
/// mean part of the loss), all f32 scalars.
pub fn loss(c: &LlamaConfig, params: &Tree, batch: &Tree, z_loss_multiplier: f64) -> (Tensor, Tree) {
    let logits = forward(c, params, &batch["inputs"], false).logits;
    loss_from_logits(&logits, &batch["targets"], &batch["targets_segmentation"], z_loss_multiplier)
}

/// The loss of `loss` given f32 logits.
pub fn loss_from_logits(logits: &Tensor, targets: &Tensor, segmentation: &Tensor, z: f64) -> (Tensor, Tree) {
    let vocab = logits.shape()[2];
    let log_z = logits.logsumexp(-1);
    let target_logit = (logits * &targets.one_hot(vocab, DType::F32)).sum(&[-1]);
    let weights = segmentation.ne(0).astype(DType::F32);
    let z_term = log_z.square() * z;
    let xent = (&log_z - &target_logit + &z_term) * &weights;
    let total_loss = xent.sum_all();
    let total_weights = weights.sum_all();
    let loss = &total_loss / &total_weights.maximum(1.0);
    let z_loss = (z_term * &weights).sum_all() / &total_weights.maximum(1.0);
    let aux = Tree::new().with("total_loss", total_loss).with("total_weights", total_weights).with("z_loss", z_loss);
    (loss, aux)
}
