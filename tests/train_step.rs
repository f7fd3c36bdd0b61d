//! One compiled train step (`maxrs::train::step`) against an f64 reference written here: the
//! reference loss (tests/common/llama_ref.rs), its gradient by central differences for every
//! parameter element, then clipping, AdamW and the schedule by hand. Starting from random,
//! non-zero optimizer moments at step 3 (mid-schedule, bias corrections not trivial), with
//! clipping active and a z-loss, the step's loss, gradient norm, learning rate, new moments and
//! new parameters must match. A tiny model keeps the finite differences cheap.

use crate::common::llama_ref::*;
use maxrs::config::{self, Config};
use maxrs::host::HostTensor;
use maxrs::runtime;
use maxrs::tensor::Tree;
use maxrs::train::schedule::LearningRateSchedule;
use maxrs::train::step::TrainStep;

const TINY: &[&str] = &[
    "base_emb_dim=8",
    "base_num_query_heads=4",
    "base_num_kv_heads=2",
    "head_dim=2",
    "base_mlp_dim=16",
    "vocab_size=16",
    "per_device_batch_size=2",
    "max_target_length=16",
    "steps=10",
    "warmup_steps_fraction=0.2",
    "learning_rate=0.01",
    "adam_eps_root=1e-9",
];

fn run_config(scan_layers: bool, clip: f64, z: f64) -> Config {
    let mut overrides: Vec<String> = TINY.iter().map(|s| s.to_string()).collect();
    overrides.extend([
        "dtype=float32".to_string(),
        "weight_dtype=float32".to_string(),
        format!("scan_layers={scan_layers}"),
        format!("gradient_clipping_threshold={clip}"),
        format!("z_loss_multiplier={z}"),
    ]);
    config::load(None, &overrides).expect("config loads")
}

/// d loss / d p for every element of `p`, by central differences of the f64 reference.
fn finite_difference_grads(c: &maxrs::model::Model, p: &RefParams, b: &Batch, z: f64) -> RefParams {
    let mut work = clone_params(p);
    let mut grads = map_params(p, |_| 0.0);
    let h = 1e-5;
    let count = param_matrices_mut(&mut work).len();
    for m in 0..count {
        let len = param_matrices_mut(&mut work)[m].len();
        for i in 0..len {
            let at = |w: &mut RefParams, delta: f64| {
                let mut ms = param_matrices_mut(w);
                let x = ms[m].as_slice_mut().expect("standard layout");
                x[i] += delta;
            };
            at(&mut work, h);
            let plus = reference(c, &work, &b.tokens, &b.targets, &b.seg, z).loss;
            at(&mut work, -2.0 * h);
            let minus = reference(c, &work, &b.tokens, &b.targets, &b.seg, z).loss;
            at(&mut work, h);
            param_matrices_mut(&mut grads)[m].as_slice_mut().expect("standard layout")[i] = (plus - minus) / (2.0 * h);
        }
    }
    grads
}

/// The tree `host_params` makes, renamed from `params.` to `prefix.`.
fn renamed(c: &maxrs::model::Model, p: &RefParams, prefix: &str) -> Tree<HostTensor> {
    host_params(c, p)
        .into_iter()
        .map(|(n, t)| (format!("{prefix}.{}", n.strip_prefix("params.").unwrap()), t))
        .collect()
}

/// The reference loss, gradient and gradient norm: they do not depend on `scan_layers` (only the
/// stacking of the compiled step's parameters does), so both tests share one computation, the
/// costly part of each (two f64 forward passes per parameter element).
struct Reference {
    loss: f64,
    grads: RefParams,
    norm: f64,
}

fn shared_reference(c: &maxrs::model::Model, p: &RefParams, b: &Batch, z: f64) -> &'static Reference {
    static REFERENCE: std::sync::OnceLock<Reference> = std::sync::OnceLock::new();
    REFERENCE.get_or_init(|| {
        let loss = reference(c, p, &b.tokens, &b.targets, &b.seg, z).loss;
        let mut grads = finite_difference_grads(c, p, b, z);
        let norm: f64 =
            param_matrices_mut(&mut grads).iter().map(|m| m.iter().map(|x| x * x).sum::<f64>()).sum::<f64>().sqrt();
        Reference { loss, grads, norm }
    })
}

fn check_step(scan_layers: bool) {
    let z = 1e-3;
    let c = config(scan_layers, TINY);
    let p = random_params(&c, 11);
    let b = batch(&c, 12);
    let mut rng = crate::common::rng(13);
    let mu = map_params(&p, |_| crate::common::uniform(&mut rng, 1, -0.01, 0.01)[0]);
    let nu = map_params(&p, |_| crate::common::uniform(&mut rng, 1, 0.0, 1e-4)[0]);
    let count = 3;

    // The reference step.
    let want = shared_reference(&c, &p, &b, z);
    let (want_loss, norm) = (want.loss, want.norm);
    let mut g2 = clone_params(&want.grads);
    let clip = 0.5 * norm; // clipping is active
    let cfg = run_config(scan_layers, clip, z);
    let schedule = LearningRateSchedule::new(0.01, cfg.learning_rate_final_fraction, 0.2, None, -1, 10).unwrap();
    let lr = schedule.at(count);
    let (b1, b2, eps, eps_root, wd) =
        (cfg.adam_b1, cfg.adam_b2, cfg.adam_eps, cfg.adam_eps_root, cfg.adam_weight_decay);
    let t = (count + 1) as i32;
    let scale = clip / norm;
    let (mut want_mu, mut want_nu, mut want_p) = (clone_params(&mu), clone_params(&nu), clone_params(&p));
    {
        let (mut gm, mut mm, mut nm, mut pm) = (
            param_matrices_mut(&mut g2),
            param_matrices_mut(&mut want_mu),
            param_matrices_mut(&mut want_nu),
            param_matrices_mut(&mut want_p),
        );
        for k in 0..gm.len() {
            let gs = gm[k].as_slice_mut().unwrap();
            let (ms, ns, ps) =
                (mm[k].as_slice_mut().unwrap(), nm[k].as_slice_mut().unwrap(), pm[k].as_slice_mut().unwrap());
            for i in 0..gs.len() {
                let g = gs[i] * scale;
                ms[i] = b1 * ms[i] + (1.0 - b1) * g;
                ns[i] = b2 * ns[i] + (1.0 - b2) * g * g;
                let m_hat = ms[i] / (1.0 - b1.powi(t));
                let v_hat = ns[i] / (1.0 - b2.powi(t));
                ps[i] -= lr * (m_hat / ((v_hat + eps_root).sqrt() + eps) + wd * ps[i]);
            }
        }
    }

    // The compiled step.
    let derived = config::validate(&cfg, 1, 1).expect("valid config");
    let step = TrainStep::new(&cfg, &derived, None).unwrap();
    let program = step.train_step().expect("the train step traces");
    let mut inputs = host_params(&c, &p);
    inputs.extend(renamed(&c, &mu, "opt_state.mu"));
    inputs.extend(renamed(&c, &nu, "opt_state.nu"));
    inputs.insert("opt_state.count", HostTensor::from_i32(&[], &[count as i32]));
    let dims = [B as i64, T as i64];
    inputs.insert("batch.inputs", HostTensor::from_i32(&dims, &b.tokens));
    inputs.insert("batch.targets", HostTensor::from_i32(&dims, &b.targets));
    inputs.insert("batch.targets_segmentation", HostTensor::from_i32(&dims, &b.seg));
    let out = runtime::run_program(&crate::common::client(), &program, &inputs).expect("the step runs");

    let scalar = |n: &str| out[n].to_f64()[0];
    let rel = |got: f64, want: f64| (got - want).abs() / want.abs();
    println!(
        "scan_layers={scan_layers}: loss {} vs {want_loss}, grad_norm {} vs {norm}",
        scalar("metrics.loss"),
        scalar("metrics.grad_norm")
    );
    assert!(rel(scalar("metrics.loss"), want_loss) < 1e-5, "loss");
    assert!(rel(scalar("metrics.grad_norm"), norm) < 1e-4, "grad_norm");
    assert!(
        rel(scalar("metrics.learning_rate"), lr) < 1e-6,
        "learning rate {} vs {lr}",
        scalar("metrics.learning_rate")
    );
    assert_eq!(out["opt_state.count"].to_i64(), vec![count as i64 + 1]);
    for (prefix, want, tol) in
        [("opt_state.mu", &want_mu, 1e-4), ("opt_state.nu", &want_nu, 1e-4), ("params", &want_p, 1e-5)]
    {
        for (name, tensor) in renamed(&c, want, prefix).iter() {
            let err = scaled_err(&out[name].to_f64(), &tensor.to_f64());
            assert!(err < tol, "{name}: scaled error {err:e}");
        }
    }
    // The update itself (new minus old parameters), which is much smaller than the parameters.
    for (name, before) in host_params(&c, &p).iter() {
        let after_want = &renamed(&c, &want_p, "params")[name];
        let delta = |x: &HostTensor| x.to_f64().iter().zip(before.to_f64()).map(|(a, b)| a - b).collect::<Vec<_>>();
        let err = scaled_err(&delta(&out[name]), &delta(after_want));
        assert!(err < 2e-3, "{name}: update differs, scaled error {err:e}");
    }
}

#[test]
fn train_step_matches_reference_scanned() {
    check_step(true);
}

#[test]
fn train_step_matches_reference_unrolled() {
    check_step(false);
}
