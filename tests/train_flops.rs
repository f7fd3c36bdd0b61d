//! The TFLOPs formula against hand-computed llama2-7b numbers and MaxText's own golden test;
//! the peak table and MFU.

use maxrs::model::flops::{StepShape, StepTflops};
use maxrs::model::Model;
use maxrs::train::flops::{mfu, peak_tflops_per_device};

/// llama2-7b (emb 4096, 32 heads of 128, 32 kv heads, mlp 11008, 32 layers, vocab 32000) from its
/// model file, with `overrides`.
fn llama2_7b(overrides: &[&str]) -> Model {
    let mut args = vec!["model_name=llama2-7b".to_string(), "override_model_config=true".to_string()];
    args.extend(overrides.iter().map(|s| s.to_string()));
    Model::from_config(&maxrs::config::load(None, &args).unwrap()).unwrap()
}

fn training_tflops_per_device(model: &Model, shape: &StepShape) -> StepTflops {
    model.training_tflops_per_device(shape)
}

fn shape(batch: f64, seq: u64) -> StepShape {
    StepShape { per_device_batch_size: batch, max_target_length: seq, gradient_accumulation_steps: 1 }
}

fn assert_close(actual: f64, expected: f64, rel: f64) {
    assert!(((actual - expected) / expected).abs() <= rel, "{actual} vs {expected} (rel tol {rel})");
}

#[test]
fn llama2_7b_batch_4_seq_4096_matches_the_hand_count() {
    // Integer FLOPs, term by term (B=4, S=4096, BS=16384).
    let bs: u128 = 4 * 4096;
    let ffn = 3 * 2 * bs * 11008 * 4096; // gate, up, down projections
    let qkv = 2 * bs * 4096 * (32 + 2 * 32) * 128;
    let out = 2 * bs * 4096 * 32 * 128;
    let unembed = 2 * bs * 4096 * 32000;
    let weights = ((ffn + qkv + out) * 32 + unembed) * 3;
    let attention = 4 * 4 * 4096u128 * 4096 * 32 * 128 / 2 * 32 * 3;
    assert_eq!(weights, 649_502_134_370_304);
    assert_eq!(attention, 52_776_558_133_248);

    let t = training_tflops_per_device(&llama2_7b(&[]), &shape(4.0, 4096));
    assert_close(t.learnable_weight, 649.502134370304, 1e-12);
    assert_close(t.attention, 52.776558133248, 1e-12);
    assert_close(t.total, 702.278692503552, 1e-12);
    assert_eq!(t.total, t.learnable_weight + t.attention);
}

/// MaxText's flop_calculation_test.py checks llama2-7b (B=12, S=2048) against
/// `6 * B * S * 6.74e9 + 6 * L * B * S^2 * H * hd` within 5%; the same holds here, at B=4/S=4096 too.
#[test]
fn llama2_7b_agrees_with_maxtexts_golden_test() {
    for (b, s) in [(12.0, 2048u64), (4.0, 4096)] {
        let golden = 6.0 * b * s as f64 * 6.74e9 / 1e12 + 6.0 * 32.0 * b * (s * s) as f64 * 32.0 * 128.0 / 1e12;
        let t = training_tflops_per_device(&llama2_7b(&[]), &shape(b, s));
        assert_close(t.total, golden, 0.05);
    }
}

#[test]
fn batch_and_accumulation_scale_linearly_and_gqa_shrinks_qkv() {
    let one = training_tflops_per_device(&llama2_7b(&[]), &shape(1.0, 2048));
    let half = training_tflops_per_device(&llama2_7b(&[]), &shape(0.5, 2048));
    assert_close(half.total, one.total / 2.0, 1e-12);
    let accumulated = training_tflops_per_device(
        &llama2_7b(&[]),
        &StepShape { per_device_batch_size: 1.0, max_target_length: 2048, gradient_accumulation_steps: 4 },
    );
    assert_close(accumulated.total, 4.0 * one.total, 1e-12);

    let gqa = llama2_7b(&["base_num_kv_heads=8"]);
    let g = training_tflops_per_device(&gqa, &shape(1.0, 2048));
    // QKV per layer drops from (32 + 64) to (32 + 16) heads' worth; attention is unchanged.
    let saved = 2.0 * 2048.0 * 4096.0 * (64.0 - 16.0) * 128.0 * 32.0 * 3.0 / 1e12;
    assert_close(one.learnable_weight - g.learnable_weight, saved, 1e-9);
    assert_eq!(g.attention, one.attention);
    assert_close(
        StepShape { per_device_batch_size: 4.0, max_target_length: 4096, gradient_accumulation_steps: 2 }
            .tokens_per_device(),
        32768.0,
        0.0,
    );
}

#[test]
fn peak_by_device_kind_and_override() {
    assert_eq!(peak_tflops_per_device("NVIDIA H100 80GB HBM3", None), Some(989.0));
    assert_eq!(peak_tflops_per_device("NVIDIA H100 PCIe", None), Some(756.0));
    assert_eq!(peak_tflops_per_device("NVIDIA H100 NVL", None), Some(835.0));
    assert_eq!(peak_tflops_per_device("NVIDIA H200", None), Some(989.0));
    assert_eq!(peak_tflops_per_device("TPU v5 lite", None), Some(197.0));
    assert_eq!(peak_tflops_per_device("TPU v5", None), Some(459.0));
    assert_eq!(peak_tflops_per_device("cpu", None), None);
    assert_eq!(peak_tflops_per_device("cpu", Some(1.5)), Some(1.5));
    assert_eq!(peak_tflops_per_device("NVIDIA H100 80GB HBM3", Some(798.0)), Some(798.0));
    assert_close(mfu(494.5, 989.0), 0.5, 1e-12);
}

fn model(name: &str) -> Model {
    Model::from_config(&maxrs::config::load(None, &[format!("model_name={name}")]).unwrap()).unwrap()
}

/// gemma2-2b under MaxText's `calculate_gemma2_tflops_training_per_device` (maxtext_utils.py,
/// e591f30), by hand: each of the 13 stacked layers is a local and a global layer (twice the
/// weight terms), global attention causal over the sequence, local attention over the window.
#[test]
fn gemma2_counts_pairs_of_local_and_global_layers() {
    for seq in [8192u128, 2048] {
        let (e, h, kv, d, m, l, v) = (2304u128, 8u128, 4u128, 256u128, 9216u128, 13u128, 256128u128);
        let bs = seq; // per_device_batch_size 1
        let ffn = 3 * 2 * bs * m * e; // gelu and linear inputs, output
        let qkv = 2 * bs * e * (h + 2 * kv) * d;
        let proj = 2 * bs * e * h * d;
        let weights = ((ffn + qkv + proj) * l * 2 + 2 * bs * e * v) * 3;
        let w = 4096.min(seq);
        let global = 2 * seq * seq * h * d;
        let local = 4 * (seq * w - w * w / 2) * h * d;
        let attention = (global + local) * l * 3;
        let t = training_tflops_per_device(&model("gemma2-2b"), &shape(1.0, seq as u64));
        assert_close(t.learnable_weight, weights as f64 / 1e12, 1e-12);
        assert_close(t.attention, attention as f64 / 1e12, 1e-12);
    }
}

/// gemma3-12b and gemma3-4b under MaxText's `calculate_mixed_attention_model_tflops_training_per_device`
/// with an attention pattern of 6 (maxtext_utils.py, e591f30), by hand: of 48 layers 48 / 6 = 8
/// global (causal over the sequence) and 40 local (over the 1024-token window); of gemma3-4b's 34
/// (5 blocks and a remainder of 4 local layers) 34 / 6 = 5 global and 29 local.
#[test]
fn gemma3_counts_local_and_global_layers() {
    for (name, e, h, kv, m, l, globals, seq) in [
        ("gemma3-12b", 3840u128, 16u128, 8u128, 15360u128, 48u128, 8u128, 8192u128),
        ("gemma3-12b", 3840, 16, 8, 15360, 48, 8, 512),
        ("gemma3-4b", 2560, 8, 4, 10240, 34, 5, 8192),
    ] {
        let (d, v) = (256u128, 262144u128);
        let ffn = 3 * 2 * seq * m * e;
        let qkv = 2 * seq * e * (h + 2 * kv) * d;
        let proj = 2 * seq * e * h * d;
        let weights = ((ffn + qkv + proj) * l + 2 * seq * e * v) * 3;
        let w = 1024.min(seq);
        let global = 2 * seq * seq * h * d;
        let local = 4 * (seq * w - w * w / 2) * h * d;
        let attention = (globals * global + (l - globals) * local) * 3;
        let t = training_tflops_per_device(&model(name), &shape(1.0, seq as u64));
        assert_close(t.learnable_weight, weights as f64 / 1e12, 1e-12);
        assert_close(t.attention, attention as f64 / 1e12, 1e-12);
    }
}

/// gpt3-6b and gemma-7b under the dense formula: one MLP input for GPT-3's gelu, two for GeGLU.
#[test]
fn gpt3_and_gemma_use_the_dense_formula() {
    for (name, e, h, d, m, l, v, acts) in [
        ("gpt3-6b", 3072u128, 12u128, 256u128, 12288u128, 48u128, 32768u128, 1u128),
        ("gemma-7b", 3072, 16, 256, 24576, 28, 256128, 2),
    ] {
        let seq = 1024u128;
        let ffn = (acts + 1) * 2 * seq * m * e;
        let attn_weights = 2 * seq * e * 3 * h * d + 2 * seq * e * h * d;
        let weights = ((ffn + attn_weights) * l + 2 * seq * e * v) * 3;
        let attention = 4 * seq * seq * h * d / 2 * l * 3;
        let t = training_tflops_per_device(&model(name), &shape(1.0, seq as u64));
        assert_close(t.learnable_weight, weights as f64 / 1e12, 1e-12);
        assert_close(t.attention, attention as f64 / 1e12, 1e-12);
    }
}

/// mixtral-8x7b: the hand count (router plus 2 of 8 experts), and MaxText's golden test
/// (`tests/unit/flop_calculation_test.py::test_mixtral_8x7b_flops` at main e591f30): about
/// `6 x B x S x 12.9e9` active parameters plus causal attention, within 5%.
#[test]
fn mixtral_8x7b_counts_the_active_experts_only() {
    let args = ["model_name=mixtral-8x7b".to_string()];
    let model = Model::from_config(&maxrs::config::load(None, &args).unwrap()).unwrap();
    let (b, s): (u128, u128) = (4, 8192);
    let bs = b * s;
    let router = 2 * bs * 4096 * 8;
    let experts = 2 * 3 * 2 * bs * 14336 * 4096;
    let qkv = 2 * bs * 4096 * (32 + 2 * 8) * 128;
    let out = 2 * bs * 4096 * 32 * 128;
    let unembed = 2 * bs * 4096 * 32000;
    let weights = ((router + experts + qkv + out) * 32 + unembed) * 3;
    let attention = 4 * b * s * s * 32 * 128 / 2 * 32 * 3;
    let t = training_tflops_per_device(&model, &shape(4.0, 8192));
    assert_close(t.learnable_weight, weights as f64 / 1e12, 1e-12);
    assert_close(t.attention, attention as f64 / 1e12, 1e-12);

    let golden_attention = 2.0 * 3.0 * 32.0 * 4.0 * 8192f64.powi(2) * 32.0 * 128.0 / 1e12;
    let golden = 6.0 * 4.0 * 8192.0 * 12.9e9 / 1e12 + golden_attention;
    assert_close(t.total, golden, 5e-2);
    // 46.7B parameters in all (Mistral's figure for Mixtral 8x7B).
    assert_close(model.num_params() as f64, 46.7e9, 1e-2);
}

/// gpt-oss-20b: the hand count (router plus 4 of 32 experts; MaxText's
/// `calculate_mixed_attention_model_tflops_training_per_device` with an attention pattern of 2:
/// 12 global layers causal over the sequence, 12 over the 128-token window), and MaxText's golden
/// test (`tests/unit/flop_calculation_test.py::test_gpt_oss_20b_flops` at e591f30): about
/// `6 x B x S x 3.6e9` active parameters plus its attention estimate, within 5%.
#[test]
fn gpt_oss_20b_counts_the_active_experts_and_the_windows() {
    let (b, s, w): (u128, u128, u128) = (4, 8192, 128);
    let (e, h, kv, d, m, x, k, l, v) = (2880u128, 64u128, 8u128, 64u128, 2880u128, 32u128, 4u128, 24u128, 201088u128);
    let bs = b * s;
    let ffn = 2 * bs * e * x + k * 3 * 2 * bs * m * e;
    let qkv = 2 * bs * e * (h + 2 * kv) * d;
    let out = 2 * bs * e * h * d;
    let weights = ((ffn + qkv + out) * l + 2 * bs * e * v) * 3;
    let global = 2 * b * s * s * h * d;
    let local = 4 * b * (s * w - w * w / 2) * h * d;
    let attention = (l / 2 * global + l / 2 * local) * 3;
    let t = training_tflops_per_device(&model("gpt-oss-20b"), &shape(4.0, 8192));
    assert_close(t.learnable_weight, weights as f64 / 1e12, 1e-12);
    assert_close(t.attention, attention as f64 / 1e12, 1e-12);

    let (bf, sf, wf) = (4.0, 8192f64, 128f64);
    let golden_attention = 2.0 * 3.0 * bf * (12.0 * sf * sf + 12.0 * wf * wf) * 64.0 * 64.0 / 1e12;
    let golden = 6.0 * bf * sf * 3.6e9 / 1e12 + golden_attention;
    assert_close(t.total, golden, 5e-2);
}

/// llama4-17b-128e: the hand count (24 dense layers of `mlp` 16384; 24 MoE layers of the router,
/// 1 of 128 experts and the shared one, `moe_mlp` 8192 each; MaxText's
/// `calculate_routed_and_shared_ffn_tflops_per_device`), and MaxText's own test of
/// `calculate_llama4_attention_tflops` (`tests/unit/flop_calculation_test.py` at e591f30): 16
/// layers, 4 NoPE ones causal over 4096 tokens, 12 over 4 chunks of 1024, batch 2, 16 heads of 128.
#[test]
fn llama4_counts_the_dense_and_moe_layers_and_the_chunks() {
    let (b, s): (u128, u128) = (4, 8192);
    let (e, h, kv, d, mlp, moe_mlp, x, l, v) =
        (5120u128, 40u128, 8u128, 128u128, 16384u128, 8192u128, 128u128, 48u128, 202048u128);
    let bs = b * s;
    let projections = 2 * bs * e * (h + 2 * kv) * d + 2 * bs * e * h * d;
    let dense = 3 * 2 * bs * mlp * e;
    let moe = 2 * bs * e * x + 2 * 3 * 2 * bs * moe_mlp * e;
    let weights = ((projections * l + dense * l / 2 + moe * l / 2) + 2 * bs * e * v) * 3;
    let t = training_tflops_per_device(&model("llama4-17b-128e"), &shape(4.0, 8192));
    assert_close(t.learnable_weight, weights as f64 / 1e12, 1e-12);

    let keys = ["base_num_decoder_layers=16", "chunk_attn_window_size=1024", "base_num_query_heads=16", "head_dim=128"];
    let mut args = vec!["model_name=llama4-17b-16e".to_string(), "override_model_config=true".to_string()];
    args.extend(keys.iter().map(|k| k.to_string()));
    let m = Model::from_config(&maxrs::config::load(None, &args).unwrap()).unwrap();
    let t = training_tflops_per_device(&m, &shape(2.0, 4096));
    let global = 4.0 * 2.0 * 4096f64.powi(2) * 16.0 * 128.0;
    let chunked = 4.0 * 2.0 * (4.0 * 1024f64.powi(2)) * 16.0 * 128.0;
    let want = (4.0 * global + 12.0 * chunked) / 2.0 * 3.0 / 1e12;
    assert_close(t.attention, want, 1e-12);
}

/// Gemma 4 under MaxText's `calculate_gemma4_tflops_training_per_device` (maxtext_utils.py at
/// e591f30), with the sizes of MaxText's own test of it (`flop_calculation_test.py::
/// test_calculate_gemma4_tflops_training_per_device`: B 2, S 8192, window 4096, 16 heads of 256,
/// 8 key/value heads, 12 layers, global heads of 512 with 2 key/value heads shared by keys and
/// values, emb 2816), whose expected attention and projection counts are written out here, plus
/// the FFN and the unembedding that test leaves at 0: gemma4-31b's dense GeGLU (mlp 21504), and
/// gemma4-26b's router, 8 of 128 experts of 704 and the shared MLP of 2112
/// (`calculate_routed_and_shared_ffn_tflops_per_device`).
#[test]
fn gemma4_counts_its_global_heads_and_shared_projections() {
    let (b, s, w, h, kv, d, gd, gkv, e, l, v) =
        (2u128, 8192u128, 4096u128, 16u128, 8u128, 256u128, 512u128, 2u128, 2816u128, 12u128, 262144u128);
    let bs = b * s;
    let (globals, locals) = (l / 6, l - l / 6);
    let attention = (globals * 2 * b * s * s * h * gd + locals * (4 * b * (s * w - w * w / 2) * h * d)) * 3;
    let local_weights = 2 * bs * e * (h + 2 * kv) * d + 2 * bs * e * h * d;
    let global_weights = 2 * bs * e * (h + gkv) * gd + 2 * bs * e * h * gd;
    let projections = locals * local_weights + globals * global_weights;
    let sizes = [
        "override_model_config=true",
        "base_num_decoder_layers=12",
        "base_emb_dim=2816",
        "base_num_query_heads=16",
        "base_num_kv_heads=8",
        "global_num_kv_heads=2",
        "sliding_window_size=4096",
    ];
    let dense = 3 * 2 * bs * 21504 * e;
    let moe = 2 * bs * e * 128 + 8 * 3 * 2 * bs * 704 * e + 3 * 2 * bs * 2112 * e;
    for (name, extra, ffn) in [("gemma4-31b", "base_mlp_dim=21504", dense), ("gemma4-26b", "base_mlp_dim=2112", moe)] {
        let mut args = vec![format!("model_name={name}")];
        args.extend(sizes.iter().chain([&extra]).map(|s| s.to_string()));
        let model = Model::from_config(&maxrs::config::load(None, &args).unwrap()).unwrap();
        let t = training_tflops_per_device(&model, &shape(2.0, 8192));
        let weights = (projections + ffn * l + 2 * bs * e * v) * 3;
        assert_close(t.learnable_weight, weights as f64 / 1e12, 1e-12);
        assert_close(t.attention, attention as f64 / 1e12, 1e-12);
    }
}

/// Gemma 4 small under MaxText's `calculate_gemma4_small_tflops_training_per_device`
/// (maxtext_utils.py at e591f30), at the sizes of MaxText's own test of it
/// (`flop_calculation_test.py::test_calculate_gemma4_small_tflops_e2b`: gemma4-e2b's file, B 1,
/// S 2048), whose expected counts are written out here: 7 global and 28 local layers, the last 20
/// (4 global, 16 local) without key/value projections and with MLPs twice as wide, the per-layer
/// inputs' projection (emb to 35 x 256) and each layer's gate and projection; plus the
/// unembedding (that test's `embedding_flops`).
#[test]
fn gemma4_small_counts_its_shared_layers_and_per_layer_inputs() {
    let (b, s, w, h, kv, d, gd, e, m, v) =
        (1u128, 2048u128, 512u128, 8u128, 1u128, 256u128, 512u128, 1536u128, 6144u128, 262144u128);
    let (layers, shared, ple) = (35u128, 20u128, 256u128);
    let (globals, locals, globals_owning, locals_owning) = (7u128, 28u128, 3u128, 12u128);
    let attention = (globals * 2 * b * s * s * h * gd + locals * (4 * b * (s * w - w * w / 2) * h * d)) * 3;
    let projections = globals * 2 * (2 * b * s * e * h * gd)
        + locals * 2 * (2 * b * s * e * h * d)
        + globals_owning * 2 * b * s * e * 2 * kv * gd
        + locals_owning * 2 * b * s * e * 2 * kv * d;
    let ffn = 2 * b * s * m * e * 3;
    let ffn = (layers - shared) * ffn + shared * 2 * ffn;
    let per_layer = 2 * b * s * e * layers * ple + layers * 2 * 2 * b * s * e * ple;
    let weights = (projections + ffn + per_layer + 2 * b * s * e * v) * 3;
    let args = ["model_name=gemma4-e2b", "scan_layers=false", "max_target_length=2048"];
    let model = Model::from_config(&maxrs::config::load(None, &args.map(String::from)).unwrap()).unwrap();
    let t = training_tflops_per_device(&model, &shape(1.0, 2048));
    assert_close(t.learnable_weight, weights as f64 / 1e12, 1e-12);
    assert_close(t.attention, attention as f64 / 1e12, 1e-12);
}
