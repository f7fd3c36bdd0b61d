//! `maxrs convert` with Hugging Face Llama checkpoints: a small random checkpoint in Hugging
//! Face's layout (config.json, two safetensors shards and their index, written here with the
//! `safetensors` crate) is converted to maxrs; maxrs's logits on it are checked against an
//! independent f64 implementation of Hugging Face's `LlamaForCausalLM` forward pass written
//! here (on the Hugging Face tensors: `[out, in]` linears, `rotate_half` RoPE, `repeat_kv`
//! grouped-query attention, scaling by `1/sqrt(head_dim)`); converting back gives the original
//! tensors bit for bit, in float32 and in bfloat16, sharded with an index (the query weights'
//! folded `1/sqrt(head_dim)` is 1/4 here, exact both ways).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use half::bf16;
use maxrs::checkpoint::dir;
use maxrs::config;
use maxrs::files::Location;
use maxrs::host::{DType, HostTensor};
use maxrs::ir::Signature;
use maxrs::model::Model;
use maxrs::tensor::{trace, Tree};
use ndarray::{Array2, Array3};
use safetensors::{serialize_to_file, Dtype, SafeTensors, View};

const MAXRS: &str = env!("CARGO_BIN_EXE_maxrs");
const E: usize = 64;
const H: usize = 4;
const K: usize = 2;
const D: usize = 16;
const M: usize = 96;
const L: usize = 2;
const V: usize = 128;
const T: usize = 12;
const EPS: f64 = 1e-5;
const THETA: f64 = 10000.0;

/// A random Hugging Face Llama checkpoint: name -> (shape, f32 values).
pub(crate) fn random_checkpoint(seed: u64) -> BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    let mut rng = crate::common::rng(seed);
    let mut t = BTreeMap::new();
    let mut put = |name: String, shape: Vec<usize>, lo: f64, hi: f64| {
        let n = shape.iter().product();
        t.insert(name, (shape, crate::common::uniform(&mut rng, n, lo, hi).into_iter().map(|x| x as f32).collect()));
    };
    put("model.embed_tokens.weight".into(), vec![V, E], -1.0, 1.0);
    for l in 0..L {
        let p = |s: &str| format!("model.layers.{l}.{s}");
        put(p("input_layernorm.weight"), vec![E], 0.8, 1.2);
        put(p("self_attn.q_proj.weight"), vec![H * D, E], -0.25, 0.25);
        put(p("self_attn.k_proj.weight"), vec![K * D, E], -0.25, 0.25);
        put(p("self_attn.v_proj.weight"), vec![K * D, E], -0.25, 0.25);
        put(p("self_attn.o_proj.weight"), vec![E, H * D], -0.25, 0.25);
        put(p("post_attention_layernorm.weight"), vec![E], 0.8, 1.2);
        put(p("mlp.gate_proj.weight"), vec![M, E], -0.25, 0.25);
        put(p("mlp.up_proj.weight"), vec![M, E], -0.25, 0.25);
        put(p("mlp.down_proj.weight"), vec![E, M], -0.2, 0.2);
    }
    put("model.norm.weight".into(), vec![E], 0.8, 1.2);
    put("lm_head.weight".into(), vec![V, E], -0.25, 0.25);
    t
}

pub(crate) struct Raw {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl View for &Raw {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        (&self.bytes[..]).into()
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

pub(crate) fn raw(shape: &[usize], values: &[f32], bf: bool) -> Raw {
    let bytes = if bf {
        values.iter().flat_map(|v| bf16::from_f32(*v).to_le_bytes()).collect()
    } else {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    };
    Raw { dtype: if bf { Dtype::BF16 } else { Dtype::F32 }, shape: shape.to_vec(), bytes }
}

/// A u8 tensor of `shape` holding `bytes` (gpt-oss's MXFP4 blocks and scales).
pub(crate) fn raw_u8(shape: &[usize], bytes: Vec<u8>) -> Raw {
    Raw { dtype: Dtype::U8, shape: shape.to_vec(), bytes }
}

/// Writes the checkpoint in Hugging Face's layout: two shards and an index.
pub(crate) fn write_hf(dir: &Path, t: &BTreeMap<String, (Vec<usize>, Vec<f32>)>, bf: bool) {
    std::fs::create_dir_all(dir).unwrap();
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": E,
        "num_attention_heads": H, "num_key_value_heads": K, "head_dim": D, "intermediate_size": M,
        "num_hidden_layers": L, "vocab_size": V, "rms_norm_eps": EPS, "rope_theta": THETA,
        "tie_word_embeddings": false, "hidden_act": "silu", "max_position_embeddings": 256,
        "torch_dtype": if bf { "bfloat16" } else { "float32" }, "rope_scaling": null,
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let raws: BTreeMap<&String, Raw> = t.iter().map(|(n, (s, v))| (n, raw(s, v, bf))).collect();
    let mut weight_map = serde_json::Map::new();
    let names: Vec<&&String> = raws.keys().collect();
    let half = names.len() / 2;
    for (i, part) in [&names[..half], &names[half..]].iter().enumerate() {
        let file = format!("model-{:05}-of-00002.safetensors", i + 1);
        let views: Vec<(&str, &Raw)> = part.iter().map(|n| (n.as_str(), &raws[**n])).collect();
        serialize_to_file(
            views,
            &Some(std::collections::HashMap::from([("format".into(), "pt".into())])),
            &dir.join(&file),
        )
        .unwrap();
        for n in part.iter() {
            weight_map.insert(n.to_string(), serde_json::Value::String(file.clone()));
        }
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
}

pub(crate) fn convert(args: &[&str]) -> String {
    let out = Command::new(MAXRS).arg("convert").args(args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "maxrs convert {args:?}: {text}");
    text
}

// ---------------------------------------------------------------------------------------------
// Hugging Face's LlamaForCausalLM, in f64 on the Hugging Face tensors.
// ---------------------------------------------------------------------------------------------

fn mat(t: &BTreeMap<String, (Vec<usize>, Vec<f32>)>, name: &str) -> Array2<f64> {
    let (shape, v) = &t[name];
    let (r, c) = if shape.len() == 1 { (1, shape[0]) } else { (shape[0], shape[1]) };
    Array2::from_shape_vec((r, c), v.iter().map(|&x| x as f64).collect()).unwrap()
}

/// `x * weight / sqrt(mean(x^2) + eps)` per row.
fn rms_norm(x: &Array2<f64>, w: &Array2<f64>) -> Array2<f64> {
    let mut y = x.clone();
    for mut row in y.rows_mut() {
        let inv = 1.0 / (row.iter().map(|v| v * v).sum::<f64>() / row.len() as f64 + EPS).sqrt();
        for (j, v) in row.iter_mut().enumerate() {
            *v *= inv * w[[0, j]];
        }
    }
    y
}

/// `x @ W^T` for a Hugging Face `[out, in]` weight.
fn linear(x: &Array2<f64>, w: &Array2<f64>) -> Array2<f64> {
    x.dot(&w.t())
}

/// HF's `apply_rotary_pos_emb`: `q * cos + rotate_half(q) * sin`, `cos = cat(freqs, freqs)`,
/// `rotate_half(x) = cat(-x2, x1)`, `inv_freq[i] = theta^(-2i/D)`. `x: [T, heads, D]`.
fn rope(x: &Array3<f64>) -> Array3<f64> {
    let mut y = x.clone();
    for t in 0..x.shape()[0] {
        for h in 0..x.shape()[1] {
            for i in 0..D {
                let f = t as f64 * THETA.powf(-2.0 * (i % (D / 2)) as f64 / D as f64);
                let rotated = if i < D / 2 { -x[[t, h, i + D / 2]] } else { x[[t, h, i - D / 2]] };
                y[[t, h, i]] = x[[t, h, i]] * f.cos() + rotated * f.sin();
            }
        }
    }
    y
}

fn hf_logits(t: &BTreeMap<String, (Vec<usize>, Vec<f32>)>, tokens: &[i32]) -> Array2<f64> {
    let embed = mat(t, "model.embed_tokens.weight");
    let mut x = Array2::from_shape_fn((T, E), |(i, j)| embed[[tokens[i] as usize, j]]);
    for l in 0..L {
        let w = |s: &str| mat(t, &format!("model.layers.{l}.{s}"));
        let h = rms_norm(&x, &w("input_layernorm.weight"));
        let q = rope(&linear(&h, &w("self_attn.q_proj.weight")).into_shape_with_order((T, H, D)).unwrap());
        let k = rope(&linear(&h, &w("self_attn.k_proj.weight")).into_shape_with_order((T, K, D)).unwrap());
        let v = linear(&h, &w("self_attn.v_proj.weight")).into_shape_with_order((T, K, D)).unwrap();
        let mut attn = Array2::<f64>::zeros((T, H * D));
        for head in 0..H {
            let kv = head / (H / K); // repeat_kv
            for i in 0..T {
                let scores: Vec<f64> = (0..=i)
                    .map(|j| (0..D).map(|d| q[[i, head, d]] * k[[j, kv, d]]).sum::<f64>() / (D as f64).sqrt())
                    .collect();
                let max = scores.iter().cloned().fold(f64::MIN, f64::max);
                let z: f64 = scores.iter().map(|s| (s - max).exp()).sum();
                for (j, s) in scores.iter().enumerate() {
                    let p = (s - max).exp() / z;
                    for d in 0..D {
                        attn[[i, head * D + d]] += p * v[[j, kv, d]];
                    }
                }
            }
        }
        x = &x + &linear(&attn, &w("self_attn.o_proj.weight"));
        let h = rms_norm(&x, &w("post_attention_layernorm.weight"));
        let gate = linear(&h, &w("mlp.gate_proj.weight")).mapv(|g| g / (1.0 + (-g).exp()));
        let up = linear(&h, &w("mlp.up_proj.weight"));
        x = &x + &linear(&(gate * up), &w("mlp.down_proj.weight"));
    }
    linear(&rms_norm(&x, &mat(t, "model.norm.weight")), &mat(t, "lm_head.weight"))
}

/// maxrs's logits (`[tokens, vocab]`, flat) with the converted parameters of the checkpoint
/// directory `dir`, in f32.
pub(crate) fn maxrs_logits(dir: &Path, tokens: &[i32], extra: &[&str]) -> Vec<f64> {
    let manifest = dir::read_manifest(&Location::Local(dir.to_path_buf())).unwrap();
    let mut args: Vec<String> = manifest
        .model
        .iter()
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => format!("{k}={s}"),
            other => format!("{k}={other}"),
        })
        .collect();
    // In f32, as transformers computes.
    args.extend(extra.iter().chain(&["dtype=float32", "weight_dtype=float32"]).map(|s| s.to_string()));
    let c = config::load(None, &args).unwrap();
    let model = Model::from_config(&c).unwrap();
    let loaded = dir::load(
        &Location::Local(dir.to_path_buf()),
        &model
            .param_defs()
            .into_iter()
            .map(|d| dir::Expected { name: format!("params.{}", d.name), ty: DType::F32, dims: d.shape })
            .collect::<Vec<_>>(),
        &maxrs::checkpoint::manifest::model_keys(&c, &model),
        true,
    )
    .unwrap();
    let mut sig = Signature::new(None);
    model.declare_params(&mut sig, "params");
    let t = tokens.len() as i64;
    sig.input("inputs", DType::S32, &[1, t]);
    let program = trace(&sig, |_, inp| {
        let batch = Tree::new().with("inputs", inp["inputs"].clone());
        Tree::new().with("logits", model.forward(&inp.subtree("params"), &batch, false).logits)
    })
    .unwrap();
    let mut inputs: Tree<HostTensor> = loaded.arrays.into_iter().collect();
    inputs.insert("inputs", HostTensor::from_i32(&[1, t], tokens));
    crate::common::run(&program, &inputs)["logits"].to_f64()
}

/// The tensors of a Hugging Face directory (all shards), as raw dtype + shape + bytes.
pub(crate) fn read_hf(dir: &Path) -> BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "safetensors") {
            let bytes = std::fs::read(&path).unwrap();
            let st = SafeTensors::deserialize(&bytes).unwrap();
            for (name, view) in st.tensors() {
                out.insert(name, (view.dtype(), view.shape().to_vec(), view.data().to_vec()));
            }
        }
    }
    out
}

#[test]
fn hf_checkpoint_gives_the_reference_logits_and_converts_back_exactly() {
    let d = tempfile::tempdir().unwrap();
    let t = random_checkpoint(31);
    let hf = d.path().join("hf");
    write_hf(&hf, &t, false);
    let tokens: Vec<i32> = (0..T).map(|i| ((i * 37 + 5) % V) as i32).collect();
    let want = hf_logits(&t, &tokens);
    let want: Vec<f64> = want.iter().copied().collect();

    for scan in ["true", "false"] {
        let ours = d.path().join(format!("maxrs-{scan}"));
        let text = convert(&["from-hf", hf.to_str().unwrap(), ours.to_str().unwrap(), &format!("scan_layers={scan}")]);
        assert!(text.contains("load_parameters_path="), "{text}");
        let got = maxrs_logits(&ours, &tokens, &[&format!("scan_layers={scan}")]);
        let err = crate::common::llama_ref::scaled_err(&got, &want);
        println!("scan_layers={scan}: logits scaled error vs the Hugging Face reference {err:e}");
        assert!(err < 1e-5, "scan_layers={scan}: logits differ from Hugging Face's: {err:e}");

        // Back to Hugging Face, in shards of at most 100 kB with an index: the same bytes.
        let back = d.path().join(format!("hf-back-{scan}"));
        convert(&["to-hf", ours.to_str().unwrap(), back.to_str().unwrap(), "--max-shard-size", "100KB"]);
        assert!(back.join("model.safetensors.index.json").exists());
        let original = read_hf(&hf);
        assert_eq!(read_hf(&back), original, "the round trip is exact (scan_layers={scan})");
        let config: serde_json::Value =
            serde_json::from_slice(&std::fs::read(back.join("config.json")).unwrap()).unwrap();
        for (key, value) in [("hidden_size", E), ("num_key_value_heads", K), ("intermediate_size", M), ("head_dim", D)]
        {
            assert_eq!(config[key].as_u64(), Some(value as u64), "{key}");
        }
        assert_eq!(config["rope_theta"].as_f64(), Some(THETA));
        assert_eq!(config["torch_dtype"], "float32");
    }

    // bfloat16: a bf16 checkpoint converts to bf16 maxrs weights and back, bit for bit.
    let hf_bf = d.path().join("hf-bf16");
    write_hf(&hf_bf, &t, true);
    let ours = d.path().join("maxrs-bf16");
    convert(&["from-hf", hf_bf.to_str().unwrap(), ours.to_str().unwrap()]);
    let manifest = dir::read_manifest(&Location::Local(ours.clone())).unwrap();
    assert_eq!(manifest.model["weight_dtype"], "bfloat16");
    let back = d.path().join("hf-bf16-back");
    convert(&["to-hf", ours.to_str().unwrap(), back.to_str().unwrap()]);
    assert!(back.join("model.safetensors").exists(), "one file under the default 5GB shard size");
    assert_eq!(read_hf(&back), read_hf(&hf_bf));
    // And f32 -> bf16 on the way out rounds each weight to nearest even.
    let down = d.path().join("hf-down");
    convert(&["to-hf", d.path().join("maxrs-true").to_str().unwrap(), down.to_str().unwrap(), "--dtype", "bfloat16"]);
    let got = read_hf(&down);
    let (dtype, _, bytes) = &got["model.norm.weight"];
    assert_eq!(*dtype, Dtype::BF16);
    let want_bytes: Vec<u8> = t["model.norm.weight"].1.iter().flat_map(|v| bf16::from_f32(*v).to_le_bytes()).collect();
    assert_eq!(bytes, &want_bytes);
}

#[test]
fn unsupported_hf_configs_are_refused_naming_the_key() {
    let d = tempfile::tempdir().unwrap();
    let t = random_checkpoint(32);
    let hf = d.path().join("hf");
    write_hf(&hf, &t, false);
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(hf.join("config.json")).unwrap()).unwrap();
    config["rope_scaling"] = serde_json::json!({"rope_type": "llama3", "factor": 8.0});
    std::fs::write(hf.join("config.json"), config.to_string()).unwrap();
    let out = Command::new(MAXRS)
        .args(["convert", "from-hf", hf.to_str().unwrap(), d.path().join("x").to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("rope_scaling") && err.contains("not supported yet"), "{err}");
    // A tensor of the wrong shape is named.
    config["rope_scaling"] = serde_json::Value::Null;
    config["intermediate_size"] = serde_json::json!(80);
    std::fs::write(hf.join("config.json"), config.to_string()).unwrap();
    let out = Command::new(MAXRS)
        .args(["convert", "from-hf", hf.to_str().unwrap(), d.path().join("y").to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("mlp.gate_proj.weight"), "{err}");
    // A family with no Hugging Face layout here, and tied logits Hugging Face's Llama cannot
    // express, are refused before any file is read.
    for (model, want) in [
        (
            &["model_name=gpt3-52k"][..],
            "decoder_block=gpt3: converting gpt3 to Hugging Face's layout is not supported yet",
        ),
        (
            &["logits_via_embedding=true"][..],
            "normalize_embedding_logits=true: Hugging Face's llama2 tied logits are not",
        ),
    ] {
        let out = Command::new(MAXRS)
            .args(["convert", "to-hf", "params.safetensors", d.path().join("z").to_str().unwrap()])
            .args(model)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(want), "{err}");
    }
}
