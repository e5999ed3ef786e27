"""What C++ cannot register for a C++-registered op, added from Python after its AOT library is loaded: the vmap rule
of an elementwise op (functorch's C++ batching headers need nlohmann/json, which the torch wheel does not ship), and
the torch 2.13 Inductor workaround. Used by custom_ops_2.py (CMake/JIT libraries) and by the my_ops package."""

from __future__ import annotations

import torch

import torch_compat

_libraries: list[torch.library.Library] = []  # the fragments holding the vmap rules registered here, kept alive


def register(qualified_name: str, elementwise: bool) -> None:
    """Once per op and process, whoever asks first (the CMake-built library's loader or the my_ops package)."""
    namespace, name = qualified_name.split("::")
    torch_compat.apply(namespace)
    if not elementwise or _has_vmap_rule(qualified_name):
        return
    lib = torch.library.Library(namespace, "FRAGMENT")
    functional = getattr(getattr(torch.ops, namespace), name).default

    def elementwise_vmap(info, in_dims, input):
        return functional(input), in_dims[0]  # the whole batch at once, batched along the same dimension

    torch.library.register_vmap(qualified_name, elementwise_vmap, lib=lib)
    _libraries.append(lib)


def _has_vmap_rule(qualified_name: str) -> bool:
    # Registered here before, or by another copy of this module (the repository's or the wheel's).
    return torch._C._dispatch_has_kernel_for_dispatch_key(qualified_name, "FuncTorchBatched")


def is_defined(qualified_name: str) -> bool:
    """Whether PyTorch already has a schema for this op (from any library, Python or C++)."""
    try:
        torch._C._dispatch_find_schema_or_throw(qualified_name, "")
        return True
    except RuntimeError:
        return False
