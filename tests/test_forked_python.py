"""tests/forked_python.py, the tests' new processes: a child forked from the template is where a new interpreter
would be after importing torch and executorch.exir (the caller's environment, path, working directory, a new
__main__, nothing of this repository, an empty kernel registry), and where it could not be, a new interpreter runs."""

import os
import subprocess
import sys
import time

import pytest

import forked_python
from helpers import REPO_ROOT, TESTS_DIR

# What a child sees of its start, printed as one line of repr(): compared between a forked child and a new interpreter.
STARTED = """
import os, sys
print(repr([sys.path[:3], os.getcwd(), os.environ.get("CUSTOM_OPS_PROBE"), sys.argv, __name__,
            sorted(m for m in sys.modules if m.split(".")[0] in ("flow", "my_ops", "models", "helpers"))]))
print(repr(["torch" in sys.modules, os.getppid()]))
"""


def environment(**extra) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([REPO_ROOT, TESTS_DIR]), **extra)


def run(code, env, timeout=120, fresh_imports=False):
    returncode, out, err = forked_python.run(code, env, timeout, fresh_imports)
    assert returncode == 0, err[-3000:]
    return [eval(line) for line in out.splitlines()]


def test_a_forked_child_starts_as_a_new_interpreter_would_after_the_imports(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env = environment(CUSTOM_OPS_PROBE="forked")
    (forked, (preimported, parent)), (fresh, (fresh_preimported, fresh_parent)) = (
        run(STARTED, env), run(STARTED, env, fresh_imports=True))
    assert forked == fresh == [["", REPO_ROOT, TESTS_DIR], str(tmp_path), "forked", ["-c"], "__main__", []]
    assert preimported and parent != os.getpid()  # the template's child
    assert not fresh_preimported and fresh_parent == os.getpid()


def test_a_module_and_code_with_arguments_start_as_python_m_and_c_would(tmp_path):
    (tmp_path / "started_probe.py").write_text("import sys\nprint(repr([__spec__ and __spec__.name, sys.argv]))\n"
                                               + STARTED)
    env = environment(CUSTOM_OPS_PROBE="module")
    for args in (["-m", "started_probe", "one", "--two"], ["-c", "import started_probe", "one"],
                 ["-c", STARTED, "one", "--two"]):
        forked = forked_python.python(args, env, 120, cwd=str(tmp_path))
        fresh = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=tmp_path,
                               timeout=120)
        assert forked.returncode == fresh.returncode == 0, (forked.stderr[-3000:], fresh.stderr[-3000:])
        assert forked.stdout.splitlines()[:-1] == fresh.stdout.splitlines()[:-1]  # all but the parent's pid
        assert eval(forked.stdout.splitlines()[-1])[0] and not eval(fresh.stdout.splitlines()[-1])[0]
    started = eval(forked.stdout.splitlines()[0])
    assert (started[0][0], started[1], started[3]) == ("", str(tmp_path), ["-c", "one", "--two"])


def test_each_child_imports_this_repository_from_its_own_path(tmp_path, monkeypatch):
    # A copy of the repository (the recipe's tests make one) gets its own modules, though a child before it imported
    # this checkout's.
    monkeypatch.chdir(tmp_path)  # `python -c` looks in the working directory first
    (tmp_path / "copy" / "flow").mkdir(parents=True)
    (tmp_path / "copy" / "flow" / "__init__.py").write_text("")
    where = "import flow; print(repr(flow.__file__))"
    assert run(where, environment()) == [os.path.join(REPO_ROOT, "flow", "__init__.py")]
    copy = dict(environment(), PYTHONPATH=str(tmp_path / "copy"))
    assert run(where, copy) == run(where, copy, fresh_imports=True) == [str(tmp_path / "copy" / "flow" / "__init__.py")]


def test_a_kernel_library_loaded_in_one_child_is_not_in_the_next(combined_build):
    registry = """
import ctypes, sys
if LOAD:
    ctypes.CDLL(KERNELS, mode=ctypes.RTLD_GLOBAL)
from executorch.runtime import Runtime
print(repr(sorted(n for n in Runtime.get().operator_registry.operator_names if n.startswith("my_ops::"))))
"""
    setup = f"KERNELS = {combined_build.kernel_lib!r}\n"
    (loaded,), (after,) = (run(setup + "LOAD = True\n" + registry, environment()),
                           run(setup + "LOAD = False\n" + registry, environment()))
    assert "my_ops::mul4.out" in loaded
    assert after == []


def test_an_environment_the_template_read_at_start_gets_a_new_interpreter():
    # libgomp reads OMP_NUM_THREADS when torch loads it: a child of the template could not take another value.
    (_, (preimported, parent)) = run(STARTED, environment(OMP_NUM_THREADS="1"))
    assert not preimported and parent == os.getpid()
    assert forked_python.template_environment(environment(OMP_NUM_THREADS="1")) != \
        forked_python.template_environment(environment())
    assert forked_python.template_environment(dict(environment(CUSTOM_OPS_ISA="avx2"), PYTHONPATH="/")) == \
        forked_python.template_environment(environment())


def test_exit_status_errors_and_timeouts_are_a_new_interpreters():
    env = environment()
    for code, expected in (("import sys; sys.exit(3)", 3), ("1 / 0", 1), ("import os, signal; os.kill(os.getpid(), "
                                                                         "signal.SIGTERM)", -15)):
        forked = forked_python.run(code, env, 60)
        fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
        assert forked[0] == fresh.returncode == expected, (code, forked, fresh.stderr)
        assert forked[2].splitlines()[-1:] == fresh.stderr.splitlines()[-1:]
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        forked_python.run("import time; time.sleep(120)", env, 2)
    assert time.monotonic() - started < 60  # the child killed at the timeout, not waited for
    assert forked_python.run("print('next')", env, 60)[:2] == (0, "next\n")  # the template serves the next call


# flow/forked_steps.py: a mode's `python -m` step forked from the mode's process.
PROBE_MODULE = """
import sys
if __name__ == "__main__":
    print(repr([sys.argv[1:], __name__, __file__ == sys.argv[0]]), flush=True)
    if sys.argv[1] == "raise":
        raise ValueError("probe")
    if sys.argv[1] == "message":
        sys.exit("a message")
    sys.exit(int(sys.argv[1]))
"""


def test_a_modes_step_forked_from_it_runs_as_python_m_would(tmp_path):
    (tmp_path / "step_probe.py").write_text(PROBE_MODULE)
    env = dict(environment(), PYTHONPATH=os.pathsep.join([str(tmp_path), REPO_ROOT]))
    cases = ["0", "3", "raise", "message"]
    forking = ("from flow import forked_steps\n"
               f"codes = [forked_steps.run_module('step_probe', [case]) for case in {cases!r}]\n"
               "print(repr(codes))\n")
    returncode, forked_out, forked_err = forked_python.run(forking, env, 120)
    assert returncode == 0, forked_err[-3000:]
    *printed, codes = forked_out.splitlines()
    expected_codes, expected_printed, expected_last_error_lines = [], [], []
    for case in cases:
        proc = subprocess.run([sys.executable, "-m", "step_probe", case], capture_output=True, text=True, env=env,
                              timeout=120)
        expected_codes.append(proc.returncode)
        expected_printed.append(proc.stdout.strip())
        expected_last_error_lines += proc.stderr.splitlines()[-1:]
    assert eval(codes) == expected_codes == [0, 3, 1, 1]
    assert printed == expected_printed
    assert [line for line in forked_err.splitlines() if line in expected_last_error_lines] == \
        expected_last_error_lines == ["ValueError: probe", "a message"]
