"""The kinds of value each operator's kernel unboxes, from PyTorch's schemas: the one table both pre-flights check a
program's kernel calls against. ExecuTorch's own kernels (aten, prims, quantized) unbox their arguments unchecked
(EValue::toTensor() aborts the process on an Int), so a call passing a value of another kind is refused first:
flow/program.py reads the table live from PyTorch, and the runner compiles in the header this module writes at build
time (CMake: cmake/ExecuTorchCodegen.cmake; Buck2: targets.bzl), so both refuse the same calls in the same words.

    python -m flow.argument_kinds --output argument_kinds.h
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

from .xnnpack_layout import KERNEL_TYPES

from .runtime_kernels import RUNTIME_NAMESPACES

# PyTorch's name of an argument type (str(argument.type)) -> the value kinds (program.fbs KernelTypes) ExecuTorch
# unboxes it from. ScalarType, Layout and MemoryFormat are "int" here, as in a program. Types not listed (Device,
# Generator, List[number]) are not checked.
_KINDS_OF_TYPE = {
    "Tensor": ("Tensor",), "int": ("Int",), "SymInt": ("Int",), "float": ("Double",), "bool": ("Bool",),
    "number": ("Int", "Double", "Bool"), "str": ("String",), "List[int]": ("IntList",), "List[SymInt]": ("IntList",),
    "List[float]": ("DoubleList",), "List[bool]": ("BoolList",), "List[Tensor]": ("TensorList",),
    "List[Optional[Tensor]]": ("OptionalTensorList",),
}


def kinds_of_type(type_name: str) -> tuple[str, ...] | None:
    """The value kinds an argument of PyTorch type `type_name` may be passed as, or None when it is not checked."""
    if type_name.startswith("Optional[") and type_name.endswith("]"):
        inner = kinds_of_type(type_name[len("Optional["):-1])
        return None if inner is None else inner + ("Null",)
    return _KINDS_OF_TYPE.get(type_name)


# (name, type as a schema spells it, kinds or None) per value a call passes: the arguments, then the result.
Arguments = tuple[tuple[str, str, "tuple[str, ...] | None"], ...]


def schema_spelling(type_name: str) -> str:
    """PyTorch's name of a type as a schema spells it: Optional[List[int]] -> int[]?, number -> Scalar."""
    if type_name.startswith("Optional[") and type_name.endswith("]"):
        return schema_spelling(type_name[len("Optional["):-1]) + "?"
    if type_name.startswith("List[") and type_name.endswith("]"):
        return schema_spelling(type_name[len("List["):-1]) + "[]"
    return "Scalar" if type_name == "number" else type_name


def arguments_of(schema) -> Arguments:
    """A schema's arguments, then its result: written by the kernel, never read, so of any kind."""
    return tuple((a.name, schema_spelling(str(a.type)), kinds_of_type(str(a.type))) for a in schema.arguments) + (
        ("result", "", None),)


# Ops the runtime's kernels serve that PyTorch has no schema for: the emitter's et_view (which reads its result, the
# view it writes) and et_copy_index (a map loop's output: it passes no result, its last value is the index), and the
# integer prims of older programs.
EMITTER_OPS: dict[str, Arguments] = {
    **{f"executorch_prim::{op}.int": (("a", "int", ("Int",)), ("b", "int", ("Int",)), ("result", "", None))
       for op in ("floordiv", "mod")},
    "executorch_prim::et_view.default": (("self", "Tensor", ("Tensor",)), ("size", "int[]", ("IntList",)),
                                         ("result", "Tensor", ("Tensor",))),
    "executorch_prim::et_copy_index.tensor": (("copy_to", "Tensor", ("Tensor",)), ("copy_from", "Tensor", ("Tensor",)),
                                              ("index", "int", ("Int",))),
}


def import_runtime_schemas() -> None:
    """Registers with PyTorch the schemas of the runtime's ops that PyTorch lacks until imported: ExecuTorch's prims,
    dim-order and device-copy ops, and the quantized_decomposed ops with their out variants."""
    import torch.ao.quantization.fx._decomposed  # noqa: F401
    import executorch.exir.passes._device_copy_ops_registry  # noqa: F401
    import executorch.exir.passes.dim_order_ops_registry  # noqa: F401
    import executorch.exir.passes.executorch_prim_ops_registry  # noqa: F401
    import executorch.kernels.quantized  # noqa: F401  (the out variants' schemas, from its AOT library)


def _schema(name: str):
    import torch

    qualified, _, overload = name.partition(".")
    namespace, _, op = qualified.partition("::")
    try:
        return getattr(getattr(getattr(torch.ops, namespace), op), overload or "default")._schema
    except (AttributeError, RuntimeError):
        return None


def arguments_of_operator(name: str) -> Arguments | None:
    """What a call of the operator "ns::op.overload" (as a program names it) passes, from PyTorch's schema (for the
    runtime's own ops, call import_runtime_schemas() first, or read runtime_arguments()), or None when neither PyTorch
    nor EMITTER_OPS knows it."""
    if name in EMITTER_OPS:
        return EMITTER_OPS[name]
    schema = _schema(name)
    return None if schema is None else arguments_of(schema)


def as_an_older_schema_passes(name: str, arguments: Arguments, values: int) -> Arguments:
    """`arguments` without the optional ones (default None) just before the keyword-only ones that a call of `values`
    values leaves out: a program exported before an op's schema gained them (my_ops::decoder_layer's v_weight and
    v_format). For the project's own ops, whose kernels check their calls themselves
    (kernel_helpers/checked_unboxing.h) and take such a program where they say so; else `arguments` as they are."""
    schema = _schema(name)
    missing = len(arguments) - values
    if schema is None or missing <= 0:
        return arguments
    positional = [i for i, a in enumerate(schema.arguments) if not a.kwarg_only]
    last = positional[-1] if positional else -1
    left_out = range(last - missing + 1, last + 1)
    if last + 1 - missing < 0 or not all(str(schema.arguments[i].type).startswith("Optional[")
                                         and schema.arguments[i].has_default_value()
                                         and schema.arguments[i].default_value is None for i in left_out):
        return arguments
    return tuple(a for i, a in enumerate(arguments) if i not in left_out)


def call_problem(name: str, arguments: Arguments, kinds: tuple[str, ...]) -> str | None:
    """What is wrong with a kernel call of `name` passing values of `kinds`, or None. The runner words it the same
    (runner/kernel_calls.cpp)."""
    if len(kinds) != len(arguments):
        return (f"{name} is called with {len(kinds)} values, its schema has {len(arguments) - 1} arguments plus the "
                "result")
    for (argument, type_name, allowed), kind in zip(arguments, kinds):
        if allowed is not None and kind not in allowed:
            return f"{name}: argument {argument} is {kind}, but the schema declares {type_name}"
    return None


def runtime_table() -> dict[str, Arguments]:
    """Every operator of RUNTIME_NAMESPACES a program can call a kernel of, by the name a program gives it: the out
    and in-place variants (a written argument), the prims, the ops returning no tensor (such as aten::sym_size.int)
    and EMITTER_OPS."""
    import torch

    import_runtime_schemas()
    table = dict(EMITTER_OPS)
    for schema in torch._C._jit_get_all_schemas():
        namespace = schema.name.split("::")[0]
        if namespace not in RUNTIME_NAMESPACES:
            continue
        returns_tensor = any("Tensor" in str(r.type) for r in schema.returns)
        writes = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
        if namespace == "executorch_prim" or writes or not returns_tensor:
            table[schema.name + (f".{schema.overload_name}" if schema.overload_name else "")] = arguments_of(schema)
    return dict(sorted(table.items()))


@functools.cache
def runtime_arguments() -> dict[str, Arguments]:
    """runtime_table(), kept as JSON by the versions of torch and executorch and this file, in runtime_kernels'
    folder ($CUSTOM_OPS_CODEGEN_CACHE, else ~/.cache/my_ops): making it imports three of ExecuTorch's op registries,
    which import its whole exporter (4-5 s of CPU), and every process that checks a program needs it."""
    from .runtime_kernels import cache_dir

    return _cached_table(cache_dir())


def _cached_table(cache: str) -> dict[str, Arguments]:
    # Its own few lines, not flow/file_cache.py: a table that fails to parse is made again here, where that cache would
    # hand back the damaged file.
    import hashlib
    import json
    from importlib import metadata

    with open(__file__, "rb") as f:
        digest = hashlib.sha256(f.read())
    digest.update(f"torch={metadata.version('torch')};executorch={metadata.version('executorch')}".encode())
    path = os.path.join(cache, f"argument_kinds-{digest.hexdigest()}.json")
    try:
        with open(path) as f:
            return {name: tuple((arg, type_name, None if kinds is None else tuple(kinds))
                                for arg, type_name, kinds in args) for name, args in json.load(f).items()}
    except (OSError, ValueError):  # not made yet, or damaged: made again below
        pass
    table = runtime_table()
    os.makedirs(cache, exist_ok=True)
    with open(f"{path}.{os.getpid()}.tmp", "w") as f:
        json.dump(table, f)
    os.replace(f"{path}.{os.getpid()}.tmp", path)  # whole or absent for a concurrent reader
    return table


def cpp_header(table: dict[str, Arguments], executorch_kernels=()) -> str:
    """The table as the runner compiles it: operators sorted by name (binary search), each a run of arguments whose
    kinds are a bit per KernelTypes tag (Null = 1; 0 = not checked). Beside it, the operators ExecuTorch's kernel
    libraries register (flow/runtime_kernels.py), sorted: how the runner tells an op whose library is not linked from
    one nobody ships."""
    bit = {kind: 1 << (i + 1) for i, kind in enumerate(KERNEL_TYPES)}
    arguments, operators = [], []
    for name, args in table.items():
        operators.append(f'    {{"{name}", {len(arguments)}, {len(args)}}},')
        for argument, type_name, kinds in args:
            mask = sum(bit[k] for k in kinds) if kinds else 0
            arguments.append(f'    {{"{argument}", "{type_name}", {mask:#x}}},')
    return "\n".join([
        "// Generated by flow/argument_kinds.py from PyTorch's schemas at build time; do not edit.",
        "#pragma once", "", "#include <cstdint>", "",
        "namespace custom_ops_runner::argument_kinds {", "",
        "struct Argument {", "  const char* name;", "  const char* type;  // as the schema spells it, for the message",
        "  uint32_t kinds;  // bit 1 << tag per accepted KernelTypes tag; 0: not checked", "};",
        "struct Operator {", "  const char* name;  // \"ns::op.overload\", sorted", "  uint32_t first, count;", "};", "",
        "inline constexpr Argument kArguments[] = {", *arguments, "};",
        "inline constexpr Operator kOperators[] = {", *operators, "};", "",
        "// The operators ExecuTorch's kernel libraries register (the wheel's optimized and quantized kernels), sorted,",
        "// and the namespaces of ExecuTorch's own ops (an op of another is a project's own).",
        "inline constexpr const char* kExecuTorchKernels[] = {",
        *(f'    "{name}",' for name in sorted(executorch_kernels)), "};",
        "inline constexpr const char* kRuntimeNamespaces[] = {",
        *(f'    "{namespace}",' for namespace in RUNTIME_NAMESPACES), "};", "",
        "}  // namespace custom_ops_runner::argument_kinds", ""])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True, help="the header to write")
    args = parser.parse_args(argv)
    from .runtime_kernels import executorch_kernels

    text = cpp_header(runtime_table(), executorch_kernels())
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output + ".tmp", "w") as f:
        f.write(text)
    os.replace(args.output + ".tmp", args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
