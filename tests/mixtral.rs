//! The Mixtral model (`decoder_block=mixtral`) against the f64 reference in
//! `common/mixtral_ref.rs`, on a tiny configuration in float32 (emb 64, 2 layers, 4 experts,
//! top-2): every layer's output, the logits, and the loss with the load-balancing
//! term, for the dropless path (scanned layers) and the dropping path (unrolled layers, a
//! capacity that drops); the gradient against finite differences of the reference loss.

mod common;

use common::llama_ref::{self, scaled_err, signature, B, T};
use common::mixtral_ref::{self, config, inputs, random_params, MixtralParams};
use common::moe_ref::Routing;
use maxrs::model::Model;
use maxrs::tensor::{trace, value_and_grad, Tree};
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

#[test]
fn forward_matches_reference() {
    for (scan_layers, keys, routing) in paths() {
        let c = model(scan_layers, &keys);
        let p = random_params(&c, 21);
        let b = llama_ref::batch(&c, 22);
        let program = trace(&signature(&c), |_ctx, inp| {
            let params = inp.subtree("params");
            let fwd = c.forward(&params, inp, true);
            let (loss, aux) = c.loss(&params, inp, 0.0);
            Tree::new()
                .with("layers", fwd.layer_outputs.expect("layer outputs"))
                .with("logits", fwd.logits)
                .with("loss", loss)
                .with("moe_lb_loss", aux["aux_losses.moe_lb_loss"].clone())
        })
        .expect("the model traces");
        let out = common::run(&program, &inputs(&c, &p, &b));
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
    }
}

/// The traced gradient of the loss (cross-entropy plus load balancing) against central
/// differences of the f64 reference loss, at elements of the router, the experts and attention.
#[test]
fn gradient_matches_finite_differences() {
    for (scan_layers, keys, routing) in paths() {
        let c = model(scan_layers, &keys);
        let p = random_params(&c, 31);
        let b = llama_ref::batch(&c, 32);
        let program = trace(&signature(&c), |_ctx, inp| {
            let (loss, grads) = value_and_grad(&inp.subtree("params"), |params| c.loss(params, inp, 0.0).0);
            grads.prefixed("grad").with("loss", loss)
        })
        .expect("the gradient traces");
        let out = common::run(&program, &inputs(&c, &p, &b));
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
            let (grad_name, offset) = match scan_layers {
                true => (format!("grad.decoder.layers.{name}"), layer),
                false => (format!("grad.decoder.layers_{layer}.{name}"), 0),
            };
            let grad = out[grad_name.as_str()].to_f64();
            let g = grad[offset * grad.len() / if scan_layers { 2 } else { 1 } + i];
            println!("{routing:?} d loss / d {name}[{layer}][{i}]: traced {g:e}, finite difference {fd:e}");
            assert!(
                (g - fd).abs() <= 1e-3 * fd.abs() + 1e-6,
                "{routing:?} {name}: traced {g} vs finite difference {fd}"
            );
        }
    }
}
