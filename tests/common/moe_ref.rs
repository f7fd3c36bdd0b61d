//! An independent f64 reference of MaxText's routed MoE block (`layers/moe.py`), written with
//! ndarray on one sequence at a time (`[seq, emb]`): router top-k with softmax weights over the
//! chosen logits, SwiGLU experts, first-come-first-served capacity per expert and sequence, and
//! the load-balancing loss. And DeepSeek-V3's routed-and-shared block ([`deepseek_moe`]).

use super::{rng, uniform};
use ndarray::{s, Array2, Array3};

/// One block's parameters: `gate [emb, E]`, `wi_0`/`wi_1 [E, emb, mlp]`, `wo [E, mlp, emb]`.
#[derive(Clone)]
pub struct MoeParams {
    pub gate: Array2<f64>,
    pub wi_0: Array3<f64>,
    pub wi_1: Array3<f64>,
    pub wo: Array3<f64>,
}

impl MoeParams {
    pub fn random(emb: usize, mlp: usize, experts: usize, seed: u64) -> MoeParams {
        let mut r = rng(seed);
        let mut arr3 = |a: usize, b: usize, c: usize, scale: f64| {
            Array3::from_shape_vec((a, b, c), uniform(&mut r, a * b * c, -scale, scale)).unwrap()
        };
        let wi_0 = arr3(experts, emb, mlp, 1.7 / (emb as f64).sqrt());
        let wi_1 = arr3(experts, emb, mlp, 1.7 / (emb as f64).sqrt());
        let wo = arr3(experts, mlp, emb, 1.7 / (mlp as f64).sqrt());
        let gate = arr3(1, emb, experts, 3.0 / (emb as f64).sqrt()).index_axis_move(ndarray::Axis(0), 0);
        MoeParams { gate, wi_0, wi_1, wo }
    }

    /// Every parameter as a flat row-major vector, keyed by the block's parameter names.
    pub fn named(&self) -> Vec<(&'static str, Vec<i64>, Vec<f64>)> {
        let dims = |s: &[usize]| s.iter().map(|&d| d as i64).collect::<Vec<_>>();
        vec![
            ("gate.kernel", dims(self.gate.shape()), self.gate.iter().copied().collect()),
            ("wi_0", dims(self.wi_0.shape()), self.wi_0.iter().copied().collect()),
            ("wi_1", dims(self.wi_1.shape()), self.wi_1.iter().copied().collect()),
            ("wo", dims(self.wo.shape()), self.wo.iter().copied().collect()),
        ]
    }
}

/// How the block computes: dropless (or every expert: the same numbers), or with a capacity.
#[derive(Clone, Copy, Debug)]
pub enum Routing {
    Dropless,
    Capacity(f64),
}

pub struct MoeRef {
    /// Per sequence, `[seq, emb]`.
    pub outputs: Vec<Array2<f64>>,
    /// The load-balancing loss before its weight.
    pub load_balance: f64,
    /// Assignments dropped by the capacity, and kept.
    pub dropped: usize,
    pub kept: usize,
    /// The smallest gap between a token's k-th and (k+1)-th router logit: routing is only
    /// comparable between precisions when this is not tiny.
    pub min_margin: f64,
}

pub fn silu(v: f64) -> f64 {
    v / (1.0 + (-v).exp())
}

fn softmax(v: &[f64]) -> Vec<f64> {
    let m = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = v.iter().map(|x| (x - m).exp()).collect();
    let z: f64 = e.iter().sum();
    e.iter().map(|x| x / z).collect()
}

/// Expert `e`'s SwiGLU MLP on one token.
pub fn expert(p: &MoeParams, e: usize, x: &ndarray::ArrayView1<f64>) -> ndarray::Array1<f64> {
    let gate = x.dot(&p.wi_0.slice(s![e, .., ..])).mapv(silu);
    let up = x.dot(&p.wi_1.slice(s![e, .., ..]));
    (gate * up).dot(&p.wo.slice(s![e, .., ..]))
}

/// The block on each sequence of `xs`, routing `k` of `E` experts.
pub fn moe(p: &MoeParams, xs: &[Array2<f64>], k: usize, routing: Routing) -> MoeRef {
    let experts = p.gate.ncols();
    let (mut dropped, mut kept, mut min_margin) = (0, 0, f64::INFINITY);
    let mut load_balance = 0.0;
    let mut outputs = Vec::new();
    for x in xs {
        let seq = x.nrows();
        let capacity = match routing {
            Routing::Dropless => usize::MAX,
            Routing::Capacity(cf) => (((seq * k) as f64 / experts as f64).ceil() * cf).max(cf) as usize,
        };
        let logits = x.dot(&p.gate);
        let mut arrivals = vec![0usize; experts];
        let mut density = vec![0.0; experts];
        let mut prob = vec![0.0; experts];
        let mut out = Array2::<f64>::zeros(x.raw_dim());
        for t in 0..seq {
            let row: Vec<f64> = logits.row(t).to_vec();
            for (e, q) in softmax(&row).iter().enumerate() {
                prob[e] += q / seq as f64;
            }
            // Stable descending order: ties go to the lower expert.
            let mut order: Vec<usize> = (0..experts).collect();
            order.sort_by(|&a, &b| row[b].partial_cmp(&row[a]).unwrap());
            if k < experts {
                min_margin = min_margin.min(row[order[k - 1]] - row[order[k]]);
            }
            let chosen = &order[..k];
            let weights = softmax(&chosen.iter().map(|&e| row[e]).collect::<Vec<_>>());
            for (&e, w) in chosen.iter().zip(weights) {
                density[e] += 1.0 / seq as f64;
                arrivals[e] += 1;
                if arrivals[e] > capacity {
                    dropped += 1;
                    continue;
                }
                kept += 1;
                let y = expert(p, e, &x.row(t));
                out.row_mut(t).scaled_add(w, &y);
            }
        }
        load_balance += density.iter().zip(&prob).map(|(d, q)| d * q).sum::<f64>();
        outputs.push(out);
    }
    let e = experts as f64;
    load_balance = load_balance / (xs.len() as f64 * e) * e * e;
    MoeRef { outputs, load_balance, dropped, kept, min_margin }
}

/// DeepSeek-V3's block besides the routed experts' `MoeParams`: the router's correction bias
/// `[E]` and the shared MLP (`wi_0`, `wi_1`: `[emb, shared]`, `wo`: `[shared, emb]`).
#[derive(Clone)]
pub struct DeepSeekParams {
    pub routed: MoeParams,
    pub bias: Vec<f64>,
    pub shared_wi_0: Array2<f64>,
    pub shared_wi_1: Array2<f64>,
    pub shared_wo: Array2<f64>,
}

/// DeepSeek-V3's routing settings (Hugging Face's `n_group`, `topk_group`,
/// `routed_scaling_factor`; sigmoid scores, `norm_topk_prob: true`), or with softmax scores
/// (MaxText's `routed_score_func: softmax`, whose weights are not renormalized).
#[derive(Clone, Copy, Debug)]
pub struct DeepSeekRouting {
    pub k: usize,
    pub groups: usize,
    pub top_groups: usize,
    pub scaling: f64,
    pub softmax: bool,
    /// DeepSeek-V3's weights (the chosen experts' unbiased scores); else MaxText's for a
    /// `model_name` not starting with deepseek3/deepseek4 (`get_topk`, `layers/moe.py` at
    /// MaxText e591f30: `jax.lax.top_k` of the biased scores, whose values are the weights;
    /// then `deepseek_scale_weights`, as for V3), which has no groups.
    pub v3: bool,
}

/// What the reference chose, per token (row-major over the sequences).
pub struct DeepSeekRef {
    pub outputs: Vec<Array2<f64>>,
    /// The chosen experts, in descending biased score.
    pub chosen: Vec<Vec<usize>>,
    /// The top k of the biased scores without the group limit, and of the unbiased ones: the
    /// test data must make the groups and the bias matter.
    pub chosen_ungrouped: Vec<Vec<usize>>,
    pub chosen_unbiased: Vec<Vec<usize>>,
    /// The smallest gap between the k-th and (k+1)-th candidate, and between the last chosen
    /// group and the next: a choice comparable across precisions needs both clear of 0.
    pub min_margin: f64,
    /// The smallest biased score (Hugging Face masks other groups with 0, MaxText with -inf:
    /// the same choice while every biased score is positive).
    pub min_biased_score: f64,
}

/// Descending order, ties to the lower index (`jax.lax.top_k`'s and `torch.topk`'s order).
fn descending(v: &[f64]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..v.len()).collect();
    order.sort_by(|&a, &b| v[b].partial_cmp(&v[a]).unwrap());
    order
}

/// Hugging Face's `DeepseekV3MoE` (transformers' `modeling_deepseek_v3.py`,
/// `route_tokens_to_experts` + shared experts) on each sequence of `xs`: sigmoid scores, the
/// bias added for the choice only, the `top_groups` groups with the best sum of their two best
/// biased scores, top k of the biased scores in those groups, weights the unbiased scores of the
/// chosen experts over their sum plus 1e-20, times `scaling`; plus the shared MLP.
pub fn deepseek_moe(p: &DeepSeekParams, xs: &[Array2<f64>], r: DeepSeekRouting) -> DeepSeekRef {
    assert!(r.v3 || r.groups == 1, "MaxText groups experts only in DeepSeek-V3's routing");
    let experts = p.routed.gate.ncols();
    let per_group = experts / r.groups;
    let mut out = DeepSeekRef {
        outputs: Vec::new(),
        chosen: Vec::new(),
        chosen_ungrouped: Vec::new(),
        chosen_unbiased: Vec::new(),
        min_margin: f64::INFINITY,
        min_biased_score: f64::INFINITY,
    };
    for x in xs {
        let logits = x.dot(&p.routed.gate);
        let mut y = Array2::<f64>::zeros(x.raw_dim());
        for t in 0..x.nrows() {
            let scores: Vec<f64> = match r.softmax {
                true => softmax(&logits.row(t).to_vec()),
                false => logits.row(t).iter().map(|&l| 1.0 / (1.0 + (-l).exp())).collect(),
            };
            let biased: Vec<f64> = scores.iter().zip(&p.bias).map(|(s, b)| s + b).collect();
            out.min_biased_score = biased.iter().cloned().fold(out.min_biased_score, f64::min);
            let group_score: Vec<f64> = (0..r.groups)
                .map(|g| {
                    let order = descending(&biased[g * per_group..(g + 1) * per_group]);
                    biased[g * per_group + order[0]] + biased[g * per_group + order[1]]
                })
                .collect();
            let group_order = descending(&group_score);
            if r.top_groups < r.groups {
                let gap = group_score[group_order[r.top_groups - 1]] - group_score[group_order[r.top_groups]];
                out.min_margin = out.min_margin.min(gap);
            }
            let masked: Vec<f64> = (0..experts)
                .map(|e| match group_order[..r.top_groups].contains(&(e / per_group)) {
                    true => biased[e],
                    false => f64::NEG_INFINITY,
                })
                .collect();
            let order = descending(&masked);
            let gap = masked[order[r.k - 1]] - masked[order[r.k]];
            out.min_margin = out.min_margin.min(gap);
            let chosen = order[..r.k].to_vec();
            let weight = |e: usize| if r.v3 { scores[e] } else { biased[e] };
            let sum = match r.softmax {
                true => 1.0,
                false => chosen.iter().map(|&e| weight(e)).sum::<f64>() + 1e-20,
            };
            for &e in &chosen {
                y.row_mut(t).scaled_add(weight(e) / sum * r.scaling, &expert(&p.routed, e, &x.row(t)));
            }
            let h = x.row(t).dot(&p.shared_wi_0).mapv(silu) * x.row(t).dot(&p.shared_wi_1);
            y.row_mut(t).scaled_add(1.0, &h.dot(&p.shared_wo));
            out.chosen.push(chosen);
            out.chosen_ungrouped.push(descending(&biased)[..r.k].to_vec());
            out.chosen_unbiased.push(descending(&scores)[..r.k].to_vec());
        }
        out.outputs.push(y);
    }
    out
}
