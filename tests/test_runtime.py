"""The example programs at runtime, through the C++ runner and the ExecuTorch Python runtime, against ATen's own
`x * K` (not our ops' eager kernels, which share the code under test); one build with every op runs both; programs
with channels-last inputs."""

import pytest
import torch

from flow.compare import mismatches
from flow.runner import run_pte

FACTORS = {"mul3": 3, "mul4": 4}


@pytest.fixture(params=["mul3", "mul4"])
def example(request, mul3_build, mul3_pte, mul4_build, mul4_pte):
    """(factor, its flow's build, its program)"""
    if request.param == "mul3":
        return 3, mul3_build, mul3_pte
    return 4, mul4_build, mul4_pte


def random_inputs():
    return [torch.randn(2, 3, generator=torch.Generator().manual_seed(seed)) for seed in range(3)]


def test_runner_matches_aten(example):
    factor, build, pte = example
    for x in random_inputs():
        expected = [x * factor]
        assert mismatches(run_pte(build.runner, pte, [x], expected), expected, exact=True) == []


def test_python_runtime_matches_aten(example, load_method):
    factor, _, pte = example
    method = load_method(pte)
    for x in random_inputs():
        (actual,) = method.execute([x])
        torch.testing.assert_close(actual, x * factor, rtol=0, atol=0)


def test_one_build_with_every_op_runs_both_programs(combined_build, mul3_pte, mul4_pte):
    x = torch.randn(2, 3)
    for pte, expected in ((mul3_pte, x * 3), (mul4_pte, x * 4)):
        assert mismatches(run_pte(combined_build.runner, pte, [x], [expected]), [expected], exact=True) == []


@pytest.fixture(scope="module")
def channels_last_programs(mul4_aot, tmp_path_factory):
    from flow.export import CallOp, export_to_pte

    example = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    out_dir = tmp_path_factory.mktemp("channels_last")
    return {op: export_to_pte(CallOp(getattr(torch.ops.my_ops, op).default), (example,), out_dir / f"{op}.pte")
            for op in FACTORS}


@pytest.mark.parametrize("op", FACTORS)
def test_channels_last_programs_run_in_both_runtimes(op, channels_last_programs, combined_build, load_method):
    x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    expected = x * FACTORS[op]
    (actual,) = load_method(channels_last_programs[op]).execute([x])
    assert actual.stride() == expected.stride()
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    from_runner = run_pte(combined_build.runner, channels_last_programs[op], [x], [expected])
    assert mismatches(from_runner, [expected], exact=True) == []
