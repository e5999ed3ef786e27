"""Selective build: a kernel library registers exactly the ops selected at build time, and a program that needs an
op the build left out fails with a message naming that op."""

import pytest

from helpers import registered_operators, run_runner
from tests.conftest import cmake_build


def custom_ops(kernel_lib):
    return [op for op in registered_operators(kernel_lib) if op.startswith("my_ops::")]


def test_mul3_build_registers_mul3_out_only(mul3_build):
    assert custom_ops(mul3_build.kernel_lib) == ["my_ops::mul3.out"]


def test_mul4_build_registers_mul4_out_only(mul4_build):
    assert custom_ops(mul4_build.kernel_lib) == ["my_ops::mul4.out"]


def test_selection_from_a_program_registers_the_ops_it_uses(mul3_pte):
    build = cmake_build("custom_ops_from_model", f"CUSTOM_OPS_MODEL_FILE={mul3_pte}")
    assert custom_ops(build.kernel_lib) == ["my_ops::mul3.out"]


def test_unselected_kernel_code_is_not_linked_in(mul3_build):
    import subprocess

    symbols = subprocess.run(["nm", "-C", mul3_build.kernel_lib], capture_output=True, text=True, check=True).stdout
    assert "mul3_out_impl" in symbols
    assert "mul4_out_impl" not in symbols


def test_combined_build_registers_both(combined_build):
    assert custom_ops(combined_build.kernel_lib) == ["my_ops::mul3.out", "my_ops::mul4.out"]


def test_mul3_runner_on_the_mul4_program_fails_naming_mul4_out(mul3_build, mul4_pte):
    proc = run_runner(mul3_build.runner, f"--model_path={mul4_pte}")
    assert proc.returncode == 1, proc.stderr
    assert "registers: my_ops::mul4.out." in proc.stderr


def test_program_needing_an_unselected_op_fails_naming_it(mul4_build, mul3_pte):
    proc = run_runner(mul4_build.runner, f"--model_path={mul3_pte}")
    assert proc.returncode == 1, proc.stderr
    assert "error: the program calls operator(s) that no kernel library linked into this runner registers: " \
           "my_ops::mul3.out." in proc.stderr
    assert "custom_ops.yaml" in proc.stderr


@pytest.mark.parametrize("value", ["0", "mul3"])
def test_invalid_example_selection_fails_at_configure_time(value, tmp_path):
    import subprocess
    import sys

    from helpers import REPO_ROOT

    proc = subprocess.run(
        ["cmake", "-S", REPO_ROOT, "-B", str(tmp_path), "-G", "Ninja", f"-DPython3_EXECUTABLE={sys.executable}",
         f"-DREGISTER_EXAMPLE_CUSTOM_OP={value}"], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "REGISTER_EXAMPLE_CUSTOM_OP must be 1, 2 or 3" in proc.stderr
