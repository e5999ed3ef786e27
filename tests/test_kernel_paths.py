"""Every path of the kernel loop (kernel_helpers/elementwise_loop.h) runs and gives ATen's exact results, in both
modes: ExecuTorch mode (libcustom_ops_lib.so through the Python runtime) and ATen mode (libcustom_ops_aot_lib.so).

Which path an input takes depends on its size against two thresholds (the last-level cache for streaming stores,
256 KiB grains for threads), so each check runs in a fresh process with the thresholds lowered through the kernels'
test hooks (CUSTOM_OPS_STREAMING_MIN_BYTES, CUSTOM_OPS_PARALLEL_GRAIN_BYTES) and reads the kernels' own path counters
(custom_ops_elementwise_stats) afterwards."""

import threading

import pytest
import torch

from helpers import ALL_DTYPES, full_range, run_in_fresh_python
from pte_surgery import rewrite_output_tensor

SMALL_THRESHOLDS = {"CUSTOM_OPS_STREAMING_MIN_BYTES": "0", "CUSTOM_OPS_PARALLEL_GRAIN_BYTES": "64"}

# Runs in the fresh process: reads a library's path counters.
READ_STATS = """
import ctypes
import torch

def equal_bits(actual, expected):
    try:
        torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)
        return True
    except AssertionError:
        return False

def path_stats(library):
    counts = (ctypes.c_uint64 * 4)()
    ctypes.CDLL(library).custom_ops_elementwise_stats(counts, 4)
    return dict(zip(["serial", "parallel", "streamed", "streamed_with_head"], counts))
"""

RUNTIME_PROBE = READ_STATS + """
import torch
from executorch.runtime import Runtime
from helpers import full_range
from flow.runtime import load_kernel_library
load_kernel_library({kernel_lib!r})
runtime = Runtime.get()
mismatches = []
for factor, dtype_name, pte in {programs!r}:
    x = full_range((16, 16), getattr(torch, dtype_name), seed=factor)
    (y,) = runtime.load_program(pte).load_method("forward").execute([x])
    if not equal_bits(y, x * factor):
        mismatches.append(dtype_name)
x = torch.randn(2, 3)
(y,) = runtime.load_program({shifted_pte!r}).load_method("forward").execute([x])
result = {{"mismatches": mismatches, "shifted_output_ok": torch.equal(y, x * 3), "stats": path_stats({kernel_lib!r})}}
"""


@pytest.fixture(scope="module")
def runtime_programs(dynamic_programs):
    return [(factor, dtype, dynamic_programs.get(op, getattr(torch, dtype), 2))
            for op, factor in (("mul3", 3), ("mul4", 4)) for dtype in ALL_DTYPES]


@pytest.fixture(scope="module")
def shifted_output_pte(mul3_pte, tmp_path_factory):
    # The output 4 bytes past its buffer's start: aligned to float, not to a cache line, so streaming begins with a
    # head of plain stores.
    return rewrite_output_tensor(mul3_pte, str(tmp_path_factory.mktemp("shifted") / "shifted.pte"), memory_offset=4)


def run_runtime_probe(combined_build, programs, shifted_pte, env):
    code = RUNTIME_PROBE.format(kernel_lib=combined_build.kernel_lib, programs=programs, shifted_pte=shifted_pte)
    return run_in_fresh_python(code, env=env)


def test_runtime_kernels_take_the_parallel_and_streaming_paths(combined_build, runtime_programs, shifted_output_pte):
    result = run_runtime_probe(combined_build, runtime_programs, shifted_output_pte, SMALL_THRESHOLDS)
    assert result["mismatches"] == [] and result["shifted_output_ok"]
    stats = result["stats"]
    assert stats["parallel"] == len(runtime_programs), stats  # 256 elements, 64-byte grains: every call splits
    assert stats["serial"] == 1, stats  # the 6-element program
    assert stats["streamed"] >= len(runtime_programs) + 1, stats
    assert stats["streamed_with_head"] >= 1, stats  # the shifted output


def test_runtime_kernels_stay_serial_and_cached_by_default(combined_build, runtime_programs, shifted_output_pte):
    result = run_runtime_probe(combined_build, runtime_programs, shifted_output_pte, {})
    assert result["mismatches"] == [] and result["shifted_output_ok"]
    assert result["stats"] == {"serial": len(runtime_programs) + 1, "parallel": 0, "streamed": 0,
                               "streamed_with_head": 0}


ATEN_PROBE = READ_STATS + """
import torch
from helpers import full_range
torch.ops.load_library({aot_lib!r})
mismatches = []
for dtype_name in {dtypes!r}:
    dtype = getattr(torch, dtype_name)
    x = full_range((16, 16), dtype)
    expected = x * 4
    head_out = torch.empty(257, dtype=dtype)[1:].view(16, 16)  # one element past an aligned start
    in_place = x.clone()
    results = [torch.ops.my_ops.mul4(x), torch.ops.my_ops.mul4.out(x, output=torch.empty(0, dtype=dtype)),
               torch.ops.my_ops.mul4.out(x, output=head_out), torch.ops.my_ops.mul4.out(in_place, output=in_place)]
    mismatches += [dtype_name for y in results if not equal_bits(y, expected)]
result = {{"mismatches": mismatches, "stats": path_stats({aot_lib!r})}}
"""


def test_aten_kernel_takes_every_path(mul4_build):
    result = run_in_fresh_python(ATEN_PROBE.format(aot_lib=mul4_build.aot_lib, dtypes=ALL_DTYPES),
                                 env=SMALL_THRESHOLDS)
    assert result["mismatches"] == []
    stats = result["stats"]
    calls = 4 * len(ALL_DTYPES)
    assert stats["parallel"] == calls and stats["serial"] == 0, stats
    assert stats["streamed"] >= calls, stats
    assert stats["streamed_with_head"] >= len(ALL_DTYPES), stats  # every head_out call


def test_aten_kernel_stays_serial_and_cached_by_default(mul4_build):
    result = run_in_fresh_python(ATEN_PROBE.format(aot_lib=mul4_build.aot_lib, dtypes=ALL_DTYPES))
    assert result["mismatches"] == []
    assert result["stats"] == {"serial": 4 * len(ALL_DTYPES), "parallel": 0, "streamed": 0, "streamed_with_head": 0}


def run_concurrently(work, threads=4):
    errors = []

    def guarded():
        try:
            work()
        except Exception as err:  # noqa: BLE001  (reported below)
            errors.append(err)

    pool = [threading.Thread(target=guarded) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in pool), "a thread hung"
    assert errors == []


def test_concurrent_executions_from_several_threads(load_method, tmp_path):
    # Large enough for the threadpool, so several callers share it at once; each thread owns its Method.
    import custom_ops_1  # noqa: F401  (registers mul3 for the export)
    from flow.export import CallOp, export_to_pte

    pte = export_to_pte(CallOp(torch.ops.my_ops.mul3.default), (torch.randn(1 << 20),), tmp_path / "big.pte")

    def work():
        method = load_method(pte)
        for seed in range(8):
            x = full_range((1 << 20,), torch.float32, seed)
            (y,) = method.execute([x])
            torch.testing.assert_close(y, x * 3, rtol=0, atol=0, equal_nan=True)

    run_concurrently(work)


def test_concurrent_aten_calls_from_several_threads(mul4_aot):
    def work():
        for seed in range(8):
            x = full_range((1 << 20,), torch.float32, seed)
            torch.testing.assert_close(torch.ops.my_ops.mul4(x), x * 4, rtol=0, atol=0, equal_nan=True)

    run_concurrently(work)


def same_numbers(actual, expected) -> bool:
    """Bit for bit, except that a NaN only has to be a NaN (its payload is c10's canonical one, which ATen's vectorized
    BFloat16 path does not use)."""
    numbers = ~expected.isnan()
    return torch.equal(actual.isnan(), expected.isnan()) and torch.equal(
        actual[numbers].view(torch.int16), expected[numbers].view(torch.int16))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_types_convert_whole_blocks_and_tails_exactly(mul4_aot, dynamic_programs, load_method, dtype):
    # Half and BFloat16 convert 256-element blocks with vector instructions and the rest with portable code: every
    # size around a block boundary, with specials in a whole block and in the tail, matches eager bit for bit. mul3
    # rounds (x * 3 needs more bits than the type has); mul4 only overflows and keeps subnormals.
    methods = {factor: load_method(dynamic_programs.get(op, dtype, 4))
               for op, factor in (("mul3", 3), ("mul4", 4))}
    for shape in ((1, 1, 1, 3), (1, 3, 5, 16), (1, 1, 16, 16), (1, 2, 11, 12), (1, 4, 16, 16), (3, 7, 13, 15)):
        x = full_range(shape, dtype, seed=sum(shape))
        x.view(-1)[-3:] = torch.tensor([float("nan"), -0.0, torch.finfo(dtype).max], dtype=dtype)
        for factor, method in methods.items():
            (actual,) = method.execute([x])
            assert same_numbers(actual, x * factor), (shape, factor)
        assert same_numbers(torch.ops.my_ops.mul4(x), x * 4), shape
