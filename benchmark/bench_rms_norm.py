"""Benchmark: my_ops::rms_norm.out against the same math written as ATen ops (x * rsqrt(mean(x*x, -1) + eps) * w,
exported and run by ExecuTorch's optimized aten kernels) and against a memcpy of the input's bytes, side by side in
one run of the same runner. `bash test_custom_ops.sh bench rms_norm` builds what it needs and runs it.

Programs leave graph inputs out of memory planning (the time is the kernels', not an input copy's). Each round runs
decomposed, custom and memcpy once per case; a round's figure is the median over its executions; the table gives the
median over rounds and the min-max spread of the ratios across rounds. memcpy copies the input's bytes (reads n,
writes n: what the op must at least move) on all threads of the same threadpool.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from measure import execution_times, executions_for, memcpy_times, spread  # noqa: E402  (benchmark/measure.py)

EPS = 1e-6
PAST_CACHE = [8192, 4096]  # 128 MiB of float32: past the last-level cache of any machine this runs on
CASES = [("float32", [64, 4096]), ("bfloat16", [64, 4096]), ("float32", [1, 4096]), ("bfloat16", [1, 4096]),
         ("float32", PAST_CACHE), ("bfloat16", PAST_CACHE)]


def goals(dtype: str, shape: list[int]) -> tuple[float | None, float | None]:
    """(minimum speedup over the decomposed graph, minimum fraction of memcpy bandwidth) for one row."""
    if shape == PAST_CACHE:
        return None, 0.6
    if dtype == "float32" and shape == [64, 4096]:
        return 3.0, None
    return None, None


class Decomposed(torch.nn.Module):
    def forward(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


class Custom(torch.nn.Module):
    def forward(self, x, w):
        return torch.ops.my_ops.rms_norm(x, w, EPS)


def main() -> int:
    from flow import declarations, registration
    from flow.export import export_to_pte

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build_dir", default=os.path.join(REPO_ROOT, "cmake-out", "bench"))
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    registration.register_with_pytorch([declarations.find("rms_norm")],
                                       aot_library=os.path.join(args.build_dir, "libcustom_ops_aot_lib.so"))
    runner = os.path.join(args.build_dir, "custom_ops_executor_runner")
    out_dir = os.path.join(args.build_dir, "programs")
    os.makedirs(out_dir, exist_ok=True)

    programs = {}
    for dtype_name, shape in CASES:
        dtype = getattr(torch, dtype_name)
        inputs = (torch.ones(shape, dtype=dtype), torch.ones(shape[-1], dtype=dtype))
        for side, model in (("decomposed", Decomposed()), ("custom", Custom())):
            path = os.path.join(out_dir, f"rms_norm_{side}_{dtype_name}_{'x'.join(map(str, shape))}.pte")
            if not os.path.exists(path):
                export_to_pte(model, inputs, path, plan_graph_inputs=False)
            programs[(side, dtype_name, tuple(shape))] = path

    samples = {(d, tuple(s)): {"decomposed": [], "custom": [], "memcpy": []} for d, s in CASES}
    for _ in range(args.rounds):
        for dtype_name, shape in CASES:
            nbytes = shape[0] * shape[1] * getattr(torch, dtype_name).itemsize
            executions = executions_for(2 * nbytes)
            for side in ("decomposed", "custom"):
                times = execution_times(runner, programs[(side, dtype_name, tuple(shape))], executions)
                samples[(dtype_name, tuple(shape))][side].append(statistics.median(times))
            samples[(dtype_name, tuple(shape))]["memcpy"] += memcpy_times(
                os.path.join(args.build_dir, "memcpy_bandwidth"), nbytes, executions)

    print(f"rms_norm, {args.rounds} rounds; per round the median execution; ratios min-max over rounds")
    print(f"{'dtype':>9} | {'shape':>10} | {'ATen ops us':>11} | {'custom us':>9} | {'vs ATen ops':>17} | "
          f"{'of memcpy':>15} | goal")
    failures = []
    for dtype_name, shape in CASES:
        s = samples[(dtype_name, tuple(shape))]
        speedups = [d / c for d, c in zip(s["decomposed"], s["custom"])]
        fractions = [m / c for m, c in zip(s["memcpy"], s["custom"])]
        decomposed, custom = statistics.median(s["decomposed"]), statistics.median(s["custom"])
        speedup, fraction = statistics.median(speedups), statistics.median(fractions)
        min_speedup, min_fraction = goals(dtype_name, shape)
        met = (min_speedup is None or speedup >= min_speedup) and (min_fraction is None or fraction >= min_fraction)
        goal = " and ".join(g for g in (f">= {min_speedup}x ATen ops" if min_speedup else "",
                                        f">= {min_fraction:.0%} memcpy" if min_fraction else "") if g)
        if goal and not met:
            failures.append(f"{dtype_name} {shape}")
        print(f"{dtype_name:>9} | {'x'.join(map(str, shape)):>10} | {decomposed:>11.2f} | {custom:>9.2f} | "
              f"{speedup:>6.2f}x ({spread(speedups):>9}) | {fraction:>5.0%} ({spread(fractions):>9}) | "
              f"{(goal + (': met' if met else ': NOT met')) if goal else '-'}")
    print(f"goals: {'all met' if not failures else 'NOT met for ' + ', '.join(failures)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
