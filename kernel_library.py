"""Loads a kernel library (libcustom_ops_lib.so) into this process, so the ExecuTorch Python runtime finds its ops.

ExecuTorch aborts the whole process when an operator is registered twice ("Re-registering my_ops::mul3.out"), which
two kernel libraries with a common op would do. So a process takes one kernel library: loading the same one again is
a no-op, and a second, different one is refused with a RuntimeError instead of an abort.
"""

from __future__ import annotations

import ctypes
import os

_loaded: str | None = None


def load_kernel_library(path: str | os.PathLike) -> str:
    """Loads the kernel library at `path` (RTLD_GLOBAL, before loading programs); returns its resolved path."""
    global _loaded
    resolved = os.path.realpath(path)
    if _loaded == resolved:
        return resolved
    if _loaded is not None:
        raise RuntimeError(
            f"kernel library {_loaded} is already loaded in this process; loading {resolved} as well could register "
            "an operator twice, which aborts the process. Build one library that selects every op you need "
            "(e.g. -DREGISTER_EXAMPLE_CUSTOM_OP=3), or load each library in its own process")
    if not os.path.isfile(resolved):
        raise FileNotFoundError(f"kernel library not found: {resolved}; build it with `bash test_custom_ops.sh cmake`")
    ctypes.CDLL(resolved, mode=ctypes.RTLD_GLOBAL)
    _loaded = resolved
    return resolved
