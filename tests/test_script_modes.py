"""test_custom_ops.sh's command line: usage on a missing or unknown mode, a clear message where buck2 is absent."""

import os
import shutil
import subprocess

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
