"""Benchmark: my_ops::sdpa_with_cache side by side, in one run, with (1) the same attention written as ATen ops in the
same runner, (2) ExecuTorch's own llama::custom_sdpa in ExecuTorch's Python runtime with both ops' kernels loaded in
the same process, and (3) a memcpy of the K and V bytes a decode step reads. `bash test_custom_ops.sh bench attention`
builds what it needs and runs it.

Every program writes the step's new keys and values into its caches (my_ops::update_cache, or llama::update_cache for
upstream's op: each op in its own cache layout, here the same [B, S, H_kv, D]) and attends over the filled positions.
Each round runs every side once per case; a round's figure is the median over its executions; the table gives the
median over rounds and the min-max spread of the ratios across rounds.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from measure import execution_times, memcpy_times, spread  # noqa: E402  (benchmark/measure.py)

# (length T, filled positions before the step, heads, kv heads, head_dim)
DECODE = [(1, filled, h, kv, d) for filled in (64, 256, 1024, 4096) for h, kv, d in ((8, 8, 64), (32, 32, 128))]
PREFILL = [(t, 0, h, kv, d) for t in (128, 512) for h, kv, d in ((8, 8, 64), (32, 32, 128))]
GQA = [(1, 1024, 32, 8, 128), (1, 4096, 32, 8, 128), (128, 0, 32, 8, 128)]
SMOLLM2 = [(1, 128, 9, 3, 64), (1, 255, 9, 3, 64), (128, 0, 9, 3, 64)]  # the real model's heads (bench real)
CASES = DECODE + PREFILL + GQA + SMOLLM2


class Fused(torch.nn.Module):
    def __init__(self, t, filled, heads, kv_heads, head_dim, dtype):
        super().__init__()
        self.filled = filled
        shape = (1, filled + t, kv_heads, head_dim)
        self.register_buffer("k_cache", torch.zeros(shape, dtype=dtype))
        self.register_buffer("v_cache", torch.zeros(shape, dtype=dtype))

    def forward(self, q, k, v):
        torch.ops.my_ops.update_cache(k, self.k_cache, self.filled)
        torch.ops.my_ops.update_cache(v, self.v_cache, self.filled)
        return torch.ops.my_ops.sdpa_with_cache(q, self.k_cache, self.v_cache, self.filled)


class AtenOps(Fused):
    """The same attention as ATen ops: the filled positions, kv heads repeated, matmul, causal mask, softmax, matmul."""

    def forward(self, q, k, v):
        torch.ops.my_ops.update_cache(k, self.k_cache, self.filled)
        torch.ops.my_ops.update_cache(v, self.v_cache, self.filled)
        t, heads = q.shape[1], q.shape[2]
        end = self.filled + t
        group = heads // self.k_cache.shape[2]
        keys = self.k_cache[:, :end].transpose(1, 2).repeat_interleave(group, dim=1)  # [1, H, end, D]
        values = self.v_cache[:, :end].transpose(1, 2).repeat_interleave(group, dim=1)
        scores = torch.matmul(q.transpose(1, 2), keys.transpose(2, 3)) / math.sqrt(q.shape[3])  # [1, H, T, end]
        allowed = torch.arange(end)[None, :] <= (self.filled + torch.arange(t))[:, None]
        weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
        return torch.matmul(weights, values).transpose(1, 2)


class Upstream(Fused):
    """ExecuTorch's llama ops (executorch.extension.llm.custom_ops), in the same layout."""

    def forward(self, q, k, v):
        torch.ops.llama.update_cache(k, self.k_cache, self.filled)
        torch.ops.llama.update_cache(v, self.v_cache, self.filled)
        return torch.ops.llama.custom_sdpa(q, self.k_cache, self.v_cache, self.filled, None, 0.0, True, None)


def case_name(case, dtype):
    t, filled, heads, kv_heads, head_dim = case
    kind = "decode" if t == 1 else f"prefill {t}"
    return f"{kind} @{filled} {heads}/{kv_heads}x{head_dim} {str(dtype)[6:]}"


def inputs_of(case, dtype):
    t, _, heads, kv_heads, head_dim = case
    generator = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, t, h, head_dim, generator=generator).to(dtype) for h in (heads, kv_heads, kv_heads))


def python_runtime_times(method, inputs, seconds=0.05):
    method.execute(list(inputs))  # warm-up
    times = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(times) < 5:
        start = time.perf_counter()
        method.execute(list(inputs))
        times.append((time.perf_counter() - start) * 1e6)
    return times


def main() -> int:
    from flow import declarations, registration
    from flow.export import export_to_pte
    from flow.runtime import load_kernel_library, load_method_checked

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build_dir", default=os.path.join(REPO_ROOT, "cmake-out", "bench"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--cases", default="", help="only the cases whose name contains this, e.g. decode")
    args = parser.parse_args()
    registration.register_with_pytorch(list(declarations.load().values()),
                                       aot_library=os.path.join(args.build_dir, "libcustom_ops_aot_lib.so"))
    from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401  (llama:: ops, both runtimes' kernels)

    load_kernel_library(os.path.join(args.build_dir, "libcustom_ops_lib.so"))
    runner = os.path.join(args.build_dir, "custom_ops_executor_runner")
    out_dir = os.path.join(args.build_dir, "programs")
    os.makedirs(out_dir, exist_ok=True)
    dtypes = [getattr(torch, name) for name in args.dtypes.split(",")]

    programs, methods, inputs = {}, {}, {}
    for dtype in dtypes:
        for case in CASES:
            if args.cases not in case_name(case, dtype):
                continue
            key = (case, dtype)
            inputs[key] = inputs_of(case, dtype)
            for side, cls in (("fused", Fused), ("aten", AtenOps), ("upstream", Upstream)):
                path = os.path.join(out_dir, f"attention_{side}_{'_'.join(map(str, case))}_{str(dtype)[6:]}.pte")
                try:
                    if not os.path.exists(path):
                        export_to_pte(cls(*case, dtype), inputs[key], path)
                    programs[(side, key)] = path
                except Exception as err:  # noqa: BLE001  (upstream may not take a dtype: its row says so)
                    print(f"{case_name(case, dtype)}: {side} not exported: {type(err).__name__}: "
                          f"{str(err).splitlines()[0][:160]}")
            for side in ("fused", "upstream"):
                if (side, key) in programs:
                    methods[(side, key)] = load_method_checked(programs[(side, key)])

    samples = {key: {s: [] for s in ("fused", "aten", "py_fused", "upstream", "memcpy")} for key in inputs}
    for _ in range(args.rounds):
        for key in inputs:
            case, dtype = key
            executions = 50 if case[0] == 1 else 12  # a prefill in ATen ops takes up to a second in bfloat16
            for side in ("fused", "aten"):
                if (side, key) in programs:
                    samples[key][side].append(statistics.median(execution_times(runner, programs[(side, key)],
                                                                                executions)))
            for side, name in (("fused", "py_fused"), ("upstream", "upstream")):
                if (side, key) in methods:
                    samples[key][name].append(statistics.median(python_runtime_times(methods[(side, key)],
                                                                                     inputs[key])))
            t, filled, _, kv_heads, head_dim = case
            kv_bytes = 2 * (filled + t) * kv_heads * head_dim * dtype.itemsize
            samples[key]["memcpy"] += memcpy_times(os.path.join(args.build_dir, "memcpy_bandwidth"), kv_bytes, 50)

    print(f"attention, {args.rounds} rounds; per round the median execution; ratios min-max over rounds")
    print(f"{'case':>34} | {'fused us':>9} | {'vs ATen ops (runner)':>22} | {'vs llama::custom_sdpa (Python)':>30} | "
          f"{'K+V read at, of memcpy':>22}")
    for key, s in samples.items():
        fused = statistics.median(s["fused"])
        cells = []
        for base, ours in (("aten", "fused"), ("upstream", "py_fused")):
            if s[base] and s[ours]:
                ratios = [b / o for b, o in zip(s[base], s[ours])]
                cells.append(f"{statistics.median(ratios):6.2f}x ({spread(ratios):>11})")
            else:
                cells.append("n/a")
        fractions = [m / f for m, f in zip(s["memcpy"], s["fused"])]
        print(f"{case_name(*key):>34} | {fused:>9.1f} | {cells[0]:>22} | {cells[1]:>30} | "
              f"{statistics.median(fractions):>6.0%} ({spread(fractions):>11})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
