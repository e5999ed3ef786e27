"""Differential tests: random dtype x shape (0-size, 1-D to 4-D) x op, the ExecuTorch runtime (Python runtime with
libcustom_ops_lib.so) against ATen's `x * K`. The kernel promises ATen's exact bits for every dtype (integer
wrap-around, one rounding for half types), so the comparison is exact. A fixed example budget keeps CI fast."""

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import custom_ops_1  # noqa: F401
from helpers import ALL_DTYPES, full_range

DTYPES = [getattr(torch, name) for name in ALL_DTYPES]
MAX_DIM = 16
FACTORS = {"mul3": 3, "mul4": 4}


@settings(max_examples=120, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    op=st.sampled_from(["mul3", "mul4"]),
    dtype=st.sampled_from(DTYPES),
    shape=st.lists(st.integers(0, MAX_DIM), min_size=1, max_size=4),
    seed=st.integers(0, 2**31 - 1),
)
def test_runtime_equals_eager(op, dtype, shape, seed, dynamic_programs, load_method):
    x = full_range(shape, dtype, seed)
    expected = x * FACTORS[op]
    method = load_method.load_program(dynamic_programs.get(op, dtype, len(shape))).load_method("forward")
    (actual,) = method.execute([x])
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


def test_integer_overflow_wraps_like_eager(dynamic_programs, load_method):
    for dtype in (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64):
        info = torch.iinfo(dtype)
        x = torch.tensor([info.max, info.min, info.max // 2 + 1, -1 if info.min < 0 else 1], dtype=dtype)
        method = load_method(dynamic_programs.get("mul3", dtype, 1))
        (actual,) = method.execute([x])
        assert torch.equal(actual, x * 3), dtype
