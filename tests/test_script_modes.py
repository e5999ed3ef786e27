"""test_custom_ops.sh's command line: usage on a missing or unknown mode, a clear message where buck2 is absent."""

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
