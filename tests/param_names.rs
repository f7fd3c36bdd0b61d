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

/// Scanned only: MaxText's scanned Gemma 3 stacks blocks of 6 layers, `layers.layers_<j>`
/// (models/gemma3.py:305, `Gemma3ScannableBlock`), and the layers after the last whole block as
/// `layers_remainder` (layers/decoders.py:1390). Unscanned, MaxText has one `layers_<i>` per layer
/// (layers/decoders.py:1209,1246) where maxrs keeps the blocks: not matched yet.
#[test]
fn gemma3_scanned_names_match_maxtext() {
    let want = [
        "decoder.layers.layers_0.pre_self_attention_norm.scale",
        "decoder.layers.layers_5.self_attention.query_norm.scale",
        "decoder.layers.layers_5.post_ffw_norm.scale",
        "decoder.layers_remainder.layers_3.mlp.wi_0.kernel",
    ];
    let want: Vec<String> = TOP.iter().chain(&want).map(|s| s.to_string()).collect();
    check_scan("gemma3-4b", true, &want);
}
