#!/usr/bin/env python3
"""Writes tests/data/orbax/nnx_streams.json: the `nnx_aux` leaves of MaxText's train state per decoder block and layout.

A MaxText `pure_nnx` checkpoint (its default) holds, besides params, optimizer state and step, an
`nnx_aux` subtree: the NNX random streams (`RngState`: each stream's `key` and `count`) of the
modules of MaxText's model tree that keep an `nnx.Rngs` (the decoder, its dropouts, a layer's
attention op, a MoE block, ...), split out by `train_state_nnx.to_checkpoint_dict`
(`src/maxtext/common/train_state_nnx.py` at MaxText e591f30). Which modules those are depends on
the decoder block and on `scan_layers`; `maxrs convert to-maxtext` must write exactly them.

For each decoder block maxrs has, scanned and unscanned, this builds MaxText's abstract train
state as its trainer does (`train_utils.setup_train_loop` with `pure_nnx`: the model from
`model_creation_utils.create_nnx_abstract_model`, `nnx.Optimizer` over it, `TrainStateNNX`,
under `nnx.eval_shape`: nothing is initialized nor trained), takes `to_checkpoint_dict`'s
`nnx_aux` and records each leaf: its path (joined with `/`), the shape and dtype it is stored
with (a typed PRNG key as its `key_data`: `uint32`, a trailing axis of 4 for `unsafe_rbg`, the
PRNG implementation MaxText's `trainers/pre_train/train.py` sets) and whether it is a key.

Each model is a MaxText model file (`model_name=`) with `override_model_config=true` and a few
layers (`LAYERS`); the streams' shapes depend only on the layer counts, so the other sizes stay
the model file's (eval_shape allocates nothing).

Usage (the venv with MaxText's dependencies, tools/README.md; MaxText's source on --maxtext-src):
    /tmp/mtvenv/bin/python tools/maxtext_nnx_streams.py --maxtext-src /tmp/maxtext/src \
        --out tests/data/orbax/nnx_streams.json
With `--blocks llama4 gemma4/gemma4-31b ...` (keys of `MODELS`) only those are run, replacing their
entries in the --out file and keeping the others.
"""

import argparse
import json
import os
import re
import subprocess
import sys

# decoder_block (or `<decoder_block>/<model file>` for another model of a block) -> (MaxText model file,
# the keys that make it small). Gemma 3's 8 layers are one scanned block of 6 and a remainder of 2;
# DeepSeek's 3 are 1 dense layer and 2 MoE layers; Llama 4's 8 are two blocks of 4
# (`inhomogeneous_layer_cycle_interval`) whose 2nd and 4th layers have experts (every layer in the
# 16-expert model); Gemma 4's 12 are two blocks of 5 local layers and a global one, with experts in
# gemma4-26b and without in gemma4-31b (scanned, MaxText names a remainder by its module class, which
# maxrs refuses).
MODELS = {
    "llama2": ("llama2-7b", ["base_num_decoder_layers=3"]),
    "mistral": ("mistral-7b", ["base_num_decoder_layers=3"]),
    "mixtral": ("mixtral-8x7b", ["base_num_decoder_layers=3"]),
    "gemma": ("gemma-2b", ["base_num_decoder_layers=3"]),
    "gemma2": ("gemma2-2b", ["base_num_decoder_layers=4"]),
    "gemma3": ("gemma3-4b", ["base_num_decoder_layers=8"]),
    "gpt3": ("gpt3-52k", ["base_num_decoder_layers=3"]),
    "qwen2": ("qwen2.5-1.5b", ["base_num_decoder_layers=3"]),
    "qwen3": ("qwen3-0.6b", ["base_num_decoder_layers=3"]),
    "qwen3_moe": ("qwen3-30b-a3b", ["base_num_decoder_layers=3"]),
    "qwen3_custom_moe": ("qwen3-custom-30b-a3b", ["base_num_decoder_layers=3"]),
    "deepseek": ("deepseek3-tiny", ["base_num_decoder_layers=3", "first_num_dense_layers=1"]),
    "olmo3": ("olmo3-7b", ["base_num_decoder_layers=4"]),
    "gpt_oss": ("gpt-oss-20b", ["base_num_decoder_layers=4"]),
    "llama4": ("llama4-17b-128e", ["base_num_decoder_layers=8"]),
    "llama4/llama4-17b-16e": ("llama4-17b-16e", ["base_num_decoder_layers=8"]),
    "gemma4": ("gemma4-26b", ["base_num_decoder_layers=12"]),
    "gemma4/gemma4-31b": ("gemma4-31b", ["base_num_decoder_layers=12"]),
}
# CPU, one process, no data (as tools/orbax_fixture.py's `RUN_KEYS`).
RUN_KEYS = [
    "hardware=cpu",
    "skip_jax_distributed_system=true",
    "dataset_type=synthetic",
    "per_device_batch_size=1",
    "max_target_length=16",
    "enable_checkpointing=false",
    "run_name=nnx_streams",
    "base_output_directory=/tmp/maxtext_nnx_streams",
]


def streams(src, model, keys):
    """The `nnx_aux` leaves of MaxText's abstract train state for `keys`, with their stored shape and dtype."""
    import jax
    from flax import nnx

    jax.config.update("jax_default_prng_impl", "unsafe_rbg")  # as trainers/pre_train/train.py does
    from maxtext.common import train_state_nnx
    from maxtext.configs import pyconfig
    from maxtext.utils import maxtext_utils, model_creation_utils, train_utils

    argv = ["streams", os.path.join(src, "maxtext/configs/base.yml"), f"model_name={model}"]
    config = pyconfig.initialize(argv + ["override_model_config=true"] + keys + RUN_KEYS)
    assert config.pure_nnx, "MaxText's default pure_nnx"
    mesh = maxtext_utils.get_mesh_from_config(config)
    create_model, model = model_creation_utils.create_nnx_abstract_model(config, mesh)
    _, tx = train_utils.create_training_optimizer(config, model)

    def create_train_state():  # train_utils.setup_train_loop's create_train_state_fn
        model = create_model()
        return train_state_nnx.TrainStateNNX(model, nnx.Optimizer(model, tx, wrt=nnx.Param))

    state = nnx.state(nnx.eval_shape(create_train_state))
    aux = train_state_nnx.to_checkpoint_dict(state).get("nnx_aux", {})
    leaves = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(aux)[0]:
        name = "/".join(["nnx_aux"] + [str(getattr(k, "key", getattr(k, "idx", k))) for k in path])
        is_key = jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)
        if is_key:
            leaf = jax.eval_shape(jax.random.key_data, leaf)
        leaves[name] = {"shape": list(leaf.shape), "dtype": str(leaf.dtype), "key": bool(is_key)}
    return dict(sorted(leaves.items()))


def versions():
    from importlib.metadata import version

    return {p: version(p) for p in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint")}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--maxtext-src", required=True, help="MaxText's src/ folder (commit e591f30)")
    p.add_argument("--out", required=True, help="the JSON file (replaced)")
    p.add_argument("--blocks", nargs="+", choices=sorted(MODELS), help="only these, merged into --out's table")
    p.add_argument("--one", nargs=2, metavar=("BLOCK", "SCAN"), help=argparse.SUPPRESS)
    args = p.parse_args()
    src = os.path.abspath(args.maxtext_src)
    sys.path.insert(0, src)
    os.environ.setdefault("DECOUPLE_GCLOUD", "TRUE")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if args.one:  # one model in its own process: MaxText's config and JAX's state stay per model
        block, scan = args.one
        model, keys = MODELS[block]
        leaves = streams(src, model, keys + [f"scan_layers={scan}"])
        with open(args.out, "w", encoding="utf8") as f:
            json.dump(leaves, f)
        return
    table = {}
    if args.blocks:
        with open(args.out, encoding="utf8") as f:
            table = json.load(f)["blocks"]
    for block, (model, keys) in MODELS.items():
        if args.blocks and block not in args.blocks:
            continue
        table.pop(block, None)
        for scan in ("true", "false"):
            one = f"{args.out}.{block.replace('/', '.')}.{scan}.tmp"
            cmd = [sys.executable, os.path.abspath(__file__), "--maxtext-src", src, "--out", one, "--one", block, scan]
            print("+", block, f"scan_layers={scan}", flush=True)
            done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if done.returncode != 0:
                error = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"
                print(f"  MaxText cannot build it: {error}", flush=True)
                table.setdefault(block, {"model_name": model, "keys": keys})[f"scan_layers={scan}"] = {"error": error}
                continue
            with open(one, encoding="utf8") as f:
                leaves = json.load(f)
            os.remove(one)
            table.setdefault(block, {"model_name": model, "keys": keys})[f"scan_layers={scan}"] = leaves
    table = {block: table[block] for block in MODELS if block in table}  # MODELS' order, merged or not
    out = {
        "what": "the nnx_aux leaves of MaxText's pure_nnx train state (tools/maxtext_nnx_streams.py)",
        "maxtext": "e591f30",
        "versions": versions(),
        "blocks": table,
    }
    write(args.out, out)


def write(path, table):
    """`table` as indented JSON with each leaf on one line."""
    text = json.dumps(table, indent=1)
    leaf = re.compile(r'\{\s*"shape": \[([^\]]*)\],\s*"dtype": ("[^"]*"),\s*"key": (true|false)\s*\}')
    one_line = '{{"shape": [{}], "dtype": {}, "key": {}}}'
    text = leaf.sub(lambda m: one_line.format(re.sub(r"\s+", " ", m[1]).strip(), m[2], m[3]), text)
    with open(path, "w", encoding="utf8") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
