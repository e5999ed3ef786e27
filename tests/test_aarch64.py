"""ARM64: `bash test_custom_ops.sh aarch64` cross-compiles the runtime side with cmake/aarch64-linux-gnu.toolchain.cmake
against the aarch64 executorch wheel and runs it under qemu-aarch64. Here: that mode end to end, every dtype and
dynamic shapes bit for bit on an ARMv8.0 CPU (Cortex-A53: NEON, no half-precision arithmetic) and on QEMU's `max` CPU
(FEAT_FP16, FEAT_DotProd, FEAT_I8MM), and the proof that the half-precision path and the block formats' dot-product
tiles run where the CPU has them and never elsewhere: sdot on the Neoverse N1 (FEAT_DotProd, no FEAT_I8MM), smmla with
sdot on `max`, neither on the Cortex-A53."""

import functools
import os
import re
import subprocess

import pytest
import torch

from conftest import cmake_build
from helpers import ALL_DTYPES, REPO_ROOT, full_range, qemu
from flow.compare import bit_difference, mismatches
from flow.runner import run_pte

CPUS = ("cortex-a53", "max")
ELF_MACHINE_AARCH64 = 183


def elf_machine(path: str) -> int:
    with open(path, "rb") as f:
        header = f.read(20)
    assert header[:4] == b"\x7fELF", path
    return int.from_bytes(header[18:20], "little")


@pytest.fixture(scope="module")
def aarch64_build(aarch64_package):
    """Every op's kernels and a runner, cross-compiled: the build the mode made (configured the same, so no rebuild)."""
    from flow import declarations

    ops = ",".join(op.out_name for op in declarations.load().values())
    return cmake_build(os.path.join("aarch64", "all_ops"),
                       f"CMAKE_TOOLCHAIN_FILE={REPO_ROOT}/cmake/aarch64-linux-gnu.toolchain.cmake",
                       f"EXECUTORCH_PACKAGE_DIR={aarch64_package}", "CUSTOM_OPS_BUILD_AOT_LIBRARY=OFF",
                       f"CUSTOM_OPS_ROOT_OPS={ops}")


def test_the_mode_cross_builds_runs_and_verifies_every_example(aarch64_flow, declared):
    names = " ".join(op.short_name for op in declared.values())
    assert f"All aarch64 flows (under qemu-aarch64) passed: {names} match their references" in aarch64_flow.stdout
    build_dir = os.path.join(REPO_ROOT, "cmake-out", "aarch64", "all_ops")
    for built in ("custom_ops_executor_runner", "libcustom_ops_lib.so"):
        assert elf_machine(os.path.join(build_dir, built)) == ELF_MACHINE_AARCH64, built
    assert aarch64_flow.stdout.count("outputs match the reference") == len(declared)


@pytest.mark.parametrize("cpu", CPUS)
def test_every_dtype_and_dynamic_shapes_bit_exact_under_emulation(aarch64_build, dynamic_programs, cpu):
    # Shapes: empty, a tail only, whole 256-element blocks plus a tail (the 16-bit float paths' two halves).
    shapes = [(0, 2, 3, 4), (1, 1, 1, 3), (3, 7, 13, 15)]
    problems = []
    for op, factor in (("mul3", 3), ("mul4", 4)):
        for dtype_name in ALL_DTYPES:
            dtype = getattr(torch, dtype_name)
            pte = dynamic_programs.get(op, dtype, 4)
            for shape in shapes:
                x = full_range(shape, dtype, seed=len(problems) + sum(shape))
                expected = [x * factor]
                actual = run_pte(aarch64_build.runner, pte, [x], expected, pass_shapes=True, emulator=qemu(cpu))
                problems += [f"{op} {dtype_name} {shape}: {p}" for p in mismatches(actual, expected, exact=True)]
    assert problems == []


@functools.cache
def disassembly(library: str) -> str:
    return subprocess.run(["aarch64-linux-gnu-objdump", "-d", library], capture_output=True, text=True,
                          check=True).stdout


def encodings_of(library: str, instruction: str) -> set[str]:
    """The encodings of the library's instructions that match `instruction` (a regular expression from the mnemonic
    on): `fmul\s+v\d+\.8h` (half-precision vector multiply, FEAT_FP16), `sdot\s` (signed 8-bit dot product,
    FEAT_DotProd), `smmla\s` (signed 8-bit matrix multiply, FEAT_I8MM)."""
    return set(re.findall(rf"^\s*[0-9a-f]+:\s+([0-9a-f]{{8}})\s+{instruction}", disassembly(library), re.M))


def translated_encodings(log) -> set[str]:
    """The encodings of every instruction in a QEMU translation log (`-d in_asm`: address, encoding, mnemonic), read
    once: a search of the whole log per encoding took 45 s where none of them was there."""
    return set(re.findall(r"^0x[0-9a-f]+:\s+([0-9a-f]{8})\s", log.read_text(), re.M))


@pytest.mark.parametrize("cpu,expect_half_arithmetic", [("cortex-a53", False), ("max", True)])
def test_half_arithmetic_runs_only_where_the_cpu_has_it(aarch64_build, dynamic_programs, tmp_path, cpu,
                                                        expect_half_arithmetic):
    # QEMU logs every instruction it translates (-d in_asm): the FP16 multiply appears exactly when HWCAP says the CPU
    # has it. On the Cortex-A53 it would be SIGILL, so this also checks the runtime test.
    encodings = encodings_of(aarch64_build.kernel_lib, r"fmul\s+v\d+\.8h")
    assert encodings, "the kernel library has no half-precision vector multiply (the FP16 path was not compiled)"
    x = full_range((1, 1, 16, 16), torch.float16)
    log = tmp_path / "in_asm.log"
    actual = run_pte(aarch64_build.runner, dynamic_programs.get("mul3", torch.float16, 4), [x], [x * 3],
                     pass_shapes=True, emulator=[*qemu(cpu), "-d", "in_asm", "-D", str(log)])
    assert mismatches(actual, [x * 3], exact=True) == []
    ran = bool(encodings & translated_encodings(log))
    assert ran == expect_half_arithmetic, f"{cpu}: half-precision multiply {'ran' if ran else 'did not run'}"


# The integer products each CPU runs in the block formats' tiles, by the kernel's HWCAP: none (the portable loop), sdot,
# or smmla for pairs of tokens and sdot for an odd last one.
PRODUCTS = {"cortex-a53": set(), "neoverse-n1": {"sdot"}, "max": {"sdot", "smmla"}}


def products_run(library: str, log) -> set[str]:
    """Which of sdot and smmla QEMU translated (its `-d in_asm` log) from the library."""
    translated = translated_encodings(log)
    return {mnemonic for mnemonic in ("sdot", "smmla") if encodings_of(library, rf"{mnemonic}\s") & translated}


# Every block format's linear layer in one program. Seven tokens: runs of four, two and one (each tile width of the
# host's and ARM64's tiles); 40 rows: two whole groups and one of 8 (two of its four quarters).
BLOCK_TOKENS, BLOCK_OUTPUTS, BLOCK_INPUTS = 7, 40, 512
BLOCK_EXECUTIONS = 2  # the outputs are the last execution's; the counters count both


@pytest.fixture(scope="module")
def block_formats_program(aot_ops, tmp_path_factory):
    """(.pte, x, the host's outputs, the reference's) for a program calling linear_blocks once per block format."""
    from flow.export import export_to_pte
    from test_block_formats import BLOCK_FORMATS, blocks_module

    module = blocks_module()
    generator = torch.Generator().manual_seed(11)
    weights = {fmt: module.random_weight(fmt, BLOCK_OUTPUTS, BLOCK_INPUTS, generator) for fmt in BLOCK_FORMATS}

    class EveryFormat(torch.nn.Module):
        def __init__(self):
            super().__init__()
            for i, weight in enumerate(weights.values()):
                self.register_buffer(f"w{i}", weight)

        def forward(self, x):
            return tuple(torch.ops.my_ops.linear_blocks(x, getattr(self, f"w{i}"), fmt)
                         for i, fmt in enumerate(weights))

    x = torch.randn(BLOCK_TOKENS, BLOCK_INPUTS, generator=generator) * 3
    pte = export_to_pte(EveryFormat(), (x,), str(tmp_path_factory.mktemp("blocks") / "every_format.pte"))
    host = [torch.ops.my_ops.linear_blocks(x, w, fmt) for fmt, w in weights.items()]
    reference = [module.linear_blocks_reference(x, w, fmt) for fmt, w in weights.items()]
    return pte, x, host, reference


@pytest.mark.parametrize("cpu", PRODUCTS)
def test_every_block_format_takes_the_dot_product_tiles_where_the_cpu_has_them(aarch64_build, block_formats_program,
                                                                              tmp_path, cpu):
    # Within the reference's tolerance on every CPU; with sdot or smmla the tiles' bits are the host's x86 tiles'
    # (AVX2 or AVX-512: the same integer sums, the same float arithmetic per lane in the same order). QEMU logs every
    # instruction it translates: each product appears exactly where HWCAP says the CPU has it (elsewhere it would be
    # SIGILL).
    from test_block_formats import BLOCK_FORMATS, TOLERANCE
    from test_kernel_paths import expected_isa

    pte, x, host, reference = block_formats_program
    for mnemonic in ("sdot", "smmla"):
        assert encodings_of(aarch64_build.kernel_lib, rf"{mnemonic}\s"), f"the kernel library has no {mnemonic}"
    log, counts = tmp_path / "in_asm.log", {}
    actual = run_pte(aarch64_build.runner, pte, [x], host, num_executions=BLOCK_EXECUTIONS,
                     emulator=[*qemu(cpu), "-d", "in_asm", "-D", str(log)], path_counts=counts)
    for fmt, a, r in zip(BLOCK_FORMATS, actual, reference):
        torch.testing.assert_close(a, r, **TOLERANCE, msg=f"{fmt} on {cpu}")
    if PRODUCTS[cpu] and expected_isa(None) != "baseline":
        differ = [fmt for fmt, a, h in zip(BLOCK_FORMATS, actual, host) if bit_difference(a, h) is not None]
        assert differ == [], f"{cpu}: the dot-product tiles' bits differ from the host's vector tiles in {differ}"
    assert products_run(aarch64_build.kernel_lib, log) == PRODUCTS[cpu], cpu
    # The path counters: smmla takes the tokens in pairs and leaves the odd last one to sdot.
    by_smmla = BLOCK_TOKENS // 2 * 2 if "smmla" in PRODUCTS[cpu] else 0
    by_sdot = BLOCK_TOKENS - by_smmla if "sdot" in PRODUCTS[cpu] else 0
    outputs = BLOCK_EXECUTIONS * BLOCK_OUTPUTS * len(BLOCK_FORMATS)
    assert (counts["matrix_multiply"], counts["dot_product"]) == (by_smmla * outputs, by_sdot * outputs), counts


# A whole decoder layer in block formats (tests/test_fused_ops.py's LayerOps), as one my_ops::decoder_layer and as
# the ops it replaces: two executions of 3 tokens (tiles of a run of two and of one), the second attending over the
# cache the first wrote. v's projection apart, in a format of 256-weight blocks beside q and k's of 32 (its activations
# prepared in blocks of their own), as llama-quantize's Q4_K_M has some layers; v with q and k is the op's example, which
# the aarch64 mode runs.
LAYER_FORMATS, LAYER_TOKENS = ("Q8_0", "Q4_1", "Q4_K", "Q6_K", "Q4_K"), 3


@pytest.fixture(scope="module")
def layer_programs(aot_ops, python_ops, tmp_path_factory):
    """({fused: .pte}, each execution's inputs, the host's output of the second)."""
    from flow.export import export_to_pte
    from test_fused_ops import LayerOps as Layer, angles

    class LayerOps(Layer):  # a quarter of the weights (each width whole K-quant blocks): emulation is slow
        MODEL, HEADS, KV_HEADS, HEAD_DIM, MLP = 256, 4, 2, 64, 256

    generator = torch.Generator().manual_seed(3)
    cos, sin = angles((2 * LAYER_TOKENS, LayerOps.HEAD_DIM))
    steps = [(torch.randn(1, LAYER_TOKENS, LayerOps.MODEL, generator=generator),
              cos[None, start:start + LAYER_TOKENS], sin[None, start:start + LAYER_TOKENS], torch.tensor([start]))
             for start in (0, LAYER_TOKENS)]
    directory = tmp_path_factory.mktemp("layer")
    programs = {fused: export_to_pte(LayerOps(fused, LAYER_FORMATS), steps[0], str(directory / f"layer_{fused}.pte"))
                for fused in (True, False)}
    host = LayerOps(True, LAYER_FORMATS)
    host(*steps[0])
    return programs, steps, host(*steps[1])


@pytest.mark.parametrize("cpu", PRODUCTS)
def test_the_decoder_layer_takes_the_dot_product_tiles_and_gives_the_bits_of_the_ops_it_replaces(
        aarch64_build, layer_programs, tmp_path, cpu):
    # The fused op's projections run the same tiles as linear_blocks', so the layer equals the unfused program bit for
    # bit on ARM64 too (each CPU's own code), near the host's; sdot and smmla appear in QEMU's translation log where
    # HWCAP says the CPU has them.
    programs, steps, host = layer_programs
    outputs, ran = {}, {}
    for fused, pte in programs.items():
        log = tmp_path / f"in_asm_{fused}.log"
        (outputs[fused],) = run_pte(aarch64_build.runner, pte, list(steps[0]), [host], num_executions=2,
                                    later_inputs=[list(steps[1])],
                                    emulator=[*qemu(cpu), "-d", "in_asm", "-D", str(log)])
        ran[fused] = products_run(aarch64_build.kernel_lib, log)
    assert bit_difference(outputs[True], outputs[False]) is None, f"{cpu}: the layer's bits differ from its ops'"
    torch.testing.assert_close(outputs[True], host, atol=0.05, rtol=0.05)
    assert ran == {True: PRODUCTS[cpu], False: PRODUCTS[cpu]}, f"{cpu}: products run {ran}"
