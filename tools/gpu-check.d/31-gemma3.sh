# Issue 31 (Gemma 3), sourced by tools/gpu-check: defines check_31_gemma3.
#
# A Gemma 3 of gemma3-12b's shape shrunk to fit one GPU with its real vocabulary, head_dim,
# window and RoPE settings (12 layers = 2 blocks of 5 local + 1 global, emb 1536, bf16,
# 2 x 4096 tokens, attention=cudnn_flash_jax) trains 20 steps: the start-up line says cuDNN
# (the local layers' 1024-token window and the global layers both go to cuDNN), the loss falls,
# and the median step time is printed. Writes $GPU_CHECK_OUT/31-gemma3.train.log.
check_31_gemma3() {
  local plugin="${GPU_CHECK_PLUGIN:-cuda13}" out="$GPU_CHECK_OUT/31-gemma3"
  "$MAXRS" train hardware=gpu "plugin=$plugin" model_name=gemma3-12b override_model_config=true \
    base_num_decoder_layers=12 base_emb_dim=1536 base_num_query_heads=8 base_num_kv_heads=4 base_mlp_dim=6144 \
    per_device_batch_size=2 max_target_length=4096 dtype=bfloat16 steps=20 learning_rate=1e-3 \
    remat_policy=full attention=cudnn_flash_jax >"$out.train.log" 2>&1 || { tail -5 "$out.train.log"; return 1; }
  grep -q "^attention: cudnn_flash_jax -> XLA's cuDNN fused attention" "$out.train.log" \
    || { echo "31-gemma3: the run did not use cuDNN:"; grep "^attention:" "$out.train.log"; return 1; }
  grep "^done:" "$out.train.log"
  python3 - "$out.train.log" <<'PY'
import re, sys
losses = [float(m) for m in re.findall(r"^completed step: \d+, .*, loss: ([\d.e+-]+)", open(sys.argv[1]).read(), re.M)]
print(f"gemma3 (12 layers, emb 1536, vocab 262144, bf16): loss {losses[0]:.3f} -> {losses[-1]:.3f}")
sys.exit(0 if len(losses) == 20 and losses[-1] < losses[0] - 0.5 else 1)
PY
}
