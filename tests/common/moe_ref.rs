//! An independent f64 reference of MaxText's routed MoE block (`layers/moe.py`), written with
//! ndarray on one sequence at a time (`[seq, emb]`): router top-k with softmax weights over the
//! chosen logits, SwiGLU experts, first-come-first-served capacity per expert and sequence, and
//! the load-balancing loss.

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

fn silu(v: f64) -> f64 {
    v / (1.0 + (-v).exp())
}

fn softmax(v: &[f64]) -> Vec<f64> {
    let m = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = v.iter().map(|x| (x - m).exp()).collect();
    let z: f64 = e.iter().sum();
    e.iter().map(|x| x / z).collect()
}

/// Expert `e`'s SwiGLU MLP on one token.
fn expert(p: &MoeParams, e: usize, x: &ndarray::ArrayView1<f64>) -> ndarray::Array1<f64> {
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
