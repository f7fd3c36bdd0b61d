//! The routed MoE block (`maxrs::model::moe`) against the independent f64 reference in
//! `common/moe_ref.rs`, traced in f64 on random inputs: the dropless path, every expert on every
//! token, dropping with a capacity that drops and one that does not, the load-balancing loss, and
//! the gradient of a loss through each path against central differences of the reference. And
//! on 8 devices, one device's numbers: expert-parallel dispatch (with all-to-alls), and the
//! dropless path per batch shard (gpt-oss's biased experts too).

use crate::common::moe_ref::{moe, MoeParams, MoeRef, Routing};
use crate::common::{f64_tensor, rng, run, uniform};
use maxrs::autodiff::value_and_grad_with_aux;
use maxrs::host::HostTensor;
use maxrs::ir::{DType, Program, Signature};
use maxrs::model::blocks::Activation;
use maxrs::model::moe::{moe_block, param_defs, GptOssExperts, MoeConfig, Router};
use maxrs::model::ModelConfig;
use maxrs::sharding::Mesh;
use maxrs::tensor::{trace, Tree};
use ndarray::Array2;

const S: usize = 8;
const EMB: usize = 16;
const MLP: usize = 24;
const EXPERTS: usize = 8;
const K: usize = 2;

fn config(sparse_matmul: bool, capacity_factor: f64, load_balance_loss_weight: f64) -> MoeConfig {
    MoeConfig {
        num_experts: EXPERTS as i64,
        num_experts_per_tok: K as i64,
        capacity_factor,
        sparse_matmul,
        load_balance_loss_weight,
        float32_weight_sum: true,
        float32_gate_logits: false,
        dispatch_no_expert_sharding: false,
        router: Router::Softmax,
        shared_experts: 0,
        norm_topk_prob: false,
        gpt_oss: None,
    }
}

/// The shared numerics: `dtype` activations, MaxText's logical axis rules.
fn model_config(dtype: DType) -> ModelConfig {
    let mut c = ModelConfig::from_config(&maxrs::config::load(None, &[]).expect("the base config"));
    c.dtype = dtype;
    c
}

/// The block's output and weighted load-balancing loss, and the gradients of
/// `sum(output * w) + loss` with respect to the parameters and the input.
/// On a mesh, the parameters are sharded by their logical axes and `x`, `w` by the batch.
fn program(c: &ModelConfig, m: &MoeConfig, batch: usize, mesh: Option<&Mesh>) -> Program {
    let mut sig = Signature::new(mesh.cloned());
    for def in param_defs(m, EMB as i64, MLP as i64) {
        let input = sig.input(&def.name, c.dtype, &def.shape);
        if let Some(mesh) = mesh {
            input.sharded(c.rules.spec(&def.logical, mesh));
        }
    }
    for name in ["x", "w"] {
        let input = sig.input(name, c.dtype, &[batch as i64, S as i64, EMB as i64]);
        if let Some(mesh) = mesh {
            input.sharded(c.rules.spec(&["activation_batch", "activation_length", "activation_embed"], mesh));
        }
    }
    trace(&sig, |_ctx, inp| {
        let wrt: Tree = inp.iter().filter(|(n, _)| *n != "w").map(|(n, t)| (n, t.clone())).collect();
        let (loss, mut outputs, grads) = value_and_grad_with_aux(&wrt, |v| {
            let out = moe_block(c, m, v, &v["x"]);
            let lb = out.load_balance_loss.unwrap_or_else(|| v["x"].trace().scalar(0.0, c.dtype));
            let loss = (&out.output * &inp["w"]).sum_all() + &lb;
            (loss, Tree::new().with("output", out.output).with("load_balance_loss", lb))
        });
        outputs.extend(grads.prefixed("grad"));
        outputs.with("loss", loss)
    })
    .expect("the block traces")
}

struct Data {
    p: MoeParams,
    xs: Vec<Array2<f64>>,
    w: Vec<f64>,
}

fn data(seed: u64, batch: usize) -> Data {
    let p = MoeParams::random(EMB, MLP, EXPERTS, seed);
    let mut r = rng(seed + 100);
    let xs =
        (0..batch).map(|_| Array2::from_shape_vec((S, EMB), uniform(&mut r, S * EMB, -1.0, 1.0)).unwrap()).collect();
    let w = uniform(&mut r, batch * S * EMB, -1.0, 1.0);
    Data { p, xs, w }
}

/// The inputs in f64, or rounded to f32.
fn host(d: &Data, dtype: DType) -> Tree<HostTensor> {
    let tensor = |dims: &[i64], v: &[f64]| match dtype {
        DType::F32 => HostTensor::from_f32(dims, &v.iter().map(|&x| x as f32).collect::<Vec<_>>()),
        _ => f64_tensor(dims, v),
    };
    let mut t: Tree<HostTensor> = d.p.named().into_iter().map(|(n, dims, v)| (n, tensor(&dims, &v))).collect();
    let x: Vec<f64> = d.xs.iter().flat_map(|a| a.iter().copied()).collect();
    let dims = [d.xs.len() as i64, S as i64, EMB as i64];
    t.insert("x", tensor(&dims, &x));
    t.insert("w", tensor(&dims, &d.w));
    t
}

/// The reference loss `sum(output * w) + weight x load_balance`.
fn ref_loss(d: &Data, routing: Routing, lb_weight: f64) -> (f64, MoeRef) {
    let r = moe(&d.p, &d.xs, K, routing);
    let dot: f64 = r.outputs.iter().flat_map(|a| a.iter()).zip(&d.w).map(|(a, b)| a * b).sum();
    (dot + lb_weight * r.load_balance, r)
}

fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

/// (sparse_matmul, capacity_factor, the reference's routing, expect drops)
const PATHS: [(bool, f64, Routing, bool); 4] = [
    (true, -1.0, Routing::Dropless, false),
    (false, -1.0, Routing::Dropless, false),
    (false, 1.0, Routing::Capacity(1.0), true),
    // Capacity ceil(8 x 2 / 8) x 4 = 8 per expert and sequence: nothing can be dropped.
    (false, 4.0, Routing::Capacity(4.0), false),
];

/// Per path, the output and the weighted load-balancing loss against the reference, and the
/// traced gradients of every parameter and of the input against central differences of the
/// reference loss, on a sample of elements of each.
#[test]
fn every_path_matches_the_reference() {
    let d = data(7, 2);
    let lb_weight = 0.1;
    for (sparse, cf, routing, drops) in PATHS {
        let m = config(sparse, cf, lb_weight);
        let out = run(&program(&model_config(DType::F64), &m, 2, None), &host(&d, DType::F64));
        let (_, want) = ref_loss(&d, routing, lb_weight);
        assert!(want.min_margin > 1e-3, "the test data has a near-tie in routing: {}", want.min_margin);
        assert_eq!(want.dropped > 0, drops, "{routing:?}: {} dropped, {} kept", want.dropped, want.kept);
        let flat: Vec<f64> = want.outputs.iter().flat_map(|a| a.iter().copied()).collect();
        let err = max_abs_diff(&out["output"].to_f64(), &flat);
        println!("sparse_matmul={sparse} capacity_factor={cf}: output error {err:e}, dropped {}", want.dropped);
        assert!(err < 1e-12, "sparse_matmul={sparse} capacity_factor={cf}: output differs by {err:e}");
        let lb = out["load_balance_loss"].to_f64()[0];
        assert!((lb - lb_weight * want.load_balance).abs() < 1e-14, "load balance {lb} vs {}", want.load_balance);

        let mut r = rng(5);
        let h = 1e-5;
        for name in ["gate.kernel", "wi_0", "wi_1", "wo", "x"] {
            let grad = out[format!("grad.{name}").as_str()].to_f64();
            for _ in 0..8 {
                let i = (uniform(&mut r, 1, 0.0, grad.len() as f64)[0]) as usize;
                let at = |delta: f64| {
                    let mut e = Data { p: d.p.clone(), xs: d.xs.clone(), w: d.w.clone() };
                    let slot = match name {
                        "gate.kernel" => e.p.gate.as_slice_mut().unwrap().get_mut(i),
                        "wi_0" => e.p.wi_0.as_slice_mut().unwrap().get_mut(i),
                        "wi_1" => e.p.wi_1.as_slice_mut().unwrap().get_mut(i),
                        "wo" => e.p.wo.as_slice_mut().unwrap().get_mut(i),
                        _ => e.xs[i / (S * EMB)].as_slice_mut().unwrap().get_mut(i % (S * EMB)),
                    };
                    *slot.unwrap() += delta;
                    ref_loss(&e, routing, lb_weight).0
                };
                let fd = (at(h) - at(-h)) / (2.0 * h);
                let g = grad[i];
                assert!(
                    (g - fd).abs() <= 1e-6 * fd.abs().max(1.0),
                    "sparse_matmul={sparse} capacity_factor={cf}: d loss / d {name}[{i}]: traced {g}, finite difference {fd}"
                );
            }
        }
    }
}

/// Expert-parallel dispatch: the dropping path on 8 devices with the experts split 8 ways and the
/// dispatched tokens kept expert-sharded (`moe_dispatch_no_expert_sharding`) moves the tokens
/// with all-to-alls, and its output and gradients equal one device's within 1e-5 (f32). (The
/// whole model on 8 devices, both paths, is `tests/mixtral.rs`'s.)
#[test]
fn expert_parallel_dispatch_uses_all_to_all() {
    let c = model_config(DType::F32);
    let batch = 8;
    let d = data(13, batch);
    let m = MoeConfig { dispatch_no_expert_sharding: true, ..config(false, 1.0, 0.01) };
    let one = run(&program(&c, &m, batch, None), &host(&d, DType::F32));
    let hlo = same_on_8_devices(&c, &m, &host(&d, DType::F32), &one, &Mesh::new(&[("expert", 8)]));
    assert!(hlo.windows(10).any(|w| w == b"all-to-all"), "expert-parallel dispatch without an all-to-all");
}

/// The dropless path on fsdp 4 x expert 2, where each batch shard sorts its own tokens against
/// the experts' gathered kernels (`dropless_per_shard`), equals one device within 1e-5 (f32),
/// the gradients of the fsdp- and expert-sharded kernels included.
#[test]
fn dropless_per_batch_shard_matches_one_device() {
    let c = model_config(DType::F32);
    let batch = 8;
    let d = data(17, batch);
    let m = config(true, -1.0, 0.01);
    let one = run(&program(&c, &m, batch, None), &host(&d, DType::F32));
    same_on_8_devices(&c, &m, &host(&d, DType::F32), &one, &Mesh::new(&[("fsdp", 4), ("expert", 2)]));
}

/// The same with gpt-oss's experts (`moe::GptOssExperts`): the router and expert biases go into
/// each batch shard's region with the kernels (random here, as a checkpoint's).
#[test]
fn gpt_oss_dropless_per_batch_shard_matches_one_device() {
    let c = model_config(DType::F32);
    let batch = 8;
    let d = data(19, batch);
    let experts = GptOssExperts { gate_bias: true, expert_bias: true, limit: 1.0, activation: Activation::Sigmoid };
    let m = MoeConfig { gpt_oss: Some(experts), ..config(true, -1.0, 0.0) };
    let mut inputs = host(&d, DType::F32);
    let mut r = rng(23);
    for def in param_defs(&m, EMB as i64, MLP as i64).into_iter().filter(|d| d.name.contains("bias")) {
        let n = def.shape.iter().product::<i64>() as usize;
        let values: Vec<f32> = uniform(&mut r, n, -0.5, 0.5).into_iter().map(|x| x as f32).collect();
        inputs.insert(def.name.as_str(), HostTensor::from_f32(&def.shape, &values));
    }
    let one = run(&program(&c, &m, batch, None), &inputs);
    same_on_8_devices(&c, &m, &inputs, &one, &Mesh::new(&[("fsdp", 4), ("expert", 2)]));
}

/// Runs the block on `mesh` and checks every output against `one` device's; returns the
/// optimized HLO (a serialized HloModuleProto, whose opcodes are strings).
fn same_on_8_devices(
    c: &ModelConfig,
    m: &MoeConfig,
    inputs: &Tree<HostTensor>,
    one: &Tree<HostTensor>,
    mesh: &Mesh,
) -> Vec<u8> {
    let client = crate::common::client();
    let compiled = maxrs::runtime::compile(&client, &program(c, m, 8, Some(mesh))).expect("compiles");
    let hlo = compiled.executable.executable().optimized_program().expect("optimized HLO").1;
    let many = compiled.run(&client, inputs).expect("the sharded block runs");
    for (name, value) in one.iter() {
        let (a, b) = (value.to_f64(), many[name].to_f64());
        let scale = a.iter().fold(1.0f64, |m, v| m.max(v.abs()));
        let err = max_abs_diff(&a, &b) / scale;
        assert!(err < 1e-5, "{name}: 8 devices differ from one by {err:e} (scaled)");
    }
    hlo
}
