"""Test helpers: paths into a CMake build, and running code in a fresh interpreter (an empty kernel registry)."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(TESTS_DIR)
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)
from flow.dtypes import ELEMENTWISE_DTYPES as ALL_DTYPES  # noqa: E402  (the elementwise kernels' dtypes, by name)
import forked_python  # noqa: E402


@dataclass(frozen=True)
class CMakeBuild:
    build_dir: str

    @property
    def runner(self) -> str:
        return os.path.join(self.build_dir, "custom_ops_executor_runner")

    @property
    def kernel_lib(self) -> str:
        return os.path.join(self.build_dir, "libcustom_ops_lib.so")

    @property
    def aot_lib(self) -> str:
        return os.path.join(self.build_dir, "libcustom_ops_aot_lib.so")


# NaNs with payloads, as bit patterns: signaling and quiet, both signs. Exactness includes their bits.
PAYLOAD_NANS = {"float16": [0x7D01, 0xFE01, 0x7E33], "bfloat16": [0x7F81, 0xFFC1],
                "float32": [0x7F800001, 0xFFC00101, 0x7FA00000], "float64": [0x7FF0000000000001, 0xFFF8000000000101]}


def special_values(dtype):
    """NaN, infinities, -0, a subnormal and NaNs with payloads, in `dtype`."""
    import torch

    plain = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0], dtype=dtype)
    subnormal = (torch.tensor(torch.finfo(dtype).tiny, dtype=dtype) / 4).reshape(1)
    width = 8 * dtype.itemsize
    bits = [b - (1 << width) if b >= 1 << (width - 1) else b for b in PAYLOAD_NANS[str(dtype).removeprefix("torch.")]]
    int_type = {16: torch.int16, 32: torch.int32, 64: torch.int64}[width]
    return torch.cat([plain, subnormal, torch.tensor(bits, dtype=int_type).view(dtype)])


def full_range(shape, dtype, seed: int = 0):
    """Random values across the dtype's whole range: integer products wrap around, half-type products overflow to
    inf, and floats span many magnitudes, with special_values() at the start and the end (in a vector block and in a
    tail)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        magnitudes = 10.0 ** torch.randint(-3, 6, shape, generator=g)
        values = (torch.randn(shape, generator=g, dtype=torch.float64) * magnitudes).to(dtype)
        flat, special = values.view(-1), special_values(dtype)
        n = min(flat.numel(), special.numel())
        flat[:n] = special[:n]
        flat[flat.numel() - n:] = special.flip(0)[:n]
        return values
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, shape, generator=g, dtype=torch.int64).to(dtype)


def copy_repository(destination) -> str:
    """Copies the repository's files (tracked, and untracked but not ignored: no build outputs, no .venv) to
    `destination`, with .venv linked in, so a test can edit files or run the script there; returns the copy's path."""
    import shutil

    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO_ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for relative in filter(None, listed):
        source = os.path.join(REPO_ROOT, relative)
        if os.path.isfile(source):
            target = os.path.join(destination, relative)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy2(source, target)
    if os.path.isdir(os.path.join(REPO_ROOT, ".venv")):
        os.symlink(os.path.join(REPO_ROOT, ".venv"), os.path.join(destination, ".venv"))
    return str(destination)


def write_buckconfig_local(repo) -> None:
    """What `bash test_custom_ops.sh buck2` writes first: where the Buck2 build finds this machine's wheels."""
    with open(os.path.join(repo, ".buckconfig.local"), "w") as f:
        subprocess.run([sys.executable, os.path.join(REPO_ROOT, "tools", "buckconfig_local.py")], stdout=f, check=True)


# Sanitizer findings end the run with this exit code and a report on stderr (sanitized builds only).
SANITIZER_ENV = {"ASAN_OPTIONS": "exitcode=86:detect_leaks=1", "UBSAN_OPTIONS": "print_stacktrace=1:exitcode=86"}


def run_runner(runner: str, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([runner, *args], capture_output=True, text=True, errors="replace", timeout=timeout,
                          env=dict(os.environ, **SANITIZER_ENV))


def run_flow(module: str, *args: str, repo: str = REPO_ROOT, timeout: int = 600,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python -m flow.<module> ARGS` (or `python -m <package.module>`) of the repository `repo` (this one, or a
    copy), as the README runs it: forked from the tests' template interpreter where it can be (forked_python.py)."""
    name = module if "." in module else f"flow.{module}"
    return forked_python.python(["-m", name, *args], dict(os.environ, PYTHONPATH=repo, **(env or {})), timeout,
                                cwd=repo)


# The kernels' path counters (flow/runtime.py reads them), counted only in a process started with COUNT_PATHS.
from flow.runtime import COUNT_PATHS, PATH_COUNTERS, path_counts  # noqa: E402,F401


def compile_commands(build_dir: str) -> list[list[str]]:
    """The compiler command lines of a CMake (Ninja) build tree, each split into its arguments."""
    out = subprocess.run(["ninja", "-C", build_dir, "-t", "commands"], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]))
    commands = [shlex.split(line) for line in out.stdout.splitlines()]
    return [c for c in commands if "-c" in c and any(a.endswith((".cpp", ".cu", ".cc")) for a in c)]


def run_in_fresh_python(code: str, timeout: int = 300, env: dict[str, str] | None = None,
                        fresh_imports: bool = False) -> dict:
    """Runs `code` in a new process (with `env` added to the environment): forked from an interpreter that has
    imported torch and executorch.exir and nothing of this repository (forked_python.py), or, with `fresh_imports`
    (a check of what an import imports), a new interpreter. The code sets `result` to something JSON-serializable,
    which is returned."""
    script = textwrap.dedent(code) + "\nimport json as _json, sys as _sys\n_sys.stdout.write('\\n@@RESULT@@' + _json.dumps(result))\n"
    path = os.pathsep.join([REPO_ROOT, TESTS_DIR, os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, **(env or {}), PYTHONPATH=path)
    returncode, stdout, stderr = forked_python.run(script, env, timeout, fresh_imports)
    if returncode != 0 or "@@RESULT@@" not in stdout:
        raise AssertionError(f"fresh interpreter failed ({returncode}):\n{stderr[-5000:]}")
    return json.loads(stdout.split("@@RESULT@@")[-1])


def registered_operators(kernel_lib: str) -> tuple[list[str], list[str]]:
    """The ExecuTorch registry's operator names after loading only `kernel_lib`, and the names of the library's
    kernels that replace ExecuTorch's, which it keeps out of the registry (custom_ops_method_kernels: ExecuTorch's
    Kernel, a name, a key and a function pointer)."""
    return tuple(run_in_fresh_python(f"""
        import ctypes
        library = ctypes.CDLL({kernel_lib!r}, mode=ctypes.RTLD_GLOBAL)
        from flow.lazy_exir import defer_exir_package
        defer_exir_package()
        from executorch.runtime import Runtime

        class Kernel(ctypes.Structure):
            _fields_ = [("name", ctypes.c_char_p), ("key", ctypes.c_char_p), ("op", ctypes.c_void_p)]

        kernels = ctypes.POINTER(Kernel)()
        count = library.custom_ops_method_kernels(ctypes.byref(kernels)) if hasattr(library, "custom_ops_method_kernels") else 0
        result = [sorted(Runtime.get().operator_registry.operator_names),
                  sorted(kernels[i].name.decode() for i in range(count))]
    """))


# The runner's last-resort line when ExecuTorch itself aborts (ET_CHECK) or throws: one error line, but a finding.
ABORT_HOOK = ("ExecuTorch stopped on a failed internal check", "an exception escaped ExecuTorch")


def outcome(proc, values_known: bool = True) -> str:
    """'ok', 'clean' (one error line, exit 1), or what went wrong. values_known: the program has no constant data, so
    a run that succeeds must print the unmutated program's values (ones in, 3 out); a mutant of a program with
    weights may change them and still be a valid program."""
    if proc.returncode < 0:
        return f"signal {signal.Signals(-proc.returncode).name}"
    if "Sanitizer" in proc.stderr or proc.returncode == 86:
        return "sanitizer report: " + next(l for l in proc.stderr.splitlines() if "Sanitizer" in l)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    if proc.returncode == 1:
        if len(errors) != 1:
            return f"exit 1 with {len(errors)} error lines"
        return "abort hook" if any(h in errors[0] for h in ABORT_HOOK) else "clean"
    if proc.returncode != 0:
        return f"exit {proc.returncode}"
    values = [float(v) for printed in re.findall(r"values: \[([^\]]*)\]", proc.stdout)
              for v in printed.replace("...", "").split(",") if v.strip()]
    wrong = [v for v in values if not (v in (0.0, 1.0, 3.0))] if values_known else []
    return "ok" if not wrong else f"exit 0 with wrong values {wrong[:4]}"


AARCH64_SYSROOT = "/usr/aarch64-linux-gnu"


def qemu(cpu: str) -> list[str]:
    """The emulator command for an aarch64 binary (Debian's qemu-user and cross libc)."""
    return ["qemu-aarch64", "-cpu", cpu, "-L", AARCH64_SYSROOT]


FUZZING_PACKAGES = ["clang", "libclang-rt-14-dev"]


def fuzzing_toolchain_problem() -> str | None:
    """None when clang and its libFuzzer runtime are installed (tools/require_packages.sh installs them as root), else
    what to install."""
    proc = subprocess.run(["bash", os.path.join(REPO_ROOT, "tools", "require_packages.sh"), *FUZZING_PACKAGES],
                          capture_output=True, text=True)
    return None if proc.returncode == 0 else proc.stderr.strip()
