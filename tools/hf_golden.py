"""Golden logits from Hugging Face's own modeling code, for `tests/convert_families.rs`.

For each family: a tiny checkpoint in Hugging Face's layout whose weights come from a
deterministic generator (the same in the Rust test: an LCG per tensor seeded by the FNV-1a hash
of its name), loaded by `transformers` (`AutoModelForCausalLM`, f32, eager attention); a greedy
`generate` continues a fixed prompt, and the logits of the whole sequence are recorded. The test
writes the same checkpoint, converts it with `maxrs convert from-hf`, and checks maxrs's logits
and greedy tokens against these.

Made with (CPU only; versions as recorded in the output's "versions"):

    python3 -m venv ~/.cache/maxrs/venvs/hf-golden
    ~/.cache/maxrs/venvs/hf-golden/bin/pip install --no-deps torch==2.15.0
    ~/.cache/maxrs/venvs/hf-golden/bin/pip install transformers==5.23.0 safetensors numpy \
        filelock typing-extensions sympy networkx jinja2 fsspec
    ~/.cache/maxrs/venvs/hf-golden/bin/python tools/hf_golden.py tests/data/hf_golden.json

`tools/hf_golden.py --only FAMILY tests/data/hf_golden.json` remakes one family's entry and keeps
the others' as they are. `tools/hf_golden.py --checkpoint FAMILY DIR` writes one family's checkpoint (config.json and
model.safetensors) to DIR, e.g. to compare `maxrs decode` on it with the recorded greedy tokens.
"""

import json
import math
import struct
import sys
import tempfile

MASK = (1 << 64) - 1
PROMPT = [3, 17, 42, 99, 5, 64, 120, 7]
NEW_TOKENS = 4


def fnv1a(name):
    h = 0xCBF29CE484222325
    for b in name.encode():
        h = ((h ^ b) * 0x100000001B3) & MASK
    return h


def uniform(name, n):
    """n values in [-1, 1): an LCG (Knuth's MMIX constants) seeded by the name's hash."""
    x = fnv1a(name)
    out = []
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) & MASK
        out.append((x >> 40) / float(1 << 23) - 1.0)
    return out


def bf16(v):
    """v (an f32 value) rounded to the nearest bfloat16, ties to even."""
    bits = struct.unpack("<I", struct.pack("<f", v))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def values(name, n, plus_one_norms):
    """A tensor's values (as f32 after rounding): norms near 1 (or near 0 where the model adds
    1), embeddings in [-1, 1) and bfloat16 values, other weights in [-0.25, 0.25). (MaxText's
    tied logits round the table to bfloat16, `attend_on_embedding` in `layers/embeddings.py` at
    e591f30, so maxrs does; with a table of bfloat16 values that rounding changes nothing, and
    transformers' f32 logits are MaxText's.)"""
    u = uniform(name, n)
    if name.endswith("norm.weight"):
        return [0.2 * v for v in u] if plus_one_norms else [1.0 + 0.2 * v for v in u]
    # Gemma 4's other multipliers near 1 too, as its norms: a layer's output, the router's input
    # and each expert's weight are multiplied by them.
    if name.endswith(("layer_scalar", "router.scale", "per_expert_scale")):
        return [1.0 + 0.2 * v for v in u]
    if "embed_tokens" in name:
        return [bf16(v) for v in u]
    return [0.25 * v for v in u]


E, H, K, D, M, V = 64, 4, 2, 16, 96, 128

BASE = {
    "hidden_size": E, "num_attention_heads": H, "num_key_value_heads": K, "head_dim": D,
    "intermediate_size": M, "vocab_size": V, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "max_position_embeddings": 256, "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2,
    "pad_token_id": 0,
}


def llama_tensors(layers, moe_experts=0, qk_norm=False, tied=False, qwen3_moe=False):
    t = {"model.embed_tokens.weight": [V, E], "model.norm.weight": [E]}
    if not tied:
        t["lm_head.weight"] = [V, E]
    for l in range(layers):
        p = f"model.layers.{l}."
        t[p + "input_layernorm.weight"] = [E]
        t[p + "self_attn.q_proj.weight"] = [H * D, E]
        t[p + "self_attn.k_proj.weight"] = [K * D, E]
        t[p + "self_attn.v_proj.weight"] = [K * D, E]
        t[p + "self_attn.o_proj.weight"] = [E, H * D]
        t[p + "post_attention_layernorm.weight"] = [E]
        if qk_norm:
            t[p + "self_attn.q_norm.weight"] = [D]
            t[p + "self_attn.k_norm.weight"] = [D]
        if moe_experts:
            block, (gate, up, down) = (("mlp", ("gate_proj", "up_proj", "down_proj")) if qwen3_moe
                                       else ("block_sparse_moe", ("w1", "w3", "w2")))
            t[p + f"{block}.gate.weight"] = [moe_experts, E]
            for j in range(moe_experts):
                q = p + f"{block}.experts.{j}."
                t[q + f"{gate}.weight"] = [M, E]
                t[q + f"{up}.weight"] = [M, E]
                t[q + f"{down}.weight"] = [E, M]
        else:
            t[p + "mlp.gate_proj.weight"] = [M, E]
            t[p + "mlp.up_proj.weight"] = [M, E]
            t[p + "mlp.down_proj.weight"] = [E, M]
    return t


def gemma_tensors(layers, gemma2, kv, qk_norm=False):
    t = {"model.embed_tokens.weight": [V, E], "model.norm.weight": [E]}
    for l in range(layers):
        p = f"model.layers.{l}."
        norms = ["input_layernorm", "post_attention_layernorm"]
        if gemma2:
            norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
        for n in norms:
            t[p + n + ".weight"] = [E]
        t[p + "self_attn.q_proj.weight"] = [H * D, E]
        t[p + "self_attn.k_proj.weight"] = [kv * D, E]
        t[p + "self_attn.v_proj.weight"] = [kv * D, E]
        t[p + "self_attn.o_proj.weight"] = [E, H * D]
        if qk_norm:
            t[p + "self_attn.q_norm.weight"] = [D]
            t[p + "self_attn.k_norm.weight"] = [D]
        t[p + "mlp.gate_proj.weight"] = [M, E]
        t[p + "mlp.up_proj.weight"] = [M, E]
        t[p + "mlp.down_proj.weight"] = [E, M]
    return t


def olmo3_tensors(layers):
    """OLMo 3's post-norm layers: q_norm and k_norm over all heads' queries and keys."""
    t = {"model.embed_tokens.weight": [V, E], "model.norm.weight": [E], "lm_head.weight": [V, E]}
    for l in range(layers):
        p = f"model.layers.{l}."
        t[p + "self_attn.q_proj.weight"] = [H * D, E]
        t[p + "self_attn.k_proj.weight"] = [K * D, E]
        t[p + "self_attn.v_proj.weight"] = [K * D, E]
        t[p + "self_attn.o_proj.weight"] = [E, H * D]
        t[p + "self_attn.q_norm.weight"] = [H * D]
        t[p + "self_attn.k_norm.weight"] = [K * D]
        t[p + "post_attention_layernorm.weight"] = [E]
        t[p + "mlp.gate_proj.weight"] = [M, E]
        t[p + "mlp.up_proj.weight"] = [M, E]
        t[p + "mlp.down_proj.weight"] = [E, M]
        t[p + "post_feedforward_layernorm.weight"] = [E]
    return t


def gpt_oss_tensors(layers, experts):
    """gpt-oss's layers: biases on every attention projection, a sink per head, a biased router
    and `experts` stacked experts with interleaved gate/up columns and biases."""
    t = {"model.embed_tokens.weight": [V, E], "model.norm.weight": [E], "lm_head.weight": [V, E]}
    for l in range(layers):
        p = f"model.layers.{l}."
        t[p + "input_layernorm.weight"] = [E]
        for proj, rows in (("q_proj", H * D), ("k_proj", K * D), ("v_proj", K * D)):
            t[p + f"self_attn.{proj}.weight"] = [rows, E]
            t[p + f"self_attn.{proj}.bias"] = [rows]
        t[p + "self_attn.o_proj.weight"] = [E, H * D]
        t[p + "self_attn.o_proj.bias"] = [E]
        t[p + "self_attn.sinks"] = [H]
        t[p + "post_attention_layernorm.weight"] = [E]
        t[p + "mlp.router.weight"] = [experts, E]
        t[p + "mlp.router.bias"] = [experts]
        t[p + "mlp.experts.gate_up_proj"] = [experts, E, 2 * M]
        t[p + "mlp.experts.gate_up_proj_bias"] = [experts, 2 * M]
        t[p + "mlp.experts.down_proj"] = [experts, M, E]
        t[p + "mlp.experts.down_proj_bias"] = [experts, E]
    return t


def deepseek_tensors(layers, dense, q_lora=0, experts=0, moe=0, qk_nope=16, qk_rope=8, v_head=12, kv_lora=16):
    """DeepSeek-V3's layers: dense before `dense` (`first_k_dense_replace`), routed (`experts`
    of width `moe`, one shared) after; queries with a low-rank projection when `q_lora`."""
    t = {"model.embed_tokens.weight": [V, E], "model.norm.weight": [E], "lm_head.weight": [V, E]}
    for l in range(layers):
        p = f"model.layers.{l}."
        t[p + "input_layernorm.weight"] = [E]
        if q_lora:
            t[p + "self_attn.q_a_proj.weight"] = [q_lora, E]
            t[p + "self_attn.q_a_layernorm.weight"] = [q_lora]
            t[p + "self_attn.q_b_proj.weight"] = [H * (qk_nope + qk_rope), q_lora]
        else:
            t[p + "self_attn.q_proj.weight"] = [H * (qk_nope + qk_rope), E]
        t[p + "self_attn.kv_a_proj_with_mqa.weight"] = [kv_lora + qk_rope, E]
        t[p + "self_attn.kv_a_layernorm.weight"] = [kv_lora]
        t[p + "self_attn.kv_b_proj.weight"] = [H * (qk_nope + v_head), kv_lora]
        t[p + "self_attn.o_proj.weight"] = [E, H * v_head]
        t[p + "post_attention_layernorm.weight"] = [E]
        if l < dense:
            t[p + "mlp.gate_proj.weight"] = [M, E]
            t[p + "mlp.up_proj.weight"] = [M, E]
            t[p + "mlp.down_proj.weight"] = [E, M]
            continue
        t[p + "mlp.gate.weight"] = [experts, E]
        t[p + "mlp.gate.e_score_correction_bias"] = [experts]
        for q in [f"mlp.experts.{j}." for j in range(experts)] + ["mlp.shared_experts."]:
            t[p + q + "gate_proj.weight"] = [moe, E]
            t[p + q + "up_proj.weight"] = [moe, E]
            t[p + q + "down_proj.weight"] = [E, moe]
    return t


def gemma4_tensors(layers, global_d, global_kv, experts=0, moe=0, small=None):
    """Gemma 4's layers: sliding layers of head D and K key/value heads, every 6th global with
    heads of `global_d` and `global_kv` key/value heads whose values are their keys (no v_proj);
    QK norms (the value norm has no weight), a layer scalar; with `experts`, a router (its own
    scale and per-expert scales), fused experts of width `moe` and three more norms beside the
    shared MLP. With `small` (Gemma 4 small: `period`, `shared`, per-layer input width `ple`,
    `wide`): every `period`-th layer global with its own values, the last `shared` layers without
    key/value projections (nor k_norm), with `wide` their MLPs twice as wide, and the per-layer
    input tensors (the packed table of V rows, its projection and norm; each layer's gate,
    projection and norm)."""
    period, shared, ple, wide = small or (6, 0, 0, False)
    t = {"model.embed_tokens.weight": [V, E], "model.norm.weight": [E]}
    if ple:
        t["model.embed_tokens_per_layer.weight"] = [V, layers * ple]
        t["model.per_layer_model_projection.weight"] = [layers * ple, E]
        t["model.per_layer_projection_norm.weight"] = [ple]
    for l in range(layers):
        p = f"model.layers.{l}."
        full = (l + 1) % period == 0
        reuses = l >= layers - shared
        d, kv = (global_d, global_kv) if full else (D, K)
        for n in ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"]:
            t[p + n + ".weight"] = [E]
        t[p + "self_attn.q_proj.weight"] = [H * d, E]
        if not reuses:
            t[p + "self_attn.k_proj.weight"] = [kv * d, E]
            if not full or small:
                t[p + "self_attn.v_proj.weight"] = [kv * d, E]
            t[p + "self_attn.k_norm.weight"] = [d]
        t[p + "self_attn.o_proj.weight"] = [E, H * d]
        t[p + "self_attn.q_norm.weight"] = [d]
        m = 2 * M if reuses and wide else M
        t[p + "mlp.gate_proj.weight"] = [m, E]
        t[p + "mlp.up_proj.weight"] = [m, E]
        t[p + "mlp.down_proj.weight"] = [E, m]
        t[p + "layer_scalar"] = [1]
        if ple:
            t[p + "per_layer_input_gate.weight"] = [ple, E]
            t[p + "per_layer_projection.weight"] = [E, ple]
            t[p + "post_per_layer_input_norm.weight"] = [E]
        if experts:
            t[p + "router.proj.weight"] = [experts, E]
            t[p + "router.scale"] = [E]
            t[p + "router.per_expert_scale"] = [experts]
            t[p + "experts.gate_up_proj"] = [experts, 2 * moe, E]
            t[p + "experts.down_proj"] = [experts, E, moe]
            for n in ["pre_feedforward_layernorm_2", "post_feedforward_layernorm_1", "post_feedforward_layernorm_2"]:
                t[p + n + ".weight"] = [E]
    return t


def llama4_tensors(layers, experts, moe_step, moe, mlp):
    """Llama 4's text layers: every `moe_step`-th an MoE layer (a router, `experts` fused experts of
    width `moe` with the gate and up projections side by side, one shared expert of that width),
    the others a dense MLP of width `mlp`."""
    t = {"model.embed_tokens.weight": [V, E], "model.norm.weight": [E], "lm_head.weight": [V, E]}
    for l in range(layers):
        p = f"model.layers.{l}."
        t[p + "input_layernorm.weight"] = [E]
        t[p + "self_attn.q_proj.weight"] = [H * D, E]
        t[p + "self_attn.k_proj.weight"] = [K * D, E]
        t[p + "self_attn.v_proj.weight"] = [K * D, E]
        t[p + "self_attn.o_proj.weight"] = [E, H * D]
        t[p + "post_attention_layernorm.weight"] = [E]
        if (l + 1) % moe_step == 0:
            t[p + "feed_forward.router.weight"] = [experts, E]
            t[p + "feed_forward.experts.gate_up_proj"] = [experts, E, 2 * moe]
            t[p + "feed_forward.experts.down_proj"] = [experts, moe, E]
            for proj, shape in (("gate_proj", [moe, E]), ("up_proj", [moe, E]), ("down_proj", [E, moe])):
                t[p + f"feed_forward.shared_expert.{proj}.weight"] = shape
        else:
            for proj, shape in (("gate_proj", [mlp, E]), ("up_proj", [mlp, E]), ("down_proj", [E, mlp])):
                t[p + f"feed_forward.{proj}.weight"] = shape
    return t


def cases():
    llama = dict(BASE, architectures=["LlamaForCausalLM"], model_type="llama", num_hidden_layers=2,
                 hidden_act="silu", tie_word_embeddings=False)
    llama31 = dict(llama, rope_theta=500000.0, max_position_embeddings=131072, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192})
    mistral = dict(llama, architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=4)
    mixtral = dict(llama, architectures=["MixtralForCausalLM"], model_type="mixtral", num_hidden_layers=1,
                   num_local_experts=4, num_experts_per_tok=2, sliding_window=None,
                   rope_theta=1000000.0, router_jitter_noise=0.0)
    qwen3 = dict(llama, architectures=["Qwen3ForCausalLM"], model_type="qwen3", rms_norm_eps=1e-6,
                 rope_theta=1000000.0, tie_word_embeddings=True, use_sliding_window=False,
                 sliding_window=None)
    qwen3_moe = dict(qwen3, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
                     num_hidden_layers=1, tie_word_embeddings=False, num_experts=4, num_experts_per_tok=2,
                     moe_intermediate_size=M, intermediate_size=200, norm_topk_prob=True,
                     decoder_sparse_step=1, mlp_only_layers=[], router_aux_loss_coef=0.001)
    gemma = dict(BASE, architectures=["GemmaForCausalLM"], model_type="gemma", num_hidden_layers=2,
                 num_key_value_heads=1, hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6,
                 tie_word_embeddings=True)
    gemma2 = dict(BASE, architectures=["Gemma2ForCausalLM"], model_type="gemma2", num_hidden_layers=4,
                  hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6, tie_word_embeddings=True,
                  query_pre_attn_scalar=24, sliding_window=4, attn_logit_softcapping=5.0,
                  final_logit_softcapping=3.0)
    # YaRN as DeepSeek-V3's (mscale = mscale_all_dim = 1: the softmax scale grows, RoPE's does
    # not), written as `maxrs convert to-hf` writes it back.
    deepseek_v3 = dict(BASE, architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3",
                       num_hidden_layers=2, num_key_value_heads=H, head_dim=8, hidden_act="silu",
                       tie_word_embeddings=False, q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=16,
                       qk_rope_head_dim=8, v_head_dim=12, first_k_dense_replace=2, n_routed_experts=4,
                       num_experts_per_tok=2, n_group=1, topk_group=1, num_nextn_predict_layers=0,
                       rope_interleave=True, attention_bias=False, rope_scaling={
                           "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                           "beta_fast": 32.0, "beta_slow": 1.0, "truncate": True, "mscale": 1.0,
                           "mscale_all_dim": 1.0})
    # A dense layer, then two routed ones (4 experts of width 32, top 2, a shared one; sigmoid
    # scores with the correction bias, weights normalized and scaled), low-rank queries.
    deepseek_v3_moe = dict(deepseek_v3, num_hidden_layers=3, first_k_dense_replace=1, q_lora_rank=24,
                           n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                           moe_intermediate_size=32, routed_scaling_factor=2.5, norm_topk_prob=True,
                           scoring_func="sigmoid", topk_method="noaux_tc")
    # Gemma 3: a block of 5 sliding + 1 full layer, then 2 sliding ones (maxrs's layers_remainder);
    # global RoPE base 100 with linear factor 4 and local base 10000 (told apart over 12 positions),
    # and a query_pre_attn_scalar other than head_dim (folded into the query norm on conversion).
    gemma3 = dict(BASE, architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", num_hidden_layers=8,
                  hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6, tie_word_embeddings=True,
                  query_pre_attn_scalar=24, sliding_window=4, rope_parameters={
                      "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 100.0},
                      "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})
    del gemma3["rope_theta"]
    # OLMo 3: 8 layers (3 sliding with a window of 4, then a full one, twice); default RoPE, as
    # the pre-training revisions' (olmo3-7b-pt): with YaRN transformers 5 gives the sliding layers
    # the default RoPE, MaxText YaRN in every layer.
    # `rope_parameters` for both kinds of layer: transformers 5.23's `Olmo3Config` gives the
    # sliding layers its default base 500000 when a config states only `rope_theta`.
    olmo3 = dict(BASE, architectures=["Olmo3ForCausalLM"], model_type="olmo3", num_hidden_layers=8,
                 hidden_act="silu", rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False,
                 sliding_window=4, rope_parameters={
                     "full_attention": {"rope_type": "default", "rope_theta": 10000.0},
                     "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})
    del olmo3["rope_theta"]
    # gpt-oss: 4 layers (sliding with a window of 4, then full, twice), 4 experts of which 2 a
    # token, a clamp of 1.0 that the experts' inputs cross, and YaRN without truncation whose
    # ramp matters at head_dim 16 (base 100, factor 4, original context 8, beta_fast 2,
    # beta_slow 0.25: frequencies 0-2 blended, the rest divided by 4). max_position_embeddings
    # 4096: maxrs's YaRN covers the positions below it, and its default max_target_length is 2048.
    gpt_oss = dict(BASE, architectures=["GptOssForCausalLM"], model_type="gpt_oss", num_hidden_layers=4,
                   max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False,
                   attention_bias=True, sliding_window=4,
                   layer_types=["sliding_attention", "full_attention"] * 2, num_local_experts=4,
                   num_experts_per_tok=2, swiglu_limit=1.0, router_aux_loss_coef=0.0,
                   output_router_logits=False, rope_parameters={
                       "rope_type": "yarn", "rope_theta": 100.0, "factor": 4.0,
                       "original_max_position_embeddings": 8, "beta_fast": 2.0, "beta_slow": 0.25,
                       "truncate": False})
    del gpt_oss["rope_theta"]
    # Gemma 4: one block of 5 sliding layers (window 4) and a full one whose heads are 32 wide, 1
    # key/value head shared by keys and values, RoPE over half of it at base 100 (proportional;
    # the sliding layers' default at base 10000), logits soft-capped at 30; no per-layer
    # embeddings. The MoE variant: 4 experts of width 32, 2 a token, beside the shared MLP.
    gemma4 = dict(BASE, architectures=["Gemma4ForCausalLM"], model_type="gemma4_text", num_hidden_layers=6,
                  hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6, tie_word_embeddings=True,
                  sliding_window=4, layer_types=["sliding_attention"] * 5 + ["full_attention"],
                  global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True,
                  final_logit_softcapping=30.0, hidden_size_per_layer_input=0, num_kv_shared_layers=0,
                  enable_moe_block=False, rope_parameters={
                      "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                      "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5,
                                         "rope_theta": 100.0}})
    del gemma4["rope_theta"]
    gemma4_moe = dict(gemma4, enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32)
    # Gemma 4 small (gemma4-e2b's pattern): 10 layers, 4 sliding then a full one with heads of 32
    # and 2 key/value heads of its own, the last 4 reusing layer 5's (sliding) and layer 4's (full)
    # keys and values with double-wide MLPs, per-layer inputs 8 wide from a table of V rows.
    gemma4_small = dict(gemma4, num_hidden_layers=10,
                        layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 2,
                        attention_k_eq_v=False, hidden_size_per_layer_input=8, vocab_size_per_layer_input=V,
                        num_kv_shared_layers=4, use_double_wide_mlp=True)
    del gemma4_small["num_global_key_value_heads"]
    # Llama 4 (text): 4 layers, the last without RoPE and attending fully, the others within chunks
    # of 4 tokens (the 12-token sequence crosses them) with Llama 3.1's scaled RoPE and the QK L2
    # norm; layers 1 and 3 MoE (4 experts of width 32, one a token scaled by its logit's sigmoid,
    # and a shared one), 0 and 2 dense of width M. (Temperature tuning changes nothing before
    # position 8191.)
    llama4 = dict(BASE, architectures=["Llama4ForCausalLM"], model_type="llama4_text", num_hidden_layers=4,
                  max_position_embeddings=131072, hidden_act="silu", tie_word_embeddings=False, attention_bias=False,
                  intermediate_size=32, intermediate_size_mlp=M, num_local_experts=4, num_experts_per_tok=1,
                  interleave_moe_layer_step=2, no_rope_layer_interval=4, attention_chunk_size=4,
                  use_qk_norm=True, attn_temperature_tuning=True, floor_scale=8192, attn_scale=0.1,
                  router_jitter_noise=0.0, rope_parameters={
                      "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    del llama4["rope_theta"]
    return {
        "deepseek_v3": (deepseek_v3, deepseek_tensors(2, 2)),
        "deepseek_v3_moe": (deepseek_v3_moe, deepseek_tensors(3, 1, q_lora=24, experts=4, moe=32)),
        "llama": (llama, llama_tensors(2)),
        "llama3.1": (llama31, llama_tensors(2)),
        "mistral": (mistral, llama_tensors(2)),
        "mixtral": (mixtral, llama_tensors(1, moe_experts=4)),
        "qwen3": (qwen3, llama_tensors(2, qk_norm=True, tied=True)),
        "qwen3_moe": (qwen3_moe, llama_tensors(1, moe_experts=4, qk_norm=True, qwen3_moe=True)),
        "gemma": (gemma, gemma_tensors(2, False, 1)),
        "gemma2": (gemma2, gemma_tensors(4, True, K)),
        "gemma3": (gemma3, gemma_tensors(8, True, K, qk_norm=True)),
        "olmo3": (olmo3, olmo3_tensors(8)),
        "gpt_oss": (gpt_oss, gpt_oss_tensors(4, 4)),
        "gemma4": (gemma4, gemma4_tensors(6, 32, 1)),
        "gemma4_moe": (gemma4_moe, gemma4_tensors(6, 32, 1, experts=4, moe=32)),
        "gemma4_small": (gemma4_small, gemma4_tensors(10, 32, K, small=(5, 4, 8, True))),
        "llama4": (llama4, llama4_tensors(4, 4, 2, 32, M)),
    }


def write_checkpoint(d, config, shapes):
    import torch
    from safetensors.torch import save_file

    plus_one = config["model_type"].startswith("gemma") and not config["model_type"].startswith("gemma4")
    tensors = {}
    for name, shape in shapes.items():
        n = math.prod(shape)
        tensors[name] = torch.tensor(values(name, n, plus_one), dtype=torch.float32).reshape(shape)
    save_file(tensors, f"{d}/model.safetensors", metadata={"format": "pt"})
    with open(f"{d}/config.json", "w") as f:
        json.dump(config, f)


def main(out_path, only=None):
    import torch
    import transformers

    torch.manual_seed(0)
    golden = {"versions": {"torch": torch.__version__, "transformers": transformers.__version__},
              "prompt": PROMPT, "families": {}}
    if only is not None:
        # One family (re)made, the others' entries kept as they are.
        with open(out_path) as f:
            golden = json.load(f)
        assert golden["versions"] == {"torch": torch.__version__, "transformers": transformers.__version__}
    for family, (config, shapes) in cases().items():
        if only is not None and family != only:
            continue
        with tempfile.TemporaryDirectory() as d:
            write_checkpoint(d, config, shapes)
            model, info = transformers.AutoModelForCausalLM.from_pretrained(
                d, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
            model.eval()
            # Every tensor of the file was used, and none is left at its random initialization.
            assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
            with torch.no_grad():
                ids = torch.tensor([PROMPT])
                generated = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False,
                                           eos_token_id=None, pad_token_id=0, min_new_tokens=NEW_TOKENS)
                sequence = generated[0].tolist()
                logits = model(generated).logits[0]
        golden["families"][family] = {
            "config": config,
            "tensors": {k: v for k, v in shapes.items()},
            "sequence": sequence,
            "logits": [[float(f"{x:.7g}") for x in row] for row in logits.tolist()],
        }
        print(family, "greedy:", sequence[len(PROMPT):])
    with open(out_path, "w") as f:
        json.dump(golden, f, separators=(",", ":"))


if __name__ == "__main__":
    if sys.argv[1] == "--checkpoint":
        import os
        os.makedirs(sys.argv[3])
        write_checkpoint(sys.argv[3], *cases()[sys.argv[2]])
    elif sys.argv[1] == "--only":
        main(sys.argv[3], only=sys.argv[2])
    else:
        main(sys.argv[1])
