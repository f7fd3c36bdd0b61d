//! LoRA (`lora.*` keys, `model::lora`): an adapted model against the independent f64 reference
//! of its family run on the merged weights `W + A @ B * alpha / r` (computed here), scanned and
//! unrolled; the adapters' gradients against central differences of that reference; training
//! that moves only the adapters (base weights bit for bit, optimizer state for the adapters
//! only), checkpointed and resumed, and `load_parameters_path` loading the base model under
//! fresh adapters; MaxText's `lora:` mapping in files and `lora.<field>=` on the command line;
//! the refusals.

use std::collections::BTreeMap;

use maxrs::checkpoint::{dir, manifest};
use maxrs::config;
use maxrs::files::Location;
use maxrs::model::Model;
use maxrs::pjrt::cpu_client;

use crate::common::family_ref::{self, batch, check_outputs, inputs, random_params, Family, RefParams, RopeRef, Spec};
use crate::model_families::SIZES;

pub(crate) const LORA: &[&str] = &["lora.enable_lora=true", "lora.lora_rank=3", "lora.lora_alpha=7.5"];
const SCALE: f64 = 7.5 / 3.0;

fn llama_spec() -> Spec {
    Spec::plain(Family::Llama, RopeRef::HalfSplit, 1e-5)
}

fn shrunk(lora: bool, extra: &[&str]) -> Model {
    let adapters: &[&str] = if lora { LORA } else { &[] };
    let args: Vec<&str> = SIZES.iter().chain(adapters).chain(extra).copied().collect();
    family_ref::model("llama2-7b", &args)
}

/// `p` with every adapter pair folded into its kernel (`W + A @ B * scale`, kernels flattened to
/// `[inputs, outputs]` as `RefParams` holds them) and removed: the parameters of the same model
/// without LoRA.
pub(crate) fn merged(p: &RefParams) -> RefParams {
    let mut p = p.clone();
    for layer in &mut p.layers {
        let adapted: Vec<String> = layer.keys().filter_map(|k| k.strip_suffix("_lora_a")).map(str::to_string).collect();
        assert!(!adapted.is_empty(), "a layer has adapters");
        for kernel in adapted {
            let a = layer.remove(&format!("{kernel}_lora_a")).unwrap();
            let b = layer.remove(&format!("{kernel}_lora_b")).unwrap();
            let w = layer.get_mut(&kernel).unwrap();
            *w = &*w + &(a.dot(&b) * SCALE);
        }
    }
    p
}

/// Which parameters have adapters: MaxText's default path for a Llama (`lora_module_path.yml`'s
/// `default`) matches the attention and MLP projections, nothing else.
#[test]
fn the_default_path_adapts_the_attention_and_mlp_projections() {
    for scan in ["true", "false"] {
        let m = shrunk(true, &[&format!("scan_layers={scan}")]);
        let defs = m.param_defs();
        let adapted: Vec<&str> = defs.iter().filter_map(|d| d.name.strip_suffix(".kernel_lora_a")).collect();
        let per_layer = ["query", "key", "value", "out"]
            .map(|p| format!("self_attention.{p}"))
            .into_iter()
            .chain(["wi_0", "wi_1", "wo"].map(|p| format!("mlp.{p}")));
        let want: Vec<String> = match scan {
            "true" => per_layer.map(|p| format!("decoder.layers.{p}")).collect(),
            _ => (0..2).flat_map(|l| per_layer.clone().map(move |p| format!("decoder.layers_{l}.{p}"))).collect(),
        };
        let mut want_sorted = want.clone();
        want_sorted.sort();
        let mut got: Vec<String> = adapted.iter().map(|s| s.to_string()).collect();
        got.sort();
        assert_eq!(got, want_sorted, "scan_layers={scan}");
        // Qwix's shapes: A [contracted, r], B [r, outputs] (the out kernel contracts heads x head_dim).
        let shape = |name: &str| defs.iter().find(|d| d.name == name).unwrap().shape.clone();
        if scan == "true" {
            assert_eq!(shape("decoder.layers.self_attention.query.kernel_lora_a"), [2, 32, 3]);
            assert_eq!(shape("decoder.layers.self_attention.query.kernel_lora_b"), [2, 3, 4 * 8]);
            assert_eq!(shape("decoder.layers.self_attention.out.kernel_lora_a"), [2, 4 * 8, 3]);
            assert_eq!(shape("decoder.layers.self_attention.out.kernel_lora_b"), [2, 3, 32]);
        }
        assert!(defs.iter().all(|d| d.frozen != d.name.contains("_lora_")), "only the adapters train");
    }
}

/// The adapted model equals the reference on merged weights (embeddings, every layer, logits,
/// loss within 1e-4), scanned and unrolled; the merged weights are another function than the
/// base ones; the gradient of the loss with respect to adapter elements matches central
/// differences of the reference loss.
#[test]
fn an_adapted_model_is_its_merged_weights() {
    let spec = llama_spec();
    for scan in ["true", "false"] {
        let m = shrunk(true, &[&format!("scan_layers={scan}")]);
        let base = shrunk(false, &[&format!("scan_layers={scan}")]);
        let (p, b) = (random_params(&spec, &m, 11), batch(&m, 12));
        let gradient = scan == "true";
        let program = crate::common::llama_ref::forward_program(&m, 0.0, gradient);
        let out = crate::common::run(&program, &inputs(&m, &p, &b));
        let want = family_ref::reference(&spec, &base, &merged(&p), &b);
        check_outputs(&format!("lora scan_layers={scan}"), &base, &out, &want);
        let unadapted = family_ref::reference(&spec, &base, &without_adapters(&p), &b);
        let moved = crate::common::max_rel_diff(
            &unadapted.logits.iter().copied().collect::<Vec<_>>(),
            &want.logits.iter().copied().collect::<Vec<_>>(),
        );
        assert!(moved > 1e-2, "the adapters change nothing: {moved:e}");
        if !gradient {
            continue;
        }
        let probes = [
            (0, "self_attention.query.kernel_lora_a", 17),
            (1, "self_attention.out.kernel_lora_b", 40),
            (0, "mlp.wi_1.kernel_lora_b", 100),
            (1, "mlp.wo.kernel_lora_a", 60),
        ];
        for (layer, name, index) in probes {
            let h = 1e-4;
            let nudged = |delta: f64| {
                let mut q = p.clone();
                let a = q.layers[layer].get_mut(name).unwrap();
                let cols = a.ncols();
                a[[index / cols, index % cols]] += delta;
                family_ref::reference(&spec, &base, &merged(&q), &b).loss
            };
            let fd = (nudged(h) - nudged(-h)) / (2.0 * h);
            let per_layer = p.layers[layer][name].len();
            let g = out[format!("grad.decoder.layers.{name}").as_str()].to_f64()[layer * per_layer + index];
            println!("d loss / d {name}[{layer}][{index}]: traced {g:e}, finite difference {fd:e}");
            assert!(fd.abs() > 1e-7, "{name}[{index}] does not affect the loss; pick another probe");
            assert!((g - fd).abs() <= 2e-3 * fd.abs() + 1e-6, "{name}: traced {g} vs finite difference {fd}");
        }
    }
}

pub(crate) fn without_adapters(p: &RefParams) -> RefParams {
    let mut p = p.clone();
    for layer in &mut p.layers {
        layer.retain(|k, _| !k.contains("_lora_"));
    }
    p
}

/// A LoRA run trains the adapters only: two steps on one batch, checkpointed, resumed for two
/// more; the base weights are those of the first checkpoint bit for bit, the adapters moved
/// (`lora_b` starts at zero), the optimizer state holds the adapters' moments only, the loss
/// falls. Starting with `lora_b` at zero and the base drawn as without LoRA, its first loss is a
/// plain run's. `load_parameters_path` loads a plain run's checkpoint as the base under fresh
/// adapters (its first loss is the plain run's next), and a LoRA run's with its adapters;
/// `lora.lora_restore_path` reads a LoRA checkpoint's adapters only, and is refused without LoRA
/// or a checkpoint there.
#[test]
fn lora_trains_only_the_adapters_and_checkpoints_them() {
    let base = tempfile::tempdir().unwrap();
    let dir_arg = format!("base_output_directory={}", base.path().display());
    let plain_config = |extra: &[&str]| {
        let args = [
            "per_device_batch_size=4",
            "enable_checkpointing=true",
            "checkpoint_period=1",
            "reuse_example_batch=1",
            &dir_arg,
        ];
        config::load(None, &crate::checkpoint_resume::small(&[&args[..], extra].concat())).unwrap()
    };
    let config = |extra: &[&str]| {
        let lora = ["lora.enable_lora=true", "lora.lora_rank=4", "lora.lora_alpha=8", "checkpoint_period=2"];
        plain_config(&[&lora[..], extra].concat())
    };
    let run = |c: &config::Config| maxrs::train::run::train(c, &cpu_client(1).unwrap()).unwrap();
    let c = config(&["run_name=l", "steps=2"]);
    let first = run(&c);
    let second = run(&config(&["run_name=l", "steps=4"]));
    assert_eq!(second.first_step, 2);
    let losses: Vec<f64> = first.losses.iter().chain(&second.losses).copied().collect();
    assert!(losses[3] < losses[0] - 0.05, "the adapters learn one batch: {losses:?}");

    let model = Model::from_config(&c).unwrap();
    let load = |step: u64| -> BTreeMap<String, Vec<f64>> {
        let at = Location::Local(base.path().join(format!("l/checkpoints/{step}")));
        let expected = crate::checkpoint_resume::state_expected(&c);
        let loaded = dir::load(&at, &expected, &manifest::model_keys(&c, &model), false).unwrap();
        loaded.arrays.into_iter().map(|(n, t)| (n, t.to_f64())).collect()
    };
    let (after_two, after_four) = (load(1), load(3));
    let moments: Vec<&String> = after_two.keys().filter(|n| n.starts_with("opt_state.mu.")).collect();
    assert_eq!(moments.len(), 14, "{moments:?}");
    assert!(moments.iter().all(|n| n.contains("_lora_")), "{moments:?}");
    for (name, values) in &after_two {
        let Some(key) = name.strip_prefix("params.") else { continue };
        let later = &after_four[name];
        if key.contains("_lora_") {
            assert_ne!(values, later, "{name}: an adapter trains");
            if key.ends_with("_lora_b") {
                assert!(values.iter().any(|&v| v != 0.0), "{name} moved from zero");
            }
        } else {
            assert_eq!(values, later, "{name}: a base weight stays frozen");
        }
    }

    let plain = run(&plain_config(&["run_name=p", "steps=2"]));
    assert_eq!(first.losses[0], plain.losses[0], "lora_b starts at zero, the base as drawn without LoRA");
    let load_from = |run_name: &str, step: u64| {
        let path = format!("load_parameters_path={}/{run_name}/checkpoints/{step}", base.path().display());
        run(&config(&["run_name=from", "steps=1", "enable_checkpointing=false", &path])).losses[0]
    };
    assert_eq!(load_from("p", 0), plain.losses[1], "a plain checkpoint is the base, the adapters fresh");
    // Fresh adapters would give the first run's first loss (the base is frozen, lora_b zero); the
    // trained ones, on the batch they were trained on, less.
    let with_adapters = load_from("l", 1);
    assert!(
        with_adapters < first.losses[0] - 0.05,
        "a LoRA checkpoint brings its adapters: {with_adapters} vs {:?}",
        first.losses
    );
    // lora.lora_restore_path: the adapters alone, over the base the init program draws (the
    // LoRA run's frozen base): the same state as loading its parameters.
    let restore = format!("lora.lora_restore_path={}/l/checkpoints/1", base.path().display());
    let restored = run(&config(&["run_name=r", "steps=1", "enable_checkpointing=false", &restore]));
    assert_eq!(restored.losses[0], with_adapters, "the adapters restored, the base drawn");
    let refused =
        |c: config::Config| format!("{:#}", maxrs::train::run::train(&c, &cpu_client(1).unwrap()).unwrap_err());
    let e = refused(plain_config(&["run_name=x", "steps=1", "enable_checkpointing=false", &restore]));
    assert!(e.contains("lora.lora_restore_path") && e.contains("set lora.enable_lora=true"), "{e}");
    let nowhere = format!("lora.lora_restore_path={}", base.path().display());
    let e = refused(config(&["run_name=x", "steps=1", "enable_checkpointing=false", &nowhere]));
    assert!(e.contains("no manifest.json there"), "{e}");
}

/// MaxText's `lora:` mapping: post_train/sft.yml (MaxText e591f30) with LoRA turned on from the
/// command line field by field, a file's partial mapping merged over it, and the refusals, each
/// naming its key.
#[test]
fn maxtexts_lora_keys_load_and_bad_ones_are_refused() {
    let sft = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/maxtext_configs/post_train/sft.yml");
    let load = |extra: &[&str]| {
        let args: Vec<String> =
            std::iter::once(sft.display().to_string()).chain(extra.iter().map(|s| s.to_string())).collect();
        config::load_args(&args)
    };
    let c = load(&["lora.enable_lora=True", "lora.lora_rank=16", "lora.lora_alpha=32"]).unwrap();
    assert!(c.lora_enable_lora && c.lora_rank == 16 && c.lora_alpha == 32.0 && c.lora_module_path.is_empty());
    let m = Model::from_config(&c).unwrap();
    assert!(m.lora_summary().unwrap().contains("7 projections adapted"), "{}", m.lora_summary().unwrap());

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lora.yml");
    std::fs::write(&file, format!("base_config: {}\nlora:\n  lora_rank: 4\n", sft.display())).unwrap();
    let c = config::load_args(&[file.display().to_string(), "lora.enable_lora=true".into()]).unwrap();
    assert!(c.lora_enable_lora && c.lora_rank == 4 && c.lora_alpha == 0.0);

    let refused = |extra: &[&str]| load(extra).err().map(|e| e.to_string());
    let model_refuses = |extra: &[&str]| Model::from_config(&load(extra).unwrap()).unwrap_err().to_string();
    let e = refused(&["lora.lora_weight_qtype=nf4"]).unwrap();
    assert!(e.contains("lora.lora_weight_qtype") && e.contains("QLoRA"), "{e}");
    let e = refused(&["lora.rank=3"]).unwrap();
    assert!(e.contains("lora.rank"), "{e}");
    let e = refused(&["lora=7"]).unwrap();
    assert!(e.contains("lora.<field>=value"), "{e}");
    let e = model_refuses(&["lora.enable_lora=true"]);
    assert!(e.contains("lora.lora_rank is 0"), "{e}");
    let e = model_refuses(&["lora.enable_lora=true", "lora.lora_rank=2"]);
    assert!(e.contains("lora.lora_alpha is 0") && e.contains("lora.lora_alpha=4"), "{e}");
    let e = model_refuses(&[
        "lora.enable_lora=true",
        "lora.lora_rank=2",
        "lora.lora_alpha=4",
        "lora.lora_module_path=decoder/nothing",
    ]);
    assert!(e.contains("matches no projection") && e.contains("decoder/layers/self_attention/query"), "{e}");
    let e = model_refuses(&[
        "lora.enable_lora=true",
        "lora.lora_rank=2",
        "lora.lora_alpha=4",
        "lora.lora_module_path=decoder/logits_dense",
    ]);
    assert!(e.contains("not a DenseGeneral kernel") && e.contains("not supported yet"), "{e}");
    let e = model_refuses(&[
        "lora.enable_lora=true",
        "lora.lora_rank=2",
        "lora.lora_alpha=4",
        "lora.lora_module_path=(unclosed",
    ]);
    assert!(e.contains("not a regular expression"), "{e}");
    let e = model_refuses(&["lora.enable_lora=true", "lora.lora_rank=2", "lora.lora_alpha=4", "quantization=fp8"]);
    assert!(e.contains("quantization=fp8") && e.contains("not supported yet"), "{e}");
}

/// Every family with MaxText's default path for its model name (`lora_module_path.yml` at
/// e591f30): the projections it adapts, layer by layer as the family names them; DeepSeek-V3's
/// names match no entry (its `default` reads `decoder/layers/`, DeepSeek's stacks are
/// `dense_layers` and `moe_layers`), so it is refused and needs a path, as in MaxText.
#[test]
fn every_family_gets_adapters_from_maxtexts_default_paths() {
    let adapted = |model_name: &str, extra: &[&str]| -> Result<Vec<String>, String> {
        let args: Vec<String> = [
            format!("model_name={model_name}"),
            "lora.enable_lora=true".into(),
            "lora.lora_rank=4".into(),
            "lora.lora_alpha=8".into(),
        ]
        .into_iter()
        .chain(extra.iter().map(|s| s.to_string()))
        .collect();
        let m = Model::from_config(&config::load(None, &args).unwrap()).map_err(|e| e.to_string())?;
        let mut kernels: Vec<String> = m
            .param_defs()
            .iter()
            .filter_map(|d| d.name.strip_suffix(".kernel_lora_a"))
            .map(|n| n.strip_prefix("decoder.").unwrap().to_string())
            .collect();
        kernels.sort();
        Ok(kernels)
    };
    for (model_name, want) in [
        ("llama2-7b", 7),
        ("mistral-7b", 7),
        ("mixtral-8x7b", 4),
        ("gemma-2b", 7),
        ("gemma2-2b", 14),
        ("gemma3-4b", 6 * 7 + 4 * 7),
        ("gpt3-52k", 4),
        ("qwen2.5-7b", 7),
        ("qwen3-8b", 7),
        ("qwen3-30b-a3b", 4),
        ("qwen3-custom-30b-a3b", 4),
        ("deepseek2-16b", 7),
        // Blocks of 4 layers, each its own `layers_<j>` (as MaxText scans OLMo 3).
        ("olmo3-7b", 4 * 7),
        // Blocks of 2 layers; the experts' stacked kernels are not dense projections.
        ("gpt-oss-20b", 2 * 4),
        // Blocks of 4 layers: llama4-17b-128e's dense ones with the MLP's 3, its MoE ones without
        // (the shared expert is `Llama4MoEBlock_0/shared_experts`, not `mlp`).
        ("llama4-17b-128e", 2 * 7 + 2 * 4),
    ] {
        let kernels = adapted(model_name, &[]).unwrap_or_else(|e| panic!("{model_name}: {e}"));
        println!("{model_name}: {kernels:?}");
        assert_eq!(kernels.len(), want, "{model_name}: {kernels:?}");
    }
    let e = adapted("deepseek3-671b", &[]).unwrap_err();
    assert!(e.contains("matches no projection") && e.contains("decoder/dense_layers/self_attention"), "{e}");
    let path = "lora.lora_module_path=decoder/(dense_layers|moe_layers)/self_attention/(wq_a|wq_b|wkv_a|wkv_b|out)";
    assert_eq!(adapted("deepseek3-671b", &[path]).unwrap().len(), 10);
}
