"""flow/lazy_exir.py and the cached argument-kinds table: a process that reads, checks and runs programs does not
import ExecuTorch's exporter (executorch.exir's __init__, 4-5 s of CPU a process), and one that goes on to export gets
the package whole."""

import json
import os

import pytest

from helpers import run_in_fresh_python

# Whether executorch.exir's own __init__ has run: it imports the exporter's program module.
INIT_RAN = "'executorch.exir.program' in sys.modules"


def test_reading_checking_and_running_a_program_leaves_the_exporter_unimported(mul3_build, mul3_pte, tmp_path):
    env = {"CUSTOM_OPS_CODEGEN_CACHE": str(tmp_path / "codegen-cache")}
    check = f"""
        import sys
        from flow import program
        operators = program.read({mul3_pte!r}).operators
        after_reading = {INIT_RAN}
        program.check({mul3_pte!r})
        result = [operators, after_reading, {INIT_RAN}]
    """
    # The first check makes the kinds table (importing the registries, which import the exporter): the probe sees it.
    assert run_in_fresh_python(check, env=env, fresh_imports=True) == [["my_ops::mul3.out"], False, True]
    assert run_in_fresh_python(check, env=env, fresh_imports=True) == [["my_ops::mul3.out"], False, False]
    run = f"""
        import sys, torch
        from flow.runtime import load_kernel_library, load_method_checked
        load_kernel_library({mul3_build.kernel_lib!r})
        method = load_method_checked({mul3_pte!r})
        outputs = [method.execute([torch.ones(2, 3)])[0].tolist() for _ in range(2)]
        result = [outputs, {INIT_RAN}]
    """
    assert run_in_fresh_python(run, env=env, fresh_imports=True) == [[[[3.0] * 3] * 2] * 2, False]


def test_each_light_module_loads_without_the_packages_init():
    result = run_in_fresh_python(f"""
        import importlib, sys
        from flow import lazy_exir
        lazy_exir.defer_exir_package()
        for name in lazy_exir.LIGHT_MODULES:
            importlib.import_module("executorch.exir." + name)
        from executorch.exir import schema  # an attribute that is a light module: imported, not the package
        result = [{INIT_RAN}, lazy_exir.is_deferred(), schema.__name__]
    """, fresh_imports=True)
    assert result == [False, True, "executorch.exir.schema"]


@pytest.mark.parametrize("first_use", [
    "from executorch.exir import to_edge",  # an attribute of the package
    "import executorch.exir.passes; from executorch.exir import to_edge",  # a submodule outside the light ones
])
def test_a_process_that_goes_on_to_export_gets_the_whole_package(first_use):
    result = run_in_fresh_python(f"""
        import sys, torch
        from flow import lazy_exir
        lazy_exir.defer_exir_package()
        import executorch.exir._serialize._program
        before = {INIT_RAN}
        {first_use}
        class Double(torch.nn.Module):
            def forward(self, x):
                return x * 2
        buffer = to_edge(torch.export.export(Double(), (torch.ones(3),))).to_executorch().buffer
        from executorch.runtime import Runtime
        program = Runtime.get().load_program(buffer)
        method = program.load_method("forward")
        outputs = [method.execute([torch.ones(3)])[0].tolist() for _ in range(2)]
        result = [before, {INIT_RAN}, lazy_exir.is_deferred(), outputs]
    """, fresh_imports=True)
    assert result == [False, True, False, [[2.0, 2.0, 2.0]] * 2]


def test_the_cached_table_is_the_live_one_and_a_damaged_one_is_made_again(tmp_path):
    from flow import argument_kinds

    live = argument_kinds.runtime_table()
    made = argument_kinds._cached_table(str(tmp_path))
    (path,) = tmp_path.iterdir()
    assert made == live and argument_kinds._cached_table(str(tmp_path)) == live  # the second read from the file
    with open(path) as f:
        assert len(json.load(f)) == len(live)
    path.write_text('{"aten::add.out": [')  # cut short, as by a full disk
    assert argument_kinds._cached_table(str(tmp_path)) == live
    assert os.listdir(tmp_path) == [path.name]  # no leftover temporary file


def test_the_exporters_yaml_is_parsed_by_ruamels_c_parser():
    # executorch.exir parses its edge dialect's yaml with YAML(typ="safe") at import: 0.5-0.9 s of CPU in pure Python
    # in every exporting process, unless ruamel.yaml.clib (pyproject.toml) is installed.
    from ruamel.yaml import YAML

    assert YAML(typ="safe").Parser.__name__ == "CParser"
