"""The ops of this project as a Python package: `import my_ops` makes every op declared in custom_ops.bzl known to
PyTorch, so models calling them export to ExecuTorch programs.

The wheel (setup.py, `bash test_custom_ops.sh wheel`) carries the C++ AOT ops compiled into one library (_C*.so: the
C++ registrations, their kernels in ATen mode, and the schemas and CPU registration codegen writes for their out
variants), the modules that register the Python ops (custom_ops_1.py), and _declared.py, the op list it was built
with. An editable install (`pip install -e .`) reads the same modules from the checkout instead.

Registration happens once per process: when a CMake-built AOT library or custom_ops_1 came first, their ops are
used and nothing is registered twice.
"""

from __future__ import annotations

import glob
import importlib
import os
import sys

import torch

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_CHECKOUT = os.path.dirname(_PACKAGE_DIR)  # for an editable install: the repository

__all__ = ["OPS", "library_path"]


# Editable install: the repository's modules stand in for the wheel's copies (my_ops.custom_ops_1 is custom_ops_1.py).
if not os.path.isfile(os.path.join(_PACKAGE_DIR, "_declared.py")):
    __path__.append(_CHECKOUT)  # noqa: F821  (a package's __path__)


def _bundled(name: str):
    """my_ops.<name>: the wheel's copy of a repository module, or the checkout's file in an editable install."""
    return importlib.import_module(f"{__name__}.{name}")


# The repository's modules (and a user's op module written like them) import these helpers by their top-level names.
# One module object per helper and process: the one already imported, else the wheel's copy under that name.
_SHARED_MODULES = ("torch_compat", "aot_python_side")  # in dependency order
for _name in _SHARED_MODULES:
    if _name not in sys.modules:
        sys.modules[_name] = _bundled(_name)


def _declared_ops() -> list[dict]:
    if os.path.isfile(os.path.join(_PACKAGE_DIR, "_declared.py")):
        return _bundled("_declared").OPS
    return [op.as_manifest() for op in _bundled("declared_ops").load().values()]  # editable: custom_ops.bzl itself


def _find_library() -> str | None:
    found = sorted(glob.glob(os.path.join(_PACKAGE_DIR, "_C*.so")))
    return found[0] if found else None


OPS: list[str] = []  # the qualified names of the ops this package registers, e.g. ["my_ops::mul3", "my_ops::mul4"]
library_path: str | None = _find_library()


def _register() -> None:
    aot_python_side = sys.modules["aot_python_side"]
    ops = _declared_ops()
    cpp_ops = [op for op in ops if op["registered_from"] == "cpp"]
    if cpp_ops and not all(aot_python_side.is_defined(op["name"]) for op in cpp_ops):
        if library_path is None:
            raise ImportError("my_ops was installed without its C++ library (_C*.so); rebuild the wheel with "
                              "`bash test_custom_ops.sh wheel` or `pip install --no-build-isolation .`")
        torch.ops.load_library(library_path)
    for op in ops:
        if op["registered_from"] == "python":
            _bundled(op["python_module"])
        else:
            aot_python_side.register(op["name"], op["elementwise"])
        OPS.append(op["name"])


_register()
