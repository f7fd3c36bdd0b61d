//! DeepSeek-V3's routed-and-shared MoE block (`maxrs::model::moe::routed_and_shared_block`, as
//! the deepseek family builds it with `MoeConfig::deepseek`) against the f64 reference of
//! Hugging Face's `DeepseekV3MoE` in `common/moe_ref.rs`: sigmoid scores, the correction bias
//! for the choice only, group-limited top-k, normalized and scaled weights, the shared MLP. One
//! f64 program on random inputs where both the groups and the bias change some tokens' choice:
//! the output, and the gradient of every parameter (the bias's is zero) and of the input against
//! central differences of the reference; and softmax scores without groups or bias.

use crate::common::moe_ref::{deepseek_moe, DeepSeekParams, DeepSeekRouting, MoeParams};
use crate::common::{f64_tensor, rng, run, uniform};
use maxrs::autodiff::value_and_grad_with_aux;
use maxrs::host::HostTensor;
use maxrs::ir::{DType, Program, Signature};
use maxrs::model::moe::{routed_and_shared_block, routed_and_shared_param_defs, MoeConfig};
use maxrs::model::ModelConfig;
use maxrs::tensor::{trace, Tree};
use ndarray::Array2;

const BATCH: usize = 2;
const S: usize = 16;
const EMB: usize = 16;
/// The routed experts' width; the shared MLP is `SHARED x` this.
const MLP: usize = 8;
const SHARED: usize = 2;
const ROUTING: DeepSeekRouting =
    DeepSeekRouting { k: 4, groups: 4, top_groups: 2, scaling: 2.5, softmax: false, v3: true };
const EXPERTS: usize = 16;

/// The block's configuration as the deepseek family gets it: from keys (groups only when `r`
/// has several; DeepSeek-V3's routing under a deepseek3 model name), through
/// `MoeConfig::deepseek`.
fn configs(r: DeepSeekRouting, bias: bool) -> (ModelConfig, MoeConfig) {
    let name = if r.v3 { "deepseek3-test" } else { "kimi-k2-1t" };
    let mut keys = vec![
        format!("model_name={name}"),
        "override_model_config=true".to_string(),
        format!("num_experts={EXPERTS}"),
        format!("num_experts_per_tok={}", r.k),
        format!("routed_scaling_factor={}", r.scaling),
        format!("shared_experts={SHARED}"),
        format!("routed_score_func={}", if r.softmax { "softmax" } else { "sigmoid" }),
        format!("routed_bias={bias}"),
    ];
    if r.groups > 1 {
        keys.extend([format!("n_routing_groups={}", r.groups), format!("topk_routing_group={}", r.top_groups)]);
    }
    let config = maxrs::config::load(None, &keys).expect("the routing keys load");
    let mut c = ModelConfig::from_config(&config);
    c.dtype = DType::F64;
    (c, MoeConfig::deepseek(&config).expect("valid DeepSeek routing"))
}

/// The block's output and the gradients of `sum(output * w)` with respect to the parameters and
/// the input.
fn program(c: &ModelConfig, m: &MoeConfig) -> Program {
    let mut sig = Signature::new(None);
    for def in routed_and_shared_param_defs(c, m, EMB as i64, MLP as i64) {
        sig.input(&def.name, c.dtype, &def.shape);
    }
    for name in ["x", "w"] {
        sig.input(name, c.dtype, &[BATCH as i64, S as i64, EMB as i64]);
    }
    trace(&sig, |_ctx, inp| {
        let wrt: Tree = inp.iter().filter(|(n, _)| *n != "w").map(|(n, t)| (n, t.clone())).collect();
        let (loss, outputs, grads) = value_and_grad_with_aux(&wrt, |v| {
            let out = routed_and_shared_block(c, m, v, &v["x"]);
            ((&out.output * &inp["w"]).sum_all(), Tree::new().with("output", out.output))
        });
        let mut all = grads.prefixed("grad").with("loss", loss);
        all.extend(outputs);
        all
    })
    .expect("the DeepSeek block traces")
}

/// The block's parameters, the input sequences and the weights `w` of the loss.
struct Data {
    p: DeepSeekParams,
    xs: Vec<Array2<f64>>,
    w: Vec<f64>,
}

fn data(seed: u64) -> Data {
    let mut r = rng(seed);
    let mut matrix = |rows: usize, cols: usize, scale: f64| {
        Array2::from_shape_vec((rows, cols), uniform(&mut r, rows * cols, -scale, scale)).unwrap()
    };
    let shared = SHARED * MLP;
    let (shared_wi_0, shared_wi_1) = (matrix(EMB, shared, 0.4), matrix(EMB, shared, 0.4));
    let shared_wo = matrix(shared, EMB, 0.3);
    let xs = (0..BATCH).map(|_| matrix(S, EMB, 1.0)).collect();
    let mut r = rng(seed + 1);
    let bias = uniform(&mut r, EXPERTS, -0.1, 0.1);
    let w = uniform(&mut r, BATCH * S * EMB, -1.0, 1.0);
    let mut routed = MoeParams::random(EMB, MLP, EXPERTS, seed + 2);
    // Logits within about ±2: every sigmoid score stays above the bias's reach.
    routed.gate *= 0.5;
    Data { p: DeepSeekParams { routed, bias, shared_wi_0, shared_wi_1, shared_wo }, xs, w }
}

/// Every input in f64 under the block's parameter names (the routing bias with `bias`).
fn host(d: &Data, bias: bool) -> Tree<HostTensor> {
    let flat = |a: &Array2<f64>| a.iter().copied().collect::<Vec<_>>();
    let mut t: Tree<HostTensor> =
        d.p.routed.named().into_iter().map(|(n, dims, v)| (format!("MoeBlock_0.{n}"), f64_tensor(&dims, &v))).collect();
    if bias {
        t.insert("MoeBlock_0.gate.bias", f64_tensor(&[EXPERTS as i64], &d.p.bias));
    }
    for (name, a) in [("wi_0", &d.p.shared_wi_0), ("wi_1", &d.p.shared_wi_1), ("wo", &d.p.shared_wo)] {
        let dims = [a.nrows() as i64, a.ncols() as i64];
        t.insert(format!("shared_experts.{name}.kernel").as_str(), f64_tensor(&dims, &flat(a)));
    }
    let x: Vec<f64> = d.xs.iter().flat_map(flat).collect();
    let dims = [BATCH as i64, S as i64, EMB as i64];
    t.insert("x", f64_tensor(&dims, &x));
    t.insert("w", f64_tensor(&dims, &d.w));
    t
}

fn ref_loss(d: &Data, routing: DeepSeekRouting) -> f64 {
    let r = deepseek_moe(&d.p, &d.xs, routing);
    r.outputs.iter().flat_map(|a| a.iter()).zip(&d.w).map(|(a, b)| a * b).sum()
}

/// The element `i` of the named input of `d`, to perturb.
fn slot<'a>(d: &'a mut Data, name: &str, i: usize) -> &'a mut f64 {
    let p = &mut d.p;
    let flat = match name {
        "MoeBlock_0.gate.kernel" => p.routed.gate.as_slice_mut(),
        "MoeBlock_0.gate.bias" => Some(p.bias.as_mut_slice()),
        "MoeBlock_0.wi_0" => p.routed.wi_0.as_slice_mut(),
        "MoeBlock_0.wi_1" => p.routed.wi_1.as_slice_mut(),
        "MoeBlock_0.wo" => p.routed.wo.as_slice_mut(),
        "shared_experts.wi_0.kernel" => p.shared_wi_0.as_slice_mut(),
        "shared_experts.wi_1.kernel" => p.shared_wi_1.as_slice_mut(),
        "shared_experts.wo.kernel" => p.shared_wo.as_slice_mut(),
        _ => return &mut d.xs[i / (S * EMB)].as_slice_mut().unwrap()[i % (S * EMB)],
    };
    &mut flat.unwrap()[i]
}

/// The block with `routing` (and the routing bias with `bias`; without it the reference's bias
/// must be zero) against the reference: the output, and the gradient of every input at 4
/// random elements against central differences.
fn check(routing: DeepSeekRouting, bias: bool, d: &Data) {
    let want = deepseek_moe(&d.p, &d.xs, routing);
    // A perturbation of the finite differences moves a score by at most 1e-5 / 4.
    assert!(want.min_margin > 1e-5, "the test data has a near-tie in routing: {:e}", want.min_margin);
    let (c, m) = configs(routing, bias);
    let inputs = host(d, bias);
    let out = run(&program(&c, &m), &inputs);
    let flat: Vec<f64> = want.outputs.iter().flat_map(|a| a.iter().copied()).collect();
    let got = out["output"].to_f64();
    let err = got.iter().zip(&flat).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    assert!(err < 1e-12, "{routing:?}: output differs from the reference by {err:e}");

    let mut r = rng(5);
    let h = 1e-5;
    for (name, _) in inputs.iter().filter(|(n, _)| *n != "w") {
        let grad = out[format!("grad.{name}").as_str()].to_f64();
        if name == "MoeBlock_0.gate.bias" && routing.v3 {
            assert!(grad.iter().all(|&g| g == 0.0), "the routing bias has a gradient: {grad:?}");
        }
        for _ in 0..4 {
            let i = (uniform(&mut r, 1, 0.0, grad.len() as f64)[0]) as usize;
            let at = |delta: f64| {
                let mut e = Data { p: d.p.clone(), xs: d.xs.clone(), w: d.w.clone() };
                *slot(&mut e, name, i) += delta;
                ref_loss(&e, routing)
            };
            let fd = (at(h) - at(-h)) / (2.0 * h);
            let g = grad[i];
            assert!(
                (g - fd).abs() <= 1e-6 * fd.abs().max(1.0),
                "{routing:?}: d loss / d {name}[{i}]: traced {g}, finite difference {fd}"
            );
        }
    }
}

/// DeepSeek-V3's routing: sigmoid scores, the bias, 2 of 4 groups, normalized and scaled.
#[test]
fn routed_and_shared_block_matches_the_reference() {
    let d = data(14);
    let want = deepseek_moe(&d.p, &d.xs, ROUTING);
    let tokens = BATCH * S;
    let set = |v: &[usize]| v.iter().copied().collect::<std::collections::BTreeSet<_>>();
    let differ = |a: &[Vec<usize>], b: &[Vec<usize>]| (0..tokens).filter(|&t| set(&a[t]) != set(&b[t])).count();
    let by_groups = differ(&want.chosen, &want.chosen_ungrouped);
    let by_bias = differ(&want.chosen_ungrouped, &want.chosen_unbiased);
    println!("choices changed by the groups: {by_groups}, by the bias: {by_bias}; margin {:e}", want.min_margin);
    assert!(by_groups > 0 && by_bias > 0, "the test data must exercise both the groups and the bias");
    assert!(want.min_biased_score > 0.0, "Hugging Face's 0-fill and MaxText's -inf mask would differ");
    check(ROUTING, true, &d);
}

/// routed_score_func=softmax without groups or bias: the chosen experts' softmax probabilities,
/// not renormalized, times the scaling factor (MaxText's `deepseek_scale_weights`).
#[test]
fn softmax_scores_without_groups_or_bias() {
    let mut d = data(14);
    d.p.bias.fill(0.0);
    let routing = DeepSeekRouting { k: 3, groups: 1, top_groups: 1, scaling: 1.5, softmax: true, v3: true };
    check(routing, false, &d);
}

/// A `decoder_block=deepseek` model whose name does not start with deepseek3/deepseek4 (here
/// MaxText's kimi-k2-1t: sigmoid scores, a routing bias, no groups): MaxText weighs the chosen
/// experts by their biased scores, so the bias has a gradient (checked against the reference's
/// central differences like every other input).
#[test]
fn other_model_names_weigh_by_the_biased_scores() {
    let d = data(14);
    let routing = DeepSeekRouting { k: 4, groups: 1, top_groups: 1, scaling: 2.827, softmax: false, v3: false };
    let (v3, maxtext) =
        (deepseek_moe(&d.p, &d.xs, DeepSeekRouting { v3: true, ..routing }), deepseek_moe(&d.p, &d.xs, routing));
    let apart = v3.outputs.iter().zip(&maxtext.outputs).map(|(a, b)| (a - b).mapv(f64::abs).sum()).sum::<f64>();
    assert!(apart > 1e-3, "the test data must tell the two weightings apart: {apart:e}");
    check(routing, true, &d);
}
