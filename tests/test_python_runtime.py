"""python_runtime: one kernel library per process (a second is refused with an error rather than the abort a second
registration of an op would cause), and programs checked before the runtime sees them."""

import re

import pytest

from helpers import run_in_fresh_python


def test_a_second_kernel_library_is_refused_and_the_first_keeps_working(mul3_build, mul4_build, mul3_pte):
    result = run_in_fresh_python(f"""
        import torch
        from python_runtime import load_kernel_library
        load_kernel_library({mul3_build.kernel_lib!r})
        load_kernel_library({mul3_build.kernel_lib!r})  # the same library again: nothing to do
        try:
            load_kernel_library({mul4_build.kernel_lib!r})
            error = None
        except RuntimeError as err:
            error = str(err)
        from executorch.runtime import Runtime
        (y,) = Runtime.get().load_program({mul3_pte!r}).load_method("forward").execute([torch.ones(2, 3)])
        result = [error, y.tolist()]
    """)
    error, values = result
    assert error is not None and "is already loaded in this process" in error and "aborts the process" in error
    assert values == [[3.0] * 3] * 2


def test_checked_loading_runs_a_valid_program(et_runtime, mul3_pte):
    import torch

    from python_runtime import load_method_checked

    (y,) = load_method_checked(mul3_pte).execute([torch.ones(2, 3)])
    assert y.tolist() == [[3.0] * 3] * 2


@pytest.mark.parametrize("edit, message", [
    (lambda plan: plan.outputs.__setitem__(0, 2**31 - 1), "output 0 refers to value 2147483647, but the method has"),
    (lambda plan: plan.inputs.__setitem__(0, 99), "input 0 refers to value 99"),
    (lambda plan: plan.non_const_buffer_sizes.__setitem__(-1, 2**40), "need 1099511627776 bytes, more than"),
])
def test_checked_loading_refuses_what_would_abort_or_exhaust_the_process(edit, message, mul3_pte, tmp_path):
    from test_untrusted_programs import _edit_plan

    from python_runtime import load_method_checked

    bad = _edit_plan(mul3_pte, str(tmp_path / "bad.pte"), edit)
    with pytest.raises(ValueError, match=re.escape(message)):
        load_method_checked(bad)


def test_checked_loading_refuses_a_file_that_is_not_a_program(tmp_path):
    from python_runtime import load_method_checked

    garbage = tmp_path / "garbage.pte"
    garbage.write_bytes(b"\0" * 64)
    with pytest.raises(ValueError, match="not an ExecuTorch program"):
        load_method_checked(garbage)
