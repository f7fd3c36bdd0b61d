//! Decoding (`maxrs::inference`): the key/value cache is exact (greedy decoding equals the argmax
//! of a full forward pass over the growing sequence, token by token, for prompts of different
//! lengths in one batch, with grouped-query attention; the same on a sharded mesh with unrolled
//! layers and several tokens per call; sliding-window attention through the cache equals the
//! windowed mask over the whole sequence), EOS stops a sequence, and sampling follows the
//! distributions of MaxText's strategies and is reproducible from its seed.

use crate::common::llama_ref::{host_params, random_params};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use maxrs::checkpoint;
use maxrs::config::{self, Config, DecoderBlock, Derived};
use maxrs::data::tokenizer::TextTokenizer;
use maxrs::files::Location;
use maxrs::host::HostTensor;
use maxrs::inference::{Generation, ParamSource, Sampling, Session};
use maxrs::ir::{DType, Signature};
use maxrs::model::attention::{AttendOptions, KvCache, LayerCache, LayerContext};
use maxrs::model::{Model, ParamInit};
use maxrs::tensor::{random, trace, Tree};

/// Prompts of different lengths (the longest fills the prefill) and one idle batch row.
const PROMPTS: &[&[i32]] = &[&[5, 17, 300, 2, 9], &[1, 2, 3, 4, 5, 6, 7, 8], &[42]];
const PREFILL: i64 = 8;
const CACHE: i64 = 24;

fn load(extra: &[&str]) -> Config {
    let mut overrides: Vec<String> = vec![
        "dtype=float32".into(),
        "weight_dtype=float32".into(),
        format!("max_prefill_predict_length={PREFILL}"),
        format!("max_target_length={CACHE}"),
    ];
    overrides.extend(extra.iter().map(|s| s.to_string()));
    config::load(None, &overrides).expect("config loads")
}

/// The model's parameters, random, as host arrays by name (the same for every test): the Llama
/// reference's draw; for Gemma 3 and DeepSeek the init program's (seed 7: no training test runs
/// theirs); for the other families a host draw (seed 7) at each parameter's init scale
/// (`ParamDef::init`: uniform with the initializer's standard deviation, norm scales 1, biases 0),
/// as compiling their init programs, which the training tests run (`train_run`, `mixtral`), was a
/// third of a family's decode test.
fn params(c: &Config) -> Tree<HostTensor> {
    let model = Model::from_config(c).unwrap();
    // Multi-head latent attention has one key per query head.
    let mla = c.decoder_block == DecoderBlock::Deepseek;
    assert!(mla || model.config.kv_heads < model.config.heads, "the test must exercise grouped-query attention");
    if c.decoder_block == DecoderBlock::Llama2 {
        return host_params(&model, &random_params(&model, 7)).subtree("params");
    }
    if matches!(c.decoder_block, DecoderBlock::Gemma3 | DecoderBlock::Deepseek) {
        let init = trace(&Signature::new(None), |ctx, _| model.init_params(&random::key(ctx, 7))).unwrap();
        return crate::common::run(&init, &Tree::new());
    }
    let mut rng = crate::common::rng(7);
    model
        .param_defs()
        .into_iter()
        .map(|d| {
            let n = d.shape.iter().product::<i64>() as usize;
            let std = match d.init {
                ParamInit::Ones => return (d.name, HostTensor::from_f32(&d.shape, &vec![1.0; n])),
                // gpt-oss's biases and sinks start at zero; drawn (in [-0.5, 0.5]) so that
                // decoding exercises them.
                ParamInit::Zeros if c.decoder_block == DecoderBlock::GptOss => 0.5 / 3f64.sqrt(),
                ParamInit::Zeros => return (d.name, HostTensor::from_f32(&d.shape, &vec![0.0; n])),
                ParamInit::Normal(std) => std,
                ParamInit::FanIn(fan_in) | ParamInit::FanInNormal(fan_in) => (1.0 / fan_in as f64).sqrt(),
                ParamInit::HeUniform(fan_in) => (2.0 / fan_in as f64).sqrt(),
                ParamInit::FanInOver { fan_in, depth_scaling } => (1.0 / fan_in as f64).sqrt() / depth_scaling,
            };
            // Uniform on [-a, a] has standard deviation a / sqrt(3).
            let a = std * 3f64.sqrt();
            let values: Vec<f32> = crate::common::uniform(&mut rng, n, -a, a).into_iter().map(|x| x as f32).collect();
            (d.name, HostTensor::from_f32(&d.shape, &values))
        })
        .collect()
}

/// A decode session of `c` with the parameters `p` (drawn once by the caller, as the check
/// against the full forward pass reads them too: an init program is compiled once).
fn session(c: &Config, p: &Tree<HostTensor>, devices: usize, steps_per_call: i64) -> Session {
    let derived: Derived = config::validate(c, devices, 1).expect("valid config");
    let mesh = derived.mesh.step_mesh(&[(0..devices as i64).collect()]).unwrap();
    Session::new(c, &derived, mesh, &crate::common::client(), ParamSource::Host(p), steps_per_call)
        .expect("the decode programs compile")
}

fn prompts() -> Vec<Vec<i32>> {
    PROMPTS.iter().map(|p| p.to_vec()).collect()
}

/// For each prompt, every generated token is the argmax of the full model's logits at the
/// position before it, the model run once over the prompt and the generated tokens (causal
/// attention makes position t's logits those of the sequence cut after t).
fn check_against_full_forward(c: &Config, p: &Tree<HostTensor>, g: &Generation) {
    let model = Model::from_config(c).unwrap();
    let rows = PROMPTS.len() as i64;
    let mut sig = Signature::new(None);
    model.declare_params(&mut sig, "params");
    sig.input("inputs", DType::S32, &[rows, CACHE]);
    let forward = trace(&sig, |_, inp| {
        let batch = Tree::new().with("inputs", inp["inputs"].clone());
        Tree::new().with("next", model.forward(&inp.subtree("params"), &batch, false).logits.argmax(-1))
    })
    .unwrap();
    let mut tokens = vec![0i32; (rows * CACHE) as usize];
    for (r, (prompt, out)) in PROMPTS.iter().zip(&g.tokens).enumerate() {
        assert_eq!(out.len() as i64, 1 + CACHE - PREFILL, "prompt {r}: the first token and one per generate step");
        let sequence: Vec<i32> = prompt.iter().chain(&out[..out.len() - 1]).copied().collect();
        tokens[r * CACHE as usize..r * CACHE as usize + sequence.len()].copy_from_slice(&sequence);
    }
    let mut inputs = p.clone().prefixed("params");
    inputs.insert("inputs", HostTensor::from_i32(&[rows, CACHE], &tokens));
    let next = crate::common::run(&forward, &inputs)["next"].to_i32();
    for (r, (prompt, out)) in PROMPTS.iter().zip(&g.tokens).enumerate() {
        let row = &next[r * CACHE as usize..];
        let want: Vec<i32> = (0..out.len()).map(|k| row[prompt.len() - 1 + k]).collect();
        assert_eq!(out, &want, "prompt {r}: decoded tokens vs the full forward's argmax");
    }
}

/// Greedy decoding of [`PROMPTS`] on one device, one token per call, checked against the full
/// forward pass.
fn greedy_decoding_checked(c: &Config) {
    let p = params(c);
    let g = session(c, &p, 1, 1).generate(&prompts(), None).unwrap();
    check_against_full_forward(c, &p, &g);
}

/// Greedy decoding with the cache equals the full forward pass, for every prompt of the batch;
/// EOS ends a sequence after that token and leaves the others as they were.
#[test]
fn greedy_decoding_equals_the_full_forward_pass() {
    let c = load(&["per_device_batch_size=4"]);
    let p = params(&c);
    let s = session(&c, &p, 1, 1);
    let g = s.generate(&prompts(), None).unwrap();
    println!("{:?}", g.tokens);
    check_against_full_forward(&c, &p, &g);
    assert!(g.per_token_seconds().is_some() && g.tokens_per_second().unwrap() > 0.0);

    // EOS: a token prompt 0 makes mid-way (its first occurrence) ends each sequence after its
    // first occurrence of it; greedy decoding is deterministic, so the rest is unchanged.
    let eos = g.tokens[0][3];
    let stopped = s.generate(&prompts(), Some(eos)).unwrap();
    for (full, cut) in g.tokens.iter().zip(&stopped.tokens) {
        let end = full.iter().position(|&t| t == eos).map_or(full.len(), |i| i + 1);
        assert_eq!(cut, &full[..end], "EOS {eos} ends the sequence after it");
    }
}

/// With `attention=flash` (blockwise attention: the full forward in blocks of the cache length,
/// prefill in blocks of the prefill length) greedy decoding still equals the full forward pass.
#[test]
fn blockwise_attention_greedy_decoding_equals_the_full_forward_pass() {
    let c = load(&["attention=flash", "per_device_batch_size=4"]);
    greedy_decoding_checked(&c);
}

/// Mixtral (routed experts, dropless: each token's experts do not depend on the others) decodes
/// through the same cache: greedy decoding equals its full forward pass.
#[test]
fn mixtral_greedy_decoding_equals_the_full_forward_pass() {
    let c = load(&["decoder_block=mixtral", "num_experts=4", "num_experts_per_tok=2", "per_device_batch_size=4"]);
    greedy_decoding_checked(&c);
}

/// DeepSeek's multi-head latent attention (YaRN, values narrower than the keys) decodes with
/// MaxText's compressed cache (`mla_naive_kvcache=false`): each token's latent and RoPE key,
/// from which each generate step expands every cached position's keys and values; greedy
/// decoding equals the full forward pass. (The default cache, every head's keys and values, is
/// the other families' cache.)
#[test]
fn deepseek_latent_cache_greedy_decoding_equals_the_full_forward_pass() {
    let deepseek = [
        "decoder_block=deepseek",
        "attention_type=mla",
        "base_emb_dim=64",
        "base_num_kv_heads=4",
        "base_mlp_dim=96",
        "kv_lora_rank=16",
        "qk_nope_head_dim=8",
        "qk_rope_head_dim=8",
        "v_head_dim=6",
        "rope_type=yarn",
        "mla_naive_kvcache=false",
        "first_num_dense_layers=2",
        "per_device_batch_size=4",
    ];
    let c = load(&deepseek);
    greedy_decoding_checked(&c);
}

/// The other families decode through the same cache: Gemma 2 (local and global layers, two
/// attention calls per scanned pair, attention and final-logit soft caps, tied logits) and Gemma
/// (GeGLU, scaled embeddings, tied logits), Gemma 3, OLMo 3, gpt-oss, Llama 4 (chunked
/// attention through the cache), Gemma 4 (global layers' caches of their own head size) and Gemma
/// 4 small (per-layer inputs, layers attending over earlier layers' keys and values): greedy
/// decoding equals each full forward pass.
#[test]
fn gemma_families_greedy_decoding_equals_the_full_forward_pass() {
    let gemma2 = [
        "decoder_block=gemma2",
        "sliding_window_size=4",
        "attn_logits_soft_cap=50.0",
        "final_logits_soft_cap=30.0",
        "logits_via_embedding=true",
        "mlp_activations=[gelu, linear]",
        "per_device_batch_size=4",
    ];
    let gemma = [
        "decoder_block=gemma",
        "logits_via_embedding=true",
        "mlp_activations=[gelu, linear]",
        "per_device_batch_size=4",
    ];
    // Gemma 3: one block of 5 local layers (window 4) and a global one, then a remainder block of
    // 1 local layer (its own cache), QK norms, two RoPE bases.
    let gemma3 = [
        "model_name=gemma3-4b",
        "override_model_config=true",
        "base_num_decoder_layers=7",
        "base_emb_dim=64",
        "base_num_query_heads=4",
        "base_num_kv_heads=2",
        "vocab_size=512",
        "head_dim=16",
        "base_mlp_dim=128",
        "sliding_window_size=4",
        "local_rope_max_timescale=10000",
        "rope_max_timescale=1000000",
        "rope_linear_scaling_factor=8.0",
        "use_post_attn_norm=true",
        "use_post_ffw_norm=true",
        "logits_via_embedding=true",
        "mlp_activations=[gelu, linear]",
        "per_device_batch_size=4",
    ];
    // Unscanned too: Gemma 3's layers are then modules `layers_<n>`, not blocks.
    let gemma3_unscanned = [&gemma3[..], &["scan_layers=false"]].concat();
    // OLMo 3 (post-norms like Gemma's, sliding and global layers): one block of 3 sliding layers
    // (window 4) and a global one, whole-width QK-norms, YaRN RoPE with a ramp at head_dim 16.
    let olmo3 = [
        "model_name=olmo3-7b",
        "override_model_config=true",
        "base_num_decoder_layers=4",
        "base_emb_dim=64",
        "base_num_query_heads=4",
        "base_num_kv_heads=2",
        "vocab_size=512",
        "head_dim=16",
        "base_mlp_dim=128",
        "sliding_window_size=4",
        "original_max_position_embeddings=16",
        "rope_max_timescale=10000",
        "per_device_batch_size=4",
    ];
    // gpt-oss: one block of a sliding (window 4) and a global layer with attention sinks, biases,
    // YaRN (a ramp at head_dim 16) and 4 biased experts, 2 a token, clamped at 1.5.
    let gpt_oss = [
        "model_name=gpt-oss-20b",
        "override_model_config=true",
        "base_num_decoder_layers=2",
        "base_emb_dim=64",
        "base_num_query_heads=4",
        "base_num_kv_heads=2",
        "vocab_size=512",
        "head_dim=16",
        "base_mlp_dim=64",
        "base_moe_mlp_dim=64",
        "num_experts=4",
        "num_experts_per_tok=2",
        "mlp_activations_limit=1.5",
        "sliding_window_size=4",
        "original_max_position_embeddings=16",
        "rope_max_timescale=10000",
        "per_device_batch_size=4",
    ];
    // Llama 4: one block of a layer attending within chunks of 5 tokens (the prompts and the
    // generated tokens cross them) and a NoPE global one, QK L2 norms, temperature tuning, dense
    // and MoE layers in turn (4 experts, one a token, and the shared one): its files' block of 4
    // (3 chunked layers) shrunk to its two kinds of layer.
    let llama4 = [
        "model_name=llama4-17b-16e",
        "override_model_config=true",
        "base_num_decoder_layers=2",
        "inhomogeneous_layer_cycle_interval=2",
        "nope_layer_interval=2",
        "base_emb_dim=64",
        "base_num_query_heads=4",
        "base_num_kv_heads=2",
        "vocab_size=512",
        "head_dim=16",
        "base_mlp_dim=64",
        "base_moe_mlp_dim=64",
        "num_experts=4",
        "interleave_moe_layer_step=2",
        "chunk_attn_window_size=5",
        "per_device_batch_size=4",
    ];
    // Gemma 4: one scanned block of 5 local layers (window 4) and a global one with heads of 32,
    // one key/value head shared by keys and values (each call its own cache shape), partial RoPE,
    // value norms, layer scalars, and 4 experts (2 a token) beside the shared MLP.
    let gemma4 = [
        "model_name=gemma4-26b",
        "override_model_config=true",
        "base_num_decoder_layers=6",
        "base_emb_dim=64",
        "base_num_query_heads=4",
        "base_num_kv_heads=2",
        "global_num_kv_heads=1",
        "vocab_size=512",
        "head_dim=16",
        "global_head_dim=32",
        "base_mlp_dim=64",
        "base_moe_mlp_dim=32",
        "num_experts=4",
        "num_experts_per_tok=2",
        "sliding_window_size=4",
        "per_device_batch_size=4",
    ];
    // Gemma 4 small: 10 layers in periods of 5 (4 local, window 4, then a global one), the last 5
    // attending over layer 3's keys and values (the local ones) and layer 4's (the global 9),
    // each with its own cache of them, double-wide MLPs there, per-layer inputs 8 wide.
    let gemma4_small = [
        "model_name=gemma4-e2b",
        "override_model_config=true",
        "scan_layers=false",
        "base_num_decoder_layers=10",
        "num_kv_shared_layers=5",
        "base_emb_dim=32",
        "base_num_query_heads=4",
        "base_num_kv_heads=2",
        "vocab_size=512",
        "head_dim=8",
        "global_head_dim=16",
        "base_mlp_dim=32",
        "hidden_size_per_layer_input=8",
        "vocab_size_per_layer_input=512",
        "sliding_window_size=4",
        "per_device_batch_size=4",
    ];
    let families = [&gemma2[..], &gemma[..], &gemma3[..], &gemma3_unscanned[..], &olmo3[..], &gpt_oss[..], &llama4[..]];
    for extra in families.into_iter().chain([&gemma4[..], &gemma4_small[..]]) {
        let c = load(extra);
        greedy_decoding_checked(&c);
    }
}

/// The same on 4 devices (kv heads and the cache over `autoregressive`, the batch over `fsdp`),
/// with unrolled layers and four tokens per generate call.
#[test]
fn sharded_unrolled_multi_token_decoding_equals_the_full_forward_pass() {
    let c = load(&[
        "per_device_batch_size=1",
        "ici_fsdp_parallelism=2",
        "ici_autoregressive_parallelism=2",
        "scan_layers=false",
    ]);
    let p = params(&c);
    let s = session(&c, &p, 4, 4);
    let cache_spec = s.engine.cache_sharding().unwrap().to_string();
    assert!(cache_spec.contains("autoregressive"), "the cache's kv heads are split: {cache_spec}");
    let g = s.generate(&prompts(), None).unwrap();
    assert_eq!(g.call_seconds.len(), ((CACHE - PREFILL) / 4) as usize, "four steps per call");
    check_against_full_forward(&c, &p, &g);
}

/// Sliding-window attention through the cache (prefill of the first tokens, then one token per
/// step) equals windowed attention over the whole sequence, with grouped-query heads.
#[test]
fn sliding_window_attention_through_the_cache_equals_the_full_mask() {
    let c = load(&[]);
    let mc = Model::from_config(&c).unwrap().config;
    let (b, t, p, window) = (2i64, 10i64, 4i64, 3i64);
    let (h, kv, d) = (mc.heads, mc.kv_heads, mc.head_dim);
    let opts = AttendOptions::default();
    let mut sig = Signature::new(None);
    sig.input("q", DType::F32, &[b, t, h, d]);
    sig.input("k", DType::F32, &[b, t, kv, d]);
    sig.input("v", DType::F32, &[b, t, kv, d]);
    let program = trace(&sig, |ctx, inp| {
        let tokens = |n: i64| ctx.zeros(DType::S32, &[b, n]);
        let (q, k, v) = (&inp["q"], &inp["k"], &inp["v"]);
        let full = LayerContext::new(&mc, &Tree::new().with("inputs", tokens(t))).attend(q, k, v, Some(window), &opts);

        let prefill = LayerContext::new(&mc, &Tree::new().with("inputs", tokens(p)))
            .with_cache(LayerCache::Fill { len: t, filled: Vec::new() });
        let first = |x: &maxrs::tensor::Tensor| x.slice_axis(1, 0, p);
        let mut outputs = vec![prefill.attend(&first(q), &first(k), &first(v), Some(window), &opts)];
        let Some(LayerCache::Fill { filled, .. }) = prefill.into_cache() else { unreachable!() };
        let stacked = |x: &maxrs::tensor::Tensor| x.reshape(&[1, b, t, kv, d]);
        let mut cache = KvCache { key: stacked(&filled[0].key), value: stacked(&filled[0].value) };
        for pos in p..t {
            let batch = Tree::new()
                .with("inputs", tokens(1))
                .with("inputs_position", ctx.full(pos as f64, DType::S32, &[b, 1]));
            let step = LayerContext::new(&mc, &batch).with_cache(LayerCache::Update {
                layer: ctx.scalar(0.0, DType::S32),
                caches: vec![cache],
                used: 0,
            });
            let at = |x: &maxrs::tensor::Tensor| x.slice_axis(1, pos, pos + 1);
            outputs.push(step.attend(&at(q), &at(k), &at(v), Some(window), &opts));
            let Some(LayerCache::Update { mut caches, .. }) = step.into_cache() else { unreachable!() };
            cache = caches.remove(0);
        }
        let refs: Vec<&maxrs::tensor::Tensor> = outputs.iter().collect();
        Tree::new().with("full", full).with("cached", maxrs::tensor::concatenate(&refs, 1))
    })
    .unwrap();
    let mut rng = crate::common::rng(3);
    let mut inputs = Tree::new();
    for (name, heads) in [("q", h), ("k", kv), ("v", kv)] {
        let n = (b * t * heads * d) as usize;
        inputs.insert(
            name,
            HostTensor::from_f32(
                &[b, t, heads, d],
                &crate::common::uniform(&mut rng, n, -2.0, 2.0).iter().map(|&x| x as f32).collect::<Vec<_>>(),
            ),
        );
    }
    let out = crate::common::run(&program, &inputs);
    let err = crate::common::max_rel_diff(&out["full"].to_f64(), &out["cached"].to_f64());
    assert!(err < 1e-5, "cached vs full windowed attention: {err:e}");
}

/// The sampled token frequencies of each strategy match its distribution (computed here in f64
/// from MaxText's definitions) on a tiny vocabulary, and a seed gives the same samples again.
#[test]
fn sampling_matches_the_strategies_distributions() {
    const N: i64 = 20_000;
    let logits = [1.0, 2.5, 0.3, 2.0, -1.0, 1.5];
    let v = logits.len() as i64;
    let t = 0.8;
    let softmax = |l: &[f64], temperature: f64| -> Vec<f64> {
        let e: Vec<f64> = l.iter().map(|x| (x / temperature).exp()).collect();
        let z: f64 = e.iter().sum();
        e.iter().map(|x| x / z).collect()
    };
    // Tokens by decreasing logit: 1, 3, 5, 0, 2, 4. Untempered probabilities (for the nucleus):
    // 0.428, 0.259, 0.157, 0.095, 0.047, 0.013 -> cumulative 0.428, 0.687, 0.844, ...
    let keep = |kept: &[usize]| -> Vec<f64> {
        let masked: Vec<f64> =
            logits.iter().enumerate().map(|(i, &l)| if kept.contains(&i) { l } else { f64::NEG_INFINITY }).collect();
        softmax(&masked, t)
    };
    let cases = [
        (Sampling::Weighted { temperature: t }, softmax(&logits, t)),
        // p = 0.7: 0.428 and 0.687 are below it, so the nucleus is the first three tokens.
        (Sampling::Nucleus { p: 0.7, temperature: t }, keep(&[1, 3, 5])),
        (Sampling::TopK { k: 2, temperature: t }, keep(&[1, 3])),
        // Top 4, whose own softmax is 0.455, 0.276, 0.167, 0.102 -> cumulative 0.455, 0.731:
        // p = 0.5 keeps two.
        (Sampling::Composite { k: 4, p: 0.5, temperature: t }, keep(&[1, 3])),
        (Sampling::Greedy, keep(&[1])),
    ];
    for (sampling, want) in cases {
        let mut sig = Signature::new(None);
        sig.input("key", DType::U32, &[2]);
        let program = trace(&sig, |ctx, inp| {
            let rows = ctx.constant(DType::F32, &[1, v], &logits).broadcast_to(&[N, v]);
            Tree::new().with("tokens", sampling.sample(&rows, &inp["key"]))
        })
        .unwrap();
        let draw = |seed: u32| {
            crate::common::run(&program, &Tree::new().with("key", HostTensor::from_u32(&[2], &[0, seed])))["tokens"]
                .to_i32()
        };
        let tokens = draw(1234);
        let mut counts = vec![0usize; v as usize];
        tokens.iter().for_each(|&i| counts[i as usize] += 1);
        for (i, (&count, &p)) in counts.iter().zip(&want).enumerate() {
            let freq = count as f64 / N as f64;
            let sigma = (p * (1.0 - p) / N as f64).sqrt();
            assert!(
                (freq - p).abs() <= 4.5 * sigma + 1e-12,
                "{sampling:?}: token {i} drawn {freq:.4} of the time, expected {p:.4} (counts {counts:?})"
            );
        }
        assert_eq!(draw(1234), tokens, "{sampling:?}: the same key gives the same samples");
        if sampling != Sampling::Greedy {
            assert_ne!(draw(1235), tokens, "{sampling:?}: another key gives other samples");
        }
    }
}

fn maxrs(args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_maxrs")).args(args).output().expect("run maxrs");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// Writes `c`'s parameters into `dir` twice: as a safetensors file and as a checkpoint directory
/// of step 1, as `maxrs train` saves one (its writer, its model keys); returns both paths.
fn save_params(c: &Config, dir: &Path) -> (PathBuf, PathBuf) {
    let host: BTreeMap<String, HostTensor> = params(c).into_iter().collect();
    let file = dir.join("params.safetensors");
    maxrs::host::params_io::save_safetensors(&file, &host).unwrap();
    let step_dir = dir.join("checkpoints/1");
    let snapshot = checkpoint::Snapshot {
        step: Some(1),
        arrays: host.into_iter().map(|(name, t)| (format!("params.{name}"), t)).collect(),
        model: checkpoint::manifest::model_keys(c, &Model::from_config(c).unwrap()),
        data: None,
    };
    checkpoint::dir::save(&Location::Local(step_dir.clone()), &snapshot).unwrap();
    (file, step_dir)
}

/// The SentencePiece tokenizer (512 tokens, the default model's vocabulary) of the data tests.
fn tokenizer_path() -> String {
    format!("{}/tests/data/shakespeare-bpe512.model", env!("CARGO_MANIFEST_DIR"))
}

/// `maxrs decode` as a user runs it, twice with the same parameters and `decode_seed` (weighted
/// sampling): from a safetensors file with prompts written as token ids (the tokenizer's ids of
/// two texts, BOS first), and from a checkpoint directory with the texts and `tokenizer_path`.
/// Both print the outputs and the timings; the second's text is the tokenizer's decoding of the
/// first's ids up to EOS, so the parameters, the samples, the prompt encoding and the EOS stop
/// agree.
#[test]
fn cli_decodes_ids_from_a_file_and_text_from_a_checkpoint_alike() {
    let dir = tempfile::tempdir().unwrap();
    let (file, checkpoint) = save_params(&load(&[]), dir.path());
    let tokenizer = TextTokenizer::load(&tokenizer_path(), "sentencepiece", true, true).unwrap();
    let texts = ["To be or not", "I love to"];
    let ids: Vec<Vec<i32>> =
        texts.iter().map(|t| [vec![tokenizer.bos_id().unwrap()], tokenizer.encode_text(t).unwrap()].concat()).collect();
    let join = |ids: &[i32]| ids.iter().map(i32::to_string).collect::<Vec<_>>().join(" ");
    let run = |prompt: String, extra: &[String]| -> Vec<(String, String)> {
        let mut args = [
            "decode",
            "dtype=float32",
            "weight_dtype=float32",
            "per_device_batch_size=2",
            "max_prefill_predict_length=8",
            "max_target_length=16",
            "decode_sampling_strategy=weighted",
            "decode_seed=5",
        ]
        .map(String::from)
        .to_vec();
        args.push(prompt);
        args.extend_from_slice(extra);
        let (ok, stdout, stderr) = maxrs(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(ok, "{stdout}\n{stderr}");
        assert!(
            stdout.contains("prefill: ") && stdout.contains("per-token latency") && stdout.contains("tokens/s"),
            "{stdout}"
        );
        let outputs: Vec<(String, String)> = stdout
            .lines()
            .filter_map(|l| l.strip_prefix("Input `")?.strip_suffix('`')?.split_once("` -> `"))
            .map(|(i, o)| (i.to_string(), o.to_string()))
            .collect();
        assert_eq!(outputs.len(), 2, "{stdout}");
        outputs
    };
    let by_ids = run(
        format!("prompt=[{}]", ids.iter().map(|p| join(p)).collect::<Vec<_>>().join(", ")),
        &[format!("load_parameters_path={}", file.display())],
    );
    let by_text = run(
        format!("prompt=[{}]", texts.join(", ")),
        &[format!("load_parameters_path={}", checkpoint.display()), format!("tokenizer_path={}", tokenizer_path())],
    );
    let eos = tokenizer.eos_id().unwrap();
    for (row, ((input, generated), (text_in, text_out))) in by_ids.iter().zip(&by_text).enumerate() {
        assert_eq!(input, &join(&ids[row]));
        assert_eq!(text_in, texts[row]);
        let generated: Vec<i32> = generated.split(' ').map(|t| t.parse().unwrap()).collect();
        assert_eq!(generated.len(), 9, "the first token and 16 - 8 generate steps: {generated:?}");
        let until_eos = generated.iter().position(|&t| t == eos).map_or(&generated[..], |e| &generated[..=e]);
        assert_eq!(text_out, &tokenizer.decode(until_eos).unwrap(), "row {row}: {generated:?}");
    }
}

/// Bad input stops with one line that names the culprit.
#[test]
fn cli_bad_input_is_one_line_naming_the_culprit() {
    let dir = tempfile::tempdir().unwrap();
    let (other, other_checkpoint) = save_params(&load(&["base_num_decoder_layers=3", "base_emb_dim=128"]), dir.path());
    let other_arg = format!("load_parameters_path={}", other.display());
    let other_checkpoint_arg = format!("load_parameters_path={}", other_checkpoint.display());
    let tokenizer = format!("tokenizer_path={}", tokenizer_path());
    let cases: &[(&[&str], &str)] = &[
        (&["decode", "prompt="], "is empty: give at least one token"),
        (&["decode", "prompt=1 2 3 4 5", "max_prefill_predict_length=4"], "more than max_prefill_predict_length=4"),
        (&["decode", "prompt=I love to"], "`I` is not a token id in 0..512"),
        (&["decode", "prompt=[1, 2, 3]", "per_device_batch_size=2"], "3 prompts, but the decode batch"),
        (&["decode", "prompt=1", "max_prefill_predict_length=200"], "max_prefill_predict_length=200"),
        (&["decode", "prompt=1", "decode_sampling_strategy=topk"], "decode_sampling_top_k=0"),
        (
            &["decode", "prompt=1", "decode_sampling_strategy=weighted", "decode_sampling_temperature=0"],
            "must be positive",
        ),
        (&["decode", "prompt=1", "decode_sampling_strategy=beam"], "greedy, weighted, nucleus, topk, composite"),
        (&["decode", "prompt=1", &other_arg], "not this model's parameters"),
        (&["decode", "prompt=1", &other_checkpoint_arg], "base_emb_dim: checkpoint 128, this run 256"),
        (&["decode", "prompt=To be", &tokenizer, "vocab_size=256"], "the tokenizer has 512 tokens"),
        (
            &["decode", "prompt=To be or not to be", &tokenizer, "max_prefill_predict_length=4"],
            "more than max_prefill_predict_length=4",
        ),
    ];
    for (args, want) in cases {
        let (ok, stdout, stderr) = maxrs(args);
        assert!(!ok, "{args:?} must fail:\n{stdout}");
        let error: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error: ")).collect();
        assert_eq!(error.len(), 1, "{args:?}: one error line in\n{stderr}");
        assert!(error[0].contains(want) && !error[0].contains('\n'), "{args:?}: {}", error[0]);
        assert_eq!(
            stderr.lines().filter(|l| !l.starts_with(['W', 'I'])).count(),
            1,
            "{args:?}: only the error: {stderr}"
        );
    }
}
