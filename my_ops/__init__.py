"""The ops of this project as a Python package: `import my_ops` makes every op declared in custom_ops.bzl known to
PyTorch, so models calling them export to ExecuTorch programs.

The wheel (setup.py, `bash test_custom_ops.sh wheel`) carries the C++ AOT ops compiled into one library (_C*.so: the C++
registrations, their kernels in ATen mode, and the schemas and CPU registration codegen writes for their out variants),
copies of the modules that register the Python ops (custom_ops_1.py, and ops/<name>/<name>.py flat as my_ops.<name>),
of the Python side they and my_ops.hf share (flow/torch_compat.py, flow/vmap_rules.py, flow/file_cache.py,
ops/blocks/block_layouts.py, ops/rope_sdpa_with_cache/cache_positions.py), of the checked loading of untrusted
programs that my_ops.hf runs them with (flow/runtime.py and the modules it imports: my_ops.runtime, my_ops.program, ...;
imported when a program is loaded), and _declared.py, the op list it was built with. Everything is imported relative to
this package. An editable install (`pip install -e .`) has no copies: it loads the checkout's shared files under the
same my_ops.<module> names, and my_ops.hf loads programs through the checkout's flow.runtime.

Besides the ops: my_ops.gguf (a GGUF file as a program on its own blocks) and my_ops.hf (Hugging Face and GGUF
models put on the ops: export, generate, perplexity; `python -m my_ops.hf`).

Registration happens once per process: when a CMake-built AOT library or the repository's custom_ops_1 came first,
their ops are used and nothing is registered twice.
"""

from __future__ import annotations

import glob
import importlib
import importlib.util
import os
import sys

import torch

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_CHECKOUT = os.path.dirname(_PACKAGE_DIR)  # for an editable install: the repository
_EDITABLE = not os.path.isfile(os.path.join(_PACKAGE_DIR, "_declared.py"))

__all__ = ["OPS", "library_path"]


def _from_checkout(name: str, relative_path: str):
    """Editable install: the checkout's file, loaded as my_ops.<name> (what the wheel carries a copy of)."""
    qualified = f"{__name__}.{name}"
    if qualified not in sys.modules:
        spec = importlib.util.spec_from_file_location(qualified, os.path.join(_CHECKOUT, relative_path))
        module = importlib.util.module_from_spec(spec)
        sys.modules[qualified] = module
        spec.loader.exec_module(module)
    return sys.modules[qualified]


if _EDITABLE:
    block_layouts = _from_checkout("block_layouts", "ops/blocks/block_layouts.py")
    cache_positions = _from_checkout("cache_positions", "ops/rope_sdpa_with_cache/cache_positions.py")
    file_cache = _from_checkout("file_cache", "flow/file_cache.py")
    torch_compat = _from_checkout("torch_compat", "flow/torch_compat.py")
    vmap_rules = _from_checkout("vmap_rules", "flow/vmap_rules.py")
else:
    from . import block_layouts, cache_positions, file_cache, torch_compat, vmap_rules  # noqa: F401  (shared)


def _declared_ops() -> list[dict]:
    if not _EDITABLE:
        from ._declared import OPS as declared

        return declared
    declarations = _from_checkout("_declarations", "flow/declarations.py")
    return [op.as_manifest() for op in declarations.load(os.path.join(_CHECKOUT, "custom_ops.bzl")).values()]


def _import_python_op(op: dict):
    if op.get("defined_by"):  # the library defining the op, whose out variant the op's module adds
        importlib.import_module(op["defined_by"])
    if _EDITABLE:
        return _from_checkout(op["wheel_module"], op["python_file"])
    return importlib.import_module(f".{op['wheel_module']}", __name__)


def _find_library() -> str | None:
    found = sorted(glob.glob(os.path.join(_PACKAGE_DIR, "_C*.so")))
    return found[0] if found else None


def _checkout_build_library() -> str | None:
    """A checkout that was not installed: its CMake build with every op (what `bash test_custom_ops.sh real` and the
    other modes that build cmake-out/all_ops make)."""
    path = os.path.join(_CHECKOUT, "cmake-out", "all_ops", "libcustom_ops_aot_lib.so")
    return path if _EDITABLE and os.path.isfile(path) else None


OPS: list[str] = []  # the qualified names of the ops this package registers, e.g. ["my_ops::mul3", "my_ops::mul4"]
library_path: str | None = _find_library()


def _register() -> None:
    ops = _declared_ops()
    cpp_ops = [op for op in ops if op["registered_from"] == "cpp"]
    if cpp_ops and not all(vmap_rules.is_defined(op["name"]) for op in cpp_ops):
        library = library_path
        if library is None and not any(vmap_rules.is_defined(op["name"]) for op in cpp_ops):
            library = _checkout_build_library()
        if library is None:
            if _EDITABLE:
                raise ImportError("my_ops: this checkout's C++ ops are not built; build them with `bash "
                                  "test_custom_ops.sh real` (cmake-out/all_ops) or `pip install --no-build-isolation "
                                  "-e .`, or load a build's libcustom_ops_aot_lib.so before importing my_ops")
            raise ImportError("my_ops was installed without its C++ library (_C*.so); rebuild the wheel with "
                              "`bash test_custom_ops.sh wheel` or `pip install --no-build-isolation .`")
        torch.ops.load_library(library)
    for op in ops:
        if op["registered_from"] == "python":
            _import_python_op(op)
        elif op["elementwise"]:
            vmap_rules.register_elementwise(op["name"])
        if op["registered_from"] != "aten":  # PyTorch's own ops need no workaround
            torch_compat.apply(op["name"].split("::")[0])
        OPS.append(op["name"])


_register()
