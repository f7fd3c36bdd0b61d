#!/usr/bin/env python3
"""One plain-JAX training run of maxrs's Llama model for `tools/gpu-bench`, on JAX's default
backend (the GPU where there is one), printed as one JSON object on stdout.

    python3 tools/gpu_bench_jax.py --attention cudnn --remat minimal_flash \
        --emb 4096 --heads 32 --kv-heads 32 --head-dim 128 --mlp 11008 --layers 8 \
        --vocab 32000 --batch 4 --seq 4096 --steps 10

The model, loss and AdamW are `tools/jax_train.py`'s (maxrs's Llama, written from maxrs's sources).
Attention is either `xla` (jax_train's einsum softmax) or `cudnn`: JAX's cuDNN fused attention,
called as MaxText's `cudnn_jax_flash_attention` calls it (`src/maxtext/layers/attention_op.py`,
MaxText e591f30: queries already scaled, `scale=1.0`, causal, BTNH, `return_residual=True`, the
output and the softmax statistics tagged `context`). Remat policies: `full` (nothing saved),
`minimal_flash` (MaxText's: the projections and `context` saved by name) and `none`. Parameters
are drawn on the device (truncated normal, fan-in scaled; not maxrs's numbers: this run measures
speed), the tokens are random.

`--profile-dir DIR` profiles the whole run (every step) into DIR (`tools/xplane_top.py` reads it).

Output: {"jax_version", "device", "timings_s": {"compile", "first_step", "median_step"},
"losses", "peak_bytes"} (peak device memory from `memory_stats`, null where the backend has none).
"""

import argparse
import contextlib
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jax_train as jt  # noqa: E402  (imports jax)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.ad_checkpoint import checkpoint_name  # noqa: E402

# MaxText's minimal_flash: the projections and `context` (maxrs's `remat_policy` in
# src/model/config.rs lists the same names).
MINIMAL_NAMES = ("query_proj", "value_proj", "key_proj", "kv_proj", "qkv_proj", "out_proj",
                 "mlpwi_0", "mlpwi_1", "mlpwi", "mlpwo")


def remat_policy(name):
    return {
        "full": jax.checkpoint_policies.nothing_saveable,
        "minimal_flash": jax.checkpoint_policies.save_only_these_names(*MINIMAL_NAMES, "context"),
    }[name]


def cudnn_attention(c, p, h, cos, sin, causal):
    del causal  # cuDNN's CAUSAL mask
    dt = c.compute_dtype
    w = lambda n: p[f"self_attention.{n}.kernel"].astype(dt)  # noqa: E731
    q = checkpoint_name(jnp.einsum("btd,dhk->bthk", h, w("query")), "query_proj")
    k = checkpoint_name(jnp.einsum("btd,dhk->bthk", h, w("key")), "key_proj")
    v = checkpoint_name(jnp.einsum("btd,dhk->bthk", h, w("value")), "value_proj")
    q = jt.rope(q, cos, sin) * (1.0 / math.sqrt(c.head_dim))
    k = jt.rope(k, cos, sin)
    out, lse = jax.nn.dot_product_attention(q, k, v, is_causal=True, scale=1.0, implementation="cudnn",
                                            return_residual=True)
    out = checkpoint_name(out, "context")
    checkpoint_name(lse, "context")
    return checkpoint_name(jnp.einsum("bthk,hkd->btd", out, w("out")), "out_proj")


def device_params(c, seed):
    """jax_train's initializers drawn on the device (fast for billions of parameters)."""
    key = jax.random.PRNGKey(seed)
    params = {}
    for i, (name, shape, _, init) in enumerate(jt.param_defs(c)):
        k = jax.random.fold_in(key, i)
        if init == "ones":
            params[name] = jnp.ones(shape, jnp.float32)
        elif init == "normal":
            params[name] = jax.random.normal(k, shape, jnp.float32)
        else:
            scale = math.sqrt(1.0 / init) / 0.8796256610342398
            params[name] = jax.random.truncated_normal(k, -2.0, 2.0, shape, jnp.float32) * scale
    return params


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a.add_argument("--attention", choices=("xla", "cudnn"), required=True)
    a.add_argument("--remat", choices=("full", "minimal_flash", "none"), required=True)
    a.add_argument("--scan-layers", choices=("true", "false"), default="true")
    for flag in ("emb", "heads", "kv-heads", "head-dim", "mlp", "layers", "vocab", "batch", "seq", "steps"):
        a.add_argument(f"--{flag}", type=int, required=True)
    a.add_argument("--profile-dir", help="write a profile of the whole run (jax.profiler.trace) under this folder")
    args = a.parse_args()
    jt.REMAT_POLICIES = ("full", "minimal_flash", "none")
    jt.remat_policy = remat_policy
    if args.attention == "cudnn":
        jt.attention = cudnn_attention
    c = jt.Config({
        "emb": args.emb, "heads": args.heads, "kv_heads": args.kv_heads, "head_dim": args.head_dim,
        "mlp": args.mlp, "layers": args.layers, "vocab": args.vocab, "eps": 1e-5,
        "rope_max_timescale": 10000.0, "logits_via_embedding": False, "dtype": "bfloat16",
        "weight_dtype": "float32", "scan_layers": args.scan_layers == "true", "remat_policy": args.remat,
        "global_batch": args.batch, "seq": args.seq, "steps": args.steps, "learning_rate": 3e-5,
        "warmup_steps_fraction": 0.1, "learning_rate_final_fraction": 0.1,
        "learning_rate_schedule_steps": -1, "adam_b1": 0.9, "adam_b2": 0.95, "adam_eps": 1e-8,
        "adam_eps_root": 0.0, "adam_weight_decay": 0.1, "gradient_clipping_threshold": 1.0,
        "z_loss_multiplier": 0.0, "num_devices": 1,
    })
    rows = np.random.default_rng(0).integers(0, c.vocab, size=(c.global_batch * 2, c.seq + 1), dtype=np.int32)
    with jax.profiler.trace(args.profile_dir) if args.profile_dir else contextlib.nullcontext():
        result = jt.train(c, device_params(c, 0), rows, log=False)
    device = jax.devices()[0]
    stats = device.memory_stats() or {}
    print(json.dumps({
        "jax_version": jax.__version__,
        "device": f"{device.platform}:{device.device_kind}",
        "timings_s": {k: result["timings_s"][k] for k in ("trace", "lower", "compile", "first_step", "median_step")},
        "losses": result["losses"],
        "peak_bytes": stats.get("peak_bytes_in_use"),
    }))


if __name__ == "__main__":
    main()
