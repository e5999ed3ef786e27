"""Both AOT ops as PyTorch subsystems see them: torch.library.opcheck, torch.compile (no graph break), torch.vmap, and
torch.export with dynamic shapes, whose programs then run at several sizes in the runner and the Python runtime."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import custom_ops_1  # noqa: F401
from flow.compare import mismatches
from flow.runner import run_pte

pytestmark = pytest.mark.usefixtures("mul4_aot")

FACTORS = {"mul3": 3, "mul4": 4}
SHAPES = [(5,), (3, 4), (2, 0, 3), (2, 3, 4, 5)]


def sample(shape, dtype, requires_grad=False):
    if dtype.is_floating_point:
        return torch.randn(shape, dtype=dtype, requires_grad=requires_grad)
    return torch.randint(0 if dtype == torch.uint8 else -100, 100, shape, dtype=dtype)


@pytest.mark.parametrize("op", FACTORS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int32, torch.uint8])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_opcheck_functional(op, dtype, shape):
    for requires_grad in ((False, True) if dtype.is_floating_point else (False,)):
        torch.library.opcheck(getattr(torch.ops.my_ops, op).default, (sample(shape, dtype, requires_grad),))


@pytest.mark.parametrize("op", FACTORS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.int8])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_opcheck_out_variant(op, dtype, shape):
    out_op = getattr(torch.ops.my_ops, op).out
    torch.library.opcheck(out_op, (sample(shape, dtype),), {"output": torch.empty(shape, dtype=dtype)})
    torch.library.opcheck(out_op, (sample(shape, dtype),), {"output": torch.empty(0, dtype=dtype)})  # resized


class BothOps(torch.nn.Module):
    def forward(self, x):
        return torch.ops.my_ops.mul4(torch.ops.my_ops.mul3(x) + 1)


@pytest.mark.parametrize("dynamic", [False, True])
def test_torch_compile_fullgraph_matches_eager(dynamic):
    torch._dynamo.reset()
    compiled = torch.compile(BothOps(), fullgraph=True, dynamic=dynamic)  # fullgraph: a graph break is an error
    for shape in ((4, 5), (7, 5)):
        x = torch.randn(shape)
        torch.testing.assert_close(compiled(x), BothOps()(x), rtol=0, atol=0)


class OpCalls(TorchDispatchMode):
    """Records each call of the op named `name` that reaches the kernels, with its input's shape."""

    def __init__(self, name):
        super().__init__()
        self.name, self.shapes = name, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.name().startswith(self.name):
            self.shapes.append(tuple(args[0].shape))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("op", FACTORS)
def test_vmap_uses_the_batching_rule(op):
    # With the rule, vmap calls the op once on the whole batch; vmap's slow fallback would call it once per sample.
    fn = getattr(torch.ops.my_ops, op)
    x = torch.randn(3, 4, 5)
    for in_dims in (0, 1, 2):
        with OpCalls(f"my_ops::{op}") as calls:
            result = torch.vmap(fn, in_dims=in_dims)(x)
        torch.testing.assert_close(result, (x * FACTORS[op]).movedim(in_dims, 0))
        assert calls.shapes == [(3, 4, 5)], f"vmap over dim {in_dims} called the op per sample: {calls.shapes}"
    with OpCalls(f"my_ops::{op}") as calls:
        torch.testing.assert_close(torch.vmap(torch.vmap(fn))(x), x * FACTORS[op])
    assert calls.shapes == [(3, 4, 5)], calls.shapes


@pytest.mark.parametrize("op", FACTORS)
def test_export_with_dynamic_dims_runs_at_several_sizes(op, dynamic_programs, combined_build, load_method):
    pte = dynamic_programs.get(op, torch.float32, 2)
    method = load_method(pte)
    for shape in ((1, 1), (3, 16), (16, 7), (0, 5)):
        x = torch.randn(shape)
        expected = [x * FACTORS[op]]
        (actual,) = method.execute([x])
        assert actual.shape == x.shape
        torch.testing.assert_close(actual, expected[0], rtol=0, atol=0)
        from_runner = run_pte(combined_build.runner, pte, [x], expected, pass_shapes=True)
        assert mismatches(from_runner, expected, exact=True) == []
