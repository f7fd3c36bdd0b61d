#!/usr/bin/env python3
"""Checks `maxrs convert to-maxtext` against MaxText and writes tests/data/orbax/to_maxtext_*losses.json (issue 47).

Each `--case` (`CASES`) is the fixture's tiny model (tools/orbax_fixture.py's `MODEL_KEYS`) with
a few keys of its own (another layout, another decoder block), its MaxText losses written to its
own file (`to_maxtext_losses.json` for the fixture's model itself, the default):
1. maxrs trains the case's model for 2 steps on
   MaxText's synthetic batch (`maxtext_batch.tokens`, `dataset_type=tokens`), saving step 1.
2. `maxrs convert to-maxtext` writes it as a MaxText checkpoint (`<out>/1/items`).
3. Orbax's own restore (`PyTreeCheckpointer`, each array on this machine's first device) of what
   maxrs wrote must equal, bit for bit, the arrays of maxrs's checkpoint (its safetensors files:
   a scanned layer's arrays with their layer axis moved from 0 to MaxText's `param_scan_axis` 1),
   and `step` and both optimizer counts must be 2.
4. MaxText (`maxtext.trainers.pre_train.train`, `dataset_type=synthetic`, whose batch is the
   token file's row) resumes from it as a run's `checkpoints/` folder for steps 2 and 3; maxrs
   continues from its own checkpoint for the same steps. Their losses must agree within 1e-5.
   MaxText's are written to the case's file: tests/orbax.rs continues maxrs from its converted
   checkpoint and compares with them.
5. `maxrs convert to-maxtext --params-only` writes step 1's parameters alone; MaxText loads them
   with `load_parameters_path` for one step: its loss (`params_only_loss_by_step`, step 0) must
   be maxrs's continued run's at step 2 (the same parameters on the same batch).

Usage (from the repository root, after `cargo build`; the venv with MaxText's dependencies):
    /tmp/mtvenv/bin/python tools/maxtext_resume.py --maxtext-src /tmp/maxtext/src \
        --maxrs target/debug/maxrs --out tests/data/orbax [--case llama2_unscanned]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from orbax_fixture import MODEL_KEYS, RUN_KEYS, maxtext  # noqa: E402

# Two of MaxText's defaults that maxrs's `default` model file changes (models/default.yml).
MAXRS_KEYS = ["learning_rate=3e-5", "synthetic_progression=false"]
TOLERANCE = 1e-5
# The runs checked (`--case`): keys both programs add to the fixture's model, and the file
# MaxText's losses are written to. `llama2_unscanned` is the same model with a layer module per
# layer (`decoder/layers_<i>`): other parameter names, and other NNX random streams (the
# decoder's shared by the layers, held first by layer 0's attention op).
CASES = {
    "llama2": ([], "to_maxtext_losses.json"),
    "llama2_unscanned": (["scan_layers=false"], "to_maxtext_unscanned_losses.json"),
    "mixtral": (
        ["decoder_block=mixtral", "num_experts=4", "num_experts_per_tok=2", "base_moe_mlp_dim=32",
         "sparse_matmul=false"],
        "to_maxtext_mixtral_losses.json",
    ),
    "gemma2": (
        ["decoder_block=gemma2", "mlp_activations=[gelu,linear]", "normalization_layer_epsilon=1e-6",
         "logits_via_embedding=true", "final_logits_soft_cap=30.0", "attn_logits_soft_cap=50.0",
         "sliding_window_size=8", "use_post_attn_norm=true", "use_post_ffw_norm=true"],
        "to_maxtext_gemma2_losses.json",
    ),
    "gemma3": (
        # MaxText's gemma3 scales its queries by the model name's rule: a gemma3 model file, shrunk.
        ["model_name=gemma3-4b", "override_model_config=true", "base_num_decoder_layers=8", "sliding_window_size=8"],
        "to_maxtext_gemma3_losses.json",
    ),
    "deepseek": (
        ["decoder_block=deepseek", "attention_type=mla", "q_lora_rank=8", "kv_lora_rank=8", "qk_nope_head_dim=8",
         "qk_rope_head_dim=8", "v_head_dim=8", "num_experts=4", "num_experts_per_tok=2", "shared_experts=1",
         "base_moe_mlp_dim=32", "first_num_dense_layers=1", "routed_score_func=sigmoid", "routed_bias=true",
         "sparse_matmul=false"],
        "to_maxtext_deepseek_losses.json",
    ),
}


def model_keys(case_keys):
    """The fixture's model keys with the case's: a key the case gives replaces the fixture's."""
    given = {k.split("=", 1)[0] for k in case_keys}
    return [k for k in MODEL_KEYS if k.split("=", 1)[0] not in given] + case_keys


def losses(metrics):
    with open(metrics, encoding="utf8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return {str(int(row["step"])): row["learning/loss"] for row in rows}


def maxrs(binary, *args):
    print("+", binary, *args, flush=True)
    subprocess.run([binary, *args], check=True, stdout=subprocess.DEVNULL)


def check_restore(items, maxrs_step):
    """Orbax's restore of `items` against maxrs's checkpoint folder `maxrs_step`, bit for bit."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp
    from safetensors.numpy import load_file

    ckptr = ocp.PyTreeCheckpointer()
    meta = ckptr.metadata(items)
    tree = getattr(getattr(meta, "item_metadata", meta), "tree", meta)
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    restored = ckptr.restore(items, restore_args=jax.tree_util.tree_map(lambda _: ocp.ArrayRestoreArgs(sharding=sharding), tree))
    params = load_file(os.path.join(maxrs_step, "params.safetensors"))
    opt = load_file(os.path.join(maxrs_step, "opt_state.safetensors"))

    def maxtext_layout(key, value):
        # A scanned stack's arrays (DeepSeek's two stacks too; not Gemma 3's `layers_remainder`).
        scanned = key.startswith(("decoder.layers.", "decoder.dense_layers.", "decoder.moe_layers."))
        return np.swapaxes(value, 0, 1) if scanned else value

    def at(tree, dotted):
        for part in dotted.split("."):
            tree = tree[int(part)] if isinstance(tree, (list, tuple)) else tree[part]
        return np.asarray(tree)

    want = {f"params.params.{k}": maxtext_layout(k, v) for k, v in params.items()}
    for k, v in opt.items():
        if k != "count":
            group, key = k.split(".", 1)
            want[f"opt_state.0.{group}.params.{key}"] = maxtext_layout(key, v)
    for name, value in want.items():
        got = at(restored, name)
        assert got.dtype == value.dtype and got.shape == value.shape, (name, got.dtype, got.shape, value.shape)
        assert got.tobytes() == value.tobytes(), f"{name} differs from maxrs's checkpoint"
    for name in ("step", "opt_state.0.count", "opt_state.2.count"):
        assert int(at(restored, name)) == int(opt["count"]) == 2, (name, at(restored, name))
    print(f"Orbax restores {len(want)} arrays equal to maxrs's, and step/counts {int(opt['count'])}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--maxtext-src", required=True, help="MaxText's src/ folder (commit e591f30)")
    p.add_argument("--maxrs", required=True, help="the maxrs binary")
    p.add_argument("--out", required=True, help="the fixture folder (the case's losses file is replaced)")
    p.add_argument("--case", choices=sorted(CASES), default="llama2", help="the model's layout (default llama2)")
    args = p.parse_args()
    src, binary, out = (os.path.abspath(a) for a in (args.maxtext_src, args.maxrs, args.out))
    case_keys, losses_file = CASES[args.case]
    tokens = os.path.join(out, "maxtext_batch.tokens")
    data = ["dataset_type=tokens", f"dataset_path={tokens}"]
    with tempfile.TemporaryDirectory() as tmp:
        keys = model_keys(case_keys) + MAXRS_KEYS + data
        maxrs(binary, "train", *keys, f"base_output_directory={tmp}", "run_name=mx", "enable_checkpointing=true", "steps=2")
        converted = os.path.join(tmp, "converted")
        maxrs(binary, "convert", "to-maxtext", os.path.join(tmp, "mx"), converted)
        check_restore(os.path.join(converted, "1", "items"), os.path.join(tmp, "mx", "checkpoints", "1"))

        shutil.copytree(converted, os.path.join(tmp, "mt", "checkpoints"))
        mt_metrics = os.path.join(tmp, "mt.jsonl")
        mt_keys = ["run_name=mt", f"base_output_directory={tmp}", "enable_checkpointing=true", "steps=4"]
        mt_keys += [f"metrics_file={mt_metrics}"] + model_keys(case_keys) + RUN_KEYS
        maxtext(src, "maxtext.trainers.pre_train.train", mt_keys)
        own_metrics = os.path.join(tmp, "own.jsonl")
        own = [f"load_full_state_path={os.path.join(tmp, 'mx', 'checkpoints', '1')}", "steps=4", f"metrics_file={own_metrics}"]
        maxrs(binary, "train", *keys, *own)
        mt, mine = losses(mt_metrics), losses(own_metrics)
        assert sorted(mt) == sorted(mine) == ["2", "3"], (mt, mine)
        for step in mt:
            diff = abs(mt[step] - mine[step])
            print(f"step {step}: MaxText {mt[step]!r}, maxrs {mine[step]!r}, |diff| {diff:.3g}")
            assert diff < TOLERANCE, step

        params = os.path.join(tmp, "params")
        maxrs(binary, "convert", "to-maxtext", "--params-only", os.path.join(tmp, "mx"), params)
        params_metrics = os.path.join(tmp, "params.jsonl")
        params_keys = ["run_name=p", f"base_output_directory={tmp}", "enable_checkpointing=true", "steps=1"]
        params_keys += [f"load_parameters_path={os.path.join(params, '0', 'items')}", f"metrics_file={params_metrics}"]
        maxtext(src, "maxtext.trainers.pre_train.train", params_keys + model_keys(case_keys) + RUN_KEYS)
        first = losses(params_metrics)
        diff = abs(first["0"] - mine["2"])
        print(f"parameters only: MaxText's step 0 {first['0']!r}, maxrs's step 2 {mine['2']!r}, |diff| {diff:.3g}")
        assert list(first) == ["0"] and diff < TOLERANCE, first
    with open(os.path.join(out, losses_file), "w", encoding="utf8") as f:
        run = "MaxText resumed from maxrs's step 1 converted by `maxrs convert to-maxtext`, steps=4"
        run += "".join(f" {k}" for k in case_keys)
        params_run = "MaxText with load_parameters_path= the same step converted with --params-only, steps=1"
        json.dump({"run": run, "loss_by_step": mt, "params_only_run": params_run, "params_only_loss_by_step": first}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
