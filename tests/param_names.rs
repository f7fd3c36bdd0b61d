//! Parameter names against MaxText's: per decoder family, a few names written by hand from
//! MaxText's flax module names (MaxText e591f30; the tree is `params.params.decoder.*` and
//! `params.params.token_embedder.embedding`), scanned (`decoder.layers.*`, `Decoder.scan_decoder_layers`)
//! and unscanned (`decoder.layers_<i>.*`, `name=f"layers_{lyr}"`, layers/decoders.py:1246).

use maxrs::model::Model;

/// The names of `model_name`'s parameters with `scan_layers` set as given.
fn names(model_name: &str, scan: bool) -> Vec<String> {
    let args = [format!("model_name={model_name}"), format!("scan_layers={scan}")];
    let c = maxrs::config::load(None, &args).expect("config loads");
    Model::from_config(&c).expect("the model builds").param_defs().into_iter().map(|d| d.name).collect()
}

/// Checks that `model_name`'s names hold each of `want` with `scan_layers` true and false: `{l}`
/// is `layers` scanned and `layers_0` unscanned; DeepSeek's `{d}` and `{m}` are `dense_layers` and
/// `moe_layers` scanned, `dense_layers_0` and `moe_layers_0` unscanned
/// (`name=f"{layer_prefix}_{index}"`, layers/decoders.py:1158,1171).
fn check(model_name: &str, want: &[&str]) {
    for (scan, suffix) in [(true, ""), (false, "_0")] {
        let named = |w: &&str| {
            w.replace("{l}", &format!("layers{suffix}"))
                .replace("{d}", &format!("dense_layers{suffix}"))
                .replace("{m}", &format!("moe_layers{suffix}"))
        };
        check_scan(model_name, scan, &want.iter().map(named).collect::<Vec<_>>());
    }
}

/// Checks that `model_name`'s names with `scan_layers=scan` hold each of `want`.
fn check_scan(model_name: &str, scan: bool, want: &[String]) {
    let got = names(model_name, scan);
    let missing: Vec<&String> = want.iter().filter(|w| !got.contains(w)).collect();
    assert!(missing.is_empty(), "{model_name} scan_layers={scan}: missing {missing:?}; maxrs has {got:?}");
}

/// Shared by every family: `token_embedder` (layers/embeddings.py `Embed`), `decoder_norm`
/// (layers/decoders.py:797) and, untied, `logits_dense` (layers/decoders.py:837).
const TOP: &[&str] = &["token_embedder.embedding", "decoder.decoder_norm.scale"];

#[test]
fn llama2_names_match_maxtext() {
    // models/llama2.py:66,77,106,116; attentions.py:653 (`query`); linears.py `MlpBlock` (wi_0/wi_1/wo).
    let layer = [
        "decoder.{l}.pre_self_attention_layer_norm.scale",
        "decoder.{l}.self_attention.query.kernel",
        "decoder.{l}.self_attention.out.kernel",
        "decoder.{l}.post_self_attention_layer_norm.scale",
        "decoder.{l}.mlp.wi_0.kernel",
        "decoder.{l}.mlp.wo.kernel",
        "decoder.logits_dense.kernel",
    ];
    check("llama2-7b", &[TOP, &layer].concat());
}

#[test]
fn mistral_names_match_maxtext() {
    // models/mistral.py:59,68,96,105.
    let layer = [
        "decoder.{l}.pre_self_attention_layer_norm.scale",
        "decoder.{l}.self_attention.key.kernel",
        "decoder.{l}.post_self_attention_layer_norm.scale",
        "decoder.{l}.mlp.wi_1.kernel",
    ];
    check("mistral-7b", &[TOP, &layer].concat());
}

#[test]
fn gemma_names_match_maxtext() {
    // models/gemma.py:63,71,95,103 (logits tied to the embedding: no `logits_dense`).
    let layer = [
        "decoder.{l}.pre_self_attention_norm.scale",
        "decoder.{l}.self_attention.value.kernel",
        "decoder.{l}.pre_ffw_norm.scale",
        "decoder.{l}.mlp.wi_0.kernel",
    ];
    check("gemma-2b", &[TOP, &layer].concat());
}

#[test]
fn gemma2_names_match_maxtext() {
    // models/gemma2.py:64,72,98,106,114,129 (`_local`) and 139,147,172,180,188,203 (`_global`).
    let layer = [
        "decoder.{l}.pre_self_attention_norm_local.scale",
        "decoder.{l}.self_attention_local.query.kernel",
        "decoder.{l}.post_self_attention_norm_local.scale",
        "decoder.{l}.mlp_local.wi_0.kernel",
        "decoder.{l}.post_ffw_norm_local.scale",
        "decoder.{l}.self_attention_global.query.kernel",
        "decoder.{l}.pre_ffw_norm_global.scale",
    ];
    check("gemma2-2b", &[TOP, &layer].concat());
}

#[test]
fn mixtral_names_match_maxtext() {
    // models/mixtral.py:62,71,99,108 (`MoeBlock_0`); layers/moe.py:489 (`gate`).
    let layer = [
        "decoder.{l}.pre_self_attention_layer_norm.scale",
        "decoder.{l}.self_attention.query.kernel",
        "decoder.{l}.post_self_attention_layer_norm.scale",
        "decoder.{l}.MoeBlock_0.gate.kernel",
        "decoder.{l}.MoeBlock_0.wi_0",
        "decoder.{l}.MoeBlock_0.wo",
    ];
    check("mixtral-8x7b", &[TOP, &layer].concat());
}

#[test]
fn gpt3_names_match_maxtext() {
    // models/gpt3.py:411 (`pre_self_attention_norm`, a `Gpt3LayerNorm` with `scale` and `bias`), 421 (`mlp`).
    let layer = [
        "decoder.{l}.pre_self_attention_norm.scale",
        "decoder.{l}.pre_self_attention_norm.bias",
        "decoder.{l}.mlp.wi.kernel",
    ];
    check("gpt3-6b", &[TOP, &layer].concat());
}

#[test]
fn qwen3_names_match_maxtext() {
    // models/qwen3.py:1441,1452,1481,1541; attentions.py:498,511 (`query_norm`, `key_norm`).
    let layer = [
        "decoder.{l}.pre_self_attention_layer_norm.scale",
        "decoder.{l}.self_attention.query_norm.scale",
        "decoder.{l}.self_attention.key_norm.scale",
        "decoder.{l}.post_self_attention_layer_norm.scale",
        "decoder.{l}.mlp.wi_0.kernel",
    ];
    check("qwen3-0.6b", &[TOP, &layer].concat());
}

#[test]
fn qwen3_moe_names_match_maxtext() {
    // models/qwen3.py:1604 (`moe_block`, a `RoutedMoE`); layers/moe.py:489 (`gate`).
    let layer =
        ["decoder.{l}.self_attention.query.kernel", "decoder.{l}.moe_block.gate.kernel", "decoder.{l}.moe_block.wi_0"];
    check("qwen3-30b-a3b", &[TOP, &layer].concat());
}

#[test]
fn qwen2_names_match_maxtext() {
    // models/qwen2.py:62,73,103,163; biased q/k/v (`use_bias_in_projections`, layers/attentions.py:131).
    let layer = [
        "decoder.{l}.pre_self_attention_layer_norm.scale",
        "decoder.{l}.self_attention.query.kernel",
        "decoder.{l}.self_attention.query.bias",
        "decoder.{l}.post_self_attention_layer_norm.scale",
        "decoder.{l}.mlp.wi_0.kernel",
    ];
    check("qwen2.5-1.5b", &[TOP, &layer].concat());
}

#[test]
fn qwen3_custom_moe_names_match_maxtext() {
    // models/qwen3_custom.py:127 (`latent_norm`) and its `moe_block`.
    let layer = [
        "decoder.{l}.self_attention.out.kernel",
        "decoder.{l}.latent_norm.scale",
        "decoder.{l}.moe_block.gate.kernel",
        "decoder.{l}.moe_block.wo",
    ];
    check("qwen3-custom-30b-a3b", &[TOP, &layer].concat());
}

#[test]
fn deepseek_names_match_maxtext() {
    // models/deepseek.py:87,96,144 (MLA `self_attention`), 328 (`mlp`), 418 (`DeepSeekMoeBlock_0`);
    // layers/attention_mla.py:851,864,872,895; layers/moe.py:3302 (`MoeBlock_0`), 3318 (`shared_experts`).
    let layer = [
        "decoder.{d}.pre_self_attention_layer_norm.scale",
        "decoder.{d}.self_attention.wkv_a.kernel",
        "decoder.{d}.self_attention.kv_norm.scale",
        "decoder.{d}.self_attention.wkv_b.kernel",
        "decoder.{d}.self_attention.out.kernel",
        "decoder.{d}.mlp.wi_0.kernel",
        "decoder.{m}.post_self_attention_layer_norm.scale",
        "decoder.{m}.DeepSeekMoeBlock_0.MoeBlock_0.gate.kernel",
        "decoder.{m}.DeepSeekMoeBlock_0.MoeBlock_0.wi_0",
        "decoder.{m}.DeepSeekMoeBlock_0.shared_experts.wi_0.kernel",
    ];
    check("deepseek2-16b", &[TOP, &layer].concat());
}

/// One Gemma 3 layer's parameters under its module (`Gemma3DecoderLayer`, models/gemma3.py:95,
/// 104,132,142,150,165 with `use_post_attn_norm` and `use_post_ffw_norm`; `Attention`'s query,
/// key, value, out and, with `use_qk_norm=True` (models/gemma3.py:125), query_norm and key_norm;
/// `MlpBlock`'s wi_0, wi_1 and wo).
const GEMMA3_LAYER: &[&str] = &[
    "pre_self_attention_norm.scale",
    "self_attention.query.kernel",
    "self_attention.key.kernel",
    "self_attention.value.kernel",
    "self_attention.out.kernel",
    "self_attention.query_norm.scale",
    "self_attention.key_norm.scale",
    "post_self_attention_norm.scale",
    "pre_ffw_norm.scale",
    "mlp.wi_0.kernel",
    "mlp.wi_1.kernel",
    "mlp.wo.kernel",
    "post_ffw_norm.scale",
];

/// The layer parameters (`decoder.layers*`) of a Gemma 3 of 8 layers with `scan_layers=scan`,
/// sorted.
fn gemma3_layer_names(scan: bool) -> Vec<String> {
    let args = [
        "model_name=gemma3-4b",
        "override_model_config=true",
        "base_num_decoder_layers=8",
        "sliding_window_size=4",
        "use_post_attn_norm=true",
        "use_post_ffw_norm=true",
        &format!("scan_layers={scan}"),
    ]
    .map(str::to_string);
    let c = maxrs::config::load(None, &args).expect("config loads");
    let defs = Model::from_config(&c).expect("the model builds").param_defs();
    let mut names: Vec<String> = defs.into_iter().map(|d| d.name).filter(|n| n.starts_with("decoder.layers")).collect();
    names.sort();
    names
}

/// `prefix.p` for each parameter `p` of a Gemma 3 layer, for each prefix.
fn gemma3_modules(prefixes: impl Iterator<Item = String>) -> Vec<String> {
    let mut names: Vec<String> = prefixes.flat_map(|m| GEMMA3_LAYER.iter().map(move |p| format!("{m}.{p}"))).collect();
    names.sort();
    names
}

/// Scanned, MaxText's Gemma 3 stacks blocks of 6 layers, `layers.layers_<j>` (scanned as `layers`,
/// layers/decoders.py:1341,1373; sub-layer `j` named `layers_<j>`, models/gemma3.py:305), and the
/// `8 % 6 = 2` layers after the last whole block as the module `layers_remainder`
/// (layers/decoders.py:1385,1390), again `layers_<j>` inside.
#[test]
fn gemma3_scanned_names_match_maxtext() {
    let blocks = (0..6).map(|j| format!("decoder.layers.layers_{j}"));
    let remainder = (0..2).map(|j| format!("decoder.layers_remainder.layers_{j}"));
    assert_eq!(gemma3_layer_names(true), gemma3_modules(blocks.chain(remainder)));
    check_scan("gemma3-4b", true, &TOP.iter().map(|s| s.to_string()).collect::<Vec<_>>());
}

/// Unscanned, MaxText builds one module per layer, `Gemma3DecoderLayer` (layers/decoders.py:466)
/// named `layers_<n>` for `n` in `0..num_decoder_layers` (layers/decoders.py:1205,1246): no block
/// and no `layers_remainder`, so 8 layers are `layers_0` .. `layers_7`.
#[test]
fn gemma3_unscanned_names_match_maxtext() {
    assert_eq!(gemma3_layer_names(false), gemma3_modules((0..8).map(|n| format!("decoder.layers_{n}"))));
    let want = ["decoder.layers_0.pre_self_attention_norm.scale", "decoder.layers_33.mlp.wi_0.kernel"];
    check_scan("gemma3-4b", false, &TOP.iter().chain(&want).map(|s| s.to_string()).collect::<Vec<_>>());
}

/// Unscanned Gemma 3 initializes to the scanned model's values under MaxText's per-layer names:
/// by hand, slice `b` of scanned `layers.layers_<j>.p` is unscanned `layers_<6b+j>.p`, and
/// `layers_remainder.layers_<j>.p` is `layers_<12+j>.p` (14 layers: two blocks and 2 more).
#[test]
fn gemma3_unscanned_init_is_the_scanned_init_renamed() {
    use maxrs::ir::Signature;
    use maxrs::tensor::{random, trace, Tree};
    let init = |scan: bool| {
        let args = [
            "model_name=gemma3-4b",
            "override_model_config=true",
            "base_num_decoder_layers=14",
            "sliding_window_size=4",
            "use_post_attn_norm=true",
            "use_post_ffw_norm=true",
            "base_emb_dim=16",
            "base_num_query_heads=2",
            "base_num_kv_heads=1",
            "head_dim=8",
            "base_mlp_dim=32",
            "vocab_size=32",
            &format!("scan_layers={scan}"),
        ]
        .map(str::to_string);
        let m = Model::from_config(&maxrs::config::load(None, &args).unwrap()).unwrap();
        let program = trace(&Signature::new(None), |ctx, _| m.init_params(&random::key(ctx, 3))).unwrap();
        crate::common::run(&program, &Tree::new())
    };
    let (scanned, unscanned) = (init(true), init(false));
    let mut layer_params = 0;
    for (name, value) in scanned.iter() {
        let values = value.to_f64();
        let got = |n: String| unscanned[n.as_str()].to_f64();
        if let Some((j, p)) = name.strip_prefix("decoder.layers.layers_").and_then(|r| r.split_once('.')) {
            let (j, per_block) = (j.parse::<usize>().unwrap(), values.len() / 2);
            for b in 0..2 {
                assert_eq!(
                    got(format!("decoder.layers_{}.{p}", 6 * b + j)),
                    values[b * per_block..][..per_block],
                    "{name}"
                );
            }
            if p.ends_with(".kernel") {
                assert_ne!(values[..per_block], values[per_block..], "{name}: the blocks' random values differ");
            }
            layer_params += 2;
        } else if let Some((j, p)) =
            name.strip_prefix("decoder.layers_remainder.layers_").and_then(|r| r.split_once('.'))
        {
            assert_eq!(got(format!("decoder.layers_{}.{p}", 12 + j.parse::<usize>().unwrap())), values, "{name}");
            layer_params += 1;
        } else {
            assert_eq!(got(name.to_string()), values, "{name}");
        }
    }
    assert_eq!(layer_params, 14 * GEMMA3_LAYER.len());
    assert_eq!(unscanned.len(), scanned.len() + 6 * GEMMA3_LAYER.len());
}

/// Llama 4 (models/llama4.py at e591f30): scanned, blocks of 4 layers `layers.layers_<j>`
/// (`Llama4ScannableBlock`, its `layers_{layer_id}`), each with `self_attention` and a dense
/// `mlp` (`MlpBlock`) or `Llama4MoEBlock_0` (`RoutedAndSharedMoE`: `MoeBlock_0`, `shared_experts`);
/// unscanned, `layers_<n>` for every layer. llama4-17b-128e's MoE layers are the odd ones.
#[test]
fn llama4_names_match_maxtext() {
    let moe = "Llama4MoEBlock_0";
    let layer = |l: &str| {
        vec![
            format!("decoder.{l}0.pre_self_attention_layer_norm.scale"),
            format!("decoder.{l}0.self_attention.query.kernel"),
            format!("decoder.{l}0.mlp.wi_0.kernel"),
            format!("decoder.{l}1.{moe}.MoeBlock_0.gate.kernel"),
            format!("decoder.{l}1.{moe}.MoeBlock_0.wi_1"),
            format!("decoder.{l}3.{moe}.shared_experts.wo.kernel"),
            format!("decoder.{l}3.post_self_attention_layer_norm.scale"),
            "decoder.logits_dense.kernel".to_string(),
        ]
    };
    check_scan("llama4-17b-128e", true, &layer("layers.layers_"));
    let mut unscanned = layer("layers_");
    unscanned.push(format!("decoder.layers_47.{moe}.MoeBlock_0.wo"));
    check_scan("llama4-17b-128e", false, &unscanned);
    let scanned = names("llama4-17b-128e", true);
    assert!(!scanned.iter().any(|n| n.starts_with("decoder.layers.layers_1.mlp")), "{scanned:?}");
    assert!(!scanned.iter().any(|n| n.starts_with("decoder.layers.layers_4")), "{scanned:?}");
}

/// One Gemma 4 layer's parameters as MaxText's converter lists them
/// (`GEMMA4_MAXTEXT_TO_HF_PARAM_MAPPING`'s `param_specs`,
/// `src/maxtext/checkpoint_conversion/utils/param_mapping.py` at e591f30, `-` read as `.`): every
/// layer's, the value kernel (not in a global layer with `share_kv_projections`), the dense MLP's,
/// and with experts the MoE block's (`Gemma4MoE`, models/gemma4.py).
const GEMMA4_LAYER: &[&str] = &[
    "self_attention.query.kernel",
    "self_attention.key.kernel",
    "self_attention.out.kernel",
    "self_attention.query_norm.scale",
    "self_attention.key_norm.scale",
    "pre_self_attention_norm.scale",
    "post_self_attention_norm.scale",
    "pre_ffw_norm.scale",
    "post_ffw_norm.scale",
    "layer_scalar",
];
const GEMMA4_DENSE: &[&str] = &["mlp.wi_0.kernel", "mlp.wi_1.kernel", "mlp.wo.kernel"];
const GEMMA4_MOE: &[&str] = &[
    "mlp.pre_feedforward_layernorm_2.scale",
    "mlp.post_feedforward_layernorm_1.scale",
    "mlp.post_feedforward_layernorm_2.scale",
    "mlp.pre_forward_scale_2",
    "mlp.moe_block.MoeBlock_0.gate.kernel",
    "mlp.moe_block.MoeBlock_0.wi_0",
    "mlp.moe_block.MoeBlock_0.wi_1",
    "mlp.moe_block.MoeBlock_0.wo",
    "mlp.moe_block.MoeBlock_0.per_expert_scale",
    "mlp.moe_block.shared_experts.wi_0.kernel",
    "mlp.moe_block.shared_experts.wi_1.kernel",
    "mlp.moe_block.shared_experts.wo.kernel",
];

/// `prefix.p` for each parameter of a Gemma 4 layer (`global`: no value kernel), sorted.
fn gemma4_layer(prefix: &str, global: bool, mlp: &[&str]) -> Vec<String> {
    let value = (!global).then_some("self_attention.value.kernel");
    GEMMA4_LAYER.iter().chain(mlp).copied().chain(value).map(|p| format!("{prefix}.{p}")).collect()
}

/// The decoder layers' parameter names of `model_name` with `scan_layers=scan`, sorted.
fn layer_names(model_name: &str, scan: bool) -> Vec<String> {
    let mut names: Vec<String> = names(model_name, scan).into_iter().filter(|n| n.starts_with("decoder.")).collect();
    names.retain(|n| n != "decoder.decoder_norm.scale");
    names.sort();
    names
}

/// Gemma 4's names as MaxText's converter maps them: scanned, `scanned_blocks.local_layers.*` (the
/// 5 local layers, one more scan) and `scanned_blocks.global_layer.*` (`Gemma4ScannableBlock`,
/// layers/decoders.py `_apply_gemma4_scanned_blocks`: `name="scanned_blocks"`); unscanned,
/// `layers_<n>` for each of gemma4-31b's 60 layers, the global ones (`n % 6 == 5`) without a value
/// kernel.
#[test]
fn gemma4_names_match_maxtexts_converter() {
    for (name, mlp) in [("gemma4-31b", GEMMA4_DENSE), ("gemma4-26b", GEMMA4_MOE)] {
        let mut want = gemma4_layer("decoder.scanned_blocks.local_layers", false, mlp);
        want.extend(gemma4_layer("decoder.scanned_blocks.global_layer", true, mlp));
        want.sort();
        assert_eq!(layer_names(name, true), want, "{name}");
    }
    let mut want: Vec<String> =
        (0..60).flat_map(|n| gemma4_layer(&format!("decoder.layers_{n}"), n % 6 == 5, GEMMA4_DENSE)).collect();
    want.sort();
    assert_eq!(layer_names("gemma4-31b", false), want);
    check_scan("gemma4-31b", false, &TOP.iter().map(|s| s.to_string()).collect::<Vec<_>>());
}

/// Gemma 4 small's names as MaxText's converter maps them (`GEMMA4_SMALL_MAXTEXT_TO_HF_PARAM_MAPPING`,
/// `src/maxtext/checkpoint_conversion/utils/param_mapping.py` at e591f30, `-` read as `.`; no
/// scanned layout): the per-layer embedder `decoder.per_layer_embedder.*`, then `layers_<n>` for
/// each of gemma4-e4b's 42 layers with its per-layer input gate, projection and norm, the value
/// kernel in every layer that owns its keys and values (`v_norm_with_scale` false: no value norm),
/// and no key or value kernel, nor key norm, in the last 18 (`is_shared`).
#[test]
fn gemma4_small_names_match_maxtexts_converter() {
    let per_layer = ["per_layer_input_gate.kernel", "per_layer_projection.kernel", "post_per_layer_input_norm.scale"];
    let owned = ["self_attention.key.kernel", "self_attention.key_norm.scale", "self_attention.value.kernel"];
    let mut want: Vec<String> = [
        "decoder.per_layer_embedder.embed_tokens_per_layer",
        "decoder.per_layer_embedder.per_layer_model_projection.kernel",
        "decoder.per_layer_embedder.per_layer_projection_norm.scale",
    ]
    .map(String::from)
    .to_vec();
    for n in 0..42 {
        let shares = n >= 42 - 18;
        let own = GEMMA4_LAYER.iter().filter(|p| !(shares && owned.contains(p)));
        let value = (!shares).then_some("self_attention.value.kernel");
        let layer = own.chain(GEMMA4_DENSE).chain(&per_layer).copied().chain(value);
        want.extend(layer.map(|p| format!("decoder.layers_{n}.{p}")));
    }
    want.sort();
    assert_eq!(layer_names("gemma4-e4b", false), want);
    check_scan("gemma4-e4b", false, &TOP.iter().map(|s| s.to_string()).collect::<Vec<_>>());
}
