"""my_ops::sdpa_with_cache, registered from C++: its kernel against ATen's scaled_dot_product_attention on the filled,
causally masked positions (sdpa_with_cache_reference) in float32 and bfloat16, at decode and prefill shapes, with
grouped heads and head sizes off every vector width, with and without a sliding window; the cache past the filled
positions (and before the first query's window) holds NaN, so a kernel that reads one fails; logits near float's
maximum; every vector ISA the CPU has, each of whose task functions prefetches the cache rows; bad arguments refused
with one message in PyTorch (CPU, Meta under export) and in the runtime; and the runtime kernel in the runner and the
Python runtime."""

import collections
import platform
import re
import subprocess

import pytest
import torch

from flow.export import export_to_pte
from flow.runner import RunnerError, run_pte
from helpers import COUNT_PATHS, run_in_fresh_python
from ops.sdpa_with_cache.sdpa_with_cache import sdpa_with_cache_reference

pytestmark = pytest.mark.usefixtures("aot_ops")

DTYPES = [torch.float32, torch.bfloat16]
# bfloat16: both round the same float result once, so they may differ by one bfloat16 step.
TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=8e-3, atol=8e-3)}
# (batch, length, heads, kv_heads, head_dim, positions, start_pos)
SHAPES = {
    "decode at 0": (1, 1, 4, 4, 64, 128, 0),
    "decode at 77": (1, 1, 4, 4, 64, 128, 77),
    "decode, 201 positions (blocks and a tail), grouped 8 over 2, batch 2": (2, 1, 8, 2, 128, 300, 200),
    "decode at the last position, 32 heads over 8": (1, 1, 32, 8, 64, 160, 159),
    "prefill from 0": (1, 16, 4, 4, 64, 64, 0),
    "prefill after 30, one kv head, 70 queries (several query blocks), head_dim 24": (1, 70, 2, 1, 24, 200, 30),
    "prefill, head_dim 100, grouped 6 over 3, batch 2": (2, 5, 6, 3, 100, 40, 7),
    "one position, head_dim 1": (1, 1, 1, 1, 1, 1, 0),
    "decode, SmolLM2's 9 heads over 3, 200 filled": (1, 1, 9, 3, 64, 256, 199),
}

# (shape, window): a sliding window shorter than the filled positions, at decode and prefill, one position, one
# block boundary (64 positions) inside the window, a prefill longer than the window, a window longer than the cache.
WINDOWED = {
    "decode at 77, window 16": ((1, 1, 4, 4, 64, 128, 77), 16),
    "decode at 199, window 70 (two blocks), SmolLM2's heads": ((1, 1, 9, 3, 64, 256, 199), 70),
    "decode at 200, window 1": ((2, 1, 8, 2, 128, 300, 200), 1),
    "prefill of 70 from 30, window 24, several query blocks": ((1, 70, 2, 1, 24, 200, 30), 24),
    "prefill of 5 from 7, window 3, grouped 6 over 3": ((2, 5, 6, 3, 100, 40, 7), 3),
    "prefill of 16 from 0, window 100 (never slides)": ((1, 16, 4, 4, 64, 64, 0), 100),
    "Gemma 3's local layer: decode at 600, window 512, 4 heads over 1, head_dim 256": ((1, 1, 4, 1, 256, 640, 600),
                                                                                       512),
}


def make(shape, dtype, seed=0, scale_values=1.0, window=0):
    """query, key_cache, value_cache; every position past the filled ones (start_pos + length), and before the first
    query's window when there is one, is NaN."""
    batch, length, heads, kv_heads, head_dim, positions, start = shape
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, length, heads, head_dim, generator=generator) * scale_values
    k = torch.randn(batch, positions, kv_heads, head_dim, generator=generator) * scale_values
    v = torch.randn(batch, positions, kv_heads, head_dim, generator=generator)
    for cache in (k, v):
        cache[:, start + length:] = float("nan")
        if window:
            cache[:, :max(0, start - window + 1)] = float("nan")
    return q.to(dtype), k.to(dtype), v.to(dtype), start


def test_schema_is_as_documented():
    assert str(torch.ops.my_ops.sdpa_with_cache.default._schema) == (
        "my_ops::sdpa_with_cache(Tensor query, Tensor key_cache, Tensor value_cache, SymInt start_pos, "
        "float? scale=None, int window=0) -> Tensor")
    assert str(torch.ops.my_ops.sdpa_with_cache.out._schema) == (
        "my_ops::sdpa_with_cache.out(Tensor query, Tensor key_cache, Tensor value_cache, SymInt start_pos, "
        "float? scale=None, int window=0, *, Tensor(a!) out) -> Tensor(a!)")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_eager_equals_atens_sdpa_on_the_filled_positions(shape, dtype):
    q, k, v, start = make(shape, dtype)
    expected = sdpa_with_cache_reference(q, k, v, start)
    actual = torch.ops.my_ops.sdpa_with_cache(q, k, v, start)
    assert not actual.isnan().any()  # nothing past the filled positions was read
    torch.testing.assert_close(actual, expected, **TOLERANCE[dtype])
    out = torch.empty(0, dtype=dtype)
    assert torch.ops.my_ops.sdpa_with_cache.out(q, k, v, start, out=out).data_ptr() == out.data_ptr()
    torch.testing.assert_close(out, expected, **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", WINDOWED.values(), ids=WINDOWED.keys())
def test_a_sliding_window_equals_atens_sdpa_masked_to_it(case, dtype):
    shape, window = case
    q, k, v, start = make(shape, dtype, window=window)
    expected = sdpa_with_cache_reference(q, k, v, start, None, window)
    actual = torch.ops.my_ops.sdpa_with_cache(q, k, v, start, None, window)
    assert not actual.isnan().any()  # nothing before the first query's window was read
    torch.testing.assert_close(actual, expected, **TOLERANCE[dtype])
    out = torch.empty(0, dtype=dtype)
    torch.ops.my_ops.sdpa_with_cache.out(q, k, v, start, window=window, out=out)
    torch.testing.assert_close(out, expected, **TOLERANCE[dtype])


@pytest.mark.parametrize("threads", [1, 3])
def test_tasks_of_several_kv_heads_equal_the_reference_whatever_the_thread_count(threads):
    # Adjacent kv heads share a task while the tasks still cover the threads: one thread groups every head it may (up
    # to 32 rows a task), three group fewer and leave short last groups; both against the reference.
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for shape in SHAPES.values():
            for dtype in DTYPES:
                q, k, v, start = make(shape, dtype, seed=2)
                actual = torch.ops.my_ops.sdpa_with_cache(q, k, v, start)
                assert not actual.isnan().any()
                torch.testing.assert_close(actual, sdpa_with_cache_reference(q, k, v, start), **TOLERANCE[dtype])
    finally:
        torch.set_num_threads(before)


def test_the_scale_is_used_and_defaults_to_one_over_sqrt_head_dim():
    q, k, v, start = make((1, 3, 2, 2, 16, 8, 2), torch.float32)
    default = torch.ops.my_ops.sdpa_with_cache(q, k, v, start)
    torch.testing.assert_close(default, torch.ops.my_ops.sdpa_with_cache(q, k, v, start, 0.25), rtol=0, atol=0)
    halved = torch.ops.my_ops.sdpa_with_cache(q, k, v, start, 0.125)
    torch.testing.assert_close(halved, sdpa_with_cache_reference(q, k, v, start, 0.125), **TOLERANCE[torch.float32])
    assert not torch.allclose(halved, default)


def test_each_query_sees_exactly_the_positions_up_to_its_own():
    # Values that name their position: query t's output must be a mix of positions 0 .. start + t only, and with
    # equal keys an equal mix, so its mean position is (start + t) / 2.
    start, length, positions = 5, 4, 12
    q = torch.zeros(1, length, 1, 4)
    k = torch.zeros(1, positions, 1, 4)
    v = torch.arange(positions, dtype=torch.float32).view(1, positions, 1, 1).expand(1, positions, 1, 4).clone()
    out = torch.ops.my_ops.sdpa_with_cache(q, k, v, start)
    torch.testing.assert_close(out[0, :, 0, 0], torch.tensor([(start + t) / 2 for t in range(length)]))


@pytest.mark.parametrize("window", [1, 3, 7])
def test_each_query_sees_exactly_the_last_window_positions_up_to_its_own(window):
    # As above, within the window: query t mixes positions max(0, q - window + 1) .. q, q = start + t, equally.
    start, length, positions = 5, 4, 12
    q = torch.zeros(1, length, 1, 4)
    k = torch.zeros(1, positions, 1, 4)
    v = torch.arange(positions, dtype=torch.float32).view(1, positions, 1, 1).expand(1, positions, 1, 4).clone()
    out = torch.ops.my_ops.sdpa_with_cache(q, k, v, start, None, window)
    means = [(max(0, start + t - window + 1) + start + t) / 2 for t in range(length)]
    torch.testing.assert_close(out[0, :, 0, 0], torch.tensor(means))


def test_each_query_head_reads_its_own_kv_head():
    # kv head j holds the constant j: query head h must read kv head h // (heads / kv_heads).
    heads, kv_heads = 8, 2
    q = torch.randn(1, 1, heads, 8)
    k = torch.randn(1, 4, kv_heads, 8)
    v = torch.arange(kv_heads, dtype=torch.float32).view(1, 1, kv_heads, 1).expand(1, 4, kv_heads, 8).contiguous()
    out = torch.ops.my_ops.sdpa_with_cache(q, k, v, 3)
    torch.testing.assert_close(out[0, 0, :, 0], torch.tensor([h // (heads // kv_heads) for h in range(heads)],
                                                              dtype=torch.float32))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_logits_near_the_float_maximum_stay_finite(dtype):
    # Scores around +-3e38 (one position twice the others' logit would overflow a naive exp), and a single position.
    q, k, v, start = make((1, 2, 2, 2, 16, 40, 30), dtype)
    q = torch.full_like(q, 1.0)
    k = k.float()
    k[:, :32] = torch.sign(torch.randn(1, 32, 2, 16)) * 1.3e37  # q . k / 4 = +-(up to) 5e37 * 16 / 4
    k = k.to(dtype)
    actual = torch.ops.my_ops.sdpa_with_cache(q, k, v, start)
    assert torch.isfinite(actual).all()
    torch.testing.assert_close(actual, sdpa_with_cache_reference(q, k, v, start), **TOLERANCE[dtype])
    one = make((1, 1, 1, 1, 8, 1, 0), dtype)
    torch.testing.assert_close(torch.ops.my_ops.sdpa_with_cache(*one), one[2])  # softmax of one score is 1


def test_strided_inputs_and_output():
    q, k, v, start = make((1, 3, 4, 2, 16, 10, 1), torch.float32)
    q_strided = q.transpose(1, 2).contiguous().transpose(1, 2)
    out = torch.empty(1, 3, 4, 32)[..., ::2]
    torch.ops.my_ops.sdpa_with_cache.out(q_strided, k, v, start, out=out)
    torch.testing.assert_close(out, sdpa_with_cache_reference(q, k, v, start), **TOLERANCE[torch.float32])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_opcheck(dtype):
    q, k, v, start = make((1, 3, 4, 2, 16, 10, 1), dtype)
    k, v = k.nan_to_num(), v.nan_to_num()  # opcheck compares outputs with NaN-unequal semantics elsewhere
    torch.library.opcheck(torch.ops.my_ops.sdpa_with_cache.default, (q, k, v, start))
    torch.library.opcheck(torch.ops.my_ops.sdpa_with_cache.default, (q, k, v, 0, 0.3))
    torch.library.opcheck(torch.ops.my_ops.sdpa_with_cache.default, (q, k, v, start, None, 2))
    torch.library.opcheck(torch.ops.my_ops.sdpa_with_cache.out, (q, k, v, start), {"out": torch.empty(0, dtype=dtype)})


def test_requires_grad_is_refused_by_name():
    q, k, v, start = make((1, 1, 2, 2, 8, 4, 0), torch.float32)
    with pytest.raises(RuntimeError, match="query requires grad, but this op is for inference and has no gradient"):
        torch.ops.my_ops.sdpa_with_cache(q.requires_grad_(), k, v, start)
    with torch.no_grad():
        torch.ops.my_ops.sdpa_with_cache(q, k, v, start)


OP = "my_ops::sdpa_with_cache"
# (query, key_cache, value_cache shapes, start_pos, dtype of query, dtype of the caches, the message's core)
BAD_ARGUMENTS = {
    "3-d query": ([1, 2, 8], [1, 8, 2, 8], [1, 8, 2, 8], 0, torch.float32, torch.float32,
                  "must be [batch, length, heads, head_dim] and key_cache [1, 8, 2, 8]"),
    "value shape": ([1, 1, 2, 8], [1, 8, 2, 8], [1, 9, 2, 8], 0, torch.float32, torch.float32,
                    "value_cache [1, 9, 2, 8] must have key_cache's shape [1, 8, 2, 8]"),
    "batch": ([2, 1, 2, 8], [1, 8, 2, 8], [1, 8, 2, 8], 0, torch.float32, torch.float32,
              "key_cache [1, 8, 2, 8] holds batch 1 but query [2, 1, 2, 8] has batch 2"),
    "head_dim": ([1, 1, 2, 16], [1, 8, 2, 8], [1, 8, 2, 8], 0, torch.float32, torch.float32,
                 "query [1, 1, 2, 16] has head_dim 16 but key_cache [1, 8, 2, 8] has 8"),
    "kv heads": ([1, 1, 3, 8], [1, 8, 2, 8], [1, 8, 2, 8], 0, torch.float32, torch.float32,
                 "query's 3 heads are not a multiple of the cache's 2 kv heads"),
    "start_pos past the cache": ([1, 1, 2, 8], [1, 8, 2, 8], [1, 8, 2, 8], 8, torch.float32, torch.float32,
                                 "1 queries at start_pos 8 need cache positions up to 9 but the cache holds 8"),
    "length past the cache": ([1, 9, 2, 8], [1, 8, 2, 8], [1, 8, 2, 8], 0, torch.float32, torch.float32,
                              "9 queries at start_pos 0 need cache positions up to 9 but the cache holds 8"),
    "negative start_pos": ([1, 1, 2, 8], [1, 8, 2, 8], [1, 8, 2, 8], -1, torch.float32, torch.float32,
                           "start_pos -1"),
    "dtype": ([1, 1, 2, 8], [1, 8, 2, 8], [1, 8, 2, 8], 0, torch.float16, torch.float16,
              "query has unsupported dtype float16; supported: float32, bfloat16"),
    "mixed dtypes": ([1, 1, 2, 8], [1, 8, 2, 8], [1, 8, 2, 8], 0, torch.float32, torch.bfloat16,
                     "key_cache has dtype bfloat16 but query has float32; they must match"),
}


@pytest.mark.parametrize("case", BAD_ARGUMENTS)
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_bad_arguments_are_one_message_naming_the_problem(case, device):
    q_shape, k_shape, v_shape, start, q_dtype, cache_dtype, message = BAD_ARGUMENTS[case]
    q = torch.zeros(q_shape, dtype=q_dtype, device=device)
    k = torch.zeros(k_shape, dtype=cache_dtype, device=device)
    v = torch.zeros(v_shape, dtype=cache_dtype, device=device)
    with pytest.raises(RuntimeError, match=OP) as info:
        torch.ops.my_ops.sdpa_with_cache(q, k, v, start)
    assert message in str(info.value)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_a_negative_window_is_refused(device):
    q, k, v, start = (t.to(device) if isinstance(t, torch.Tensor) else t for t in make((1, 1, 2, 2, 8, 4, 0),
                                                                                         torch.float32))
    with pytest.raises(RuntimeError, match=f"{OP}: window -1 is negative; pass the sliding window's length"):
        torch.ops.my_ops.sdpa_with_cache(q, k, v, start, None, -1)


def test_a_non_finite_scale_is_refused():
    q, k, v, start = make((1, 1, 2, 2, 8, 4, 0), torch.float32)
    with pytest.raises(RuntimeError, match="scale inf is not finite"):
        torch.ops.my_ops.sdpa_with_cache(q, k, v, start, float("inf"))


# Each vector ISA's code (AVX-512, AVX2, the baseline) in a fresh process with CUSTOM_OPS_ISA capping it, counted where
# it wrote its output (custom_ops_elementwise_stats of the AOT library): every case, both dtypes, against the reference.
ISA_PROBE = """
import torch
from helpers import path_counts
from flow import registration
registration.load_aot_library({aot!r})
from test_sdpa_with_cache import SHAPES, TOLERANCE, WINDOWED, make
from ops.sdpa_with_cache.sdpa_with_cache import sdpa_with_cache_reference
elements = 0
for shape in SHAPES.values():
    for dtype in TOLERANCE:
        q, k, v, start = make(shape, dtype, seed=1)
        actual = torch.ops.my_ops.sdpa_with_cache(q, k, v, start)
        torch.testing.assert_close(actual, sdpa_with_cache_reference(q, k, v, start), **TOLERANCE[dtype])
        elements += actual.numel()
for shape, window in WINDOWED.values():
    for dtype in TOLERANCE:
        q, k, v, start = make(shape, dtype, seed=1, window=window)
        actual = torch.ops.my_ops.sdpa_with_cache(q, k, v, start, None, window)
        torch.testing.assert_close(actual, sdpa_with_cache_reference(q, k, v, start, None, window), **TOLERANCE[dtype])
        elements += actual.numel()
counts = path_counts({aot!r})
result = {{"elements": elements, **counts}}
"""


@pytest.mark.parametrize("isa", ["baseline", "avx2", "avx512"])
def test_every_vector_isa_equals_the_reference(isa, combined_build):
    from test_kernel_paths import expected_isa

    if expected_isa(isa) != isa:
        pytest.skip(f"this CPU has no {isa}")
    counts = run_in_fresh_python(ISA_PROBE.format(aot=combined_build.aot_lib),
                                 env=dict(COUNT_PATHS, CUSTOM_OPS_ISA=isa))
    assert counts[isa] == counts["elements"] > 0, counts


def prefetches_by_function(library: str) -> collections.Counter:
    listing = subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", library], capture_output=True, text=True,
                             check=True).stdout
    counts, function = collections.Counter(), None
    for line in listing.splitlines():
        if (start := re.match(r"[0-9a-f]+ <(.*)>:$", line)) is not None:
            function = start.group(1)
        elif function is not None and "prefetch" in line:
            counts[function] += 1
    return counts


@pytest.mark.skipif(platform.machine() != "x86_64", reason="reads x86-64 machine code")
def test_every_isas_tasks_ask_for_the_cache_rows_ahead(combined_build):
    # attend() prefetches the K and V rows ahead of its scores (its comment says why). The results do not show it:
    # GCC once dropped every prefetch of the kernel, with no other change, when the helper that issues them was no
    # longer inlined (a function whose only effects are prefetches counts as pure to it).
    counts = prefetches_by_function(combined_build.kernel_lib)
    tasks = {task.group(0) for f, n in counts.items() if n >= 2
             and (task := re.search(r"attend_(baseline|avx2|avx512)<(float|c10::BFloat16)>", f)) is not None}
    expected = {f"attend_{isa}<{dtype}>" for isa in ("baseline", "avx2", "avx512")
                for dtype in ("float", "c10::BFloat16")}
    assert expected <= tasks, sorted(tasks)


# ---- The runtime kernel ------------------------------------------------------------------------------------------
POSITIONS = 96


class AttendOverCaches(torch.nn.Module):
    """The op alone, the caches and the position given each call: any length up to the cache, any start."""

    def __init__(self, window: int = 0):
        super().__init__()
        self.window = window

    def forward(self, q, k_cache, v_cache, position):
        start = position.item()
        torch._check(start >= 0)
        torch._check(start + q.shape[1] <= k_cache.shape[1])
        return torch.ops.my_ops.sdpa_with_cache(q, k_cache, v_cache, start, None, self.window)


RUNTIME_WINDOW = 24  # slides in every runtime case but the first


@pytest.fixture(scope="module", params=[(dtype, window) for dtype in DTYPES for window in (0, RUNTIME_WINDOW)],
                ids=lambda p: f"{str(p[0])[6:]}{f'-window {p[1]}' if p[1] else ''}")
def runtime_program(request, tmp_path_factory):
    dtype, window = request.param
    q, k, v, _ = make((1, 4, 8, 2, 64, POSITIONS, 0), dtype)
    length = torch.export.Dim("length", min=1, max=POSITIONS)
    pte = export_to_pte(AttendOverCaches(window), (q, k.nan_to_num(), v.nan_to_num(), torch.tensor([0])),
                        tmp_path_factory.mktemp("sdpa") / f"sdpa_{str(dtype)[6:]}_{window}.pte",
                        dynamic_shapes=({1: length}, None, None, None))
    return pte, dtype, window


# (length, start_pos): decode early and at the last position, prefill from 0 and after a prompt
RUNTIME_CASES = [(1, 0), (1, 63), (1, POSITIONS - 1), (40, 0), (17, 50)]


def runtime_inputs(dtype, length, start, window=0):
    q, k, v, _ = make((1, length, 8, 2, 64, POSITIONS, start), dtype, seed=length + start, window=window)
    return [q, k, v, torch.tensor([start])], sdpa_with_cache_reference(q, k, v, start, None, window)


@pytest.mark.parametrize("length, start", RUNTIME_CASES)
def test_the_runtime_kernel_equals_the_reference_in_the_runner(runtime_program, combined_build, length, start):
    pte, dtype, window = runtime_program
    inputs, expected = runtime_inputs(dtype, length, start, window)
    (actual,) = run_pte(combined_build.runner, pte, inputs, [expected], num_executions=2, pass_shapes=True)
    torch.testing.assert_close(actual, expected, **TOLERANCE[dtype])


def test_the_runtime_kernel_equals_the_reference_in_the_python_runtime(runtime_program, load_method):
    pte, dtype, window = runtime_program
    method = load_method(pte)
    for length, start in RUNTIME_CASES * 2:  # each shape twice: an execution must not spoil the next
        inputs, expected = runtime_inputs(dtype, length, start, window)
        (actual,) = method.execute(inputs)
        assert not actual.isnan().any()
        torch.testing.assert_close(actual, expected, **TOLERANCE[dtype])


def test_a_start_past_the_cache_is_one_error_line_in_the_runner_and_an_error_in_python(runtime_program,
                                                                                      combined_build, load_method):
    pte, dtype, _ = runtime_program
    inputs, expected = runtime_inputs(dtype, 1, 0)
    inputs[3] = torch.tensor([POSITIONS])
    with pytest.raises(RunnerError) as info:
        run_pte(combined_build.runner, pte, inputs, [expected], pass_shapes=True)
    assert (f"my_ops::sdpa_with_cache.out: 1 queries at start_pos {POSITIONS} need cache positions up to "
            f"{POSITIONS + 1} but the cache holds {POSITIONS}") in str(info.value)
    assert "Signal" not in str(info.value)
    with pytest.raises(RuntimeError):
        load_method(pte).execute(inputs)
