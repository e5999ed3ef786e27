"""Bad input reaching the runtime kernels: each check in kernel_helpers/multiply_by_constant.h fails the method with a message that
names the problem and the fix; the runner prints it and exits 1, the Python runtime raises; nothing aborts.

No export produces such programs, so each is a valid program whose output tensor was rewritten (pte_surgery)."""

import pytest
import torch

from helpers import run_runner
from pte_surgery import rewrite_output_tensor

CASES = {
    "dtype mismatch": (dict(scalar_type="INT"),
                       "my_ops::mul3.out: output has dtype int32 but input has float32; they must match"),
    "non-resizable output of the wrong shape": (
        dict(sizes=[3, 2], static=True),
        "my_ops::mul3.out: output has shape [3, 2] and cannot be resized to [2, 3]"),
    "different dim order": (dict(dim_order=[1, 0]),
                            "my_ops::mul3.out: input and output have different dim orders"),
}


@pytest.mark.parametrize("case", CASES)
def test_runner_prints_the_kernel_error_and_exits_1(case, mul3_build, mul3_pte, tmp_path):
    changes, message = CASES[case]
    bad = rewrite_output_tensor(mul3_pte, str(tmp_path / "bad.pte"), **changes)
    proc = run_runner(mul3_build.runner, f"--model_path={bad}")
    assert proc.returncode == 1, proc.stderr  # an abort would be -6, a crash -11
    (error_line,) = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert error_line.startswith("error: executing method 'forward' failed: Error::InvalidArgument")
    assert message in proc.stderr


@pytest.mark.parametrize("case", CASES)
def test_python_runtime_raises_instead_of_aborting(case, load_method, mul3_pte, tmp_path, capfd):
    changes, message = CASES[case]
    bad = rewrite_output_tensor(mul3_pte, str(tmp_path / "bad.pte"), **changes)
    method = load_method(bad)
    with pytest.raises(RuntimeError, match="failed with error 0x12"):  # InvalidArgument
        method.execute([torch.randn(2, 3)])
    assert message in capfd.readouterr().err  # ExecuTorch's log, written by the kernel
    # The process is still healthy: a good program runs right after.
    (y,) = load_method(mul3_pte).execute([torch.ones(2, 3)])
    assert y.tolist() == [[3.0] * 3] * 2
