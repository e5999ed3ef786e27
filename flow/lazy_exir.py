"""executorch.exir's package __init__ imports the whole exporter (to_edge, the emitter, the passes): 4-5 s of CPU a
process on a 2-core AMD EPYC. Reading or running a program needs a few of its modules only: the runtime's pybindings
import exir._warnings, the program reader exir._serialize and exir.schema. A process that reads or runs programs calls
defer_exir_package() first; the package's __init__ then runs the first time anything else of it is used (an
attribute of the package, or a submodule outside LIGHT_MODULES), so a process that goes on to export gets the package
as it always does, only later.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import threading
import types

PACKAGE = "executorch.exir"

# Submodules that import nothing of the package outside this list (checked by tests/test_lazy_exir.py, which loads
# each in a fresh interpreter and asserts the package's __init__ did not run).
LIGHT_MODULES = ("_warnings", "_serialize", "schema", "error", "scalar_type", "sym_util", "tensor", "tensor_layout",
                 "backend", "backend.compile_spec_schema")


def _is_light(fullname: str) -> bool:
    name = fullname[len(PACKAGE) + 1:]
    return name in LIGHT_MODULES or name.startswith("_serialize.")


class _DeferredPackage(types.ModuleType):
    """executorch.exir before its __init__ ran: a light submodule is imported on its own, anything else runs it."""

    def __getattr__(self, name: str):
        if name.startswith("__") and name != "__all__":  # dunder probes (copy, inspect, hasattr) find nothing
            raise AttributeError(name)
        if _is_light(f"{PACKAGE}.{name}"):
            return importlib.import_module(f"{PACKAGE}.{name}")
        run_exir_init()
        return getattr(sys.modules[PACKAGE], name)


class _InitBeforeHeavySubmodules(importlib.abc.MetaPathFinder):
    """Runs the package's __init__ before any of its submodules outside LIGHT_MODULES is imported, so they load in
    the order the package itself imports them (some import each other in cycles that order resolves)."""

    def find_spec(self, fullname, path, target=None):
        if fullname.startswith(PACKAGE + ".") and not _is_light(fullname):
            run_exir_init()
        return None  # the regular finders find the module


_FINDER = _InitBeforeHeavySubmodules()


def defer_exir_package() -> None:
    """Makes `import executorch.exir...` cheap for a program reader or runner. A no-op once the package is imported
    (deferred or not)."""
    if PACKAGE in sys.modules:
        return
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.loader is None:
        return  # no executorch: the caller's own import says so
    module = importlib.util.module_from_spec(spec)
    module.__class__ = _DeferredPackage
    sys.modules[PACKAGE] = module
    setattr(sys.modules["executorch"], "exir", module)
    sys.meta_path.insert(0, _FINDER)


def is_deferred() -> bool:
    return type(sys.modules.get(PACKAGE)) is _DeferredPackage


# Held while the __init__ runs: another thread needing the package waits for the whole of it, as it would wait on
# the import lock of a package being imported; the running thread itself passes (its own nested uses see the package
# as a package importing itself sees it).
_INIT_LOCK = threading.RLock()


def run_exir_init() -> None:
    """Runs the deferred package's __init__ (a no-op when it ran already)."""
    with _INIT_LOCK:
        module = sys.modules.get(PACKAGE)
        if type(module) is not _DeferredPackage:
            return
        module.__class__ = types.ModuleType
        if _FINDER in sys.meta_path:
            sys.meta_path.remove(_FINDER)
        try:
            module.__spec__.loader.exec_module(module)
        except BaseException:
            del sys.modules[PACKAGE]  # as a failed import leaves it: the next import tries again
            raise
