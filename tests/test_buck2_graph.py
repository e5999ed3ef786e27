"""The Buck2 build, checked without buck2 (tests/buck2_graph.py): it passes on the real TARGETS, fails on copies of the
Buck2 files with one thing broken (a dependency, an attribute, a genrule command, link_whole, the dialect, a block
format's stated layout), and `bash test_custom_ops.sh buck2` either runs the flows with a buck2 on PATH or says
plainly that buck2 did not run."""

import os
import subprocess
import sys

import pytest

from helpers import REPO_ROOT, copy_repository, write_buckconfig_local

GRAPH_CHECK = os.path.join(REPO_ROOT, "tests", "buck2_graph.py")
# Mutated copies share the real tree's compile cache: what they do not break is not rebuilt.
CACHE = {"BUCK2_GRAPH_CACHE": os.path.join(REPO_ROOT, "buck-out", "graph", "cache")}


def run_graph_check(repo, stage="run", ops=()):
    return subprocess.run([sys.executable, GRAPH_CHECK, "--repo", repo, "--stage", stage, "--fail_fast",
                           *(("--ops", ",".join(ops)) if ops else ())],
                          capture_output=True, text=True, timeout=1800, env=dict(os.environ, **CACHE))


def run_script_buck2(path_prefix="", *ops):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env.update(CACHE, PATH=path_prefix + "/usr/local/bin:/usr/bin:/bin")
    return subprocess.run(["bash", os.path.join(REPO_ROOT, "test_custom_ops.sh"), "buck2", *ops], capture_output=True,
                          text=True, timeout=1800, env=env)


@pytest.fixture(scope="module")
def graph_check(representatives):
    """`bash test_custom_ops.sh buck2 <one op of each kind>` without buck2 on PATH: the graph check of the real tree,
    run once: every target evaluated, every example's selection and sources (all ops together included) checked
    against CMake's plan, the targets of one op of each kind (flow/op_kinds.py) built, their examples run and
    verified."""
    return run_script_buck2("", *(op.short_name for op in representatives))


def test_the_graph_checks_every_target_and_builds_and_runs_one_op_of_each_kind(graph_check, declared, representatives):
    assert "[buck2 graph] passed: evaluate, check, build, run" in graph_check.stdout, graph_check.stderr[-4000:]
    out = graph_check.stdout
    assert "every attribute known to the prelude" in out
    assert "each example selects and compiles what CMake does" in out
    for op in declared.values():
        alone = f"custom_ops_executor_runner_{op.short_name} on {op.example_program}.pte: match"
        assert (alone in out) == (op in representatives), op.name


def test_the_graph_check_refuses_an_op_it_does_not_know():
    proc = run_graph_check(REPO_ROOT, "build", ["no-such-op"])
    assert proc.returncode == 1 and "error: --ops names no-such-op, which custom_ops.bzl does not declare" in proc.stderr


MUTATIONS = {
    "a dependency dropped (the kernels lose the executorch headers)": (
        "targets.bzl", '        deps = [":executorch_threadpool"],\n', "", "build",
        "root//:custom_ops_kernels_mul3: compiling custom_ops_1_out.cpp failed"),
    "an attribute misspelled": (
        "targets.bzl", '        compiler_flags = _COMPILER_FLAGS,\n        deps = [":executorch_threadpool"],',
        '        compiler_flag = _COMPILER_FLAGS,\n        deps = [":executorch_threadpool"],', "evaluate",
        "'compiler_flag' is not an attribute of cxx_library in the prelude"),
    "a genrule command broken": (
        "codegen/codegen.bzl", "generate --selection", "generate --selected", "build",
        "root//:custom_ops_lib_mul3_combined: the genrule's cmd failed"),
    "the registration not linked whole": (
        "codegen/codegen.bzl", "        link_whole = True,\n", "", "run",
        # the first runner verified stops the run: a C++ op's (their examples run first)
        "no kernel library linked into this runner registers: my_ops::mul4.out"),
    "a default_only attribute set": (
        "targets.bzl", '        link_style = "static",', '        link_style = "static",\n        link_whole = True,',
        "evaluate", "attribute 'link_whole' is default_only in the prelude"),
    "a def in the build file": (
        "TARGETS", "define_common_targets()\n", "def f():\n    pass\n\ndefine_common_targets()\n", "evaluate",
        "`def` is not allowed in this dialect"),
    "a block format's layout that its traits do not have": (
        "ops/blocks/block_layouts.py", '"Q8_0": Layout(32, 32, 128,', '"Q8_0": Layout(32, 32, 127,', "build",
        "differ from its layout in ops/blocks/block_layouts.py: make the two agree",
        # linear_blocks' targets alone (every target would first compile the ATen-mode sources of the ops declared
        # before it, which no other check compiled in a cold cache): the formats are its sources
        ["linear_blocks"]),
    "a selection that differs from CMake's": (
        "targets.bzl", 'et_operator_library(name = select, ops = [_out_variant(name) for name in by_codegen])',
        'et_operator_library(name = select, ops = ["my_ops::mul3.out"])', "check",
        "root//:select_mul4 selects ['my_ops::mul3.out'], CMake selects ['my_ops::mul4.out']"),
}


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_a_broken_copy_of_the_buck2_files_fails_the_check(mutation, graph_check, representatives, tmp_path):
    path, old, new, stage, message, *only = MUTATIONS[mutation]
    repo = copy_repository(tmp_path / "repo")
    write_buckconfig_local(repo)
    with open(os.path.join(repo, path)) as f:
        text = f.read()
    assert old in text, f"the mutation's anchor is gone from {path}"
    with open(os.path.join(repo, path), "w") as f:
        f.write(text.replace(old, new, 1))
    # The run stage builds every target first: the per-op ones of one op of each kind, as the graph check above.
    proc = run_graph_check(repo, stage, [op.short_name for op in representatives] if stage == "run" else
                           only[0] if only else ())
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert message in proc.stderr, proc.stderr[-3000:]


def test_without_buck2_the_script_runs_the_graph_check_and_exits_3(graph_check):
    proc = graph_check
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "[buck2 graph] passed: evaluate, check, build, run" in proc.stdout
    assert "error: buck2 itself was NOT run: it is not on PATH" in proc.stderr
    assert "https://github.com/facebook/buck2/releases" in proc.stderr


def test_with_a_buck2_on_path_the_script_builds_exports_runs_and_verifies_each_op(graph_check, representatives):
    # A stand-in buck2 (tests/buck2/buck2) built on the graph executor: this checks the script's with-buck2 branch
    # (target names, --show-full-output parsing, AOT library hand-off), not buck2 itself: one op registered from
    # Python and one from C++ cover both branches, among those whose targets the graph check above built.
    python_op = next(op for op in representatives if op.from_python).short_name
    cpp_op = next(op for op in representatives if op.from_cpp).short_name
    proc = run_script_buck2(os.path.join(REPO_ROOT, "tests", "buck2") + ":", python_op, cpp_op)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"All buck2 flows passed: {python_op} {cpp_op} match their references" in proc.stdout


def test_the_compile_cache_keys_on_the_headers_a_source_reads(tmp_path, monkeypatch):
    # The graph check's compile cache: a source whose header trees sit elsewhere but offer the same names, and whose
    # included headers have the same content, is compiled once; a change to an included header compiles again.
    sys.path.insert(0, os.path.dirname(GRAPH_CHECK))
    import buck2_graph

    monkeypatch.setenv("BUCK2_GRAPH_CACHE", str(tmp_path / "cache"))
    targets, _ = buck2_graph.evaluate(REPO_ROOT)
    compiled = []
    executor = buck2_graph.Executor(str(tmp_path), targets, log=compiled.append)
    source = tmp_path / "use.cpp"
    source.write_text('#include "read.h"\nint value() { return VALUE; }\n')

    def compile_with(tree_name, read, unread="", extra=None):
        tree = os.path.join(executor.out, tree_name)
        os.makedirs(tree)
        for name, text in {"read.h": read, "unread.h": unread, **({extra: ""} if extra else {})}.items():
            with open(os.path.join(tree, name), "w") as f:
                f.write(text)
        before = len(compiled)
        obj = executor._compile_one(targets["root//:custom_ops_lib"], str(source), ["-I", tree])
        return obj, len(compiled) > before

    first, ran = compile_with("a", "#define VALUE 1\n")
    assert ran
    assert compile_with("b", "#define VALUE 1\n", unread="// not included") == (first, False)
    changed, ran = compile_with("c", "#define VALUE 2\n")
    assert ran and changed != first
    assert compile_with("d", "#define VALUE 1\n", extra="more.h")[1]  # a tree offering other names: compiled


def test_the_buckconfig_names_this_interpreters_torch_and_its_abi():
    # tools/buckconfig_local.py reads the ABI from libc10's symbols rather than importing torch: it must say what
    # torch itself says.
    import torch

    written = subprocess.run([sys.executable, os.path.join(REPO_ROOT, "tools", "buckconfig_local.py")],
                             capture_output=True, text=True, check=True).stdout
    assert f"  torch_dir = {os.path.dirname(torch.__file__)}\n" in written
    assert f"  torch_cxx11_abi = {int(torch._C._GLIBCXX_USE_CXX11_ABI)}\n" in written
