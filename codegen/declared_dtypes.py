"""Each op's dtypes, stated once in custom_ops.bzl, for the code that enforces them: the C++ header its kernels take
their dtype sets from (`declared_dtypes::<namespace>::<name>`, a contract::DtypeSet, in
`declared_dtypes/<namespace>/<name>.h`), written at build time, and the check that each Python-registered op's module
refuses what the declaration refuses (its module-level `DTYPES`, read without importing the module). CMake's configure
step and Buck2's genrule call it through the codegen entry point:

    run_codegen.py declared_dtypes --output_dir <generated include directory>
"""

from __future__ import annotations

import ast
import os

# torch's dtype name -> ExecuTorch's and ATen's ScalarType enumerator: the dtypes a kernel can be compiled for
# (kernel_helpers/kernel_contract.h's cpp_type).
CPP_SCALAR_TYPES = {
    "float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16", "uint8": "Byte",
    "int8": "Char", "int16": "Short", "int32": "Int", "int64": "Long",
}


class DtypeMismatch(Exception):
    """A declaration names a dtype no kernel can be compiled for, or a Python module's DTYPES disagrees with it."""


HEADER_DIR = "declared_dtypes"


def header_path(name: str) -> str:
    """Where a declared op's set is written, under the generated include directory: one header per op, so that
    declaring or changing one op leaves every other kernel's inputs, and its compiled object, as they were."""
    return f"{HEADER_DIR}/{name.replace('::', '/')}.h"


def headers(ops) -> dict[str, str]:
    """Each declared op's C++ dtype set, in the declared order (its messages' order), as the header its kernels
    include: {header_path(op.name): text}."""
    written = {}
    for op in ops:
        unknown = [d for d in op.dtypes if d not in CPP_SCALAR_TYPES]
        if unknown:
            raise DtypeMismatch(f"custom_ops.bzl: {op.name} declares dtypes {', '.join(unknown)}, which no kernel "
                                f"can be compiled for; the dtypes kernels take: {', '.join(CPP_SCALAR_TYPES)}")
        members = ", ".join(f"ScalarType::{CPP_SCALAR_TYPES[d]}" for d in op.dtypes)
        written[header_path(op.name)] = "\n".join([
            f"// Written by codegen/run_codegen.py declared_dtypes from custom_ops.bzl: {op.name}'s dtypes as a",
            "// contract::DtypeSet, the set its kernels compile and accept for their first tensor input.",
            "#pragma once",
            "",
            '#include "kernel_helpers/kernel_contract.h"',
            "",
            f"namespace custom::native::declared_dtypes::{op.namespace} {{",
            f"using {op.short_name} = contract::DtypeSet<{members}>;",
            f"}} // namespace custom::native::declared_dtypes::{op.namespace}",
            "",
        ])
    return written


def module_dtypes(path: str, shown_as: str) -> tuple[str, ...] | None:
    """The torch names in the module's top-level `DTYPES = (torch.<name>, ...)`; None when it has none. `shown_as`:
    the file's name in messages."""
    with open(path) as f:
        tree = ast.parse(f.read(), filename=path)
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "DTYPES" for t in targets):
                value = node.value
                if not (isinstance(value, (ast.Tuple, ast.List)) and all(
                        isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "torch"
                        for e in value.elts)):
                    raise DtypeMismatch(f"{shown_as}:{node.lineno}: DTYPES must be a literal tuple of torch dtypes, "
                                        "e.g. (torch.float32, torch.bfloat16), so the build can read it")
                return tuple(e.attr for e in value.elts)
    return None


def check_python_modules(ops, repo_root: str) -> list[str]:
    """Each "python" op's module states the dtypes its declaration does, in the same order (one refusal message on
    both sides). A module that adds only the out variant of an op another library defines (defined_by) may leave the
    refusing to that library. Returns the files read."""
    read: dict[str, None] = {}  # each file once: a module may register several ops (ops/gated/gated.py)
    for op in ops:
        if not op.python_file:
            continue
        path = os.path.join(repo_root, op.python_file)
        read[path] = None
        stated = module_dtypes(path, op.python_file)
        if stated is None:
            if op.defined_by:
                continue
            raise DtypeMismatch(f"{op.python_file}: no DTYPES; {op.name}'s module must state the dtypes its kernels "
                                f"accept, as custom_ops.bzl declares them: DTYPES = "
                                f"({', '.join('torch.' + d for d in op.dtypes)})")
        if stated != op.dtypes:
            raise DtypeMismatch(f"{op.python_file}: DTYPES is ({', '.join(stated)}) but custom_ops.bzl declares "
                                f"{op.name}'s dtypes as ({', '.join(op.dtypes)}); make the two agree, in that order")
    return list(read)
