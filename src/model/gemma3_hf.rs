//! Gemma 3's Hugging Face layout (`Gemma3ForCausalLM`, `model_type: gemma3_text`), as data: its
//! tensor names and how each maps to maxrs's (`gemma3.rs`), for `maxrs convert` (whose
//! machinery, `llama_hf.rs` and `checkpoint/hf.rs`, reads such tables) and the logits-parity
//! test (`tests/gemma3_hf.rs`).
//!
//! Hugging Face layer `N` is maxrs's block `N / 6`, layer `j = N % 6` (`layers_<j>.` inside the
//! stacked `decoder.layers.`). A Hugging Face linear weight is `[out, in]`; maxrs's kernels are
//! `[in..., out...]` (a transpose and a reshape; the number is how many leading maxrs dimensions
//! form `in`). Values change where MaxText's converter (`convert_gemma3_chkpt.py`, e591f30)
//! folds Gemma's reparametrizations into the stored parameters: every RMSNorm weight `w`
//! becomes `1 + w`, the embedding is multiplied by `sqrt(hidden_size)`. Query weights are copied
//! unscaled: both apply `query_pre_attn_scalar` at run time. `lm_head.weight` is the embedding
//! (`tie_word_embeddings`, and MaxText's `logits_via_embedding`).
//!
//! `config.json` fields and maxrs keys: `hidden_size` -> `base_emb_dim`, `num_attention_heads`
//! -> `base_num_query_heads`, `num_key_value_heads` -> `base_num_kv_heads`, `head_dim`,
//! `intermediate_size` -> `base_mlp_dim`, `num_hidden_layers` -> `base_num_decoder_layers`,
//! `vocab_size`, `rms_norm_eps` -> `normalization_layer_epsilon`, `sliding_window` ->
//! `sliding_window_size`, `rope_theta` (`rope_parameters.full_attention.rope_theta`) ->
//! `rope_max_timescale`, `rope_local_base_freq` (`rope_parameters.sliding_attention`) ->
//! `local_rope_max_timescale`, `rope_scaling.factor` (linear; `full_attention.factor`) ->
//! `rope_linear_scaling_factor`. Refused when they differ from what maxrs computes:
//! `query_pre_attn_scalar` other than `head_dim` (or 168 for gemma3-27b), `layer_types` other
//! than 5 sliding + 1 full repeated, `attn_logit_softcapping` / `final_logit_softcapping` set,
//! `hidden_activation` other than `gelu_pytorch_tanh`, `use_bidirectional_attention`.

/// What converting a tensor does to its values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fold {
    /// Copied.
    None,
    /// maxrs = Hugging Face + 1 (Gemma's RMSNorm gain `1 + w`).
    PlusOne,
    /// maxrs = Hugging Face x sqrt(hidden_size) (Gemma's embedding scale).
    TimesSqrtEmb,
}

/// One layer's tensors: maxrs name (relative to `layers_<j>.`), Hugging Face name (relative to
/// `model.layers.N.`), the leading maxrs dimensions that form Hugging Face's `in` axis (`None`:
/// same shape), and the value fold.
pub const LAYER: &[(&str, &str, Option<usize>, Fold)] = &[
    ("pre_self_attention_norm.scale", "input_layernorm.weight", None, Fold::PlusOne),
    ("self_attention.query.kernel", "self_attn.q_proj.weight", Some(1), Fold::None),
    ("self_attention.key.kernel", "self_attn.k_proj.weight", Some(1), Fold::None),
    ("self_attention.value.kernel", "self_attn.v_proj.weight", Some(1), Fold::None),
    ("self_attention.out.kernel", "self_attn.o_proj.weight", Some(2), Fold::None),
    ("self_attention.query_norm.scale", "self_attn.q_norm.weight", None, Fold::PlusOne),
    ("self_attention.key_norm.scale", "self_attn.k_norm.weight", None, Fold::PlusOne),
    ("post_self_attention_norm.scale", "post_attention_layernorm.weight", None, Fold::PlusOne),
    ("pre_ffw_norm.scale", "pre_feedforward_layernorm.weight", None, Fold::PlusOne),
    ("mlp.wi_0.kernel", "mlp.gate_proj.weight", Some(1), Fold::None),
    ("mlp.wi_1.kernel", "mlp.up_proj.weight", Some(1), Fold::None),
    ("mlp.wo.kernel", "mlp.down_proj.weight", Some(1), Fold::None),
    ("post_ffw_norm.scale", "post_feedforward_layernorm.weight", None, Fold::PlusOne),
];

/// The tensors outside the layers, as `LAYER` (full names).
pub const GLOBAL: &[(&str, &str, Option<usize>, Fold)] = &[
    ("token_embedder.embedding", "model.embed_tokens.weight", None, Fold::TimesSqrtEmb),
    ("decoder.decoder_norm.scale", "model.norm.weight", None, Fold::PlusOne),
];

/// The maxrs name (scanned layout) and Hugging Face name of layer tensor `entry` of Hugging Face
/// layer `n`, with the block it is stacked at.
pub fn layer_names(n: i64, entry: &(&str, &str, Option<usize>, Fold)) -> (String, i64, String) {
    let block = n / super::gemma3::BLOCK;
    let j = n % super::gemma3::BLOCK;
    (format!("decoder.layers.layers_{j}.{}", entry.0), block, format!("model.layers.{n}.{}", entry.1))
}
