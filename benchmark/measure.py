"""What every benchmark here measures with: the runner's execution times of a program, a memcpy (or a read) of the
same bytes on ExecuTorch's threadpool (benchmark/memcpy_bandwidth.cpp), how many executions a size needs, and the
min-max spread a table prints beside each median. The benchmarks (benchmark/bench_*.py) import it by its file name:
each runs as a script with benchmark/ on its path."""

from __future__ import annotations

import re
import subprocess

TARGET_EXECUTION_SECONDS = 0.05  # per (program, round): enough executions for a stable median


def execution_times(runner: str, pte: str, executions: int) -> list[float]:
    proc = subprocess.run([runner, f"--model_path={pte}", f"--num_executions={executions}"],
                          capture_output=True, text=True, check=True)
    times = [float(t) for t in re.findall(r"^Execution \d+: ([\d.]+) us$", proc.stdout, re.M)]
    return times[min(10, len(times) // 10):]  # drop warm-up executions


def memcpy_times(binary: str, nbytes: int, repetitions: int, read_only: bool = False,
                 threads: int | None = None) -> list[float]:
    """The median time (us) of a memcpy of nbytes on every thread of ExecuTorch's pool; read_only: of reading them
    (on `threads` of them: 1, the calling thread alone)."""
    extra = (["read"] + ([str(threads)] if threads else [])) if read_only else []
    proc = subprocess.run([binary, str(nbytes), str(repetitions), *extra], capture_output=True, text=True, check=True)
    return [float(re.search(r"median ([\d.]+) us", proc.stdout).group(1))]


def executions_for(nbytes: int) -> int:
    estimate_us = 1.0 + nbytes / 20e3  # ~20 GB/s, a pessimistic guess to size the loop
    return int(min(20000, max(20, TARGET_EXECUTION_SECONDS * 1e6 / estimate_us)))


def spread(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"
