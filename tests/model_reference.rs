//! The Llama model (`maxrs::model`, `decoder_block=llama2`) against an independent f64 reference written here
//! with ndarray: the tiny default model (emb 256, 4 query heads over 2 kv heads of 64, mlp 512,
//! vocab 512, 2 layers) in float32 on a 2 x 16 batch, with random non-zero parameters made on the
//! host. Embeddings, every layer's output, the logits and the loss are compared layer by layer,
//! with `scan_layers` on and off; the gradient of the loss is checked against finite differences
//! of the reference loss (from the forward checks' programs).

use crate::common::llama_ref::*;
use maxrs::ir::Signature;
use maxrs::tensor::{trace, Tree};
use ndarray::Array2;

/// The forward pass against the reference; with `gradient`, the gradient too, from the same
/// program (`llama_ref::forward_program`).
fn check_forward(scan_layers: bool, extra: &[&str], z: f64, gradient: bool) {
    let c = config(scan_layers, extra);
    let p = random_params(&c, 1);
    let b = batch(&c, 2);
    let program = forward_program(&c, z, gradient);
    let out = crate::common::run(&program, &inputs(&c, &p, &b));
    let want = reference(&c, &p, &b.tokens, &b.targets, &b.seg, z);
    let tol = 1e-4;
    let flat = |a: &Array2<f64>| a.iter().copied().collect::<Vec<_>>();
    let err = scaled_err(&out["embeddings"].to_f64(), &flat(&want.embeddings));
    assert!(err < tol, "embeddings differ: {err:e}");
    let layers = out["layers"].to_f64();
    let per = B * T * c.config.emb as usize;
    for (i, l) in want.layers.iter().enumerate() {
        let err = scaled_err(&layers[i * per..(i + 1) * per], &flat(l));
        println!("scan_layers={scan_layers} layer {i}: scaled error {err:e}");
        assert!(err < tol, "layer {i} output differs (scan_layers={scan_layers}): {err:e}");
    }
    let err = scaled_err(&out["logits"].to_f64(), &flat(&want.logits));
    println!("scan_layers={scan_layers} logits: scaled error {err:e}");
    assert!(err < tol, "logits differ: {err:e}");
    let loss = out["loss"].to_f64()[0];
    let rel = (loss - want.loss).abs() / want.loss.abs();
    println!("scan_layers={scan_layers} loss {loss} vs reference {} (rel {rel:e})", want.loss);
    assert!(rel < tol, "loss {loss} vs reference {}", want.loss);
    if gradient {
        assert_eq!(z, 0.0, "the gradient program has no z-loss");
        check_gradient(&c, &p, &b, &out);
    }
}

/// The forward pass, unrolled, and from the same program the gradient (see [`check_gradient`]).
#[test]
fn forward_matches_reference_unrolled() {
    check_forward(false, &["remat_policy=full"], 0.0, true);
}

/// The forward pass, scanned, and from the same program the gradient (see [`check_gradient`]).
#[test]
fn forward_matches_reference_scanned() {
    check_forward(true, &["remat_policy=full"], 0.0, true);
}

#[test]
fn forward_matches_reference_tied_embedding_z_loss_minimal_remat() {
    check_forward(true, &["logits_via_embedding=true", "remat_policy=minimal"], 1e-2, false);
}

/// The gradient from `value_and_grad` (`out`, with full rematerialization) against central
/// differences of the f64 reference loss. (Once a test of its own, with its own program; now read
/// from the forward tests' programs, one compile for both.)
fn check_gradient(c: &maxrs::model::Model, p: &RefParams, b: &Batch, out: &Tree<maxrs::host::HostTensor>) {
    let scan_layers = c.config.scan_layers;
    // (layer, reference parameter, row, col) and the element's index in the model's layout.
    let probes: &[(usize, &str, usize, usize)] = &[
        (0, "self_attention.query.kernel", 3, 70),
        (1, "self_attention.key.kernel", 10, 5),
        (0, "self_attention.value.kernel", 200, 100),
        (1, "self_attention.out.kernel", 130, 7),
        (0, "mlp.wi_0.kernel", 17, 300),
        (1, "mlp.wo.kernel", 400, 11),
        (0, "pre_self_attention_layer_norm.scale", 0, 42),
    ];
    for &(li, name, r, col) in probes {
        let mut plus = clone_params(p);
        let mut minus = clone_params(p);
        let h = 1e-4;
        plus.layers[li].get_mut(name).unwrap()[[r, col]] += h;
        minus.layers[li].get_mut(name).unwrap()[[r, col]] -= h;
        let fd = (reference(c, &plus, &b.tokens, &b.targets, &b.seg, 0.0).loss
            - reference(c, &minus, &b.tokens, &b.targets, &b.seg, 0.0).loss)
            / (2.0 * h);
        let cols = p.layers[li][name].ncols();
        let (grad_name, offset) = if scan_layers {
            (format!("grad.decoder.layers.{name}"), li * p.layers[li][name].len())
        } else {
            (format!("grad.decoder.layers_{li}.{name}"), 0)
        };
        let g = out[grad_name.as_str()].to_f64()[offset + r * cols + col];
        println!(
            "scan_layers={scan_layers} d loss / d {name}[{li}][{r},{col}]: traced {g:e}, finite difference {fd:e}"
        );
        assert!((g - fd).abs() <= 1e-3 * fd.abs() + 1e-6, "{name}: traced {g} vs finite difference {fd}");
    }
}

/// `init_params`: every parameter of `param_defs` with its shape and dtype, MaxText's scales
/// (embedding stddev 1, kernels stddev sqrt(1/fan_in), truncated or not, Llama's query kernel that
/// over sqrt(head_dim), norm scales 1, biases and GPT-3's norm scales 0), the same values for the same seed and different values for another
/// seed; for the Llama model and a small GPT-3 (the other initializers).
#[test]
fn init_params_follow_the_defs_and_the_seed() {
    use maxrs::model::{Model, ParamInit};
    use maxrs::tensor::random;
    let gpt3 = [
        "model_name=gpt3-52k",
        "override_model_config=true",
        "base_emb_dim=128",
        "base_mlp_dim=256",
        "vocab_size=512",
        "trainable_position_size=256",
        "max_target_length=64",
    ];
    let gpt3 = Model::from_config(&maxrs::config::load(None, &gpt3.map(String::from)).unwrap()).unwrap();
    let lora = config(true, &["lora.enable_lora=true", "lora.lora_rank=16", "lora.lora_alpha=16"]);
    for c in [config(true, &[]), gpt3, lora] {
        // The seed is an input: one compile per model for the three draws.
        let mut sig = Signature::new(None);
        sig.input("seed", maxrs::ir::DType::U32, &[]);
        let program = trace(&sig, |_, inp| c.init_params(&random::key_from(&inp["seed"]))).expect("init traces");
        let compiled = maxrs::runtime::compile(&crate::common::client(), &program).expect("init compiles");
        let init = |seed: u32| {
            let inputs = Tree::new().with("seed", maxrs::host::HostTensor::from_u32(&[], &[seed]));
            compiled.run(&crate::common::client(), &inputs).expect("init runs")
        };
        let (a, again, other) = (init(0), init(0), init(1));
        let defs = c.param_defs();
        assert_eq!(a.len(), defs.len());
        for def in &defs {
            let values = a[def.name.as_str()].to_f64();
            assert_eq!(a[def.name.as_str()].dims, def.shape, "{}", def.name);
            assert_eq!(values, again[def.name.as_str()].to_f64(), "{} is not deterministic", def.name);
            let n = values.len() as f64;
            let mean = values.iter().sum::<f64>() / n;
            let std = (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt();
            let constant = match def.init {
                ParamInit::Ones => Some(1.0),
                ParamInit::Zeros => Some(0.0),
                ParamInit::Normal(s) => {
                    assert!((std / s - 1.0).abs() < 0.05, "{}: std {std}", def.name);
                    None
                }
                ParamInit::FanIn(fan_in) => {
                    let want = (1.0 / fan_in as f64).sqrt();
                    assert!((std / want - 1.0).abs() < 0.05, "{}: std {std}, expected {want}", def.name);
                    assert!(values.iter().all(|v| v.abs() <= 2.0 * want / 0.8796 + 1e-6), "{} not truncated", def.name);
                    None
                }
                ParamInit::FanInOver { fan_in, .. } => {
                    // dtype=float32: MaxText's depth_scaling is sqrt(head_dim) in f32.
                    let want = (1.0 / fan_in as f64).sqrt() / (c.config.head_dim as f64).sqrt();
                    assert!(def.name.ends_with("query.kernel"), "{}", def.name);
                    assert!((std / want - 1.0).abs() < 0.05, "{}: std {std}, expected {want}", def.name);
                    assert!(values.iter().all(|v| v.abs() <= 2.0 * want / 0.8796 + 1e-6), "{} not truncated", def.name);
                    None
                }
                ParamInit::FanInNormal(fan_in) => {
                    let want = (1.0 / fan_in as f64).sqrt();
                    assert!((std / want - 1.0).abs() < 0.05, "{}: std {std}, expected {want}", def.name);
                    // Untruncated: a sample this large has values beyond 2 stddev.
                    assert!(values.iter().any(|v| v.abs() > 2.0 * want), "{} looks truncated", def.name);
                    None
                }
                ParamInit::HeUniform(fan_in) => {
                    // Uniform on ±sqrt(6 / fan_in): stddev sqrt(2 / fan_in).
                    let (limit, want) = ((6.0 / fan_in as f64).sqrt(), (2.0 / fan_in as f64).sqrt());
                    assert!(def.name.ends_with("_lora_a"), "{}", def.name);
                    assert!((std / want - 1.0).abs() < 0.05, "{}: std {std}, expected {want}", def.name);
                    assert!(values.iter().all(|v| v.abs() <= limit), "{} beyond ±{limit}", def.name);
                    None
                }
            };
            match constant {
                Some(k) => assert!(values.iter().all(|&v| v == k), "{}", def.name),
                None => assert_ne!(values, other[def.name.as_str()].to_f64(), "{} ignores the seed", def.name),
            }
        }
    }
}

/// Unscanned layers initialize to the scanned model's stacked values, layer by layer (one random
/// draw per kind of layer parameter, as the scanned model draws it), and the layers differ.
#[test]
fn unscanned_init_is_the_scanned_init_unstacked() {
    use maxrs::tensor::random;
    let init = |scan: bool| {
        let c = config(scan, &[]);
        let program = trace(&Signature::new(None), |ctx, _| c.init_params(&random::key(ctx, 3))).expect("init traces");
        (c.param_defs(), crate::common::run(&program, &Tree::new()))
    };
    let ((scanned_defs, scanned), (defs, unscanned)) = (init(true), init(false));
    assert_eq!(unscanned.len(), defs.len());
    let layers = (0..).take_while(|i| unscanned.get(&format!("decoder.layers_{i}.mlp.wo.kernel")).is_some()).count();
    assert!(layers >= 2, "the reference model has several layers");
    for def in &scanned_defs {
        let values = scanned[def.name.as_str()].to_f64();
        let Some(name) = def.name.strip_prefix("decoder.layers.") else {
            assert_eq!(values, unscanned[def.name.as_str()].to_f64(), "{}", def.name);
            continue;
        };
        let per_layer = values.len() / layers;
        for i in 0..layers {
            let got = unscanned[format!("decoder.layers_{i}.{name}").as_str()].to_f64();
            assert_eq!(got, values[i * per_layer..(i + 1) * per_layer], "layer {i} of {name}");
        }
        if !matches!(def.init, maxrs::model::ParamInit::Ones | maxrs::model::ParamInit::Zeros) {
            assert_ne!(values[..per_layer], values[per_layer..2 * per_layer], "{name}: layers 0 and 1 are equal");
        }
    }
}

/// The query kernel's draw is MaxText's for the families whose attention folds the queries'
/// `1/sqrt(head_dim)` into it (`Attention.init_query_w`, `src/maxtext/layers/attentions.py` at
/// MaxText e591f30: `kernel_init(...) / depth_scaling`, `depth_scaling = jnp.sqrt(head_dim)
/// .astype(dtype)`): Llama 2 and Gemma with head_dim 128. With `dtype=bfloat16` the divisor is
/// bfloat16's nearest to sqrt(128) = 11.31371, i.e. 11.3125 (8 significant bits: steps of 1/16 in
/// [8, 16)); with float32, sqrt(128) in f32. The same seed draws the same values otherwise, so
/// the two kernels differ by exactly that ratio, and the key kernel (same fan-in) not at all.
#[test]
fn folded_query_kernels_are_drawn_as_maxtext_draws_them() {
    use maxrs::model::Model;
    use maxrs::tensor::random;
    let init = |model: &str, dtype: &str| {
        let args = [
            &format!("model_name={model}"),
            "override_model_config=true",
            "base_emb_dim=256",
            "base_num_query_heads=2",
            "base_num_kv_heads=2",
            "head_dim=128",
            "base_mlp_dim=64",
            "base_num_decoder_layers=1",
            "vocab_size=64",
            "weight_dtype=float32",
            &format!("dtype={dtype}"),
        ];
        let c = Model::from_config(&maxrs::config::load(None, &args.map(String::from)).unwrap()).unwrap();
        let program = trace(&Signature::new(None), |ctx, _| c.init_params(&random::key(ctx, 5))).unwrap();
        crate::common::run(&program, &Tree::new())
    };
    let sqrt_f32 = (128f32).sqrt() as f64;
    for model in ["llama2-7b", "gemma-2b"] {
        let (bf16, f32) = (init(model, "bfloat16"), init(model, "float32"));
        let kernel = |p: &Tree<maxrs::host::HostTensor>, name: &str| {
            p[format!("decoder.layers.self_attention.{name}.kernel").as_str()].to_f64()
        };
        let (query, query_f32) = (kernel(&bf16, "query"), kernel(&f32, "query"));
        assert_eq!(kernel(&bf16, "key"), kernel(&f32, "key"), "{model}: the same draw");
        let want_ratio = sqrt_f32 / 11.3125;
        for (a, b) in query.iter().zip(&query_f32) {
            assert!((a / b / want_ratio - 1.0).abs() < 1e-6, "{model}: {a} / {b} is not {want_ratio}");
        }
        let n = query.len() as f64;
        let std = (query.iter().map(|v| v * v).sum::<f64>() / n).sqrt();
        let want = (1.0 / 256f64).sqrt() / 11.3125;
        assert!((std / want - 1.0).abs() < 0.05, "{model}: query kernel std {std}, MaxText's {want}");
    }
}
