# Issue 34: the one-GPU guide's commands work on a GPU as the guide shows them. Sourced by
# tools/gpu-check (needs $MAXRS, one NVIDIA GPU, the machine's own jax-cuda13-pjrt; no network).
#
# The fenced blocks that follow a `<!-- gpu-check -->` line in docs/src/guides/one-gpu.md run with
# `maxrs` = $MAXRS, with cuda12 read as cuda13 (the build this machine has installed): `maxrs
# devices` must show the GPU memory XLA may use, and the default model's run must finish with MFU
# on its log lines (the guide says every log line on an H100/H200 ends with it).
check_34_docs() {
  local out="$GPU_CHECK_OUT/34-docs"
  mkdir -p "$out"
  local guide=docs/src/guides/one-gpu.md
  awk '/^<!-- gpu-check -->$/ { getline; block = 1; next }
       block && /^```/ { block = 0; next }
       block { print }' "$guide" | sed 's/cuda12/cuda13/g' >"$out/blocks.sh"
  echo "== the guide's blocks"
  cat "$out/blocks.sh"
  PATH="$(dirname "$MAXRS"):$PATH" bash -e -o pipefail "$out/blocks.sh" >"$out/run.log" 2>&1
  local rc=$?
  grep -E "GPU memory:|MFU:|^done:" "$out/run.log" | tail -5
  local failed=0
  if [[ $rc != 0 ]]; then
    echo "FAIL: the guide's blocks failed (rc $rc; see $out/run.log)"; failed=1
  fi
  if ! grep -q "GPU memory:" "$out/run.log"; then
    echo "FAIL: maxrs devices showed no 'GPU memory:' line"; failed=1
  fi
  if ! grep -q "completed step: 99,.*MFU:" "$out/run.log"; then
    echo "FAIL: the default model's run did not reach step 99 with MFU on its log line"; failed=1
  fi
  return $failed
}
