"""Driving the C++ runner (custom_ops_executor_runner) from Python: tensors cross as raw little-endian files
(--inputs/--outputs) in each tensor's memory order, its dim order (row-major unless the program declares another)."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from typing import Sequence

import torch

from flow.runtime import COUNT_PATHS, PATH_COUNTERS


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


def printed_path_counts(stderr: str) -> dict[str, int]:
    """The path counters a runner started with COUNT_PATHS printed (runner/program_runner.h's print_path_counts)."""
    lines = [line for line in stderr.splitlines() if line.startswith("path counts:")]
    if not lines:
        raise RunnerError("the runner printed no path counts: its kernel library has no counters, or it was not "
                          f"started with {COUNT_PATHS}")
    values = [int(v) for v in lines[-1].removeprefix("path counts:").split()]
    if len(values) < len(PATH_COUNTERS):
        raise RunnerError(f"the runner printed {len(values)} path counts, fewer than flow.runtime's "
                          f"{len(PATH_COUNTERS)}: a runner built before the counters were added")
    return dict(zip(PATH_COUNTERS, values))


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
    num_executions: int = 1,
    extra_args: Sequence[str] = (),
    emulator: Sequence[str] = (),
    later_inputs: Sequence[Sequence[torch.Tensor]] = (),
    path_counts: dict[str, int] | None = None,
) -> list[torch.Tensor]:
    """Runs the program's forward on `inputs` (num_executions times; the outputs are the last execution's) and returns
    its outputs read back with the dtypes of `expected_like`.

    later_inputs: the inputs of executions 2, 3, ... for a program with state (the runner takes the groups in turn).

    path_counts: a dict the kernels' path counters (flow.runtime.PATH_COUNTERS) are put in, counted over the runner's
    whole run.

    pass_shapes=True sends each input's shape (--input_shapes), which programs with dynamic dimensions need.
    emulator: a command that runs the runner, for one built for another architecture (e.g. qemu-aarch64 -L ...).
    """
    with tempfile.TemporaryDirectory() as tmp:
        out_files = [os.path.join(tmp, f"output{i}.bin") for i in range(len(expected_like))]
        cmd = [*emulator, runner, f"--model_path={pte_path}", *input_flags(tmp, [inputs, *later_inputs]),
               f"--outputs={','.join(out_files)}", f"--num_executions={num_executions}"]
        if pass_shapes:
            cmd.append("--input_shapes=" + ",".join("x".join(map(str, t.shape)) for t in inputs))
        return run_and_read_outputs([*cmd, *extra_args], out_files, expected_like, path_counts)


def input_flags(directory: str, groups: Sequence[Sequence[torch.Tensor]]) -> list[str]:
    """Writes each execution's inputs into `directory`; one --inputs flag per execution's group."""
    flags = []
    for g, group in enumerate(groups):
        files = [os.path.join(directory, f"input{g}_{i}.bin") for i in range(len(group))]
        for t, path in zip(group, files):
            tensor_to_file(t, path)
        flags.append(f"--inputs={','.join(files)}")
    return flags


def run_and_read_outputs(cmd: Sequence[str], out_files: Sequence[str], expected_like: Sequence[torch.Tensor],
                         path_counts: dict[str, int] | None = None) -> list[torch.Tensor]:
    """Runs a runner command that writes its outputs to `out_files` and prints their shapes; reads them back with the
    dtypes of `expected_like` (and, given a dict, the path counters into it)."""
    env = None if path_counts is None else dict(os.environ, **COUNT_PATHS)
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=300, env=env)
    if proc.returncode != 0:
        raise RunnerError(f"runner exited {proc.returncode}:\n{proc.stderr}{proc.stdout}")
    if path_counts is not None:
        path_counts.update(printed_path_counts(proc.stderr))
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
