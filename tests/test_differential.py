"""Differential tests: random dtype x shape (0-size, 1-D to 4-D) x op, the ExecuTorch runtime (Python runtime with
libcustom_ops_lib.so) against each op's declared ATen reference. The kernels promise the reference's exact bits for
every dtype (integer wrap-around, one rounding for half types, -0 and NaN payloads kept), so the comparison is
flow.compare's bit for bit. A fixed example budget keeps CI fast."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flow.compare import assert_bit_exact
from helpers import ALL_DTYPES, full_range

DTYPES = [getattr(torch, name) for name in ALL_DTYPES]
MAX_DIM = 16


@pytest.fixture(scope="module")
def references(declared):
    return {op.short_name: op.reference_function() for op in declared.values()}


@settings(max_examples=120, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    op=st.sampled_from(["mul3", "mul4"]),
    dtype=st.sampled_from(DTYPES),
    shape=st.lists(st.integers(0, MAX_DIM), min_size=1, max_size=4),
    seed=st.integers(0, 2**31 - 1),
)
def test_runtime_equals_the_reference_bit_for_bit(op, dtype, shape, seed, dynamic_programs, load_method, references):
    x = full_range(shape, dtype, seed)
    (actual,) = load_method(dynamic_programs.get(op, dtype, len(shape))).execute([x])
    assert_bit_exact(actual, references[op](x), (op, dtype, shape))


def test_integer_overflow_wraps_like_the_reference(dynamic_programs, load_method, references):
    for dtype in (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64):
        info = torch.iinfo(dtype)
        x = torch.tensor([info.max, info.min, info.max // 2 + 1, -1 if info.min < 0 else 1], dtype=dtype)
        (actual,) = load_method(dynamic_programs.get("mul3", dtype, 1)).execute([x])
        assert_bit_exact(actual, references["mul3"](x), dtype)


def test_negative_zero_stays_negative(dynamic_programs, load_method, references):
    # The case assert_close(rtol=0, atol=0) cannot see: -0.0 * 3 is -0.0, not +0.0.
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        x = torch.tensor([-0.0, 0.0, -0.0], dtype=dtype)
        for op in ("mul3", "mul4"):
            (actual,) = load_method(dynamic_programs.get(op, dtype, 1)).execute([x])
            assert actual.signbit().tolist() == [True, False, True], (op, dtype)
            assert_bit_exact(actual, references[op](x), (op, dtype))
