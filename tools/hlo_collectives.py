#!/usr/bin/env python3
"""The bytes a compiled program's collectives move per device, from an optimized HLO text dump.

    XLA_FLAGS="--xla_dump_to=DIR --xla_dump_hlo_as_text" maxrs train-compile ...
    python3 tools/hlo_collectives.py DIR/module_*after_optimizations.txt [--list] [--minus OTHER.txt]

What it counts: every all-gather, reduce-scatter, all-to-all, collective-permute and all-reduce
(their `-start` forms and the ones XLA wraps in async computations; `-done` moves nothing), each
as many times as it runs: the computations are walked from ENTRY, a while loop's body counted
its `known_trip_count` times (a loop without one counts once, and is said on stderr; a
conditional's branches each once: an upper bound). An
instruction's bytes are per device, from its operands' shapes and dtypes (combined collectives:
each operand), with `n` the size of its replica group, as a ring algorithm moves them (what
each device sends, which is what it receives):

    all-gather          (n - 1) x operand      (every other device's shard)
    reduce-scatter      (n - 1) / n x operand  (every shard but its own)
    all-to-all          (n - 1) / n x operand
    collective-permute  operand                (one neighbour's block)
    all-reduce          2 (n - 1) / n x operand (a reduce-scatter and an all-gather)

Each operand is put in one of two columns: `strategy`, a collective the program wrote itself
(maxrs's context-parallel strategies are manual computations: their collectives carry no
`is_spmd_generated` attribute, and keep their `call.N/` op name when XLA's combiners merge them
with the partitioner's), or `partitioner`, one the SPMD partitioner added (the parameters'
all-gathers and their gradients' reduce-scatters over fsdp-like axes, the loss's all-reduces).

`--minus OTHER` subtracts OTHER's counts: a 2-layer program minus the same 1-layer program is
one layer's collectives. `--list` prints every collective with its run count, op name and bytes.
The output is a markdown table in MiB (2^20 bytes).
"""

import argparse
import re
import sys
from collections import defaultdict

KINDS = ["all-gather", "reduce-scatter", "all-to-all", "collective-permute", "all-reduce"]
# Bytes per element; sub-byte integers round up to a byte per element (none move here).
DTYPE_BYTES = {
    "pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "s32": 4, "u32": 4, "s64": 8, "u64": 8,
    "f16": 2, "bf16": 2, "f32": 4, "f64": 8, "c64": 8, "c128": 16, "token": 0,
    "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3fnuz": 1, "f8e5m2fnuz": 1, "f8e4m3b11fnuz": 1, "f8e4m3": 1, "f8e3m4": 1,
}
ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")


def array_bytes(type_text):
    """The bytes of every array in a (possibly tuple) HLO type."""
    total = 0
    for dtype, dims in ARRAY.findall(type_text):
        if dtype not in DTYPE_BYTES:
            continue
        elements = 1
        for d in filter(None, dims.split(",")):
            elements *= int(d)
        total += elements * DTYPE_BYTES[dtype]
    return total


def split_balanced(text, start):
    """`text[start]` is '(' : the inside of the balanced parentheses and the index after them."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] in "({[":
            depth += 1
        elif text[i] in ")}]":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
    raise ValueError(f"unbalanced: {text[start:start + 80]}")


def split_top(text):
    """`text` split at its commas outside brackets."""
    parts, depth, last = [], 0, 0
    for i, c in enumerate(text):
        if c in "({[":
            depth += 1
        elif c in ")}]":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[last:i].strip())
            last = i + 1
    parts.append(text[last:].strip())
    return [p for p in parts if p]


class Instruction:
    def __init__(self, name, rest):
        self.name = name
        if rest.startswith("("):
            self.type, at = split_balanced(rest, 0)
            self.type = "(" + self.type + ")"
        else:
            at = rest.index(" ")
            self.type = rest[:at]
        rest = rest[at:].lstrip()
        paren = rest.index("(")
        self.opcode = rest[:paren].strip()
        inside, after = split_balanced(rest, paren)
        inside = re.sub(r"/\*.*?\*/", "", inside)  # long operand lists carry `/*index=5*/` marks
        self.operands = [p.split()[-1].lstrip("%") for p in split_top(inside)]
        self.attrs = rest[after:]

    def attr(self, key):
        m = re.search(r"\b" + key + r"=(\{[^}]*\}|%?[\w.\-]+)", self.attrs)
        return m.group(1) if m else None

    def callees(self):
        """(computation, runs per run of this instruction) for each computation it runs."""
        if self.opcode == "while":
            m = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', self.attrs)
            if not m:
                print(f"{self.name}: a while loop without a known trip count, counted once", file=sys.stderr)
            trips = int(m.group(1)) if m else 1
            return [(self.attr("body").lstrip("%"), trips), (self.attr("condition").lstrip("%"), trips + 1)]
        out = []
        for key in ["calls", "branch_computations", "true_computation", "false_computation"]:
            value = self.attr(key)
            if value:
                out += [(c.strip().lstrip("%"), 1) for c in value.strip("{}").split(",") if c.strip()]
        return out


def parse(path):
    """The module's computations ({name: [Instruction]}), its ENTRY's name, its partition count."""
    computations, entry, current, partitions = {}, None, None, 1
    with open(path) as f:
        for line in f:
            if line.startswith("HloModule"):
                m = re.search(r"num_partitions=(\d+)", line)
                partitions = int(m.group(1)) if m else 1
                continue
            if current is None:
                m = COMPUTATION.match(line)
                if m:
                    current = m.group(2)
                    computations[current] = []
                    entry = current if m.group(1) else entry
                continue
            if line.strip() == "}":
                current = None
                continue
            m = INSTRUCTION.match(line)
            if m:
                computations[current].append(Instruction(m.group(1), m.group(2)))
    return computations, entry, partitions


def group_size(inst, partitions):
    groups = inst.attr("replica_groups")
    if groups is None or groups == "{}":
        return partitions
    if groups.startswith("{"):
        first = re.match(r"\{\{([^}]*)\}", inst.attrs[inst.attrs.index("replica_groups=") + 15 :])
        return len(first.group(1).split(","))
    m = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", inst.attrs)
    if m:
        return int(m.group(2))
    m = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", inst.attrs)
    if m:
        sizes = dict((a.strip().strip("'"), int(s)) for a, s in (x.split("=") for x in m.group(1).split(",")))
        size = 1
        for axis in m.group(2).split(","):
            size *= sizes[axis.strip().strip("'")]
        return size
    raise ValueError(f"{inst.name}: replica groups {groups!r}")


def op_names(inst):
    """The op name of each operand: a combined collective's `(a:b)` (or `prefix/(a:b)`) split."""
    m = re.search(r'op_name="([^"]*)"', inst.attrs)
    name = m.group(1) if m else ""
    m = re.match(r"^(.*/)?\((.*)\)$", name)
    if m and len(m.group(2).split(":")) == len(inst.operands):
        return [(m.group(1) or "") + part for part in m.group(2).split(":")]
    return [name] * len(inst.operands)


def operand_type(types, operand):
    """The type of `operand`; `%x#k` is element `k` of the multi-output instruction `%x`."""
    base, _, element = operand.partition("#")
    if not element:
        return types[base]
    inside = re.sub(r"/\*[^*]*\*/", "", types[base])[1:-1]
    return split_top(inside)[int(element)]


def collectives(path):
    """[(kind, column, bytes per run, runs, instruction name, op name)] of the module at `path`."""
    computations, entry, partitions = parse(path)
    runs = defaultdict(int)

    def walk(comp, times):
        runs[comp] += times
        for inst in computations[comp]:
            for callee, per in inst.callees():
                if callee in computations:
                    walk(callee, times * per)

    walk(entry, 1)
    out = []
    for comp, insts in computations.items():
        types = {i.name: i.type for i in insts}
        for inst in insts:
            kind = inst.opcode.removesuffix("-start")
            if kind not in KINDS or runs[comp] == 0:
                continue
            # A permute sends to one peer: no group.
            n = group_size(inst, partitions) if kind != "collective-permute" else 1
            spmd = 'is_spmd_generated="true"' in inst.attrs
            for operand, name in zip(inst.operands, op_names(inst)):
                ty = operand_type(types, operand)
                size = array_bytes(ty)
                moved = {
                    "all-gather": (n - 1) * size,
                    "reduce-scatter": (n - 1) * size / n,
                    "all-to-all": (n - 1) * size / n,
                    "collective-permute": size,
                    "all-reduce": 2 * (n - 1) * size / n,
                }[kind]
                column = "strategy" if not spmd or "/" in name else "partitioner"
                out.append((kind, column, moved, runs[comp], inst.name, name, ty, n))
    return out


def totals(rows):
    t = defaultdict(float)
    for kind, column, moved, times, *_ in rows:
        t[(kind, column)] += moved * times
    return t


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("module", help="an optimized HLO text dump (*after_optimizations.txt)")
    p.add_argument("--minus", help="a second dump whose counts are subtracted (one layer fewer)")
    p.add_argument("--list", action="store_true", help="every collective, its runs and bytes")
    args = p.parse_args()
    rows = collectives(args.module)
    if args.list:
        for kind, column, moved, times, name, op, ty, n in sorted(rows, key=lambda r: (r[0], r[1], -r[2])):
            print(f"{kind:18} {column:11} x{times:<3} n={n:<2} {moved / 2**20:10.2f} MiB  {ty:28} {name} {op}")
    t = totals(rows)
    if args.minus:
        for key, value in totals(collectives(args.minus)).items():
            t[key] -= value
    print("| collective | strategy (MiB) | partitioner (MiB) |")
    print("|---|---|---|")
    for kind in KINDS:
        print(f"| {kind} | {t[(kind, 'strategy')] / 2**20:.1f} | {t[(kind, 'partitioner')] / 2**20:.1f} |")
    s = sum(v for (k, c), v in t.items() if c == "strategy")
    q = sum(v for (k, c), v in t.items() if c == "partitioner")
    print(f"| all | {s / 2**20:.1f} | {q / 2**20:.1f} |")


if __name__ == "__main__":
    main()
