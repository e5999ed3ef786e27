"""Both AOT ops as PyTorch subsystems see them: torch.library.opcheck, torch.compile (no graph break), torch.vmap, and
torch.export with dynamic shapes, whose programs then run at several sizes in the runner and the Python runtime."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import custom_ops_1
from flow.compare import assert_bit_exact, mismatches
from flow.dtypes import ELEMENTWISE_DTYPES
from flow.runner import run_pte
from helpers import run_runner
from pte_surgery import edit_plan

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
        assert_bit_exact(compiled(x), BothOps()(x))


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
        assert_bit_exact(actual, expected[0])
        from_runner = run_pte(combined_build.runner, pte, [x], expected, pass_shapes=True)
        assert mismatches(from_runner, expected, exact=True) == []


def accepts(call) -> bool:
    try:
        call()
        return True
    except RuntimeError:
        return False


def test_every_side_of_an_op_accepts_the_same_dtypes(mul3_pte, mul3_build, dynamic_programs, load_method, tmp_path):
    # mul3's Python registration (custom_ops_1.DTYPES: export refuses the rest), mul4's C++ kernels and the
    # runtime kernels must agree on the dtypes, or export would write programs the runtime refuses.
    candidates = [*ELEMENTWISE_DTYPES, "bool", "complex64", "uint16"]
    ones = {name: torch.ones(3, dtype=getattr(torch, name)) for name in candidates}
    python_side = {name for name in candidates if accepts(lambda: torch.ops.my_ops.mul3(ones[name]))}
    cpp_side = {name for name in candidates if accepts(lambda: torch.ops.my_ops.mul4(ones[name]))}
    assert python_side == cpp_side == set(ELEMENTWISE_DTYPES)
    assert {str(d).removeprefix("torch.") for d in custom_ops_1.DTYPES} == set(ELEMENTWISE_DTYPES)
    for name in ELEMENTWISE_DTYPES:  # the runtime kernels run every one (programs exported in that dtype)
        for op in FACTORS:
            load_method(dynamic_programs.get(op, getattr(torch, name), 1)).execute([ones[name]])
    # ... and refuse another: mul3's program with its input and output retyped to Bool.
    from executorch.exir.schema import ScalarType

    def to_bool(plan):
        for index in (plan.inputs[0], plan.outputs[0]):
            plan.values[index].val.scalar_type = ScalarType.BOOL

    proc = run_runner(mul3_build.runner, f"--model_path={edit_plan(mul3_pte, str(tmp_path / 'bool.pte'), to_bool)}")
    assert proc.returncode == 1 and "my_ops::mul3.out: input has unsupported dtype bool" in proc.stderr, proc.stderr[-2000:]
