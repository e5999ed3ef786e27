"""New interpreters for the tests, forked from one that has already imported torch and executorch.exir.

A test that needs an empty kernel registry, or an environment of its own, runs its code in another process
(helpers.run_in_fresh_python), and a test of a command line runs it as a user would (`python -m flow.verify ...`).
Started anew, each such process spends 4-7 CPU-s importing torch and the exporter before its own work: most of that
work on two cores. Here a template interpreter imports them once per pytest worker and forks a child per call
(python(): `-c CODE` or `-m MODULE`, then the arguments); the child takes the caller's environment, path and working
directory, so it is where a new interpreter would be after those imports, with nothing of this repository imported.

A fork cannot change what was read while the template imported (libgomp reads OMP_* at load, Inductor its config), so
a call whose environment differs from the template's in anything but READ_AFTER_START still starts a new interpreter,
as does a call that asks for fresh imports (a check of what importing something imports).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time

PREIMPORTED = ("torch", "executorch.exir")

# Read by a child after it starts, so a child's may differ from the template's: its module path; Inductor's cache
# folder (read at each compile) and the address it passes to the code it loads, both of which it sets in a process that
# compiled, as the workers do; Intel's OpenMP settings (torch here loads libgomp), which Inductor and scikit-learn set;
# the project's own settings (the kernel library reads them when it loads, flow's modules when imported); pytest's.
READ_AFTER_START = ("PYTHONPATH", "TORCHINDUCTOR_CACHE_DIR", "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR",
                    "KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK")
READ_AFTER_START_PREFIXES = ("CUSTOM_OPS_", "PYTEST_")

# The template: imports PREIMPORTED, then forks a child per request (a JSON line on one pipe) and replies on another
# with the child's pid and its own CPU seconds so far, then with the child's exit status and CPU seconds. A child
# runs its arguments as `python -c CODE ARG...` or `python -m MODULE ARG...` would, in a new __main__.
_TEMPLATE = r"""
import gc, importlib, json, os, runpy, sys, types
for name in sys.argv[3:]:
    importlib.import_module(name)
gc.freeze()  # the children's collections skip these objects: they would touch (and copy) every page of them
requests, replies = os.fdopen(int(sys.argv[1]), "r"), os.fdopen(int(sys.argv[2]), "w")
base_path = sys.path[1:]  # after the entry `python -c` puts first
for line in requests:
    request = json.loads(line)
    sys.stdout.flush(), sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        requests.close(), replies.close()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        option, target, *arguments = request["args"]
        first = "" if option == "-c" else os.getcwd()  # what each option puts first on the path
        sys.path[:] = [first, *filter(None, request["env"].get("PYTHONPATH", "").split(os.pathsep)), *base_path]
        sys.path_importer_cache.clear()
        importlib.invalidate_caches()
        sys.argv = [option, *arguments]
        main = types.ModuleType("__main__")
        main.__builtins__ = __builtins__
        sys.modules["__main__"] = main
        if option == "-c":
            exec(compile(target, "<string>", "exec"), main.__dict__)
        else:  # sets argv[0] to the module's file, as -m does
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        sys.exit(0)
    replies.write(json.dumps({"pid": pid, "cpu": os.times().user + os.times().system}) + "\n")
    replies.flush()
    _, status, usage = os.wait4(pid, 0)
    replies.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status),
                              "cpu": usage.ru_utime + usage.ru_stime}) + "\n")
    replies.flush()
"""


def template_environment(env: dict[str, str]) -> dict[str, str]:
    """The part of an environment a child cannot change after the template read it."""
    return {k: v for k, v in env.items() if k not in READ_AFTER_START and not k.startswith(READ_AFTER_START_PREFIXES)}


class _Template:
    def __init__(self, env: dict[str, str]):
        self.environment = template_environment(env)
        self._messages = tempfile.TemporaryFile()  # what the template says while it imports, shown if it dies
        requests_read, self._requests = os.pipe()
        self._replies, replies_write = os.pipe()
        try:  # started in / so that nothing of the working directory is importable while it imports
            self.process = subprocess.Popen(
                [sys.executable, "-c", _TEMPLATE, str(requests_read), str(replies_write), *PREIMPORTED],
                pass_fds=(requests_read, replies_write), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=self._messages, env=self.environment, cwd="/")
        finally:
            os.close(requests_read), os.close(replies_write)
        self._pending = b""
        self._template_cpu = 0.0

    def _reply(self, deadline: float | None) -> dict | None:
        while b"\n" not in self._pending:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self._replies], [], [], wait)[0]:
                return None
            chunk = os.read(self._replies, 4096)
            if not chunk:
                self._messages.seek(0)
                raise RuntimeError(f"the template interpreter exited ({self.process.wait()}):\n"
                                   f"{self._messages.read().decode(errors='replace')[-3000:]}")
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return json.loads(line)

    def run(self, args: list[str], env: dict[str, str], cwd: str, timeout: float) -> tuple[int, str, str, float]:
        with tempfile.TemporaryDirectory(prefix="forked_python") as folder:
            out, err = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
            request = {"args": args, "env": env, "cwd": cwd, "stdout": out, "stderr": err}
            os.write(self._requests, (json.dumps(request) + "\n").encode())
            started = self._reply(None)
            pid, template_cpu = started["pid"], started["cpu"] - self._template_cpu
            self._template_cpu = started["cpu"]
            done = self._reply(time.monotonic() + timeout)
            if done is None:
                os.kill(pid, signal.SIGKILL)
                self._reply(None)
                raise subprocess.TimeoutExpired(["forked python", *(a[:200] for a in args)], timeout)
            with open(out, errors="replace") as o, open(err, errors="replace") as e:
                return done["returncode"], o.read(), e.read(), template_cpu + done["cpu"]


_template: _Template | None = None
_lock = threading.Lock()
cpu_seconds = 0.0  # of this process's template and its children (os.times() counts only this process's own children)


def python(args: list[str], env: dict[str, str], timeout: float, cwd: str | None = None,
           fresh_imports: bool = False) -> subprocess.CompletedProcess:
    """`python -c CODE ARG...` or `python -m MODULE ARG...` with `env`, in `cwd` (else this process's), its output
    captured as text: a child of the template where it can be one."""
    global _template, cpu_seconds
    if args[:1] not in (["-c"], ["-m"]) or len(args) < 2:
        raise ValueError(f"expected -c CODE or -m MODULE, then the arguments: {args[:2]}")
    cwd = os.path.abspath(cwd or os.getcwd())
    with _lock:
        if not fresh_imports and os.environ.get("CUSTOM_OPS_FORKED_PYTHON") != "0":
            if _template is None or _template.process.poll() is not None:
                _template = _Template(os.environ)
            if template_environment(env) == _template.environment:
                returncode, out, err, cpu = _template.run(list(args), env, cwd, timeout)
                cpu_seconds += cpu
                return subprocess.CompletedProcess([sys.executable, *args], returncode, out, err)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, errors="replace", timeout=timeout,
                          env=env, cwd=cwd)


def run(code: str, env: dict[str, str], timeout: float, fresh_imports: bool = False) -> tuple[int, str, str]:
    """`python -c code` with `env` (returncode, stdout, stderr)."""
    proc = python(["-c", code], env, timeout, fresh_imports=fresh_imports)
    return proc.returncode, proc.stdout, proc.stderr
