"""Checks of the kernel machinery's own source: the functor contract's integer arithmetic is free of undefined
behaviour (proven at compile time), and the ISA dispatcher checks every CPU feature each vector variant is compiled
for (a variant compiled with a feature the CPU lacks would die with SIGILL)."""

import os
import re
import subprocess

import pytest

from helpers import REPO_ROOT


def executorch_include_dirs():
    import executorch

    include = os.path.join(executorch.__path__[0], "include")
    return [include, os.path.join(include, "executorch", "runtime", "core", "portable_type", "c10")]


def test_integer_arithmetic_wraps_without_undefined_behaviour():
    source = os.path.join(REPO_ROOT, "tests", "cpp", "elementwise_functor_checks.cpp")
    includes = [f"-I{d}" for d in (REPO_ROOT, *executorch_include_dirs())]
    proc = subprocess.run(["c++", "-std=c++17", "-fsyntax-only", "-DC10_USING_CUSTOM_GENERATED_MACROS", *includes,
                           source], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_the_pytorch_side_helpers_for_several_inputs_equal_aten_and_refuse_alike(combined_build):
    # elementwise_functional / elementwise_meta / elementwise_out_meta on a two-input op: broadcast shapes on CPU and
    # Meta tensors equal ATen's, and bad dtypes and shapes are refused in the out kernel's words.
    proc = subprocess.run([os.path.join(combined_build.build_dir, "elementwise_helpers_aten")], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr


def test_the_steps_of_one_region_run_in_order_and_a_failing_unit_reaches_the_caller(combined_build):
    # kernel_helpers/steps_region.h (my_ops::decoder_layer's region) on ATen's pool at 1 to 4 threads: every unit once,
    # each step after the whole step before it, an empty step passed, and a unit that throws rethrown to the caller
    # with the other units run (no thread left waiting for it).
    proc = subprocess.run([os.path.join(combined_build.build_dir, "steps_region_aten")], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_the_vector_exp_gives_std_exps_bits_and_silu_mul_and_gelu_mul_their_scalar_loops(isa, combined_build):
    # kernel_helpers/vector_expf.h (silu_mul's and gelu_mul's float32 vector code) against this libm's std::exp on
    # every 61st float bit pattern (70M; `vector_expf 1` compares all 2^32), and both ops' vector ranges against their
    # scalar loops, with each ISA's code (capped with CUSTOM_OPS_ISA).
    from test_kernel_paths import expected_isa

    if expected_isa(isa) != isa:
        pytest.skip(f"this CPU has no {isa}")
    proc = subprocess.run([os.path.join(combined_build.build_dir, "vector_expf"), "61"], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, CUSTOM_OPS_ISA=isa))
    assert proc.returncode == 0 and proc.stdout.strip() == f"ok {isa}", proc.stdout + proc.stderr


def test_the_isa_dispatcher_checks_every_feature_a_variant_is_compiled_for():
    def read(*path):
        with open(os.path.join(REPO_ROOT, *path)) as f:
            return f.read()

    source = read("kernel_helpers", "vector.h")  # the targets and the run-time checks, in one place
    callers = read("kernel_helpers", "elementwise_loop.h") + read("ops", "blocks", "block_ops.h")
    compiled_for = set()
    for targets in re.findall(r'__attribute__\(\(target\("([^"]+)"\)\)\)', source):
        compiled_for.update(targets.split(","))
    checked = set(re.findall(r'__builtin_cpu_supports\("([^"]+)"\)', source))
    checked |= set(re.findall(r"(?<!bool )cpu_supports_(\w+)\(\)", source))  # calls of the CPUID readers
    # AArch64: a variant runs only where the kernel's HWCAP has its feature's bits, and where its caller asks.
    for reader, bits, target in (("cpu_has_half_arithmetic", {"FPHP", "ASIMDHP"}, "arch=armv8.2-a+fp16"),
                                 ("cpu_has_dot_product", {"ASIMDDP"}, "arch=armv8.2-a+dotprod"),
                                 ("cpu_has_i8mm", {"I8MM"}, "arch=armv8.2-a+dotprod+i8mm")):
        body = source.split(f"inline bool {reader}()")[1].split("}")[0]
        if bits <= set(re.findall(r"\bHWCAP2?_(\w+)\b", body)) and f"simd::{reader}()" in callers:
            checked.add(target)
    assert compiled_for, "no target attributes found"
    assert compiled_for <= checked, f"compiled for but never checked at run time: {sorted(compiled_for - checked)}"
