#!/usr/bin/env python3
"""Writes tests/data/orbax/: small checkpoints exactly as MaxText writes them, and their values (issue 47).

MaxText's own programs write every checkpoint here, on CPU, for a tiny f32 model (3 decoder
layers, a count no other size shares, so that a misplaced layer axis shows; emb 16, mlp 32,
2 heads of 8, vocab 64, sequences of 16; `MODEL_KEYS`):
- `nnx/checkpoints/`: `maxtext.trainers.pre_train.train` for 2 steps with `checkpoint_period=1`
  (MaxText's default `pure_nnx=true`): steps 0 and 1, each a `CheckpointManager` step with the
  `items` item (params under `params/params/`, `opt_state`, `step`, `nnx_aux`), OCDBT + zarr v3
  (`checkpoint_storage_use_ocdbt`, `checkpoint_storage_use_zarr3` at their defaults, true).
- `nnx_params/0/items`: `maxtext.utils.generate_param_only_checkpoint` from step 1's items:
  the parameters cast to bfloat16, as NNX state (`decoder/.../kernel/value`).
- `linen_params/0/items`: the same with `pure_nnx=false enable_nnx=false pure_nnx_decoder=false`
  (a Linen training run of 2 steps made its full state, in a temporary folder): bfloat16
  parameters under `params/params/`, the tree `load_params_from_path` restores
  (`src/maxtext/common/checkpointing.py` at MaxText e591f30).
- `losses.json`: MaxText's own continuation of the `nnx` run (a scratch copy of it, `steps=4`,
  resuming from step 1's checkpoint as MaxText does): its per-step losses from `metrics_file`,
  steps 2 and 3, full precision. A run resumed from `nnx/checkpoints/1` continues with them.
- `values/<name>.safetensors`: every array of `nnx/checkpoints/1/items`, `nnx_params/0/items`
  and `linen_params/0/items` as Orbax's own `PyTreeCheckpointer().restore` reads it back, named
  by its tree path joined with `/` (bfloat16 stays bfloat16): the golden values of tests/orbax.rs.

Usage (the venv with MaxText's dependencies; MaxText's source on --maxtext-src):
    python tools/orbax_fixture.py --maxtext-src /tmp/maxtext/src --out tests/data/orbax
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

MODEL_KEYS = [
    "base_num_decoder_layers=3",
    "base_emb_dim=16",
    "base_mlp_dim=32",
    "base_num_query_heads=2",
    "base_num_kv_heads=2",
    "head_dim=8",
    "vocab_size=64",
    "max_target_length=16",
    "per_device_batch_size=1",
    "weight_dtype=float32",
    "dtype=float32",
    "attention=dot_product",
    # The learning-rate schedule of a 4-step run in every run: the 2 saved steps and the 2
    # steps MaxText continues with (`losses.json`) are one schedule.
    "learning_rate_schedule_steps=4",
]
# CPU, one process: no JAX distributed system (MaxText would ask for a TPU coordinator).
RUN_KEYS = ["hardware=cpu", "skip_jax_distributed_system=true", "dataset_type=synthetic", "async_checkpointing=false"]
LINEN_KEYS = ["pure_nnx=false", "enable_nnx=false", "pure_nnx_decoder=false"]


def maxtext(src, module, keys):
    env = dict(os.environ, DECOUPLE_GCLOUD="TRUE", JAX_PLATFORMS="cpu", PYTHONPATH=src)
    cmd = [sys.executable, "-m", module, os.path.join(src, "maxtext/configs/base.yml"), *keys]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)


def train(src, out, run_name, extra, steps=2):
    keys = [f"run_name={run_name}", f"base_output_directory={out}", "enable_checkpointing=true", f"steps={steps}"]
    maxtext(src, "maxtext.trainers.pre_train.train", keys + ["checkpoint_period=1"] + MODEL_KEYS + RUN_KEYS + extra)
    return os.path.join(out, run_name, "checkpoints")


def continued_losses(src, tmp, nnx):
    """MaxText resuming a copy of the run's checkpoints (its newest, step 1) for steps 2 and 3."""
    shutil.copytree(nnx, os.path.join(tmp, "continued", "checkpoints"))
    metrics = os.path.join(tmp, "metrics.jsonl")
    train(src, tmp, "continued", [f"metrics_file={metrics}"], steps=4)
    with open(metrics, encoding="utf8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return {str(int(row["step"])): row["learning/loss"] for row in rows}


def param_only(src, out, run_name, full_state_items, extra):
    keys = [f"run_name={run_name}", f"base_output_directory={out}", f"load_full_state_path={full_state_items}"]
    maxtext(src, "maxtext.utils.generate_param_only_checkpoint", keys + MODEL_KEYS + RUN_KEYS + extra)
    return os.path.join(out, run_name, "checkpoints", "0")


def dump_values(items, path):
    import jax
    import numpy as np
    import orbax.checkpoint as ocp
    from safetensors.numpy import save_file

    restored = ocp.PyTreeCheckpointer().restore(items)
    arrays = {}
    for key_path, value in jax.tree_util.tree_flatten_with_path(restored)[0]:
        if isinstance(value, jax.Array):
            if jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
                value = jax.random.key_data(value)  # what the checkpoint stores of a typed key
            arrays["/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in key_path)] = np.asarray(value)
    save_file(arrays, path)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--maxtext-src", required=True, help="MaxText's src/ folder (commit e591f30)")
    p.add_argument("--out", required=True, help="the fixture folder (replaced)")
    args = p.parse_args()
    src = os.path.abspath(args.maxtext_src)
    out = os.path.abspath(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        nnx = train(src, tmp, "nnx", [])
        losses = continued_losses(src, tmp, nnx)
        nnx_params = param_only(src, tmp, "nnx_params", os.path.join(nnx, "1", "items"), [])
        linen = train(src, tmp, "linen", LINEN_KEYS)
        linen_params = param_only(src, tmp, "linen_params", os.path.join(linen, "1", "items"), LINEN_KEYS)
        for kept in ("nnx", "nnx_params", "linen_params", "values"):
            shutil.rmtree(os.path.join(out, kept), ignore_errors=True)
        shutil.copytree(nnx, os.path.join(out, "nnx", "checkpoints"))
        shutil.copytree(nnx_params, os.path.join(out, "nnx_params", "0"))
        shutil.copytree(linen_params, os.path.join(out, "linen_params", "0"))
    with open(os.path.join(out, "losses.json"), "w", encoding="utf8") as f:
        json.dump({"run": "nnx, resumed from checkpoints/1 with steps=4", "loss_by_step": losses}, f, indent=1)
        f.write("\n")
    os.makedirs(os.path.join(out, "values"))
    for name, items in [
        ("nnx_step1", "nnx/checkpoints/1/items"),
        ("nnx_params", "nnx_params/0/items"),
        ("linen_params", "linen_params/0/items"),
    ]:
        dump_values(os.path.join(out, items), os.path.join(out, "values", f"{name}.safetensors"))


if __name__ == "__main__":
    main()
