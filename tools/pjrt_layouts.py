"""Prints the compile-time layout checks of src/pjrt/ffi.rs from a pjrt_c_api.h.

usage: python3 tools/pjrt_layouts.py PATH/TO/pjrt_c_api.h > /tmp/layouts.rs

The header of PJRT C API 0.81 ships in the PyPI wheel xla-cpu-pjrt==0.0.1
(xla_plugins/xla_cpu_pjrt/include/pjrt_c_api.h). For every `#[repr(C)]` struct that ffi.rs
declares, this compiles a C program with the header that prints sizeof and offsetof of each
field the Rust struct has (so a field that C does not have is a compile error here), and writes
one `layout!` line per struct for ffi.rs.
"""

import os
import re
import subprocess
import sys
import tempfile

FFI = os.path.join(os.path.dirname(__file__), "..", "src", "pjrt", "ffi.rs")
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
        offsets = " ".join(f'{f}: %zu,' for f in fields)
        renames = dict(FIELD_RENAMES, **(NAMED_VALUE_RENAMES if rust == "NamedValue" else {}))
        args = ", ".join(f"offsetof({c}, {renames.get(f, f)})" for f in fields)
        # maxrs's function table stops before the end of the 0.81 table: offsets only.
        size = "_" if rust == "Api" else "%zu"
        size_arg = "" if rust == "Api" else f"sizeof({c}), "
        lines.append(f'  printf("layout!({rust} = {size} {{ {offsets} }});\\n", {size_arg}{args});')
    lines.append("  return 0;\n}")
    with tempfile.TemporaryDirectory() as d:
        src, exe = os.path.join(d, "l.c"), os.path.join(d, "l")
        open(src, "w").write("\n".join(lines))
        subprocess.run(["cc", "-o", exe, src], check=True)
        print(subprocess.run([exe], check=True, capture_output=True, text=True).stdout, end="")


if __name__ == "__main__":
    main()
