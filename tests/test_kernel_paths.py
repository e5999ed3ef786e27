"""Every path of the kernel loop (kernel_helpers/elementwise_loop.h) runs on real data and gives the reference's exact
bits (flow.compare), in both modes: ExecuTorch mode (libcustom_ops_lib.so through the Python runtime) and ATen mode
(libcustom_ops_aot_lib.so, mul4's PyTorch kernel).

Which path an input takes depends on its size against two thresholds (the last-level cache for streaming stores,
256 KiB grains for threads) and on the CPU, so each check runs in a fresh process with the thresholds lowered and the
vector ISA capped through the kernels' test hooks (CUSTOM_OPS_STREAMING_MIN_BYTES, CUSTOM_OPS_PARALLEL_GRAIN_BYTES,
CUSTOM_OPS_ISA), then reads the kernels' own counters (custom_ops_elementwise_stats), which count where the work is
done: streamed blocks after their non-temporal stores, elements by the ISA loop that computed them. Each call moves
192 KiB, so with 16 KiB grains every threadpool task holds about 23 streamed 4 KiB blocks, of random data with NaN
payloads, infinities, -0 and subnormals in a vector block and in a tail."""

import threading

import pytest
import torch

from flow.compare import assert_bit_exact, bit_difference
from flow.cpu import ISA_ORDER, hardware_isa, kernel_isa
from helpers import ALL_DTYPES, COUNT_PATHS, PATH_COUNTERS, full_range, run_in_fresh_python
from pte_surgery import rewrite_output_tensor

GRAIN = 16 << 10
SMALL_THRESHOLDS = {"CUSTOM_OPS_STREAMING_MIN_BYTES": "0", "CUSTOM_OPS_PARALLEL_GRAIN_BYTES": str(GRAIN)}
CALL_BYTES = 192 << 10
MAX_ELEMENTS = 1 << 18
ISA_COUNTERS = PATH_COUNTERS[4:8]  # baseline, AVX2, AVX-512, half arithmetic


def numel(dtype_name: str) -> int:
    return CALL_BYTES // getattr(torch, dtype_name).itemsize + 37  # 37: a tail after the last whole block


def expected_isa(cap: str | None) -> str:
    """The loop the kernels run in a process started with CUSTOM_OPS_ISA=cap, or (None) with this process's own
    environment, as a run of the whole suite capped at AVX2 passes it on: never above what the CPU has."""
    return kernel_isa(cap)


def cpu_isa() -> str:
    """The best loop the kernels run here (this process's cap included)."""
    return expected_isa(None)


def isas_here() -> list[str]:
    """Every loop this CPU runs, capped with CUSTOM_OPS_ISA: the ones a test runs each of."""
    return ISA_ORDER[:ISA_ORDER.index(hardware_isa()) + 1]


# Runs in the fresh process: reads a library's counters, compares with the op's declared reference.
PROBE_PRELUDE = """
import torch
from flow import declarations
from flow.compare import bit_difference
from helpers import full_range, path_counts

def path_stats(library):
    return path_counts(library)

reference = {{op.short_name: op.reference_function() for op in declarations.load().values()}}
mismatches, elements = [], 0
"""

RUNTIME_PROBE = PROBE_PRELUDE + """
from flow.runtime import load_kernel_library, load_method_checked
load_kernel_library({kernel_lib!r})
for op, dtype_name, numel, pte, shifted in {programs!r}:
    x = full_range((numel,), getattr(torch, dtype_name), seed=numel)
    (y,) = load_method_checked(pte).execute([x])
    problem = bit_difference(y, reference[op](x))
    mismatches += [f"{{op}} {{dtype_name}}: {{problem}}"] if problem else []
    elements += numel
result = {{"mismatches": mismatches, "elements": elements, "stats": path_stats({kernel_lib!r})}}
"""

ATEN_PROBE = PROBE_PRELUDE + """
torch.ops.load_library({aot_lib!r})
for dtype_name, numel in {sizes!r}:
    dtype = getattr(torch, dtype_name)
    x = full_range((numel,), dtype, seed=numel)
    expected = reference["mul4"](x)
    head_out = torch.empty(numel + 1, dtype=dtype)[1:]  # one element past an aligned start
    in_place = x.clone()
    results = [torch.ops.my_ops.mul4(x), torch.ops.my_ops.mul4.out(x, output=torch.empty(0, dtype=dtype)),
               torch.ops.my_ops.mul4.out(x, output=head_out), torch.ops.my_ops.mul4.out(in_place, output=in_place)]
    mismatches += [f"{{dtype_name}} call {{i}}: {{bit_difference(y, expected)}}" for i, y in enumerate(results)
                   if bit_difference(y, expected)]
    elements += 4 * numel
result = {{"mismatches": mismatches, "elements": elements, "stats": path_stats({aot_lib!r})}}
"""


@pytest.fixture(scope="module")
def large_programs(mul4_aot, declared, tmp_path_factory):
    """(op, dtype, numel, program, output shifted?) for both ops and every dtype: one dynamic dimension up to
    MAX_ELEMENTS; and mul3's float32 program with its output moved 4 bytes into its buffer (aligned to floats, not
    to a cache line), so streaming starts with a head of plain stores."""
    from flow import registration
    from flow.export import CallOp, export_to_pte

    registration.register_with_pytorch(list(declared.values()))
    out = tmp_path_factory.mktemp("large")
    dim = ({0: torch.export.Dim("n", min=1, max=MAX_ELEMENTS)},)
    programs = []
    for op in ("mul3", "mul4"):
        for dtype_name in ALL_DTYPES:
            example = torch.ones(1024, dtype=getattr(torch, dtype_name))
            pte = export_to_pte(CallOp(getattr(torch.ops.my_ops, op).default), (example,),
                                out / f"{op}_{dtype_name}.pte", dynamic_shapes=dim)
            programs.append((op, dtype_name, numel(dtype_name), str(pte), False))
    shifted = rewrite_output_tensor(programs[0][3], str(out / "mul3_float32_shifted.pte"), memory_offset=4)
    programs.append(("mul3", "float32", numel("float32"), shifted, True))
    return programs


def assert_every_path_ran(result, isa: str, calls: int, total_bytes: int, shifted_calls: int):
    assert result["mismatches"] == []
    stats = result["stats"]
    assert stats["serial"] == 0 and stats["parallel_tasks"] >= calls, stats  # every call split across the pool
    assert stats["streamed_blocks"] * 4096 >= 0.9 * total_bytes, stats  # nearly every byte left by streaming stores
    assert stats["unaligned_heads"] >= shifted_calls, stats
    assert stats[isa] == result["elements"], stats  # every element computed by the expected ISA's loop
    assert sum(stats[c] for c in ISA_COUNTERS) == result["elements"], stats


@pytest.mark.parametrize("cap", ["baseline", "avx2", None], ids=["baseline", "avx2", "best"])
def test_runtime_kernels_stream_in_parallel_on_every_isa(cap, combined_build, large_programs):
    env = dict(SMALL_THRESHOLDS, **COUNT_PATHS, **({"CUSTOM_OPS_ISA": cap} if cap else {}))
    result = run_in_fresh_python(RUNTIME_PROBE.format(kernel_lib=combined_build.kernel_lib,
                                                      programs=large_programs), env=env)
    total_bytes = sum(n * getattr(torch, d).itemsize for _, d, n, _, _ in large_programs)
    assert_every_path_ran(result, expected_isa(cap), len(large_programs), total_bytes, shifted_calls=1)


@pytest.mark.parametrize("cap", ["baseline", "avx2", None], ids=["baseline", "avx2", "best"])
def test_aten_kernel_streams_in_parallel_on_every_isa(cap, mul4_build):
    env = dict(SMALL_THRESHOLDS, **COUNT_PATHS, **({"CUSTOM_OPS_ISA": cap} if cap else {}))
    sizes = [(d, numel(d)) for d in ALL_DTYPES]
    result = run_in_fresh_python(ATEN_PROBE.format(aot_lib=mul4_build.aot_lib, sizes=sizes),
                                 env=env)
    total_bytes = 4 * sum(n * getattr(torch, d).itemsize for d, n in sizes)
    assert_every_path_ran(result, expected_isa(cap), 4 * len(sizes), total_bytes, shifted_calls=len(sizes))


def test_small_inputs_stay_serial_and_cached_by_default(combined_build, dynamic_programs, mul4_build):
    programs = [(op, d, 16, dynamic_programs.get(op, getattr(torch, d), 1), False)
                for op in ("mul3", "mul4") for d in ALL_DTYPES]
    runtime = run_in_fresh_python(RUNTIME_PROBE.format(kernel_lib=combined_build.kernel_lib,
                                                       programs=programs), env=COUNT_PATHS)
    aten = run_in_fresh_python(ATEN_PROBE.format(aot_lib=mul4_build.aot_lib,
                                                 sizes=[(d, 16 * 16) for d in ALL_DTYPES]), env=COUNT_PATHS)
    for result, calls in ((runtime, len(programs)), (aten, 4 * len(ALL_DTYPES))):
        assert result["mismatches"] == []
        stats = result["stats"]
        assert (stats["serial"], stats["parallel_tasks"], stats["streamed_blocks"], stats["unaligned_heads"]) == \
            (calls, 0, 0, 0), stats
        assert stats[cpu_isa()] == result["elements"], stats


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


def test_concurrent_executions_from_several_threads(load_method, declared, tmp_path):
    # Large enough for the threadpool, so several callers share it at once; each thread owns its Method.
    from flow import registration
    from flow.export import CallOp, export_to_pte

    registration.register_with_pytorch([declared["my_ops::mul3"]])
    reference = declared["my_ops::mul3"].reference_function()
    pte = export_to_pte(CallOp(torch.ops.my_ops.mul3.default), (torch.randn(1 << 20),), tmp_path / "big.pte")

    def work():
        method = load_method(pte)
        for seed in range(8):
            x = full_range((1 << 20,), torch.float32, seed)
            (y,) = method.execute([x])
            assert_bit_exact(y, reference(x), seed)

    run_concurrently(work)


def test_concurrent_aten_calls_from_several_threads(mul4_aot, declared):
    reference = declared["my_ops::mul4"].reference_function()

    def work():
        for seed in range(8):
            x = full_range((1 << 20,), torch.float32, seed)
            assert_bit_exact(torch.ops.my_ops.mul4(x), reference(x), seed)

    run_concurrently(work)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_types_convert_whole_blocks_and_tails_exactly(mul4_aot, dynamic_programs, load_method, declared, dtype):
    # Half and BFloat16 convert 256-element blocks with vector instructions and the rest with portable code: every
    # size around a block boundary, with NaN payloads, -0, the largest finite value and subnormals in a whole block
    # and in the tail, has the reference's bits (Half NaNs keep their quieted payload wherever they sit). mul3 rounds
    # (x * 3 needs more bits than the type has); mul4 only overflows and keeps subnormals.
    references = {op: declared[f"my_ops::{op}"].reference_function() for op in ("mul3", "mul4")}
    methods = {op: load_method(dynamic_programs.get(op, dtype, 4)) for op in references}
    for shape in ((1, 1, 1, 3), (1, 3, 5, 16), (1, 1, 16, 16), (1, 2, 11, 12), (1, 4, 16, 16), (3, 7, 13, 15)):
        x = full_range(shape, dtype, seed=sum(shape))
        x.view(-1)[-2:] = torch.tensor([-0.0, torch.finfo(dtype).max], dtype=dtype)
        for op, method in methods.items():
            (actual,) = method.execute([x])
            assert_bit_exact(actual, references[op](x), (shape, op))
            if dtype == torch.bfloat16:  # the one NaN flow.compare leaves free: ours is always c10's 0x7FC0
                assert actual.view(torch.int16)[actual.isnan()].eq(0x7FC0).all(), (shape, op)
        assert bit_difference(torch.ops.my_ops.mul4(x), references["mul4"](x)) is None, shape
