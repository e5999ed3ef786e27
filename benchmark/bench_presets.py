"""Benchmark: the GGUF files people download, on their own tensors, against llama.cpp on the same files. For the shipped
SmolLM2 file, each llama-quantize preset made from it (models/gguf_presets.py: Q4_K_M, Q5_K_M, Q6_K, Q3_K_M, Q2_K, Q5_0)
and Gemma 3 270M's Q4_K_M file as downloaded (`gemma3`: models/real_models.py), the project's GGUF program (--quantize
gguf) in ExecuTorch's Python runtime at 1 thread and at every core (ExecuTorch's threadpool reset between them;
PyTorch's own threads at one, as my_ops.hf does), beside `llama-bench -t 1` and `-t N` on the same file, in interleaved
rounds: prefill of a PROMPT_TOKENS-token prompt (warm, as llama-bench times it after a warm-up), decode tokens/s over
NEW_TOKENS. Ratios are taken within a round; the table gives medians and the min-max across rounds.
`bash test_custom_ops.sh bench presets` runs this alone; `bench real` runs it after its own tables.

    python benchmark/bench_presets.py --build_dir cmake-out/all_ops [--presets Q4_K_M,Q2_K,gemma3] [--rounds 3]
                                      [--isa avx2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO_ROOT, os.path.dirname(os.path.abspath(__file__))]

from measure import spread  # noqa: E402  (benchmark/measure.py)

PROMPT_TOKENS = NEW_TOKENS = 128
DECODE_GOAL = 1.25  # the program over llama.cpp on the same file, at the same threads
F32_DECODE_GOAL = 1.0  # float32 weights: both sides read the same 4 bytes a weight, the memory's rate bounds both
PREFILL_GOAL = 1.5  # at every core


def add_isa_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--isa", choices=("native", "avx2"), default="native",
                        help="avx2: the project capped at AVX2 (CUSTOM_OPS_ISA) beside llama.cpp built for AVX2 "
                             "without AVX-512, to measure the AVX2 code on an AVX-512 host; native: each side's best")


def use_isa(isa: str) -> None:
    """Caps this process's kernels (read once, at their first call: before any runs)."""
    if isa == "avx2":
        os.environ["CUSTOM_OPS_ISA"] = "avx2"


def isa_line(isa: str) -> str:
    """What each side runs: the project's kernels (flow/cpu.py) and llama.cpp's build flags."""
    from flow import cpu
    from models import llama_cpp

    return f"ISA: {cpu.describe()}; llama.cpp: {' '.join(llama_cpp.BUILDS[isa])}"


def thread_counts() -> list[int]:
    cores = os.cpu_count() or 1
    return [1] if cores == 1 else [1, cores]


def time_program(pte: str, ids: list[int], threads: int, new_tokens: int = NEW_TOKENS) -> dict:
    """The program's prefill (warm, as llama-bench's) and decode tokens/s on `threads` of ExecuTorch's pool (one load,
    one generation), and its load time."""
    from executorch.extension.pybindings import portable_lib

    from decode_timing import time_one  # benchmark/decode_timing.py

    portable_lib._unsafe_reset_threadpool(threads)
    run = time_one(pte, False, ids, new_tokens)
    return {"prefill": run["warm_prefill_tokens_per_s"], "decode": run["decode_tokens_per_s"],
            "first_token_ms": run["load_ms"] + run["prefill_us"] / 1e3}


def measure(label: str, types: str, pte: str, gguf: str, ids: list[int], rounds: int, isa: str = "native",
            new_tokens: int = NEW_TOKENS) -> dict:
    """A program and llama-bench (built for `isa`: models/llama_cpp.py's BUILDS) on `gguf` at each thread count, in
    interleaved rounds, a len(ids)-token prompt and `new_tokens` new ones; the pool is left at every core, as it
    was."""
    from executorch.extension.pybindings import portable_lib

    from models import llama_cpp

    per_round = []
    for r in range(rounds):
        found = {}
        for threads in thread_counts() if r % 2 == 0 else reversed(thread_counts()):
            found[threads] = {"project": time_program(pte, ids, threads, new_tokens),
                              "llama.cpp": {key: value[0] for key, value in llama_cpp.bench(
                                  gguf, threads, len(ids), new_tokens, 1, isa).items() if key != "peak_rss_mib"}}
        per_round.append(found)
    portable_lib._unsafe_reset_threadpool(thread_counts()[-1])
    print(f"{label}: " + ", ".join(f"{t} threads {r['project']['decode']:.1f} vs {r['llama.cpp']['decode']:.1f}"
                                   for t, r in per_round[-1].items()), flush=True)
    return {"preset": label, "types": types, "rounds": per_round}


def rows(presets: list[str], rounds: int, isa: str = "native") -> list[dict]:
    """Per file: its programs' and llama-bench's tokens/s at each thread count, every round."""
    from models import gguf_presets as files, real_models as real
    from my_ops.hf.checkpoint import load
    from my_ops.hf.session import default_cache_dir, export_cached

    measured = []
    for preset in presets:
        path = files.preset_file(preset)
        checkpoint = load(path, dequantize=False)  # the file's own tensors: no float32 model
        with open(real.TEXT, encoding="utf-8") as f:
            ids = list(checkpoint.tokenizer.encode(f.read(), add_special_tokens=False))[:PROMPT_TOKENS]
        max_seq_len = real.MODELS.get(preset, real.SMOLLM2).max_seq_len  # a preset is SmolLM2's file
        pte, _ = export_cached(checkpoint, "gguf", max_seq_len, default_cache_dir())
        del checkpoint
        measured.append(measure(preset, files.tensor_types(path), pte, path, ids, rounds, isa))
    return measured


# A fresh process (the counters count only in one started with COUNT_PATHS): a prompt, then `steps` decode steps,
# the counters' change over the steps.
POOL_SPLIT = """
import json, sys, time, torch
torch.set_num_threads(1)
sys.path[:0] = [{here!r}, {repo!r}]
from decode_timing import load_runtimes
load_runtimes({kernel_library!r})
from executorch.extension.pybindings import portable_lib
from flow.runtime import load_method_checked, path_counts
from my_ops.hf.text import greedy
portable_lib._unsafe_reset_threadpool({threads})
method = load_method_checked({pte!r})
tokens, position = torch.tensor([{ids!r}]), torch.tensor([0])
out = method.execute([tokens, position])[0]
before, start = path_counts({kernel_library!r}), time.perf_counter()
for _ in range({steps}):
    position, tokens = position + tokens.shape[1], torch.tensor([[greedy(out)]])
    out = method.execute([tokens, position])[0]
seconds = time.perf_counter() - start
after = path_counts({kernel_library!r})
print("@@" + json.dumps({{"seconds": seconds, "counts": {{k: after[k] - before[k] for k in after}}}}))
"""


def pool_split(pte: str, ids: list[int], threads: int, kernel_library: str, steps: int = 32) -> dict:
    """A decode step's time on the pool at `threads`, per user (linear layers, attention, the rest), in microseconds a
    step: the thread-time its hand-offs held the pool, the time its tasks worked, and the difference (waking, joining,
    waiting on the slowest task); with the step's time and hand-offs. The counters' clocks add a little to each."""
    import json
    import subprocess

    from flow.runtime import COUNT_PATHS, POOL_USERS

    here = os.path.dirname(os.path.abspath(__file__))
    code = POOL_SPLIT.format(here=here, repo=REPO_ROOT, kernel_library=kernel_library, threads=threads, pte=pte,
                             ids=ids, steps=steps)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **COUNT_PATHS})
    if proc.returncode != 0:
        raise RuntimeError(f"the pool split of {pte} failed:\n{proc.stderr[-2000:]}")
    found = json.loads(proc.stdout.rsplit("@@", 1)[1])
    counts = found["counts"]
    split = {"step_us": found["seconds"] / steps * 1e6, "handoffs": counts["pool_handoffs"] / steps}
    for user in POOL_USERS:
        held, work = counts[f"{user}_pool_ns"] / steps / 1e3, counts[f"{user}_work_ns"] / steps / 1e3
        split[user] = {"held": held, "work": work, "waiting": held - work}
    return split


def pool_report(splits: dict[str, dict], threads: int) -> list[str]:
    """The table of pool_split()s by program."""
    from flow.runtime import POOL_USERS

    header = ["program", "step us", "hand-offs"] + [f"{user} held / work / waiting" for user in POOL_USERS]
    lines = ["| " + " | ".join(header) + " |", "| --- |" + " ---: |" * (len(header) - 1)]
    for name, s in splits.items():
        cells = [name, f"{s['step_us']:.0f}", f"{s['handoffs']:.0f}"]
        cells += [f"{s[u]['held']:.0f} / {s[u]['work']:.0f} / {s[u]['waiting']:.0f}" for u in POOL_USERS]
        lines.append("| " + " | ".join(cells) + " |")
    return [f"A decode step's time on the pool at {threads} threads, us a step (held: the hand-offs' wall time times "
            "the threads; waiting: held less the tasks' work):", "", *lines]


def report(measured: list[dict], columns: tuple[str, str] = ("file", "tensor types")) -> list[str]:
    """The table of `measured` rows (measure()'s), and whether the decode and prefill goals were met."""
    counts = thread_counts()
    header = list(columns)
    for t in counts:
        header += [f"decode {t}t project", f"llama.cpp", "ratio"]
    header += [f"prefill {counts[-1]}t ratio", f"project {counts[-1]}t over 1t", f"llama.cpp {counts[-1]}t over 1t"]
    lines = ["| " + " | ".join(header) + " |", "| --- | --- |" + " ---: |" * (len(header) - 2)]
    missed, slow_prefill = [], []
    for row in measured:
        rounds = row["rounds"]
        cells = [row["preset"], row["types"]]
        for t in counts:
            ours = [rd[t]["project"]["decode"] for rd in rounds]
            theirs = [rd[t]["llama.cpp"]["decode"] for rd in rounds]
            ratios = [a / b for a, b in zip(ours, theirs)]
            cells += [f"{statistics.median(ours):.1f}", f"{statistics.median(theirs):.1f}",
                      f"{statistics.median(ratios):.2f}x ({spread(ratios)})"]
            if statistics.median(ratios) < (F32_DECODE_GOAL if row["types"] == "F32" else DECODE_GOAL):
                missed.append(f"{row['preset']} at {t} threads: {statistics.median(ratios):.2f}x")
        most = counts[-1]
        prefill = [rd[most]["project"]["prefill"] / rd[most]["llama.cpp"]["prefill"] for rd in rounds]
        if statistics.median(prefill) < PREFILL_GOAL:
            slow_prefill.append(f"{row['preset']}: {statistics.median(prefill):.2f}x")
        scale = [rd[most]["project"]["decode"] / rd[1]["project"]["decode"] for rd in rounds]
        scale_llama = [rd[most]["llama.cpp"]["decode"] / rd[1]["llama.cpp"]["decode"] for rd in rounds]
        cells += [f"{statistics.median(prefill):.2f}x", f"{statistics.median(scale):.2f}x",
                  f"{statistics.median(scale_llama):.2f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"decode >= {DECODE_GOAL}x llama.cpp ({F32_DECODE_GOAL}x on F32) on each file at each thread count: "
                 + ("met" if not missed else "not met (" + "; ".join(missed) + ")"))
    lines.append(f"prefill >= {PREFILL_GOAL}x at {counts[-1]} threads: "
                 + ("met" if not slow_prefill else "not met (" + "; ".join(slow_prefill) + ")"))
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build_dir", required=True, help="a build with every op (AOT library, kernels)")
    parser.add_argument("--presets", default=None, help="files: Q4_1 (the shipped one), llama-quantize presets of it, "
                                                        "gemma3 (Gemma 3 270M's Q4_K_M file)")
    parser.add_argument("--rounds", type=int, default=3)
    add_isa_argument(parser)
    args = parser.parse_args()
    use_isa(args.isa)
    torch.set_num_threads(1)
    from models import gguf_presets as files
    from models.decoding import register_ops
    from flow.runtime import load_kernel_library

    chosen = [files.SHIPPED if p == "Q4_1" else p for p in (args.presets or ",".join(
        ("Q4_1", *files.PRESETS, *files.other_models()))).split(",") if p]
    register_ops(args.build_dir)
    load_kernel_library(os.path.join(args.build_dir, "libcustom_ops_lib.so"))
    print(f"\nGGUF files on their own tensors: the project's program (Python runtime) against llama-bench on the same "
          f"file, {PROMPT_TOKENS}-token prompt, {NEW_TOKENS} new tokens, medians of {args.rounds} interleaved rounds, "
          f"min-max of each ratio.\n{isa_line(args.isa)}\n")
    print("\n".join(report(rows(chosen, args.rounds, args.isa))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
