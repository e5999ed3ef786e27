"""custom_ops_2.pte at runtime, through the C++ runner and the ExecuTorch Python runtime: equal to eager; and one
combined build that runs both example programs."""

import torch

from runner_check import compare_outputs, run_pte


def test_runner_matches_eager_on_random_inputs(mul4_build, mul4_pte):
    for seed in range(3):
        x = torch.randn(2, 3, generator=torch.Generator().manual_seed(seed))
        expected = [torch.ops.my_ops.mul4(x)]
        assert compare_outputs(run_pte(mul4_build.runner, mul4_pte, [x], expected), expected) == []


def test_python_runtime_matches_eager_on_random_inputs(et_runtime, mul4_pte):
    method = et_runtime.load_program(mul4_pte).load_method("forward")
    for seed in range(3):
        x = torch.randn(2, 3, generator=torch.Generator().manual_seed(seed))
        (actual,) = method.execute([x])
        torch.testing.assert_close(actual, torch.ops.my_ops.mul4(x), rtol=0, atol=0)


def test_combined_runner_runs_both_programs(combined_build, mul3_pte, mul4_pte):
    x = torch.randn(2, 3)
    for pte, expected in ((mul3_pte, x * 3), (mul4_pte, x * 4)):
        assert compare_outputs(run_pte(combined_build.runner, pte, [x], [expected]), [expected]) == []
