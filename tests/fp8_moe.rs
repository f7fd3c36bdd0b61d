//! fp8 for Mixtral's experts (issue 43 item 3): the routed MoE block with `quantization=fp8`
//! (`model::moe::Products::Fp8`: the gate an fp8 product, the experts' einsums flax's
//! `Fp8Einsum` with one scale per operand over all experts) over two steps against an f64
//! reference of the quantized formula written here, gradients and new state included; and a
//! tiny Mixtral trained with it on the token-dropping path, whose loss decreases and whose fp8
//! state (MaxText's `_Fp8EinsumWrapper_<i>.fp8_einsum.*` names) is checkpointed and resumed.

use crate::common::{rng, run, uniform};
use crate::fp8::{assert_close, matmul, transpose, Meta, E4M3FN, E5M2};
use maxrs::autodiff::value_and_grad_with_aux;
use maxrs::host::HostTensor;
use maxrs::ir::{DType, Program, Signature};
use maxrs::model::fp8::{AMAX_HISTORY_LENGTH, STATE};
use maxrs::model::moe::{fp8_einsums, moe_block_with, param_defs, MoeConfig, Products, Router};
use maxrs::model::ModelConfig;
use maxrs::tensor::{trace, Tree};

const B: usize = 2;
const S: usize = 8;
const T: usize = B * S;
const EMB: usize = 16;
const MLP: usize = 12;
const EXPERTS: usize = 4;
const K: usize = 2;

/// Every expert on every token (`sparse_matmul=false`, no capacity): its three einsums.
fn block_config() -> MoeConfig {
    MoeConfig {
        num_experts: EXPERTS as i64,
        num_experts_per_tok: K as i64,
        capacity_factor: -1.0,
        sparse_matmul: false,
        load_balance_loss_weight: 0.0,
        float32_weight_sum: true,
        float32_gate_logits: false,
        dispatch_no_expert_sharding: false,
        router: Router::Softmax,
        shared_experts: 0,
        norm_topk_prob: false,
        gpt_oss: None,
    }
}

/// The block's quantized products: the gate, then the einsums in MaxText's call order.
fn products(m: &MoeConfig) -> Vec<String> {
    std::iter::once("gate".to_string()).chain(fp8_einsums(m)).collect()
}

fn state_len(name: &str) -> usize {
    if name.ends_with("_scale") {
        1
    } else {
        AMAX_HISTORY_LENGTH as usize
    }
}

/// The block's output and the gradients of `sum(output * w)` with respect to the parameters, the
/// input and the fp8 state (the new state), in f32.
fn program(m: &MoeConfig) -> Program {
    let mut c = ModelConfig::from_config(&maxrs::config::load(None, &[]).expect("the base config"));
    c.dtype = DType::F32;
    let mut sig = Signature::new(None);
    for def in param_defs(m, EMB as i64, MLP as i64) {
        sig.input(&def.name, DType::F32, &def.shape);
    }
    for name in ["x", "w"] {
        sig.input(name, DType::F32, &[B as i64, S as i64, EMB as i64]);
    }
    for op in products(m) {
        for name in STATE {
            sig.input(&format!("{op}.{name}"), DType::F32, &[state_len(name) as i64]);
        }
    }
    trace(&sig, |_, inp| {
        let wrt: Tree = inp.iter().filter(|(n, _)| *n != "w").map(|(n, t)| (n, t.clone())).collect();
        let (_, mut outputs, grads) = value_and_grad_with_aux(&wrt, |v| {
            let out = moe_block_with(&c, m, v, &v["x"], Products::Fp8(v));
            ((&out.output * &inp["w"]).sum_all(), Tree::new().with("output", out.output))
        });
        outputs.extend(grads.prefixed("grad"));
        outputs
    })
    .expect("the block traces")
}

/// One product's state in the reference: its input's, kernel's and output gradient's.
#[derive(Clone)]
struct Product {
    input: Meta,
    kernel: Meta,
    grad: Meta,
}

/// A quantized product's operands as the reference holds them: the dequantized values of each
/// (`qdq` with the new scale), and the new state.
struct Quantized {
    x: Vec<f64>,
    k: Vec<f64>,
    next: Product,
}

impl Product {
    fn new() -> Product {
        Product { input: Meta::new(), kernel: Meta::new(), grad: Meta::new() }
    }

    /// The forward half: `x` and `k` quantized to e4m3 with their new scales.
    fn forward(&self, x: &[f64], k: &[f64]) -> Quantized {
        let (input, kernel) = (self.input.update(E4M3FN, x), self.kernel.update(E4M3FN, k));
        let (qx, qk) = (E4M3FN.qdq(x, input.scale), E4M3FN.qdq(k, kernel.scale));
        Quantized { x: qx, k: qk, next: Product { input, kernel, grad: self.grad.clone() } }
    }
}

impl Quantized {
    /// The backward half: the output's gradient `g` quantized to e5m2 with its new scale.
    fn gradient(&mut self, g: &[f64]) -> Vec<f64> {
        self.next.grad = self.next.grad.update(E5M2, g);
        E5M2.qdq(g, self.next.grad.scale)
    }
}

fn silu(v: f64) -> f64 {
    v / (1.0 + (-v).exp())
}

fn silu_grad(v: f64) -> f64 {
    let s = 1.0 / (1.0 + (-v).exp());
    s * (1.0 + v * (1.0 - s))
}

/// Expert `e`'s slice of a stacked `[E, rows, cols]` kernel.
fn expert(k: &[f64], e: usize, rows: usize, cols: usize) -> &[f64] {
    &k[e * rows * cols..(e + 1) * rows * cols]
}

/// The block's parameters and one step's input and output weights (row-major, tokens `b*S+s`).
struct Data {
    gate: Vec<f64>,
    wi_0: Vec<f64>,
    wi_1: Vec<f64>,
    wo: Vec<f64>,
    x: Vec<f64>,
    w: Vec<f64>,
}

/// The reference step: output, gradients (`gate.kernel`, `wi_0`, `wi_1`, `wo`, `x`), each
/// product's new state, and the smallest gap between a token's k-th and (k+1)-th quantized logit.
struct Reference {
    output: Vec<f64>,
    grads: Vec<(&'static str, Vec<f64>)>,
    next: Vec<Product>,
    margin: f64,
}

/// MaxText's `dense_matmul` without capacity, quantized: `logits = q(x) q(gate)`, top-k with
/// softmax weights, per expert `h = silu(q(x) q(wi_0)) * q(x) q(wi_1)` and `q(h) q(wo)`, summed
/// with the weights; backward, each product's e5m2 output gradient times the other operand's e4m3
/// values (`fp8_ops.py`'s `quantized_dot_bwd`). Every `q` has one scale over its whole tensor.
fn reference(d: &Data, state: &[Product]) -> Reference {
    let (m, h, e_n) = (EMB, MLP, EXPERTS);
    let mut gate = state[0].forward(&d.x, &d.gate);
    let logits = matmul(&gate.x, &gate.k, T, m, e_n);
    let (mut weights, mut chosen, mut margin) = (vec![0.0; T * e_n], Vec::new(), f64::INFINITY);
    for t in 0..T {
        let row = &logits[t * e_n..(t + 1) * e_n];
        let mut order: Vec<usize> = (0..e_n).collect();
        order.sort_by(|&a, &b| row[b].partial_cmp(&row[a]).unwrap());
        margin = margin.min(row[order[K - 1]] - row[order[K]]);
        let top: Vec<usize> = order[..K].to_vec();
        let z: f64 = top.iter().map(|&e| (row[e] - row[top[0]]).exp()).sum();
        for &e in &top {
            weights[t * e_n + e] = (row[e] - row[top[0]]).exp() / z;
        }
        chosen.push(top);
    }
    let mut up0 = state[1].forward(&d.x, &d.wi_0);
    let mut up1 = state[2].forward(&d.x, &d.wi_1);
    let a: Vec<Vec<f64>> = (0..e_n).map(|e| matmul(&up0.x, expert(&up0.k, e, m, h), T, m, h)).collect();
    let b: Vec<Vec<f64>> = (0..e_n).map(|e| matmul(&up1.x, expert(&up1.k, e, m, h), T, m, h)).collect();
    // The activations `[T, E, H]`, flattened as the einsum's input `bseh`.
    let mut hidden = vec![0.0; T * e_n * h];
    for (e, (a, b)) in a.iter().zip(&b).enumerate() {
        for t in 0..T {
            for j in 0..h {
                hidden[(t * e_n + e) * h + j] = silu(a[t * h + j]) * b[t * h + j];
            }
        }
    }
    let mut down = state[3].forward(&hidden, &d.wo);
    let per_expert = |v: &[f64], e: usize, width: usize| -> Vec<f64> {
        (0..T).flat_map(|t| v[(t * e_n + e) * width..(t * e_n + e + 1) * width].to_vec()).collect()
    };
    let o: Vec<Vec<f64>> =
        (0..e_n).map(|e| matmul(&per_expert(&down.x, e, h), expert(&down.k, e, h, m), T, h, m)).collect();
    let mut output = vec![0.0; T * m];
    let (mut g_out, mut g_weights) = (vec![0.0; T * e_n * m], vec![0.0; T * e_n]);
    for t in 0..T {
        for e in 0..e_n {
            for j in 0..m {
                output[t * m + j] += weights[t * e_n + e] * o[e][t * m + j];
                g_out[(t * e_n + e) * m + j] = weights[t * e_n + e] * d.w[t * m + j];
                g_weights[t * e_n + e] += o[e][t * m + j] * d.w[t * m + j];
            }
        }
    }

    // Backward: `wo`, then the activations, then `wi_0` and `wi_1`, then the router and the gate.
    let qg = down.gradient(&g_out);
    let (mut d_hidden, mut d_wo) = (vec![0.0; T * e_n * h], Vec::new());
    for e in 0..e_n {
        let g = per_expert(&qg, e, m);
        let dh = matmul(&g, &transpose(expert(&down.k, e, h, m), h, m), T, m, h);
        for t in 0..T {
            d_hidden[(t * e_n + e) * h..(t * e_n + e + 1) * h].copy_from_slice(&dh[t * h..(t + 1) * h]);
        }
        d_wo.extend(matmul(&transpose(&per_expert(&down.x, e, h), T, h), &g, h, T, m));
    }
    let (mut da, mut db) = (vec![0.0; T * e_n * h], vec![0.0; T * e_n * h]);
    for e in 0..e_n {
        for t in 0..T {
            for j in 0..h {
                let (i, g) = ((t * e_n + e) * h + j, d_hidden[(t * e_n + e) * h + j]);
                da[i] = g * b[e][t * h + j] * silu_grad(a[e][t * h + j]);
                db[i] = g * silu(a[e][t * h + j]);
            }
        }
    }
    let mut dx = vec![0.0; T * m];
    let mut up_grads = Vec::new();
    for (up, g) in [(&mut up0, &da), (&mut up1, &db)] {
        let qg = up.gradient(g);
        let mut dk = Vec::new();
        for e in 0..e_n {
            let g = per_expert(&qg, e, h);
            let dxe = matmul(&g, &transpose(expert(&up.k, e, m, h), m, h), T, h, m);
            dx.iter_mut().zip(dxe).for_each(|(a, b)| *a += b);
            dk.extend(matmul(&transpose(&up.x, T, m), &g, m, T, h));
        }
        up_grads.push(dk);
    }
    // The weights are the softmax of the chosen logits: d l_i = w_i (g_i - sum_j w_j g_j).
    let mut g_logits = vec![0.0; T * e_n];
    for (t, top) in chosen.iter().enumerate() {
        let mean: f64 = top.iter().map(|&e| weights[t * e_n + e] * g_weights[t * e_n + e]).sum();
        for &e in top {
            g_logits[t * e_n + e] = weights[t * e_n + e] * (g_weights[t * e_n + e] - mean);
        }
    }
    let qg = gate.gradient(&g_logits);
    let dxg = matmul(&qg, &transpose(&gate.k, m, e_n), T, e_n, m);
    dx.iter_mut().zip(dxg).for_each(|(a, b)| *a += b);
    let d_gate = matmul(&transpose(&gate.x, T, m), &qg, m, T, e_n);
    let [d_wi_0, d_wi_1]: [Vec<f64>; 2] = up_grads.try_into().unwrap();
    Reference {
        output,
        grads: vec![("gate.kernel", d_gate), ("wi_0", d_wi_0), ("wi_1", d_wi_1), ("wo", d_wo), ("x", dx)],
        next: vec![gate.next, up0.next, up1.next, down.next],
        margin,
    }
}

fn host(dims: &[usize], v: &[f64]) -> HostTensor {
    let dims: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
    HostTensor::from_f32(&dims, &v.iter().map(|&x| x as f32).collect::<Vec<_>>())
}

/// Two steps of the quantized block (all experts, f32), the second with the state the first
/// wrote and inputs three times larger (clipped by the scales of the first): the output, every
/// gradient and each product's new scales and histories match the reference.
#[test]
fn fp8_moe_block_matches_an_f64_reference_over_two_steps() {
    let m = block_config();
    let names = products(&m);
    assert_eq!(
        names[1..],
        ["_Fp8EinsumWrapper_0.fp8_einsum", "_Fp8EinsumWrapper_1.fp8_einsum", "_Fp8EinsumWrapper_2.fp8_einsum"]
    );
    let program = program(&m);
    let mut r = rng(430);
    let f32s = |v: Vec<f64>| v.iter().map(|&x| x as f32 as f64).collect::<Vec<_>>();
    let mut draw = |n: usize, scale: f64| f32s(uniform(&mut r, n, -scale, scale));
    let (gate, wi_0, wi_1, wo) = (
        draw(EMB * EXPERTS, 0.8),
        draw(EXPERTS * EMB * MLP, 0.5),
        draw(EXPERTS * EMB * MLP, 0.5),
        draw(EXPERTS * MLP * EMB, 0.5),
    );
    let mut state = vec![Product::new(); names.len()];
    let mut inputs: Tree<HostTensor> = Tree::new();
    for op in &names {
        for name in STATE {
            let value = if name.ends_with("_scale") { 1.0 } else { 0.0 };
            inputs.insert(format!("{op}.{name}"), host(&[state_len(name)], &vec![value; state_len(name)]));
        }
    }
    inputs.insert("gate.kernel", host(&[EMB, EXPERTS], &gate));
    inputs.insert("wi_0", host(&[EXPERTS, EMB, MLP], &wi_0));
    inputs.insert("wi_1", host(&[EXPERTS, EMB, MLP], &wi_1));
    inputs.insert("wo", host(&[EXPERTS, MLP, EMB], &wo));
    for (step, scale) in [1.0, 3.0].into_iter().enumerate() {
        let d = Data {
            gate: gate.clone(),
            wi_0: wi_0.clone(),
            wi_1: wi_1.clone(),
            wo: wo.clone(),
            x: draw(T * EMB, scale),
            w: draw(T * EMB, scale),
        };
        inputs.insert("x", host(&[B, S, EMB], &d.x));
        inputs.insert("w", host(&[B, S, EMB], &d.w));
        let out = run(&program, &inputs);
        let want = reference(&d, &state);
        assert!(want.margin > 1e-4, "step {step}: a near-tie in routing ({:e})", want.margin);
        let at = |what: &str| format!("step {step}: {what}");
        assert_close(&at("output"), &out["output"].to_f64(), &want.output);
        for (name, grad) in &want.grads {
            assert_close(&at(&format!("d {name}")), &out[&format!("grad.{name}")].to_f64(), grad);
        }
        for (op, product) in names.iter().zip(&want.next) {
            for (prefix, meta) in
                [("input", &product.input), ("kernel", &product.kernel), ("output_grad", &product.grad)]
            {
                let scale = out[&format!("grad.{op}.{prefix}_scale")].to_f64()[0];
                assert!((scale - meta.scale).abs() <= 1e-6 * meta.scale, "{}: {scale} vs {}", at(op), meta.scale);
                let history = out[&format!("grad.{op}.{prefix}_amax_history")].to_f64();
                assert_close(&at(&format!("{op}.{prefix}_amax_history")), &history, &meta.history);
            }
            for name in STATE {
                inputs.insert(format!("{op}.{name}"), out[&format!("grad.{op}.{name}")].clone());
            }
        }
        state = want.next;
    }
}

/// A tiny Mixtral trained with `quantization=fp8` on the token-dropping path
/// (`capacity_factor=1`: the dispatch and combine einsums quantized too) lowers its loss, which
/// follows the unquantized run's; its checkpoint holds the state of the attention projections',
/// the gate's and the five einsums' products under MaxText's names, and a run resumed from it
/// carries the histories on.
#[test]
fn fp8_mixtral_trains_checkpoints_and_resumes_its_expert_state() {
    use crate::checkpoint_resume::{small, state_expected};
    use maxrs::checkpoint::{dir, manifest};
    use maxrs::files::Location;
    use maxrs::pjrt::cpu_client;

    let base = tempfile::tempdir().unwrap();
    let dir_arg = format!("base_output_directory={}", base.path().display());
    let model = [
        "decoder_block=mixtral",
        "num_experts=4",
        "num_experts_per_tok=2",
        "sparse_matmul=false",
        "capacity_factor=1",
        "base_num_decoder_layers=2",
        "quantization=fp8",
        "per_device_batch_size=4",
    ];
    let run = |steps: &str| {
        let args = ["enable_checkpointing=true", "run_name=q", "checkpoint_period=1", &dir_arg, steps];
        let c = maxrs::config::load(None, &small(&[&model[..], &args[..]].concat())).unwrap();
        (maxrs::train::run::train(&c, &cpu_client(1).unwrap()).unwrap(), c)
    };
    let (first, c) = run("steps=3");
    let (second, _) = run("steps=6");
    assert_eq!(second.first_step, 3);
    let losses: Vec<f64> = first.losses.iter().chain(&second.losses).copied().collect();
    let plain: Vec<String> = small(&[&model[..6], &["per_device_batch_size=4", "steps=6"]].concat());
    let plain = maxrs::train::run::train(&maxrs::config::load(None, &plain).unwrap(), &cpu_client(1).unwrap()).unwrap();
    println!("fp8 Mixtral losses: {losses:?}\nunquantized: {:?}", plain.losses);
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
    assert!(losses[5] < losses[0] - 0.05, "the loss does not decrease: {losses:?}");
    // The batches differ in difficulty (the unquantized run's losses go up and down the same way):
    // step by step, the fp8 losses are the unquantized run's within 1%.
    for (q, p) in losses.iter().zip(&plain.losses) {
        assert!((q - p).abs() <= 0.01 * p, "fp8 losses {losses:?}, unquantized {:?}", plain.losses);
    }

    let model = maxrs::model::Model::from_config(&c).unwrap();
    let load = |step: u64| {
        let at = Location::Local(base.path().join(format!("q/checkpoints/{step}")));
        let loaded = dir::load(&at, &state_expected(&c), &manifest::model_keys(&c, &model), false).unwrap();
        loaded.arrays.into_iter().filter(|(n, _)| n.starts_with("fp8.")).collect::<Vec<_>>()
    };
    let (early, late) = (load(1), load(4));
    // Query, key, value, out, the gate, and the five einsums: 10 products x 6 arrays.
    assert_eq!(early.len(), 60);
    let einsum = "fp8.decoder.layers._Fp8EinsumWrapper_4.fp8_einsum.output_grad_amax_history";
    assert!(early.iter().any(|(n, _)| n == einsum), "{:?}", early.iter().map(|(n, _)| n).collect::<Vec<_>>());
    assert!(early.iter().any(|(n, _)| n == "fp8.decoder.layers.MoeBlock_0.gate.kernel_scale"));
    for ((name, two), (_, five)) in early.iter().zip(&late) {
        let (two, five) = (two.to_f64(), five.to_f64());
        let n = two.len() / 2;
        for (l, (row, later)) in two.chunks(n).zip(five.chunks(n)).enumerate() {
            if name.ends_with("_scale") {
                assert!(row[0] != 1.0 && row[0] > 0.0, "{name} layer {l}: {row:?}");
            } else {
                // After step 1: [a1, 0, ..., 0, a0]; after step 4: [a4, 0, ..., a0, a1, a2, a3].
                assert!(row[0] > 0.0 && row[n - 1] > 0.0, "{name} layer {l}");
                assert!(row[1..n - 1].iter().all(|&a| a == 0.0), "{name} layer {l}");
                assert_eq!((later[n - 4], later[n - 3]), (row[n - 1], row[0]), "{name} layer {l} after resuming");
            }
        }
    }
}
