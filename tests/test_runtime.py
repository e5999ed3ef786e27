"""The example programs at runtime, through the C++ runner and the ExecuTorch Python runtime: equal to eager; and one
combined build that runs both."""

import pytest
import torch

from runner_check import compare_outputs, run_pte


@pytest.fixture(params=["mul3", "mul4"])
def example(request, mul3_build, mul3_pte, mul4_build, mul4_pte):
    """(op, its flow's build, its program)"""
    if request.param == "mul3":
        return torch.ops.my_ops.mul3, mul3_build, mul3_pte
    return torch.ops.my_ops.mul4, mul4_build, mul4_pte


def random_inputs():
    return [torch.randn(2, 3, generator=torch.Generator().manual_seed(seed)) for seed in range(3)]


def test_runner_matches_eager_on_random_inputs(example):
    op, build, pte = example
    for x in random_inputs():
        expected = [op(x)]
        assert compare_outputs(run_pte(build.runner, pte, [x], expected), expected) == []


def test_python_runtime_matches_eager_on_random_inputs(example, et_runtime):
    op, _, pte = example
    method = et_runtime.load_program(pte).load_method("forward")
    for x in random_inputs():
        (actual,) = method.execute([x])
        torch.testing.assert_close(actual, op(x), rtol=0, atol=0)


def test_combined_runner_runs_both_programs(combined_build, mul3_pte, mul4_pte):
    x = torch.randn(2, 3)
    for pte, expected in ((mul3_pte, x * 3), (mul4_pte, x * 4)):
        assert compare_outputs(run_pte(combined_build.runner, pte, [x], [expected]), [expected]) == []
