"""Selective build: a kernel library registers exactly the ops selected at build time (and compiles only their
kernels), and a program that needs an op the build left out fails with a message naming that op."""

import os
import subprocess
import sys

import pytest

from helpers import REPO_ROOT, copy_repository, registered_operators, run_runner
from tests.conftest import op_build


def custom_ops(kernel_lib):
    """The ops `kernel_lib` gives kernels for, alone in a process: those the runtime registry then holds that
    ExecuTorch's own kernels do not give it (this project's, of its namespaces and ATen's), and those whose kernels
    it holds in place of ExecuTorch's."""
    from flow.runtime_kernels import executorch_kernels

    registered, replacing = registered_operators(kernel_lib)
    return sorted([op for op in registered if op not in executorch_kernels()] + replacing)


def test_one_op_of_each_kind_builds_alone_and_registers_only_itself(representatives):
    # Selection is by name through one plan; what differs between ops is their kind (flow/op_kinds.py: how each side
    # registers, shared sources, ...), so one op of each kind is built alone. Every op is selected by the default build.
    for op in representatives:
        assert custom_ops(op_build(op).kernel_lib) == [op.out_name]


def test_an_op_registered_by_its_source_has_no_generated_registration(representatives):
    # An op declaring runtime_registration "executorch_library" (decoder_layer, update_cache, ...): a build of the op
    # alone compiles no codegen output, and the registry has the op from EXECUTORCH_LIBRARY_CHECKED in its source.
    import json

    by_source = [op for op in representatives if not op.by_codegen]
    assert by_source, "no op of this kind is declared any more: drop this test"
    for op in by_source:
        build = op_build(op)
        with open(os.path.join(build.build_dir, "compile_commands.json")) as f:
            compiled = {os.path.basename(entry["file"]) for entry in json.load(f)}
        # (registered_by_its_sources.cpp: the marker the runner reads in place of codegen's registration)
        assert compiled == {*map(os.path.basename, op.kernel_sources), "registered_by_its_sources.cpp",
                            "custom_ops_executor_runner.cpp", "command_line.cpp", "data_file.cpp", "kernel_calls.cpp",
                            "program_runner.cpp", "xnnpack_payload.cpp"}
        assert custom_ops(build.kernel_lib) == [op.out_name]


def test_the_default_build_registers_every_declared_op(declared, combined_build):
    assert custom_ops(combined_build.kernel_lib) == sorted(op.out_name for op in declared.values())


def test_selection_from_a_program_registers_the_ops_it_uses(model_file_build):
    build, _ = model_file_build  # the program calls mul3, bucketize, add and amax (ExecuTorch's)
    assert custom_ops(build.kernel_lib) == ["aten::bucketize.Tensor_out", "my_ops::mul3.out"]


@pytest.mark.parametrize("value, expected", [("1", "my_ops::mul3"), ("2", "my_ops::mul4"),
                                             ("3", "my_ops::mul3;my_ops::mul4")])
def test_the_upstream_example_switch_selects_by_example_program(value, expected, tmp_path):
    # REGISTER_EXAMPLE_CUSTOM_OP=N is passed to the plan step as --example N; the plan decides what gets built.
    subprocess.run([sys.executable, os.path.join(REPO_ROOT, "codegen", "run_codegen.py"), "plan",
                    "--build_dir", str(tmp_path), "--example", value], check=True, capture_output=True)
    plan = (tmp_path / "custom_ops_plan.cmake").read_text()
    assert f'set(CUSTOM_OPS_SELECTED "{expected}")' in plan


def test_planning_the_same_selection_again_touches_no_file(tmp_path):
    # Every configure plans; a rewritten selection regenerated and relinked a build's libraries while another test
    # process ran its runner ("file too short"). A changed selection is still written.
    def plan(example):
        subprocess.run([sys.executable, os.path.join(REPO_ROOT, "codegen", "run_codegen.py"), "plan",
                        "--build_dir", str(tmp_path), "--example", example], check=True, capture_output=True)
        return {name: (tmp_path / name).stat().st_mtime_ns for name in
                ("selected_operators.yaml", "aot_selected_operators.yaml", "custom_ops_plan.cmake")}

    first = plan("3")
    assert plan("3") == first
    changed = plan("2")  # mul4 alone: the Python op leaves the selection; the C++ ops (mul4) stay as they were
    assert [name for name in first if changed[name] != first[name]] == ["selected_operators.yaml",
                                                                          "custom_ops_plan.cmake"]
    assert "my_ops::mul3" not in (tmp_path / "selected_operators.yaml").read_text()


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
    # Its kernel library is linked and registered: not a link step missing (tests/test_linking.py)
    assert "register_all_kernels" not in proc.stderr and "whole" not in proc.stderr, proc.stderr


def _codegen(*args, cache=None):
    env = {k: v for k, v in os.environ.items() if k != "CUSTOM_OPS_CODEGEN_CACHE"}
    if cache:
        env["CUSTOM_OPS_CODEGEN_CACHE"] = str(cache)
    return subprocess.run([sys.executable, os.path.join(REPO_ROOT, "codegen", "run_codegen.py"), *args],
                          capture_output=True, text=True, env=env, check=True)


def _files(directory):
    return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))}


@pytest.mark.parametrize("aten", [[], ["--aten"]], ids=["ExecuTorch mode", "ATen mode"])
def test_the_codegen_cache_gives_what_codegen_writes_and_keys_on_the_selection(aten, tmp_path):
    # Every build tree and copy of the repository runs codegen for its selection; with CUSTOM_OPS_CODEGEN_CACHE, a
    # selection generated before is copied from there. What it copies must be what codegen writes.
    for ops in ("my_ops::mul4.out", "my_ops::mul4.out,my_ops::rms_norm.out"):
        name = ops.count(",")
        _codegen("select", "--output", str(tmp_path / f"selection{name}.yaml"), "--root_ops", ops)
    plain, cached, hit = tmp_path / "plain", tmp_path / "cached", tmp_path / "hit"
    cache = tmp_path / "cache"
    _codegen("generate", "--selection", str(tmp_path / "selection1.yaml"), "--output_dir", str(plain), *aten)
    _codegen("generate", "--selection", str(tmp_path / "selection1.yaml"), "--output_dir", str(cached), *aten,
             cache=cache)
    (entry,) = os.listdir(cache)
    marker = b"// served from the cache\n"
    for name in os.listdir(cache / entry):  # a hit copies the entry, not a new generation
        (cache / entry / name).write_bytes(marker + (cache / entry / name).read_bytes())
    _codegen("generate", "--selection", str(tmp_path / "selection1.yaml"), "--output_dir", str(hit), *aten,
             cache=cache)
    assert _files(plain) == _files(cached)
    assert _files(hit) == {name: marker + data for name, data in _files(plain).items()}
    # another selection is another entry, generated for it
    other = tmp_path / "other"
    _codegen("generate", "--selection", str(tmp_path / "selection0.yaml"), "--output_dir", str(other), *aten,
             cache=cache)
    assert len(os.listdir(cache)) == 2 and marker not in b"".join(_files(other).values())
    assert _files(other) != _files(plain)


def test_an_op_bound_beside_the_selection_leaves_its_generated_code_untouched(tmp_path):
    # Codegen reads custom_ops.yaml cut to the selected entries: binding one more op regenerates nothing for the build
    # trees that do not select it (their sources keep their time stamps, so nothing recompiles or relinks, and the
    # cache key is the same); a change to a selected entry regenerates.
    repo = copy_repository(tmp_path / "repo")
    run_codegen = os.path.join(repo, "codegen", "run_codegen.py")
    selection, out, cache = str(tmp_path / "selection.yaml"), tmp_path / "out", tmp_path / "cache"
    env = dict(os.environ, CUSTOM_OPS_CODEGEN_CACHE=str(cache))

    def generate():
        subprocess.run([sys.executable, run_codegen, "generate", "--selection", selection, "--output_dir", str(out),
                        "--aten"], capture_output=True, text=True, env=env, check=True)
        return {name: ((out / name).stat().st_mtime_ns, (out / name).read_bytes()) for name in sorted(os.listdir(out))}

    subprocess.run([sys.executable, run_codegen, "select", "--output", selection, "--root_ops", "my_ops::mul4.out"],
                   capture_output=True, text=True, env=env, check=True)
    before = generate()
    bindings = os.path.join(repo, "custom_ops.yaml")
    with open(bindings) as f:
        text = f.read()
    with open(bindings, "a") as f:
        f.write("\n- func: my_ops::mul5.out(Tensor input, *, Tensor(a!) output) -> Tensor(a!)\n"
                "  kernels:\n    - arg_meta: null\n      kernel_name: custom::mul5_out_impl\n")
    assert generate() == before
    assert len(os.listdir(cache)) == 1
    with open(bindings, "w") as f:
        f.write(text.replace("custom::mul4_out_impl", "custom::mul4_out_renamed"))
    after = generate()
    assert b"mul4_out_renamed" in b"".join(data for _, data in after.values())
    assert len(os.listdir(cache)) == 2


def test_reading_the_declarations_imports_no_torch():
    # codegen's plan step reads them at every configure of every build tree: torch's import would cost a second each.
    code = ("import sys; from flow import declarations; declarations.load(); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO_ROOT, env=dict(os.environ, PYTHONPATH=REPO_ROOT))


def test_the_declarations_dtype_names_are_torchs():
    from flow import declarations, dtypes

    assert declarations.DTYPE_NAMES == {str(d).removeprefix("torch.") for d in dtypes.SCALAR_TYPES.values()}
