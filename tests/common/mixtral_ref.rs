//! An independent f64 reference of the Mixtral model: Llama's reference attention
//! (`llama_ref`) with the MoE block of `moe_ref` in place of the MLP, the load-balancing loss
//! averaged over layers and added to the cross-entropy, and the conversion of reference
//! parameters to the model's program inputs.

use super::llama_ref::{self, attention, rms_norm, RefParams, B, T};
use super::moe_ref::{moe, MoeParams, Routing};
use maxrs::host::HostTensor;
use maxrs::model::Model;
use maxrs::tensor::Tree;
use ndarray::{Array2, Axis};

/// A tiny Mixtral (emb 64, 4 query heads over 2 kv heads of 16, experts 96 wide, vocab 128,
/// 2 layers; 4 experts, top-2) in f32 with `extra` overrides.
pub fn config(scan_layers: bool, extra: &[&str]) -> Model {
    let mut overrides: Vec<&str> = vec![
        "decoder_block=mixtral",
        "num_experts=4",
        "num_experts_per_tok=2",
        "base_emb_dim=64",
        "head_dim=16",
        "base_mlp_dim=96",
        "vocab_size=128",
    ];
    overrides.extend(extra);
    llama_ref::config(scan_layers, &overrides)
}

/// Llama's reference parameters (the `mlp.*` kernels unused) and one MoE block per layer.
pub struct MixtralParams {
    pub base: RefParams,
    pub moe: Vec<MoeParams>,
}

pub fn random_params(c: &Model, seed: u64) -> MixtralParams {
    let base = llama_ref::random_params(c, seed);
    let (emb, mlp) = (c.config.emb as usize, c.config.mlp as usize);
    let experts = num_experts(c);
    let moe = (0..c.config.layers).map(|l| MoeParams::random(emb, mlp, experts, seed * 100 + l as u64)).collect();
    MixtralParams { base, moe }
}

pub fn num_experts(c: &Model) -> usize {
    c.param_defs()
        .iter()
        .find(|d| d.name.contains("MoeBlock_0.wi_0"))
        .map(|d| d.shape[d.shape.len() - 3] as usize)
        .unwrap()
}

/// The parameters as program inputs `params.<name>` in the model's layout.
pub fn host_params(c: &Model, p: &MixtralParams) -> Tree<HostTensor> {
    let f32t = |dims: &[i64], values: Vec<f64>| {
        HostTensor::from_f32(dims, &values.iter().map(|&x| x as f32).collect::<Vec<_>>())
    };
    let flat = |a: &Array2<f64>| a.iter().copied().collect::<Vec<f64>>();
    let mut out = Tree::new();
    for def in c.param_defs() {
        // (layer, name within the layer), or a shared parameter.
        let layer_param = match def.name.strip_prefix("decoder.layers.") {
            Some(rest) => Some((None, rest.to_string())),
            None => def.name.strip_prefix("decoder.layers_").map(|rest| {
                let (i, name) = rest.split_once('.').unwrap();
                (Some(i.parse::<usize>().unwrap()), name.to_string())
            }),
        };
        let values: Vec<f64> = match layer_param {
            None => match def.name.as_str() {
                "token_embedder.embedding" => flat(&p.base.embedding),
                "decoder.decoder_norm.scale" => flat(&p.base.final_norm),
                "decoder.logits_dense.kernel" => flat(p.base.logits_dense.as_ref().unwrap()),
                other => panic!("unexpected parameter {other}"),
            },
            Some((layer, name)) => {
                let one = |l: usize| -> Vec<f64> {
                    match name.strip_prefix("MoeBlock_0.") {
                        Some(moe_name) => p.moe[l].named().into_iter().find(|(n, _, _)| *n == moe_name).unwrap().2,
                        None => flat(&p.base.layers[l][name.as_str()]),
                    }
                };
                match layer {
                    Some(l) => one(l),
                    None => (0..p.moe.len()).flat_map(one).collect(),
                }
            }
        };
        assert_eq!(values.len() as i64, def.shape.iter().product::<i64>(), "{}", def.name);
        out.insert(format!("params.{}", def.name), f32t(&def.shape, values));
    }
    out
}

pub struct MixtralOut {
    pub layers: Vec<Array2<f64>>,
    pub logits: Array2<f64>,
    /// The cross-entropy plus the weighted load-balancing loss.
    pub loss: f64,
    /// The load-balancing loss (unweighted), averaged over layers.
    pub load_balance: f64,
    pub dropped: usize,
    /// The smallest router margin over all layers (see `MoeRef::min_margin`).
    pub min_margin: f64,
}

/// The model on `tokens` (`[B*T]`), with the loss on `targets` masked by `seg`.
pub fn reference(
    c: &Model,
    p: &MixtralParams,
    b: &llama_ref::Batch,
    k: usize,
    routing: Routing,
    lb_weight: f64,
) -> MixtralOut {
    let e = c.config.emb as usize;
    let mut x = Array2::<f64>::zeros((B * T, e));
    for (r, &tok) in b.tokens.iter().enumerate() {
        x.row_mut(r).assign(&p.base.embedding.row(tok as usize));
    }
    let (mut layers, mut load_balance, mut dropped, mut min_margin) = (Vec::new(), 0.0, 0, f64::INFINITY);
    for (l, attn) in p.base.layers.iter().enumerate() {
        let h = rms_norm(&x, &attn["pre_self_attention_layer_norm.scale"], c.config.eps);
        x = &x + &attention(c, attn, &h);
        let h = rms_norm(&x, &attn["post_self_attention_layer_norm.scale"], c.config.eps);
        let sequences: Vec<Array2<f64>> =
            (0..B).map(|s| h.slice(ndarray::s![s * T..(s + 1) * T, ..]).to_owned()).collect();
        let block = moe(&p.moe[l], &sequences, k, routing);
        let views: Vec<_> = block.outputs.iter().map(|o| o.view()).collect();
        x = &x + &ndarray::concatenate(Axis(0), &views).unwrap();
        load_balance += block.load_balance / p.moe.len() as f64;
        dropped += block.dropped;
        min_margin = min_margin.min(block.min_margin);
        layers.push(x.clone());
    }
    let y = rms_norm(&x, &p.base.final_norm, c.config.eps);
    let logits = y.dot(p.base.logits_dense.as_ref().unwrap());
    let loss = llama_ref::cross_entropy(&logits, &b.targets, &b.seg, 0.0) + lb_weight * load_balance;
    MixtralOut { layers, logits, loss, load_balance, dropped, min_margin }
}

/// The program inputs: parameters and the batch.
pub fn inputs(c: &Model, p: &MixtralParams, b: &llama_ref::Batch) -> Tree<HostTensor> {
    llama_ref::with_batch(host_params(c, p), b)
}
