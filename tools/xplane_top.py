#!/usr/bin/env python3
"""tools/xplane_top.py: where a GPU step's time goes, from a profile `maxrs train profiler=xplane`
wrote (`.../tensorboard/plugins/profile/<time>/<host>.xplane.pb`), as text.

    python3 tools/xplane_top.py PROFILE.xplane.pb [--top 25]

Reads the XSpace with JAX's own reader (`jax.profiler.ProfileData`, no TensorBoard needed) and
prints, for each GPU plane: the XLA modules it ran, the device's busy time (the union of its
kernels' intervals) against the time from its first kernel to its last, and the XLA operations
(from the kernels' `hlo_op` stat where the trace has no "XLA Ops" line) and the kernels that took
the most time, with their share of the busy time.
An operation's class (`cudnn` attention, `gemm`, `fusion`, `copy`, `while` ...) is read off its
name, so a table of classes says at a glance what dominates.
"""

import argparse
import re
import statistics
import sys
from collections import defaultdict


def load(path):
    try:
        from jax.profiler import ProfileData
    except ImportError as e:
        sys.exit(f"xplane_top: `from jax.profiler import ProfileData` failed ({e}): run it where JAX is installed")
    return ProfileData.from_file(path)


def klass(name):
    """A coarse class of an XLA operation or kernel, by its name."""
    n = name.lower()
    for key, label in (("cudnn", "cudnn"), ("fmha", "cudnn"), ("flash", "cudnn"), ("cublas", "gemm"),
                       ("gemm", "gemm"), ("matmul", "gemm"), ("sm90_xmma", "gemm"), ("nvjet", "gemm"),
                       ("triton", "triton"), ("while", "while"), ("copy", "copy"), ("transpose", "copy"),
                       ("all-reduce", "collective"), ("nccl", "collective"), ("memset", "memset"),
                       ("scatter", "scatter"), ("gather", "gather"), ("dynamic-update-slice", "dus"),
                       ("dynamic_update_slice", "dus"), ("reduce", "reduce"), ("fusion", "fusion"),
                       ("loop_", "fusion"), ("input_", "fusion")):
        if key in n:
            return label
    return "other"


def busy_ns(intervals):
    """Length of the union of [start, end) intervals."""
    total, end = 0, None
    for s, e in sorted(intervals):
        if end is None or s >= end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def table(title, groups, busy, top):
    rows = sorted(groups.items(), key=lambda kv: -sum(kv[1]))[:top]
    print(f"\n{title}")
    print("| ms total | share | count | ms each (median) | name |")
    print("|---|---|---|---|---|")
    for name, ds in rows:
        t = sum(ds)
        print(f"| {t / 1e6:.2f} | {100 * t / busy:.1f}% | {len(ds)} | {statistics.median(ds) / 1e6:.3f} | {name[:110]} |")


def stats_of(ev):
    """An event's stats as a dict (names to values); empty where the reader gives none."""
    try:
        return {k: v for k, v in ev.stats}
    except (TypeError, ValueError):
        return {}


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a.add_argument("profile")
    a.add_argument("--top", type=int, default=25)
    a.add_argument("--module", default="", metavar="REGEX",
                   help="only the kernels of XLA modules whose name matches (e.g. train_step: not JAX's autotuning)")
    args = a.parse_args()
    data = load(args.profile)
    planes = [p for p in data.planes if re.match(r"/device:GPU:\d+", p.name)]
    if not planes:
        sys.exit(f"xplane_top: no /device:GPU:N plane in {args.profile} (planes: {[p.name for p in data.planes]})")
    for plane in planes:
        modules, ops, kernels, intervals = defaultdict(list), defaultdict(list), defaultdict(list), []
        seen_stats = set()
        # Raw traces carry no "XLA Ops" / "XLA Modules" lines: each kernel names its HLO operation
        # and module in its stats.
        derived = {line.name for line in plane.lines} & {"XLA Ops", "XLA Modules"}
        for line in plane.lines:
            for ev in line.events:
                d = ev.duration_ns
                if line.name == "XLA Modules":
                    modules[ev.name].append(d)
                elif line.name == "XLA Ops":
                    ops[ev.name].append(d)
                elif line.name.startswith("Stream") or "stream" in line.name.lower():
                    st = stats_of(ev)
                    if args.module and not re.search(args.module, str(st.get("hlo_module", ""))):
                        continue
                    kernels[ev.name].append(d)
                    intervals.append((ev.start_ns, ev.start_ns + d))
                    seen_stats.update(st)
                    if "hlo_op" in st and "XLA Ops" not in derived:
                        ops[str(st["hlo_op"])].append(d)
                    if "hlo_module" in st and "XLA Modules" not in derived:
                        modules.setdefault(str(st["hlo_module"]), [])
        busy = busy_ns(intervals) or 1
        span = (max(e for _, e in intervals) - min(s for s, _ in intervals)) if intervals else 0
        print(f"== {plane.name} (lines: {', '.join(sorted({l.name for l in plane.lines}))[:300]})")
        print(f"kernel stats seen: {', '.join(sorted(seen_stats))[:300]}")
        for name, ds in sorted(modules.items(), key=lambda kv: -sum(kv[1])):
            if ds:
                print(f"module {name[:80]}: {len(ds)} runs, median {statistics.median(ds) / 1e6:.2f} ms, "
                      f"total {sum(ds) / 1e6:.2f} ms")
            else:
                print(f"module {name[:80]}")
        print(f"device busy {busy / 1e6:.2f} ms in kernels over {span / 1e6:.2f} ms from the first kernel to the "
              f"last ({100 * busy / span if span else 0:.1f}%)")
        by_class = defaultdict(list)
        for name, ds in (ops or kernels).items():
            by_class[klass(name)].extend(ds)
        table("XLA operations by class" if ops else "kernels by class", by_class, busy, args.top)
        if ops:
            table("XLA operations", ops, busy, args.top)
        table("kernels", kernels, busy, args.top)


if __name__ == "__main__":
    main()
