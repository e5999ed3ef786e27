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


def dim_order(t: torch.Tensor) -> list[int]:
    """The order of t's dimensions in memory, outermost first (ExecuTorch's dim order): [0, 2, 3, 1] for
    channels-last. Ties (size-1 dimensions) keep their logical order, as ExecuTorch does."""
    return sorted(range(t.dim()), key=lambda d: (-t.stride(d), d))


def tensor_to_file(t: torch.Tensor, path: str) -> None:
    """Writes t's elements in its own memory order (the runner reads raw bytes in the program's dim order)."""
    with open(path, "wb") as f:
        f.write(t.permute(dim_order(t)).contiguous().view(torch.uint8).numpy().tobytes())


def _printed_outputs(stdout: str) -> list[tuple[list[int], list[int] | None]]:
    # The runner prints "Output 0: Float[2, 3], values: [...]", with " dim_order=[0, 2, 3, 1]" when not row-major.
    parse = lambda text: [int(d) for d in text.split(",") if d.strip()]  # noqa: E731
    return [(parse(m.group(1)), parse(m.group(2)) if m.group(2) is not None else None)
            for m in re.finditer(r"^Output \d+: \w+\[([^\]]*)\](?: dim_order=\[([^\]]*)\])?", stdout, re.M)]


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
        outputs = []
        for path, like, (shape, order) in zip(out_files, expected_like, _printed_outputs(proc.stdout)):
            with open(path, "rb") as f:
                data = bytearray(f.read())
            flat = torch.frombuffer(data, dtype=like.dtype) if data else torch.empty(0, dtype=like.dtype)
            order = order or list(range(len(shape)))
            # The bytes are in memory order: view them with that order's shape, then put the dimensions back.
            in_memory = flat.reshape([shape[d] for d in order])
            outputs.append(in_memory.permute([order.index(d) for d in range(len(shape))]))
        return outputs


def compare_outputs(actual: Sequence[torch.Tensor], expected: Sequence[torch.Tensor], *, exact: bool) -> list[str]:
    """Returns one line per mismatch (empty when all match). exact=True: the same values bit for bit (NaN equals NaN),
    what ops with one rounding per element promise. exact=False: integers exact, floats within torch.testing's
    per-dtype tolerance (float32: rtol 1.3e-6, atol 1e-5; float16: 1e-3, 1e-5; bfloat16: 1.6e-2, 1e-5)."""
    problems = []
    if len(actual) != len(expected):
        return [f"got {len(actual)} outputs, expected {len(expected)}"]
    tolerance = dict(rtol=0, atol=0) if exact else dict(rtol=None, atol=None)
    for i, (a, e) in enumerate(zip(actual, expected)):
        try:
            torch.testing.assert_close(a, e, **tolerance, equal_nan=True)
        except AssertionError as err:
            problems.append(f"output {i}: {err}")
    return problems


def _example(number: int, so_library: str | None) -> tuple[Callable, torch.Tensor]:
    if number == 1:
        import custom_ops_1

        return torch.ops.my_ops.mul3.default, torch.randn_like(custom_ops_1.example_inputs()[0])
    import custom_ops_2

    custom_ops_2.load_aot_library(so_library)
    return torch.ops.my_ops.mul4.default, torch.randn_like(custom_ops_2.example_inputs()[0])


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
    problems = compare_outputs(actual, expected, exact=True)  # both ops promise eager's exact bits
    print(f"input   {x.flatten()[:6].tolist()}")
    print(f"runner  {actual[0].flatten()[:6].tolist()}")
    print(f"eager   {expected[0].flatten()[:6].tolist()}")
    for line in problems:
        print(f"MISMATCH {line}", file=sys.stderr)
    print("outputs match PyTorch eager" if not problems else "outputs DIFFER from PyTorch eager")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
