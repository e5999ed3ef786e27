"""Benchmark: my_ops::mul3.out against ExecuTorch's own optimized aten kernels for `x * 3` and against a memcpy of the
same bytes, for every dtype and a range of sizes, side by side in one run of the same runner.

Programs are exported with graph inputs left out of memory planning, so an execution reads the caller's buffer and
the time is the kernel's, not an input copy's. Each round runs aten, custom and memcpy once per (dtype, size), in that
order; a round's figure is the median over its executions, and the table gives the median over rounds with the
min-max spread of the ratios across rounds. memcpy copies the op's bytes (reads n, writes n, like the op) on all
threads of the same threadpool. Run it with `bash test_custom_ops.sh bench` (builds what it needs); it writes the
table to stdout and a plot (GB/s vs size) to --plot.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys

import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from flow.dtypes import ELEMENTWISE_DTYPES as DTYPES  # noqa: E402  (every dtype the kernels implement)
from measure import execution_times, executions_for, memcpy_times, spread  # noqa: E402  (benchmark/measure.py)

SIZES = [16, 16 * 1024, 4 * 1024 * 1024]
LARGE = 64 * 1024 * 1024  # float32 only: 512 MiB of traffic, past any cache here


def goals(dtype: str, n: int) -> tuple[float | None, float | None]:
    """(minimum speedup over aten, minimum fraction of memcpy bandwidth) for one row."""
    if n == LARGE:
        return None, 0.75
    if n == 4 * 1024 * 1024:
        return 1.0, 0.75
    if dtype == "float32" and n == 16 * 1024:
        return 1.0, None
    if dtype == "float32" and n == 16:
        return 1.0, None
    return None, None


class AtenMul3(torch.nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.factor = 3.0 if dtype.is_floating_point else 3  # the scalar a user writes for this dtype

    def forward(self, x):
        return x * self.factor


def export_programs(out_dir: str, cases) -> dict[tuple[str, str, int], str]:
    from flow import declarations, registration
    from flow.export import CallOp, export_to_pte

    registration.register_with_pytorch([declarations.find("my_ops::mul3")])

    programs = {}
    for dtype_name, n in cases:
        dtype = getattr(torch, dtype_name)
        for side, model in (("aten", AtenMul3(dtype)), ("custom", CallOp(torch.ops.my_ops.mul3.default))):
            path = os.path.join(out_dir, f"{side}_{dtype_name}_{n}.pte")
            if not os.path.exists(path):
                export_to_pte(model, (torch.ones(n, dtype=dtype),), path, plan_graph_inputs=False)
            programs[(side, dtype_name, n)] = path
    return programs


def plot(rows, path: str, machine: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    f32 = sorted((r for r in rows if r["dtype"] == "float32"), key=lambda r: r["n"])
    for key, label, style in (("custom", "my_ops::mul3.out", "o-"), ("aten", "aten::mul.out", "s--"),
                              ("memcpy", "memcpy (same bytes)", "^:")):
        left.plot([r["n"] for r in f32], [r[f"gbps_{key}"] for r in f32], style, label=label)
    left.set_xscale("log", base=2)
    left.set_xlabel("float32 elements")
    left.set_ylabel("GB/s (bytes read + written)")
    left.set_title("float32: GB/s vs size")
    left.legend()
    left.grid(True, alpha=0.3)
    big = [r for r in rows if r["n"] == 4 * 1024 * 1024]
    xs = range(len(big))
    width = 0.27
    for offset, key, label in ((-width, "custom", "my_ops::mul3.out"), (0, "aten", "aten::mul.out"),
                               (width, "memcpy", "memcpy")):
        right.bar([x + offset for x in xs], [r[f"gbps_{key}"] for r in big], width, label=label)
    right.set_xticks(list(xs), [r["dtype"] for r in big], rotation=30)
    right.set_ylabel("GB/s")
    right.set_title("4M elements, every dtype")
    right.legend()
    fig.suptitle(f"median of rounds, {machine}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build_dir", default=os.path.join(REPO_ROOT, "cmake-out", "bench"),
                        help="a build with -DCUSTOM_OPS_BUILD_BENCHMARK=ON (bash test_custom_ops.sh bench makes it)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--plot", default=os.path.join(REPO_ROOT, "cmake-out", "bench", "benchmark.png"))
    parser.add_argument("--no_large", action="store_true", help="skip the 64M float32 row")
    args = parser.parse_args()

    runner = os.path.join(args.build_dir, "custom_ops_executor_runner")
    memcpy_binary = os.path.join(args.build_dir, "memcpy_bandwidth")
    out_dir = os.path.join(REPO_ROOT, "cmake-out", "bench", "programs")
    os.makedirs(out_dir, exist_ok=True)
    dtypes = args.dtypes.split(",")
    cases = [(d, n) for d in dtypes for n in SIZES] + ([] if args.no_large or "float32" not in dtypes
                                                      else [("float32", LARGE)])
    programs = export_programs(out_dir, cases)

    samples = {case: {"aten": [], "custom": [], "memcpy": []} for case in cases}
    for _ in range(args.rounds):
        for dtype_name, n in cases:
            nbytes = n * getattr(torch, dtype_name).itemsize
            executions = executions_for(nbytes)
            for side in ("aten", "custom"):
                times = execution_times(runner, programs[(side, dtype_name, n)], executions)
                samples[(dtype_name, n)][side].append(statistics.median(times))
            samples[(dtype_name, n)]["memcpy"] += memcpy_times(memcpy_binary, nbytes, executions)

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    machine = f"{cpu}, {os.cpu_count()} cores"
    print(f"machine: {machine}; {args.rounds} rounds; per round the median execution; ratios min-max over rounds")
    print(f"{'dtype':>9} | {'elements':>10} | {'aten us':>9} | {'custom us':>9} | {'vs aten':>15} | "
          f"{'GB/s':>6} | {'of memcpy':>15} | goal")
    rows, failures = [], []
    for dtype_name, n in cases:
        s = samples[(dtype_name, n)]
        nbytes = n * getattr(torch, dtype_name).itemsize
        speedups = [a / c for a, c in zip(s["aten"], s["custom"])]
        fractions = [m / c for m, c in zip(s["memcpy"], s["custom"])]
        aten, custom, mem = (statistics.median(s[k]) for k in ("aten", "custom", "memcpy"))
        min_speedup, min_fraction = goals(dtype_name, n)
        speedup, fraction = statistics.median(speedups), statistics.median(fractions)
        met = (min_speedup is None or speedup >= min_speedup) and (min_fraction is None or fraction >= min_fraction)
        goal = " and ".join(g for g in (f">= {min_speedup}x aten" if min_speedup else "",
                                        f">= {min_fraction:.0%} memcpy" if min_fraction else "") if g)
        if goal and not met:
            failures.append((dtype_name, n))
        gbps = lambda us: 2 * nbytes / us / 1e3  # noqa: E731  (read + write)
        rows.append({"dtype": dtype_name, "n": n, "gbps_custom": gbps(custom), "gbps_aten": gbps(aten),
                     "gbps_memcpy": gbps(mem)})
        print(f"{dtype_name:>9} | {n:>10} | {aten:>9.3f} | {custom:>9.3f} | {speedup:>5.2f}x ({spread(speedups):>9}) | "
              f"{gbps(custom):>6.1f} | {fraction:>5.0%} ({spread(fractions):>9}) | "
              f"{(goal + (': met' if met else ': NOT met')) if goal else '-'}")
    if args.plot:
        os.makedirs(os.path.dirname(os.path.abspath(args.plot)), exist_ok=True)
        plot(rows, args.plot, machine)
        print(f"plot: {args.plot}")
    print(f"goals: {'all met' if not failures else 'NOT met for ' + ', '.join(f'{d} {n}' for d, n in failures)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
