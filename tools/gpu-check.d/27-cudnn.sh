# Issue 27 (cuDNN fused attention), sourced by tools/gpu-check: defines check_27_cudnn.
#
# 1. cuDNN's calls and blockwise attention, in bf16, against the exact (f32) attention: outputs
#    and q/k/v gradients, for causal MHA, GQA, a sliding window, per-row lengths and packed
#    documents (cuDNN's packed layout, alone and with GQA and a window); cuDNN must be
#    as close as the bf16 tolerance or blockwise allows (target/release/examples/cudnn_check,
#    built by `cargo build --release --example cudnn_check` and carried with target/release/maxrs).
# 2. The same training run (a small bf16 Llama, 30 steps, the same synthetic batches) with
#    attention=cudnn_flash_jax and attention=flash: the start-up line says cuDNN, and the losses
#    agree step by step within bf16 tolerance (2% relative).
# 3. The same on packed documents (dataset_type=hf, packing=true, max_segments_per_seq=4): 400
#    generated documents of 20-400 words, MaxText's first-fit packing, cuDNN's packed layout.
# Writes $GPU_CHECK_OUT/27-cudnn.losses.txt and 27-cudnn-packed.losses.txt.
check_27_cudnn() {
  local plugin="${GPU_CHECK_PLUGIN:-cuda13}" check="${CUDNN_CHECK:-$PWD/target/release/examples/cudnn_check}"
  [[ -x "$check" ]] || { echo "27-cudnn: $check is missing: cargo build --release --example cudnn_check"; return 1; }
  "$check" hardware=gpu "plugin=$plugin" || return 1
  local small=(hardware=gpu "plugin=$plugin" base_emb_dim=512 base_num_query_heads=8 base_num_kv_heads=4
    head_dim=64 base_mlp_dim=1024 base_num_decoder_layers=4 vocab_size=1024 per_device_batch_size=4
    max_target_length=1024 dtype=bfloat16 steps=30 learning_rate=1e-3 remat_policy=minimal_flash)
  local out="$GPU_CHECK_OUT/27-cudnn"
  same_losses "$out" "${small[@]}" || return 1
  python3 - "$GPU_CHECK_OUT/27-documents.jsonl" <<'PY'
import json, random, sys
words = "the of and to in that is was he for it with as his on be at by had not are but from or have an they which one you were all her she there would their we him been has when who will more no if out so said what up its about into than them can only other new some could time these two may then do first any my now such like our over man me even most made after also did many before must through back years where much your way well down should because each just those people how too little state good very make world still own see men work long get here between both life being under never day same another know while last might us great old year off come since against go came right used take three".split()
rng = random.Random(27)
with open(sys.argv[1], "w") as f:
    for _ in range(400):
        f.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(rng.randint(20, 400)))}) + "\n")
PY
  local packed=(dataset_type=hf "hf_train_files=$GPU_CHECK_OUT/27-documents.jsonl" tokenizer_path=tests/data/shakespeare-bpe512.model
    packing=true max_segments_per_seq=4 enable_data_shuffling=false)
  same_losses "$out-packed" "${small[@]}" "${packed[@]}"
}

# Trains `$@` with attention=cudnn_flash_jax and attention=flash (logs $1.cudnn.log,
# $1.flash.log): the first must use cuDNN and both must give the same losses (2% relative).
same_losses() {
  local out="$1"
  shift
  "$MAXRS" train "$@" attention=cudnn_flash_jax >"$out.cudnn.log" 2>&1 || { tail -5 "$out.cudnn.log"; return 1; }
  "$MAXRS" train "$@" attention=flash >"$out.flash.log" 2>&1 || { tail -5 "$out.flash.log"; return 1; }
  grep -q "^attention: cudnn_flash_jax -> XLA's cuDNN fused attention" "$out.cudnn.log" \
    || { echo "$out: the cuDNN run did not use cuDNN:"; grep "^attention:" "$out.cudnn.log"; return 1; }
  python3 - "$out.cudnn.log" "$out.flash.log" <<'PY' | tee "$out.losses.txt"
import re, sys
def losses(path):
    return [float(m) for m in re.findall(r"^completed step: \d+, .*, loss: ([\d.e+-]+)", open(path).read(), re.M)]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
if not a or len(a) != len(b):
    sys.exit(f"{sys.argv[1]}: {len(a)} cuDNN losses and {len(b)} blockwise losses in the logs")
worst = max(abs(x - y) / abs(y) for x, y in zip(a, b))
print(f"cudnn {a[0]:.4f} -> {a[-1]:.4f}, blockwise {b[0]:.4f} -> {b[-1]:.4f}; largest relative difference per step {worst:.2e}")
sys.exit(0 if worst < 2e-2 else 1)
PY
  [[ ${PIPESTATUS[0]} == 0 ]]
}
