//! `maxrs convert` for every family against Hugging Face's own modeling code: for Llama, Llama 3.1
//! (`rope_scaling` llama3), Mistral (sliding window), Mixtral, Qwen3, Qwen3 MoE, Gemma, Gemma 2,
//! Gemma 3 (a block of 6 layers and a remainder block), Gemma 4 (dense and with experts), Gemma 4
//! small (per-layer inputs, shared key/value layers),
//! DeepSeek-V3 (multi-head latent
//! attention, YaRN; dense, then routed layers), OLMo 3 and gpt-oss (sinks, biased experts), a tiny
//! checkpoint in Hugging Face's layout, converted to maxrs, gives the logits and greedy tokens
//! `transformers` computed on it (recorded in `tests/data/hf_golden.json` by
//! `tools/hf_golden.py`, which states the command and versions), and converts back to the same
//! tensors. The weights come from the generator the script uses (an LCG per tensor seeded by the
//! FNV-1a hash of its name), so the golden file holds no weights.

use std::collections::BTreeMap;
use std::path::Path;

use safetensors::serialize_to_file;
use serde_json::Value;

use maxrs::checkpoint::dir;

use crate::convert_hf::{convert, maxrs_logits, raw, raw_u8, read_hf, Raw};

/// The golden file's prompt length: the greedy tokens follow it.
const PROMPT: usize = 8;

fn golden() -> &'static Value {
    static GOLDEN: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    GOLDEN.get_or_init(|| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/hf_golden.json");
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    })
}

/// A golden case's token sequence.
fn golden_sequence(case: &Value) -> Vec<i32> {
    case["sequence"].as_array().unwrap().iter().map(|t| t.as_i64().unwrap() as i32).collect()
}

/// A golden case's logits (transformers'), flattened row by row.
fn golden_logits(case: &Value) -> Vec<f64> {
    let rows = case["logits"].as_array().unwrap().iter();
    rows.flat_map(|row| row.as_array().unwrap()).map(|x| x.as_f64().unwrap()).collect()
}

/// `n` values in [-1, 1), as `tools/hf_golden.py`'s `uniform`.
fn uniform(name: &str, n: usize) -> Vec<f64> {
    let mut x: u64 = 0xCBF2_9CE4_8422_2325;
    for b in name.bytes() {
        x = (x ^ b as u64).wrapping_mul(0x0100_0000_01B3);
    }
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (x >> 40) as f64 / (1u64 << 23) as f64 - 1.0
        })
        .collect()
}

/// A tensor's values, as `tools/hf_golden.py`'s `values` (embeddings rounded to bfloat16, so
/// that the rounding of MaxText's tied logits changes nothing and transformers' logits are its).
fn values(name: &str, n: usize, plus_one_norms: bool) -> Vec<f32> {
    let u = uniform(name, n);
    let f = |v: f64| -> f64 {
        if name.ends_with("norm.weight") {
            if plus_one_norms {
                0.2 * v
            } else {
                1.0 + 0.2 * v
            }
        } else if ["layer_scalar", "router.scale", "per_expert_scale"].iter().any(|s| name.ends_with(s)) {
            1.0 + 0.2 * v
        } else if name.contains("embed_tokens") {
            half::bf16::from_f32(v as f32).to_f64()
        } else {
            0.25 * v
        }
    };
    u.into_iter().map(|v| f(v) as f32).collect()
}

/// Writes the family's golden checkpoint (config.json, one f32 model.safetensors) to `dir`.
fn write_checkpoint(dir: &Path, case: &Value) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), case["config"].to_string()).unwrap();
    let model_type = case["config"]["model_type"].as_str().unwrap();
    let plus_one = model_type.starts_with("gemma") && !model_type.starts_with("gemma4");
    let raws: BTreeMap<String, Raw> = case["tensors"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, shape)| {
            let shape: Vec<usize> = shape.as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
            let n = shape.iter().product();
            (name.clone(), raw(&shape, &values(name, n, plus_one), false))
        })
        .collect();
    let views: Vec<(&str, &Raw)> = raws.iter().map(|(n, r)| (n.as_str(), r)).collect();
    let metadata = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    serialize_to_file(views, &Some(metadata), &dir.join("model.safetensors")).unwrap();
}

/// A converted checkpoint: its directory (in `_dir`) and the model keys of the `maxrs train`
/// command `from-hf` printed for it.
struct Converted {
    _dir: tempfile::TempDir,
    ours: std::path::PathBuf,
    printed: Vec<String>,
}

/// The words of a shell line quoted as maxrs prints it (single quotes, none inside).
fn shell_words(line: &str) -> Vec<String> {
    let (mut words, mut word, mut quoted) = (Vec::new(), None::<String>, false);
    for ch in line.chars() {
        match ch {
            '\'' => {
                quoted = !quoted;
                word.get_or_insert_with(String::new);
            }
            ' ' if !quoted => words.extend(word.take()),
            _ => word.get_or_insert_with(String::new).push(ch),
        }
    }
    words.extend(word);
    words
}

/// Converts the family's golden checkpoint, checks maxrs's logits (under the keys of the printed
/// `maxrs train` command) and greedy tokens against `transformers`', and converts back (`exact`:
/// bit for bit; otherwise within f32 rounding of the value maps).
fn check_family(family: &str, exact: bool) -> Converted {
    let case = &golden()["families"][family];
    let d = tempfile::tempdir().unwrap();
    let hf = d.path().join("hf");
    write_checkpoint(&hf, case);
    let ours = d.path().join("maxrs");
    let text = convert(&["from-hf", hf.to_str().unwrap(), ours.to_str().unwrap()]);
    let line = text.lines().map(str::trim).find(|l| l.starts_with("maxrs train ")).expect("a printed command");
    let words = shell_words(line);
    assert_eq!(words[2], format!("load_parameters_path={}", ours.display()), "{family}: {line}");
    let printed = words[3..].to_vec();

    let (sequence, want) = (golden_sequence(case), golden_logits(case));
    let got = maxrs_logits(&ours, &sequence, &printed.iter().map(String::as_str).collect::<Vec<_>>());
    let err = crate::common::llama_ref::scaled_err(&got, &want);
    println!("{family}: logits scaled error vs transformers {err:e}");
    assert!(err < 2e-5, "{family}: logits differ from transformers': scaled error {err:e}");
    // Greedy decoding: each generated token is the argmax of maxrs's logits one position earlier.
    let vocab = want.len() / sequence.len();
    for pos in PROMPT - 1..sequence.len() - 1 {
        let row = &got[pos * vocab..(pos + 1) * vocab];
        let best = (0..vocab).max_by(|&a, &b| row[a].total_cmp(&row[b])).unwrap();
        assert_eq!(best as i32, sequence[pos + 1], "{family}: greedy token after position {pos}");
    }

    let back = d.path().join("hf-back");
    convert(&["to-hf", ours.to_str().unwrap(), back.to_str().unwrap()]);
    let (original, returned) = (read_hf(&hf), read_hf(&back));
    assert_eq!(returned.keys().collect::<Vec<_>>(), original.keys().collect::<Vec<_>>(), "{family}");
    for (name, (dtype, shape, bytes)) in &original {
        let (got_dtype, got_shape, got_bytes) = &returned[name];
        assert_eq!((got_dtype, got_shape), (dtype, shape), "{family}: {name}");
        if exact {
            assert_eq!(got_bytes, bytes, "{family}: {name} converts back bit for bit");
            continue;
        }
        // The query scaling (query_pre_attn_scalar 24, head_dim 16) is folded into Gemma 2's query
        // weights and into Gemma 3's query norm gain `1 + w`; the checkpoint written back says
        // query_pre_attn_scalar = head_dim.
        let scale = (16.0f64 / 24.0).sqrt();
        let fold = |x: f64| match family {
            "gemma2" if name.contains("q_proj") => x * scale,
            "gemma3" if name.contains("q_norm") => (1.0 + x) * scale - 1.0,
            _ => x,
        };
        let f = |b: &[u8]| b.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64).collect::<Vec<_>>();
        let want: Vec<f64> = f(bytes).into_iter().map(fold).collect();
        let diff = crate::common::max_rel_diff(&f(got_bytes), &want);
        assert!(diff < 1e-6, "{family}: {name} converts back within f32 rounding: {diff:e}");
    }
    let config: Value = serde_json::from_slice(&std::fs::read(back.join("config.json")).unwrap()).unwrap();
    for field in ["model_type", "hidden_size", "num_hidden_layers", "num_key_value_heads", "head_dim", "rope_scaling"] {
        assert_eq!(config[field], case["config"][field], "{family}: config.json's {field}");
    }
    Converted { _dir: d, ours, printed }
}

#[test]
fn llama_matches_transformers() {
    check_family("llama", true);
}

#[test]
fn llama31_rope_scaling_matches_transformers() {
    check_family("llama3.1", true);
}

#[test]
fn mistral_sliding_window_matches_transformers() {
    check_family("mistral", true);
}

#[test]
fn mixtral_matches_transformers() {
    check_family("mixtral", true);
}

#[test]
fn gemma_matches_transformers() {
    check_family("gemma", false);
}

#[test]
fn gemma2_matches_transformers() {
    check_family("gemma2", false);
}

/// Gemma 3 with 8 layers: a block of 6 and the `layers_remainder` block of 2.
#[test]
fn gemma3_with_a_remainder_block_matches_transformers() {
    check_family("gemma3", false);
}

/// Gemma 3 27B's query scaling: a `query_pre_attn_scalar` equal to `hidden_size //
/// num_attention_heads` (64 // 4 = 16) and not to `head_dim` (here 8) converts under gemma3-27b,
/// whose rule computes that scalar (`get_query_pre_attn_scalar`, `src/maxtext/models/gemma3.py:52-59`
/// at MaxText e591f30), with nothing folded into the query norm. Its logits equal those of the
/// same checkpoint converted under gemma3-4b (`head_dim^-1/2`, the difference folded into the
/// query norm's gain: the path the golden test checks against transformers), and `to-hf` writes
/// the query norm back unfolded, with the scalar 16.
#[test]
fn gemma3_27b_query_scaling_converts_under_its_name_unfolded() {
    let mut case = golden()["families"]["gemma3"].clone();
    let (emb, heads, kv, head_dim) = (64, 4, 2, 8);
    let config = case["config"].as_object_mut().unwrap();
    assert_eq!((config["hidden_size"].as_u64(), config["num_attention_heads"].as_u64()), (Some(emb), Some(heads)));
    config.insert("head_dim".into(), head_dim.into());
    config.insert("num_key_value_heads".into(), kv.into());
    config.insert("query_pre_attn_scalar".into(), (emb / heads).into());
    for (name, shape) in case["tensors"].as_object_mut().unwrap() {
        let new = match name.rsplit('.').nth(1) {
            Some("q_proj") => Some(serde_json::json!([heads * head_dim, emb])),
            Some("k_proj" | "v_proj") => Some(serde_json::json!([kv * head_dim, emb])),
            Some("o_proj") => Some(serde_json::json!([emb, heads * head_dim])),
            Some("q_norm" | "k_norm") => Some(serde_json::json!([head_dim])),
            _ => None,
        };
        if let Some(new) = new {
            *shape = new;
        }
    }
    let d = tempfile::tempdir().unwrap();
    let at = |name: &str| d.path().join(name);
    write_checkpoint(&at("hf"), &case);
    let model_args = |text: &str| {
        let line = text.lines().map(str::trim).find(|l| l.starts_with("maxrs train ")).expect("a printed command");
        shell_words(line)[3..].to_vec()
    };
    let hf = at("hf").to_str().unwrap().to_string();
    let big = model_args(&convert(&["from-hf", &hf, at("27b").to_str().unwrap()]));
    assert_eq!(big[..2], ["model_name=gemma3-27b", "override_model_config=true"], "{big:?}");
    let folded = model_args(&convert(&["from-hf", &hf, at("4b").to_str().unwrap(), "model_name=gemma3-4b"]));
    assert_eq!(folded[..2], ["model_name=gemma3-4b", "override_model_config=true"], "{folded:?}");

    let sequence = golden_sequence(&case);
    let logits = |dir: &str| maxrs_logits(&at(dir), &sequence, &[]);
    let err = crate::common::llama_ref::scaled_err(&logits("27b"), &logits("4b"));
    println!("gemma3 27b-named vs folded logits: scaled error {err:e}");
    assert!(err < 1e-5, "gemma3-27b's logits differ from the folded conversion's: scaled error {err:e}");

    convert(&["to-hf", at("27b").to_str().unwrap(), at("back").to_str().unwrap()]);
    let (original, returned) = (read_hf(&at("hf")), read_hf(&at("back")));
    // Unfolded, the query norm comes back within f32 rounding of `1 + w - 1`; folded, it would be
    // `(1 + w) sqrt(8 / 16) - 1`.
    let f = |b: &[u8]| b.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64).collect::<Vec<_>>();
    for layer in 0..8 {
        let q_norm = format!("model.layers.{layer}.self_attn.q_norm.weight");
        let diff = crate::common::max_rel_diff(&f(&returned[&q_norm].2), &f(&original[&q_norm].2));
        assert!(diff < 1e-6, "{q_norm}: gemma3-27b stores the query norm unfolded: {diff:e}");
    }
    let config: Value = serde_json::from_slice(&std::fs::read(at("back").join("config.json")).unwrap()).unwrap();
    assert_eq!(config["query_pre_attn_scalar"], 16);
}

/// Unscanned, Gemma 3's parameters are one module per layer, `decoder.layers_<n>` for Hugging Face
/// layer `n` (the remainder's too: `layers/decoders.py:1205,1246` at MaxText e591f30): the
/// logits are transformers', and `to-hf` writes back byte for byte what it writes from the
/// scanned conversion.
#[test]
fn gemma3_unscanned_converts_per_layer() {
    let case = &golden()["families"]["gemma3"];
    let d = tempfile::tempdir().unwrap();
    let at = |name: &str| d.path().join(name);
    write_checkpoint(&at("hf"), case);
    for scan in ["true", "false"] {
        let (ours, back) = (at(&format!("maxrs-{scan}")), at(&format!("hf-{scan}")));
        let arg = format!("scan_layers={scan}");
        convert(&["from-hf", at("hf").to_str().unwrap(), ours.to_str().unwrap(), &arg]);
        convert(&["to-hf", ours.to_str().unwrap(), back.to_str().unwrap()]);
    }
    assert_eq!(read_hf(&at("hf-false")), read_hf(&at("hf-true")));
    let manifest = dir::read_manifest(&maxrs::files::Location::Local(at("maxrs-false"))).unwrap();
    let names: Vec<&str> = manifest.arrays.iter().map(|a| a.name.as_str()).collect();
    for layer in ["layers_0", "layers_5", "layers_6", "layers_7"] {
        assert!(names.contains(&format!("params.decoder.{layer}.mlp.wo.kernel").as_str()), "{names:?}");
    }
    assert!(!names.iter().any(|n| n.contains("remainder") || n.contains(".layers.")), "{names:?}");

    let (sequence, want) = (golden_sequence(case), golden_logits(case));
    let got = maxrs_logits(&at("maxrs-false"), &sequence, &["scan_layers=false"]);
    let err = crate::common::llama_ref::scaled_err(&got, &want);
    assert!(err < 2e-5, "gemma3 unscanned: logits differ from transformers': scaled error {err:e}");
}

/// Gemma 4 with one block of 5 sliding layers and a full one with its own head size, keys shared
/// with values, partial RoPE, the logits soft-capped.
#[test]
fn gemma4_matches_transformers() {
    check_family("gemma4", true);
}

/// Gemma 4 small (gemma4-e2b's pattern: 4 sliding layers, then a full one with its own values),
/// 10 layers, the last 4 reusing earlier layers' keys and values with double-wide MLPs,
/// per-layer inputs: converted unscanned (`decoder_block=gemma4_small`) and back bit for bit.
#[test]
fn gemma4_small_matches_transformers() {
    let converted = check_family("gemma4_small", true);
    for key in ["decoder_block=gemma4_small", "model_name=gemma4-e2b", "scan_layers=false"] {
        assert!(converted.printed.iter().any(|k| k == key), "{key} in {:?}", converted.printed);
    }
}

/// Gemma 4 with experts (4, 2 a token) beside the shared MLP, whose fused `gate_up_proj` and
/// `down_proj` split into each expert's kernels; unscanned (every layer its own module
/// `decoder.layers_<n>`) it converts back to the same tensors too.
#[test]
fn gemma4_moe_matches_transformers_scanned_and_unscanned() {
    let converted = check_family("gemma4_moe", true);
    let hf = converted._dir.path().join("hf");
    let (ours, back) = (converted._dir.path().join("unscanned"), converted._dir.path().join("unscanned-back"));
    convert(&["from-hf", hf.to_str().unwrap(), ours.to_str().unwrap(), "scan_layers=false"]);
    convert(&["to-hf", ours.to_str().unwrap(), back.to_str().unwrap()]);
    assert_eq!(read_hf(&back), read_hf(&hf));
    let manifest = dir::read_manifest(&maxrs::files::Location::Local(ours)).unwrap();
    let names: Vec<&str> = manifest.arrays.iter().map(|a| a.name.as_str()).collect();
    assert!(names.contains(&"params.decoder.layers_5.mlp.moe_block.MoeBlock_0.wi_0"), "{names:?}");
}

/// A `Gemma4ForConditionalGeneration` checkpoint (`model_type: gemma4`, the text model's fields in
/// `text_config`, its weights under `model.language_model.`, a vision tower beside them): the
/// language model converts, the vision tensors are skipped by name, and `to-hf` writes the text
/// model (`Gemma4ForCausalLM`'s names) with the same bytes.
#[test]
fn gemma4_multimodal_checkpoint_converts_its_language_model() {
    let text = &golden()["families"]["gemma4"];
    let mut tensors: serde_json::Map<String, Value> = text["tensors"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, shape)| (name.replacen("model.", "model.language_model.", 1), shape.clone()))
        .collect();
    for name in
        ["model.vision_tower.patch_embedder.input_proj.weight", "model.embed_vision.embedding_projection.weight"]
    {
        tensors.insert(name.into(), serde_json::json!([4, 4]));
    }
    let config = serde_json::json!({
        "model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"],
        "text_config": text["config"], "vision_config": {"model_type": "gemma4_vision"},
    });
    let case = serde_json::json!({"config": config, "tensors": tensors});
    let d = tempfile::tempdir().unwrap();
    let at = |name: &str| d.path().join(name);
    write_checkpoint(&at("hf"), &case);
    convert(&["from-hf", at("hf").to_str().unwrap(), at("maxrs").to_str().unwrap()]);
    convert(&["to-hf", at("maxrs").to_str().unwrap(), at("back").to_str().unwrap()]);
    let want: BTreeMap<_, _> = read_hf(&at("hf"))
        .into_iter()
        .filter_map(|(name, t)| Some((name.strip_prefix("model.language_model.")?.to_string(), t)))
        .map(|(rest, t)| (format!("model.{rest}"), t))
        .collect();
    assert_eq!(read_hf(&at("back")), want);
}

/// OLMo 3 with 8 layers (2 blocks of 3 sliding + 1 full layer): post-norms, whole-width QK-norm.
#[test]
fn olmo3_matches_transformers() {
    check_family("olmo3", true);
}

/// gpt-oss with 4 layers (2 blocks of a sliding and a full layer): attention sinks, biases on
/// every projection, YaRN without truncation, 4 biased experts (2 a token) whose interleaved
/// gate/up columns split into `wi_0` and `wi_1`, and a clamp of 1.0.
#[test]
fn gpt_oss_matches_transformers() {
    check_family("gpt_oss", true);
}

/// Llama 4's text model with 4 layers (one scanned block: 3 within chunks of 4 tokens with Llama
/// 3.1's scaled RoPE and the QK L2 norm, then a NoPE layer attending fully), dense and MoE
/// layers in turn (4 experts whose side-by-side gate/up halves split into `wi_0` and `wi_1`, one
/// a token scaled by its logit's sigmoid, and the shared one); unscanned, per layer.
#[test]
fn llama4_matches_transformers_scanned_and_unscanned() {
    let converted = check_family("llama4", true);
    let hf = converted._dir.path().join("hf");
    let (ours, back) = (converted._dir.path().join("unscanned"), converted._dir.path().join("unscanned-back"));
    convert(&["from-hf", hf.to_str().unwrap(), ours.to_str().unwrap(), "scan_layers=false"]);
    convert(&["to-hf", ours.to_str().unwrap(), back.to_str().unwrap()]);
    assert_eq!(read_hf(&back), read_hf(&hf));
    let case = &golden()["families"]["llama4"];
    let keys: Vec<&str> = converted.printed.iter().map(String::as_str).chain(["scan_layers=false"]).collect();
    let got = maxrs_logits(&ours, &golden_sequence(case), &keys);
    let err = crate::common::llama_ref::scaled_err(&got, &golden_logits(case));
    assert!(err < 2e-5, "llama4 unscanned: logits differ from transformers': scaled error {err:e}");
}

/// OpenAI's gpt-oss checkpoints store the experts' kernels as MXFP4: `<name>_blocks` (u8
/// `[experts, out, in / 32, 16]`, two 4-bit E2M1 codes a byte, the low nibble first) and
/// `<name>_scales` (u8 `[experts, out, in / 32]`, exponents biased by 127), as transformers'
/// `integrations/mxfp4.py` (5.23.0) reads them. The golden checkpoint with random MXFP4 experts
/// converts to what its twin with those values written out in f32 (`code value x
/// 2^(scale - 127)` at `[expert, in, out]`) converts to.
#[test]
fn gpt_oss_mxfp4_experts_dequantize_on_import() {
    const FP4: [f32; 16] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];
    let case = &golden()["families"]["gpt_oss"];
    let d = tempfile::tempdir().unwrap();
    let at = |name: &str| d.path().join(name);
    let (mut packed, mut twin): (BTreeMap<String, Raw>, BTreeMap<String, Raw>) = Default::default();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut byte = |range: u8| {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((state >> 33) % range as u64) as u8
    };
    for (name, shape) in case["tensors"].as_object().unwrap() {
        let shape: Vec<usize> = shape.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
        let n = shape.iter().product();
        if !name.ends_with("gate_up_proj") && !name.ends_with("down_proj") {
            packed.insert(name.clone(), raw(&shape, &values(name, n, false), false));
            twin.insert(name.clone(), raw(&shape, &values(name, n, false), false));
            continue;
        }
        let (experts, inputs, outputs) = (shape[0], shape[1], shape[2]);
        let groups = inputs / 32;
        let blocks: Vec<u8> = (0..experts * outputs * groups * 16).map(|_| byte(255)).collect();
        let scales: Vec<u8> = (0..experts * outputs * groups).map(|_| 122 + byte(8)).collect();
        let mut dense = vec![0f32; n];
        for x in 0..experts {
            for o in 0..outputs {
                for i in 0..inputs {
                    let group = (x * outputs + o) * groups + i / 32;
                    let b = blocks[group * 16 + (i % 32) / 2];
                    let code = if i % 2 == 0 { b & 0x0f } else { b >> 4 };
                    let value = FP4[code as usize] * 2f32.powi(scales[group] as i32 - 127);
                    dense[(x * inputs + i) * outputs + o] = value;
                }
            }
        }
        packed.insert(format!("{name}_blocks"), raw_u8(&[experts, outputs, groups, 16], blocks));
        packed.insert(format!("{name}_scales"), raw_u8(&[experts, outputs, groups], scales));
        twin.insert(name.clone(), raw(&shape, &dense, false));
    }
    for (dir, tensors) in [("packed", &packed), ("twin", &twin)] {
        std::fs::create_dir_all(at(dir)).unwrap();
        std::fs::write(at(dir).join("config.json"), case["config"].to_string()).unwrap();
        let views: Vec<(&str, &Raw)> = tensors.iter().map(|(n, r)| (n.as_str(), r)).collect();
        serialize_to_file(views, &None, &at(dir).join("model.safetensors")).unwrap();
        let ours = at(&format!("{dir}-maxrs"));
        convert(&["from-hf", at(dir).to_str().unwrap(), ours.to_str().unwrap()]);
        convert(&["to-hf", ours.to_str().unwrap(), at(&format!("{dir}-back")).to_str().unwrap()]);
    }
    let (from_packed, from_twin) = (read_hf(&at("packed-back")), read_hf(&at("twin-back")));
    assert!(from_packed.contains_key("model.layers.3.mlp.experts.gate_up_proj"));
    assert_eq!(from_packed, from_twin, "the MXFP4 experts convert to their values");
}

#[test]
fn qwen3_qk_norm_tied_matches_transformers() {
    check_family("qwen3", true);
}

#[test]
fn qwen3_moe_matches_transformers() {
    check_family("qwen3_moe", true);
}

#[test]
fn deepseek_v3_latent_attention_matches_transformers() {
    check_family("deepseek_v3", true);
}

/// Hugging Face's DeepSeek-V3 router weighs the chosen experts by their unbiased scores, which
/// MaxText does only for a model_name starting with deepseek3 (`get_topk`, `layers/moe.py` at
/// MaxText e591f30): the printed command names one (the logits above ran under it). The
/// checkpoint then does not fit a model named to route otherwise (MaxText's kimi-k2-1t), which
/// `to-hf` refuses by name too.
#[test]
fn deepseek_v3_routed_layers_match_transformers() {
    let converted = check_family("deepseek_v3_moe", true);
    assert_eq!(converted.printed[..2], ["model_name=deepseek3-test", "override_model_config=true"]);
    let kimi: Vec<String> = converted
        .printed
        .iter()
        .map(|a| if a.starts_with("model_name=") { "model_name=kimi-k2-1t".into() } else { a.clone() })
        .collect();
    let c = maxrs::config::load(None, &kimi).unwrap();
    let model = maxrs::model::Model::from_config(&c).unwrap();
    let expected: Vec<dir::Expected> = model
        .param_defs()
        .into_iter()
        .map(|d| dir::Expected { name: format!("params.{}", d.name), ty: maxrs::host::DType::F32, dims: d.shape })
        .collect();
    let location = maxrs::files::Location::Local(converted.ours.clone());
    let err = dir::load(&location, &expected, &maxrs::checkpoint::manifest::model_keys(&c, &model), true)
        .err()
        .expect("a checkpoint routed as DeepSeek-V3 does not fit kimi-k2-1t")
        .to_string();
    assert!(
        err.contains(
            "model_name: checkpoint \"deepseek3-test\", this run \"kimi-k2-1t\"; the checkpoint's name gives \
             DeepSeek-V3's routing, the experts weighed by their unbiased scores (a name starting with deepseek3 or \
             deepseek4), this run's the experts weighed by their biased scores"
        ),
        "{err}"
    );
    let back = converted.ours.with_file_name("hf-kimi");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_maxrs"))
        .args(["convert", "to-hf", converted.ours.to_str().unwrap(), back.to_str().unwrap(), "model_name=kimi-k2-1t"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && text.contains("model_name=kimi-k2-1t: MaxText weighs this model's experts by their biased scores"),
        "{text}"
    );
}

fn peft_golden() -> &'static Value {
    static GOLDEN: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    GOLDEN.get_or_init(|| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/peft_golden.json");
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    })
}

/// The golden PEFT adapter of a family's checkpoint, as `tools/peft_golden.py` makes it: on each
/// linear weight whose last name is a target, `lora_A: [r, in]` and `lora_B: [out, r]` drawn by
/// the generator under their PEFT names. Returns the tensors' values by name.
fn write_adapter(dir: &Path, case: &Value) -> BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    let peft = peft_golden();
    let rank = peft["rank"].as_u64().unwrap() as usize;
    let targets: Vec<&str> = peft["targets"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    let mut tensors = BTreeMap::new();
    for (name, shape) in case["tensors"].as_object().unwrap() {
        let module = name.strip_suffix(".weight").unwrap();
        if !targets.contains(&module.rsplit('.').next().unwrap()) {
            continue;
        }
        let shape: Vec<usize> = shape.as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
        for (part, dims) in [("lora_A", vec![rank, shape[1]]), ("lora_B", vec![shape[0], rank])] {
            let key = format!("base_model.model.{module}.{part}.weight");
            let v = values(&key, dims.iter().product(), false);
            tensors.insert(key, (dims, v));
        }
    }
    std::fs::create_dir_all(dir).unwrap();
    let raws: BTreeMap<&String, Raw> = tensors.iter().map(|(n, (s, v))| (n, raw(s, v, false))).collect();
    let views: Vec<(&str, &Raw)> = raws.iter().map(|(n, r)| (n.as_str(), r)).collect();
    let metadata = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    serialize_to_file(views, &Some(metadata), &dir.join("adapter_model.safetensors")).unwrap();
    let config = serde_json::json!({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank,
        "lora_alpha": peft["alpha"], "target_modules": peft["targets"], "lora_dropout": 0.0, "bias": "none",
        "fan_in_fan_out": false, "use_rslora": false, "use_dora": false, "base_model_name_or_path": null});
    std::fs::write(dir.join("adapter_config.json"), config.to_string()).unwrap();
    tensors
}

/// A PEFT LoRA adapter (rank 4, alpha 8, every attention and MLP projection) of the Llama 3.1
/// checkpoint (query and key rows reordered on conversion) and of the Gemma 2 one (query scaling
/// folded into the query weights): `convert from-hf ... hf_lora_adapter_path=` gives the logits
/// `peft` computes over `transformers` (tests/data/peft_golden.json, tools/peft_golden.py), which
/// the adapter changes; `to-hf` writes the adapter back (bit for bit where no scale is folded,
/// within f32 rounding where one is), and `to-hf --merge-lora` the weights `W + B @ A * alpha / r`.
#[test]
fn peft_adapters_match_peft_and_convert_back() {
    let peft = peft_golden();
    let scale = peft["alpha"].as_f64().unwrap() / peft["rank"].as_f64().unwrap();
    for family in ["llama3.1", "gemma2"] {
        let case = &golden()["families"][family];
        let d = tempfile::tempdir().unwrap();
        let (hf, adapter, ours) = (d.path().join("hf"), d.path().join("adapter"), d.path().join("maxrs"));
        write_checkpoint(&hf, case);
        let original = write_adapter(&adapter, case);
        let with = format!("hf_lora_adapter_path={}", adapter.display());
        // Activations in f32 (transformers' and peft's), where the plain conversions keep the
        // checkpoint's bfloat16 `dtype`: XLA's CPU computes a bfloat16 model's products in f32
        // (excess precision), but rounds the adapted projections' sums, which maxrs casts back.
        let text = convert(&["from-hf", hf.to_str().unwrap(), ours.to_str().unwrap(), &with, "dtype=float32"]);
        let line = text.lines().map(str::trim).find(|l| l.starts_with("maxrs train ")).expect("a printed command");
        assert!(line.contains("lora.enable_lora=true") && line.contains("lora.lora_rank=4"), "{line}");
        let printed = shell_words(line)[3..].to_vec();

        let sequence = golden_sequence(case);
        let got = maxrs_logits(&ours, &sequence, &printed.iter().map(String::as_str).collect::<Vec<_>>());
        let want = golden_logits(&peft["families"][family]);
        let err = crate::common::llama_ref::scaled_err(&got, &want);
        println!("{family}: logits with the adapter, scaled error vs peft {err:e}");
        assert!(err < 2e-5, "{family}: logits differ from peft's: {err:e}");
        let moved = crate::common::llama_ref::scaled_err(&golden_logits(case), &want);
        assert!(moved > 1e-2, "{family}: the adapter changes nothing: {moved:e}");

        // The adapter back in PEFT's format.
        let back = d.path().join("adapter-back");
        convert(&["to-hf", ours.to_str().unwrap(), back.to_str().unwrap()]);
        let config: Value = serde_json::from_slice(&std::fs::read(back.join("adapter_config.json")).unwrap()).unwrap();
        assert_eq!((config["r"].as_u64(), config["lora_alpha"].as_f64()), (Some(4), peft["alpha"].as_f64()));
        let mut targets: Vec<&str> =
            config["target_modules"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
        targets.sort();
        let mut want_targets: Vec<&str> =
            peft["targets"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
        want_targets.sort();
        assert_eq!(targets, want_targets, "{family}");
        let returned = read_hf(&back);
        assert_eq!(returned.len(), original.len(), "{family}");
        let f32s = |b: &[u8]| b.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect::<Vec<_>>();
        for (name, (shape, values)) in &original {
            let (_, got_shape, bytes) = &returned[name];
            assert_eq!(got_shape, shape, "{family}: {name}");
            let got = f32s(bytes);
            if family == "gemma2" && name.contains("q_proj.lora_B") {
                // The query scaling folded in, as into the query weights `to-hf` writes (whose
                // config.json then says query_pre_attn_scalar = head_dim).
                let folded: Vec<f64> = values.iter().map(|&x| x as f64 * (16.0f64 / 24.0).sqrt()).collect();
                let diff = crate::common::max_rel_diff(&got.iter().map(|&x| x as f64).collect::<Vec<_>>(), &folded);
                assert!(diff < 1e-6, "{family}: {name} within f32 rounding of the folded scale: {diff:e}");
            } else {
                assert_eq!(&got, values, "{family}: {name} converts back bit for bit");
            }
        }

        // The merged model: each adapted weight is W + B @ A * scale (Gemma 2's query weights with
        // the query scaling folded, as `to-hf` writes them), every other tensor the original.
        let merged = d.path().join("merged");
        convert(&["to-hf", "--merge-lora", ours.to_str().unwrap(), merged.to_str().unwrap()]);
        let merged = read_hf(&merged);
        let base = read_hf(&hf);
        assert_eq!(merged.keys().collect::<Vec<_>>(), base.keys().collect::<Vec<_>>(), "{family}");
        let fold =
            |name: &str| if family == "gemma2" && name.contains("q_proj") { (16.0f64 / 24.0).sqrt() } else { 1.0 };
        for (name, (_, shape, bytes)) in &base {
            let module = name.strip_suffix(".weight").unwrap();
            let a = original.get(&format!("base_model.model.{module}.lora_A.weight"));
            let w: Vec<f64> = f32s(bytes).into_iter().map(|x| x as f64).collect();
            let got: Vec<f64> = f32s(&merged[name].2).into_iter().map(|x| x as f64).collect();
            let Some((a_shape, a)) = a else {
                let want: Vec<f64> = w.iter().map(|x| x * fold(name)).collect();
                let diff = crate::common::max_rel_diff(&got, &want);
                assert!(diff < 1e-6, "{family}: {name} is not adapted and converts back: {diff:e}");
                continue;
            };
            let (_, b) = &original[&format!("base_model.model.{module}.lora_B.weight")];
            let (rows, cols, r) = (shape[0], shape[1], a_shape[0]);
            let want: Vec<f64> = (0..rows * cols)
                .map(|ij| {
                    let (i, j) = (ij / cols, ij % cols);
                    let delta: f64 = (0..r).map(|k| b[i * r + k] as f64 * a[k * cols + j] as f64).sum();
                    (w[ij] + scale * delta) * fold(name)
                })
                .collect();
            let diff = crate::common::max_rel_diff(&got, &want);
            assert!(diff < 1e-6, "{family}: {name} merged: {diff:e}");
        }
    }
}
