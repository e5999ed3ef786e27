"""A mode's Python steps (an op's export, its verification, ...) each in a process of its own, forked from the mode's
process once that has imported torch and ExecuTorch's exporter. Started as `python -m`, every step spends its first
4-7 CPU-s importing them (a 2-core AMD EPYC), and the cmake mode runs two steps an op. The mode's process registers no
op and loads no kernel library, so a child is where `python -m MODULE` would be after those imports.
CUSTOM_OPS_FORKED_STEPS=0 starts each step as a new interpreter instead.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import os
import runpy
import subprocess
import sys
import traceback

PREIMPORTED = ("torch", "executorch.exir")


def _exit_status(code) -> int:
    """What `python` exits with for SystemExit(code)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def run_module(module: str, arguments: list[str]) -> int:
    """`python -m module arguments`; its exit status (-N for a signal, as subprocess reports it)."""
    if os.environ.get("CUSTOM_OPS_FORKED_STEPS") == "0" or not hasattr(os, "fork"):
        return subprocess.run([sys.executable, "-m", module, *arguments]).returncode
    if not all(name in sys.modules for name in PREIMPORTED):
        for name in PREIMPORTED:
            importlib.import_module(name)
        gc.freeze()  # the children's collections skip these objects: they would touch (and copy) every page of them
    sys.stdout.flush(), sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            sys.argv = [module, *arguments]  # run_module puts the module's file first, as `python -m` does
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            status = 0
        except SystemExit as stop:
            status = _exit_status(stop.code)
        except BaseException:
            traceback.print_exc()
        finally:
            try:  # what an interpreter does at its exit: logging's flush, temporary files' cleanup
                atexit._run_exitfuncs()
                sys.stdout.flush(), sys.stderr.flush()
            finally:
                os._exit(status)  # here: never back into the mode's own frames
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)
