"""tests/data/orbax/storage/: one small PyTree item written by Orbax with each storage choice
MaxText offers besides its default (`checkpoint_storage_use_ocdbt` and
`checkpoint_storage_use_zarr3`, which `src/maxtext/common/checkpointing.py` at MaxText e591f30
passes to `ocp.PyTreeCheckpointHandler(use_ocdbt=..., use_zarr3=...)`): ocdbt0_zarr2,
ocdbt0_zarr3, ocdbt1_zarr2 (ocdbt1_zarr3 is the default, in tests/data/orbax/nnx*). The values
are formulas the test recomputes: `wi_0` = arange(24) / 7 as float32 [2, 3, 4], `scale` =
linspace(-1, 1, 5) as bfloat16, `embedding` = arange(24) as float32 [6, 4], `step` = 3 (an int32
jax.Array).
Each item is restored with Orbax and compared with what was written.

    python tools/orbax_storage_fixture.py --out tests/data/orbax/storage

Versions: Python 3.12, jax 0.12.0.1, orbax-checkpoint 0.12.8, tensorstore 0.1.86.
"""

import argparse
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp


def tree():
    return {
        "params": {
            "params": {
                "decoder": {
                    "layers": {"mlp": {"wi_0": {"kernel": np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 7}}},
                    "decoder_norm": {"scale": jnp.asarray(np.linspace(-1, 1, 5), dtype=jnp.bfloat16)},
                },
                "token_embedder": {"embedding": np.arange(24, dtype=np.float32).reshape(6, 4)},
            }
        },
        "step": jnp.asarray(3, dtype=jnp.int32),  # a jax.Array, as MaxText's TrainState.step
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    out = p.parse_args().out.absolute()
    for ocdbt, zarr3 in [(False, False), (False, True), (True, False)]:
        path = out / f"ocdbt{int(ocdbt)}_zarr{3 if zarr3 else 2}"
        shutil.rmtree(path, ignore_errors=True)
        checkpointer = ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=ocdbt, use_zarr3=zarr3))
        checkpointer.save(path, args=ocp.args.PyTreeSave(tree()))
        restore_args = jax.tree_util.tree_map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree())
        back = checkpointer.restore(path, args=ocp.args.PyTreeRestore(restore_args=restore_args))
        for (key, want), got in zip(jax.tree_util.tree_leaves_with_path(tree()), jax.tree_util.tree_leaves(back)):
            assert np.asarray(want).dtype == got.dtype and np.array_equal(np.asarray(want), got), key
        print(path)


if __name__ == "__main__":
    main()
