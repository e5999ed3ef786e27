"""Measures the edit loop: the incremental rebuild after a one-line edit of an op's kernel source, in the build the
flow makes for that op (cmake-out/<example_program>/). A Python-registered op's kernel compiles once (runtime); a
C++-registered op's kernel compiles twice, for the runtime and in ATen mode for the AOT library (against
precompiled libtorch headers). Not a test: it prints what it measured.

    .venv/bin/python benchmark/bench_edit_loop.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from flow import declarations  # noqa: E402

ENV = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))


def build(build_dir: str, *cmake_args: str) -> float:
    """Configures (if needed) and builds; returns the build's wall time in seconds."""
    if not os.path.isfile(os.path.join(build_dir, "build.ninja")):
        subprocess.run(["cmake", "-S", REPO_ROOT, "-B", build_dir, "-G", "Ninja",
                        f"-DPython3_EXECUTABLE={sys.executable}", *cmake_args],
                       check=True, capture_output=True, env=ENV)
    start = time.perf_counter()
    subprocess.run(["cmake", "--build", build_dir], check=True, capture_output=True, env=ENV)
    return time.perf_counter() - start


def measure(op, rounds: int) -> list[float]:
    build_dir = os.path.join(REPO_ROOT, "cmake-out", op.example_program)
    build(build_dir, f"-DCUSTOM_OPS_ROOT_OPS={op.out_name}")  # up to date first
    kernel = os.path.join(REPO_ROOT, op.kernel_sources[0])
    with open(kernel) as f:
        original = f.read()
    times = []
    try:
        for i in range(rounds):
            with open(kernel, "w") as f:  # one changed line of code, new every time: ccache cannot have compiled it
                f.write(original + f'[[maybe_unused]] static const char kEditLoopProbe[] = "{time.time_ns()}";\n')
            times.append(build(build_dir))
    finally:
        with open(kernel, "w") as f:
            f.write(original)
        build(build_dir)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    ops = declarations.load().values()
    examples = [next(op for op in ops if op.registered_from == origin) for origin in ("python", "cpp")]
    print(f"{os.cpu_count()} cores; rebuild after a one-line edit of the kernel source, {args.rounds} rounds")
    for op in examples:
        times = measure(op, args.rounds)
        print(f"{op.name:>14} ({op.registered_from:>6}, {op.kernel_sources[0]}): median {statistics.median(times):.2f} s, "
              f"min {min(times):.2f} s, max {max(times):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
