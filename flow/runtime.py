"""The ExecuTorch Python runtime for this project's programs: loading the kernel library into the process (once), and
loading untrusted programs with the checks the runtime itself skips.

    from flow.runtime import load_kernel_library, load_method_checked
    load_kernel_library("cmake-out/custom_ops_1/libcustom_ops_lib.so")
    method = load_method_checked("custom_ops_1.pte")          # a ValueError for a corrupt or oversized program
    outputs = method.execute([torch.ones(2, 3)])             # as often as you like, for as long as `method` lives

Three behaviours of ExecuTorch's Python runtime end or corrupt the process instead of raising, so these helpers stop
them first (and a fourth hangs it: load_kernel_library() makes the threadpool, see _make_threadpool()):
- registering an operator twice aborts ("Re-registering my_ops::mul3.out"), which two kernel libraries with a common op
  do: a process takes one kernel library, the same one again is a no-op, a second is a RuntimeError;
- a program whose output refers past its values aborts in Method::get_outputs (an ET_CHECK), and one whose planned
  buffers are huge ends in bad_alloc: load_method_checked() makes the C++ runner's pre-flight checks first
  (flow.program.check) and refuses both, and names each operator no loaded library registers, with what to do about
  it by its kind (MissingOperatorError), where the runtime's own error is a number;
- a Method does not keep its Program alive, and the Program owns the program's bytes: `load_program(p).load_method(m)`
  leaves a Method reading freed memory once the Program is collected. load_method_checked() returns a method that
  holds its Program.
And one kernel would not be the project's: the pybindings load a method without method-scoped kernels, where the C++
runner puts an op whose declared kernel replaces ExecuTorch's (replaces_executorch). load_method_checked() registers
that kernel under the kernel key of each of the program's calls instead, which ExecuTorch prefers to its own.
And one slows it: a program loaded from a Python bytes object is read where the bytes sit, 48 bytes past a cache line,
so every weight a kernel loads 64 bytes at a time straddles two lines (a 513 MiB float32 program decoded 55 tokens/s
so, 70 from its file). load_method_checked() hands the runtime the checked bytes as a file (see _as_file()), and a large
program as a file the system can map with 2 MiB pages (see _unnamed_file()): a decode step streams every weight, and
a 235 MiB 4-bit program decoded 1.34x as fast on one core from 2 MiB pages as from 4 KiB ones (AMD EPYC, the same
program loaded both ways in one process, 6 alternating rounds).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import warnings
from typing import Any, Sequence

from .lazy_exir import defer_exir_package
from .program import DEFAULT_MAX_MEMORY, MethodSpec, check

_loaded: str | None = None


# The kernels count which path did the work (kernel_helpers/elementwise_loop.h) only in a process started with this
# environment.
COUNT_PATHS = {"CUSTOM_OPS_COUNT_PATHS": "1"}

# The counters of elementwise_loop.h's Path enum, in its order: baseline to half_arithmetic name where the vector work
# ran, pool_handoffs the ranges handed to the thread pool's workers (kernel_contract.h's parallel_for), then per user
# of the pool the thread-time its hand-offs held it and the time its tasks worked, in nanoseconds, then the outputs of
# the row formats' panels and of the block formats' ARM64 dot-product tiles (sdot, smmla).
PATH_COUNTERS = ["serial", "parallel_tasks", "streamed_blocks", "unaligned_heads",
                 "baseline", "avx2", "avx512", "half_arithmetic", "pool_handoffs",
                 "linear_pool_ns", "linear_work_ns", "attention_pool_ns", "attention_work_ns", "other_pool_ns",
                 "other_work_ns", "layer_pool_ns", "layer_work_ns", "row_panel_outputs",
                 "dot_product", "matrix_multiply"]
POOL_USERS = ("linear", "attention", "other", "layer")


def path_counts(library: str) -> dict[str, int]:
    """A kernel library's path counters by name (custom_ops_elementwise_stats), read in a process started with
    COUNT_PATHS."""
    counts = (ctypes.c_uint64 * len(PATH_COUNTERS))()
    if ctypes.CDLL(library).custom_ops_elementwise_stats(counts, len(PATH_COUNTERS)) != 1:
        raise AssertionError(f"{library} counted nothing: start the process with CUSTOM_OPS_COUNT_PATHS=1")
    return dict(zip(PATH_COUNTERS, counts))


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
    _make_threadpool()
    return resolved


def _make_threadpool() -> None:
    """ExecuTorch makes its threadpool on a kernel's first parallel call, and making it may log, which in this runtime
    goes through Python and needs the GIL. Several threads making their first calls at once deadlock: one holds the
    GIL inside Method.execute, waiting for the pool's initializer, which another thread runs and which waits for the
    GIL (seen in a clean clone's test run). Made here, on the loading thread, the pool exists before any program runs."""
    defer_exir_package()
    from executorch.extension.pybindings import portable_lib

    portable_lib._threadpool_get_thread_count()


class CheckedMethod:
    """A loaded method together with the Program it came from, which owns the program's bytes: while this object
    lives, so does everything the method reads."""

    def __init__(self, program, name: str, spec: MethodSpec):
        self.program = program
        self.spec = spec  # what flow.program read of the method: its inputs, outputs and operators
        self._method = program.load_method(name)

    def execute(self, inputs: Sequence[Any]) -> list[Any]:
        return list(self._method.execute(inputs))

    @property
    def metadata(self):
        return self._method.metadata


def _write_all(fd: int, data) -> None:
    view = memoryview(data)
    while view:  # os.write may take less than it is given
        view = view[os.write(fd, view):]


def _as_file(data: bytes) -> int | None:
    """A sealed in-memory file holding `data` (its descriptor), or None where the system has none (memfd is Linux's).
    The runtime maps a program it loads from a path at a page boundary, so the program's 64-byte-aligned tensors stay
    aligned; the seals make it the very bytes that were checked, whatever happens to the .pte meanwhile."""
    if not hasattr(os, "memfd_create"):
        return None
    import fcntl

    fd = os.memfd_create("checked.pte", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        _write_all(fd, data)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE)
    except BaseException:
        os.close(fd)
        raise
    return fd


# Programs with more data than this go in an unnamed file on the program's own disk (_unnamed_file()): past what a
# core's TLB reaches on 4 KiB pages (12 MiB on Zen 4's 3072 entries), and few enough that tests' small programs stay
# in memory alone.
LARGE_PROGRAM_BYTES = 32 << 20


def _unnamed_file(data, directory: str) -> int | None:
    """An unnamed file (O_TMPFILE, mode 0600: no path reaches it, it is gone when the runtime lets go) in `directory`
    holding `data`, or None where the filesystem makes none, or has no room. The runtime maps a program it loads from
    a path: the page cache holds a file written in one piece in large folios (ext4 and XFS on recent kernels) and maps
    them with 2 MiB pages, where a memfd's shared memory stays on 4 KiB pages on a default system
    (/sys/kernel/mm/transparent_hugepage/shmem_enabled: never). Unlike a sealed memfd, a process of the same user could
    still write to it through /proc; such a process could as well write to this one's memory."""
    flag = getattr(os, "O_TMPFILE", None)
    if flag is None:
        return None
    try:
        fd = os.open(directory or ".", flag | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except OSError:  # no O_TMPFILE on this filesystem, a read-only or missing folder
        return None
    try:
        _write_all(fd, data)
    except OSError:  # out of space
        os.close(fd)
        return None
    return fd


def _checked_copy(path: str) -> tuple[Any, int | None]:
    """(the bytes of the file at `path` to check, a descriptor of a file no path reaches that holds exactly those bytes,
    or None where the system makes none: the runtime then takes the bytes themselves). A large file is written into an
    unnamed file beside it (_unnamed_file) from a mapping of it, and checked where the runtime reads it, in a mapping
    of that copy: the process neither reads it into memory first nor holds it twice (an 8B program's 4.6 GB loads in
    3.7-3.8 s at a 5.1 GiB peak; read and written back, twice the memory). A small one is read and handed over in a
    sealed memfd (_as_file)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size > LARGE_PROGRAM_BYTES:
            # Populated first: a write from pages not yet mapped reaches the page cache 4 KiB at a time, and the copy
            # would be mapped on 4 KiB pages (seen: none of an 8B program's 4.6 GB on 2 MiB pages).
            source = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE | getattr(mmap, "MAP_POPULATE", 0),
                               prot=mmap.PROT_READ)
            try:
                fd = _unnamed_file(source, os.path.dirname(os.path.abspath(path)))
            finally:
                source.close()
            if fd is not None:
                try:
                    return memoryview(mmap.mmap(fd, 0, prot=mmap.PROT_READ)), fd
                except BaseException:
                    os.close(fd)
                    raise
        data = f.read()
    return data, _as_file(data)


class ReplacedKernelWarning(UserWarning):
    """A program calls an op whose declared kernel replaces ExecuTorch's (replaces_executorch), and the loaded kernel
    library does not hold it: ExecuTorch's own kernel runs."""


class MissingOperatorError(RuntimeError):
    """The program calls an operator no kernel library in this process registers (the runtime's "Missing operator")."""


def _declared_replacing(library: ctypes.CDLL) -> list[str]:
    """The ops whose declared kernel replaces ExecuTorch's, as the kernel library was built with them (its
    custom_ops_declared_replacing(): every declared one, selected or not, null-terminated)."""
    listed = getattr(library, "custom_ops_declared_replacing", None)
    if listed is None:
        return []
    listed.restype = ctypes.POINTER(ctypes.c_char_p)
    names, found = listed(), []
    while names[len(found)] is not None:
        found.append(names[len(found)].decode())
    return found


def _register_replacing_kernels(spec: MethodSpec, program_name: str) -> None:
    """The pybindings load a method without method-scoped kernels, so for an op whose declared kernel replaces
    ExecuTorch's (replaces_executorch), the loaded kernel library registers its kernel globally under the kernel key of
    each call the program makes (custom_ops_register_keyed), which ExecuTorch prefers to its own fallback kernel."""
    if _loaded is None:
        return  # nothing of the project's is loaded: ExecuTorch's kernels serve every op the loader lets through
    library = ctypes.CDLL(_loaded)
    declared = _declared_replacing(library)
    left = []
    for name in [op for op in dict.fromkeys(spec.operators) if op in declared]:
        keys = dict.fromkeys(key for index, key in spec.kernel_keys if spec.operators[index] == name)
        results = {library.custom_ops_register_keyed(name.encode(), key.encode()) for key in keys}
        if -1 in results:
            raise RuntimeError(f"{program_name}: registering the kernel library's {name} under its calls' kernel keys "
                               "failed (ExecuTorch's kernel registry is full?)")
        if 1 in results:
            left.append(name)
    if left:
        warnings.warn(f"{program_name}: ExecuTorch's own kernel runs for {', '.join(left)} in this process: the loaded "
                      "kernel library has no kernel for it (select the op and rebuild the library)",
                      ReplacedKernelWarning, stacklevel=3)


def load_method_checked(path: str | os.PathLike, method: str = "forward", max_memory: int = DEFAULT_MAX_MEMORY,
                        data_path: str | os.PathLike | None = None) -> CheckedMethod:
    """flow.program.check() (a ValueError naming the problem), then the runtime's own load with full verification
    (InternalConsistency) of the same bytes. data_path: the named data file (.ptd) of a program exported with its
    weights outside it, checked as the runner checks it (flow/data_file.py) and handed over as the bytes checked. The
    kernel library must be loaded first."""
    defer_exir_package()
    data, fd = _checked_copy(os.fspath(path))
    data_fd = None
    try:
        spec = check(data, method, max_memory)
        data_arg, data_fd = _checked_data_file(spec, os.fspath(path),
                                               None if data_path is None else os.fspath(data_path))
        return _load_checked(data, fd, spec, os.fspath(path), method, data_arg)
    finally:
        for held in (fd, data_fd):
            if held is not None:
                os.close(held)  # the runtime holds its own mapping or descriptor


def _load_checked(data, fd: int | None, spec, path: str, method: str, data_path: str | None) -> CheckedMethod:
    from executorch.runtime import Runtime

    registered = set(Runtime.get().operator_registry.operator_names)
    if missing := [name for name in dict.fromkeys(spec.operators) if name not in registered]:
        from .runtime_kernels import missing_operator_advice

        raise MissingOperatorError(f"{os.path.basename(path)}: the program calls operator(s) that no kernel "
                                   f"library loaded into this process registers: {', '.join(missing)}. "
                                   f"{missing_operator_advice(missing)}")
    _register_replacing_kernels(spec, os.path.basename(path))
    if fd is None:
        return CheckedMethod(Runtime.get().load_program(data, data_path=data_path), method, spec)
    return CheckedMethod(Runtime.get().load_program(f"/proc/self/fd/{fd}", data_path=data_path), method, spec)


def _checked_data_file(spec, program: str, data_path: str | None) -> tuple[str | None, int | None]:
    """(the path the runtime reads, the descriptor to close after) of the checked bytes of the data file `data_path`
    that the program `spec` needs ((None, None) when it needs none); ProgramError / DataFileError naming what is missing
    or wrong, in the runner's words."""
    from .data_file import check as check_data_file
    from .program import ProgramError

    if data_path is None:
        if spec.external_tensors:
            raise ProgramError(f"'{program}' keeps {spec.external_tensors} tensor(s) in a named data file outside it "
                               "(exported with its weights in a .ptd): pass that file as data_path, the one written "
                               "beside the program by the same export")
        return None, None
    if not spec.external_tensors:
        raise ProgramError(f"data_path gives '{data_path}', but '{program}' names no data outside itself (its weights "
                           "are inside it): drop data_path, or give the program exported with that data file")
    # the bytes checked, not the path again: a file changed after the check is not read
    data, fd = _checked_copy(data_path)
    try:
        check_data_file(data, data_path)
    except BaseException:
        if fd is not None:
            os.close(fd)
        raise
    return (data_path, None) if fd is None else (f"/proc/self/fd/{fd}", fd)
