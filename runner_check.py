"""Runs a .pte in the built C++ runner and checks its outputs against PyTorch eager: the flow's last step.

test_custom_ops.sh calls it after each build (`python runner_check.py --example 1 --runner ... --pte ...`); the tests
import run_pte() and compare_outputs(). Tensors cross to the runner as raw little-endian files (--inputs/--outputs).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from typing import Callable, Sequence

import torch


class RunnerError(RuntimeError):
    """The runner exited non-zero; the message holds its error line and log."""


def tensor_to_file(t: torch.Tensor, path: str) -> None:
    with open(path, "wb") as f:
        f.write(t.contiguous().view(torch.uint8).numpy().tobytes())


def _printed_shapes(stdout: str) -> list[list[int]]:
    # The runner prints "Output 0: Float[2, 3], values: [...]".
    return [[int(d) for d in m.group(1).split(",") if d.strip()]
            for m in re.finditer(r"^Output \d+: \w+\[([^\]]*)\]", stdout, re.M)]


def run_pte(
    runner: str,
    pte_path: str,
    inputs: Sequence[torch.Tensor],
    expected_like: Sequence[torch.Tensor],
    *,
    pass_shapes: bool = False,
    extra_args: Sequence[str] = (),
) -> list[torch.Tensor]:
    """Runs the program's forward on `inputs`; returns its outputs read back with the dtypes of `expected_like`.

    pass_shapes=True sends each input's shape (--input_shapes), which programs with dynamic dimensions need.
    """
    with tempfile.TemporaryDirectory() as tmp:
        in_files, out_files = [], []
        for i, t in enumerate(inputs):
            in_files.append(os.path.join(tmp, f"input{i}.bin"))
            tensor_to_file(t, in_files[-1])
        out_files = [os.path.join(tmp, f"output{i}.bin") for i in range(len(expected_like))]
        cmd = [runner, f"--model_path={pte_path}", f"--inputs={','.join(in_files)}", f"--outputs={','.join(out_files)}"]
        if pass_shapes:
            cmd.append("--input_shapes=" + ",".join("x".join(map(str, t.shape)) for t in inputs))
        proc = subprocess.run([*cmd, *extra_args], capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RunnerError(f"runner exited {proc.returncode}:\n{proc.stderr}{proc.stdout}")
        shapes = _printed_shapes(proc.stdout)
        outputs = []
        for path, like, shape in zip(out_files, expected_like, shapes):
            with open(path, "rb") as f:
                data = bytearray(f.read())
            out = torch.frombuffer(data, dtype=like.dtype) if data else torch.empty(0, dtype=like.dtype)
            outputs.append(out.reshape(shape))
        return outputs


def compare_outputs(actual: Sequence[torch.Tensor], expected: Sequence[torch.Tensor]) -> list[str]:
    """Returns one line per mismatch (empty when all match): exact for integers, dtype tolerance for floats."""
    problems = []
    if len(actual) != len(expected):
        return [f"got {len(actual)} outputs, expected {len(expected)}"]
    for i, (a, e) in enumerate(zip(actual, expected)):
        try:
            torch.testing.assert_close(a, e, rtol=None, atol=None, equal_nan=True)
        except AssertionError as err:
            problems.append(f"output {i}: {err}")
    return problems


def _example(number: int, so_library: str | None) -> tuple[Callable, torch.Tensor]:
    if number == 1:
        import custom_ops_1

        return torch.ops.my_ops.mul3.default, torch.randn_like(custom_ops_1.EXAMPLE_INPUTS[0])
    import custom_ops_2

    custom_ops_2.load_aot_library(so_library)
    return torch.ops.my_ops.mul4.default, torch.randn_like(custom_ops_2.EXAMPLE_INPUTS[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--example", type=int, choices=(1, 2), required=True, help="1: mul3, 2: mul4")
    parser.add_argument("--runner", required=True)
    parser.add_argument("--pte", required=True)
    parser.add_argument("--so_library", help="libcustom_ops_aot_lib.so, for example 2's eager reference")
    args = parser.parse_args()

    torch.manual_seed(0)
    reference, x = _example(args.example, args.so_library)
    expected = [reference(x)]
    actual = run_pte(args.runner, args.pte, [x], expected)
    problems = compare_outputs(actual, expected)
    print(f"input   {x.flatten()[:6].tolist()}")
    print(f"runner  {actual[0].flatten()[:6].tolist()}")
    print(f"eager   {expected[0].flatten()[:6].tolist()}")
    for line in problems:
        print(f"MISMATCH {line}", file=sys.stderr)
    print("outputs match PyTorch eager" if not problems else "outputs DIFFER from PyTorch eager")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
