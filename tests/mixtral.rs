//! The Mixtral model (`decoder_block=mixtral`) against the f64 reference in
//! `common/mixtral_ref.rs`, on a tiny configuration in float32 (emb 64, 2 layers, 4 experts,
//! top-2): every layer's output, the logits, and the loss with the load-balancing
//! term, for the dropless path (scanned layers) and the dropping path (unrolled layers, a
//! capacity that drops); the gradient against finite differences of the reference loss. Then
//! training runs: 8 devices (expert 8; expert 2 x fsdp 4) give the 1-device losses, gradient
//! accumulation the full batch's, and the tiny Mixtral of the JaxPP fork's tests trains. Last,
//! where the dropping block's backward pass fences its expert gradients (issue 46's memory).

use crate::common::llama_ref::{self, scaled_err, signature, B, T};
use crate::common::mixtral_ref::{self, config, inputs, random_params, MixtralParams};
use crate::common::moe_ref::Routing;
use maxrs::autodiff::value_and_grad_with_aux;
use maxrs::ir::{DType, Prim};
use maxrs::model::Model;
use maxrs::pjrt::cpu_client;
use maxrs::tensor::trace;
use maxrs::train::run::{self, RunReport};
use ndarray::Array2;

const LB_WEIGHT: f64 = 0.01;

/// (scan_layers, keys, the reference's routing)
fn paths() -> [(bool, Vec<String>, Routing); 2] {
    let lb = format!("load_balance_loss_weight={LB_WEIGHT}");
    [
        (true, vec![lb.clone()], Routing::Dropless),
        (false, vec![lb, "sparse_matmul=false".into(), "capacity_factor=1.0".into()], Routing::Capacity(1.0)),
    ]
}

fn model(scan_layers: bool, keys: &[String]) -> Model {
    config(scan_layers, &keys.iter().map(String::as_str).collect::<Vec<_>>())
}

/// Per path, one program computes every layer's output, the logits, the loss and its aux
/// terms, and the gradient; the forward values must match the reference and the gradient the
/// reference's finite differences at elements of the router, the experts and attention.
#[test]
fn model_matches_reference() {
    for (scan_layers, keys, routing) in paths() {
        let c = model(scan_layers, &keys);
        let p = random_params(&c, 21);
        let b = llama_ref::batch(&c, 22);
        let program = trace(&signature(&c), |_ctx, inp| {
            let params = inp.subtree("params");
            let fwd = c.forward(&params, inp, true);
            let (loss, aux, grads) = value_and_grad_with_aux(&params, |params| c.loss(params, inp, 0.0));
            grads
                .prefixed("grad")
                .with("layers", fwd.layer_outputs.expect("layer outputs"))
                .with("logits", fwd.logits)
                .with("loss", loss)
                .with("moe_lb_loss", aux["aux_losses.moe_lb_loss"].clone())
        })
        .expect("the model traces");
        let out = crate::common::run(&program, &inputs(&c, &p, &b));
        let want = mixtral_ref::reference(&c, &p, &b, 2, routing, LB_WEIGHT);
        assert!(want.min_margin > 1e-3, "the test data has a near-tie in routing: {}", want.min_margin);
        if let Routing::Capacity(_) = routing {
            assert!(want.dropped > 0, "the capacity drops nothing");
        }
        let flat = |a: &Array2<f64>| a.iter().copied().collect::<Vec<_>>();
        let layers = out["layers"].to_f64();
        let per = B * T * c.config.emb as usize;
        for (i, l) in want.layers.iter().enumerate() {
            let err = scaled_err(&layers[i * per..(i + 1) * per], &flat(l));
            println!("{routing:?} layer {i}: scaled error {err:e}");
            assert!(err < 1e-4, "{routing:?}: layer {i} differs: {err:e}");
        }
        let err = scaled_err(&out["logits"].to_f64(), &flat(&want.logits));
        assert!(err < 1e-4, "{routing:?}: logits differ: {err:e}");
        let lb = out["moe_lb_loss"].to_f64()[0];
        assert!((lb - LB_WEIGHT * want.load_balance).abs() < 1e-7, "load balance {lb} vs {}", want.load_balance);
        let loss = out["loss"].to_f64()[0];
        let rel = (loss - want.loss).abs() / want.loss;
        println!("{routing:?}: loss {loss} vs reference {} (rel {rel:e}), {} dropped", want.loss, want.dropped);
        assert!(rel < 1e-5, "{routing:?}: loss {loss} vs {}", want.loss);

        let loss_at = |p: &MixtralParams| mixtral_ref::reference(&c, p, &b, 2, routing, LB_WEIGHT).loss;
        // (layer, parameter, flat index within the layer's tensor)
        let probes: &[(usize, &str, usize)] = &[
            (0, "MoeBlock_0.gate.kernel", 37),
            (1, "MoeBlock_0.gate.kernel", 200),
            (0, "MoeBlock_0.wi_0", 12345),
            (1, "MoeBlock_0.wi_1", 20_001),
            (0, "MoeBlock_0.wo", 7_777),
            (1, "self_attention.query.kernel", 2042),
        ];
        for &(layer, name, i) in probes {
            let h = 1e-4;
            let shifted = |delta: f64| {
                let mut q = MixtralParams { base: llama_ref::clone_params(&p.base), moe: p.moe.clone() };
                let slot = match name.strip_prefix("MoeBlock_0.") {
                    Some("gate.kernel") => &mut q.moe[layer].gate.as_slice_mut().unwrap()[i],
                    Some("wi_0") => &mut q.moe[layer].wi_0.as_slice_mut().unwrap()[i],
                    Some("wi_1") => &mut q.moe[layer].wi_1.as_slice_mut().unwrap()[i],
                    Some("wo") => &mut q.moe[layer].wo.as_slice_mut().unwrap()[i],
                    _ => &mut q.base.layers[layer].get_mut(name).unwrap().as_slice_mut().unwrap()[i],
                };
                *slot += delta;
                loss_at(&q)
            };
            let fd = (shifted(h) - shifted(-h)) / (2.0 * h);
            let (grad_name, per_layer) = match scan_layers {
                true => (format!("grad.decoder.layers.{name}"), c.config.layers as usize),
                false => (format!("grad.decoder.layers_{layer}.{name}"), 1),
            };
            let grad = out[grad_name.as_str()].to_f64();
            let g = grad[if scan_layers { layer } else { 0 } * grad.len() / per_layer + i];
            println!("{routing:?} d loss / d {name}[{layer}][{i}]: traced {g:e}, finite difference {fd:e}");
            assert!(
                (g - fd).abs() <= 1e-3 * fd.abs() + 1e-6,
                "{routing:?} {name}: traced {g} vs finite difference {fd}"
            );
        }
    }
}

fn train(devices: usize, overrides: &[&str]) -> RunReport {
    let mut args: Vec<String> = [
        "decoder_block=mixtral",
        "num_experts=8",
        "num_experts_per_tok=2",
        "base_emb_dim=64",
        "head_dim=16",
        "base_mlp_dim=96",
        "vocab_size=128",
        "max_target_length=32",
        "dtype=float32",
        // 2 steps: the second step's loss shows the first update (the runs compiled 4 before CI
        // time mattered; the steps cost little beside the compiles).
        "steps=2",
        "learning_rate=3e-3",
        "load_balance_loss_weight=0.01",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(overrides.iter().map(|s| s.to_string()));
    let c = maxrs::config::load(None, &args).expect("config loads");
    run::train(&c, &cpu_client(devices).expect("CPU plugin")).expect("the run trains")
}

fn assert_same_losses(what: &str, got: &RunReport, want: &RunReport) {
    println!(
        "{what}: losses {:?}, max relative difference {:e}",
        got.losses,
        crate::common::max_rel_diff(&got.losses, &want.losses)
    );
    for (step, (a, b)) in got.losses.iter().zip(&want.losses).enumerate() {
        let rel = (a - b).abs() / b.abs();
        assert!(rel <= 1e-5, "{what}: step {step} loss {a} vs {b} (relative difference {rel:e})");
    }
}

/// On 8 CPU devices, the dropless path with the experts split 8 ways and the dropping path
/// (expert-parallel dispatch) with experts split 2 ways next to 4-way FSDP give the 1-device
/// losses within 1e-5 (f32), the load-balancing term included; and two micro-batches give the
/// full batch's losses (the load-balancing term counts as its mean over micro-batches, in the
/// loss and in the gradient). The expert-8 run accumulates its two micro-batches of 8 (one row
/// a device) against the 1-device batch of 16: one run for what were two comparisons with the
/// same reference (the former 1-device accumulated run), as sharding and accumulation are
/// orthogonal (each micro-batch is sharded as a whole batch is).
#[test]
fn sharded_and_accumulated_runs_match_one_device() {
    let dropless = train(1, &["per_device_batch_size=16"]);
    let eight = [
        "per_device_batch_size=1",
        "gradient_accumulation_steps=2",
        "ici_fsdp_parallelism=1",
        "ici_expert_parallelism=8",
    ];
    assert_same_losses("dropless, expert 8, 2 micro-batches of 8", &train(8, &eight), &dropless);
    let dropping = ["sparse_matmul=false", "capacity_factor=1.0", "moe_dispatch_no_expert_sharding=true"];
    let one = ["per_device_batch_size=8"];
    let mixed = ["per_device_batch_size=1", "ici_fsdp_parallelism=4", "ici_expert_parallelism=2"];
    let with = |a: &[&'static str]| a.iter().chain(&dropping).copied().collect::<Vec<&str>>();
    assert_same_losses("dropping, expert 2 x fsdp 4", &train(8, &with(&mixed)), &train(1, &with(&one)));
}

/// The tiny Mixtral of the JaxPP fork's tests (emb 1024, 2 heads of 16, 8 experts of 896, top-2,
/// 2 layers, sequences of 64) with a 512-token vocabulary instead of 32000 to keep CI fast,
/// trains on CPU: the loss falls within 2 steps (batches of 2 rows: 8 rows and 3 steps took 1.3
/// times the CPU). Through `maxrs train` with XLA's default
/// optimization (`train_optimized`): this model is big enough for that to be the cheaper way.
#[test]
fn jaxpp_tiny_mixtral_trains() {
    let (losses, stdout) = crate::common::cli::train_optimized(&[
        "model_name=mixtral-8x7b",
        "override_model_config=true",
        "base_emb_dim=1024",
        "base_num_query_heads=2",
        "base_num_kv_heads=2",
        "base_mlp_dim=896",
        "base_num_decoder_layers=2",
        "head_dim=16",
        "num_experts=8",
        "num_experts_per_tok=2",
        "vocab_size=512",
        "max_target_length=64",
        "per_device_batch_size=2",
        "dtype=float32",
        "steps=2",
        "learning_rate=1e-3",
        "cpu_device_count=1",
    ]);
    println!("losses {losses:?}");
    assert_eq!(losses.len(), 2, "{stdout}");
    // 2 steps of 2 rows (of 8 rows, 10 steps fell by more than 1.0, 3 by 2.97): 6.71 -> 3.76,
    // deterministic on the CPU plugin.
    assert!(losses[1] < losses[0] - 0.4, "the loss falls: {losses:?}");
}

/// The optimization barriers that run in `g`: its own and those of the scan and manual bodies
/// it runs (not those of a composite's or remat region's definitions), each as its operands'
/// dtypes and shapes.
fn nested_barriers(g: &maxrs::ir::Graph, found: &mut Vec<Vec<(DType, Vec<i64>)>>) {
    for eqn in &g.eqns {
        match &eqn.prim {
            Prim::OptimizationBarrier => {
                found.push(eqn.inputs.iter().map(|&v| (g.ty(v).dtype, g.ty(v).shape.to_vec())).collect());
            }
            Prim::Scan(s) => nested_barriers(&s.body, found),
            Prim::ManualComputation(m) => nested_barriers(&m.body, found),
            _ => {}
        }
    }
}

/// The token-dropping block (MaxText's Mixtral test recipe, `tests/end_to_end/gpu/mixtral/
/// test_8x7b.sh` at e591f30: `sparse_matmul=False capacity_factor=1.25`, scanned layers, expert
/// parallelism) releases each layer's three expert-kernel gradients together with its dispatched
/// tokens' cotangent, in bf16, through one barrier in the scanned backward pass: without it XLA
/// kept two layers' gathered kernels and unreduced gradients alive at once (issue 46: 3.2 GiB per
/// device more than MaxText's step on 8 H100s). On one device there is nothing to gather and the
/// program has no such barrier.
#[test]
fn dropping_experts_release_their_gradients_with_the_tokens_cotangent() {
    use maxrs::config;
    use maxrs::train::step::TrainStep;
    let (e, m, experts, layers, t, b) = (32, 48, 4, 2, 16, 4);
    let keys = |devices: usize| {
        vec![
            "model_name=mixtral-8x7b".to_string(),
            "override_model_config=true".into(),
            format!("base_emb_dim={e}"),
            format!("base_mlp_dim={m}"),
            "base_num_query_heads=2".into(),
            "base_num_kv_heads=2".into(),
            "head_dim=16".into(),
            format!("base_num_decoder_layers={layers}"),
            format!("num_experts={experts}"),
            "num_experts_per_tok=2".into(),
            "vocab_size=64".into(),
            format!("max_target_length={t}"),
            format!("per_device_batch_size={}", b / devices as i64),
            "dtype=bfloat16".into(),
            "sparse_matmul=false".into(),
            "capacity_factor=1.25".into(),
            "ici_fsdp_parallelism=1".into(),
            format!("ici_expert_parallelism={devices}"),
        ]
    };
    let bf16 = |shape: &[i64]| (DType::BF16, shape.to_vec());
    let fenced = [bf16(&[experts, e, m]), bf16(&[experts, e, m]), bf16(&[experts, m, e])];
    for devices in [4, 1] {
        let c = config::load(None, &keys(devices)).expect("loads");
        let derived = config::validate(&c, devices, 1).expect("valid");
        let mesh = derived.mesh.step_mesh(&[(0..devices as i64).collect()]).expect("mesh");
        let program = TrainStep::new(&c, &derived, mesh).expect("step").train_step().expect("traces");
        let mut found = Vec::new();
        nested_barriers(&program.graph, &mut found);
        let expert_fences: Vec<_> = found.iter().filter(|ops| ops.iter().any(|op| fenced.contains(op))).collect();
        if devices == 1 {
            assert!(expert_fences.is_empty(), "one device: {expert_fences:?}");
            continue;
        }
        // One per layer's backward pass; the scanned body is traced once.
        assert_eq!(expert_fences.len(), 1, "{found:?}");
        let ops = expert_fences[0];
        // The dispatched tokens `[E, batch, capacity, emb]`, then the three kernels' gradients.
        assert_eq!(ops.len(), 4, "{ops:?}");
        assert!(ops[0].0 == DType::BF16 && ops[0].1[..2] == [experts, b] && ops[0].1[3] == e, "{ops:?}");
        assert_eq!(ops[1..], fenced, "{ops:?}");
    }
}
