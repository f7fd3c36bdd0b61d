//! The decoder families (`decoder_block` mistral, gemma, gemma2, gemma3, gpt3, qwen3, olmo3, gpt_oss, and
//! llama2 with Llama 3.1's RoPE) against the independent f64 reference of `common/family_ref.rs`,
//! each from its MaxText model file shrunk to a tiny size (emb 32, 2 stacked layers, vocab 64) in
//! float32 on a 2 x 16 batch with random non-zero parameters: embeddings, every layer's output, the logits and the
//! loss, scanned and unrolled; the gradient of the loss (from the program of one of the forward
//! checks, on its parameters and batch) against central differences of the
//! reference loss for the parameters each family adds (windows, soft caps, post norms, biases,
//! LayerNorms, learned positions, the tied and rescaled Gemma embedding, Llama 3.1's RoPE, QK-norm,
//! attention sinks, router and expert biases).

use crate::common::family_ref::*;
use maxrs::model::Model;

/// The tiny shape every family's reference test uses.
pub(crate) const SIZES: &[&str] = &[
    "base_emb_dim=32",
    "base_num_query_heads=4",
    "base_num_kv_heads=2",
    "head_dim=8",
    "base_mlp_dim=48",
    "base_num_decoder_layers=2",
    "vocab_size=64",
];

fn shrunk(model_name: &str, extra: &[&str]) -> Model {
    let args: Vec<&str> = SIZES.iter().chain(extra).copied().collect();
    model(model_name, &args)
}

/// Embeddings, every layer, logits and loss of `m` against the reference of `spec`.
fn check_forward(label: &str, m: &Model, spec: &Spec) -> RefOut {
    check_forward_and_gradient(label, m, spec, &[])
}

/// A parameter element: `layer` (None: a top-level parameter), the name, and the element's index
/// in the row-major flattening of one layer's (or the top-level) tensor.
type Probe = (Option<usize>, &'static str, usize);

/// [`check_forward`], and with `probes` the gradient of the loss (`value_and_grad`) at each probe
/// against central differences of the reference loss, from the same program (one compile for
/// both; the forward pass alone when there are no probes).
fn check_forward_and_gradient(label: &str, m: &Model, spec: &Spec, probes: &[Probe]) -> RefOut {
    let p = random_params(spec, m, 1);
    let b = batch(m, 2);
    let program = crate::common::llama_ref::forward_program(m, 0.0, !probes.is_empty());
    let out = crate::common::run(&program, &inputs(m, &p, &b));
    let want = reference(spec, m, &p, &b);
    check_outputs(label, m, &out, &want);
    for &(layer, name, index) in probes {
        let h = 1e-4;
        let nudged = |delta: f64| {
            let mut q = p.clone();
            let table = &p.top["token_embedder.embedding"];
            q.tied_rounding = Some(crate::common::tied_logit_table(table) - table);
            let a = match layer {
                Some(li) => q.layers[li].get_mut(name),
                None => q.top.get_mut(name),
            };
            let a = a.unwrap_or_else(|| panic!("{label}: no parameter {name}"));
            let cols = a.ncols();
            a[[index / cols, index % cols]] += delta;
            reference(spec, m, &q, &b).loss
        };
        let fd = (nudged(h) - nudged(-h)) / (2.0 * h);
        let (grad_name, offset) = match layer {
            Some(li) if m.config.scan_layers => (format!("grad.decoder.layers.{name}"), li * p.layers[li][name].len()),
            Some(li) => (format!("grad.decoder.layers_{li}.{name}"), 0),
            None => (format!("grad.{name}"), 0),
        };
        let g = out[grad_name.as_str()].to_f64()[offset + index];
        println!("{label}: d loss / d {name}[{layer:?}][{index}]: traced {g:e}, finite difference {fd:e}");
        assert!(fd.abs() > 1e-7, "{label}: {name}[{index}] does not affect the loss; pick another probe");
        // (A tied embedding's gradient through the logits is rounded to bf16, as MaxText's is:
        // at most 2^-8 of that part, inside these bounds at the probes here.)
        assert!((g - fd).abs() <= 2e-3 * fd.abs() + 1e-6, "{label}: {name}: traced {g} vs finite difference {fd}");
    }
    want
}

fn spec(family: Family, rope: RopeRef, eps: f64) -> Spec {
    Spec::plain(family, rope, eps)
}

#[test]
fn mistral_sliding_window() {
    let m = shrunk("mistral-7b", &["sliding_window_size=5"]);
    let windowed = Spec { window: Some(5), ..spec(Family::Llama, RopeRef::HalfSplit, 1e-5) };
    let probes = [(Some(0), "self_attention.query.kernel", 37), (Some(1), "self_attention.key.kernel", 101)];
    let want = check_forward_and_gradient("mistral window 5", &m, &windowed, &probes);
    // The window matters on 16 tokens: the unwindowed reference is another function.
    let plain =
        reference(&spec(Family::Llama, RopeRef::HalfSplit, 1e-5), &m, &random_params(&windowed, &m, 1), &batch(&m, 2));
    assert!(scaled_err(&plain.logits.iter().copied().collect::<Vec<_>>(), &want.logits) > 1e-2);
    // The same through blockwise attention (attention=flash), whose mask skips whole key blocks.
    check_forward(
        "mistral window 5 blockwise",
        &shrunk("mistral-7b", &["sliding_window_size=5", "attention=flash", "max_target_length=16"]),
        &windowed,
    );
    // MaxText's mistral files leave the window at 0: plain causal attention.
    check_forward("mistral no window", &shrunk("mistral-7b", &[]), &spec(Family::Llama, RopeRef::HalfSplit, 1e-5));
}

/// Llama 3.1's RoPE with head_dim 16 and theta 500000: its 8 frequencies have wavelengths from 6
/// to ~1e6 tokens, so all three cases of the scaling (kept, interpolated, divided by 8) occur.
#[test]
fn llama31_rope() {
    let sizes = ["head_dim=16"];
    let scaled = spec(Family::Llama, RopeRef::Llama31 { scaled: true }, 1e-5);
    let m = shrunk("llama3.1-8b", &sizes);
    let probes = [(Some(0), "self_attention.key.kernel", 77), (Some(1), "self_attention.query.kernel", 300)];
    check_forward_and_gradient("llama3.1-8b", &m, &scaled, &probes);
    check_forward("llama3.3-70b", &shrunk("llama3.3-70b", &sizes), &scaled);
    let unscaled = spec(Family::Llama, RopeRef::Llama31 { scaled: false }, 1e-5);
    check_forward(
        "llama3.1 rope_use_scale=false",
        &shrunk("llama3.1-8b", &["head_dim=16", "rope_use_scale=false"]),
        &unscaled,
    );
    check_forward("llama2 rope_type=llama3.1", &shrunk("llama2-7b", &["head_dim=16", "rope_type=llama3.1"]), &scaled);
}

#[test]
fn gemma() {
    // A final-norm epsilon unlike the layer norms' fixed 1e-6, and multi-query attention.
    let m = shrunk("gemma-2b", &["base_num_kv_heads=1", "normalization_layer_epsilon=1e-3"]);
    let s = spec(Family::Gemma, RopeRef::HalfSplit, 1e-3);
    check_forward_and_gradient(
        "gemma",
        &m,
        &s,
        &[
            (None, "token_embedder.embedding", 333),
            (None, "decoder.decoder_norm.scale", 5),
            (Some(1), "pre_ffw_norm.scale", 7),
            (Some(0), "mlp.wi_0.kernel", 200),
        ],
    );
}

#[test]
fn gemma2() {
    let caps = ["sliding_window_size=5", "attn_logits_soft_cap=1.5", "final_logits_soft_cap=2.0"];
    let s = Spec {
        window: Some(5),
        attn_cap: Some(1.5),
        final_cap: Some(2.0),
        post_norms: true,
        ..spec(Family::Gemma2, RopeRef::HalfSplit, 1e-6)
    };
    // The gradient from the scanned model's program.
    let probes = [
        (Some(0), "self_attention_local.query.kernel", 45),
        (Some(1), "self_attention_global.key.kernel", 90),
        (Some(0), "post_self_attention_norm_local.scale", 3),
        (Some(1), "post_ffw_norm_global.scale", 11),
        (None, "token_embedder.embedding", 1000),
    ];
    for (scan, probes) in [("scan_layers=true", &probes[..]), ("scan_layers=false", &[])] {
        let m = shrunk("gemma2-2b", &[&caps[..], &[scan]].concat());
        check_forward_and_gradient(&format!("gemma2 {scan}"), &m, &s, probes);
    }
    // Blockwise attention has no soft cap: asked for by name it is refused; without a cap it
    // computes the global layers' f32 query-key product.
    let args: Vec<String> = ["model_name=gemma2-2b", "override_model_config=true", "attention=flash"]
        .iter()
        .chain(SIZES)
        .chain(&caps)
        .map(|a| a.to_string())
        .collect();
    let e = Model::from_config(&maxrs::config::load(None, &args).unwrap()).unwrap_err().to_string();
    assert!(e.contains("attention=flash") && e.contains("attn_logits_soft_cap"), "{e}");
    let uncapped = Spec { attn_cap: None, ..s.clone() };
    let flash = [
        "sliding_window_size=5",
        "final_logits_soft_cap=2.0",
        "attn_logits_soft_cap=0",
        "attention=flash",
        "max_target_length=16",
    ];
    check_forward("gemma2 blockwise", &shrunk("gemma2-2b", &flash), &uncapped);
    let m = shrunk("gemma2-2b", &caps);
    // Each of the window and the two caps changes the function at these sizes.
    let (p, b) = (random_params(&s, &m, 1), batch(&m, 2));
    let logits = reference(&s, &m, &p, &b).logits;
    for without in [
        Spec { window: None, ..s.clone() },
        Spec { attn_cap: None, ..s.clone() },
        Spec { final_cap: None, ..s.clone() },
    ] {
        let other = reference(&without, &m, &p, &b).logits;
        assert!(scaled_err(&other.iter().copied().collect::<Vec<_>>(), &logits) > 1e-3, "{without:?} changes nothing");
    }
}

#[test]
fn gpt3() {
    let sizes = ["base_num_kv_heads=4", "trainable_position_size=16", "max_target_length=16"];
    let fused = Spec { fused_qkv: true, ..spec(Family::Gpt3, RopeRef::None, 1e-5) };
    // The gradient from the scanned model's program.
    let probes = [
        (Some(0), "self_attention.qkv_proj.bias", 70),
        (Some(1), "self_attention.qkv_proj.kernel", 500),
        (Some(0), "pre_self_attention_norm.scale", 9),
        (Some(1), "mlp.mlp_layer_norm.bias", 4),
        (Some(0), "mlp.wi.bias", 17),
        (Some(1), "self_attention.out.bias", 30),
        (None, "decoder.decoder_norm.bias", 2),
        (None, "decoder.position_embedder.embedding", 100),
    ];
    for (scan, probes) in [("scan_layers=true", &probes[..]), ("scan_layers=false", &[])] {
        let m = shrunk("gpt3-52k", &[&sizes[..], &[scan]].concat());
        check_forward_and_gradient(&format!("gpt3 fused {scan}"), &m, &fused, probes);
    }
    let separate = Spec { fused_qkv: false, ..fused.clone() };
    check_forward("gpt3 fused_qkv=false", &shrunk("gpt3-52k", &[&sizes[..], &["fused_qkv=false"]].concat()), &separate);
}

/// Gemma 3 from gemma3-12b's file with 8 layers (a block of 5 local + 1 global, then MaxText's
/// `layers_remainder` block of 2 local layers; scanned and unscanned; 6 layers for the gradients
/// and the checks that each feature matters), a window of 5
/// on 16 tokens, QK-norm epsilon 1e-3 (the layer norms keep 1e-6), and RoPE bases
/// and factor that make local and global layers differ at head_dim 8 (local base 10000, global
/// 100 with factor 4: MaxText's 1e6 and 8 rotate too little over 16 positions to be told apart).
#[test]
fn gemma3() {
    let keys = [
        "base_num_decoder_layers=6",
        "sliding_window_size=5",
        "rope_max_timescale=100",
        "rope_linear_scaling_factor=4",
        "normalization_layer_epsilon=1e-3",
    ];
    let g = Gemma3Spec { local_theta: 10000.0, global_theta: 100.0, global_factor: 4.0, query_pre_attn_scalar: 8.0 };
    let s =
        Spec { window: Some(5), post_norms: true, gemma3: Some(g), ..spec(Family::Gemma3, RopeRef::HalfSplit, 1e-3) };
    let remainder = [&keys[..], &["base_num_decoder_layers=8"]].concat();
    check_forward("gemma3 scanned, 1 block + 2", &shrunk("gemma3-12b", &remainder), &s);
    let unscanned = shrunk("gemma3-12b", &[&remainder[..], &["scan_layers=false"]].concat());
    check_forward("gemma3 unscanned, 1 block + 2", &unscanned, &s);
    let m = shrunk("gemma3-12b", &keys);
    // The window, the global RoPE factor and the QK norms (random scales) each change the function.
    let (p, b) = (random_params(&s, &m, 1), batch(&m, 2));
    let logits = reference(&s, &m, &p, &b).logits;
    let mut unnormed = p.clone();
    for l in unnormed.layers.iter_mut() {
        for (name, a) in l.iter_mut() {
            if name.ends_with("query_norm.scale") || name.ends_with("key_norm.scale") {
                a.fill(1.0);
            }
        }
    }
    for (without, q) in [
        (Spec { window: None, ..s.clone() }, &p),
        (Spec { gemma3: Some(Gemma3Spec { global_factor: 1.0, ..g }), ..s.clone() }, &p),
        (s.clone(), &unnormed),
    ] {
        let other = reference(&without, &m, q, &b).logits;
        assert!(scaled_err(&other.iter().copied().collect::<Vec<_>>(), &logits) > 1e-3, "{without:?} changes nothing");
    }
    // The gradient from the 6-layer model (one block; with the remainder its program took 1.4
    // times the CPU), whose forward pass is checked too.
    let probes = [
        (Some(0), "layers_1.self_attention.query_norm.scale", 3),
        (Some(0), "layers_5.self_attention.key_norm.scale", 6),
        (Some(0), "layers_5.self_attention.query.kernel", 45),
    ];
    check_forward_and_gradient("gemma3 1 block", &m, &s, &probes);
}

/// OLMo 3 from olmo3-7b's file (YaRN RoPE in every layer, whole-width QK-norm, post-norms, 3
/// sliding layers then 1 global) with 8 layers (2 scanned blocks of 4; unscanned, 8 modules), a
/// window of 5 on 16 tokens, a norm epsilon of 1e-3 and YaRN settings that make its ramp matter at
/// head_dim 8 (base 100, factor 4, original context 8, beta_fast 2, beta_slow 0.25: frequency 0
/// kept, 1 blended, 2 and 3 divided by 4).
#[test]
fn olmo3() {
    let keys = [
        "base_num_decoder_layers=8",
        "sliding_window_size=5",
        "rope_max_timescale=100",
        "rope_factor=4",
        "original_max_position_embeddings=8",
        "beta_fast=2",
        "beta_slow=0.25",
        "normalization_layer_epsilon=1e-3",
    ];
    let yarn = RopeRef::Yarn {
        factor: 4.0,
        original_max_position_embeddings: 8.0,
        beta_fast: 2.0,
        beta_slow: 0.25,
        truncate: true,
    };
    let s = Spec { window: Some(5), ..spec(Family::Olmo3, yarn, 1e-3) };
    let m = shrunk("olmo3-7b", &keys);
    let probes = [
        (Some(0), "layers_1.attention.query_norm.scale", 13),
        (Some(1), "layers_3.attention.key_norm.scale", 6),
        (Some(1), "layers_2.post_mlp_layer_norm.scale", 5),
    ];
    let want = check_forward_and_gradient("olmo3 scanned, 2 blocks", &m, &s, &probes);
    check_forward("olmo3 unscanned", &shrunk("olmo3-7b", &[&keys[..], &["scan_layers=false"]].concat()), &s);
    // The window and YaRN (against the default RoPE of olmo3-7b-pt) each change the function.
    let (p, b) = (random_params(&s, &m, 1), batch(&m, 2));
    for without in [Spec { window: None, ..s.clone() }, Spec { rope: RopeRef::HalfSplit, ..s.clone() }] {
        let other = reference(&without, &m, &p, &b).logits;
        let err = scaled_err(&other.iter().copied().collect::<Vec<_>>(), &want.logits);
        assert!(err > 1e-3, "{without:?} changes nothing");
    }
}

/// Qwen3 from qwen3-8b's file (Llama's layer with QK-norm, RoPE base 1e6), scanned, with a norm
/// epsilon of 1e-3 (QK-norms and layer norms alike) and random norm scales, which make the
/// QK-norms change the function.
#[test]
fn qwen3() {
    let m = shrunk("qwen3-8b", &["normalization_layer_epsilon=1e-3", "rope_max_timescale=100"]);
    let s = Spec { qk_norm: true, query_scaled: true, ..spec(Family::Llama, RopeRef::HalfSplit, 1e-3) };
    let probes = [(Some(0), "self_attention.query_norm.scale", 3), (Some(1), "self_attention.key_norm.scale", 6)];
    let want = check_forward_and_gradient("qwen3", &m, &s, &probes);
    let (p, b) = (random_params(&s, &m, 1), batch(&m, 2));
    let plain = reference(&Spec { qk_norm: false, ..s.clone() }, &m, &p, &b).logits;
    assert!(scaled_err(&plain.iter().copied().collect::<Vec<_>>(), &want.logits) > 1e-3, "QK-norm changes nothing");
}

/// gpt-oss from gpt-oss-20b's file (attention sinks, biases on every projection, YaRN RoPE
/// without truncation in every layer, a sliding layer then a global one, the routed experts with
/// their router and expert biases and the clamped GLU) with 4 layers (2 scanned blocks of 2;
/// unscanned, 4 modules), 4 experts of which 2 per token, a window of 5 on 16 tokens, a clamp of
/// 1.5 (which random activations cross), a norm epsilon of 1e-3 and olmo3's small YaRN settings,
/// with the dropless experts and the two `sparse_matmul=false` computations; and the same with
/// blockwise attention (`attention=flash`; one 16-token block here: `attention.rs` checks several
/// blocks with sinks, and the sinks' gradient), whose sinks join after its online softmax.
#[test]
fn gpt_oss() {
    let keys = [
        "base_num_decoder_layers=4",
        "num_experts=4",
        "num_experts_per_tok=2",
        "sliding_window_size=5",
        "mlp_activations_limit=1.5",
        "rope_max_timescale=100",
        "rope_factor=4",
        "original_max_position_embeddings=8",
        "beta_fast=2",
        "beta_slow=0.25",
        "normalization_layer_epsilon=1e-3",
    ];
    let yarn = RopeRef::Yarn {
        factor: 4.0,
        original_max_position_embeddings: 8.0,
        beta_fast: 2.0,
        beta_slow: 0.25,
        truncate: false,
    };
    let s = Spec { window: Some(5), ..spec(Family::GptOss { limit: 1.5, top_k: 2 }, yarn, 1e-3) };
    let m = shrunk("gpt-oss-20b", &keys);
    let probes = [
        (Some(0), "layers_0.GptOssAttention.sinks", 1),
        (Some(1), "layers_1.GptOssAttention.sinks", 2),
        (Some(1), "layers_0.GptOssAttention.out.bias", 4),
        (Some(0), "layers_0.GptOssMlp.gate.bias", 2),
        (Some(1), "layers_1.GptOssMlp.wi_0_bias", 101),
        (Some(0), "layers_1.GptOssMlp.wi_1_bias", 50),
        (Some(1), "layers_0.GptOssMlp.wo_bias", 70),
    ];
    check_forward_and_gradient("gpt-oss scanned, 2 blocks", &m, &s, &probes);
    // Two more programs cover the rest, each two variants at once: unscanned with every expert on
    // every token; blockwise attention with the experts dispatched under a capacity
    // (ceil(16 x 2 / 4) x 2 = 16 per expert and sequence) that drops nothing.
    for (label, variants) in [
        ("gpt-oss unscanned, every expert", &["scan_layers=false", "sparse_matmul=false"][..]),
        ("gpt-oss blockwise, dispatched", &["attention=flash", "sparse_matmul=false", "capacity_factor=2"]),
    ] {
        check_forward(label, &shrunk("gpt-oss-20b", &[&keys[..], variants].concat()), &s);
    }
}

/// Llama 4 from llama4-17b-16e's file (Llama 3.1's RoPE, QK L2 norm, temperature tuning) with one
/// scanned block of 4 layers (unscanned, 4 modules): layers 0-2 attend within chunks of 5 tokens
/// of the 16, layer 3 is NoPE and global; every 2nd layer has 4 experts (one a token, scaled by
/// its logit's sigmoid) and the shared one, the others a dense MLP; with the dropless experts and,
/// in a second program, every expert on every token under blockwise attention (one 16-token
/// block: `attention.rs` checks chunks over several blocks). Temperature tuning scales only
/// positions from 8191 on: a third program puts the rows at positions 8180.. in a model of NoPE
/// layers only (no RoPE, whose f32 angles would be far from the f64 reference's there).
#[test]
fn llama4() {
    let keys = [
        "base_num_decoder_layers=4",
        "interleave_moe_layer_step=2",
        "num_experts=4",
        "base_moe_mlp_dim=24",
        "chunk_attn_window_size=5",
        "normalization_layer_epsilon=1e-3",
    ];
    let llama4 = |chunk, nope_interval, qk_norm, temperature_tuning| Family::Llama4 {
        chunk,
        nope_interval,
        moe_step: 2,
        qk_norm,
        temperature_tuning,
    };
    let family = llama4(5, 4, true, true);
    let s = spec(family, RopeRef::Llama31 { scaled: true }, 1e-3);
    let m = shrunk("llama4-17b-16e", &keys);
    let probes = [
        (Some(0), "layers_0.self_attention.query.kernel", 37),
        (Some(0), "layers_2.self_attention.key.kernel", 101),
        (Some(0), "layers_3.self_attention.value.kernel", 11),
        (Some(0), "layers_1.Llama4MoEBlock_0.MoeBlock_0.gate.kernel", 5),
        (Some(0), "layers_3.Llama4MoEBlock_0.MoeBlock_0.wi_1", 200),
        (Some(0), "layers_3.Llama4MoEBlock_0.shared_experts.wo.kernel", 20),
        (Some(0), "layers_0.mlp.wi_0.kernel", 7),
    ];
    let want = check_forward_and_gradient("llama4 scanned, 1 block", &m, &s, &probes);
    let variants = ["scan_layers=false", "attention=flash", "max_target_length=16", "sparse_matmul=false"];
    check_forward(
        "llama4 unscanned, blockwise, every expert",
        &shrunk("llama4-17b-16e", &[&keys[..], &variants].concat()),
        &s,
    );
    // The chunks and the QK norm each change the function.
    let (p, b) = (random_params(&s, &m, 1), batch(&m, 2));
    for other in [llama4(16, 4, true, true), llama4(5, 4, false, true)] {
        let logits = reference(&Spec { family: other, ..s.clone() }, &m, &p, &b).logits;
        let err = scaled_err(&logits.iter().copied().collect::<Vec<_>>(), &want.logits);
        assert!(err > 1e-3, "{other:?} changes nothing");
    }
    let at = Spec { family: llama4(5, 1, true, true), position_offset: 8180, ..s.clone() };
    let m = shrunk("llama4-17b-16e", &[&keys[..], &["nope_layer_interval=1"]].concat());
    let want = check_forward_at("llama4 NoPE at positions 8180..8195", &m, &at);
    let untuned = Spec { family: llama4(5, 1, true, false), ..at.clone() };
    let other = reference(&untuned, &m, &p, &b).logits;
    assert!(scaled_err(&other.iter().copied().collect::<Vec<_>>(), &want.logits) > 1e-3, "temperature tuning");
}

/// [`check_forward`] with every row at positions `spec.position_offset..` (`inputs_position`).
fn check_forward_at(label: &str, m: &Model, spec: &Spec) -> RefOut {
    use maxrs::host::HostTensor;
    let (p, b) = (random_params(spec, m, 1), batch(m, 2));
    let mut sig = signature(m);
    sig.input("inputs_position", maxrs::ir::DType::S32, &[B as i64, T as i64]);
    let program = maxrs::tensor::trace(&sig, |_ctx, inp| {
        let params = inp.subtree("params");
        let fwd = m.forward(&params, inp, true);
        maxrs::tensor::Tree::new()
            .with("embeddings", fwd.embeddings)
            .with("layers", fwd.layer_outputs.expect("layer outputs"))
            .with("logits", fwd.logits)
            .with("loss", m.loss(&params, inp, 0.0).0)
    })
    .expect("the model traces");
    let positions: Vec<i32> = (0..B * T).map(|r| (r % T + spec.position_offset) as i32).collect();
    let mut inputs = inputs(m, &p, &b);
    inputs.insert("inputs_position", HostTensor::from_i32(&[B as i64, T as i64], &positions));
    let out = crate::common::run(&program, &inputs);
    let want = reference(spec, m, &p, &b);
    check_outputs(label, m, &out, &want);
    want
}
