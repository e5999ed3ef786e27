"""Benchmark: my_ops::mul3.out against ExecuTorch's own optimized aten::mul.out (a program computing x * 3), side by
side in one run of the same runner, plus a memcpy of the same bytes on all threads as the bandwidth ceiling.

Programs are exported with graph inputs left out of memory planning, so each execution reads the caller's buffer and
the time is the kernel's, not an input copy's. Rounds alternate between the two programs; each side's figure is the
median over all its executions. Run it with `bash test_custom_ops.sh bench` (builds what it needs).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys

import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

# elements -> executions per round (enough for a stable median, bounded total time)
SIZES = {16: 20000, 16 * 1024: 5000, 4 * 1024 * 1024: 300}
GOALS = {  # elements -> (minimum speedup over aten, minimum fraction of memcpy bandwidth)
    4 * 1024 * 1024: (1.5, 0.75),
    16 * 1024: (1.0, None),
    16: (1.0, None),
}


class AtenMul3(torch.nn.Module):
    def forward(self, x):
        return x * 3.0  # a float scalar: an int one adds a dtype-conversion op to the program


def export_programs(out_dir: str) -> dict[tuple[str, int], str]:
    import custom_ops_1  # noqa: F401
    from pte_export import CallOp, export_to_pte, operators_in_program

    programs = {}
    for n in SIZES:
        for name, model in (("aten", AtenMul3()), ("custom", CallOp(torch.ops.my_ops.mul3.default))):
            path = os.path.join(out_dir, f"{name}_mul3_{n}.pte")
            if not os.path.exists(path):
                export_to_pte(model, (torch.randn(n),), path, plan_graph_inputs=False)
            programs[(name, n)] = path
    aten_ops = operators_in_program(programs[("aten", 16)])
    assert aten_ops == ["aten::mul.out"], f"the aten side must be a single aten::mul.out, got {aten_ops}"
    return programs


def execution_times(runner: str, pte: str, executions: int) -> list[float]:
    proc = subprocess.run([runner, f"--model_path={pte}", f"--num_executions={executions}"],
                          capture_output=True, text=True, check=True)
    times = [float(t) for t in re.findall(r"^Execution \d+: ([\d.]+) us$", proc.stdout, re.M)]
    return times[min(10, len(times) // 10):]  # drop warm-up executions


def memcpy_time_us(memcpy_binary: str, nbytes: int, repetitions: int) -> float:
    proc = subprocess.run([memcpy_binary, str(nbytes), str(repetitions)], capture_output=True, text=True, check=True)
    return float(re.search(r"median ([\d.]+) us", proc.stdout).group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build_dir", default=os.path.join(REPO_ROOT, "cmake-out", "bench"),
                        help="a build with -DCUSTOM_OPS_BUILD_BENCHMARK=ON (bash test_custom_ops.sh bench makes it)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    runner = os.path.join(args.build_dir, "custom_ops_executor_runner")
    memcpy_binary = os.path.join(args.build_dir, "memcpy_bandwidth")
    out_dir = os.path.join(REPO_ROOT, "cmake-out", "bench")
    os.makedirs(out_dir, exist_ok=True)
    programs = export_programs(out_dir)

    times: dict[tuple[str, int], list[float]] = {key: [] for key in programs}
    memcpy_us: list[float] = []
    big = max(SIZES)
    for _ in range(args.rounds):
        for n, executions in SIZES.items():
            for name in ("aten", "custom"):
                times[(name, n)] += execution_times(runner, programs[(name, n)], executions)
        memcpy_us.append(memcpy_time_us(memcpy_binary, big * 4, SIZES[big]))

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    print(f"machine: {cpu}, {os.cpu_count()} cores; float32; median per execution over {args.rounds} alternating rounds")
    print(f"{'elements':>10} | {'aten::mul.out':>14} | {'my_ops::mul3.out':>16} | {'speedup':>7} | "
          f"{'GB/s (custom)':>13} | {'of memcpy':>9} | goal")
    memcpy_median = statistics.median(memcpy_us)
    failures = []
    for n in SIZES:
        aten, custom = statistics.median(times[("aten", n)]), statistics.median(times[("custom", n)])
        speedup = aten / custom
        gbps = 2 * n * 4 / custom / 1e3  # read + write bytes
        min_speedup, min_memcpy = GOALS[n]
        memcpy_fraction = memcpy_median / custom if n == big else None
        ok = speedup >= min_speedup and (min_memcpy is None or memcpy_fraction >= min_memcpy)
        goal = f">= {min_speedup}x" + (f", >= {min_memcpy:.0%} memcpy" if min_memcpy else "")
        if not ok:
            failures.append(n)
        print(f"{n:>10} | {aten:>11.3f} us | {custom:>13.3f} us | {speedup:>6.2f}x | {gbps:>13.1f} | "
              f"{(f'{memcpy_fraction:.0%}' if memcpy_fraction else '-'):>9} | {goal}: {'met' if ok else 'NOT met'}")
    print(f"{'memcpy':>10} | {big * 4} bytes on {os.cpu_count()} threads: {memcpy_median:.3f} us "
          f"({2 * big * 4 / memcpy_median / 1e3:.1f} GB/s read + write)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
