"""Prints the compile-time layout checks of src/pjrt/ffi/layouts.rs from a pjrt_c_api.h.

usage: python3 tools/pjrt_layouts.py PATH/TO/pjrt_c_api.h > /tmp/layouts.rs
(then replace the `layout!` lines at the end of src/pjrt/ffi/layouts.rs with them)

The header of PJRT C API 0.81 ships in the PyPI wheel xla-cpu-pjrt==0.0.1
(xla_plugins/xla_cpu_pjrt/include/pjrt_c_api.h). For every `#[repr(C)]` struct that src/pjrt/ffi/mod.rs
declares, this compiles a C program with the header that prints sizeof, the header's
`<struct>_STRUCT_SIZE` (the end of its last field, which callers put in `struct_size`) and offsetof
of each field the Rust struct has (so a field that C does not have is a compile error here), and
writes one `layout!` entry per struct for src/pjrt/ffi/layouts.rs, wrapped at 100 columns.
"""

import os
import re
import subprocess
import sys
import tempfile

FFI = os.path.join(os.path.dirname(__file__), "..", "src", "pjrt", "ffi", "mod.rs")
OBJECTS = ["DeviceDescription", "LoadedExecutable", "Executable", "Topology", "Client", "Buffer", "Device",
           "Event", "Error", "Plugin"]
SPECIAL = {
    "NamedValue": "PJRT_NamedValue",
    "ApiVersion": "PJRT_Api_Version",
    "Program": "PJRT_Program",
    "ExecuteOptions": "PJRT_ExecuteOptions",
    "Api": "PJRT_Api",
    "CompileArgs": "PJRT_Compile_Args",
    "KvGetCallbackArgs": "PJRT_KeyValueGetCallback_Args",
    "KvTryGetCallbackArgs": "PJRT_KeyValueTryGetCallback_Args",
    "KvPutCallbackArgs": "PJRT_KeyValuePutCallback_Args",
}

# Rust field names that differ from C's (`type` is a Rust keyword; the named value's anonymous
# union is one Rust field, placed where its first member is).
FIELD_RENAMES = {"buffer_type": "type", "value_type": "type"}
NAMED_VALUE_RENAMES = {"value": "string_value"}


def c_name(rust):
    if rust in SPECIAL:
        return SPECIAL[rust]
    for obj in OBJECTS:
        if rust.startswith(obj) and rust.endswith("Args"):
            c_obj = "TopologyDescription" if obj == "Topology" else obj
            return f"PJRT_{c_obj}_{rust[len(obj):-4]}_Args"
    raise SystemExit(f"no C name for {rust}")


def rust_structs(text):
    structs = {}
    for m in re.finditer(r"args_struct!\((\w+) \{(.*?)\}\);", text, re.S):
        fields = ["struct_size", "extension_start"] + re.findall(r"(\w+)\s*:", m.group(2))
        structs[m.group(1)] = fields
    for m in re.finditer(r"#\[repr\(C\)\]\s*pub struct (\w+) \{(.*?)\n\}", text, re.S):
        structs[m.group(1)] = re.findall(r"pub (\w+)\s*:", m.group(2))
    return structs


def main():
    header = sys.argv[1]
    structs = rust_structs(open(FFI).read())
    lines = ['#include <stddef.h>', '#include <stdio.h>', f'#include "{os.path.abspath(header)}"', "int main(void) {"]
    for rust, fields in structs.items():
        c = c_name(rust)
        # Every args struct starts with struct_size and extension_start at 0 and 8: `layout!`
        # checks those two itself, so an entry lists the struct's own fields.
        if rust not in ("Api", "ApiVersion", "NamedValue"):
            assert fields[:2] == ["struct_size", "extension_start"], rust
            fields = fields[2:]
        offsets = " ".join(f"{f}: %zu," for f in fields)
        renames = dict(FIELD_RENAMES, **(NAMED_VALUE_RENAMES if rust == "NamedValue" else {}))
        args = ", ".join(f"offsetof({c}, {renames.get(f, f)})" for f in fields)
        # maxrs's function table stops before the end of the 0.81 table: offsets only. The
        # plugin fills in its version struct: maxrs never sets a struct_size there.
        if rust == "Api":
            head, head_args = "_", ""
        elif rust == "ApiVersion":
            head, head_args = "%zu", f"sizeof({c}), "
        else:
            head, head_args = "%zu, struct_size %d", f"sizeof({c}), (int){c}_STRUCT_SIZE, "
        body = f"{{ {offsets} }}" if fields else "{}"
        lines.append(f'  printf("layout!({rust} = {head} {body});\\n", {", ".join(filter(None, [head_args.rstrip(", "), args]))});')
    lines.append("  return 0;\n}")
    with tempfile.TemporaryDirectory() as d:
        src, exe = os.path.join(d, "l.c"), os.path.join(d, "l")
        open(src, "w").write("\n".join(lines))
        subprocess.run(["cc", "-o", exe, src], check=True)
        for line in subprocess.run([exe], check=True, capture_output=True, text=True).stdout.splitlines():
            print(wrap(line))


def wrap(line, width=100):
    """`layout!(X = .. { a: 0, b: 8, })` on one line when it fits, else its fields on indented lines."""
    if len(line) <= width:
        return line
    head, fields = line.split(" { ", 1)
    out, current = [head + " {"], "   "
    for field in re.findall(r"\w+: \d+,", fields):
        if len(current) + 1 + len(field) > width:
            out.append(current)
            current = "   "
        current += " " + field
    out.append(current)
    return "\n".join(out) + "\n});"


if __name__ == "__main__":
    main()
