"""Test helpers: paths into a CMake build, and running code in a fresh interpreter (an empty kernel registry)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


def run_runner(runner: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([runner, *args], capture_output=True, text=True, errors="replace", timeout=120)


def run_in_fresh_python(code: str, timeout: int = 300) -> dict:
    """Runs `code` in a new interpreter; the code sets `result` to something JSON-serializable, which is returned."""
    script = textwrap.dedent(code) + "\nimport json as _json, sys as _sys\n_sys.stdout.write('\\n@@RESULT@@' + _json.dumps(result))\n"
    env = dict(os.environ, PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0 or "@@RESULT@@" not in proc.stdout:
        raise AssertionError(f"fresh interpreter failed ({proc.returncode}):\n{proc.stderr[-5000:]}")
    return json.loads(proc.stdout.split("@@RESULT@@")[-1])


def registered_operators(kernel_lib: str) -> list[str]:
    """The ExecuTorch registry's operator names after loading only `kernel_lib`."""
    return run_in_fresh_python(f"""
        import ctypes
        ctypes.CDLL({kernel_lib!r}, mode=ctypes.RTLD_GLOBAL)
        from executorch.runtime import Runtime
        result = sorted(Runtime.get().operator_registry.operator_names)
    """)
