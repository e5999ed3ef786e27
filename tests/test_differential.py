"""Differential tests: random dtype x shape (0-size, 1-D to 4-D) x op, the ExecuTorch runtime (Python runtime with
libcustom_ops_lib.so) against PyTorch eager. The kernel promises eager's exact bits for every dtype (integer
wrap-around, one rounding for half types), so the comparison is exact. A fixed example budget keeps CI fast."""

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import custom_ops_1  # noqa: F401

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16,
          torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
MAX_DIM = 16


def random_tensor(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        # Wide magnitudes, including ones that overflow to inf in half types when scaled.
        return (torch.randn(shape, generator=g, dtype=torch.float64) * 10.0 ** torch.randint(-3, 6, shape, generator=g)
                ).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, shape, generator=g, dtype=torch.int64).to(dtype)


@settings(max_examples=120, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    op=st.sampled_from(["mul3", "mul4"]),
    dtype=st.sampled_from(DTYPES),
    shape=st.lists(st.integers(0, MAX_DIM), min_size=1, max_size=4),
    seed=st.integers(0, 2**31 - 1),
)
def test_runtime_equals_eager(op, dtype, shape, seed, dynamic_programs, et_runtime):
    x = random_tensor(shape, dtype, seed)
    expected = getattr(torch.ops.my_ops, op)(x)
    method = et_runtime.load_program(dynamic_programs.get(op, dtype, len(shape))).load_method("forward")
    (actual,) = method.execute([x])
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


def test_integer_overflow_wraps_like_eager(dynamic_programs, et_runtime):
    for dtype in (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64):
        info = torch.iinfo(dtype)
        x = torch.tensor([info.max, info.min, info.max // 2 + 1, -1 if info.min < 0 else 1], dtype=dtype)
        method = et_runtime.load_program(dynamic_programs.get("mul3", dtype, 1)).load_method("forward")
        (actual,) = method.execute([x])
        assert torch.equal(actual, torch.ops.my_ops.mul3(x)), dtype


def test_large_input_takes_the_parallel_streaming_path(tmp_path, et_runtime):
    # Big enough for several threadpool tasks and for streaming stores (larger than any last-level cache here).
    from pte_export import CallOp, export_to_pte

    x = torch.randn(12 * 1024 * 1024 + 37)  # 48 MiB and an odd tail
    pte = export_to_pte(CallOp(torch.ops.my_ops.mul3.default), (x,), tmp_path / "big.pte", plan_graph_inputs=False)
    (actual,) = et_runtime.load_program(pte).load_method("forward").execute([x])
    assert torch.equal(actual, x * 3)
