//! Logits parity of maxrs's Gemma 3 with Hugging Face's `Gemma3ForCausalLM` (transformers, CPU
//! torch, f32) on a tiny random checkpoint: `tests/data/gemma3_hf/` holds the checkpoint in
//! Hugging Face's names and the logits transformers computed (`golden.json` records the command,
//! `tools/gemma3_hf_golden.py`, and the versions). The tensors are mapped with
//! `maxrs::model::gemma3_hf`'s table (names, transposes, Gemma's folded `1 + w` norms and
//! `sqrt(emb)` embedding), then maxrs's forward pass must give the same logits (scaled error
//! under 1e-5) and the same greedy tokens. The checkpoint has 6 layers (5 sliding-window layers,
//! window 4, and one global layer with linear RoPE scaling 4) over 12 tokens.

use std::path::Path;

use maxrs::host::HostTensor;
use maxrs::ir::{DType, Signature};
use maxrs::model::gemma3_hf::{layer_names, Fold, GLOBAL, LAYER};
use maxrs::model::Model;
use maxrs::tensor::{trace, Tree};
use safetensors::SafeTensors;

fn data(name: &str) -> Vec<u8> {
    std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gemma3_hf").join(name)).unwrap()
}

/// `t: [rows, cols]` (row-major) transposed.
fn transpose(t: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    (0..rows * cols).map(|i| t[(i % rows) * cols + i / rows]).collect()
}

/// maxrs's parameters (`params.<name>`, scanned layout) from the Hugging Face tensors.
fn converted(m: &Model, hf: &SafeTensors) -> Tree<HostTensor> {
    let emb = m.config.emb as f32;
    let shapes: std::collections::BTreeMap<String, Vec<i64>> =
        m.param_defs().into_iter().map(|d| (d.name, d.shape)).collect();
    let convert = |hf_name: &str, shape: &[i64], split: Option<usize>, fold: Fold| -> Vec<f32> {
        let t = hf.tensor(hf_name).unwrap_or_else(|e| panic!("{hf_name}: {e}"));
        let values: Vec<f32> = t.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        assert_eq!(values.len() as i64, shape.iter().product::<i64>(), "{hf_name}");
        let values = match split {
            None => values,
            Some(k) => {
                let (inner, outer) = (shape[..k].iter().product::<i64>(), shape[k..].iter().product::<i64>());
                transpose(&values, outer as usize, inner as usize)
            }
        };
        match fold {
            Fold::None => values,
            Fold::PlusOne => values.iter().map(|v| v + 1.0).collect(),
            Fold::TimesSqrtEmb => values.iter().map(|v| v * emb.sqrt()).collect(),
        }
    };
    let mut out = Tree::new();
    let mut used = 0;
    for (name, hf_name, split, fold) in GLOBAL {
        let shape = &shapes[*name];
        out.insert(format!("params.{name}"), HostTensor::from_f32(shape, &convert(hf_name, shape, *split, *fold)));
        used += 1;
    }
    for entry in LAYER {
        for j in 0..6 {
            let (name, _, _) = layer_names(j, entry);
            let shape = &shapes[&name];
            let mut stacked = Vec::new();
            for block in 0..shape[0] {
                let (name_n, b, hf_name) = layer_names(block * 6 + j, entry);
                assert_eq!((&name_n, b), (&name, block));
                stacked.extend(convert(&hf_name, &shape[1..], entry.2, entry.3));
                used += 1;
            }
            out.insert(format!("params.{name}"), HostTensor::from_f32(shape, &stacked));
        }
    }
    assert_eq!(used, hf.len(), "every Hugging Face tensor maps to a maxrs parameter");
    assert_eq!(out.len(), shapes.len(), "every maxrs parameter comes from a Hugging Face tensor");
    out
}

/// A JSON list of integer rows, flattened.
fn rows(v: &serde_json::Value) -> Vec<i32> {
    v.as_array()
        .unwrap()
        .iter()
        .flat_map(|row| row.as_array().unwrap().iter().map(|t| t.as_i64().unwrap() as i32))
        .collect()
}

#[test]
fn gemma3_logits_match_hugging_face() {
    let golden: serde_json::Value = serde_json::from_slice(&data("golden.json")).unwrap();
    let cfg = &golden["config"];
    let int = |k: &str| cfg[k].as_i64().unwrap();
    let args: Vec<String> = vec![
        "model_name=gemma3-12b".into(),
        "override_model_config=true".into(),
        "dtype=float32".into(),
        "weight_dtype=float32".into(),
        format!("base_emb_dim={}", int("hidden_size")),
        format!("base_num_query_heads={}", int("num_attention_heads")),
        format!("base_num_kv_heads={}", int("num_key_value_heads")),
        format!("head_dim={}", int("head_dim")),
        format!("base_mlp_dim={}", int("intermediate_size")),
        format!("base_num_decoder_layers={}", int("num_hidden_layers")),
        format!("vocab_size={}", int("vocab_size")),
        format!("sliding_window_size={}", int("sliding_window")),
        format!("rope_max_timescale={}", cfg["rope_theta"].as_f64().unwrap()),
        format!("local_rope_max_timescale={}", cfg["rope_local_base_freq"].as_f64().unwrap()),
        format!("rope_linear_scaling_factor={}", cfg["rope_scaling"]["factor"].as_f64().unwrap()),
        format!("normalization_layer_epsilon={}", cfg["rms_norm_eps"].as_f64().unwrap()),
    ];
    assert_eq!(int("query_pre_attn_scalar"), int("head_dim"), "maxrs scales queries by head_dim^-1/2 here");
    let m = Model::from_config(&maxrs::config::load(None, &args).unwrap()).unwrap();
    let bytes = data("model.safetensors");
    let mut inputs = converted(&m, &SafeTensors::deserialize(&bytes).unwrap());
    let tokens = rows(&golden["tokens"]);
    let (b, t) = (golden["tokens"].as_array().unwrap().len() as i64, tokens.len() as i64 / 2);
    inputs.insert("inputs", HostTensor::from_i32(&[b, t], &tokens));
    let mut sig = Signature::new(None);
    m.declare_params(&mut sig, "params");
    sig.input("inputs", DType::S32, &[b, t]);
    let program = trace(&sig, |_, inp| {
        let logits =
            m.forward(&inp.subtree("params"), &Tree::new().with("inputs", inp["inputs"].clone()), false).logits;
        Tree::new().with("argmax", logits.argmax(-1)).with("logits", logits)
    })
    .unwrap();
    let out = crate::common::run(&program, &inputs);
    let got = out["logits"].to_f64();
    let want: Vec<f64> = golden["logits"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    let err = crate::common::llama_ref::scaled_err(&got, &want);
    println!("gemma3 vs transformers {}: logits scaled error {err:e}", golden["transformers"]);
    assert!(err < 1e-5, "logits differ from Hugging Face's: scaled error {err:e}");
    assert_eq!(out["argmax"].to_i32(), rows(&golden["argmax"]), "greedy tokens");
}
