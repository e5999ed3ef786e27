"""What "bit for bit" means in this project, in one place: the verifier, the profiler and the tests all compare here.

Exact: same dtype, same shape, and every element's bit pattern equal to the reference's (compared as integers, so -0.0
differs from +0.0 and a NaN's sign and payload count). The one NaN exception: a bfloat16 NaN where the reference has a
NaN only has to be a NaN, because ATen itself writes 0xFFFF from its vector loop and 0x7FC0 from its scalar tail for
the same input, so the payload depends on the element's position, not on the operation. (Our kernels write c10's
canonical 0x7FC0; tests/test_kernel_paths.py checks that separately.)

Within tolerance: integers and bools exact, floats within torch.testing's per-dtype tolerance, NaN where the reference
has NaN.
"""

from __future__ import annotations

from typing import Sequence

import torch

_SAME_WIDTH_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(_SAME_WIDTH_INT[t.element_size()])


def bit_difference(actual: torch.Tensor, expected: torch.Tensor) -> str | None:
    """None when `actual` equals `expected` bit for bit (see the module's docstring), else what differs first."""
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        return f"{actual.dtype}{list(actual.shape)}, expected {expected.dtype}{list(expected.shape)}"
    if actual.dtype == torch.bool:
        differs = actual != expected
    else:
        differs = _bits(actual) != _bits(expected)
    if expected.dtype == torch.bfloat16:
        differs &= ~(expected.isnan() & actual.isnan())
    if not bool(differs.any()):
        return None
    where = tuple(int(i) for i in differs.nonzero()[0])
    a, e = actual[where], expected[where]
    shown = (lambda t: f"{t.item()!r}") if actual.dtype == torch.bool else (
        lambda t: f"{t.item()!r} (0x{int(_bits(t.reshape(1)).item()) & ((1 << 8 * t.element_size()) - 1):x})")
    return (f"{int(differs.sum())} of {differs.numel()} elements differ bit for bit; first at {list(where)}: "
            f"{shown(a)}, expected {shown(e)}")


def tolerance_difference(actual: torch.Tensor, expected: torch.Tensor) -> str | None:
    """None when `actual` is within torch.testing's default tolerance of `expected` (integers exact, NaN matches NaN)."""
    try:
        torch.testing.assert_close(actual, expected, equal_nan=True)
    except AssertionError as err:
        return str(err).replace("\n", " ")
    return None


def mismatches(actual: Sequence, expected: Sequence, *, exact: bool) -> list[str]:
    """One line per output that differs (empty when all match): bit for bit with exact=True, else within tolerance.
    Non-tensor outputs (ints, floats, bools) must be equal."""
    if len(actual) != len(expected):
        return [f"got {len(actual)} outputs, expected {len(expected)}"]
    problems = []
    for i, (a, e) in enumerate(zip(actual, expected)):
        if isinstance(e, torch.Tensor) and isinstance(a, torch.Tensor):
            problem = bit_difference(a, e) if exact else tolerance_difference(a, e)
        else:
            problem = None if type(a) is type(e) and a == e else f"{a!r}, expected {e!r}"
        if problem is not None:
            problems.append(f"output {i}: {problem}")
    return problems


def assert_bit_exact(actual: torch.Tensor, expected: torch.Tensor, context: object = "") -> None:
    """For tests: AssertionError naming the first element that differs bit for bit."""
    problem = bit_difference(actual, expected)
    assert problem is None, f"{context}: {problem}" if context else problem
