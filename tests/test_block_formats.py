"""The block-format ops (kernel_helpers/block_linear.h: linear_f32, linear_q8_0 / q4_0 / q4_1 and their embeddings)
against their references (ops/<format>/<format>.py: the weights dequantized and the activations quantized with ATen
ops), on every vector ISA; the packing of my_ops/hf/quantize.py read back by those references; bad weights and
indices refused by PyTorch and the runtime; a program whose weight holds too few bytes for its shape refused before a
kernel reads it."""

import struct

import pytest
import torch

from helpers import COUNT_PATHS, run_in_fresh_python, run_runner

FORMATS = ("q8_0", "q4_0", "q4_1")
# (tokens, outputs, inputs): one block per row, an odd number of blocks (a pair and a single block), a group of four
# tokens and one more, one row, a row count no tile divides, SmolLM2's widths, a prefill's worth of tokens.
SHAPES = [(1, 1, 32), (1, 7, 64), (3, 40, 96), (5, 33, 96), (4, 9, 160), (2, 5, 576), (1, 43, 1536), (130, 70, 576)]
F32_SHAPES = [(1, 1, 1), (1, 7, 3), (5, 40, 70), (2, 9, 17), (130, 33, 576)]  # widths no vector divides
TOLERANCE = dict(rtol=2e-5, atol=2e-4)  # float sums in another order; the integer parts are exact


def reference_module(fmt: str):
    from flow.declarations import import_repository_module

    return import_repository_module(f"ops.{fmt}.{fmt}")


def run_cases(seed: int = 0) -> tuple[int, int]:
    """Every shape of every format through the op and its reference; the outputs computed, quantized formats and F32
    (raises on a mismatch)."""
    generator = torch.Generator().manual_seed(seed)
    elements = 0
    for fmt in FORMATS:
        module = reference_module(fmt)
        op, reference = getattr(torch.ops.my_ops, f"linear_{fmt}"), getattr(module, f"linear_{fmt}_reference")
        for tokens, outputs, inputs in SHAPES:
            weight = module.random_weight(outputs, inputs, generator)
            x = torch.randn(tokens, inputs, generator=generator) * 3
            actual = op(x, weight)
            torch.testing.assert_close(actual, reference(x, weight), **TOLERANCE, msg=f"{fmt} {tokens}x{outputs}x{inputs}")
            elements += actual.numel()
    f32_elements = 0
    f32 = reference_module("linear_f32")
    for tokens, outputs, inputs in F32_SHAPES:
        weight, x = torch.randn(outputs, inputs, generator=generator), torch.randn(tokens, inputs, generator=generator)
        actual = torch.ops.my_ops.linear_f32(x, weight)
        torch.testing.assert_close(actual, f32.linear_f32_reference(x, weight), **TOLERANCE)
        f32_elements += actual.numel()
    return elements, f32_elements


# Each vector ISA's code in a fresh process with CUSTOM_OPS_ISA capping it, counted where it wrote its outputs.
ISA_PROBE = """
from helpers import path_counts
from flow import registration
registration.load_aot_library({aot!r})
from test_block_formats import run_cases
quantized, f32 = run_cases()
counts = path_counts({aot!r})
result = {{"quantized": quantized, "f32": f32, **counts}}
"""


def cpu_has_vnni() -> bool:
    with open("/proc/cpuinfo") as f:
        return "avx512_vnni" in f.read().split()


@pytest.mark.parametrize("isa", ["baseline", "avx2", "avx512"])
def test_every_format_equals_its_reference_on_every_vector_isa(isa, combined_build):
    # The quantized formats' AVX-512 code needs VNNI: on an AVX-512 CPU without it they run the AVX2 loop (F32 does
    # not need it).
    from test_kernel_paths import expected_isa

    if expected_isa(isa) != isa:
        pytest.skip(f"this CPU has no {isa}")
    counts = run_in_fresh_python(ISA_PROBE.format(aot=combined_build.aot_lib),
                                 env=dict(COUNT_PATHS, CUSTOM_OPS_ISA=isa))
    quantized_isa = "avx2" if isa == "avx512" and not cpu_has_vnni() else isa
    expected = {"baseline": 0, "avx2": 0, "avx512": 0}
    expected[isa] += counts["f32"]
    expected[quantized_isa] += counts["quantized"]
    assert counts["quantized"] > 0 and counts["f32"] > 0
    assert {k: counts[k] for k in expected} == expected, counts


@pytest.mark.parametrize("fmt", FORMATS)
def test_activation_blocks_of_zeros_infinities_and_ties(fmt, aot_ops):
    # A block of zeros (d = 0) adds nothing; a block holding an infinity or a NaN makes every output NaN, as a float
    # product would; values landing on x / d = k + 0.5 round to even, as the reference's torch.round does.
    module = reference_module(fmt)
    op, reference = getattr(torch.ops.my_ops, f"linear_{fmt}"), getattr(module, f"linear_{fmt}_reference")
    weight = module.random_weight(8, 96, torch.Generator().manual_seed(1))
    x = torch.randn(4, 96, generator=torch.Generator().manual_seed(2))
    x[0, :32] = 0
    x[1, 32:64] = torch.inf
    x[2, 70] = torch.nan
    x[3, :32] = (torch.arange(32) - 16 + 0.5) / 16  # with a maximum of 127/16, d = 1/16 and x / d = k + 0.5
    x[3, 0] = 127 / 16
    actual, expected = op(x, weight), reference(x, weight)
    assert actual[1:3].isnan().all() and not actual[[0, 3]].isnan().any()
    torch.testing.assert_close(actual, expected, **TOLERANCE, equal_nan=True)


@pytest.mark.parametrize("fmt", FORMATS)
def test_embeddings_equal_their_reference_bit_for_bit(fmt, aot_ops):
    from flow.compare import assert_bit_exact

    module = reference_module(fmt)
    table = module.random_weight(50, 96, torch.Generator().manual_seed(3))
    indices = torch.tensor([[0, 49, 7], [7, 7, 1]])
    actual = getattr(torch.ops.my_ops, f"embedding_{fmt}")(table, indices)
    assert actual.shape == (2, 3, 96)
    assert_bit_exact(actual, getattr(module, f"embedding_{fmt}_reference")(table, indices), fmt)


@pytest.mark.parametrize("fmt", ("f32", *FORMATS))
def test_strided_inputs_and_outputs_give_the_dense_results(fmt, aot_ops):
    # PyTorch hands kernels strided tensors: in ATen mode they compute on dense copies and copy into a strided out.
    generator = torch.Generator().manual_seed(4)
    weight = (torch.randn(24, 64, generator=generator) if fmt == "f32" else
              reference_module(fmt).random_weight(24, 64, generator))
    linear = getattr(torch.ops.my_ops, f"linear_{fmt}")
    x = torch.randn(64, 5, generator=generator).t()
    out = torch.empty(24, 5).t()
    assert not x.is_contiguous() and not out.is_contiguous()
    linear.out(x, weight, out=out)
    assert torch.equal(out, linear(x.contiguous(), weight))
    if fmt != "f32":
        embedding = getattr(torch.ops.my_ops, f"embedding_{fmt}")
        indices = torch.tensor([[3, 0, 23], [5, 5, 1]]).t()
        rows = torch.empty(64, 2, 3).permute(2, 1, 0)
        assert not indices.is_contiguous() and not rows.is_contiguous()
        embedding.out(weight, indices, out=rows)
        assert torch.equal(rows, embedding(weight, indices.contiguous()))


@pytest.mark.parametrize("fmt", FORMATS)
def test_packed_weights_read_back_as_the_format_defines(fmt):
    # my_ops.hf packs at export what the kernels read; the op's reference (written apart from it) reads it back: every
    # weight within half a step of its block's grid (Q4_0: a step, its grid reaches -8 steps one way and 7 the other),
    # a block of zeros stays zero, 17 rows make a whole group and a short one, and a weight already on a Q4_1 grid (a
    # GGUF file's dequantized blocks) comes back exactly.
    from my_ops.hf.quantize import pack

    module = reference_module(fmt)
    weight = torch.randn(17, 96, generator=torch.Generator().manual_seed(4))
    weight[3, :32] = 0
    restored = module.dequantize(pack(weight, fmt))
    blocks = weight.reshape(17, 3, 32)
    step = {"q8_0": blocks.abs().amax(-1) / 127 / 2, "q4_0": blocks.abs().amax(-1) / 8,
            "q4_1": (blocks.amax(-1) - blocks.amin(-1)) / 15 / 2}[fmt]
    error = (restored - weight).abs().reshape(17, 3, 32).amax(-1)
    assert bool((error <= step * 1.01 + 1e-3).all()), (error - step).max()
    assert torch.equal(restored[3, :32], weight[3, :32])
    if fmt == "q4_1":
        weight[5, 32:64] = 0.25  # a constant block: d = 0, m its value
        assert torch.equal(module.dequantize(pack(weight, fmt))[5, 32:64], weight[5, 32:64])
        d = (torch.rand(17, 3, 1) * 0.1 + 0.01).half().float()
        m = torch.randn(17, 3, 1).half().float()
        on_grid = (torch.randint(0, 16, (17, 3, 32)).float() * d + m).reshape(17, 96)
        on_grid[:, ::32] = m.reshape(17, 3)  # each block's minimum present, as q = 0 makes it
        on_grid[:, 31::32] = (15 * d + m).reshape(17, 3)
        assert torch.equal(module.dequantize(pack(on_grid, fmt)), on_grid)


BAD_WEIGHTS = [
    ("rows not whole blocks", lambda fmt, w: w[:, :-1], "are not whole"),
    ("a weight of another dtype", lambda fmt, w: w.float(), "weight has dtype float32"),
    ("a weight of one dimension", lambda fmt, w: w.reshape(-1), "must have 2 dimensions"),
]


@pytest.mark.parametrize("what, change, words", BAD_WEIGHTS, ids=[b[0] for b in BAD_WEIGHTS])
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_bad_weight_is_refused_by_name(fmt, what, change, words, aot_ops):
    weight = reference_module(fmt).random_weight(8, 64, torch.Generator().manual_seed(5))
    for call in (lambda w: getattr(torch.ops.my_ops, f"linear_{fmt}")(torch.randn(2, 64), w),
                 lambda w: getattr(torch.ops.my_ops, f"embedding_{fmt}")(w, torch.tensor([1])),
                 lambda w: getattr(torch.ops.my_ops, f"linear_{fmt}")(torch.randn(2, 64, device="meta"),
                                                                      w.to("meta"))):
        with pytest.raises(RuntimeError, match=words):
            call(change(fmt, weight))


def test_an_input_of_another_width_or_dtype_and_an_index_outside_the_table_are_refused(aot_ops):
    weight = reference_module("q4_1").random_weight(8, 64, torch.Generator().manual_seed(6))
    with pytest.raises(RuntimeError, match=r"my_ops::linear_q4_1: input \[2, 96\] must end in the layer's 64 inputs"):
        torch.ops.my_ops.linear_q4_1(torch.randn(2, 96), weight)
    with pytest.raises(RuntimeError, match="input has unsupported dtype float16; supported: float32"):
        torch.ops.my_ops.linear_q4_1(torch.randn(2, 64).half(), weight)
    with pytest.raises(RuntimeError, match=r"index 8 \(element 1 of indices\) is outside the table's 8 rows"):
        torch.ops.my_ops.embedding_q4_1(weight, torch.tensor([0, 8]))
    with pytest.raises(RuntimeError, match="index -1"):
        torch.ops.my_ops.embedding_q4_1(weight, torch.tensor([-1]))
    with pytest.raises(RuntimeError, match="requires grad, but this op is for inference"):
        torch.ops.my_ops.linear_f32(torch.randn(2, 3, requires_grad=True), torch.randn(4, 3))


@pytest.fixture(scope="module")
def embedding_program(declared, aot_ops, tmp_path_factory):
    from flow.export import export_example

    return export_example(declared["my_ops::embedding_q4_1"], tmp_path_factory.mktemp("embedding"))


def test_an_index_outside_the_table_is_one_error_in_the_runner_and_the_python_runtime(embedding_program,
                                                                                      combined_build, tmp_path):
    from flow.runtime import load_kernel_library, load_method_checked

    bad = tmp_path / "indices.bin"
    bad.write_bytes(struct.pack("<4q", 0, 5, 40, 7))  # the example's table has 40 rows
    proc = run_runner(combined_build.runner, f"--model_path={embedding_program}", f"--inputs={bad}")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 1 and len(errors) == 1, proc.stderr[-2000:]
    assert "index 40 (element 2 of indices) is outside the table's 40 rows" in proc.stderr
    load_kernel_library(combined_build.kernel_lib)
    method = load_method_checked(embedding_program)
    with pytest.raises(RuntimeError):
        method.execute([torch.tensor([[0, 5, 40, 7]])])
    assert method.execute([torch.tensor([[0, 5, 39, 7]])])[0].shape == (1, 4, 96)


def test_a_weight_shape_past_its_stored_bytes_is_refused_before_a_kernel_reads_it(declared, aot_ops, combined_build,
                                                                                   tmp_path):
    # The packed weight is a constant of the program: a program claiming more rows than its bytes hold must not send
    # the kernel past them. ExecuTorch's loader checks a constant's size against its segment (this test holds it to
    # that), so the kernels' checks start from a weight whose bytes are all there.
    from flow.export import export_example
    from flow.runtime import load_kernel_library, load_method_checked
    from pte_surgery import edit_plan

    def more_rows(plan):
        (weight,) = [v.val for v in plan.values if getattr(v.val, "data_buffer_idx", 0) > 0
                     and getattr(v.val, "sizes", None) and len(v.val.sizes) == 2]
        weight.sizes = [weight.sizes[0] * 64, weight.sizes[1]]

    good = export_example(declared["my_ops::linear_q4_1"], str(tmp_path))
    bad = edit_plan(good, str(tmp_path / "more_rows.pte"), more_rows)
    proc = run_runner(combined_build.runner, f"--model_path={bad}")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 1 and len(errors) == 1, proc.stderr[-2000:]
    assert "invalid for program constant segment size" in proc.stderr
    load_kernel_library(combined_build.kernel_lib)
    with pytest.raises(RuntimeError, match="Failed to load method forward"):
        load_method_checked(bad)
    assert load_method_checked(good).execute([torch.randn(1, 5, 96)])[0].shape == (1, 5, 40)
