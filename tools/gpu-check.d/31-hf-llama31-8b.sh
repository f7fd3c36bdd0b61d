# Issue 31: a Llama 3.1 8B-shaped Hugging Face checkpoint (random weights, Llama 3.1's config with
# its rope_scaling) converts to maxrs, converts back to the same bytes, and trains. Sourced by
# tools/gpu-check (needs $MAXRS, one H100 80GB or larger, the machine's own jax-cuda13-pjrt; no
# network). The random checkpoint is made by maxrs itself (no torch on the GPU machine):
#
# 1. llama3.1-8b (bf16 weights) trains one step from its random init and saves a checkpoint;
# 2. `convert to-hf` writes it in Hugging Face's layout (5GB shards + index, Llama 3.1's
#    config.json: rope_scaling llama3) — the "published" checkpoint;
# 3. `convert from-hf` reads that back into a maxrs checkpoint;
# 4. `convert to-hf` again: every file must equal step 2's, byte for byte;
# 5. `maxrs train load_parameters_path=` step 3's checkpoint trains 3 steps with finite losses.
#
# The layers are the 8B model's widths at 8 of its 32 layers, to stay within the GPU checks' time
# (HF31_MODEL="model_name=llama3.1-8b" runs all 32; HF31_MODEL and HF31_RUN also let the same flow
# run on CPU with a small model: HF31_MODEL="rope_type=llama3.1" HF31_RUN="steps_are_cpu=1").
check_31_hf_llama31_8b() {
  local out="$GPU_CHECK_OUT/31-hf-llama31-8b"
  rm -rf "$out" && mkdir -p "$out"
  local model run
  read -r -a model <<<"${HF31_MODEL:-model_name=llama3.1-8b override_model_config=true base_num_decoder_layers=8}"
  read -r -a run <<<"${HF31_RUN:-plugin=cuda13 hardware=gpu}"
  [[ "${run[0]}" == steps_are_cpu=1 ]] && run=()
  local common=(weight_dtype=bfloat16 per_device_batch_size=1 max_target_length=512 log_period=1)

  echo "== 1. one step from the random init, checkpointed"
  "$MAXRS" train "${model[@]}" "${run[@]}" "${common[@]}" steps=1 enable_checkpointing=true checkpoint_period=1 \
    base_output_directory="$out/runs" run_name=init >"$out/init.log" 2>&1 \
    || { tail -3 "$out/init.log"; echo "FAIL: the initial step"; return 1; }
  local ckpt="$out/runs/init/checkpoints/0"
  [[ -d "$ckpt" ]] || { ls -R "$out/runs" | head; echo "FAIL: no checkpoint at $ckpt"; return 1; }

  echo "== 2. to Hugging Face's layout"
  local start=$SECONDS
  "$MAXRS" convert to-hf "$ckpt" "$out/hf" >"$out/to-hf.log" 2>&1 \
    || { tail -3 "$out/to-hf.log"; echo "FAIL: to-hf"; return 1; }
  echo "to-hf: $((SECONDS - start)) s; $(ls "$out/hf" | tr '\n' ' ')"
  grep -A6 '"rope_scaling"' "$out/hf/config.json"
  grep -q '"rope_type": "llama3"' "$out/hf/config.json" || { echo "FAIL: config.json has no llama3 rope_scaling"; return 1; }

  echo "== 3. from Hugging Face's layout"
  start=$SECONDS
  "$MAXRS" convert from-hf "$out/hf" "$out/maxrs" >"$out/from-hf.log" 2>&1 \
    || { tail -3 "$out/from-hf.log"; echo "FAIL: from-hf"; return 1; }
  echo "from-hf: $((SECONDS - start)) s"

  echo "== 4. back again: the same files"
  "$MAXRS" convert to-hf "$out/maxrs" "$out/hf-back" >"$out/to-hf-back.log" 2>&1 \
    || { tail -3 "$out/to-hf-back.log"; echo "FAIL: the second to-hf"; return 1; }
  local f
  for f in "$out"/hf/*; do
    cmp -s "$f" "$out/hf-back/$(basename "$f")" || { echo "FAIL: $(basename "$f") differs after the round trip"; return 1; }
  done
  echo "$(ls "$out/hf" | wc -l) files identical"

  echo "== 5. train from the converted checkpoint"
  # The model keys from-hf printed (a list value without its spaces, as one argument).
  local keys
  read -r -a keys <<<"$(grep -o 'maxrs train load_parameters_path=.*' "$out/from-hf.log" | sed 's/^maxrs train //; s/, /,/g')"
  "$MAXRS" train "${keys[@]}" "${run[@]}" "${common[@]}" steps=3 >"$out/train.log" 2>&1 \
    || { tail -3 "$out/train.log"; echo "FAIL: training from the converted checkpoint"; return 1; }
  grep -E "loaded|completed step" "$out/train.log"
  if grep -qiE "loss: (nan|inf)" "$out/train.log" || ! grep -q "completed step: 2" "$out/train.log"; then
    echo "FAIL: expected 3 steps with finite losses"; return 1
  fi
}
