"""my_ops::update_cache, registered from Python, mutates its argument: in eager, under opcheck, and in programs that
keep the cache as a mutable buffer across executions (runner and Python runtime, position by position as in eager);
a position past the cache is an error everywhere, never a write past its end."""

import os

import pytest
import torch

from flow.compare import assert_bit_exact
from flow.export import export_to_pte, pt2_path
from flow.reference import reference_runs
from flow.runner import RunnerError, run_pte
from helpers import run_runner
from pte_surgery import drop_kernel_argument, replace_kernel_argument
from ops.update_cache.update_cache import KVCacheExample, update_cache_reference

pytestmark = pytest.mark.usefixtures("python_ops")


def steps(positions, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(1, 1, 2, 4, generator=generator), torch.tensor([p])) for p in positions]


def test_eager_writes_the_rows_and_returns_the_next_position():
    cache = torch.zeros(2, 8, 3)
    value = torch.randn(2, 3, 3)
    expected = cache.clone()
    expected_next = update_cache_reference(value, expected, 4)
    assert_bit_exact(torch.ops.my_ops.update_cache(value, cache, 4), expected_next)
    assert_bit_exact(cache, expected)
    assert int(expected_next) == 7


@pytest.mark.parametrize("start_pos, message", [(6, "passes the end of the cache"), (-1, "is negative")])
def test_a_position_outside_the_cache_is_an_error_and_writes_nothing(start_pos, message):
    cache = torch.zeros(1, 8, 4)
    with pytest.raises(RuntimeError, match=message):
        torch.ops.my_ops.update_cache(torch.ones(1, 3, 4), cache, start_pos)
    assert not cache.any()


def test_mismatched_shapes_and_dtypes_are_errors():
    with pytest.raises(RuntimeError, match="must match in every dimension but 1"):
        torch.ops.my_ops.update_cache(torch.ones(1, 1, 5), torch.zeros(1, 8, 4), 0)
    with pytest.raises(RuntimeError, match="dtype"):
        torch.ops.my_ops.update_cache(torch.ones(1, 1, 4, dtype=torch.float16), torch.zeros(1, 8, 4), 0)


def test_opcheck():
    torch.library.opcheck(torch.ops.my_ops.update_cache.default, (torch.randn(2, 2, 4), torch.zeros(2, 6, 4), 3))


@pytest.fixture(scope="module")
def cache_program(tmp_path_factory):
    pte = export_to_pte(KVCacheExample(), steps([0])[0], tmp_path_factory.mktemp("update_cache") / "cache.pte")
    return pte


def expected_after(pte, runs):
    return reference_runs(pt2_path(pte), runs, [])  # eager PyTorch (the op's own Python kernel), state carried


@pytest.mark.parametrize("positions", [[0, 1, 2], [5, 0, 7, 3]])
def test_the_runner_keeps_the_cache_across_executions(cache_program, combined_build, positions):
    runs = steps(positions)
    expected = expected_after(cache_program, runs)
    actual = run_pte(combined_build.runner, cache_program, runs[0], expected[-1], num_executions=len(runs),
                     later_inputs=runs[1:])
    for a, e in zip(actual, expected[-1]):
        assert_bit_exact(a, e)


def test_the_python_runtime_keeps_the_cache_across_executions(cache_program, load_method):
    runs = steps([0, 1, 2, 3])
    expected = expected_after(cache_program, runs)
    method = load_method(cache_program)
    for inputs, wanted in zip(runs, expected):
        for a, e in zip(method.execute(list(inputs)), wanted):
            assert_bit_exact(a, e)


def test_a_cache_that_starts_from_the_module_buffer(tmp_path, load_method):
    # The buffer's initial value is part of the program: ExecuTorch would leave it uninitialized unless the exporter
    # asks for it (flow.export.export_to_pte marks every mutated buffer).
    model = KVCacheExample()
    model.cache.fill_(7.0)
    pte = export_to_pte(model, steps([0])[0], tmp_path / "filled.pte")
    (summed, _) = load_method(pte).execute(list(steps([0])[0]))
    assert bool((summed[:, 1:] == 14.0).all())


def test_a_position_past_the_cache_is_one_error_line_in_the_runner_and_an_error_in_python(cache_program,
                                                                                         combined_build, load_method):
    runs = steps([8])
    with pytest.raises(RunnerError) as info:
        run_pte(combined_build.runner, cache_program, runs[0], [torch.empty(0), torch.empty(0, dtype=torch.int64)])
    assert "my_ops::update_cache.out: writing 1 row(s) at start_pos 8 passes the end of the cache (8 rows)" in str(
        info.value)
    assert "Signal" not in str(info.value)
    with pytest.raises(RuntimeError):
        load_method(cache_program).execute(list(runs[0]))


def test_the_example_program_verifies_position_by_position(declared, combined_build, tmp_path):
    from flow.export import export_example
    from flow.verify import verify

    pte = export_example(declared["my_ops::update_cache"], tmp_path)
    assert os.path.isfile(os.path.splitext(pte)[0] + ".runs.pt")
    lines = []
    assert verify(pte, runner=combined_build.runner, report=lines.append) == []
    assert "3 executions in order (state carried across)" in lines[0]


# The kernel registers itself (EXECUTORCH_LIBRARY_CHECKED, no codegen): a program whose call does not match its C++
# parameters is still one error line from the runner, never an abort or a read past the argument list.
MALFORMED_CALLS = {
    "an int where the kernel takes a tensor": (
        lambda src, dst: replace_kernel_argument(src, dst, 0, _int(7), operator="my_ops::update_cache.out"),
        "my_ops::update_cache.out: argument 0 is Int where the kernel takes Tensor"),
    "one value too few": (
        lambda src, dst: drop_kernel_argument(src, dst, 2, operator="my_ops::update_cache.out"),
        "my_ops::update_cache.out: the program passes 4 values, the kernel takes 4 arguments plus the result"),
}


def _int(value):
    from executorch.exir.schema import Int

    return Int(value)


@pytest.mark.parametrize("case", MALFORMED_CALLS)
@pytest.mark.parametrize("which", ["runner", "sanitized runner"])
def test_a_malformed_call_of_the_self_registered_kernel_is_one_error_line(case, which, cache_program, combined_build,
                                                                          sanitized_build, tmp_path):
    make, message = MALFORMED_CALLS[case]
    bad = make(cache_program, str(tmp_path / "bad.pte"))
    runner = combined_build.runner if which == "runner" else sanitized_build.runner
    proc = run_runner(runner, f"--model_path={bad}")
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    assert message in proc.stderr, proc.stderr[-2000:]
    assert len([line for line in proc.stderr.splitlines() if line.startswith("error: ")]) == 1, proc.stderr
