# Issue 30 (fp8 training, quantization=fp8), sourced by tools/gpu-check: defines check_30_fp8.
#
# The same small bf16 Llama (4 layers, emb 2048, mlp 5632, 16 heads of 128, batch 4 x 2048,
# cuDNN attention so that attention adds no GEMMs) trains 20 steps unquantized and with
# quantization=fp8, with XLA's HLO dumped (--xla_dump_to). Passes when
# 1. every dot XLA is given on 8-bit operands (the quantized products: at least 21, 7
#    projections forward and 14 backward) is a GEMM on 8-bit operands in the optimized HLO: a
#    cuBLASLt `__cublas$lt$matmul$f8` call or a Triton GEMM fusion whose dot reads them, none
#    dequantized to a bf16 GEMM (issue 43; tests/fp8_gpu_hlo.rs checks the same deviceless);
# 2. both runs' losses are finite and the fp8 losses stay within 5% of the bf16 ones per step.
# Prints the GEMM counts and the median step times and TFLOP/s of both (fp8 FLOPs counted as
# bf16 FLOPs, as MaxText counts them; MFU against the bf16 peak is tools/gpu-bench's fp8 row).
# Writes $GPU_CHECK_OUT/30-fp8.{bf16,fp8}.log and the dumps under $GPU_CHECK_OUT/30-fp8.*.dump/.
check_30_fp8() {
  local plugin="${GPU_CHECK_PLUGIN:-cuda13}" out="$GPU_CHECK_OUT/30-fp8"
  local model=(hardware=gpu "plugin=$plugin" base_emb_dim=2048 base_num_query_heads=16 base_num_kv_heads=16
    head_dim=128 base_mlp_dim=5632 base_num_decoder_layers=4 vocab_size=32000 per_device_batch_size=4
    max_target_length=2048 dtype=bfloat16 steps=20 learning_rate=1e-4 attention=cudnn_flash_jax
    remat_policy=minimal_flash)
  local q
  for q in bf16 fp8; do
    local quant="quantization="
    [[ $q == fp8 ]] && quant="quantization=fp8"
    rm -rf "$out.$q.dump"
    XLA_FLAGS="${XLA_FLAGS:-} --xla_dump_to=$out.$q.dump --xla_dump_hlo_as_text" \
      "$MAXRS" train "${model[@]}" "$quant" >"$out.$q.log" 2>&1 || { tail -5 "$out.$q.log"; return 1; }
  done
  python3 - "$out" <<'PY'
import glob, re, sys
out = sys.argv[1]
def module(q, suffix):
    files = sorted(glob.glob(f"{out}.{q}.dump/*{suffix}"), key=lambda f: -len(open(f).read()))
    if not files:
        sys.exit(f"30-fp8: no *{suffix} dumped under {out}.{q}.dump")
    return open(files[0]).read()
INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(\S+) = (\(.*?\)|\S+) ([\w-]+)\((.*?)\)")
def element(types, operand):
    name, _, index = operand.partition("#")
    ty = types.get(name, "?")
    if index:  # element `index` of a tuple, which may carry an /*index=k*/ comment
        ty = re.sub(r"/\*.*?\*/", "", ty)[1:-1].split(", ")[int(index)]
    return ty.split("[")[0]
def gemms(text):
    """(GEMMs on f8 operands, other GEMMs): every dot and cuBLAS GEMM call, by its operands."""
    f8 = other = 0
    for body in re.split(r"\n\}\n", text):
        lines = [m for m in map(INSTRUCTION.match, body.splitlines()) if m]
        types = {m.group(1): m.group(2) for m in lines}
        for m in lines:
            if m.group(3) == "dot" or "__cublas$" in m.string and m.group(3) == "custom-call":
                operands = [o.split()[-1].lstrip("%") for o in m.group(4).split(",")[:2]]
                if all(element(types, o).startswith("f8") for o in operands):
                    f8 += 1
                else:
                    other += 1
    return f8, other
def run(q):
    text = open(f"{out}.{q}.log").read()
    losses = [float(m) for m in re.findall(r"^completed step: \d+, .*, loss: ([\d.e+-]+|nan|inf)", text, re.M)]
    done = re.search(r"median step ([\d.]+) s, ([\d.]+) TFLOP/s/device", text)
    return losses, done
(f8_a, other_a), (f8_b, other_b) = gemms(module("bf16", "after_optimizations.txt")), gemms(module("fp8", "after_optimizations.txt"))
given, _ = gemms(module("fp8", ".before_optimizations.txt"))
(la, da), (lb, db) = run("bf16"), run("fp8")
print(f"bf16 step: {f8_a} GEMMs on f8 operands, {other_a} others; fp8 step: {f8_b} on f8 operands (of {given} quantized products), {other_b} others")
if da and db:
    sa, sb = float(da.group(1)), float(db.group(1))
    print(f"median step: bf16 {sa:.4f} s ({da.group(2)} TFLOP/s), fp8 {sb:.4f} s ({db.group(2)} TFLOP/s): {sa / sb:.2f}x")
ok = True
if given < 21 or f8_b != given:
    print("30-fp8: the quantized products did not all become fp8 GEMMs"); ok = False
if not la or len(la) != len(lb) or not all(abs(x) < float("inf") for x in la + lb):
    print(f"30-fp8: losses missing or not finite: bf16 {la}, fp8 {lb}"); ok = False
else:
    worst = max(abs(b - a) / abs(a) for a, b in zip(la, lb))
    print(f"losses: bf16 {la[0]:.4f} -> {la[-1]:.4f}, fp8 {lb[0]:.4f} -> {lb[-1]:.4f}; largest relative difference {worst:.2e}")
    ok = ok and worst < 0.05
sys.exit(0 if ok else 1)
PY
}
