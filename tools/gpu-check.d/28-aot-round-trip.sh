# Issue 28: the AOT round trip on a real GPU machine, with the plugin build that machine has
# (`plugin=cuda13`: its installed jax-cuda13-pjrt, e.g. 0.11.2; no network). Sourced by
# tools/gpu-check (needs $MAXRS and one H100 80GB; the CUDA compile tools from pip's NVIDIA
# wheels or a CUDA 13 install).
#
# 1. train-compile for h100-1 with that build, saving the step (the header records the build);
# 2. maxrs train loads it (printing which plugin file: the build it was compiled with);
# 3. a just-in-time compiled run of the same settings; the printed losses must be equal.
check_28_aot_round_trip() {
  local out="$GPU_CHECK_OUT/28-aot-round-trip"
  mkdir -p "$out"
  local kind
  kind="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
  if [[ "$kind" != *H100* ]]; then
    echo "FAIL: this check compiles for h100-1 and needs an H100 (this GPU: $kind)"; return 1
  fi
  local run=(plugin=cuda13 per_device_batch_size=4 max_target_length=256 steps=20 log_period=5
    enable_checkpointing=false)
  echo "== 1. train-compile --topology=h100-1 with this machine's build"
  "$MAXRS" train-compile --topology=h100-1 "${run[@]}" compiled_trainstep_file="$out/h100-1.aot" >"$out/compile.log" 2>&1 \
    || { tail -3 "$out/compile.log"; echo "FAIL: train-compile"; return 1; }
  grep -E "GPU description|compiled for" "$out/compile.log"
  head -c 2000 "$out/h100-1.aot" | grep -a -A3 '"plugin_build"'

  echo "== 2. train with the compiled step"
  "$MAXRS" train hardware=gpu "${run[@]}" compiled_trainstep_file="$out/h100-1.aot" >"$out/aot.log" 2>&1 \
    || { tail -3 "$out/aot.log"; echo "FAIL: train with the compiled step"; return 1; }
  grep -E "^plugin:|loaded the compiled" "$out/aot.log"

  echo "== 3. the same run compiled just in time"
  "$MAXRS" train hardware=gpu "${run[@]}" >"$out/jit.log" 2>&1 \
    || { tail -3 "$out/jit.log"; echo "FAIL: the just-in-time run"; return 1; }
  grep -o "loss: [0-9.]*" "$out/aot.log" >"$out/aot.losses"
  grep -o "loss: [0-9.]*" "$out/jit.log" >"$out/jit.losses"
  paste "$out/aot.losses" "$out/jit.losses" | head -20
  if [[ ! -s "$out/aot.losses" ]] || ! cmp -s "$out/aot.losses" "$out/jit.losses"; then
    echo "FAIL: the losses of the loaded step differ from the just-in-time run's"; return 1
  fi
  echo "losses equal over $(wc -l <"$out/aot.losses") steps"
}
