"""kernel_library.load_kernel_library: one kernel library per process, refused with an error rather than the abort a
second registration of an op would cause."""

from helpers import run_in_fresh_python


def test_a_second_kernel_library_is_refused_and_the_first_keeps_working(mul3_build, mul4_build, mul3_pte):
    result = run_in_fresh_python(f"""
        import torch
        from kernel_library import load_kernel_library
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
