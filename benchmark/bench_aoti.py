"""Benchmark: the example decoder run from C++ without Python two ways, side by side in one run on one machine:
ExecuTorch (decoder.pte: linear layers on XNNPACK, the custom ops on this project's kernels, custom_ops_executor_runner)
and AOTInductor (its package: Inductor-generated C++, the custom ops through the proxy executor, custom_ops_aoti_runner).
`bash test_custom_ops.sh bench aoti` builds what it needs and runs it.

Each round runs both runtimes, alternating which goes first:
  - a decode run: GENERATIONS generations of NEW_TOKENS tokens from the same prompt in one process. Prefill and decode
    step times are the steady state: generations 2.. (the first pays each runtime's one-time warm-up, which the cold
    start below counts). Peak memory is that process's maximum resident set (VmHWM, which the runners print).
  - a cold start: a new process that loads the model, runs the prefill once and exits, timed from outside (the files
    are in the page cache: a start after a reboot adds disk reads to both).
Ratios are taken within a round, so a slow moment of the machine hits both sides; the table gives medians and min-max.
What ships: the model file, the runner and every shared library they load that is not part of the OS (ldd), sizes on
disk as installed from the wheels (not stripped or compressed).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from measure import spread  # noqa: E402  (benchmark/measure.py)

NEW_TOKENS = 96
GENERATIONS = 4
SYSTEM_DIRS = ("/lib/", "/lib64/", "/usr/lib/", "/usr/lib64/")


def run_timed(command: list[str]) -> tuple[str, float]:
    """(stdout, wall seconds) of a process; RuntimeError if it fails."""
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {proc.returncode}:\n{proc.stderr}")
    return proc.stdout, seconds


def peak_kib(stdout: str) -> int:
    """The peak resident memory a runner printed (its own VmHWM: a parent's wait4 would also count what the forked
    child held of this Python process before exec)."""
    return int(re.search(r"^Peak resident memory: (\d+) KiB", stdout, re.M).group(1))


def steady_state(stdout: str) -> tuple[float, float]:
    """(prefill us, decode us per token) averaged over generations 2.. of a runner's decode output."""
    generations = [(float(p), float(d)) for p, d in
                   re.findall(r"^Generation \d+: prefill ([\d.]+) us, decode ([\d.]+) us", stdout, re.M)][1:]
    if not generations:
        raise RuntimeError(f"no per-generation times after the first in:\n{stdout}")
    return (statistics.mean(p for p, _ in generations),
            statistics.mean(d for _, d in generations) / (NEW_TOKENS - 1))


def shipped_bytes(model_file: str, binaries: list[str]) -> tuple[int, int, int]:
    """(model bytes, runner + op library bytes, bytes of the non-OS shared libraries they load)."""
    libraries = set()
    for binary in binaries:
        ldd = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
        libraries |= {os.path.realpath(m) for m in re.findall(r"=> (/\S+)", ldd) if not m.startswith(SYSTEM_DIRS)}
    libraries -= {os.path.realpath(b) for b in binaries}
    return (os.path.getsize(model_file), sum(os.path.getsize(b) for b in binaries),
            sum(os.path.getsize(lib) for lib in libraries))


def main() -> int:
    from flow import aoti
    from models import decoding, example_decoder

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build_dir", default=os.path.join(REPO_ROOT, "cmake-out", "all_ops"))
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    decoding.register_ops(args.build_dir)
    out_dir = os.path.join(args.build_dir, "programs")
    os.makedirs(out_dir, exist_ok=True)
    pte = example_decoder.export(aoti.MODEL, out_dir)
    package = aoti.model_package()
    prompt = example_decoder.model_module().PROMPT
    et_runner = os.path.join(args.build_dir, "custom_ops_executor_runner")
    libraries = [os.path.join(args.build_dir, lib) for lib in aoti.OP_LIBRARIES]
    commands = {"ExecuTorch": [et_runner, f"--model_path={pte}"],
                "AOTInductor": aoti.runner_command(args.build_dir, package)}
    decode_flags = [f"--prompt={','.join(map(str, prompt))}", f"--new_tokens={NEW_TOKENS}",
                    f"--num_executions={GENERATIONS}"]
    start_flags = [f"--prompt={','.join(map(str, prompt))}", "--new_tokens=1"]

    results = {name: {"prefill": [], "step": [], "memory": [], "start": []} for name in commands}
    tokens = {}
    for round_index in range(args.rounds):
        order = list(commands) if round_index % 2 == 0 else list(reversed(commands))
        for name in order:
            stdout, _ = run_timed(commands[name] + decode_flags)
            prefill_us, step_us = steady_state(stdout)
            tokens[name] = decoding.printed_tokens(stdout)
            _, seconds = run_timed(commands[name] + start_flags)
            for key, value in (("prefill", prefill_us), ("step", step_us), ("memory", peak_kib(stdout) / 1024),
                               ("start", seconds * 1e3)):
                results[name][key].append(value)
    if tokens["ExecuTorch"] != tokens["AOTInductor"]:
        print(f"error: the runtimes generated different tokens: {tokens}", file=sys.stderr)
        return 1

    sizes = {"ExecuTorch": shipped_bytes(pte, [et_runner]), "AOTInductor": shipped_bytes(package, [
        commands["AOTInductor"][0], *libraries])}
    et, ai = results["ExecuTorch"], results["AOTInductor"]
    print(f"examples/decoder.py, float32, {len(prompt)}-token prompt, {NEW_TOKENS} new tokens, "
          f"{example_decoder.config().max_seq} cache positions, {os.cpu_count()} cores; {args.rounds} rounds: "
          "medians (min-max); ratio = AOTInductor / "
          "ExecuTorch within a round (> 1: ExecuTorch is better)")
    print(f"{'':>27} | {'ExecuTorch':>24} | {'AOTInductor':>24} | {'ratio':>17}")
    rows = [("decode step (us/token)", "step"), ("prefill (us)", "prefill"), ("peak memory (MiB)", "memory"),
            ("cold start (ms)", "start")]
    for label, key in rows:
        ratios = [a / e for a, e in zip(ai[key], et[key])]
        print(f"{label:>27} | {statistics.median(et[key]):>8.1f} ({spread(et[key]):>13}) | "
              f"{statistics.median(ai[key]):>8.1f} ({spread(ai[key]):>13}) | {statistics.median(ratios):>5.2f} "
              f"({spread(ratios):>9})")
    mib = lambda n: n / 2**20  # noqa: E731
    for label, index in (("model file (MiB)", 0), ("runner + op libraries (MiB)", 1), ("shared libraries (MiB)", 2)):
        e, a = sizes["ExecuTorch"][index], sizes["AOTInductor"][index]
        print(f"{label:>27} | {mib(e):>24.2f} | {mib(a):>24.2f} | {a / e:>5.2f}")
    e, a = sum(sizes["ExecuTorch"]), sum(sizes["AOTInductor"])
    print(f"{'what ships (MiB)':>27} | {mib(e):>24.2f} | {mib(a):>24.2f} | {a / e:>5.2f}")
    print(f"tokens: the same {len(tokens['ExecuTorch'])} in both")
    return 0


if __name__ == "__main__":
    sys.exit(main())
