"""What a process needs to export and decode with the project's ops: the ops known to PyTorch (export) and their
ExecuTorch kernels (decoding in the Python runtime), from the my_ops wheel or a CMake build of the repository
(`cmake-out/all_ops` by default in a checkout); and programs exported once per model, precision and source, kept in a
cache folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import tempfile
from importlib import metadata
from typing import Callable

import torch

from ..file_cache import cached  # flow/file_cache.py, which the wheel carries

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # my_ops/
CHECKOUT = os.path.dirname(PACKAGE_DIR)
AOT_LIBRARY = "libcustom_ops_aot_lib.so"  # the ops for PyTorch, in a CMake build
KERNEL_LIBRARY = "libcustom_ops_lib.so"  # their ExecuTorch kernels, in a CMake build


# The terminal's stderr while libraries_quiet() holds the process's: what the user is told goes there.
_user_stderr: list = []


def say(text: str) -> None:
    """A line for the user on stderr (the terminal's own, also while the libraries' messages are kept apart)."""
    stream = _user_stderr[-1] if _user_stderr else sys.stderr
    print(text, file=stream, flush=True)


@contextlib.contextmanager
def libraries_quiet(quiet: bool = True):
    """While active (and `quiet`), whatever the libraries write to the process's stderr (ExecuTorch's threadpool logs
    from C++, torchao's load failures, torch's deprecation warnings) goes to a log file instead of the terminal, where
    it would land in the middle of the generated text; say() still reaches the terminal. Yields the log's path (None
    when not quiet); the log is removed when the block ends without an exception."""
    if not quiet:
        yield None
        return
    sys.stderr.flush()
    saved = os.dup(2)
    log = tempfile.NamedTemporaryFile(prefix="my_ops-", suffix=".log", delete=False)
    os.dup2(log.fileno(), 2)
    _user_stderr.append(os.fdopen(os.dup(saved), "w"))
    failed = True
    try:
        yield log.name
        failed = False
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        _user_stderr.pop().close()
        log.close()
        if not failed:
            os.remove(log.name)


def default_build_dir() -> str | None:
    """The checkout's build with every op, when my_ops is the repository's own package and it was built."""
    build = os.path.join(CHECKOUT, "cmake-out", "all_ops")
    return build if os.path.isfile(os.path.join(build, KERNEL_LIBRARY)) else None


def build_hint() -> str:
    if os.path.isfile(os.path.join(CHECKOUT, "test_custom_ops.sh")):
        return f"build it with `bash {os.path.join(CHECKOUT, 'test_custom_ops.sh')} real` (cmake-out/all_ops), or"
    return "build the repository (bash test_custom_ops.sh real) and"


def register_ops(build_dir: str | None) -> None:
    """Every op of the project known to PyTorch: the build's AOT library first when given (then `import my_ops` adds
    the Python-registered ones and loads nothing twice), else the installed wheel's."""
    if build_dir is not None:
        library = os.path.join(build_dir, AOT_LIBRARY)
        if not os.path.isfile(library):
            raise FileNotFoundError(f"{library} not found: {build_hint()} pass --build_dir")
        if not hasattr(torch.ops.my_ops, "linear_blocks"):
            torch.ops.load_library(library)
    import my_ops  # noqa: F401  (registers what is not registered yet)


def checked_loader():
    """The loader of untrusted programs (flow/runtime.py: the runner's checks before the runtime reads a byte, each
    operator no loaded library registers named with what to do, the kernels that replace ExecuTorch's registered
    under the program's kernel keys, the program's bytes handed over as checked): the checkout's flow.runtime when
    this my_ops is the checkout's own package, else the wheel's copy, my_ops.runtime."""
    import my_ops

    if not my_ops._EDITABLE:
        from .. import runtime

        return runtime
    if CHECKOUT not in sys.path:
        sys.path.append(CHECKOUT)
    from flow import runtime

    return runtime


def load_kernels(library: str) -> None:
    """The ops' ExecuTorch kernels into the runtime's registry (ExecuTorch's Python runtime sees them), through the
    checked loader (the library it registers replacing kernels from): once per process; a second library is a
    RuntimeError, since registering the same kernels again aborts."""
    if not os.path.isfile(library):
        raise FileNotFoundError(f"{os.path.realpath(library)} not found: {build_hint()} pass --kernel_library")
    checked_loader().load_kernel_library(library)


def load_method(pte: str, data_path: str | None = None):
    """(program, method) of `pte` in ExecuTorch's Python runtime, its weights read from the named data file
    `data_path` when it was exported with them outside it (export --ptd); keep the program as long as the method (it
    owns the bytes the method reads). Through checked_loader(): a ValueError names what is wrong with either file, a
    MissingOperatorError each operator no loaded library registers. Decoding shares the machine's cores with
    ExecuTorch's thread pool, so PyTorch's own threads, which spin between ops, are limited to one (with two cores
    they cost a third of the speed)."""
    torch.set_num_threads(1)
    method = checked_loader().load_method_checked(pte, data_path=data_path)
    return method.program, method


def versions() -> str:
    found = []
    for package in ("torch", "executorch", "transformers", "torchao"):
        try:
            found.append(f"{package}={metadata.version(package)}")
        except metadata.PackageNotFoundError:
            found.append(f"{package}=absent")
    return " ".join(found)


# The sources an export runs (the loading, a GGUF file's blocks, the swap, the packing, the export itself); the command
# line, the tokenizer and perplexity code can change without making the programs again.
EXPORT_SOURCES = ("__init__.py", "hf/__init__.py", "hf/checkpoint.py", "hf/gguf_file.py", "hf/gguf_blocks.py",
                  "hf/swap.py", "hf/quantize.py", "hf/fuse.py", "hf/to_program.py", "hf/disk_weights.py")
# Reached from checkpoint.py, but what they make is no part of a program (a checkpoint's tokenizer).
NOT_IN_PROGRAMS = ("hf/gguf_tokenizer.py",)


def package_hash() -> str:
    """A hash of the my_ops sources an export runs (EXPORT_SOURCES)."""
    h = hashlib.sha256()
    for relative in EXPORT_SOURCES:
        h.update(relative.encode() + b"\0")
        with open(os.path.join(PACKAGE_DIR, relative), "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


# The ops my_ops.hf puts into programs (the swap, the quantizers, the fusion passes): a program's identity takes their
# schemas, so an op declared beside them keeps every cached program. tests/test_hf.py checks this list against the
# ops the my_ops.hf modules name.
PROGRAM_OPS = ("rms_norm", "add_rms_norm", "sdpa_with_cache", "update_cache", "rope", "rope_sdpa_with_cache",
               "silu_mul", "gelu_mul", "linear_blocks", "embedding_blocks", "decoder_layer")


def schema_hash(ops: tuple[str, ...] = PROGRAM_OPS) -> str:
    """The registered schemas of `ops` (my_ops' names, every overload): what a program takes from the op library (a
    kernel's body is the runtime's business, so rebuilding a kernel keeps the programs)."""
    import torch

    schemas = sorted(str(torch._C._get_schema(*(name.split(".", 1) + [""])[:2]))
                     for name in torch._C._dispatch_get_all_op_names()
                     if name.startswith("my_ops::") and name[len("my_ops::"):].split(".")[0] in ops)
    return hashlib.sha256("\n".join(schemas).encode()).hexdigest()[:16]


def default_cache_dir() -> str:
    """Where exported programs are kept: $MY_OPS_CACHE_DIR, else ~/.cache/my_ops/programs (outside any checkout, so a
    fresh clone reuses them)."""
    return os.environ.get("MY_OPS_CACHE_DIR", os.path.expanduser(os.path.join("~", ".cache", "my_ops", "programs")))


def export_cached(checkpoint, quantize: str | None, max_seq_len: int, cache_dir: str,
                  on_export: Callable[[], None] | None = None) -> tuple[str, bool]:
    """The program of `checkpoint` at `quantize`: exported once per model file, settings, package versions, my_ops
    sources and op schemas into cache_dir; (path, whether it was exported now; on_export() is called first then). The
    checkpoint's model is swapped in place when it is exported."""
    from .to_program import export_checkpoint

    def make(path: str) -> None:
        if on_export is not None:
            on_export()
        # a checkpoint on a file's own tensors: they wait on disk while the program is emitted (held once, not twice)
        with tempfile.TemporaryDirectory(dir=os.path.dirname(path), prefix=".weights-") as weights:
            program = export_checkpoint(checkpoint, max_seq_len=max_seq_len, quantize=quantize,
                                        weights_dir=None if checkpoint.dequantized else weights)
            with open(path, "wb") as f:
                program.write_to_file(f)

    # A model cut to its first layers is a program of its own name: the cache keeps the newest of each name.
    cut = f"_{checkpoint.layers}layers" if checkpoint.layers is not None else ""
    name = f"{os.path.splitext(os.path.basename(checkpoint.path.rstrip('/')))[0]}{cut}_{quantize or 'float32'}.pte"
    identity = " ".join([checkpoint.digest(), str(quantize), str(max_seq_len), versions(), package_hash(),
                         schema_hash()])
    return cached(cache_dir, name, identity, make)
