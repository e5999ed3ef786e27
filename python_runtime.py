"""The ExecuTorch Python runtime for this project's programs: loading the kernel library into the process (once), and
loading untrusted programs with the checks the runtime itself skips.

    from python_runtime import load_kernel_library, load_method_checked
    load_kernel_library("cmake-out/custom_ops_1/libcustom_ops_lib.so")
    method = load_method_checked("custom_ops_1.pte")          # a ValueError for a corrupt or oversized program
    outputs = method.execute([torch.ones(2, 3)])

Two of ExecuTorch's behaviours end the whole process instead of raising, so these helpers stop them first:
- registering an operator twice aborts ("Re-registering my_ops::mul3.out"), which two kernel libraries with a common op
  do: a process takes one kernel library, the same one again is a no-op, a second is a RuntimeError;
- a program whose output refers past its values aborts in Method::get_outputs (an ET_CHECK), and one whose planned
  buffers are huge ends in bad_alloc: load_method_checked() reads the program's structure before the runtime does and
  refuses both, like the C++ runner's pre-flight.
"""

from __future__ import annotations

import ctypes
import os

DEFAULT_MAX_MEMORY = 1 << 30  # planned buffers, as the runner's --max_memory default
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


def check_program(data: bytes, method: str = "forward", max_memory: int = DEFAULT_MAX_MEMORY) -> None:
    """Raises ValueError naming the problem when `data` is not a program the runtime can be handed safely: not a
    program, no such method, an input or output value index out of range, or planned buffers beyond max_memory."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    if len(data) < 8 or data[4:6] != b"ET":
        raise ValueError("not an ExecuTorch program (.pte): no ET file identifier")
    try:
        program = deserialize_pte_binary(data)
    except Exception as err:  # noqa: BLE001  (any parse failure means a corrupt program)
        raise ValueError(f"not a readable ExecuTorch program: {type(err).__name__}") from None
    program = getattr(program, "program", program)
    plans = {plan.name: plan for plan in program.execution_plan}
    if method not in plans:
        raise ValueError(f"the program has no method {method!r}; it has: {', '.join(map(str, plans))}")
    plan = plans[method]
    for kind, indices in (("input", plan.inputs), ("output", plan.outputs)):
        for i, index in enumerate(indices):
            if not 0 <= index < len(plan.values):
                raise ValueError(f"{kind} {i} refers to value {index}, but the method has {len(plan.values)} values")
    total = sum(plan.non_const_buffer_sizes)
    if any(size < 0 for size in plan.non_const_buffer_sizes) or total > max_memory:
        raise ValueError(f"the method's memory-planned buffers need {total} bytes, more than max_memory={max_memory}")


def load_method_checked(path: str | os.PathLike, method: str = "forward", max_memory: int = DEFAULT_MAX_MEMORY):
    """check_program(), then the runtime's own load with full verification (InternalConsistency); returns the
    loaded method. The kernel library must be loaded first."""
    from executorch.runtime import Runtime

    with open(path, "rb") as f:
        data = f.read()
    check_program(data, method, max_memory)
    return Runtime.get().load_program(data).load_method(method)
