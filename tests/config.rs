//! Configuration as users drive it: loading with MaxText's precedence, error messages, mesh filling,
//! validation against device counts, and the start-up summary.

use std::path::{Path, PathBuf};

use maxrs::config::{self, Config, ConfigError, DType, DecoderBlock, RematPolicy};

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn load(list: &[&str]) -> Result<Config, ConfigError> {
    config::load(None, &args(list))
}

fn error(list: &[&str]) -> String {
    load(list).expect_err("expected an error").to_string()
}

fn invalid(list: &[&str], devices: usize, slices: usize) -> String {
    let c = load(list).expect("loads");
    config::validate(&c, devices, slices).expect_err("expected a validation error").to_string()
}

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// A scratch directory laid out like the repository.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("maxrs-config-{}-{name}", std::process::id()));
    std::fs::create_dir_all(dir.join("configs")).unwrap();
    std::fs::create_dir_all(dir.join("models")).unwrap();
    dir
}

#[test]
fn defaults_load_the_tiny_model() {
    let c = load(&[]).unwrap();
    assert_eq!(c.model_name, "default");
    assert_eq!((c.base_emb_dim, c.base_num_query_heads, c.base_num_kv_heads, c.head_dim), (256, 4, 2, 64));
    assert_eq!((c.base_mlp_dim, c.base_num_decoder_layers, c.vocab_size, c.max_target_length), (512, 2, 512, 128));
    // MaxText's defaults for what the model file leaves alone.
    assert_eq!((c.dtype, c.weight_dtype, c.remat_policy), (DType::Bfloat16, DType::Float32, RematPolicy::Full));
    assert_eq!((c.adam_b1, c.adam_b2, c.adam_eps, c.adam_weight_decay), (0.9, 0.95, 1e-8, 0.1));
    assert_eq!((c.warmup_steps_fraction, c.learning_rate_final_fraction), (0.1, 0.1));
    assert_eq!((c.ici_fsdp_parallelism, c.ici_data_parallelism, c.dcn_data_parallelism), (-1, 1, -1));
    assert_eq!((c.plugin.as_str(), c.cpu_device_count), ("cpu", 1));
    assert!(c.scan_layers && !c.enable_dropout && !c.enable_checkpointing);
    let d = config::validate(&c, 1, 1).unwrap();
    assert_eq!((d.global_batch_size, d.tokens_per_step), (8, 1024));
}

#[test]
fn the_config_file_on_disk_is_the_built_in_one() {
    let named = ["model_name=llama2-7b".to_string()];
    let from_disk = config::load(Some(&repo("configs/base.yml")), &named).unwrap();
    assert_eq!(from_disk, config::load(None, &named).unwrap());
    // Naming configs/base.yml sets every key, so models/default.yml (defaults below the user's
    // file) gives way to base.yml's model and full-size run settings: MaxText's default model.
    let default = config::load(Some(&repo("configs/base.yml")), &[]).unwrap();
    assert_eq!((default.steps, default.max_target_length, default.base_emb_dim), (150001, 2048, 2048));
    let via_args = config::load_args(&args(&[repo("configs/base.yml").to_str().unwrap(), "steps=7"])).unwrap();
    assert_eq!(via_args.steps, 7);
}

#[test]
fn a_users_config_file_beats_the_default_models_quick_start() {
    // The issue's case: these values used to vanish under models/default.yml's.
    let dir = scratch("quick");
    let path = dir.join("configs/my.yml");
    std::fs::write(&path, "steps: 3\nper_device_batch_size: 2\nmax_target_length: 64\nbase_emb_dim: 128\n").unwrap();
    let r = config::resolve(Some(&path), &args(&["learning_rate=0.01"])).unwrap();
    let c = &r.config;
    assert_eq!((c.steps, c.per_device_batch_size, c.max_target_length, c.base_emb_dim), (3, 2.0, 64, 128));
    assert_eq!(c.learning_rate, 0.01);
    assert_eq!(r.source("steps"), &config::Source::ConfigFile(path.clone()));
    assert_eq!(r.source("learning_rate"), &config::Source::CommandLine);
    assert_eq!(r.source("head_dim"), &config::Source::Model("built-in models/default.yml".into()));
    assert_eq!(r.source("adam_b1"), &config::Source::Default);
    // Without a file, the quick-start settings apply.
    assert_eq!((load(&[]).unwrap().steps, load(&[]).unwrap().per_device_batch_size), (100, 8.0));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_named_model_file_wins_over_the_config_files_model_keys_only() {
    // MaxText's rule (pyconfig.py at e591f30): merge(config file, model file, command line).
    let dir = scratch("named");
    let path = dir.join("configs/my.yml");
    std::fs::write(&path, "model_name: llama2-7b\nbase_emb_dim: 512\nsteps: 3\n").unwrap();
    let r = config::resolve(Some(&path), &[]).unwrap();
    assert_eq!((r.config.base_emb_dim, r.config.steps), (4096, 3));
    assert_eq!(r.source("base_emb_dim"), &config::Source::Model("built-in models/llama2-7b.yml".into()));
    // A model file sets model keys only.
    std::fs::write(dir.join("models/sneaky.yml"), "base_emb_dim: 64\nsteps: 5\n").unwrap();
    let e = config::load(Some(&path), &args(&["model_name=sneaky"])).unwrap_err().to_string();
    assert!(e.contains("`steps`") && e.contains("sneaky.yml") && e.contains("not a model key"), "{e}");
    // override_model_config lets the command line win.
    let c = config::load(Some(&path), &args(&["override_model_config=true", "base_emb_dim=1024"])).unwrap();
    assert_eq!(c.base_emb_dim, 1024);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn the_listing_shows_every_key_with_its_source() {
    let r = config::resolve(None, &args(&["steps=7"])).unwrap();
    let listing = r.listing();
    assert_eq!(listing.lines().count(), config::key_names().count());
    let steps = listing.lines().find(|l| l.starts_with("steps ")).unwrap();
    assert!(steps.contains("= 7") && steps.ends_with("(command line)"), "{steps}");
    let emb = listing.lines().find(|l| l.starts_with("base_emb_dim ")).unwrap();
    assert!(emb.ends_with("(built-in models/default.yml)"), "{emb}");
}

#[test]
fn model_selection_overrides_base() {
    let c = load(&["model_name=llama2-7b"]).unwrap();
    assert_eq!(c.base_emb_dim, 4096);
    assert_eq!(c.max_target_length, 2048, "base.yml's value where the model file is silent");
    assert_eq!(c.per_device_batch_size, 12.0);
}

#[test]
fn command_line_overrides_the_model() {
    let c = load(&["base_num_decoder_layers=4", "base_emb_dim=512", "steps=3"]).unwrap();
    assert_eq!((c.base_num_decoder_layers, c.base_emb_dim, c.steps), (4, 512, 3));
    let c = load(&["model_name=llama2-7b", "override_model_config=true", "base_num_decoder_layers=2"]).unwrap();
    assert_eq!((c.base_num_decoder_layers, c.base_emb_dim), (2, 4096));
    // Later arguments win.
    assert_eq!(load(&["steps=3", "steps=5"]).unwrap().steps, 5);
}

#[test]
fn changing_a_named_models_key_needs_override_model_config() {
    let e = error(&["model_name=llama2-7b", "base_num_decoder_layers=2"]);
    assert!(
        e.contains("`base_num_decoder_layers`") && e.contains("32") && e.contains("override_model_config=true"),
        "{e}"
    );
    // Restating the model's own value is not a change (MaxText compares values).
    assert!(load(&["model_name=llama2-7b", "base_emb_dim=4096"]).is_ok());
}

#[test]
fn llama2_7b_values() {
    let c = load(&["model_name=llama2-7b"]).unwrap();
    assert_eq!(
        (c.base_emb_dim, c.base_num_query_heads, c.base_num_kv_heads, c.base_mlp_dim, c.base_num_decoder_layers),
        (4096, 32, 32, 11008, 32)
    );
    assert_eq!(
        (c.vocab_size, c.head_dim, c.rope_max_timescale, c.normalization_layer_epsilon),
        (32000, 128, 10000, 1e-5)
    );
    assert_eq!(c.mlp_activations, ["silu", "linear"]);
    // Llama 2 7B's published parameter count.
    assert_eq!(maxrs::model::Model::from_config(&c).unwrap().num_params(), 6_738_415_616);
    // The model file's rule replaces base.yml's `norm` rule and goes last.
    let rules = config::axis_rules(&c);
    assert_eq!(rules.last().unwrap(), &("norm".to_string(), vec!["fsdp".to_string()]));
    assert_eq!(rules.iter().filter(|(name, _)| name == "norm").count(), 1);
}

#[test]
fn every_model_loads_and_validates() {
    for (name, _) in config::MODELS {
        let c = load(&[&format!("model_name={name}")]).unwrap();
        config::validate(&c, 8, 1).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    let c = load(&["model_name=llama2-70b"]).unwrap();
    assert_eq!(
        (c.base_emb_dim, c.base_num_query_heads, c.base_num_kv_heads, c.base_mlp_dim, c.base_num_decoder_layers),
        (8192, 64, 8, 28672, 80)
    );
    let c = load(&["model_name=llama3-8b"]).unwrap();
    assert_eq!((c.base_num_kv_heads, c.base_mlp_dim, c.vocab_size, c.rope_max_timescale), (8, 14336, 128256, 500000));
    let c = load(&["model_name=mixtral-8x7b"]).unwrap();
    assert_eq!((c.num_experts, c.num_experts_per_tok, c.base_num_kv_heads, c.base_mlp_dim), (8, 2, 8, 14336));
    assert_eq!(
        (c.decoder_block, c.rope_max_timescale, c.capacity_factor, c.sparse_matmul),
        (DecoderBlock::Mixtral, 1000000, -1.0, true)
    );
    let c = load(&["model_name=mixtral-8x22b"]).unwrap();
    assert_eq!(
        (c.base_emb_dim, c.base_num_query_heads, c.base_num_decoder_layers, c.vocab_size),
        (6144, 48, 56, 32768)
    );
}

/// The mixture-of-experts keys: experts need the Mixtral block, top-k fits in the experts, the
/// experts split over the expert axis, and dropping needs MaxText's dispatch path.
#[test]
fn moe_keys_are_checked() {
    let e = invalid(&["num_experts=8", "num_experts_per_tok=2"], 1, 1);
    assert!(e.contains("num_experts=8 needs a block with experts: decoder_block=mixtral"), "{e}");
    let e = invalid(&["decoder_block=mixtral", "num_experts=4", "num_experts_per_tok=5"], 1, 1);
    assert!(e.contains("num_experts_per_tok=5") && e.contains("num_experts=4"), "{e}");
    let e = invalid(&["model_name=mixtral-8x7b", "capacity_factor=1.25"], 1, 1);
    assert!(e.contains("capacity_factor=1.25 drops tokens only with sparse_matmul=false"), "{e}");
    let ok = load(&["model_name=mixtral-8x7b", "capacity_factor=1.25", "sparse_matmul=false"]).unwrap();
    config::validate(&ok, 8, 1).unwrap();
    let e = invalid(&["model_name=mixtral-8x7b", "ici_expert_parallelism=16", "ici_fsdp_parallelism=1"], 16, 1);
    assert!(e.contains("8 experts do not split over the 16 shards of the expert mesh axis"), "{e}");
    let e = invalid(&["model_name=mixtral-8x7b", "load_balance_loss_weight=-0.1"], 1, 1);
    assert!(e.contains("load_balance_loss_weight=-0.1"), "{e}");
}

#[test]
fn unknown_key_suggests_the_closest() {
    let e = error(&["per_device_batchsize=4"]);
    assert!(
        e.contains("unknown key `per_device_batchsize`") && e.contains("did you mean `per_device_batch_size`"),
        "{e}"
    );
    assert!(e.contains("on the command line"), "{e}");
    let e = error(&["frobnicate_kernels=flash"]);
    assert!(e.contains("unknown key `frobnicate_kernels`") && e.contains("configs/base.yml lists the keys"), "{e}");
    let e = error(&["ici_fdsp_parallelism=2"]);
    assert!(e.contains("`ici_fsdp_parallelism`"), "{e}");
}

#[test]
fn wrong_type_names_key_type_and_value() {
    let e = error(&["steps=ten"]);
    assert!(e.contains("`steps`") && e.contains("an integer") && e.contains("`ten`"), "{e}");
    let e = error(&["scan_layers=maybe"]);
    assert!(e.contains("`scan_layers`") && e.contains("boolean"), "{e}");
    let e = error(&["dtype=bf16"]);
    assert!(e.contains("bfloat16, float32, float16"), "{e}");
}

#[test]
fn malformed_argument_says_so() {
    let e = error(&["steps"]);
    assert!(e.contains("malformed argument `steps`") && e.contains("key=value"), "{e}");
    assert!(error(&["=3"]).contains("malformed"));
}

#[test]
fn maxtext_spellings_are_accepted() {
    let c = load(&["scan_layers=False", "learning_rate=3.e-4", "steps=1_000", "mlp_activations=['silu','linear']"])
        .unwrap();
    assert!(!c.scan_layers);
    assert_eq!((c.learning_rate, c.steps), (3e-4, 1000));
}

#[test]
fn unknown_model_lists_the_available_ones() {
    let e = error(&["model_name=llama2-7"]);
    assert!(e.contains("unknown model `llama2-7`") && e.contains("did you mean `llama2-7b`"), "{e}");
    assert!(e.contains("llama3-8b") && e.contains("default"), "{e}");
}

#[test]
fn files_on_disk_next_to_the_config_win_and_partial_files_keep_defaults() {
    let dir = scratch("disk");
    std::fs::write(dir.join("configs/mine.yml"), "steps: 10_000\nscan_layers: False\n").unwrap();
    std::fs::write(dir.join("models/custom.yml"), "base_emb_dim: 128\nlogical_axis_rules: [['embed', 'data']]\n")
        .unwrap();
    std::fs::write(dir.join("models/default.yml"), "base_emb_dim: 64\n").unwrap();
    let path = dir.join("configs/mine.yml");
    let c = config::load(Some(&path), &args(&["model_name=custom"])).unwrap();
    assert_eq!((c.steps, c.scan_layers, c.base_emb_dim, c.head_dim), (10_000, false, 128, 128));
    let embed: Vec<_> = config::axis_rules(&c).into_iter().filter(|(n, _)| n == "embed").collect();
    assert_eq!(embed, vec![("embed".to_string(), vec!["data".to_string()])]);
    // A model file on disk shadows the built-in one of the same name.
    assert_eq!(config::load(Some(&path), &[]).unwrap().base_emb_dim, 64);

    std::fs::write(dir.join("configs/bad.yml"), "stesp: 3\n").unwrap();
    let e = config::load(Some(&dir.join("configs/bad.yml")), &[]).unwrap_err().to_string();
    assert!(e.contains("`stesp`") && e.contains("bad.yml") && e.contains("`steps`"), "{e}");
    std::fs::write(dir.join("configs/broken.yml"), "steps: [1\n").unwrap();
    let e = config::load(Some(&dir.join("configs/broken.yml")), &[]).unwrap_err().to_string();
    assert!(e.contains("cannot use the YAML in") && e.contains("broken.yml"), "{e}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn mesh_fills_the_minus_one() {
    let c = load(&["ici_tensor_parallelism=2"]).unwrap();
    let d = config::validate(&c, 8, 1).unwrap();
    assert_eq!(d.mesh.size("fsdp"), 4);
    assert_eq!(d.mesh.size("tensor"), 2);
    assert_eq!(
        d.mesh.names(),
        [
            "data",
            "stage",
            "fsdp",
            "fsdp_transpose",
            "context",
            "context_usp_ulysses",
            "tensor",
            "tensor_sequence",
            "expert",
            "autoregressive"
        ]
    );
    assert_eq!(d.mesh.shape(), [1, 1, 4, 1, 1, 1, 2, 1, 1, 1]);
    assert_eq!(d.mesh.num_devices(), 8);
}

#[test]
fn the_issue_meshes_fit_the_default_model_on_8_devices() {
    for mesh in [
        &["ici_fsdp_parallelism=8"][..],
        &["ici_data_parallelism=2", "ici_fsdp_parallelism=2", "ici_tensor_parallelism=2"],
    ] {
        let mut list = mesh.to_vec();
        list.extend(["dtype=float32", "cpu_device_count=8"]);
        let d = config::validate(&load(&list).unwrap(), 8, 1).unwrap();
        assert_eq!((d.mesh.num_devices(), d.global_batch_size), (8, 64));
    }
}

#[test]
fn a_smaller_mesh_drops_axes_from_the_rules() {
    let c = load(&["mesh_axes=[data, fsdp, tensor]", "ici_tensor_parallelism=2"]).unwrap();
    let d = config::validate(&c, 8, 1).unwrap();
    assert_eq!((d.mesh.names(), d.mesh.shape()), (vec!["data", "fsdp", "tensor"], vec![1, 4, 2]));
    let rules = config::axis_rules(&c);
    let embed = rules.iter().find(|(n, _)| n == "embed").unwrap();
    assert_eq!(embed.1, ["fsdp"]);
    assert_eq!(d.batch_axes, ["data", "fsdp"]);
}

#[test]
fn mesh_spans_slices() {
    // MaxText's example: 16 devices in 2 slices, fsdp inside a slice, data across.
    let c = load(&["ici_fsdp_parallelism=8", "dcn_data_parallelism=2"]).unwrap();
    let d = config::validate(&c, 16, 2).unwrap();
    assert_eq!((d.mesh.size("data"), d.mesh.size("fsdp")), (2, 8));
    assert_eq!(d.mesh.ici_shape(), [1, 1, 8, 1, 1, 1, 1, 1, 1, 1]);
    assert_eq!(d.mesh.dcn_shape(), [2, 1, 1, 1, 1, 1, 1, 1, 1, 1]);
    assert_eq!(d.global_batch_size, 128);
}

#[test]
fn mesh_product_mismatch_is_an_error() {
    let e = invalid(&["ici_fsdp_parallelism=2", "ici_tensor_parallelism=2"], 8, 1);
    assert!(
        e.contains("ici_fsdp_parallelism=2 x ici_tensor_parallelism=2") && e.contains("8 devices per slice"),
        "{e}"
    );
    let e = invalid(&["ici_tensor_parallelism=3"], 8, 1);
    assert!(e.contains("ici_fsdp_parallelism=-1 cannot be filled") && e.contains("ici_tensor_parallelism=3"), "{e}");
    let e = invalid(&["ici_data_parallelism=-1"], 8, 1);
    assert!(e.contains("ici_data_parallelism, ici_fsdp_parallelism are all -1"), "{e}");
    let e = invalid(&["dcn_fsdp_parallelism=2"], 8, 1);
    assert!(e.contains("DCN") && e.contains("1 slice"), "{e}");
    let e = invalid(&["ici_tensor_parallelism=0"], 8, 1);
    assert!(e.contains("ici_tensor_parallelism=0"), "{e}");
    let e = invalid(&["ici_pipeline_parallelism=4"], 8, 1);
    assert!(e.contains("base_num_decoder_layers, ici_pipeline_parallelism, num_layers_per_pipeline_stage"), "{e}");
    let e = invalid(&["mesh_axes=[data, fsdp, tensr]"], 8, 1);
    assert!(e.contains("unknown mesh axis `tensr`") && e.contains("`tensor`"), "{e}");
    let e = invalid(&["mesh_axes=[data, fsdp]", "ici_tensor_parallelism=2"], 8, 1);
    assert!(e.contains("`tensor` is not in mesh_axes"), "{e}");
}

#[test]
fn heads_must_group() {
    let e = invalid(&["base_num_query_heads=4", "base_num_kv_heads=3"], 1, 1);
    assert!(e.contains("base_num_query_heads, base_num_kv_heads") && e.contains("one of 1, 2, 4"), "{e}");
    let e = invalid(&["head_dim=0"], 1, 1);
    assert!(e.contains("head_dim=0"), "{e}");
}

#[test]
fn batch_must_split_over_the_batch_axes() {
    // 8 devices, 2-way tensor parallel: the batch is split 4 ways (fsdp), but 8 x 0.25 = 2.
    let e = invalid(&["ici_tensor_parallelism=2", "per_device_batch_size=0.25"], 8, 1);
    assert!(e.contains("per_device_batch_size") && e.contains("= 2 sequences") && e.contains("multiple of 4"), "{e}");
    // Fractional per-device batches are fine when the batch still splits.
    let c = load(&["ici_tensor_parallelism=2", "per_device_batch_size=0.5"]).unwrap();
    assert_eq!(config::validate(&c, 8, 1).unwrap().global_batch_size, 4);
    let e = invalid(&["per_device_batch_size=0.1"], 8, 1);
    assert!(e.contains("= 0 sequences"), "{e}");
}

#[test]
fn other_inconsistencies_are_named() {
    assert!(invalid(&["steps=0"], 1, 1).contains("steps=0"));
    assert!(invalid(&["warmup_steps_fraction=1.5"], 1, 1)
        .contains("warmup_steps_fraction=1.5; it must be a number in [0, 1]"));
    assert!(invalid(&["dataset_type=tokens"], 1, 1).contains("dataset_path"));
    assert!(invalid(&["hardware=gpu"], 1, 1).contains("plugin=cuda12 or plugin=cuda13"));
    assert!(invalid(&["plugin=cuda"], 1, 1).contains("did you mean `cuda12`"));
    assert!(invalid(&["logical_axis_rules=[['embed', ['fsdpp']]]"], 1, 1).contains("`fsdpp`"));
    let c = load(&["hardware=gpu", "plugin=/opt/pjrt/xla_cuda_plugin.so"]).unwrap();
    assert!(config::validate(&c, 1, 1).is_ok());
}

#[test]
fn gradient_accumulation_multiplies_the_global_batch() {
    let c = load(&["gradient_accumulation_steps=4", "per_device_batch_size=2"]).unwrap();
    let d = config::validate(&c, 8, 1).unwrap();
    assert_eq!((d.micro_batch_size, d.global_batch_size, d.tokens_per_step), (16, 64, 64 * 128));
}

#[test]
fn summary_text() {
    let c = load(&["ici_tensor_parallelism=2", "steps=50"]).unwrap();
    let text = config::validate(&c, 8, 1).unwrap().to_string();
    let expected = "\
devices: 8 in 1 slice
mesh: [data, stage, fsdp, fsdp_transpose, context, context_usp_ulysses, tensor, tensor_sequence, expert, autoregressive] = [1, 1, 4, 1, 1, 1, 2, 1, 1, 1] (ici [1, 1, 4, 1, 1, 1, 2, 1, 1, 1], dcn [1, 1, 1, 1, 1, 1, 1, 1, 1, 1])
batch: int(8 devices x per_device_batch_size 8) = 64 x gradient_accumulation_steps 1 = global batch 64, split 4 ways over [data, fsdp, fsdp_transpose, expert]
tokens per step: 64 x 128 = 8192
steps: 50 (schedule 50, warmup 5)";
    assert_eq!(text, expected);
}

fn model(list: &[&str]) -> Result<maxrs::model::Model, String> {
    maxrs::model::Model::from_config(&load(list).expect("loads")).map_err(|e| e.to_string())
}

/// The family model files give the published parameter counts: Hugging Face's for Llama 3.1,
/// Mistral 7B and Gemma, plus MaxText's vocabulary padding for Gemma (256128 rows instead of
/// 256000: 128 x emb more); GPT-3's 175B and the JaxPP fork's 52k test model.
#[test]
fn family_model_files_give_the_published_sizes() {
    for (name, published) in [
        ("llama3.1-8b", 8_030_261_248u64),
        ("llama3.1-70b", 70_553_706_496),
        ("llama3.1-405b", 405_853_388_800),
        ("llama3-405b", 405_853_388_800),
        ("llama3.3-70b", 70_553_706_496),
        ("mistral-7b", 7_241_732_096),
        ("gemma-2b", 2_506_172_416 + 128 * 2048),
        ("gemma-7b", 8_537_680_896 + 128 * 3072),
        ("gemma2-2b", 2_614_341_888 + 128 * 2304),
        ("gemma2-9b", 9_241_705_984 + 128 * 3584),
        ("gemma2-27b", 27_227_128_320 + 128 * 4608),
    ] {
        assert_eq!(model(&[&format!("model_name={name}")]).unwrap().num_params(), published, "{name}");
    }
    let gpt3 = model(&["model_name=gpt3-175b"]).unwrap().num_params() as f64;
    assert!((gpt3 / 175e9 - 1.0).abs() < 0.005, "gpt3-175b: {gpt3}");
    assert!((52_000..53_000).contains(&model(&["model_name=gpt3-52k"]).unwrap().num_params()));
    let c = load(&["model_name=gemma2-2b"]).unwrap();
    assert_eq!(
        (c.base_num_decoder_layers, c.sliding_window_size, c.attn_logits_soft_cap, c.final_logits_soft_cap),
        (13, 4096, 50.0, 30.0)
    );
    assert!(c.use_post_attn_norm && c.use_post_ffw_norm && c.logits_via_embedding && c.normalize_embedding_logits);
    let c = load(&["model_name=gpt3-175b"]).unwrap();
    assert!(c.fused_qkv && !c.normalize_embedding_logits);
    assert_eq!((c.trainable_position_size, c.mlp_activations.as_slice()), (16384, &["gelu".to_string()][..]));
}

/// MaxText's default model scaled by `global_parameter_scale=16` (the seed's AOT example): emb x2,
/// heads and mlp x4, layers x2, head_dim unchanged; about 16B parameters.
#[test]
fn global_parameter_scale_scales_maxtexts_default_model() {
    let m = model(&["model_name=maxtext-default", "global_parameter_scale=16"]).unwrap();
    let c = &m.config;
    assert_eq!((c.emb, c.heads, c.kv_heads, c.mlp, c.layers, c.head_dim), (4096, 64, 64, 28672, 32, 128));
    assert!((m.num_params() as f64 / 16e9 - 1.0).abs() < 0.05, "{}", m.num_params());
    assert_eq!(model(&["model_name=maxtext-default"]).unwrap().config.emb, 2048);
    let e = invalid(&["global_parameter_scale=3"], 1, 1);
    assert!(e.contains("global_parameter_scale") && e.contains("power of two"), "{e}");
    for scale in ["0", "-2", "8192"] {
        let e = invalid(&[&format!("global_parameter_scale={scale}")], 1, 1);
        assert!(e.contains("global_parameter_scale") && e.contains("[1, 4096]"), "{e}");
    }
    // The scaled sizes keep the base_* ranges: 4096 = 2^12 doubles the layers 4 times.
    let e = invalid(&["global_parameter_scale=4096", "base_num_decoder_layers=4096"], 1, 1);
    assert!(e.contains("scales base_num_decoder_layers=4096 to 65536"), "{e}");
}

/// A key only some families read is refused, naming the families that use it, where MaxText would
/// silently ignore it; the families' own constraints are errors naming the key.
#[test]
fn family_keys_are_refused_where_they_do_nothing() {
    let e = model(&["sliding_window_size=64"]).unwrap_err();
    assert!(
        e.contains("sliding_window_size=64") && e.contains("decoder_block=llama2") && e.contains("mistral, gemma2"),
        "{e}"
    );
    // Mixtral's experts are SwiGLU only.
    let e =
        model(&["decoder_block=mixtral", "num_experts=4", "num_experts_per_tok=2", "mlp_activations=[gelu, linear]"])
            .unwrap_err();
    assert!(e.contains("mlp_activations") && e.contains("mixtral"), "{e}");
    let e = model(&["model_name=gemma-2b", "fused_qkv=true"]).unwrap_err();
    assert!(e.contains("fused_qkv=true") && e.contains("gpt3"), "{e}");
    for key in ["attn_logits_soft_cap=30.0", "use_post_attn_norm=true", "use_post_ffw_norm=true"] {
        assert!(model(&["model_name=mistral-7b", key]).unwrap_err().contains("gemma2"), "{key}");
    }
    // A soft cap on untied logits, Llama 3.1's scaling switch on the default RoPE. (No division
    // of untied logits, normalize_embedding_logits=false, is what they have: MaxText's qwen files
    // say so.)
    assert!(model(&["final_logits_soft_cap=30.0"]).unwrap_err().contains("logits_via_embedding"));
    model(&["normalize_embedding_logits=false"]).unwrap();
    assert!(model(&["rope_use_scale=false"]).unwrap_err().contains("rope_use_scale"));
    let e = model(&["model_name=gemma2-2b", "override_model_config=true", "sliding_window_size=0"]).unwrap_err();
    assert!(e.contains("sliding_window_size=0") && e.contains("positive"), "{e}");
    let e = model(&["model_name=gpt3-52k", "override_model_config=true", "base_num_kv_heads=1"]).unwrap_err();
    assert!(e.contains("base_num_kv_heads=1"), "{e}");
    assert!(model(&["model_name=gpt3-52k", "rope_type=llama3.1"]).unwrap_err().contains("no RoPE"));
    // Validation of the values themselves.
    assert!(invalid(&["rope_type=yarn"], 1, 1).contains("deepseek, olmo3 and gpt_oss only yet"));
    assert!(invalid(&["attention_type=mla"], 1, 1).contains("not supported yet"));
    assert!(invalid(&["decoder_block=deepseek"], 1, 1).contains("attention_type=mla"));
    assert!(invalid(&["mtp_num_layers=1"], 1, 1).contains("multi-token prediction is not supported yet"));
    assert!(invalid(&["mlp_activations=[swish, linear]"], 1, 1).contains("`swish` is not supported yet"));
    assert!(invalid(&["sliding_window_size=-1"], 1, 1).contains("sliding_window_size"));
    assert!(invalid(&["attn_logits_soft_cap=-1.0"], 1, 1).contains("attn_logits_soft_cap"));
    let e = invalid(&["trainable_position_size=64", "max_target_length=128"], 1, 1);
    assert!(e.contains("trainable_position_size") && e.contains("max_target_length=128"), "{e}");
    // A model named llama3.1-* gets Llama 3.1's RoPE without rope_type, as in MaxText.
    use maxrs::model::config::Rope;
    assert_eq!(model(&["model_name=llama3.1-8b"]).unwrap().config.rope, Rope::Llama31 { use_scale: true });
    assert_eq!(model(&["model_name=llama3-8b"]).unwrap().config.rope, Rope::Default);
}
