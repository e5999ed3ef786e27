"""Programs at runtime, through the C++ runner and the ExecuTorch Python runtime, against the declared ATen references
(never our ops' own eager kernels, which share the code under test), bit for bit: the examples; one build with every
op runs both; channels-last inputs; and multi-op programs executed again and again, whose memory plan reuses a dead
input's buffer for intermediates, so an execution that does not get its inputs back computes garbage."""

import pytest
import torch

from flow.compare import assert_bit_exact, mismatches
from flow.export import CallOp, export_to_pte, pt2_path
from flow.reference import reference_outputs
from flow.runner import run_pte


@pytest.fixture(scope="module")
def references(declared):
    return {op.short_name: op.reference_function() for op in declared.values()}


@pytest.fixture(params=["mul3", "mul4"])
def example(request, mul3_build, mul3_pte, mul4_build, mul4_pte):
    """(op, its flow's build, its program)"""
    return (request.param, *((mul3_build, mul3_pte) if request.param == "mul3" else (mul4_build, mul4_pte)))


def random_inputs():
    return [torch.randn(2, 3, generator=torch.Generator().manual_seed(seed)) for seed in range(3)]


def test_runner_matches_the_reference(example, references):
    op, build, pte = example
    for x in random_inputs():
        expected = [references[op](x)]
        assert mismatches(run_pte(build.runner, pte, [x], expected), expected, exact=True) == []


def test_python_runtime_matches_the_reference(example, load_method, references):
    op, _, pte = example
    method = load_method(pte)
    for x in random_inputs():
        (actual,) = method.execute([x])
        assert_bit_exact(actual, references[op](x))


def test_one_build_with_every_op_runs_both_programs(combined_build, mul3_pte, mul4_pte, references):
    x = torch.randn(2, 3)
    for pte, op in ((mul3_pte, "mul3"), (mul4_pte, "mul4")):
        expected = [references[op](x)]
        assert mismatches(run_pte(combined_build.runner, pte, [x], expected), expected, exact=True) == []


@pytest.fixture(scope="module")
def channels_last_programs(mul4_aot, tmp_path_factory):
    example = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    out_dir = tmp_path_factory.mktemp("channels_last")
    return {op: export_to_pte(CallOp(getattr(torch.ops.my_ops, op).default), (example,), out_dir / f"{op}.pte")
            for op in ("mul3", "mul4")}


@pytest.mark.parametrize("op", ["mul3", "mul4"])
def test_channels_last_programs_run_in_both_runtimes(op, channels_last_programs, combined_build, load_method,
                                                     references):
    x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    expected = references[op](x)
    (actual,) = load_method(channels_last_programs[op]).execute([x])
    assert actual.stride() == expected.stride()
    assert_bit_exact(actual, expected)
    from_runner = run_pte(combined_build.runner, channels_last_programs[op], [x], [expected])
    assert mismatches(from_runner, [expected], exact=True) == []


class Chain(torch.nn.Module):
    """x is dead after the first op: its planned buffer is free for the next intermediate."""

    def forward(self, x):
        return torch.ops.my_ops.mul3(torch.ops.my_ops.mul4(torch.ops.my_ops.mul3(x)))


class InputDiesEarly(torch.nn.Module):
    """x dies at the first op, y lives to the end."""

    def forward(self, x, y):
        a = torch.ops.my_ops.mul3(x)
        b = torch.ops.my_ops.mul4(a)
        return torch.ops.my_ops.mul3(b) + y


@pytest.fixture(scope="module")
def repeated_programs(mul4_aot, declared, tmp_path_factory):
    """Each program with its inputs and its reference outputs (the .pt2 with the declared references)."""
    import custom_ops_1  # noqa: F401

    out_dir = tmp_path_factory.mktemp("repeated")
    programs = {}
    for name, model, inputs in (("chain", Chain(), [torch.randn(4, 8)]),
                                ("input_dies_early", InputDiesEarly(), [torch.randn(4, 8), torch.randn(4, 8)])):
        pte = export_to_pte(model, inputs, out_dir / f"{name}.pte")
        programs[name] = (str(pte), inputs, reference_outputs(pt2_path(pte), inputs, list(declared.values())))
    return programs


@pytest.mark.parametrize("program", ["chain", "input_dies_early"])
@pytest.mark.parametrize("executions", [1, 2, 5])
def test_the_runner_is_right_at_every_execution(program, executions, repeated_programs, combined_build):
    pte, inputs, expected = repeated_programs[program]
    actual = run_pte(combined_build.runner, pte, inputs, expected, num_executions=executions)
    assert mismatches(actual, expected, exact=True) == []


@pytest.mark.parametrize("program", ["chain", "input_dies_early"])
def test_the_python_runtime_is_right_at_every_execution(program, repeated_programs, load_method):
    pte, inputs, expected = repeated_programs[program]
    method = load_method(pte)
    for execution in range(5):
        assert mismatches(method.execute(inputs), expected, exact=True) == [], execution
