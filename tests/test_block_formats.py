"""my_ops::linear_blocks and embedding_blocks (ops/blocks: every GGUF format, kernel_helpers/block_formats.h) against
their reference (ops/blocks/blocks.py: the weights dequantized and the activations quantized with ATen ops), every
format at shapes that reach each path, on every vector ISA; the packing of my_ops/hf/quantize.py read back by the
reference; bad formats, weights and indices refused by PyTorch and the runtime; a program whose weight holds too few
bytes for its shape refused before a kernel reads it. The formats' bytes against llama.cpp's own are test_gguf.py's."""

import os
import struct
import subprocess
import sys

import pytest
import torch

from helpers import COUNT_PATHS, copy_repository, run_in_fresh_python, run_runner

TOLERANCE = dict(rtol=2e-5, atol=2e-4)  # float sums in another order; the integer parts are exact


def blocks_module():
    from flow.declarations import import_repository_module

    return import_repository_module("ops.blocks.blocks")


def all_formats() -> list[str]:
    module = blocks_module()
    return [*module.ROW_FORMATS, *module.LAYOUTS]


FORMATS = all_formats()
BLOCK_FORMATS = [f for f in FORMATS if f not in ("F32", "F16", "BF16")]


def shapes(fmt: str) -> list[tuple[int, int, int]]:
    """(tokens, outputs, inputs) for a format of W weights a block: one block per row, two, an odd count; a group of
    four tokens and one more, one row, a row count no tile divides (a whole group and a short one), SmolLM2's widths
    where blocks allow, a prefill's worth of tokens. Row formats: widths no vector divides; prefills in panels of 16
    tokens (a short last panel, rows no tile divides; inputs too many for one pass over the panels, in pieces) from
    16 tokens (float32) or 32 (F16, BF16)."""
    if fmt in ("F32", "F16", "BF16"):
        return [(1, 1, 1), (1, 7, 3), (5, 40, 70), (2, 9, 17), (130, 33, 576), (17, 20, 48), (40, 20, 48),
                (40, 9, 70), (40, 13, 2560), (40, 11, 48)]
    w = blocks_module().LAYOUTS[fmt].weights
    widths = [w, 2 * w, 3 * w] + ([576, 1536] if w == 32 else [1536])
    return [(1, 1, widths[0]), (1, 7, widths[1]), (3, 40, widths[2]), (5, 33, widths[0]), (9, 17, widths[1]),
            (1, 43, widths[-1]), (130, 70, widths[-2])]


def in_panels(fmt: str, tokens: int, inputs: int) -> bool:
    """Whether a row format's vector code (AVX2, AVX-512) takes these activations in panels (ops/blocks/block_ops.h)."""
    return tokens >= (16 if fmt == "F32" else 32) and inputs % 16 == 0


def run_cases(seed: int = 0) -> dict[str, int]:
    """Every shape of every format through the op and its reference (raises on a mismatch), and the block formats'
    special activations; the outputs computed per kind of format, and those of the row formats a prefill's panels
    would take."""
    module = blocks_module()
    generator = torch.Generator().manual_seed(seed)
    computed = {"blocks": 0, "rows": 0, "panels": 0}
    for fmt in FORMATS:
        for tokens, outputs, inputs in shapes(fmt):
            weight = module.random_weight(fmt, outputs, inputs, generator)
            x = torch.randn(tokens, inputs, generator=generator) * 3
            actual = torch.ops.my_ops.linear_blocks(x, weight, fmt)
            expected = module.linear_blocks_reference(x, weight, fmt)
            torch.testing.assert_close(actual, expected, **TOLERANCE, msg=f"{fmt} {tokens}x{outputs}x{inputs}")
            computed["rows" if fmt in module.ROW_FORMATS else "blocks"] += actual.numel()
            if fmt in module.ROW_FORMATS and in_panels(fmt, tokens, inputs):
                computed["panels"] += actual.numel()
        if fmt not in module.ROW_FORMATS:  # each ISA's activation quantizer on zeros, infinities, NaN and ties
            check_special_activations(fmt)
            computed["blocks"] += 4 * 8
    return computed


# Each vector ISA's code in a fresh process with CUSTOM_OPS_ISA capping it, counted where it wrote its outputs.
ISA_PROBE = """
from helpers import path_counts
from flow import registration
registration.load_aot_library({aot!r})
from test_block_formats import run_cases
result = {{**run_cases(), **path_counts({aot!r})}}
"""


def cpu_has_vnni() -> bool:
    with open("/proc/cpuinfo") as f:
        return "avx512_vnni" in f.read().split()


@pytest.mark.parametrize("isa", ["baseline", "avx2", "avx512"])
def test_every_format_equals_its_reference_on_every_vector_isa(isa, combined_build):
    # The block formats' AVX-512 code needs VNNI: on an AVX-512 CPU without it they run the AVX2 tiles (rows do not).
    from test_kernel_paths import expected_isa

    if expected_isa(isa) != isa:
        pytest.skip(f"this CPU has no {isa}")
    counts = run_in_fresh_python(ISA_PROBE.format(aot=combined_build.aot_lib),
                                 env=dict(COUNT_PATHS, CUSTOM_OPS_ISA=isa))
    blocks_isa = "avx2" if isa == "avx512" and not cpu_has_vnni() else isa
    expected = {"baseline": 0, "avx2": 0, "avx512": 0}
    expected[isa] += counts["rows"]
    expected[blocks_isa] += counts["blocks"]
    assert counts["blocks"] > 0 and counts["rows"] > 0 and counts["panels"] > 0
    assert {k: counts[k] for k in expected} == expected, counts
    # The row formats' prefills in panels: the vector code (AVX2 and AVX-512) only.
    assert counts["row_panel_outputs"] == (counts["panels"] if isa != "baseline" else 0), counts


# Every block format's outputs, and the row formats' prefills in panels, as bits: the AVX2 tiles form the AVX-512
# tiles' integer sums with other instructions and do the same float arithmetic per lane in the same order.
BITS_PROBE = """
import torch
from flow import registration
registration.load_aot_library({aot!r})
from test_block_formats import FORMATS, blocks_module, in_panels, shapes
module = blocks_module()
generator = torch.Generator().manual_seed(7)
result = {{}}
for fmt in FORMATS:
    for tokens, outputs, inputs in shapes(fmt):
        weight = module.random_weight(fmt, outputs, inputs, generator)
        x = torch.randn(tokens, inputs, generator=generator) * 3
        if fmt in module.ROW_FORMATS and not in_panels(fmt, tokens, inputs):
            continue
        y = torch.ops.my_ops.linear_blocks(x, weight, fmt)
        result[f"{{fmt}} {{tokens}}x{{outputs}}x{{inputs}}"] = y.view(torch.int32).flatten().tolist()
"""


def test_the_avx2_tiles_give_the_avx512_tiles_bits(combined_build):
    from test_kernel_paths import expected_isa

    if expected_isa("avx512") != "avx512" or not cpu_has_vnni():
        pytest.skip("this CPU has no AVX-512 VNNI tiles to compare with")
    outputs = {isa: run_in_fresh_python(BITS_PROBE.format(aot=combined_build.aot_lib), env={"CUSTOM_OPS_ISA": isa})
               for isa in ("avx2", "avx512")}
    assert {case.split()[0] for case in outputs["avx2"]} == set(FORMATS), sorted(outputs["avx2"])
    differ = [case for case in outputs["avx512"] if outputs["avx2"][case] != outputs["avx512"][case]]
    assert differ == [], differ


# A decode step's cost on a second core is its hand-offs to the pool: counted in the runtime's kernels, where the
# pool is reached, over three executions of a program with a large and a small projection, at two threads and at one.
HANDOFF_PROBE = """
import torch
from executorch.exir import to_edge
from executorch.extension.pybindings import portable_lib
from helpers import path_counts
from flow import registration
from flow.runtime import load_kernel_library, load_method_checked
from test_block_formats import blocks_module
registration.load_aot_library({aot!r})
load_kernel_library({kernel_lib!r})
generator = torch.Generator().manual_seed(5)
large = blocks_module().random_weight("Q4_0", 1024, 1024, generator)  # 1M multiply-adds a token: the pool's
small = blocks_module().random_weight("Q4_0", 64, 64, generator)      # 4K: the calling thread's


class Projections(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("large", large)
        self.register_buffer("small", small)

    def forward(self, x):
        y = torch.ops.my_ops.linear_blocks(x, self.large, "Q4_0")
        return torch.ops.my_ops.linear_blocks(y[..., :64], self.small, "Q4_0")


pte = {out!r}
with open(pte, "wb") as f:
    f.write(to_edge(torch.export.export(Projections(), (torch.randn(1, 1024),))).to_executorch().buffer)
method = load_method_checked(pte)
result = {{}}
for threads in (2, 1):
    portable_lib._unsafe_reset_threadpool(threads)
    before = path_counts({kernel_lib!r})
    for _ in range(3):
        method.execute([torch.randn(1, 1024)])
    after = path_counts({kernel_lib!r})
    result[threads] = {{key: after[key] - before[key] for key in after if key.startswith(("pool", "linear", "attention",
                                                                                         "other"))}}
"""


def test_hand_offs_are_counted_and_timed_for_their_user_where_the_pool_is_reached(combined_build, tmp_path):
    counts = run_in_fresh_python(HANDOFF_PROBE.format(aot=combined_build.aot_lib, kernel_lib=combined_build.kernel_lib,
                                                      out=str(tmp_path / "projections.pte")), env=COUNT_PATHS)
    # The large projection once an execution; the small never. Its time on the pool goes to the linear layers' pair:
    # the thread-time held, and within it the tasks' work.
    two, one = counts["2"], counts["1"]
    assert two["pool_handoffs"] == 3 and one["pool_handoffs"] == 0, counts
    assert 0 < two["linear_work_ns"] <= two["linear_pool_ns"], counts
    assert not any(value for key, value in two.items() if key.startswith(("attention", "other"))), counts
    assert not any(one.values()), counts


def special_activations(fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, weight): four tokens of three blocks each: a block of zeros (d = 0), one of infinities, one holding a NaN,
    and values landing on x / d = k + 0.5 (with a maximum of 127/16, d = 1/16)."""
    module = blocks_module()
    inputs = 3 * module.LAYOUTS[fmt].weights
    weight = module.random_weight(fmt, 8, inputs, torch.Generator().manual_seed(1))
    x = torch.randn(4, inputs, generator=torch.Generator().manual_seed(2))
    x[0, :32] = 0
    x[1, 32:64] = torch.inf
    x[2, 70] = torch.nan
    x[3, :32] = (torch.arange(32) - 16 + 0.5) / 16
    x[3, 0] = 127 / 16
    return x, weight


def check_special_activations(fmt: str) -> None:
    # A block of zeros adds nothing; a block holding an infinity or a NaN makes every output NaN, as a float product
    # would; ties round to even, as the reference's torch.round does.
    x, weight = special_activations(fmt)
    actual = torch.ops.my_ops.linear_blocks(x, weight, fmt)
    expected = blocks_module().linear_blocks_reference(x, weight, fmt)
    assert actual[1:3].isnan().all() and not actual[[0, 3]].isnan().any(), fmt
    torch.testing.assert_close(actual, expected, **TOLERANCE, equal_nan=True, msg=f"{fmt} special activations")


@pytest.mark.parametrize("fmt", BLOCK_FORMATS)
def test_activation_blocks_of_zeros_infinities_and_ties(fmt, aot_ops):
    # This process's ISA; run_cases takes them through every ISA's quantizer too.
    check_special_activations(fmt)


@pytest.mark.parametrize("fmt", FORMATS)
def test_embeddings_equal_their_reference_bit_for_bit(fmt, aot_ops):
    from flow.compare import assert_bit_exact

    module = blocks_module()
    inputs = 2 * module.LAYOUTS[fmt].weights if fmt in module.LAYOUTS else 70
    table = module.random_weight(fmt, 50, inputs, torch.Generator().manual_seed(3))
    indices = torch.tensor([[0, 49, 7], [7, 7, 33]])  # in a whole group of 16, and in the short last one
    actual = torch.ops.my_ops.embedding_blocks(table, indices, fmt)
    assert actual.shape == (2, 3, inputs)
    assert_bit_exact(actual, module.embedding_blocks_reference(table, indices, fmt), fmt)


@pytest.mark.parametrize("fmt", ["F32", "BF16", "Q4_1", "Q6_K"])
def test_strided_inputs_and_outputs_give_the_dense_results(fmt, aot_ops):
    # PyTorch hands kernels strided tensors: in ATen mode they compute on dense copies and copy into a strided out.
    generator = torch.Generator().manual_seed(4)
    inputs = 256
    weight = blocks_module().random_weight(fmt, 24, inputs, generator)
    linear, embedding = torch.ops.my_ops.linear_blocks, torch.ops.my_ops.embedding_blocks
    x = torch.randn(inputs, 5, generator=generator).t()
    out = torch.empty(24, 5).t()
    assert not x.is_contiguous() and not out.is_contiguous()
    linear.out(x, weight, fmt, out=out)
    assert torch.equal(out, linear(x.contiguous(), weight, fmt))
    indices = torch.tensor([[3, 0, 23], [5, 5, 1]]).t()
    rows = torch.empty(inputs, 2, 3).permute(2, 1, 0)
    assert not indices.is_contiguous() and not rows.is_contiguous()
    embedding.out(weight, indices, fmt, out=rows)
    assert torch.equal(rows, embedding(weight, indices.contiguous(), fmt))


@pytest.mark.parametrize("fmt", ["F32", "F16", "BF16"])
@pytest.mark.parametrize("tokens", [1, 3])
def test_activations_off_a_cache_line_give_the_aligned_results(fmt, tokens, aot_ops):
    # ExecuTorch's memory plan aligns tensors to 16 bytes: the row formats copy such activations to a line-aligned
    # buffer first (ops/blocks/block_ops.h). The copy must carry every element: the same bits as from an aligned x.
    generator = torch.Generator().manual_seed(6)
    inputs = 200  # a tail after whole vectors
    weight = blocks_module().random_weight(fmt, 40, inputs, generator)
    storage = torch.randn(tokens * inputs + 16, generator=generator)
    for offset in (1, 4, 12):  # 4, 16 and 48 bytes off a 64-byte line
        x = storage[offset:offset + tokens * inputs].view(tokens, inputs)
        assert x.data_ptr() % 64 != 0 and x.is_contiguous()
        aligned = x.clone()
        assert aligned.data_ptr() % 64 == 0
        expected = torch.ops.my_ops.linear_blocks(aligned, weight, fmt)
        assert torch.equal(torch.ops.my_ops.linear_blocks(x, weight, fmt), expected), offset


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_0", "Q4_1"])
def test_packed_weights_read_back_as_the_format_defines(fmt):
    # my_ops.hf packs at export what the kernels read; the op's reference (written apart from it) reads it back: every
    # weight within half a step of its block's grid (Q4_0: a step, its grid reaches -8 steps one way and 7 the other),
    # a block of zeros stays zero, 17 rows make a whole group and a short one, and a weight already on a Q4_1 grid (a
    # GGUF file's dequantized blocks) comes back exactly.
    from my_ops.hf.quantize import pack

    module = blocks_module()
    weight = torch.randn(17, 96, generator=torch.Generator().manual_seed(4))
    weight[3, :32] = 0
    restored = module.dequantize(pack(weight, fmt), fmt)
    blocks = weight.reshape(17, 3, 32)
    step = {"Q8_0": blocks.abs().amax(-1) / 127 / 2, "Q4_0": blocks.abs().amax(-1) / 8,
            "Q4_1": (blocks.amax(-1) - blocks.amin(-1)) / 15 / 2}[fmt]
    error = (restored - weight).abs().reshape(17, 3, 32).amax(-1)
    assert bool((error <= step * 1.01 + 1e-3).all()), (error - step).max()
    assert torch.equal(restored[3, :32], weight[3, :32])
    if fmt == "Q4_1":
        weight[5, 32:64] = 0.25  # a constant block: d = 0, m its value
        assert torch.equal(module.dequantize(pack(weight, fmt), fmt)[5, 32:64], weight[5, 32:64])
        d = (torch.rand(17, 3, 1) * 0.1 + 0.01).half().float()
        m = torch.randn(17, 3, 1).half().float()
        on_grid = (torch.randint(0, 16, (17, 3, 32)).float() * d + m).reshape(17, 96)
        on_grid[:, ::32] = m.reshape(17, 3)  # each block's minimum present, as q = 0 makes it
        on_grid[:, 31::32] = (15 * d + m).reshape(17, 3)
        assert torch.equal(module.dequantize(pack(on_grid, fmt), fmt), on_grid)


def test_the_kernels_know_each_format_as_block_layouts_states_it_and_as_llama_cpp_sizes_it(aot_ops):
    # C++ knows a format from its traits source (ops/blocks/formats/<f>.cpp, listed in formats.h), Python from
    # ops/blocks/block_layouts.py: the same formats in one order (the list a refusal names), and the weights and bytes
    # of a block as llama.cpp's own table has them (the gguf package's). The layouts within the bytes are held by the
    # bit-for-bit tests (test_gguf.py: a file's blocks through the packer, the reference and the kernel).
    import gguf

    from ops.blocks.block_layouts import FORMATS, LAYOUTS, ROW_DTYPES

    def embedded_width(weight, fmt):
        no_indices = torch.empty(0, dtype=torch.long, device="meta")
        return torch.ops.my_ops.embedding_blocks(weight, no_indices, fmt).shape[-1]

    with pytest.raises(RuntimeError) as refusal:
        embedded_width(torch.empty(1, 1, dtype=torch.uint8, device="meta"), "Q9_K")
    assert str(refusal.value).partition("it takes the GGUF types ")[2].partition(" (")[0].split(", ") == list(FORMATS)
    for fmt, spec in LAYOUTS.items():
        assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[fmt]] == (spec.weights, spec.bytes), fmt
        assert embedded_width(torch.empty(3, 2 * spec.bytes, dtype=torch.uint8, device="meta"), fmt) == 2 * spec.weights
    for fmt, dtype in ROW_DTYPES.items():
        assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[fmt]] == (1, getattr(torch, dtype).itemsize), fmt
        assert embedded_width(torch.empty(3, 5, dtype=getattr(torch, dtype), device="meta"), fmt) == 5


def test_a_layout_that_a_formats_traits_do_not_have_stops_the_cmake_build_at_that_format(tmp_path):
    # The C++ statement of the layouts is written from block_layouts.py when the tree is configured (CMake's
    # generate_block_layouts_header; Buck2's block_layouts genrule, held by test_buck2_graph.py), and each format's
    # traits are checked against it as they compile: a copy whose Q8_0 layout its traits do not have builds no Q8_0.
    repo = copy_repository(tmp_path / "repo")
    path = os.path.join(repo, "ops", "blocks", "block_layouts.py")
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text.replace('"Q8_0": Layout(32, 32, 128,', '"Q8_0": Layout(32, 32, 127,', 1))
    build = tmp_path / "build"
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    for command, fails in (
            (["cmake", "-S", repo, "-B", str(build), "-G", "Ninja", f"-DPython3_EXECUTABLE={sys.executable}",
              "-DCUSTOM_OPS_ROOT_OPS=my_ops::linear_blocks.out", "-DCUSTOM_OPS_BUILD_AOT_LIBRARY=OFF"], False),
            (["cmake", "--build", str(build), "--target",
              "CMakeFiles/custom_ops_kernel_objects.dir/ops/blocks/formats/q8_0.cpp.o"], True)):
        proc = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
        assert (proc.returncode != 0) == fails, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "differ from its layout in ops/blocks/block_layouts.py: make the two agree" in proc.stdout
    assert "q8_0.cpp" in proc.stdout


def test_the_traits_check_tells_each_field_of_a_layout(combined_build):
    # tests/cpp/block_layouts_stated.cpp: is_stated, the check above, fails a statement that differs from a format's
    # traits in any one field, at compile time: the combined tree would not build otherwise; built means checked.
    proc = subprocess.run([os.path.join(combined_build.build_dir, "block_layouts_stated")], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok: is_stated tells each field of a layout", proc.stderr


BAD_WEIGHTS = [
    ("rows not whole blocks", lambda w: w[:, :-1], "are not whole"),
    ("a weight of another dtype", lambda w: w.float() if w.dtype == torch.uint8 else w.to(torch.int8),
     "weight has dtype"),
    ("a weight of one dimension", lambda w: w.reshape(-1), "must have 2 dimensions"),
]


BAD_CASES = [(fmt, *bad) for fmt in ("Q4_1", "Q5_K", "F16") for bad in BAD_WEIGHTS
             if not (fmt == "F16" and bad[0] == "rows not whole blocks")]  # a row format has no blocks


@pytest.mark.parametrize("fmt, what, change, words", BAD_CASES, ids=[f"{c[0]}-{c[1]}" for c in BAD_CASES])
def test_a_bad_weight_is_refused_by_name(fmt, what, change, words, aot_ops):
    inputs = 256
    weight = blocks_module().random_weight(fmt, 8, inputs, torch.Generator().manual_seed(5))
    for call in (lambda w: torch.ops.my_ops.linear_blocks(torch.randn(2, inputs), w, fmt),
                 lambda w: torch.ops.my_ops.embedding_blocks(w, torch.tensor([1]), fmt),
                 lambda w: torch.ops.my_ops.linear_blocks(torch.randn(2, inputs, device="meta"), w.to("meta"), fmt)):
        with pytest.raises(RuntimeError, match=words):
            call(change(weight))


def test_an_unknown_format_a_width_a_dtype_and_an_index_outside_the_table_are_refused(aot_ops):
    weight = blocks_module().random_weight("Q4_1", 8, 64, torch.Generator().manual_seed(6))
    linear, embedding = torch.ops.my_ops.linear_blocks, torch.ops.my_ops.embedding_blocks
    for call in (lambda: linear(torch.randn(2, 64), weight, "IQ4_XS"), lambda: embedding(weight, torch.tensor([0]), "q4_1"),
                 lambda: linear(torch.randn(2, 64, device="meta"), weight.to("meta"), "MXFP4")):
        with pytest.raises(RuntimeError, match=r"format '\w+' is not one this op takes; it takes the GGUF types F32, "
                                               r"F16, BF16, Q8_0.*Q6_K \(i-quants, TQ and MXFP4"):
            call()
    with pytest.raises(RuntimeError, match=r"my_ops::linear_blocks: input \[2, 96\] must end in the layer's 64 inputs"):
        linear(torch.randn(2, 96), weight, "Q4_1")
    with pytest.raises(RuntimeError, match="input has unsupported dtype float16; supported: float32"):
        linear(torch.randn(2, 64).half(), weight, "Q4_1")
    with pytest.raises(RuntimeError, match="a Q8_0 weight is uint8"):  # the bytes of one format read as another's
        linear(torch.randn(2, 64), torch.zeros(8, 60, dtype=torch.float16), "Q8_0")
    with pytest.raises(RuntimeError, match=r"index 8 \(element 1 of indices\) is outside the table's 8 rows"):
        embedding(weight, torch.tensor([0, 8]), "Q4_1")
    with pytest.raises(RuntimeError, match="index -1"):
        embedding(weight, torch.tensor([-1]), "Q4_1")
    with pytest.raises(RuntimeError, match="linear_blocks: input requires grad, but this op is for inference"):
        linear(torch.randn(2, 3, requires_grad=True), torch.randn(4, 3), "F32")
    with pytest.raises(RuntimeError, match="embedding_blocks: weight requires grad, but this op is for inference"):
        embedding(torch.randn(4, 3, requires_grad=True), torch.tensor([0, 3]), "F32")  # a row format's float table


@pytest.fixture(scope="module")
def embedding_program(declared, aot_ops, tmp_path_factory):
    from flow.export import export_example

    return export_example(declared["my_ops::embedding_blocks"], tmp_path_factory.mktemp("embedding"))


def test_an_index_outside_the_table_is_one_error_in_the_runner_and_the_python_runtime(embedding_program,
                                                                                      combined_build, tmp_path):
    from flow.runtime import load_kernel_library, load_method_checked

    bad = tmp_path / "indices.bin"
    bad.write_bytes(struct.pack("<4q", 0, 5, 40, 7))  # the example's tables have 40 rows
    proc = run_runner(combined_build.runner, f"--model_path={embedding_program}", f"--inputs={bad}")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 1 and len(errors) == 1, proc.stderr[-2000:]
    assert "index 40 (element 2 of indices) is outside the table's 40 rows" in proc.stderr
    load_kernel_library(combined_build.kernel_lib)
    method = load_method_checked(embedding_program)
    with pytest.raises(RuntimeError):
        method.execute([torch.tensor([[0, 5, 40, 7]])])
    assert method.execute([torch.tensor([[0, 5, 39, 7]])])[0].shape == (1, 4, 512 * len(FORMATS))


def test_a_weight_shape_past_its_stored_bytes_is_refused_before_a_kernel_reads_it(declared, aot_ops, combined_build,
                                                                                   tmp_path):
    # The packed weight is a constant of the program: a program claiming more rows than its bytes hold must not send
    # the kernel past them. ExecuTorch's loader checks a constant's size against its segment (this test holds it to
    # that), so the kernels' checks start from a weight whose bytes are all there.
    from flow.export import export_example
    from flow.runtime import load_kernel_library, load_method_checked
    from pte_surgery import edit_plan

    def more_rows(plan):
        weights = [v.val for v in plan.values if getattr(v.val, "data_buffer_idx", 0) > 0
                   and getattr(v.val, "sizes", None) and len(v.val.sizes) == 2]
        weights[-1].sizes = [weights[-1].sizes[0] * 64, weights[-1].sizes[1]]  # one format's weight

    good = export_example(declared["my_ops::linear_blocks"], str(tmp_path))
    bad = edit_plan(good, str(tmp_path / "more_rows.pte"), more_rows)
    proc = run_runner(combined_build.runner, f"--model_path={bad}")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 1 and len(errors) == 1, proc.stderr[-2000:]
    assert "invalid for program constant segment size" in proc.stderr
    load_kernel_library(combined_build.kernel_lib)
    with pytest.raises(RuntimeError, match="Failed to load method forward"):
        load_method_checked(bad)
    assert load_method_checked(good).execute([torch.randn(1, 5, 512)])[0].shape == (1, 5, 40 * len(FORMATS))


def test_an_unknown_format_in_a_program_is_one_runner_error(declared, aot_ops, combined_build, tmp_path):
    # The format is a string in the program: a corrupt or hostile one is refused by name, not looked up blindly.
    from flow.export import export_example
    from pte_surgery import edit_plan

    def rename(plan):
        strings = [v.val for v in plan.values if hasattr(v.val, "string_val") and v.val.string_val == "Q4_K"]
        assert strings, "the example calls Q4_K"
        for s in strings:
            s.string_val = "Q9_K"

    good = export_example(declared["my_ops::linear_blocks"], str(tmp_path))
    bad = edit_plan(good, str(tmp_path / "renamed.pte"), rename)
    proc = run_runner(combined_build.runner, f"--model_path={bad}")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 1 and len(errors) == 1, proc.stderr[-2000:]
    assert "format 'Q9_K' is not one this op takes" in proc.stderr
