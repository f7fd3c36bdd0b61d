# Issue 31 (DeepSeek-V3), sourced by tools/gpu-check: defines check_31_deepseek.
#
# The same training run of a small bf16 DeepSeek model (multi-head latent attention at
# DeepSeek-V3's head sizes: queries and keys 128 + 64 wide, values 128, so blockwise attention
# pads the values; YaRN; routed experts with DeepSeek-V3's grouped sigmoid router and a shared
# expert; 30 steps, the same synthetic batches) with attention=dot_product, attention=flash and
# attention=cudnn_flash_jax (cuDNN's fused attention at head dimension 192, the values padded to
# it, as blockwise attention pads them): the losses agree step by step within bf16 tolerance (2%
# relative) and fall. Writes $GPU_CHECK_OUT/31-deepseek.losses.txt.
check_31_deepseek() {
  local plugin="${GPU_CHECK_PLUGIN:-cuda13}"
  local small=(hardware=gpu "plugin=$plugin" decoder_block=deepseek attention_type=mla base_emb_dim=512
    base_num_query_heads=8 base_num_kv_heads=8 base_mlp_dim=1024 base_moe_mlp_dim=1024 base_num_decoder_layers=4
    vocab_size=1024 q_lora_rank=192 kv_lora_rank=128 qk_nope_head_dim=128 qk_rope_head_dim=64 v_head_dim=128
    rope_type=yarn num_experts=8 num_experts_per_tok=2 shared_experts=1 routed_score_func=sigmoid routed_bias=true
    routed_scaling_factor=2.5 n_routing_groups=4 topk_routing_group=2 per_device_batch_size=4
    max_target_length=1024 dtype=bfloat16 steps=30 learning_rate=1e-3)
  local out="$GPU_CHECK_OUT/31-deepseek" kind
  for kind in dot_product flash cudnn_flash_jax; do
    "$MAXRS" train "${small[@]}" "attention=$kind" >"$out.$kind.log" 2>&1 || { tail -5 "$out.$kind.log"; return 1; }
  done
  python3 - "$out.dot_product.log" "$out.flash.log" "$out.cudnn_flash_jax.log" <<'PY' | tee "$out.losses.txt"
import re, sys
def losses(path):
    text = open(path).read()
    return [float(m) for m in re.findall(r"^completed step: \d+, .*, loss: ([\d.e+-]+)", text, re.M)]
runs = [losses(p) for p in sys.argv[1:]]
base = runs[0]
ok = bool(base)
for name, run in zip(["flash", "cudnn_flash_jax"], runs[1:]):
    if len(run) != len(base):
        sys.exit(f"31-deepseek: {len(run)} {name} losses and {len(base)} dot_product losses")
    worst = max(abs(x - y) / abs(y) for x, y in zip(run, base))
    print(f"{name} {run[0]:.4f} -> {run[-1]:.4f} vs dot_product {base[0]:.4f} -> {base[-1]:.4f}; largest relative difference per step {worst:.2e}")
    ok = ok and worst < 2e-2 and run[-1] < run[0]
sys.exit(0 if ok else 1)
PY
  [[ ${PIPESTATUS[0]} == 0 ]]
}
