"""my_ops::quantize_rows, registered from Python with the torch.library.custom_op decorator: two outputs of different
dtypes and shapes, bit for bit the ATen reference (ops/quantize_rows/quantize_rows.py) in eager and in the runtime kernel."""

import pytest
import torch

import helpers
from flow.compare import assert_bit_exact
from flow.export import CallOp, export_to_pte
from ops.quantize_rows.quantize_rows import quantize_rows_reference

pytestmark = pytest.mark.usefixtures("python_ops")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def rows(shape, dtype, seed=0):
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 5).to(dtype)
    x.view(-1, shape[-1])[0] = 0  # an all-zero row
    if shape[-1] >= 8:
        x.view(-1, shape[-1])[1, :8] = torch.tensor([-7, -3.5, -0.5, 0, 0.5, 1.5, 2.5, 7]).to(dtype)  # ties at 4 bits
    return x


def test_schema_has_a_default_and_two_outputs():
    assert str(torch.ops.my_ops.quantize_rows.default._schema) == (
        "my_ops::quantize_rows(Tensor input, SymInt bits=8) -> (Tensor, Tensor)")
    assert str(torch.ops.my_ops.quantize_rows.out._schema) == (
        "my_ops::quantize_rows.out(Tensor input, SymInt bits=8, *, Tensor(a!) values, Tensor(b!) scales) -> "
        "(Tensor(a!), Tensor(b!))")


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_eager_equals_the_reference_bit_for_bit(dtype, bits):
    x = rows([3, 5, 40], dtype)
    values, scales = torch.ops.my_ops.quantize_rows(x, bits)
    expected_values, expected_scales = quantize_rows_reference(x, bits)
    assert values.dtype == torch.int8 and values.shape == x.shape
    assert scales.dtype == torch.float32 and scales.shape == x.shape[:-1]
    assert_bit_exact(values, expected_values)
    assert_bit_exact(scales, expected_scales)
    assert int(values.abs().max()) <= 2 ** (bits - 1) - 1


def test_the_default_is_8_bits():
    x = rows([4, 16], torch.float32)
    assert_bit_exact(torch.ops.my_ops.quantize_rows(x)[0], quantize_rows_reference(x, 8)[0])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_opcheck(dtype):
    x = rows([3, 16], dtype)
    torch.library.opcheck(torch.ops.my_ops.quantize_rows.default, (x, 4))
    torch.library.opcheck(torch.ops.my_ops.quantize_rows.out, (x, 4),
                          {"values": torch.empty(0, dtype=torch.int8), "scales": torch.empty(0)})


@pytest.mark.parametrize("args, message", [
    (lambda: (torch.ones(2, 4, dtype=torch.int32), 8), "input has unsupported dtype int32"),
    (lambda: (torch.ones(2, 4), 1), "bits must be 2 to 8, got 1"),
    (lambda: (torch.ones(2, 4), 9), "bits must be 2 to 8, got 9"),
    (lambda: (torch.ones(2, 0), 8), "non-empty last dimension"),
])
def test_bad_arguments_are_errors_naming_the_op(args, message):
    with pytest.raises(RuntimeError, match=message):
        torch.ops.my_ops.quantize_rows(*args())


def test_a_non_finite_input_is_an_error():
    with pytest.raises(ValueError, match="NaN or infinity"):
        torch.ops.my_ops.quantize_rows(torch.tensor([[1.0, float("nan")]]))


class Quantize(torch.nn.Module):
    def __init__(self, bits):
        super().__init__()
        self.bits = bits

    def forward(self, x):
        return torch.ops.my_ops.quantize_rows(x, self.bits)


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    out = tmp_path_factory.mktemp("quantize_rows")
    dims = {0: torch.export.Dim("rows", min=1, max=512), 1: torch.export.Dim("cols", min=1, max=600)}
    return {(dtype, bits): export_to_pte(Quantize(bits), (rows([4, 16], dtype),), out / f"q_{dtype}_{bits}.pte",
                                         dynamic_shapes=(dims,))
            for dtype in DTYPES for bits in (3, 8)}


@pytest.mark.parametrize("bits", [3, 8])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_runtime_kernel_equals_the_reference_bit_for_bit(programs, load_method, dtype, bits):
    method = load_method(programs[(dtype, bits)])
    # rows across the thread pool, a row longer than a conversion block with a tail, the extremes of the dtype
    for shape in ([1, 2], [7, 33], [300, 517]):
        x = rows(shape, dtype)
        x.view(-1)[-1] = torch.finfo(dtype).max
        x.view(-1)[-2] = torch.finfo(dtype).tiny
        for _ in range(2):
            values, scales = method.execute([x])
            expected_values, expected_scales = quantize_rows_reference(x, bits)
            assert_bit_exact(values, expected_values)
            assert_bit_exact(scales, expected_scales)


def test_the_runtime_kernel_refuses_nan(programs, load_method):
    x = rows([4, 16], torch.float32)
    x[2, 3] = float("nan")
    with pytest.raises(RuntimeError):
        load_method(programs[(torch.float32, 8)]).execute([x])


def test_the_runner_writes_both_outputs(programs, combined_build):
    from flow.runner import run_pte

    x = rows([5, 24], torch.bfloat16)
    expected = quantize_rows_reference(x, 3)
    actual = run_pte(combined_build.runner, programs[(torch.bfloat16, 3)], [x], expected, pass_shapes=True)
    assert_bit_exact(actual[0], expected[0])
    assert_bit_exact(actual[1], expected[1])


def test_helpers_full_range_is_quantized_like_the_reference():
    x = helpers.full_range((64, 32), torch.float32)
    x = torch.where(torch.isfinite(x), x, torch.zeros_like(x))
    v, s = torch.ops.my_ops.quantize_rows(x, 6)
    ev, es = quantize_rows_reference(x, 6)
    assert_bit_exact(v, ev)
    assert_bit_exact(s, es)
