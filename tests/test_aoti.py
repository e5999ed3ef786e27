"""AOTInductor's side (flow/aoti.py, runner/aoti_runner.cpp): every example's package and the decoder's, run from C++
without Python, equal the eager references; a package whose op library is missing, and bad input, fail with one error
line; the C++ registrations of the Python-registered ops have exactly the schemas Python gives them (written from the
ops' modules at build time), and a custom_ops.yaml out schema other than its module's stops that step."""

import os
import subprocess
import sys

import pytest
import torch

from flow import aoti, declarations
from models import decoding, example_decoder
from helpers import copy_repository, run_in_fresh_python


@pytest.fixture(scope="module")
def build_dir(combined_build, declared) -> str:
    decoding.register_ops(combined_build.build_dir)
    return combined_build.build_dir


@pytest.mark.parametrize("name", ["my_ops::mul3", "my_ops::mul4", "my_ops::rms_norm", "my_ops::update_cache",
                                  "my_ops::quantize_rows"])
def test_each_example_package_equals_its_reference_in_the_cpp_runner(build_dir, declared, name):
    assert "matches" in aoti.check_example(declared[name], build_dir)


def test_the_decoder_package_decodes_like_eager_twice_in_the_cpp_runner(build_dir):
    lines = example_decoder.check_aoti(build_dir)
    assert lines[0].startswith(f"{example_decoder.AOTI_VARIANT}: [")
    assert "the runner refuses the package" in lines[-1] and "my_ops::rms_norm" in lines[-1]


def ops_of_nodes(exported) -> set[str]:
    """The ops a graph's nodes call, from the nodes (an in-place op through auto_functionalized: its first argument)."""
    calls = set()
    for node in exported.graph.nodes:
        for target in (node.target, *node.args[:1]):
            if isinstance(target, torch._ops.OpOverload):
                calls.add(target._schema.name)
    return calls


@pytest.mark.parametrize("program", ["update_cache", "update_cache decomposed", "decoder"])
def test_a_package_is_keyed_by_every_op_its_program_calls(build_dir, declared, program):
    # flow/artifact_cache.py keys a package by the files of the ops it calls: one missed would reuse a stale package.
    # Decomposed, the in-place update_cache is an argument of auto_functionalized, not a node's target.
    if program == example_decoder.AOTI_VARIANT:
        exported = example_decoder.aoti_export()
    else:
        _, exported, _ = aoti.example_package(declared["my_ops::update_cache"])
        if program.endswith("decomposed"):
            exported = exported.run_decompositions({})
    expected = ops_of_nodes(exported)
    assert "my_ops::update_cache" in expected
    assert "my_ops::rms_norm" in expected or program != example_decoder.AOTI_VARIANT
    assert expected <= aoti.called_ops(exported)


def _library(build_dir, name):
    return os.path.join(build_dir, name)


@pytest.mark.parametrize("program, libraries, missing_op", [
    ("decoder", [], "my_ops::rms_norm"),  # the first custom op of the graph
    ("decoder", ["libcustom_ops_aot_lib.so"], "my_ops::update_cache"),  # a Python-registered op: its C++ kernel
    ("custom_ops_1", ["libcustom_ops_aot_lib.so"], "my_ops::mul3"),
    ("quantize_rows", ["libcustom_ops_aot_lib.so"], "my_ops::quantize_rows"),
    ("custom_ops_2", ["libcustom_ops_without_python.so"], "my_ops::mul4"),
])
def test_a_package_without_its_op_library_is_one_clear_error(build_dir, declared, program, libraries, missing_op):
    if program == example_decoder.AOTI_VARIANT:
        path = example_decoder.aoti_package()
    else:
        path, _, _ = aoti.example_package(next(op for op in declared.values() if op.example_program == program))
    line = aoti.missing_library_error(build_dir, path, [_library(build_dir, lib) for lib in libraries])
    assert f"calls {missing_op} but no loaded library registers it" in line
    # A user's Python op with no C++ registration: the hint names the declaration field and the file to write.
    short = missing_op.split("::")[1]
    assert f"write ops/{short}/{short}_without_python.cpp" in line and "without_python_sources" in line


def _runner(build_dir, *args):
    return subprocess.run([os.path.join(build_dir, aoti.RUNNER), *args], capture_output=True, text=True, timeout=300)


def test_bad_input_to_the_runner_is_one_error_line(build_dir, declared, tmp_path):
    path, _, _ = aoti.example_package(declared["my_ops::mul3"])
    short = tmp_path / "short.bin"
    short.write_bytes(b"\0" * 8)  # 2 floats where 2x3 needs 6
    libraries = f"--op_library={_library(build_dir, 'libcustom_ops_without_python.so')}"
    decoder = [f"--package={example_decoder.aoti_package()}",
               f"--op_library={','.join(_library(build_dir, lib) for lib in aoti.OP_LIBRARIES)}"]
    cases = {
        "holds 8 bytes; float32:2x3 needs 24": [f"--package={path}", libraries, f"--inputs={short}",
                                                 "--input_specs=float32:2x3"],
        "cannot load op library": [f"--package={path}", "--op_library=/nonexistent/libx.so"],
        "cannot load the package": [f"--package={tmp_path / 'missing.pt2'}"],
        # Before the runner checked the prompt, this aborted (rc 134) in the package's own bounds check.
        "prompt token 300 is outside the vocabulary [0, 256)": [*decoder, "--prompt=300", "--new_tokens=2"],
        "Expected u0 <= 254": [*decoder, "--prompt=1", "--new_tokens=300"],  # more positions than the cache has
        "has no vocabulary size": [f"--package={path}", libraries, "--prompt=1", "--new_tokens=2"],  # not a decoder
    }
    for expected, args in cases.items():
        proc = _runner(build_dir, *args)
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert proc.returncode == 1 and len(errors) == 1 and expected in errors[0], (expected, proc.stderr)
    assert _runner(build_dir, "--package").returncode == 2  # a bad command line


def test_inputs_the_package_was_not_made_for_are_errors_not_reads_or_writes_past_a_buffer(build_dir, declared):
    """The update_cache example's package (a cache of MAX_LEN rows, one row per call): a position past the cache is
    refused before a row is written, and a value of two rows (the package was exported for one) is refused by the
    package's input check, which the runner turns on; unchecked, the generated code would read past the value."""
    path, _, _ = aoti.example_package(declared["my_ops::update_cache"])
    from flow.runner import RunnerError
    from ops.update_cache.update_cache import HEADS, HEAD_DIM, MAX_LEN

    command = aoti.runner_command(build_dir, path)
    like = [torch.empty(0), torch.empty(0, dtype=torch.int64)]
    past_the_end = (torch.ones(1, 1, HEADS, HEAD_DIM), torch.tensor([MAX_LEN]))
    with pytest.raises(RunnerError, match=rf"error: running the package failed: .*{MAX_LEN}"):
        aoti.run_package(command, [past_the_end], like, 1)
    two_rows = (torch.ones(1, 2, HEADS, HEAD_DIM), torch.tensor([0]))
    with pytest.raises(RunnerError, match=r"error: running the package failed: input_handles\[0\]: unmatched dim"):
        aoti.run_package(command, [two_rows], like, 1)


# The ops registered from Python that declare a C++ registration for processes without Python.
WITHOUT_PYTHON = [op for op in declarations.load().values() if op.without_python_sources]
SCHEMAS = f"""
import torch
result = {{}}
for name in {[op.short_name for op in WITHOUT_PYTHON]!r}:
    packet = getattr(torch.ops.my_ops, name)
    for overload in packet.overloads():
        op = getattr(packet, overload)
        result[str(op._schema)] = sorted(str(tag) for tag in op.tags)
"""


def test_the_cpp_registrations_of_python_ops_have_the_python_schemas_and_tags(build_dir):
    from_cpp = run_in_fresh_python(
        f"import torch\ntorch.ops.load_library({_library(build_dir, 'libcustom_ops_without_python.so')!r})\n" + SCHEMAS)
    from_python = run_in_fresh_python("".join(f"import {op.python_module}\n" for op in WITHOUT_PYTHON) + SCHEMAS)
    assert from_cpp == from_python and len(from_cpp) == 2 * len(WITHOUT_PYTHON)  # each op and its out variant


def test_a_yaml_out_schema_other_than_the_modules_stops_the_generation_by_name(tmp_path):
    # rope's out schema in the yaml naming its arguments in another order than rope.py does. The step that writes the
    # schemas from the modules (run at build time by CMake) refuses it in one line, naming both schemas and the fix.
    repo = copy_repository(tmp_path / "repo")
    yaml_path = os.path.join(repo, "custom_ops.yaml")
    with open(yaml_path) as f:
        text = f.read()
    bound = "my_ops::rope.out(Tensor x, Tensor cos, Tensor sin, *, Tensor(a!) out)"
    assert bound in text
    with open(yaml_path, "w") as f:
        f.write(text.replace(bound, "my_ops::rope.out(Tensor x, Tensor sin, Tensor cos, *, Tensor(a!) out)"))
    command = [sys.executable, os.path.join(repo, "codegen", "run_codegen.py"), "python_schemas",
               "--ops", "my_ops::mul3,my_ops::rope", "--output", str(tmp_path / "PythonOpSchemas.cpp")]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and not (tmp_path / "PythonOpSchemas.cpp").exists()
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert line == ("error: custom_ops.yaml binds my_ops::rope.out as `my_ops::rope.out(Tensor x, Tensor sin, Tensor "
                    "cos, *, Tensor(a!) out) -> Tensor(a!)`, but ops/rope/rope.py defines `my_ops::rope.out(Tensor x, "
                    "Tensor cos, Tensor sin, *, Tensor(a!) out) -> Tensor(a!)`, the out variant programs call: make the "
                    "yaml's func the module's schema")
    with open(yaml_path, "w") as f:
        f.write(text)  # as the repository states it: the schemas are written, mul3's and rope's, with their tags
    assert subprocess.run(command, capture_output=True, text=True, timeout=300).returncode == 0
    written = (tmp_path / "PythonOpSchemas.cpp").read_text()
    rope_out = '"rope.out(Tensor x, Tensor cos, Tensor sin, *, Tensor(a!) out) -> Tensor(a!)"'
    assert f"  m.def({rope_out}, {{at::Tag::out}});" in written
    assert '  m.def("mul3(Tensor input) -> Tensor");' in written
