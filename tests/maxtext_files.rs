//! MaxText's own config files as a MaxText user brings them: `base_config` chains resolved as
//! MaxText's pyconfig resolves them, MaxText keys maxrs lacks accepted at MaxText's default and
//! refused by name otherwise, and the GPU recipes' files (tests/data/maxtext_configs/, copied
//! from MaxText e591f30) loading and training.

use std::path::{Path, PathBuf};

use maxrs::cluster::client_for;
use maxrs::config::{self, Source};
use maxrs::train::run::train;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/maxtext_configs").join(name)
}

fn args(file: &Path, overrides: &[&str]) -> Vec<String> {
    std::iter::once(file.display().to_string()).chain(overrides.iter().map(|s| s.to_string())).collect()
}

fn error(file: &Path, overrides: &[&str]) -> String {
    config::resolve_args(&args(file, overrides)).expect_err("refused").to_string()
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, text).unwrap();
    path
}

/// pyconfig.py `_load_config` at MaxText e591f30: a relative base_config next to the file that
/// names it, else in the configs directory (maxrs: the built-in base.yml); the named file's keys
/// under the naming file's; an absolute path as it is.
#[test]
fn base_config_chains_resolve_as_maxtext_pyconfig_does() {
    let dir = tempfile::tempdir().unwrap();
    let top = write(dir.path(), "run/top.yml", "base_config: 'parent.yml'\nsteps: 7\n");
    let parent = write(
        dir.path(),
        "run/parent.yml",
        &format!("base_config: '{}'\nsteps: 5\nlearning_rate: 0.5\n", dir.path().join("grand.yml").display()),
    );
    let grand =
        write(dir.path(), "grand.yml", "base_config: base.yml\nlearning_rate: 0.25\nwarmup_steps_fraction: 0.5\n");
    let r = config::resolve_args(&args(&top, &["learning_rate=0.125"])).unwrap();
    assert_eq!(r.config.steps, 7);
    assert_eq!(r.config.learning_rate, 0.125, "the command line over every file");
    assert_eq!(r.config.warmup_steps_fraction, 0.5);
    assert_eq!(r.source("steps"), &Source::ConfigFile(top.clone()));
    assert_eq!(r.source("warmup_steps_fraction"), &Source::ConfigFile(grand.clone()));
    let read: Vec<&PathBuf> = r.files_read.iter().map(|(_, p)| p).collect();
    assert_eq!(read, [&top, &parent, &grand], "outputs may not overwrite any file of the chain");

    // A file of the chain is a config file of its own too.
    let r = config::resolve_args(&args(&parent, &[])).unwrap();
    assert_eq!((r.config.steps, r.config.learning_rate), (5, 0.5));
}

#[test]
fn base_config_cycles_and_missing_files_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let a = write(dir.path(), "a.yml", "base_config: b.yml\n");
    write(dir.path(), "b.yml", "base_config: a.yml\n");
    let e = error(&a, &[]);
    assert!(e.starts_with("base_config:") && e.contains("named twice") && e.contains("a.yml"), "{e}");

    let lost = write(dir.path(), "lost.yml", "base_config: gpu/base.yml\n");
    let e = error(&lost, &[]);
    assert!(e.contains("`gpu/base.yml`") && e.contains("only base.yml"), "{e}");

    let e = error(&write(dir.path(), "absent.yml", "base_config: /nonexistent/x.yml\n"), &[]);
    assert!(e.contains("/nonexistent/x.yml"), "{e}");
    let e = error(&write(dir.path(), "typed.yml", "base_config: [a]\n"), &[]);
    assert!(e.starts_with("base_config:") && e.contains("expected the path of a config file"), "{e}");
    let e = config::resolve_args(&["steps=3".into(), "base_config=a.yml".into()]).unwrap_err().to_string();
    assert!(e.starts_with("base_config:") && e.contains("first argument"), "{e}");
}

/// A MaxText key maxrs has no use for is accepted at MaxText's default (base.yml at MaxText
/// e591f30: `shardy: True`, `enable_goodput_recording: False`; types.py: `lora`'s fields) and
/// refused by name with any other value.
#[test]
fn maxtext_keys_at_their_default_are_accepted_and_others_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(
        dir.path(),
        "f.yml",
        "shardy: True\nenable_goodput_recording: false\nlora:\n  enable_lora: false\n  lora_rank: 0\nhf_lora_adapter_path: ''\n",
    );
    config::resolve_args(&args(&f, &["check_vma=false"])).unwrap();
    let e = error(&f, &["shardy=false"]);
    assert_eq!(
        e,
        "`shardy` on the command line is MaxText's, but not supported yet: maxrs has only its default (true)"
    );
    let e = error(&f, &["hf_lora_adapter_path=x"]);
    assert!(e.contains("maxrs convert from-hf HF_DIR DST hf_lora_adapter_path=ADAPTER_DIR"), "{e}");
    let e = error(&write(dir.path(), "lora.yml", "lora: {enable_lora: true, lora_weight_qtype: nf4}\n"), &[]);
    assert!(e.starts_with("`lora.lora_weight_qtype` in ") && e.contains("no QLoRA"), "{e}");
    let e = error(&f, &["shardyy=true"]);
    assert!(e.contains("unknown key `shardyy`") && e.contains("shardy"), "a typo is still a typo: {e}");
}

/// MaxText's GPU files, as shipped: `base_config: base.yml` (not next to them: the configs
/// directory's), a named model whose file then applies, and the keys they set.
#[test]
fn maxtext_gpu_model_files_load_with_their_values() {
    let r = config::resolve_args(&args(&fixture("gpu/models/llama2_7b.yml"), &[])).unwrap();
    let c = &r.config;
    assert_eq!(c.model_name, "llama2-7b");
    assert_eq!((c.base_emb_dim, c.base_num_decoder_layers), (4096, 32), "models/llama2-7b.yml applies");
    assert_eq!((c.per_device_batch_size, c.max_target_length, c.steps), (4.0, 4096, 30));
    assert!(c.use_iota_embed && !c.scan_layers && !c.enable_checkpointing);
    assert_eq!(c.max_segments_per_seq, 32);
    let r = config::resolve_args(&args(&fixture("gpu/models/mixtral_8x7b.yml"), &[])).unwrap();
    assert_eq!((r.config.reuse_example_batch, r.config.num_experts), (1, 8));
    // post_train/sft.yml: a Hub dataset's splits, its LoRA mapping at enable_lora: false, Tunix's
    // accumulation with one microbatch.
    let c = config::load_args(&args(&fixture("post_train/sft.yml"), &[])).unwrap();
    assert_eq!(
        (c.hf_path.as_str(), c.train_split.as_str(), c.hf_eval_split.as_str()),
        ("HuggingFaceH4/ultrachat_200k", "train_sft", "test_sft")
    );
    assert!(c.use_sft && c.packing && c.use_tunix_gradient_accumulation);
    assert_eq!(c.train_data_columns, ["messages"]);
}

/// MaxText's GPU smoke test file trains as it is, on CPU (`hardware=cpu`, fewer steps).
#[test]
fn maxtext_gpu_smoke_test_file_trains() {
    let file = fixture("gpu/gpu_smoke_test.yml");
    let c = config::load_args(&args(&file, &["hardware=cpu", "steps=3", "max_target_length=128"])).unwrap();
    assert_eq!((c.base_emb_dim, c.base_num_decoder_layers, c.head_dim), (8, 8, 16));
    let client = client_for(&c).unwrap();
    let report = train(&c, &client).unwrap();
    assert_eq!(report.losses.len(), 3);
    assert!(report.losses.iter().all(|l| l.is_finite()), "{:?}", report.losses);
}

/// `reuse_example_batch` (common/data_loader.py at MaxText e591f30): every step trains on the
/// first batch the process read. Reference: the same steps on a token file that holds that batch
/// once per step, read in order.
#[test]
fn reuse_example_batch_feeds_the_first_batch_at_every_step() {
    let dir = tempfile::tempdir().unwrap();
    let (len, rows_per_step, steps) = (16usize, 8usize, 3usize);
    let row = |r: usize| (0..=len).map(move |t| ((r * 37 + t * (r + 3)) % 500) as i32 + 1);
    let tokens = |path: &Path, rows: &mut dyn Iterator<Item = usize>| {
        let bytes: Vec<u8> = rows.flat_map(row).flat_map(i32::to_le_bytes).collect();
        std::fs::write(path, bytes).unwrap();
    };
    let (varied, repeated) = (dir.path().join("varied.bin"), dir.path().join("repeated.bin"));
    tokens(&varied, &mut (0..rows_per_step * steps));
    tokens(&repeated, &mut (0..steps).flat_map(|_| 0..rows_per_step));
    // The tests' tiniest decoder (the default model's vocabulary of 512 holds the ids): which
    // rows feed the steps does not depend on the model.
    let run = |path: &Path, reuse: &str| {
        let mut args: Vec<String> = [
            "dataset_type=tokens".to_string(),
            format!("dataset_path={}", path.display()),
            format!("max_target_length={len}"),
            format!("per_device_batch_size={rows_per_step}"),
            format!("steps={steps}"),
            "enable_data_shuffling=false".into(),
            format!("reuse_example_batch={reuse}"),
        ]
        .into();
        args.extend(crate::common::TINY_DECODER.iter().map(|s| s.to_string()));
        let c = config::load(None, &args).unwrap();
        train(&c, &client_for(&c).unwrap()).unwrap()
    };
    let reused = run(&varied, "1");
    let reference = run(&repeated, "0");
    assert_eq!(reused.losses, reference.losses);
    assert_ne!(run(&varied, "0").losses, reference.losses, "the file's later rows differ");
}

/// MaxText's gemma3-4b.yml and llama4 files as the config file: their vision tower's keys
/// (`vision_encoder_block`, `*_for_vit`, `image_placeholder`) build nothing without
/// `use_multimodal`, in MaxText as in maxrs, so each file gives the text model of
/// `model_name=<name>` (the llama4 files' `tokenizer_type` is a run key).
#[test]
fn maxtext_gemma3_file_with_its_vision_keys_loads_as_the_text_model() {
    for name in ["gemma3-4b", "llama4-17b-16e", "llama4-17b-128e"] {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/data/maxtext_models/{name}.yml"));
        let from_file = config::load_args(&args(&file, &[])).unwrap();
        let named = config::load(None, &[format!("model_name={name}")]).unwrap();
        let shape = |c: &config::Config| {
            (
                c.base_emb_dim,
                c.base_num_decoder_layers,
                c.vocab_size,
                c.rope_linear_scaling_factor,
                c.sliding_window_size,
            )
        };
        assert_eq!(shape(&from_file), shape(&named), "{name}");
        // (gemma3 scales its queries by a rule of model_name, which the file alone does not give.)
        if name.starts_with("llama4") {
            maxrs::model::Model::from_config(&from_file).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        let e = error(&file, &["use_multimodal=true"]);
        assert!(e.contains("`use_multimodal`") && e.contains("text only"), "{name}: {e}");
    }
}

/// MaxText's own base.yml (all its 696 keys) as the config file: MaxText's experimental TPU
/// recipes (`configs/experimental/32b.sh`) name it with their keys on the command line. Every key
/// maxrs lacks holds MaxText's default there, so it loads; its `dataset_type: tfds` is refused
/// only while nothing replaces it.
#[test]
fn maxtext_base_yml_loads_with_a_recipes_command_line() {
    let file = fixture("base.yml");
    let recipe = [
        "run_name=x",
        "steps=30",
        "per_device_batch_size=8",
        "enable_checkpointing=false",
        "remat_policy=minimal",
        "global_parameter_scale=32",
        "ici_fsdp_parallelism=-1",
        "ici_tensor_parallelism=4",
        "max_target_length=2048",
        "use_iota_embed=true",
        "reuse_example_batch=1",
        "dataset_type=synthetic",
        "attention=flash",
        "quantization=",
        // MaxText's recipe runs on TPUs; here, the CPU plugin.
        "hardware=cpu",
    ];
    let c = config::load_args(&args(&file, &recipe)).unwrap();
    config::check(&c).unwrap();
    assert_eq!((c.base_emb_dim, c.global_parameter_scale, c.reuse_example_batch), (2048, 32, 1));
    let e = config::check(&config::load_args(&args(&file, &["hardware=cpu"])).unwrap()).unwrap_err().to_string();
    assert!(e.starts_with("dataset_type: tfds is not supported yet"), "{e}");

    // It trains, its mesh_axes and rules naming MaxText's size-one axes (diloco,
    // context_usp_ulysses, context_autoregressive) included; a tiny model on one CPU device.
    let tiny = [
        "hardware=cpu",
        "dataset_type=synthetic",
        "enable_checkpointing=false",
        "base_emb_dim=64",
        "base_num_query_heads=4",
        "base_num_kv_heads=4",
        "base_mlp_dim=128",
        "base_num_decoder_layers=2",
        "head_dim=16",
        "vocab_size=256",
        "max_target_length=32",
        "per_device_batch_size=2",
        "steps=2",
    ];
    let c = config::load_args(&args(&file, &tiny)).unwrap();
    assert!(c.mesh_axes.iter().any(|a| a == "diloco"));
    let report = train(&c, &client_for(&c).unwrap()).unwrap();
    assert!(report.losses.len() == 2 && report.losses.iter().all(|l| l.is_finite()), "{:?}", report.losses);
}
