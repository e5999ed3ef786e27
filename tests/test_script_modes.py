"""test_custom_ops.sh's command line: usage on a missing or unknown mode, a clear message where buck2 is absent, the
test mode's --cpu-report."""

import os
import shutil
import subprocess
import sys

import pytest

from helpers import REPO_ROOT

SCRIPT = os.path.join(REPO_ROOT, "test_custom_ops.sh")


@pytest.mark.parametrize("args", [[], ["frobnicate"]])
def test_usage_and_exit_2_without_a_known_mode(args):
    proc = subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "bash test_custom_ops.sh cmake" in proc.stderr


def test_doctor_reports_versions_and_paths():
    proc = subprocess.run(["bash", SCRIPT, "doctor"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    for key in ("torch:             2.13.0", "executorch:        1.5.1", "cmake:", "c++ compiler:", "include:"):
        assert key in proc.stdout


def test_pins_are_read_without_tomllib_as_on_python_3_10():
    reader = os.path.join(REPO_ROOT, "tools", "pyproject_pins.py")
    pyproject = os.path.join(REPO_ROOT, "pyproject.toml")
    hide_tomllib = ("import runpy, sys; sys.modules['tomllib'] = None; "
                    f"sys.argv = ['pyproject_pins.py', {pyproject!r}]; runpy.run_path({reader!r})")
    without = subprocess.run([sys.executable, "-c", hide_tomllib], capture_output=True, text=True, check=True).stdout
    with_tomllib = subprocess.run([sys.executable, reader, pyproject], capture_output=True, text=True, check=True)
    assert without == with_tomllib.stdout
    assert without.splitlines()[:2] == ["torch==2.13.0", "executorch==1.5.1"]


@pytest.mark.parametrize("args, message", [
    (["cmake", "no_such_op"], "error: no op 'no_such_op' is declared in custom_ops.bzl; declared: mul3 mul4"),
    (["profile", "mul3", "mul4"], "error: profile takes at most one op or model name"),
])
def test_a_mode_refuses_bad_arguments_in_one_line(args, message):
    # The script hands a mode to its Python entry point (flow/modes.py, models/model_modes.py), which refuses before
    # building anything.
    proc = subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1 and message in proc.stderr, proc.stderr[-2000:]


def test_every_mode_the_script_lists_goes_to_an_entry_point_that_has_it():
    from flow import modes
    from models import model_modes

    lines = open(SCRIPT).read().splitlines()
    listed = {line.split()[3] for line in lines if line.startswith("#   bash test_custom_ops.sh ")}
    entry_points = {"run_mode flow.modes": set(modes.MODES), "run_mode models.model_modes": set(model_modes.MODES),
                    "benchmark/bench.py": {"bench"}, "mode_test": {"test"}}
    routed = {}
    for line in lines[lines.index('case "${1:-}" in') + 1:]:
        names, _, action = line.strip().partition(")")
        for entry_point, has in entry_points.items():
            if entry_point in action:
                assert set(names.split("|")) <= has, line
                routed |= dict.fromkeys(names.split("|"), entry_point)
    assert set(routed) == listed


def test_the_real_modes_checks_name_each_miss_and_go_on(capsys):
    from models.model_modes import Checks

    checks = Checks()
    checks.run("first", "false")
    checks.run("second", "true")
    checks.run("third", sys.executable, "-c", "print('The capital of France is Lyon')", output=os.devnull,
               starts=r"^The capital of France is Paris")
    assert checks.missed == ["first", "third"]
    assert "error: first: failed (above); the mode goes on" in capsys.readouterr().err


def test_the_cpu_report_names_each_file_with_the_cpu_its_tests_used(tmp_path):
    # `test --cpu-report FILE` (tests/conftest.py): one line a file; the processes a test waited for count in its file.
    report = tmp_path / "cpu.txt"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-n0", "-q", "-p", "no:cacheprovider", "--cpu-report",
                           str(report), "tests/test_schema_types.py", "tests/test_docs.py"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:]
    lines = [line.split() for line in report.read_text().splitlines()]
    assert sorted(path for _, _, path in lines) == ["tests/test_docs.py", "tests/test_schema_types.py"]
    cost = {path: (float(cpu), float(wall)) for cpu, wall, path in lines}
    cpu, wall = cost["tests/test_schema_types.py"]  # its exports run in child processes
    assert 1 < cpu < 2 * wall + 1, (cpu, wall)
