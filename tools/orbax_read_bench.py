"""Issue 47's read-throughput measurement, Orbax's side: writes a large train-state-shaped
checkpoint as MaxText writes its checkpoints (Orbax `PyTreeCheckpointHandler` with
`use_ocdbt=True, use_zarr3=True`, MaxText's `checkpoint_storage_use_ocdbt` /
`checkpoint_storage_use_zarr3` defaults in `src/maxtext/configs/base.yml` at e591f30), then times
Orbax's own restore of every array into host memory (numpy), median of `--repeats`.
`benches/orbax_read.rs` times maxrs's reader on the same folder.

    python tools/orbax_read_bench.py --out /tmp/obench --gib 3
    cargo bench --bench orbax_read -- /tmp/obench/ckpt

Versions used for the table in the issue note: Python 3.12, jax 0.12.0.1, orbax-checkpoint
0.12.8, tensorstore 0.1.86.
"""

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp


def tree(gib: float) -> dict:
    """Llama-like parameters (emb 4096, mlp 11008, vocab 32000, f32), scanned layers with the
    layer axis at 1 as MaxText's `param_scan_axis`; as many layers as make about `gib` GiB."""
    emb, mlp, vocab = 4096, 11008, 32000
    per_layer = (4 * emb * emb + 3 * emb * mlp) * 4
    fixed = 2 * vocab * emb * 4
    layers = max(1, round((gib * 2**30 - fixed) / per_layer))
    rng = np.random.default_rng(0)

    def draw(*shape):
        return rng.standard_normal(shape, dtype=np.float32) * 0.02

    attention = {n: {"kernel": draw(emb, layers, emb)} for n in ("query", "key", "value", "out")}
    mlp_block = {n: {"kernel": draw(emb, layers, mlp)} for n in ("wi_0", "wi_1")}
    mlp_block["wo"] = {"kernel": draw(mlp, layers, emb)}
    return {
        "params": {
            "params": {
                "token_embedder": {"embedding": draw(vocab, emb)},
                "decoder": {
                    "layers": {"self_attention": attention, "mlp": mlp_block},
                    "logits_dense": {"kernel": draw(emb, vocab)},
                },
            }
        }
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--gib", type=float, default=3.0)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    path = (a.out / "ckpt").absolute()
    if path.exists():
        shutil.rmtree(path)
    state = tree(a.gib)
    nbytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(state))
    handler = ocp.PyTreeCheckpointHandler(use_ocdbt=True, use_zarr3=True)
    checkpointer = ocp.Checkpointer(handler)
    started = time.perf_counter()
    checkpointer.save(path, args=ocp.args.PyTreeSave(state))
    saved = time.perf_counter() - started
    restore_args = jax.tree_util.tree_map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), state)
    del state
    on_disk = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    seconds = []
    for _ in range(a.repeats):
        started = time.perf_counter()
        restored = checkpointer.restore(path, args=ocp.args.PyTreeRestore(restore_args=restore_args))
        seconds.append(time.perf_counter() - started)
        assert sum(x.nbytes for x in jax.tree_util.tree_leaves(restored)) == nbytes
        del restored
    median = statistics.median(seconds)
    result = {
        "array_bytes": nbytes,
        "bytes_on_disk": on_disk,
        "save_seconds": round(saved, 3),
        "orbax_restore_seconds": [round(s, 3) for s in seconds],
        "orbax_restore_median_seconds": round(median, 3),
        "orbax_restore_gib_per_s": round(nbytes / 2**30 / median, 3),
    }
    print(json.dumps(result, indent=1))
    (a.out / "orbax_restore.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
