# Issue 33: the CUDA allocator follows JAX's variables, and `maxrs train` judges a step against
# the memory the allocator may really use. Sourced by tools/gpu-check (needs $MAXRS, one H100
# 80GB or larger, the machine's own jax-cuda13-pjrt; no network).
#
# 1. The run (llama2-7b shapes, 8 layers, batch 5 x 4096, dot-product attention,
#    minimal_flash remat: ~69 GiB per GPU) with XLA's default fraction 0.75 is refused before
#    it starts, in one line naming XLA_PYTHON_CLIENT_MEM_FRACTION;
# 2. the same run with XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 trains 3 steps;
# 3. two small runs on one GPU with XLA_PYTHON_CLIENT_PREALLOCATE=false both start and finish.
check_33_gpu_memory() {
  local out="$GPU_CHECK_OUT/33-gpu-memory"
  mkdir -p "$out"
  local big=(train configs/base.yml plugin=cuda13 hardware=gpu model_name=llama2-7b base_num_decoder_layers=8
    per_device_batch_size=5 max_target_length=4096 attention=dot_product remat_policy=minimal_flash steps=3
    log_period=1 enable_checkpointing=false)
  local failed=0

  echo "== 1. default fraction: refused by maxrs's verdict"
  env -u XLA_PYTHON_CLIENT_MEM_FRACTION -u XLA_CLIENT_MEM_FRACTION "$MAXRS" "${big[@]}" >"$out/default.log" 2>&1
  local rc=$?
  grep -E "GPU memory:|out of memory" "$out/default.log"
  if [[ $rc == 0 ]] || ! grep -q "Set XLA_PYTHON_CLIENT_MEM_FRACTION=" "$out/default.log"; then
    echo "FAIL: expected a refusal naming XLA_PYTHON_CLIENT_MEM_FRACTION (rc $rc)"; failed=1
  fi

  echo "== 2. XLA_PYTHON_CLIENT_MEM_FRACTION=0.95: trains"
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 "$MAXRS" "${big[@]}" >"$out/fraction-0.95.log" 2>&1
  rc=$?
  grep -E "GPU memory:|completed step" "$out/fraction-0.95.log" | tail -4
  if [[ $rc != 0 ]] || ! grep -q "completed step: 2" "$out/fraction-0.95.log"; then
    echo "FAIL: the batch-5 run did not train 3 steps (rc $rc; see $out/fraction-0.95.log)"; failed=1
  fi

  echo "== 3. two processes on one GPU, XLA_PYTHON_CLIENT_PREALLOCATE=false"
  local small=(train configs/base.yml plugin=cuda13 hardware=gpu steps=200 log_period=50 enable_checkpointing=false)
  XLA_PYTHON_CLIENT_PREALLOCATE=false "$MAXRS" "${small[@]}" run_name=a >"$out/share-a.log" 2>&1 &
  local a=$!
  XLA_PYTHON_CLIENT_PREALLOCATE=false "$MAXRS" "${small[@]}" run_name=b >"$out/share-b.log" 2>&1 &
  local b=$!
  wait $a; local rca=$?
  wait $b; local rcb=$?
  grep -h "GPU memory:" "$out/share-a.log" "$out/share-b.log"
  if [[ $rca != 0 || $rcb != 0 ]]; then
    echo "FAIL: a process sharing the GPU failed (rc $rca, $rcb; see $out/share-*.log)"; failed=1
  fi
  return $failed
}
