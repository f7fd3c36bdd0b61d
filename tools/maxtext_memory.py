#!/usr/bin/env python3
"""MaxText's own train step, lowered for the CUDA platform on a machine without GPUs (issue 46).

The Python half of `tools/maxtext-memory`: it builds the function MaxText's `train_compile.py`
compiles (`src/maxtext/trainers/pre_train/train_compile.py` at MaxText e591f30: `train.train_step`
with the state's shardings from `get_shaped_inputs`, the state donated), lowers it with JAX for
`lowering_platforms=("cuda",)` over a mesh of host CPU devices of the target's size, and writes the
StableHLO module text (what `tools/compile_stablehlo.rs` compiles deviceless for a GPU topology)
and a JSON of the module's argument facts (shapes, dtypes, donation, bytes per device).

What differs from `train_compile.py`, and why:
- the devices are `--num-devices` host CPU devices (`--xla_force_host_platform_device_count`),
  not a GPU topology: JAX's mock GPU client needs the CUDA plugin and GPUs. Lowering only needs a
  mesh of the right shape; the target's device ids are assigned by the compile that follows.
- with `--num-slices` > 1, MaxText's `create_device_mesh` is given `compile_topology=a3` (8 GPUs
  per slice, `utils/accelerator_to_spec_map.py`) so that its config and DCN axes are those of a
  multi-host GPU job; its hybrid mesh asks each device for a `slice_index` that CPU devices lack,
  so the devices are laid out granule by granule here instead (same shape, same axes).
- JAX's cuDNN attention (`attention=cudnn_flash_jax`) asks the GPU and cuDNN for their versions
  while tracing: `--gpu` answers for them (`answer_as_gpu`); on several devices it is partitioned
  while lowering as XLA's call back into JAX would partition it (`partition_cudnn_attention`).
- nothing of the computation is replaced: model, loss, gradients and optimizer are MaxText's.
  `attention=cudnn_flash_te` needs TransformerEngine's JAX extension (CUDA-only) and
  `attention=flash` tokamax's Triton kernel, which refuses CPU devices while tracing: neither
  lowers here.

Usage (MaxText's config syntax after `--`):
    DECOUPLE_GCLOUD=TRUE PYTHONPATH=/tmp/maxtext/src python tools/maxtext_memory.py \
        --num-devices 16 --num-slices 2 --out /tmp/mt-seed -- \
        model_name=llama2-7b per_device_batch_size=4 ... attention=dot_product
MaxText's source tree is found through PYTHONPATH (`--maxtext-src` sets it): its
`configs/base.yml` is the base config.
"""

import argparse
import json
import os
import sys


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--num-devices", type=int, default=0, help="devices of the target (16 for a3mega-2)")
    p.add_argument(
        "--num-slices", type=int, default=1, help="hosts (GPU slices) of the target (2 for a3mega-2)"
    )
    p.add_argument("--out", default="", help="folder for module.mlir and module.json")
    p.add_argument("--maxtext-src", default="", help="MaxText's src/ folder (else found on PYTHONPATH)")
    p.add_argument(
        "--gpu",
        default="9.0:91000",
        help="CAPABILITY:CUDNN_VERSION that JAX's cuDNN attention (attention=cudnn_flash_jax) is told it runs on, "
        "as the GPU and cuDNN would answer (H100: 9.0; cuDNN 9.10.0: 91000)",
    )
    p.add_argument("keys", nargs="*", help="MaxText config keys, key=value")
    p.add_argument(
        "--peak",
        metavar="DUMP_DIR",
        help="instead: summarize the buffers live at the peak of each module XLA dumped to DUMP_DIR "
        "(XLA_FLAGS=--xla_dump_to=DUMP_DIR); nothing is lowered",
    )
    p.add_argument(
        "--buffers",
        type=int,
        default=0,
        metavar="N",
        help="with --peak: also list the N largest buffers live at the peak, each with the instruction "
        "that defines it (from the dumped optimized module) and its live range",
    )
    args = p.parse_args(argv)
    if args.peak:
        return args
    if not args.out:
        p.error("--out is required")
    if args.num_devices < 1 or args.num_slices < 1 or args.num_devices % args.num_slices:
        p.error(
            f"--num-devices={args.num_devices} must be a positive multiple of --num-slices={args.num_slices}"
        )
    try:
        capability, cudnn = args.gpu.split(":")
        args.gpu = (tuple(int(x) for x in capability.split(".")), int(cudnn))
    except ValueError:
        p.error(f"--gpu={args.gpu}: CAPABILITY:CUDNN_VERSION, e.g. 9.0:91000")
    bad = [k for k in args.keys if "=" not in k]
    if bad:
        p.error(f"{bad[0]!r} is not a MaxText key=value")
    return args


def main(argv):
    args = parse_args(argv)
    if args.peak:
        print_peaks(args.peak, buffers=args.buffers)
        return
    if args.maxtext_src:
        sys.path.insert(0, args.maxtext_src)
    # Before jax is imported: the host devices the mesh is built from, and MaxText's own switch
    # that replaces its Google Cloud clients (monitoring, goodput) by no-ops.
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={args.num_devices}"
    )
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ.setdefault("DECOUPLE_GCLOUD", "TRUE")

    import jax  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel
    from flax.linen import partitioning as nn_partitioning  # pylint: disable=import-outside-toplevel
    from jax.experimental import mesh_utils  # pylint: disable=import-outside-toplevel
    from jax.sharding import AxisType, Mesh  # pylint: disable=import-outside-toplevel
    import maxtext  # pylint: disable=import-outside-toplevel
    from maxtext.common.common_types import ShardMode  # pylint: disable=import-outside-toplevel
    from maxtext.configs import pyconfig  # pylint: disable=import-outside-toplevel
    from maxtext.trainers.pre_train import train, train_compile  # pylint: disable=import-outside-toplevel
    from maxtext.utils import maxtext_utils, sharding  # pylint: disable=import-outside-toplevel

    # As train_compile.main does before anything else.
    jax.config.update("jax_default_prng_impl", "unsafe_rbg")
    base_yml = os.path.join(os.path.dirname(maxtext.__file__), "configs", "base.yml")
    keys = list(args.keys)
    if not any(k.startswith("hardware=") for k in keys):
        keys.append("hardware=gpu" if args.num_slices == 1 else "hardware=gpu_multiprocess")
    if args.num_slices > 1:
        keys += ["compile_topology=a3", f"compile_topology_num_slices={args.num_slices}"]
    config = pyconfig.initialize(["maxtext_memory.py", base_yml] + keys)
    devices = jax.devices()

    def granule_mesh(ici, dcn, devs, **_):
        # mesh_utils.create_hybrid_device_mesh's layout (each slice an ICI mesh, slices placed along
        # the DCN axes), from consecutive device groups instead of `slice_index`.
        per = len(devs) // int(np.prod(dcn))
        blocks = np.empty(dcn, dtype=object)
        for g, index in enumerate(np.ndindex(*dcn)):
            blocks[index] = np.array(devs[g * per : (g + 1) * per], dtype=object).reshape(ici)
        return np.block(blocks.tolist())

    mesh_utils.create_hybrid_device_mesh = granule_mesh
    answer_as_gpu(args.gpu)
    jax.config.update("jax_remove_size_one_mesh_axis_from_type", config.remove_size_one_mesh_axis_from_type)
    axis_type = AxisType.Explicit if config.shard_mode == ShardMode.EXPLICIT else AxisType.Auto
    mesh = Mesh(
        maxtext_utils.create_device_mesh(config, devices),
        config.mesh_axes,
        axis_types=(axis_type,) * len(config.mesh_axes),
    )

    if mesh.size > 1:
        partition_cudnn_attention(jax, mesh, nn_partitioning.logical_to_mesh_axes, config.logical_axis_rules)

    # train_compile.main, up to the lowering.
    shaped_args, shaped_kwargs, state_shardings, _, model = train_compile.get_shaped_inputs(mesh, config)
    params_shardings, state_shardings = sharding.maybe_update_params_sharding_with_opt(
        config, state_shardings
    )
    input_state_shardings = sharding.build_zero1_input_state_mesh_shardings(
        config, state_shardings, params_shardings
    )
    data_sharding = sharding.get_input_data_sharding(config, mesh)
    func, in_shard, out_shard, static_argnums, donate_argnums = (
        maxtext_utils.get_functional_train_with_signature(
            train.train_step, data_sharding, input_state_shardings, model, config, params_shardings
        )
    )
    with jax.set_mesh(mesh), mesh, nn_partitioning.axis_rules(config.logical_axis_rules):
        jitted = jax.jit(
            func,
            in_shardings=in_shard,
            out_shardings=out_shard,
            static_argnums=static_argnums,
            donate_argnums=donate_argnums,
        )
        lowered = jitted.trace(*shaped_args, **shaped_kwargs).lower(lowering_platforms=("cuda",))
    text = lowered.as_text()

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "module.mlir"), "w", encoding="utf-8") as f:
        f.write(text)
    facts = module_facts(jax, shaped_args, in_shard, donate_argnums)
    facts.update(
        jax=jax.__version__,
        jaxlib=jax.lib.__version__,
        num_devices=args.num_devices,
        num_slices=args.num_slices,
        mesh={name: int(size) for name, size in mesh.shape.items()},
        keys=keys,
    )
    with open(os.path.join(args.out, "module.json"), "w", encoding="utf-8") as f:
        json.dump(facts, f, indent=1)
    print(
        f"wrote {args.out}/module.mlir ({len(text)} chars): {facts['num_arguments']} arguments, "
        f"{facts['donated_arguments']} donated, {facts['argument_bytes_per_device'] / 2**30:.2f} GiB of "
        f"arguments per device ({facts['donated_bytes_per_device'] / 2**30:.2f} GiB donated); jax {jax.__version__}"
    )


def answer_as_gpu(gpu):
    """JAX's cuDNN attention asks the local GPU for its compute capability and cuDNN for its
    version while tracing (feature gates: which masks and layouts the fused kernel takes); on CPU
    devices there is none to ask, so they are answered as the target's GPU would. The attention
    computed and its custom call are JAX's own."""
    from jax._src.cudnn import fused_attention_stablehlo as fa  # pylint: disable=import-outside-toplevel

    capability, cudnn = gpu
    fa.check_cudnn_version = lambda: cudnn
    fa.check_compute_capability = lambda c: capability >= tuple(int(x) for x in c.split("."))
    fa.is_cuda_compute_capability_equal = lambda c: capability == tuple(int(x) for x in c.split("."))


def partition_cudnn_attention(jax, mesh, logical_to_mesh_axes, rules):
    """JAX's cuDNN attention is a `custom_partitioning` op: XLA's SPMD partitioner calls back into
    the Python process that lowered it (a `CustomSPMDPartitioning` custom call) to have each
    device run cuDNN on its batch and head shard. A compile in another process has no such
    callback, so the lowering does here what that callback does: the same call per device, under
    a `shard_map` over MaxText's attention shardings (`activation_batch_attn`, `activation_heads`
    of its `logical_axis_rules`; sequence and head_dim whole, as the callback requires). Inside a
    fully manual `shard_map` JAX lowers the op's own implementation (`custom_partitioning.py`)."""
    from jax._src.cudnn import fused_attention_stablehlo as fa  # pylint: disable=import-outside-toplevel
    from jax.sharding import PartitionSpec as P  # pylint: disable=import-outside-toplevel

    batch, _, heads, _ = logical_to_mesh_axes(
        ("activation_batch_attn", None, "activation_heads", None), rules
    )
    whole = fa.dot_product_attention

    def per_device(query, key, value, **kwargs):
        if set(kwargs) - {"mask_type", "scale", "dropout_rate", "qkv_layout", "return_residual"}:
            raise NotImplementedError(
                f"cuDNN attention with {sorted(kwargs)}: only MaxText's training call is sharded"
            )
        if kwargs.get("qkv_layout") != "BTNH":
            raise NotImplementedError(
                f"cuDNN attention with qkv_layout={kwargs.get('qkv_layout')}: only BTNH"
            )
        qkv = P(batch, None, heads, None)
        out_specs = (qkv, P(batch, heads, None)) if kwargs.get("return_residual") else qkv
        return jax.shard_map(
            lambda q, k, v: whole(q, k, v, **kwargs),
            mesh=mesh,
            in_specs=(qkv, qkv, qkv),
            out_specs=out_specs,
            check_vma=False,
        )(query, key, value)

    fa.dot_product_attention = per_device


def module_facts(jax, shaped_args, in_shard, donate_argnums):
    """Each flat argument's shape, dtype, per-device bytes (from its sharding) and donation."""
    donated = {donate_argnums} if isinstance(donate_argnums, int) else set(donate_argnums)
    rows = []
    for position, (arg, shard) in enumerate(zip(shaped_args, in_shard)):
        leaves = jax.tree_util.tree_leaves_with_path(arg)
        if isinstance(shard, jax.sharding.Sharding):  # one sharding for every leaf (the batch)
            shards = [shard] * len(leaves)
        else:
            shards = (
                jax.tree_util.tree_leaves(shard, is_leaf=lambda s: s is None) if shard is not None else []
            )
        for i, (path, leaf) in enumerate(leaves):
            s = shards[i] if i < len(shards) else None
            local = s.shard_shape(leaf.shape) if s is not None else leaf.shape
            if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
                # A key array is stored as its key data (uint32[..., 2] or [..., 4]).
                data = jax.eval_shape(jax.random.key_data, leaf)
                nbytes = data.dtype.itemsize * _prod(data.shape)
            else:
                nbytes = leaf.dtype.itemsize * _prod(local)
            rows.append(
                {
                    "name": f"{position}{jax.tree_util.keystr(path)}",
                    "shape": list(leaf.shape),
                    "dtype": str(leaf.dtype),
                    "bytes_per_device": nbytes,
                    "donated": position in donated,
                }
            )
    return {
        "num_arguments": len(rows),
        "donated_arguments": sum(r["donated"] for r in rows),
        "argument_bytes_per_device": sum(r["bytes_per_device"] for r in rows),
        "donated_bytes_per_device": sum(r["bytes_per_device"] for r in rows if r["donated"]),
        "arguments": rows,
    }


def print_peaks(dump_dir, top=12, buffers=0):
    """For each module XLA dumped: its temporaries (the preallocated-temp allocation of
    `*-buffer-assignment.txt`, whose values lie at offsets in it, live over their ranges in
    `*-live-range.txt`), the most bytes the values hold at once over their own ranges and the values
    live then, grouped by shape, largest first; and the instruction where they reach the
    allocation's top, with what lies under it then, by offset. (The live-range file's own "peak"
    section counts parameters and outputs too, at another instruction.) The first is a lower bound
    of the second: a loop's carried buffer keeps its offset through the whole loop (its values, the
    loop's operand, the body's parameter and result, share it), while each value counts only over
    its own range; the gaps under the top are what lies there at other times of the loop (issue 46:
    Mixtral's scanned backward pass, 16.87 GiB at most over the values' ranges, 21.42 allocated).
    Values sharing a buffer (an update in place) count once. With `buffers`, the largest values
    live at the first instant one by one: the instruction that defines each (the optimized module's
    text, where dumped) and its live range in the schedule, which tell a saved residual (defined in
    the forward pass, read in the backward one) from a temporary the schedule keeps."""
    import glob  # pylint: disable=import-outside-toplevel
    import re  # pylint: disable=import-outside-toplevel
    from collections import defaultdict  # pylint: disable=import-outside-toplevel

    ranges = sorted(glob.glob(os.path.join(dump_dir, "*-live-range.txt")))
    if not ranges:
        sys.exit(
            f"--peak {dump_dir}: no *-live-range.txt there; compile with XLA_FLAGS=--xla_dump_to={dump_dir}"
        )
    value = re.compile(r"^ value: <\d+ (\S+?)(\{[\d,]*\})? @\d+> \(size=(\d+),offset=(\d+)\): (.*)$")
    gib = 2**30
    for path in ranges:
        temps, in_temp, allocated = [], False, 0
        with open(path.replace("-live-range.txt", "-buffer-assignment.txt"), encoding="utf-8") as f:
            for line in f:
                if line.startswith("allocation "):
                    in_temp = "preallocated-temp" in line
                    if in_temp:
                        allocated = int(re.match(r"allocation \d+: size (\d+)", line).group(1))
                elif in_temp and (m := value.match(line)):
                    temps.append((m.group(1) + (m.group(2) or "{}"), int(m.group(3)), m.group(5), int(m.group(4))))
        span = {}
        with open(path, encoding="utf-8") as f:
            for line in f:
                if m := re.match(r"^    (\S+):(\d+)-(\d+)$", line):
                    span[m.group(1)] = (int(m.group(2)), int(m.group(3)))
        temps = [(name, size, shape, offset) for name, size, shape, offset in temps if name in span]

        def live_at(t):
            return [v for v in temps if span[v[0]][0] <= t <= span[v[0]][1]]

        # Live bytes (the union of the live values' offset ranges) and the top, at each start.
        (peak, at), (reach, top_at) = (0, 0), (0, 0)
        for t in sorted({span[name][0] for name, *_ in temps}):
            covered, end, highest = 0, 0, 0
            for lo, hi in sorted((offset, offset + size) for _, size, _, offset in live_at(t)):
                covered += max(0, hi - max(lo, end))
                end, highest = max(end, hi), max(highest, hi)
            (peak, at) = max((peak, at), (covered, t))
            (reach, top_at) = max((reach, top_at), (highest, t))
        groups = defaultdict(lambda: [0, 0])
        for _, size, shape, _ in live_at(at):
            groups[shape][0] += 1
            groups[shape][1] += size
        print(
            f"{os.path.basename(path)}: temporaries {allocated / gib:.2f} GiB; the values hold at most "
            f"{peak / gib:.2f} GiB over their own ranges, at instruction {at}; by shape, largest first:"
        )
        for shape, (count, n) in sorted(groups.items(), key=lambda g: -g[1][1])[:top]:
            print(f"  {n / gib:8.2f} GiB  {count:4d} x {shape}")
        print(f"  the values reach {reach / gib:.2f} GiB at instruction {top_at}; live then, by offset:")
        for name, size, shape, offset in sorted(live_at(top_at), key=lambda v: v[3]):
            if size >= allocated / 200:
                print(f"  {offset / gib:8.2f} +{size / gib:6.3f} GiB  {name} {span[name]}  {shape}")
        if buffers:
            _print_buffers(path.replace("-live-range.txt", ".txt"), temps, span, at, buffers)


def _print_buffers(module_path, temps, span, at, count):
    """The `count` largest of `temps` live at instruction `at`: size, value, live range and the
    defining instruction's right-hand side (without its metadata) from the module text."""
    import re  # pylint: disable=import-outside-toplevel

    defined = {}
    if os.path.exists(module_path):
        with open(module_path, encoding="utf-8") as f:
            for line in f:
                if m := re.match(r"^\s*(?:ROOT )?%?(\S+) = (.*)$", line):
                    defined[m.group(1)] = re.sub(r", metadata=.*", "", m.group(2))[:160]
    spans = {name: span.get(name, (0, -1)) for name, *_ in temps}
    live = [(size, name) for name, size, *_ in temps if spans[name][0] <= at <= spans[name][1]]
    if not live:
        return
    print(f"  the {min(count, len(live))} largest, with their instruction and live range:")
    for size, name in sorted(live, key=lambda v: -v[0])[:count]:
        start, end = spans[name]
        print(f"  {size / 2**30:8.3f} GiB  {name} [{start}-{end}]  {defined.get(name.split('{')[0], '')}")


def _prod(shape):
    n = 1
    for d in shape:
        n *= int(d)
    return n


if __name__ == "__main__":
    main(sys.argv[1:])
