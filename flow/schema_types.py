"""The argument types an op's schema may use in this flow, and the C++ type each becomes in a kernel's signature: in
ExecuTorch mode (the runtime kernel, Tensor = executorch::aten::Tensor) and in ATen mode (the PyTorch AOT library).
This is what executorch.codegen.gen writes for the pinned versions (tests/test_schema_types.py regenerates and
compares). A schema using another type (Layout, Dimname, Generator, Device, ...) is refused when the declarations are
checked (codegen/run_codegen.py), with one line naming the op, the argument and this list; ExecuTorch's codegen has no
kernel argument for those.

    python -m flow.schema_types      the table, as docs/adding-an-op.md shows it
"""

from __future__ import annotations

import sys

# schema type -> (ExecuTorch-mode C++ type, ATen-mode C++ type). "T?" optionals and "T(a!)" mutable tensors included.
ARGUMENT_TYPES: dict[str, tuple[str, str]] = {
    "Tensor": ("const Tensor&", "const at::Tensor&"),
    "Tensor(a!)": ("Tensor&", "at::Tensor&"),
    "Tensor?": ("const std::optional<Tensor>&", "const std::optional<at::Tensor>&"),
    "Tensor[]": ("TensorList", "at::TensorList"),
    "Tensor?[]": ("ArrayRef<std::optional<Tensor>>", "const c10::List<std::optional<at::Tensor>>&"),
    "int": ("int64_t", "int64_t"),
    "SymInt": ("int64_t", "int64_t"),
    "float": ("double", "double"),
    "bool": ("bool", "bool"),
    "int[]": ("ArrayRef<int64_t>", "at::IntArrayRef"),
    "SymInt[]": ("ArrayRef<int64_t>", "at::IntArrayRef"),
    "float[]": ("ArrayRef<double>", "at::ArrayRef<double>"),
    "bool[2]": ("ArrayRef<bool>", "std::array<bool,2>"),
    "Scalar": ("const Scalar&", "const at::Scalar&"),
    "ScalarType": ("ScalarType", "at::ScalarType"),
    "MemoryFormat": ("MemoryFormat", "at::MemoryFormat"),
    "str": ("std::string_view", "c10::string_view"),
    "int?": ("std::optional<int64_t>", "std::optional<int64_t>"),
    "float?": ("std::optional<double>", "std::optional<double>"),
    "bool?": ("std::optional<bool>", "std::optional<bool>"),
    "ScalarType?": ("std::optional<ScalarType>", "std::optional<at::ScalarType>"),
    "Scalar?": ("const std::optional<Scalar>&", "const std::optional<at::Scalar>&"),
    "int[]?": ("std::optional<ArrayRef<int64_t>>", "at::OptionalIntArrayRef"),
    "str?": ("std::optional<std::string_view>", "std::optional<c10::string_view>"),
}

# What a kernel returns: the out arguments, by reference.
RETURN_TYPES: dict[str, tuple[str, str]] = {
    "Tensor(a!)": ("Tensor&", "at::Tensor&"),
    "(Tensor(a!), Tensor(b!))": ("std::tuple<Tensor&, Tensor&>", "std::tuple<at::Tensor&, at::Tensor&>"),
}


def base_type(schema_type: str) -> str:
    """The table's key for a schema type: alias annotations other than a mutable tensor's dropped, list sizes kept
    only for bool[N] (written bool[2] in the table)."""
    import re

    text = schema_type.strip()
    mutable = bool(re.fullmatch(r"Tensor\([a-z]!\)", text))
    text = re.sub(r"\([a-z](!|\s*->\s*\*)?\)", "", text)
    if mutable:
        return "Tensor(a!)"
    text = re.sub(r"^bool\[\d+\]", "bool[2]", text)
    return re.sub(r"^(int|SymInt|float)\[\d+\]", r"\1[]", text)


def schema_arguments(schema: str) -> list[tuple[str, str]]:
    """(type, name) of each argument of a schema string such as 'ns::op.out(Tensor input, *, Tensor(a!) out) -> ...'."""
    inner = schema[schema.index("(") + 1:]
    depth, current, parts = 0, "", []
    for ch in inner:
        if ch == ")" and depth == 0:
            break
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    arguments = []
    for part in (p.split("=")[0].strip() for p in parts):
        if part and part != "*":
            type_, _, name = part.rpartition(" ")
            arguments.append((type_.strip(), name))
    return arguments


def unsupported_arguments(schema: str) -> list[str]:
    """'name: type' for each argument of `schema` whose type is not in ARGUMENT_TYPES."""
    return [f"{name}: {type_}" for type_, name in schema_arguments(schema) if base_type(type_) not in ARGUMENT_TYPES]


def markdown_table() -> str:
    rows = ["| schema type | ExecuTorch kernel (C++) | ATen kernel (C++) |", "|---|---|---|"]
    rows += [f"| `{t}` | `{et}` | `{aten}` |" for t, (et, aten) in ARGUMENT_TYPES.items()]
    rows += [f"| returns `{t}` | `{et}` | `{aten}` |" for t, (et, aten) in RETURN_TYPES.items()]
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
    sys.exit(0)
