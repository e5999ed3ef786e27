"""custom_ops_1.pte at runtime, through the C++ runner and through the ExecuTorch Python runtime: equal to eager."""

import torch

import custom_ops_1  # noqa: F401  (registers my_ops::mul3 for the eager reference)
from runner_check import compare_outputs, run_pte


def test_runner_matches_eager_on_random_inputs(mul3_build, mul3_pte):
    for seed in range(3):
        x = torch.randn(2, 3, generator=torch.Generator().manual_seed(seed))
        expected = [torch.ops.my_ops.mul3(x)]
        assert compare_outputs(run_pte(mul3_build.runner, mul3_pte, [x], expected), expected) == []


def test_python_runtime_matches_eager_on_random_inputs(et_runtime, mul3_pte):
    method = et_runtime.load_program(mul3_pte).load_method("forward")
    for seed in range(3):
        x = torch.randn(2, 3, generator=torch.Generator().manual_seed(seed))
        (actual,) = method.execute([x])
        torch.testing.assert_close(actual, torch.ops.my_ops.mul3(x), rtol=0, atol=0)
