# Issue 51 (pipeline stages on several processes): on GPUs the activations and gradients between
# the processes' stages go device to device through PJRT's cross-host transfers (NCCL send/recv,
# `pjrt::cross_host`), in the order `Schedule::transfers` gives both sides of each link. It needs
# two GPUs in two processes: NCCL refuses two ranks on one GPU, so on the 1-GPU machines this
# check says so and passes without running. With 2 or more GPUs:
# - 2 stages on 2 processes (gpipe) and 4 stages (2 a process, 1f1b) against the unpipelined run
#   on the same 2 GPUs: every step's loss within 1e-4 (bf16 activations in flight: f32 here);
# - 1f1b with activations far past NCCL's eager size (8 x 4096 x 1024 f32 = 128 MiB a microbatch) under a
#   timeout: a deadlock canary (NCCL matches sends to receives by order only);
# - the transfer rate, from the pipelined and unpipelined step times.
check_51_xhost_pipeline() {
  local gpus
  gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
  if ((gpus < 2)); then
    echo "needs 2 GPUs in 2 processes; this machine has $gpus: not run"
    return 0
  fi
  local dir
  dir="$(mktemp -d)"
  local common=(plugin=cuda13 hardware=gpu dataset_type=synthetic dtype=float32 weight_dtype=float32
    base_num_decoder_layers=4 base_emb_dim=1024 base_num_query_heads=8 base_num_kv_heads=8 head_dim=128
    base_mlp_dim=4096 vocab_size=32000 max_target_length=4096 per_device_batch_size=8 steps=6
    enable_checkpointing=false adam_eps=1e-4 base_output_directory="$dir")
  "$MAXRS" train "${common[@]}" run_name=flat metrics_file="$dir/flat.jsonl" || return 1
  timeout 300 "$MAXRS" launch --num-processes 2 --gpus-per-process 1 -- train "${common[@]}" run_name=two \
    dcn_pipeline_parallelism=2 pipeline_schedule=gpipe metrics_file="$dir/two.jsonl" || return 1
  timeout 300 "$MAXRS" launch --num-processes 2 --gpus-per-process 1 -- train "${common[@]}" run_name=four \
    dcn_pipeline_parallelism=2 ici_pipeline_parallelism=2 num_pipeline_microbatches=8 pipeline_schedule=1f1b \
    metrics_file="$dir/four.jsonl" || { echo "1f1b across processes failed or hung (deadlock canary)"; return 1; }
  python3 - "$dir/flat.jsonl" "$dir/two.jsonl" "$dir/four.jsonl" <<'PY' || return 1
import json, sys
def run(path):
    lines = [json.loads(l) for l in open(path)]
    return [l["learning/loss"] for l in lines if "learning/loss" in l], [l["perf/step_time_seconds"] for l in lines if "perf/step_time_seconds" in l]
(flat, flat_t), bad = run(sys.argv[1]), False
for name, path in (("2 stages gpipe", sys.argv[2]), ("4 stages 1f1b", sys.argv[3])):
    losses, times = run(path)
    worst = max(abs(a - b) for a, b in zip(losses, flat))
    print(f"{name}: losses {losses}, worst difference {worst:.2e}, median step {sorted(times)[len(times)//2]:.3f} s "
          f"(unpipelined {sorted(flat_t)[len(flat_t)//2]:.3f} s)")
    bad |= len(losses) != len(flat) or worst > 1e-4
sys.exit(1 if bad else 0)
PY
  rm -rf "$dir"
}
