"""Selective build: a kernel library registers exactly the ops selected at build time (and compiles only their
kernels), and a program that needs an op the build left out fails with a message naming that op."""

import os
import subprocess
import sys

import pytest

from helpers import REPO_ROOT, registered_operators, run_runner
from tests.conftest import cmake_build, op_build


def custom_ops(kernel_lib):
    """The ops of our namespaces the runtime registry holds after loading only `kernel_lib`."""
    from flow import declarations as declared_ops

    ours = {op.namespace for op in declared_ops.load().values()}
    return [op for op in registered_operators(kernel_lib) if op.split("::")[0] in ours]


def test_each_declared_op_builds_alone_and_registers_only_itself(declared):
    for op in declared.values():
        assert custom_ops(op_build(op).kernel_lib) == [op.out_name]


def test_an_op_registered_by_its_source_has_no_generated_registration(declared):
    # update_cache declares runtime_registration "executorch_library": its build compiles no codegen output, and the
    # registry has the op from EXECUTORCH_LIBRARY_CHECKED in its kernel source.
    import json

    (op,) = [op for op in declared.values() if not op.by_codegen]
    build = op_build(op)
    with open(os.path.join(build.build_dir, "compile_commands.json")) as f:
        compiled = {os.path.basename(entry["file"]) for entry in json.load(f)}
    assert compiled == {*map(os.path.basename, op.kernel_sources), "custom_ops_executor_runner.cpp", "command_line.cpp", "program_runner.cpp",
                        "xnnpack_payload.cpp"}
    assert custom_ops(build.kernel_lib) == [op.out_name]


def test_the_default_build_registers_every_declared_op(declared, combined_build):
    assert custom_ops(combined_build.kernel_lib) == sorted(op.out_name for op in declared.values())


def test_selection_from_a_program_registers_the_ops_it_uses(mul3_pte):
    build = cmake_build("custom_ops_from_model", f"CUSTOM_OPS_MODEL_FILE={mul3_pte}")
    assert custom_ops(build.kernel_lib) == ["my_ops::mul3.out"]


@pytest.mark.parametrize("value, expected", [("1", "my_ops::mul3"), ("2", "my_ops::mul4"),
                                             ("3", "my_ops::mul3;my_ops::mul4")])
def test_the_upstream_example_switch_selects_by_example_program(value, expected, tmp_path):
    # REGISTER_EXAMPLE_CUSTOM_OP=N is passed to the plan step as --example N; the plan decides what gets built.
    subprocess.run([sys.executable, os.path.join(REPO_ROOT, "codegen", "run_codegen.py"), "plan",
                    "--build_dir", str(tmp_path), "--example", value], check=True, capture_output=True)
    plan = (tmp_path / "custom_ops_plan.cmake").read_text()
    assert f'set(CUSTOM_OPS_SELECTED "{expected}")' in plan


def test_unselected_kernels_are_neither_compiled_nor_linked_in(mul3_build):
    import json

    with open(os.path.join(mul3_build.build_dir, "compile_commands.json")) as f:
        compiled = {os.path.basename(entry["file"]) for entry in json.load(f)}
    assert "custom_ops_1_out.cpp" in compiled and "custom_ops_2_out.cpp" not in compiled
    symbols = subprocess.run(["nm", "-C", mul3_build.kernel_lib], capture_output=True, text=True, check=True).stdout
    assert "mul3_out_impl" in symbols
    assert "mul4_out_impl" not in symbols


def test_only_a_build_with_a_cpp_registered_op_makes_the_aot_library(mul3_build, mul4_build):
    assert not os.path.exists(mul3_build.aot_lib)
    assert os.path.isfile(mul4_build.aot_lib)


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
