"""The runner on bad input (and its ASan+UBSan build): a clear one-line error and a non-zero exit, never a crash (no
signal) or a hang."""

import os

import pytest
import torch

from helpers import run_runner
from flow.runner import tensor_to_file


def assert_clean_failure(proc, *fragments):
    assert proc.returncode == 1, f"expected exit 1, got {proc.returncode}\n{proc.stderr}"
    error_lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(error_lines) == 1, proc.stderr
    for fragment in fragments:
        assert fragment in error_lines[0], error_lines[0]


def test_missing_program_file(any_runner, tmp_path):
    proc = run_runner(any_runner, f"--model_path={tmp_path / 'missing.pte'}")
    assert_clean_failure(proc, "cannot open model file", "missing.pte", "No such file or directory")


def test_garbage_program_file(any_runner, tmp_path):
    garbage = tmp_path / "garbage.pte"
    garbage.write_bytes(os.urandom(4096))
    assert_clean_failure(run_runner(any_runner, f"--model_path={garbage}"),
                         "is not a loadable ExecuTorch program", "Re-export")


@pytest.mark.parametrize("keep_fraction", [0.1, 0.5, 0.9])
def test_truncated_program_file(any_runner, mul3_pte, tmp_path, keep_fraction):
    data = open(mul3_pte, "rb").read()
    truncated = tmp_path / "truncated.pte"
    truncated.write_bytes(data[: int(len(data) * keep_fraction)])
    proc = run_runner(any_runner, f"--model_path={truncated}")
    assert proc.returncode == 1, proc.stderr
    assert "error: " in proc.stderr


def test_input_file_of_the_wrong_size(any_runner, mul3_pte, tmp_path):
    wrong = tmp_path / "wrong.bin"
    tensor_to_file(torch.ones(5), str(wrong))  # the program takes float32[2, 3] = 24 bytes
    proc = run_runner(any_runner, f"--model_path={mul3_pte}", f"--inputs={wrong}")
    assert_clean_failure(proc, "has 20 bytes, expected 24", "float32[2, 3]")


def test_missing_input_file(any_runner, mul3_pte, tmp_path):
    proc = run_runner(any_runner, f"--model_path={mul3_pte}", f"--inputs={tmp_path / 'nope.bin'}")
    assert_clean_failure(proc, "cannot open input file")


def test_wrong_number_of_input_files(any_runner, mul3_pte, tmp_path):
    a = tmp_path / "a.bin"
    tensor_to_file(torch.ones(2, 3), str(a))
    proc = run_runner(any_runner, f"--model_path={mul3_pte}", f"--inputs={a},{a}")
    assert_clean_failure(proc, "names 2 file(s) but method 'forward' takes 1 input(s)")


def test_unknown_method(any_runner, mul3_pte):
    proc = run_runner(any_runner, f"--model_path={mul3_pte}", "--method=backward")
    assert_clean_failure(proc, "no method 'backward'", "forward")


def test_bad_command_line(any_runner):
    proc = run_runner(any_runner, "--frobnicate=1")
    assert proc.returncode == 2
    assert "error: unknown option --frobnicate" in proc.stderr
    assert "usage:" in proc.stderr


@pytest.mark.parametrize("flag, message", [
    ("--input_shapes=2147483648", "--input_shapes entry '2147483648' is not a shape like 2x3"),
    ("--input_shapes=4294967298x3", "--input_shapes entry '4294967298x3' is not a shape like 2x3"),
    ("--input_shapes=2x3junk", "--input_shapes entry '2x3junk' is not a shape like 2x3"),
    ("--input_shapes=-2x3", "--input_shapes entry '-2x3' is not a shape like 2x3"),
    ("--num_executions=99999999999999999999", "--num_executions must be an integer from 1 to 1000000"),
    ("--num_executions=-1", "--num_executions must be an integer from 1 to 1000000"),
    ("--num_executions=1000001", "--num_executions must be an integer from 1 to 1000000"),
    ("--num_executions=0", "--num_executions must be an integer from 1 to 1000000"),
    ("--num_executions=1e3", "--num_executions must be an integer from 1 to 1000000"),
    ("--max_memory=12Q", "--max_memory must be a positive byte count"),
    ("--verification=none", "--verification must be internal_consistency or minimal"),
])
def test_bad_numbers_on_the_command_line_exit_2_naming_the_flag(flag, message, any_runner, mul3_pte):
    proc = run_runner(any_runner, f"--model_path={mul3_pte}", flag)
    assert proc.returncode == 2, proc.stderr
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert message in line


def test_a_shape_beyond_the_memory_budget_is_refused_before_allocating(any_runner, mul3_pte):
    proc = run_runner(any_runner, f"--model_path={mul3_pte}", "--input_shapes=100000x100000")
    assert_clean_failure(proc, "input 0 of shape [100000, 100000] needs 40000000000 bytes, more than --max_memory")
