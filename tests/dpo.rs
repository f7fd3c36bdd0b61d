//! DPO and ORPO (`train::dpo`, `data::preference`): the losses, their metrics and their
//! gradients on a tiny Llama, run through the CPU plugin, against an f64 reference written
//! here from the papers' formulas on the logits of the independent f64 model reference
//! (`common::family_ref`): DPO as Rafailov et al. 2023 eq. 7 with cDPO's label smoothing (as
//! Tunix's `dpo_loss_fn`, google/tunix `tunix/sft/dpo/dpo_trainer.py` at c7d8950), ORPO as Hong
//! et al. 2024 eqs. 2-7 (odds of the length-normalized likelihood, the NLL over prompt and
//! chosen response, as Tunix and TRL default to). The gradients against central differences of
//! the f64 loss; under LoRA the reference is the base model (the adapters off), and only the
//! adapters get gradients. Then whole runs: DPO and ORPO on ~200 learnable pairs, a DPO run
//! resumed from its checkpoint, LoRA with DPO (only the adapters move), and MaxText's
//! `post_train/dpo.yml` with a local data file (and its eval), DPO on an MoE, a Gemma 3 and an
//! MLA model, gradient accumulation against the same pairs at once, the eval's reward metrics;
//! pairs read alike from JSON Lines, Parquet and a `gs://` bucket.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ndarray::Array2;

use maxrs::autodiff::value_and_grad_with_aux;
use maxrs::checkpoint::{dir, manifest};
use maxrs::cluster::client_for;
use maxrs::config;
use maxrs::data::batch::Batch;
use maxrs::data::preference::{batches, Pair};
use maxrs::files::Location;
use maxrs::host::HostTensor;
use maxrs::ir::{DType, Signature};
use maxrs::model::Model;
use maxrs::tensor::{trace, Tree};
use maxrs::train::dpo::{means, without_adapters, Algo, Dpo};
use maxrs::train::run::train;

use crate::common::family_ref::{self, host_params, random_params, Family, RefParams, RopeRef, Spec};
use crate::common::llama_ref::{self, B, T};
use crate::model_families::SIZES;

/// The prompt's share of a row (MaxText's `dpo.max_prompt_length`).
const MAX_PROMPT: usize = 6;

fn spec() -> Spec {
    Spec::plain(Family::Llama, RopeRef::HalfSplit, 1e-5)
}

fn tiny(extra: &[&str]) -> Model {
    let args: Vec<&str> = SIZES.iter().chain(["scan_layers=true"].iter()).chain(extra).copied().collect();
    family_ref::model("llama2-7b", &args)
}

/// `B` pairs of random ids: the first with a prompt longer than `MAX_PROMPT` (cut to its last
/// ids) and a chosen response longer than the rest of the row (cut to its first), the second
/// short, with padding.
fn pairs(vocab: i32) -> Vec<Pair> {
    let mut rng = crate::common::rng(5);
    let mut ids = |n: usize| -> Vec<i32> { (0..n).map(|_| rand::Rng::gen_range(&mut rng, 1..vocab)).collect() };
    let pairs = vec![
        Pair { prompt: ids(8), chosen: ids(12), rejected: ids(7) },
        Pair { prompt: ids(3), chosen: ids(4), rejected: ids(6) },
    ];
    assert_eq!(pairs.len(), B);
    pairs
}

fn ids(t: &HostTensor) -> Vec<i32> {
    t.to_i64().into_iter().map(|v| v as i32).collect()
}

/// The f64 model's logits `[B * T, vocab]` on one side's rows.
fn logits(m: &Model, p: &RefParams, side: &Batch) -> Array2<f64> {
    let b = llama_ref::Batch {
        tokens: ids(&side.inputs),
        targets: ids(&side.targets),
        seg: ids(&side.targets_segmentation),
    };
    family_ref::reference(&spec(), m, p, &b).logits
}

/// Per row: the response's summed log-likelihood and tokens, and the same over every token of
/// the row that has one before it (prompt and response).
struct RowRef {
    response: f64,
    response_tokens: f64,
    full: f64,
    full_tokens: f64,
}

fn log_softmax_at(row: ndarray::ArrayView1<f64>, id: i32) -> f64 {
    let max = row.fold(f64::NEG_INFINITY, |m, &v| m.max(v));
    let lse = max + row.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
    row[id as usize] - lse
}

fn rows_ref(logits: &Array2<f64>, side: &Batch) -> Vec<RowRef> {
    let (inputs, targets) = (ids(&side.inputs), ids(&side.targets));
    let (counted, real) = (ids(&side.targets_segmentation), ids(&side.inputs_segmentation));
    (0..B)
        .map(|r| {
            let mut row = RowRef { response: 0.0, response_tokens: 0.0, full: 0.0, full_tokens: 0.0 };
            for t in 0..T {
                let at = r * T + t;
                if counted[at] != 0 {
                    row.response += log_softmax_at(logits.row(at), targets[at]);
                    row.response_tokens += 1.0;
                }
                if t + 1 < T && real[at + 1] != 0 {
                    row.full += log_softmax_at(logits.row(at), inputs[at + 1]);
                    row.full_tokens += 1.0;
                }
            }
            row
        })
        .collect()
}

fn log_sigmoid(x: f64) -> f64 {
    -(1.0 + (-x).exp()).ln()
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = values.collect();
    v.iter().sum::<f64>() / v.len() as f64
}

/// Per pair: the loss, the (chosen, rejected) rewards and the (chosen, rejected) log-probabilities.
type PerPair = (Vec<f64>, Vec<(f64, f64)>, Vec<(f64, f64)>);

/// The loss and metrics of the papers' formulas (see the module docs) on the f64 model.
fn loss_ref(
    dpo: &Dpo,
    m: &Model,
    policy: &RefParams,
    reference: Option<(&Model, &RefParams)>,
    sides: &[Batch; 2],
) -> (f64, BTreeMap<&'static str, f64>) {
    let of = |m: &Model, p: &RefParams, i: usize| rows_ref(&logits(m, p, &sides[i]), &sides[i]);
    let (chosen, rejected) = (of(m, policy, 0), of(m, policy, 1));
    let s = dpo.label_smoothing;
    let mut metrics = BTreeMap::new();
    let pairs = chosen.iter().zip(&rejected);
    let (losses, rewards, logps): PerPair = match dpo.algo {
        Algo::Dpo => {
            let (rm, rp) = reference.expect("DPO has a reference");
            let (ref_c, ref_r) = (of(rm, rp, 0), of(rm, rp, 1));
            let mut out = (vec![], vec![], vec![]);
            for (i, (c, r)) in pairs.enumerate() {
                // log pi(y|x) / pi_ref(y|x), scaled by beta: the implicit rewards.
                let reward_c = dpo.beta * (c.response - ref_c[i].response);
                let reward_r = dpo.beta * (r.response - ref_r[i].response);
                let z = reward_c - reward_r;
                out.0.push(-(1.0 - s) * log_sigmoid(z) - s * log_sigmoid(-z));
                out.1.push((reward_c, reward_r));
                out.2.push((c.response, r.response));
            }
            out
        }
        Algo::Orpo => {
            let mut out = (vec![], vec![], vec![]);
            let mut odds_ratios = vec![];
            for (c, r) in pairs {
                let avg = |row: &RowRef| (row.response / row.response_tokens).min(-1e-7);
                let (avg_c, avg_r) = (avg(c), avg(r));
                // odds(y|x) = P / (1 - P), P the length-normalized likelihood (eq. 3-4).
                let odds = |avg: f64| avg.exp() / (1.0 - avg.exp());
                let ratio = odds(avg_c) / odds(avg_r);
                let or_loss = -(1.0 - s) * log_sigmoid(ratio.ln()) - s * log_sigmoid(-ratio.ln());
                let sft = -c.full / c.full_tokens;
                out.0.push(sft + dpo.orpo_lambda * or_loss);
                out.1.push((dpo.orpo_lambda * avg_c, dpo.orpo_lambda * avg_r));
                out.2.push((avg_c, avg_r));
                odds_ratios.push(ratio);
            }
            metrics.insert("odds_ratio", mean(odds_ratios.into_iter()));
            out
        }
    };
    metrics.insert("rewards.chosen", mean(rewards.iter().map(|r| r.0)));
    metrics.insert("rewards.rejected", mean(rewards.iter().map(|r| r.1)));
    metrics.insert("rewards.margin", mean(rewards.iter().map(|r| r.0 - r.1)));
    metrics.insert("rewards.accuracy", mean(rewards.iter().map(|r| if r.0 > r.1 { 1.0 } else { 0.0 })));
    metrics.insert("log_probs.chosen", mean(logps.iter().map(|l| l.0)));
    metrics.insert("log_probs.rejected", mean(logps.iter().map(|l| l.1)));
    let tokens = chosen.iter().chain(&rejected).map(|r| r.response_tokens).sum();
    metrics.insert("total_weights", tokens);
    (mean(losses.into_iter()), metrics)
}

/// The traced loss: its value, metrics (`metrics.<name>`) and the gradient (`grad.<name>`) of
/// the parameters that train: all of the model's, or under LoRA the adapters (the rest frozen).
/// DPO reads a reference model: `reference.<name>`, or under LoRA the base weights.
fn run(
    dpo: &Dpo,
    m: &Model,
    policy: &RefParams,
    reference: Option<&RefParams>,
    sides: &[Batch; 2],
) -> Tree<HostTensor> {
    let mut sig = Signature::new(None);
    m.declare_params(&mut sig, "params");
    if reference.is_some() {
        m.declare_params(&mut sig, "reference");
    }
    for side in ["chosen", "rejected"] {
        for name in ["inputs", "targets", "targets_segmentation", "inputs_segmentation"] {
            sig.input(&format!("{side}.{name}"), DType::S32, &[B as i64, T as i64]);
        }
    }
    let lora = m.param_defs().iter().any(|d| m.is_adapter(&d.name));
    let program = trace(&sig, |_, inp| {
        let all = inp.subtree("params");
        let trained: Tree = all.iter().filter(|(n, _)| !lora || m.is_adapter(n)).map(|(n, v)| (n, v.clone())).collect();
        let frozen: Tree = all.iter().filter(|(n, _)| lora && !m.is_adapter(n)).map(|(n, v)| (n, v.clone())).collect();
        let reference = match (dpo.algo, lora) {
            (Algo::Orpo, _) => None,
            (Algo::Dpo, true) => Some(without_adapters(m, &all)),
            (Algo::Dpo, false) => Some(inp.subtree("reference")),
        };
        let (chosen, rejected) = (inp.subtree("chosen"), inp.subtree("rejected"));
        let (loss, metrics, grads) = value_and_grad_with_aux(&trained, |p| {
            let mut params = p.clone();
            params.extend(frozen.clone());
            dpo.loss(m, &params, reference.as_ref(), &chosen, &rejected)
        });
        let mut out =
            grads.prefixed("grad").with("loss", loss).with("metrics.total_weights", metrics["total_weights"].clone());
        out.extend(means(&metrics).prefixed("metrics"));
        out
    })
    .expect("the loss traces");
    let mut inputs = host_params(m, policy);
    if let Some(r) = reference {
        inputs.extend(host_params(m, r).subtree("params").prefixed("reference"));
    }
    for (side, batch) in ["chosen", "rejected"].iter().zip(sides) {
        for name in ["inputs", "targets", "targets_segmentation", "inputs_segmentation"] {
            inputs.insert(format!("{side}.{name}"), batch.get(name).unwrap().clone());
        }
    }
    crate::common::run(&program, &inputs)
}

/// Compares the traced loss and metrics with the reference's, and the gradient at `probes`
/// (layer, parameter, flat index) with central differences of `loss_of`.
fn check(
    label: &str,
    out: &Tree<HostTensor>,
    want: &(f64, BTreeMap<&'static str, f64>),
    probes: &[(usize, &str, usize)],
    p: &RefParams,
    loss_of: impl Fn(&RefParams) -> f64,
) {
    let loss = out["loss"].to_f64()[0];
    println!("{label}: loss {loss} vs reference {}", want.0);
    assert!((loss - want.0).abs() <= 1e-4 * want.0.abs().max(1.0), "{label}: loss {loss} vs {}", want.0);
    for (name, value) in &want.1 {
        let got = out[format!("metrics.{name}").as_str()].to_f64()[0];
        println!("{label}: {name} {got} vs reference {value}");
        assert!((got - value).abs() <= 1e-4 * value.abs().max(1.0), "{label}: {name} {got} vs {value}");
    }
    for &(layer, name, index) in probes {
        let h = 1e-4;
        let nudged = |delta: f64| {
            let mut q = p.clone();
            let a = q.layers[layer].get_mut(name).unwrap();
            let cols = a.ncols();
            a[[index / cols, index % cols]] += delta;
            loss_of(&q)
        };
        let fd = (nudged(h) - nudged(-h)) / (2.0 * h);
        let per_layer = p.layers[layer][name].len();
        let g = out[format!("grad.decoder.layers.{name}").as_str()].to_f64()[layer * per_layer + index];
        println!("{label}: d loss / d {name}[{layer}][{index}]: traced {g:e}, finite difference {fd:e}");
        assert!(fd.abs() > 1e-6, "{label}: {name}[{index}] does not affect the loss; pick another probe");
        assert!((g - fd).abs() <= 2e-3 * fd.abs() + 1e-6, "{label}: {name}: traced {g} vs finite difference {fd}");
    }
}

const PROBES: &[(usize, &str, usize)] =
    &[(0, "self_attention.query.kernel", 17), (1, "mlp.wo.kernel", 40), (1, "self_attention.out.kernel", 5)];

/// DPO against a reference model of other weights, with label smoothing: the loss, Tunix's
/// metrics and the gradient. The pairs' rows are cut as MaxText cuts them.
#[test]
fn dpo_loss_and_gradient_match_the_paper() {
    let m = tiny(&[]);
    let sides = batches(&pairs(m.config.vocab as i32), MAX_PROMPT, T, 0);
    assert_eq!(ids(&sides[0].inputs)[..MAX_PROMPT], pairs(m.config.vocab as i32)[0].prompt[2..]);
    let (policy, reference) = (random_params(&spec(), &m, 1), random_params(&spec(), &m, 2));
    for (beta, smoothing) in [(0.5, 0.0), (0.3, 0.2)] {
        let dpo = Dpo { algo: Algo::Dpo, beta, label_smoothing: smoothing, orpo_lambda: 0.1 };
        let out = run(&dpo, &m, &policy, Some(&reference), &sides);
        let loss_of = |p: &RefParams| loss_ref(&dpo, &m, p, Some((&m, &reference)), &sides);
        let want = loss_of(&policy);
        let label = format!("dpo beta={beta} smoothing={smoothing}");
        check(&label, &out, &want, PROBES, &policy, |p| loss_of(p).0);
    }
}

/// ORPO: no reference model, the NLL of the chosen rows plus the weighted odds-ratio loss.
#[test]
fn orpo_loss_and_gradient_match_the_paper() {
    let m = tiny(&[]);
    let sides = batches(&pairs(m.config.vocab as i32), MAX_PROMPT, T, 0);
    let policy = random_params(&spec(), &m, 3);
    for smoothing in [0.0, 0.25] {
        let dpo = Dpo { algo: Algo::Orpo, beta: 0.1, label_smoothing: smoothing, orpo_lambda: 0.7 };
        let out = run(&dpo, &m, &policy, None, &sides);
        let loss_of = |p: &RefParams| loss_ref(&dpo, &m, p, None, &sides);
        check(&format!("orpo smoothing={smoothing}"), &out, &loss_of(&policy), PROBES, &policy, |p| loss_of(p).0);
    }
}

/// DPO under LoRA: the reference is the base model (the same weights, the adapters off), the
/// policy the merged weights; only the adapters get gradients. With `lora_b` at zero (a fresh
/// run) policy and reference agree: the loss is log 2 and every reward 0.
#[test]
fn lora_dpo_uses_the_base_model_as_its_reference() {
    let m = tiny(crate::lora::LORA);
    let base = tiny(&[]);
    let sides = batches(&pairs(m.config.vocab as i32), MAX_PROMPT, T, 0);
    let p = random_params(&spec(), &m, 4);
    let dpo = Dpo { algo: Algo::Dpo, beta: 0.5, label_smoothing: 0.1, orpo_lambda: 0.1 };
    let out = run(&dpo, &m, &p, None, &sides);
    let grads: Vec<&str> = out.names().filter(|n| n.starts_with("grad.")).collect();
    assert_eq!(grads.len(), 14, "{grads:?}");
    assert!(grads.iter().all(|n| n.contains("_lora_")), "only the adapters train: {grads:?}");
    let base_weights = crate::lora::without_adapters(&p);
    let loss_of = |q: &RefParams| loss_ref(&dpo, &base, &crate::lora::merged(q), Some((&base, &base_weights)), &sides);
    let probes = [(0, "self_attention.query.kernel_lora_a", 17), (1, "mlp.wo.kernel_lora_b", 40)];
    check("lora dpo", &out, &loss_of(&p), &probes, &p, |q| loss_of(q).0);

    let mut fresh = p.clone();
    for layer in &mut fresh.layers {
        for (name, value) in layer.iter_mut() {
            if name.ends_with("_lora_b") {
                value.fill(0.0);
            }
        }
    }
    let out = run(&dpo, &m, &fresh, None, &sides);
    let loss = out["loss"].to_f64()[0];
    assert!((loss - std::f64::consts::LN_2).abs() < 1e-6, "a fresh adapter is its reference: loss {loss}");
    assert_eq!(out["metrics.rewards.margin"].to_f64()[0], 0.0);
}

/// ~200 preference pairs in a JSON Lines file (MaxText's three columns) where the chosen
/// response is learnable: it praises the prompt's word, the rejected one scorns another.
fn learnable_pairs(dir: &Path) -> PathBuf {
    let words = ["king", "queen", "love", "night", "sword", "crown", "heart", "lord", "rose", "storm"];
    let lines: Vec<String> = (0..200)
        .map(|i| {
            let (w, other) = (words[i % words.len()], words[(i * 7 + 3) % words.len()]);
            serde_json::json!({
                "prompt": format!("Speak of the {w}."),
                "chosen": format!("The {w} is fair and good."),
                "rejected": format!("A {other} was foul, alas."),
            })
            .to_string()
        })
        .collect();
    let path = dir.join("pairs.jsonl");
    std::fs::write(&path, lines.join("\n")).unwrap();
    path
}

fn tokenizer() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/shakespeare-bpe512.model").display().to_string()
}

/// The arguments of a tiny DPO run on `data`.
fn dpo_run(data: &Path, extra: &[&str]) -> Vec<String> {
    let args: Vec<String> = [
        "dataset_type=hf".to_string(),
        "use_dpo=true".into(),
        "packing=false".into(),
        "train_data_columns=[prompt, chosen, rejected]".into(),
        format!("hf_train_files={}", data.display()),
        format!("tokenizer_path={}", tokenizer()),
        "vocab_size=512".into(),
        "max_target_length=24".into(),
        "dpo.max_prompt_length=10".into(),
        "dpo.dpo_beta=0.5".into(),
        "per_device_batch_size=8".into(),
        "dtype=float32".into(),
        "learning_rate=3e-3".into(),
    ]
    .into_iter()
    .chain(crate::common::TINY_DECODER.iter().map(|s| s.to_string()))
    .collect();
    args.into_iter().chain(extra.iter().map(|s| s.to_string())).collect()
}

fn metric_lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// DPO on learnable pairs: the first step's policy is its reference (loss log 2, no reward,
/// no pair won), then the loss falls and the accuracy rises, Tunix's metrics in the metrics
/// file. The reference model is checkpointed: a run resumed from step 8 continues with the
/// same losses as the run that went on.
#[test]
fn dpo_learns_preferences_and_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let data = learnable_pairs(dir.path());
    let base = format!("base_output_directory={}", dir.path().display());
    let metrics = dir.path().join("metrics.jsonl");
    let run = |extra: &[&str]| {
        let c = config::load(None, &dpo_run(&data, extra)).unwrap();
        train(&c, &client_for(&c).unwrap()).unwrap()
    };
    let ckpt = ["enable_checkpointing=true", "checkpoint_period=8", "run_name=d", &base];
    let metrics_arg = format!("metrics_file={}", metrics.display());
    let whole = run(&[&ckpt[..], &["steps=16", &metrics_arg]].concat());
    let lines = metric_lines(&metrics);
    let at = |step: usize, key: &str| lines[step][key].as_f64().unwrap_or_else(|| panic!("{key} at {step}"));
    println!("losses {:?}", whole.losses);
    let accuracy: Vec<f64> = (0..16).map(|s| at(s, "rewards/accuracy")).collect();
    println!("rewards/accuracy {accuracy:?}");
    assert!((whole.losses[0] - std::f64::consts::LN_2).abs() < 1e-5, "step 0: the policy is its reference");
    assert_eq!((at(0, "rewards/margin"), accuracy[0]), (0.0, 0.0));
    assert!(whole.losses[15] < 0.3, "the loss falls: {:?}", whole.losses);
    assert!(accuracy[12..].iter().all(|&a| a == 1.0), "every pair is won: {accuracy:?}");
    assert!(at(15, "rewards/chosen") > at(15, "rewards/rejected") && at(15, "log_probs/chosen") < 0.0);
    assert!(lines[0].get("odds_ratio").is_none(), "DPO has no odds ratio");

    std::fs::remove_dir_all(dir.path().join("d/checkpoints/15")).unwrap();
    let resumed = run(&[&ckpt[..], &["steps=16"]].concat());
    assert_eq!(resumed.first_step, 9);
    assert_eq!(resumed.losses, whole.losses[9..], "the resumed run compares with the same reference");
}

/// ORPO trains without a reference model: no `reference.*` state, its NLL term falls with the
/// odds-ratio term, and it reports the odds ratio.
#[test]
fn orpo_trains_without_a_reference() {
    let dir = tempfile::tempdir().unwrap();
    let data = learnable_pairs(dir.path());
    let metrics = dir.path().join("metrics.jsonl");
    let args = dpo_run(&data, &["dpo.algo=orpo", "steps=8", &format!("metrics_file={}", metrics.display())]);
    let c = config::load(None, &args).unwrap();
    let step = maxrs::train::step::TrainStep::new(&c, &config::validate(&c, 1, 1).unwrap(), None).unwrap();
    assert!(step.state().names().iter().all(|n| !n.starts_with("reference.")));
    let dpo_step = {
        let c = config::load(None, &dpo_run(&data, &[])).unwrap();
        maxrs::train::step::TrainStep::new(&c, &config::validate(&c, 1, 1).unwrap(), None).unwrap()
    };
    let copies = dpo_step.state().names().iter().filter(|n| n.starts_with("reference.")).count();
    assert_eq!(copies, dpo_step.model.param_defs().len(), "DPO keeps a copy of every parameter");
    let report = train(&c, &client_for(&c).unwrap()).unwrap();
    println!("orpo losses {:?}", report.losses);
    assert!(report.losses[7] < report.losses[0] - 1.0, "{:?}", report.losses);
    let lines = metric_lines(&metrics);
    assert!(lines.iter().all(|l| l["odds_ratio"].as_f64().is_some_and(|r| r > 0.0)));
}

/// MaxText's post_train/dpo.yml (e591f30) loads as it is, with a local file in place of the Hub
/// dataset, and trains a small model; the refusals name their keys.
#[test]
fn maxtexts_dpo_yml_loads_and_trains() {
    let dir = tempfile::tempdir().unwrap();
    let data = learnable_pairs(dir.path());
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/maxtext_configs/post_train/dpo.yml");
    let load = |extra: &[&str]| {
        let args: Vec<String> =
            [file.display().to_string(), "hf_path=".into(), format!("hf_train_files={}", data.display())]
                .into_iter()
                .chain(extra.iter().map(|s| s.to_string()))
                .collect();
        config::load_args(&args)
    };
    let local = [
        "train_data_columns=[prompt, chosen, rejected]",
        "override_model_config=true",
        "enable_checkpointing=false",
        "steps=2",
    ];
    let (tok, eval) = (format!("tokenizer_path={}", tokenizer()), format!("hf_eval_files={}", data.display()));
    let small: Vec<&str> = [&local[..], &["tokenizer_type=sentencepiece", &tok, "vocab_size=512", &eval]].concat();
    let metrics = dir.path().join("metrics.jsonl");
    let metrics_arg = format!("metrics_file={}", metrics.display());
    let small: Vec<&str> = [&small[..], &[metrics_arg.as_str()]].concat();
    let small: Vec<&str> = small.into_iter().chain(crate::common::TINY_DECODER.iter().copied()).collect();
    let c = load(&small).unwrap();
    assert!(c.use_dpo && !c.packing && c.dpo_algo == Algo::Dpo && c.dpo_dpo_beta == 0.1);
    assert_eq!((c.dpo_max_prompt_length, maxrs::data::preference::max_prompt_length(&c)), (None, 256));
    assert_eq!(c.gradient_clipping_threshold, 10.0);
    let report = train(&c, &client_for(&c).unwrap()).unwrap();
    assert!((report.losses[0] - std::f64::consts::LN_2).abs() < 1e-5, "{:?}", report.losses);
    // dpo.yml's eval (eval_interval 5, eval_steps 2) after step 0, on [chosen, rejected]: the
    // prompt is the common prefix; the policy has moved by one step of learning rate 5e-7.
    let evals: Vec<(u64, u64, f64, f64)> =
        report.evals.iter().map(|e| (e.step, e.eval_steps, e.total_weights, e.avg_loss())).collect();
    println!("evals {evals:?}");
    assert_eq!(evals.len(), 1);
    assert_eq!((evals[0].0, evals[0].1, evals[0].2), (0, 2, 4.0), "two batches of two pairs");
    assert!((evals[0].3 - std::f64::consts::LN_2).abs() < 1e-2, "{evals:?}");
    // The eval's reward metrics (`dpo_eval_reports_the_reward_metrics` checks their values).
    let lines = metric_lines(&metrics);
    let eval = lines.iter().find(|l| l.get("eval/avg_loss").is_some()).expect("an eval line");
    println!("eval line {eval}");
    let rewards =
        |side: &str| eval[format!("eval/rewards/{side}")].as_f64().unwrap_or_else(|| panic!("{side}: {eval}"));
    assert!((rewards("margin") - (rewards("chosen") - rewards("rejected"))).abs() < 1e-6);
    assert!((0.0..=1.0).contains(&rewards("accuracy")) && eval.get("eval/odds_ratio").is_none());

    let checked = |extra: &[&str]| load(&[&small[..], extra].concat()).and_then(|c| config::check(&c).map(|_| c));
    let refused = |extra: &[&str]| checked(extra).unwrap_err().to_string();
    for (extra, named) in [
        (&["packing=true"][..], "packing"),
        (&["use_sft=true"], "use_sft"),
        (&["dpo.algo=ipo"], "dpo.algo"),
        (&["dpo.max_prompt_length=512"], "dpo.max_prompt_length"),
        (&["dpo.dpo_label_smoothing=1.5"], "dpo.dpo_label_smoothing"),
        (&["train_data_columns=[text]"], "train_data_columns"),
        (&["eval_data_columns=[text]"], "eval_data_columns"),
    ] {
        let e = refused(extra);
        assert!(e.contains(named), "{extra:?}: {e}");
    }
}

/// LoRA with DPO from `maxrs train`'s keys: no reference copy in the state (the base without
/// adapters is the reference), the base weights bit for bit as they started, the adapters moved.
#[test]
fn lora_dpo_trains_only_the_adapters() {
    let dir = tempfile::tempdir().unwrap();
    let data = learnable_pairs(dir.path());
    let base = format!("base_output_directory={}", dir.path().display());
    let lora = ["lora.enable_lora=true", "lora.lora_rank=4", "lora.lora_alpha=8"];
    let run = ["enable_checkpointing=true", "checkpoint_period=2", "run_name=l", "steps=4", &base];
    let c = config::load(None, &dpo_run(&data, &[&lora[..], &run[..]].concat())).unwrap();
    let expected = crate::checkpoint_resume::state_expected(&c);
    assert!(expected.iter().all(|e| !e.name.starts_with("reference.")), "no second copy under LoRA");
    let report = train(&c, &client_for(&c).unwrap()).unwrap();
    assert!((report.losses[0] - std::f64::consts::LN_2).abs() < 1e-5, "the fresh adapters are the reference");
    assert!(report.losses[3] < report.losses[0] - 0.05, "{:?}", report.losses);
    let model = Model::from_config(&c).unwrap();
    let load = |step: u64| -> BTreeMap<String, Vec<f64>> {
        let at = Location::Local(dir.path().join(format!("l/checkpoints/{step}")));
        let loaded = dir::load(&at, &expected, &manifest::model_keys(&c, &model), false).unwrap();
        loaded.arrays.into_iter().map(|(n, t)| (n, t.to_f64())).collect()
    };
    let (first, last) = (load(0), load(3));
    for (name, values) in first.iter().filter(|(n, _)| n.starts_with("params.")) {
        match name.contains("_lora_") {
            true => assert_ne!(values, &last[name], "{name}: an adapter trains"),
            false => assert_eq!(values, &last[name], "{name}: a base weight stays frozen"),
        }
    }
}

/// Preference pairs as Parquet (two row groups) read as the same pairs as JSON Lines, locally
/// and from a `gs://` bucket (the GCS emulator, when it can be had); a row without a column's
/// string is counted as undecodable, a file without the column is refused naming it.
#[test]
fn pairs_read_from_json_lines_parquet_and_a_bucket_alike() {
    use maxrs::data::documents::{read_pairs, Doc};
    use maxrs::data::storage::{GcsFiles, LocalFiles, Storage};
    use parquet::data_type::{ByteArray, ByteArrayType};
    use parquet::file::writer::SerializedFileWriter;

    let dir = tempfile::tempdir().unwrap();
    let rows: Vec<(String, String)> = (0..10).map(|i| (format!("good {i}"), format!("bad {i}"))).collect();
    let jsonl = dir.path().join("pairs.jsonl");
    let lines: Vec<String> =
        rows.iter().map(|(c, r)| serde_json::json!({"chosen": c, "rejected": r}).to_string()).collect();
    std::fs::write(&jsonl, lines.join("\n") + "\n{\"chosen\": null, \"rejected\": \"x\"}\n").unwrap();
    let parquet = dir.path().join("pairs.parquet");
    let schema = "message p { REQUIRED BYTE_ARRAY chosen (UTF8); REQUIRED BYTE_ARRAY rejected (UTF8); }";
    let schema = std::sync::Arc::new(parquet::schema::parser::parse_message_type(schema).unwrap());
    let mut writer =
        SerializedFileWriter::new(std::fs::File::create(&parquet).unwrap(), schema, Default::default()).unwrap();
    for chunk in rows.chunks(6) {
        let mut group = writer.next_row_group().unwrap();
        for column in 0..2 {
            let mut col = group.next_column().unwrap().unwrap();
            let values: Vec<ByteArray> =
                chunk.iter().map(|p| ByteArray::from(if column == 0 { p.0.as_str() } else { p.1.as_str() })).collect();
            col.typed::<ByteArrayType>().write_batch(&values, None, None).unwrap();
            col.close().unwrap();
        }
        group.close().unwrap();
    }
    writer.close().unwrap();
    let columns = ["chosen".to_string(), "rejected".to_string()];
    let read = |storage: &dyn Storage, path: &Path| -> Vec<Doc> {
        read_pairs(storage, path, &columns).unwrap().map(Result::unwrap).collect()
    };
    let from_jsonl = read(&LocalFiles, &jsonl);
    assert_eq!(from_jsonl.len(), 11);
    let text = |t: &str| maxrs::data::documents::Side::Text(t.into());
    assert_eq!(from_jsonl[3], Doc::Pair(vec![text("good 3"), text("bad 3")]));
    assert!(matches!(&from_jsonl[10], Doc::Undecodable(why) if why.contains("`chosen` is missing or null")));
    assert_eq!(read(&LocalFiles, &parquet), from_jsonl[..10]);
    let wrong = ["prompt".to_string(), "chosen".to_string(), "rejected".to_string()];
    let e = read_pairs(&LocalFiles, &jsonl, &wrong).unwrap().next().unwrap().unwrap_err().to_string();
    assert!(e.contains("prompt"), "{e}");

    let Some(_emulator) = crate::common::gcs_emulator::start(&["maxrs-pairs"]) else { return };
    let upload = |name: &str, path: &Path| {
        let at = format!("gs://maxrs-pairs/{name}");
        maxrs::storage::write(&Location::parse(&at).unwrap(), &std::fs::read(path).unwrap()).unwrap();
        PathBuf::from(at)
    };
    assert_eq!(read(&GcsFiles, &upload("p.jsonl", &jsonl)), from_jsonl);
    assert_eq!(read(&GcsFiles, &upload("p.parquet", &parquet)), from_jsonl[..10]);
}

/// The preference step sharded over 4 devices (the global batch's 8 pairs split over `fsdp`, each
/// pair's two sequences on one device) trains as on one device: the same losses.
#[test]
fn dpo_on_four_devices_matches_one() {
    let dir = tempfile::tempdir().unwrap();
    let data = learnable_pairs(dir.path());
    let losses = |devices: &str, batch: &str| {
        let c = config::load(None, &dpo_run(&data, &[devices, batch, "steps=4"])).unwrap();
        train(&c, &client_for(&c).unwrap()).unwrap().losses
    };
    let one = losses("cpu_device_count=1", "per_device_batch_size=8");
    let four = losses("cpu_device_count=4", "per_device_batch_size=2");
    println!("one device {one:?}, four {four:?}");
    assert!(one.iter().zip(&four).all(|(a, b)| (a - b).abs() < 1e-5), "{one:?} vs {four:?}");
}

/// Conversational pairs (TRL's layout: lists of `{role, content}` messages) are rendered by the
/// tokenizer's chat template as SFT renders them (Llama 3's, `tests/data/chat/llama3`): the
/// prompt is the user's turn with the generation prompt, each response the reply's segment,
/// with the prompt in its own column or in both conversations alike. Columns of both kinds give
/// no pair. A run on such a file starts at log 2.
#[test]
fn conversational_pairs_render_with_the_chat_template() {
    use maxrs::data::chat::{ChatTemplate, Message};
    use maxrs::data::documents::Side;
    use maxrs::data::preference::Pairs;
    use maxrs::data::TextTokenizer;

    let folder = crate::data_sft::chat_dir("llama3");
    let path = folder.to_str().unwrap();
    let tokenizer = TextTokenizer::load(path, "huggingface", false, false).unwrap();
    let pairs = Pairs { columns: vec![], template: Some(ChatTemplate::load("", "", path).unwrap()) };
    let message = |role: &str, content: &str| Message { role: role.into(), content: content.into() };
    let user = vec![message("user", "Which is the fairest flower?")];
    let (good, bad) = (vec![message("assistant", "The rose, my lord.")], vec![message("assistant", "Weeds.")]);
    let pair = pairs
        .encode(&tokenizer, &[Side::Chat(user.clone()), Side::Chat(good.clone()), Side::Chat(bad.clone())], 256)
        .unwrap();
    let template = pairs.template.as_ref().unwrap();
    let segments = |reply: &[Message]| template.segments(&tokenizer, &[&user[..], reply].concat()).unwrap();
    let (chosen, rejected) = (segments(&good), segments(&bad));
    assert_eq!((chosen.len(), chosen[0].1, chosen[1].1), (2, true, false), "a prompt and a completion segment");
    assert_eq!(pair.prompt, chosen[0].0);
    assert_eq!((&pair.chosen, &pair.rejected), (&chosen[1].0, &rejected[1].0));
    let whole = |reply: &[Message]| Side::Chat([&user[..], reply].concat());
    assert_eq!(pairs.encode(&tokenizer, &[whole(&good), whole(&bad)], 256), Some(pair));
    let mixed = [Side::Text("Which?".into()), Side::Chat(good.clone()), Side::Chat(bad.clone())];
    assert_eq!(pairs.encode(&tokenizer, &mixed, 256), None);
    let untemplated = Pairs { columns: vec![], template: None };
    assert_eq!(untemplated.encode(&tokenizer, &[whole(&good), whole(&bad)], 256), None);

    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("chat_pairs.jsonl");
    let line = serde_json::json!({"prompt": user, "chosen": good, "rejected": bad}).to_string();
    std::fs::write(&data, [line.as_str(); 16].join("\n")).unwrap();
    let args: Vec<String> = dpo_run(&data, &["steps=2", "max_target_length=48", "dpo.max_prompt_length=32"])
        .into_iter()
        .filter(|a| !a.starts_with("tokenizer_path") && !a.starts_with("vocab_size"))
        .chain([format!("tokenizer_path={path}"), "tokenizer_type=huggingface".into(), "vocab_size=1024".into()])
        .collect();
    let c = config::load(None, &args).unwrap();
    let report = train(&c, &client_for(&c).unwrap()).unwrap();
    assert!((report.losses[0] - std::f64::consts::LN_2).abs() < 1e-5, "{:?}", report.losses);
}

/// DPO on a family whose decoder adds to the loss: DeepSeek's MLA with a dense layer, then
/// shared and routed experts with a load-balancing weight (left out of the loss, as MaxText's
/// Tunix adapter hands Tunix's DPO loss the logits alone: the first loss is log 2 all the same,
/// and no `learning/moe_lb_loss`), tiny, for 2 steps. The first loss is log 2 (the policy is
/// its reference), every loss is finite, and the metrics file has the reward metrics (step 0:
/// no margin, no pair won). The preference step reads a family's logits only, so the other
/// families' layers (Gemma 3's norms, Mixtral's experts alone) would add compiles, not checks.
#[test]
fn dpo_trains_a_moe_and_mla_family() {
    let dir = tempfile::tempdir().unwrap();
    let data = learnable_pairs(dir.path());
    let metrics = dir.path().join("metrics.jsonl");
    let deepseek = [
        "model_name=deepseek3-tiny",
        "override_model_config=true",
        "num_experts=4",
        "num_experts_per_tok=2",
        "base_moe_mlp_dim=64",
        "load_balance_loss_weight=0.01",
        "base_num_decoder_layers=2",
        "first_num_dense_layers=1",
        "q_lora_rank=16",
        "kv_lora_rank=16",
        "qk_nope_head_dim=16",
        "qk_rope_head_dim=8",
        "v_head_dim=16",
        "steps=2",
        "per_device_batch_size=2",
    ];
    let key = |arg: &str| arg.split('=').next().unwrap_or_default().to_string();
    let given: Vec<String> = deepseek.iter().map(|a| key(a)).collect();
    let args: Vec<String> = dpo_run(&data, &[])
        .into_iter()
        .filter(|a| !given.contains(&key(a)))
        .chain(deepseek.iter().map(|s| s.to_string()))
        .chain([format!("metrics_file={}", metrics.display())])
        .collect();
    let c = config::load(None, &args).unwrap();
    let report = train(&c, &client_for(&c).unwrap()).unwrap();
    println!("losses {:?}", report.losses);
    assert!(report.losses.iter().all(|l| l.is_finite()), "{:?}", report.losses);
    assert!((report.losses[0] - std::f64::consts::LN_2).abs() < 1e-5, "{:?}", report.losses);
    let lines = metric_lines(&metrics);
    assert_eq!(lines.len(), 2);
    for (_, name) in &maxrs::train::dpo::METRICS[..6] {
        assert!(lines.iter().all(|l| l[name].as_f64().is_some_and(f64::is_finite)), "{name}");
    }
    assert_eq!((lines[0]["rewards/margin"].as_f64(), lines[0]["rewards/accuracy"].as_f64()), (Some(0.0), Some(0.0)));
    assert!(lines[1]["log_probs/chosen"].as_f64().unwrap() < 0.0);
    assert!(lines[0].get("learning/moe_lb_loss").is_none(), "no load-balancing loss under DPO");
}

/// Gradient accumulation under DPO: a step's 8 pairs as 2 micro-batches of 4 train as the 8 at
/// once (Tunix adds up the gradients of the losses summed over each micro-batch's pairs and
/// divides by all the pairs): the same losses and reward metrics step by step.
#[test]
fn dpo_accumulated_matches_unaccumulated() {
    let dir = tempfile::tempdir().unwrap();
    let data = learnable_pairs(dir.path());
    let run = |batch: &str, accumulation: &str| {
        let metrics = dir.path().join(format!("{accumulation}.jsonl"));
        let file = format!("metrics_file={}", metrics.display());
        let args: Vec<String> = dpo_run(&data, &["steps=4", accumulation, &file])
            .into_iter()
            .filter(|a| !a.starts_with("per_device_batch_size"))
            .chain([batch.to_string()])
            .collect();
        let c = config::load(None, &args).unwrap();
        // A step runs 8 pairs of 2 sequences of 24 tokens, accumulated or not.
        let summary = config::validate(&c, 1, 1).unwrap().to_string();
        assert!(summary.contains("tokens per step: 8 pairs x 2 sequences (chosen, rejected) x 24 = 384"), "{summary}");
        assert!(summary.contains("global batch 8 pairs, split"), "{summary}");
        (train(&c, &client_for(&c).unwrap()).unwrap().losses, metric_lines(&metrics))
    };
    let (whole, whole_lines) = run("per_device_batch_size=8", "gradient_accumulation_steps=1");
    let (accumulated, accumulated_lines) = run("per_device_batch_size=4", "gradient_accumulation_steps=2");
    println!("unaccumulated {whole:?}, accumulated {accumulated:?}");
    assert!(whole[3] < whole[0] - 0.01, "the steps train: {whole:?}");
    assert!(whole.iter().zip(&accumulated).all(|(a, b)| (a - b).abs() < 1e-5), "{whole:?} vs {accumulated:?}");
    for (one, two) in whole_lines.iter().zip(&accumulated_lines) {
        for key in ["rewards/margin", "rewards/accuracy", "log_probs/chosen", "learning/total_weights"] {
            let (a, b) = (one[key].as_f64().unwrap(), two[key].as_f64().unwrap());
            assert!((a - b).abs() <= 1e-5 * a.abs().max(1.0), "{key}: {a} vs {b}");
        }
    }
}

/// An eval reports Tunix's reward metrics over all its pairs, as `eval/<name>`: with a learning
/// rate of 0 the policy stays its reference, so that an eval over the first step's 8 pairs
/// (unshuffled; 2 batches of 4) has that step's log-probabilities (means over the 8), no reward,
/// no pair won, and the loss log 2.
#[test]
fn dpo_eval_reports_the_reward_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let data = learnable_pairs(dir.path());
    let metrics = dir.path().join("metrics.jsonl");
    let eval = [
        format!("hf_eval_files={}", data.display()),
        "eval_data_columns=[prompt, chosen, rejected]".into(),
        "eval_interval=1".into(),
        "eval_steps=2".into(),
        "eval_per_device_batch_size=4".into(),
        format!("metrics_file={}", metrics.display()),
    ];
    let args: Vec<String> = dpo_run(&data, &["steps=1", "learning_rate=0", "enable_data_shuffling=false"])
        .into_iter()
        .filter(|a| !a.starts_with("learning_rate=3e-3"))
        .chain(eval)
        .collect();
    let c = config::load(None, &args).unwrap();
    let report = train(&c, &client_for(&c).unwrap()).unwrap();
    assert_eq!((report.evals.len(), report.evals[0].total_weights), (1, 8.0), "one eval of 8 pairs");
    let lines = metric_lines(&metrics);
    let (step, eval) = (&lines[0], &lines[1]);
    println!("step {step}\neval {eval}");
    let at = |line: &serde_json::Value, key: &str| line[key].as_f64().unwrap_or_else(|| panic!("{key}: {line}"));
    for key in ["log_probs/chosen", "log_probs/rejected"] {
        let (got, want) = (at(eval, &format!("eval/{key}")), at(step, key));
        assert!(want < 0.0 && (got - want).abs() <= 1e-5 * want.abs(), "eval/{key} {got} vs step 0's {want}");
    }
    for key in ["rewards/chosen", "rewards/rejected", "rewards/margin", "rewards/accuracy"] {
        assert_eq!(at(eval, &format!("eval/{key}")), 0.0, "{key}");
    }
    assert!((at(eval, "eval/avg_loss") - std::f64::consts::LN_2).abs() < 1e-6);
}
