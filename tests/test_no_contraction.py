"""No kernel build contracts floating-point expressions (flow/compiler_flags.py says why): every compile command of the
CMake builds (the combined one, and the ARM64 cross-build when it exists), every compiled target of the Buck2 graph,
and the extension the JIT build makes carry -ffp-contract=off (nvcc: --fmad=false); the wheel's library is the combined
build's AOT library, built by CMake with its commands (tests/test_wheel.py). What it guards is
tested by running: the recipe's scaled_add (x + alpha * y, an alpha whose product rounds) equals ATen bit for bit on
x86 (the AVX2+FMA variant) and on ARM64 under qemu (tests/test_own_op.py)."""

import os

import buck2_graph
from flow import compiler_flags
from helpers import REPO_ROOT, compile_commands, copy_repository, run_in_fresh_python, write_buckconfig_local


def builds() -> list[str]:
    found = [os.path.join(REPO_ROOT, "cmake-out", "all_ops")]
    cross = os.path.join(REPO_ROOT, "cmake-out", "aarch64", "all_ops")
    return found + ([cross] if os.path.exists(os.path.join(cross, "build.ninja")) else [])


def test_every_cmake_compile_command_turns_contraction_off(combined_build):
    for build_dir in builds():
        commands = compile_commands(build_dir)
        assert len(commands) >= 10, build_dir
        missing = [next(a for a in c if a.endswith((".cpp", ".cu", ".cc"))) for c in commands
                   if not set(compiler_flags.CXX) <= set(c) and not set(compiler_flags.NVCC) <= set(c)]
        assert missing == [], f"{build_dir}: compiled without {compiler_flags.CXX}: {missing}"


def test_every_compiled_target_of_the_buck2_graph_turns_contraction_off(tmp_path):
    # A copy with its own .buckconfig.local: the real tree has one only after `test_custom_ops.sh buck2` ran, which
    # another test module does, in any order, and rewrites while it runs.
    repo = copy_repository(tmp_path / "repo")
    write_buckconfig_local(repo)
    targets, _ = buck2_graph.evaluate(repo)
    compiled = [t for t in targets.values() if t.cell == "root" and t.kind in ("cxx_library", "cxx_binary")
                and buck2_graph.sources_of(t)]
    assert len(compiled) >= 4
    missing = [t.label for t in compiled if not set(compiler_flags.CXX) <= set(t.attrs.get("compiler_flags", []))]
    assert missing == []


def test_the_jit_build_passes_the_flags():
    """The arguments the JIT build hands cpp_extension.load."""
    result = run_in_fresh_python("""
import torch.utils.cpp_extension as cpp_extension
captured = {}
class Stop(Exception):
    pass
def load(**kwargs):
    captured.update(kwargs)
    raise Stop()
cpp_extension.load = load
from flow import registration
try:
    registration.build_jit_library()
except Stop:
    pass
result = [captured["extra_cflags"], captured["extra_cuda_cflags"]]
""")
    jit, jit_cuda = result
    assert set(compiler_flags.CXX) <= set(jit)
    assert set(compiler_flags.NVCC) <= set(jit_cuda)
