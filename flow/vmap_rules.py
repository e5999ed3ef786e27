"""What C++ cannot register for a C++-registered op, added from Python once its AOT library is loaded: the vmap rule of
an elementwise op (functorch's C++ batching headers need nlohmann/json, which the torch wheel does not ship). Used by
flow.registration and, as a copy, by the my_ops package: it imports only torch."""

from __future__ import annotations

import torch

_libraries: list[torch.library.Library] = []  # the fragments holding the vmap rules registered here, kept alive


def register_elementwise(qualified_name: str) -> None:
    """The batched rule of a one-input elementwise op: the op on the whole batch. Once per op and process, whoever
    asks first (the flow's loader or the my_ops package)."""
    if torch._C._dispatch_has_kernel_for_dispatch_key(qualified_name, "FuncTorchBatched"):
        return  # registered before, by this module or another copy of it
    namespace, name = qualified_name.split("::")
    functional = getattr(getattr(torch.ops, namespace), name).default

    def elementwise_vmap(info, in_dims, input):
        return functional(input), in_dims[0]  # the whole batch at once, batched along the same dimension

    lib = torch.library.Library(namespace, "FRAGMENT")
    torch.library.register_vmap(qualified_name, elementwise_vmap, lib=lib)
    _libraries.append(lib)


def is_defined(qualified_name: str) -> bool:
    """Whether PyTorch already has a schema for this op (from any library, Python or C++)."""
    try:
        torch._C._dispatch_find_schema_or_throw(qualified_name, "")
        return True
    except RuntimeError:
        return False
