"""flow.runtime: one kernel library per process (a second is refused with an error rather than the abort a second
registration of an op would cause); programs checked before the runtime sees them, with the runner's own pre-flight
checks; and a loaded method that stays valid for as long as it is held."""

import re

import pytest
import torch

from flow.export import export_to_pte
from helpers import run_in_fresh_python, run_runner
from pte_surgery import edit_plan


def test_a_second_kernel_library_is_refused_and_the_first_keeps_working(mul3_build, mul4_build, mul3_pte):
    result = run_in_fresh_python(f"""
        import torch
        from flow.runtime import load_kernel_library, load_method_checked
        load_kernel_library({mul3_build.kernel_lib!r})
        load_kernel_library({mul3_build.kernel_lib!r})  # the same library again: nothing to do
        try:
            load_kernel_library({mul4_build.kernel_lib!r})
            error = None
        except RuntimeError as err:
            error = str(err)
        (y,) = load_method_checked({mul3_pte!r}).execute([torch.ones(2, 3)])
        result = [error, y.tolist()]
    """)
    error, values = result
    assert error is not None and "is already loaded in this process" in error and "aborts the process" in error
    assert values == [[3.0] * 3] * 2


class Chain(torch.nn.Module):
    def forward(self, x):
        return torch.ops.my_ops.mul3(torch.ops.my_ops.mul4(x))


class TwoInputs(torch.nn.Module):
    def forward(self, x, y):
        return torch.ops.my_ops.mul4(torch.ops.my_ops.mul3(x) + y)


# The README's pattern, with memory churn between loading and executing: the Program (and the program's bytes) must
# outlive the function that loaded the method. Garbage the size of the program fills whatever was freed.
README_PATTERN_WITH_CHURN = """
import gc, torch
from flow.runtime import load_kernel_library, load_method_checked
load_kernel_library({kernel_lib!r})
method = load_method_checked({pte!r})
gc.collect()
churn = [bytes([i % 251]) * size for i in range(400) for size in (64, 1 << 12, 1 << 16)]
junk = [torch.full((1024,), 7.0) for _ in range(4000)]
inputs = [torch.arange(6.0).reshape(2, 3) + i for i in range({num_inputs})]
result = [[t.tolist() for t in method.execute(inputs)] for _ in range(3)]
"""


@pytest.mark.parametrize("model, num_inputs, expected", [
    (Chain(), 1, lambda x: x * 4 * 3),
    (TwoInputs(), 2, lambda x, y: (x * 3 + y) * 4),
], ids=["one input", "two inputs"])
def test_the_readme_pattern_survives_memory_churn(model, num_inputs, expected, mul4_aot, combined_build, tmp_path):
    import custom_ops_1  # noqa: F401

    inputs = [torch.arange(6.0).reshape(2, 3) + i for i in range(num_inputs)]
    pte = export_to_pte(model, inputs, tmp_path / "program.pte")
    result = run_in_fresh_python(README_PATTERN_WITH_CHURN.format(kernel_lib=combined_build.kernel_lib, pte=str(pte),
                                                                  num_inputs=num_inputs))
    assert result == [[expected(*inputs).tolist()]] * 3


def test_the_loaded_method_holds_its_program(load_method, mul3_pte):
    import gc
    import weakref

    method = load_method(mul3_pte)
    program = weakref.ref(method.program)
    gc.collect()
    assert program() is not None  # alive while the method is
    del method
    gc.collect()
    assert program() is None  # and released with it: nothing is kept for ever


def test_checked_loading_hands_the_runtime_the_checked_bytes_in_a_sealed_file(load_method, mul3_pte, tmp_path):
    # The runtime maps a program it loads from a file at a page boundary (its tensors stay on cache lines); the file is
    # an in-memory copy of the checked bytes that nobody can change: not the .pte, which may change after the check.
    import os
    import shutil

    from flow.runtime import _as_file

    data = open(mul3_pte, "rb").read()
    fd = _as_file(data)
    try:
        assert os.pread(fd, len(data) + 1, 0) == data
        with pytest.raises(PermissionError):
            os.pwrite(fd, b"x", 0)
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 1)
    finally:
        os.close(fd)
    copy = shutil.copy(mul3_pte, tmp_path / "mul3.pte")
    method = load_method(copy)
    x = torch.randn(2, 3)
    before = method.execute([x])[0]
    open(copy, "wb").write(bytes(len(data)))  # the file is gone to zeros; the method runs what was checked
    assert torch.equal(method.execute([x])[0], before) and torch.equal(before, x * 3)


@pytest.mark.parametrize("edit, runner_message, python_message", [
    (lambda plan: plan.outputs.__setitem__(0, 2**31 - 1), "output 0 refers to no valid value",
     "output 0 refers to value 2147483647, but the method has"),
    (lambda plan: plan.non_const_buffer_sizes.__setitem__(-1, 2**40),
     "memory-planned buffers need at least 1099511627776 bytes, more than --max_memory=1073741824",
     "memory-planned buffers need at least 1099511627776 bytes, more than max_memory=1073741824"),
    (lambda plan: setattr(plan.values[plan.inputs[0]].val, "dim_order", [0, 0]),
     "input 0 has invalid tensor metadata", "input 0 has invalid tensor metadata: dim order [0, 0] is not a"),
    (lambda plan: setattr(plan.values[plan.inputs[0]].val, "sizes", [-1, 3]),
     "input 0 has invalid tensor metadata", "input 0 has invalid tensor metadata: negative size in [-1, 3]"),
    (lambda plan: setattr(plan.values[plan.outputs[0]].val, "dim_order", [1]),
     "output 0 has invalid tensor metadata", "output 0 has invalid tensor metadata: dim order [1] is not a"),
], ids=["output index", "planned buffer", "input dim order", "input size", "output dim order"])
def test_checked_loading_makes_the_runners_checks(edit, runner_message, python_message, load_method, mul3_pte,
                                                  mul3_build, tmp_path):
    bad = edit_plan(mul3_pte, str(tmp_path / "bad.pte"), edit)
    # Minimal verification: the runner's own pre-flight, not ExecuTorch's program verifier, must catch each one.
    proc = run_runner(mul3_build.runner, f"--model_path={bad}", "--verification=minimal")
    assert proc.returncode == 1 and runner_message in proc.stderr, proc.stderr[-2000:]
    with pytest.raises(ValueError, match=re.escape(python_message)):
        load_method(bad)


def test_the_memory_budget_counts_inputs_like_the_runner(load_method, mul3_pte, mul3_build):
    # A budget that holds the planned buffers but not them plus the 24-byte input is refused by both; 24 more is not.
    from flow.program import read

    planned = sum(read(mul3_pte).method().planned_buffer_sizes)
    needed = planned + 2 * 3 * 4
    proc = run_runner(mul3_build.runner, f"--model_path={mul3_pte}", f"--max_memory={planned}")
    assert proc.returncode == 1 and f"the method's buffers and inputs need at least {needed} bytes" in proc.stderr
    with pytest.raises(ValueError, match=f"the method's buffers and inputs need at least {needed} bytes"):
        load_method(mul3_pte, max_memory=planned)
    assert run_runner(mul3_build.runner, f"--model_path={mul3_pte}", f"--max_memory={needed}").returncode == 0
    assert load_method(mul3_pte, max_memory=needed).execute([torch.ones(2, 3)])[0].tolist() == [[3.0] * 3] * 2


def test_checked_loading_refuses_a_file_that_is_not_a_program(load_method, tmp_path):
    garbage = tmp_path / "garbage.pte"
    garbage.write_bytes(b"\0" * 64)
    with pytest.raises(ValueError, match="not an ExecuTorch program"):
        load_method(garbage)


def test_first_executions_from_several_threads_at_once_do_not_deadlock(mul3_build, tmp_path):
    # Four threads meet at a barrier, then each makes the process's first parallel kernel call. Before the loader made
    # ExecuTorch's threadpool, this hung every time: the pool's initializer logs through Python and waits for the GIL
    # that another caller holds while it waits for the initializer.
    import subprocess

    try:
        result = run_in_fresh_python(f"""
            import threading, torch
            from flow.export import CallOp, export_to_pte
            from flow.registration import register_with_pytorch
            from flow import declarations
            from flow.runtime import load_kernel_library, load_method_checked
            load_kernel_library({mul3_build.kernel_lib!r})
            register_with_pytorch([declarations.find("my_ops::mul3")])
            pte = export_to_pte(CallOp(torch.ops.my_ops.mul3.default), (torch.randn(1 << 20),),
                                {str(tmp_path / "big.pte")!r})
            barrier, equal = threading.Barrier(4), []
            def work():
                method, x = load_method_checked(pte), torch.randn(1 << 20)
                barrier.wait()
                (y,) = method.execute([x])
                equal.append(torch.equal(y, x * 3))
            threads = [threading.Thread(target=work) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            result = equal
        """, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("four threads' first executions deadlocked (the threadpool was not made when the library loaded)")
    assert result == [True] * 4
