"""Benchmark: the same Hugging Face checkpoint exported by this project (my_ops.hf) and by its peer, optimum-executorch
(`use_custom_sdpa`, `use_custom_kv_cache`: ExecuTorch's llama::custom_sdpa and llama::update_cache), both on XNNPACK,
float32 and 8-bit (8da8w), decoded greedily in ExecuTorch's Python runtime in one process, in interleaved rounds.
`bash test_custom_ops.sh bench hf` makes the peer's environment (.venv-peer: optimum-executorch beside this project's
pins) and runs this there.

Per program and round: load time (flow.runtime.load_method_checked: the project's checks, then the runtime's load with
XNNPACK's graphs built), prefill of PROMPT, decode tokens/s over NEW_TOKENS - 1 steps (one Python loop for both, so
its overhead is the same). Once per program: .pte size, memory (a process that imports torch and ExecuTorch, loads the
program and decodes: its resident memory after decoding less before the load, so the same imports on both sides
cancel; the imports' own transient peak dwarfs a tiny model's, so the peak RSS would say nothing), and the project's
C++ runner on its own program. Then both programs from C++ alike: ExecuTorch's own LLM runner
(extension/llm/runner's TextLLMRunner, through the wheel's binding; the project's programs carry the metadata methods
it reads) decodes each, in interleaved rounds, with a llama2.c-format tokenizer made here for the tiny vocabulary.
Ratios are taken within a round; the tables give medians and the min-max of each ratio across rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from measure import spread  # noqa: E402  (benchmark/measure.py)
from decode_timing import load_runtimes, native_output_silenced, time_one  # noqa: E402  (benchmark/decode_timing.py)

GOAL = 1.25  # the project's decode tokens/s over the peer's


def export_peer(checkpoint: str, output_dir: str, quantized: bool, max_seq_len: int) -> str:
    from optimum.exporters.executorch import main_export

    from models.hf_checkpoints import QUANTIZED

    extra = {"qlinear": QUANTIZED} if quantized else {}
    main_export(model_name_or_path=checkpoint, task="text-generation", recipe="xnnpack", output_dir=output_dir,
                max_seq_len=max_seq_len, use_custom_sdpa=True, use_custom_kv_cache=True, **extra)
    return os.path.join(output_dir, "model.pte")


PEAK = """
import json, resource, sys
sys.path[:0] = [{here!r}, {repo!r}]
from decode_timing import load_runtimes, time_one  # benchmark/decode_timing.py
load_runtimes({kernel_library!r})
def resident_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20
before = resident_mib()  # the imports and the kernel libraries
result = time_one({pte!r}, {peer!r}, {prompt!r}, {new_tokens!r}, warm_prefill=False)
print("@@" + json.dumps(resident_mib() - before))
"""


def rss_growth_mib(pte: str, peer: bool, kernel_library: str, prompt, new_tokens: int) -> float:
    code = PEAK.format(here=os.path.dirname(os.path.abspath(__file__)), repo=REPO_ROOT, kernel_library=kernel_library,
                       pte=pte, peer=peer, prompt=list(prompt), new_tokens=new_tokens)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"the memory run of {pte} failed:\n{proc.stderr[-3000:]}")
    return float(proc.stdout.split("@@")[-1])


def llm_runner_rounds(pair: dict[str, str], tokenizer: str, new_tokens: int, max_seq_len: int, rounds: int) -> dict:
    """Both programs in ExecuTorch's LLM runner: tokens/s over a whole generate() (the prompt's prefill and the decode
    steps), each round in alternating order; and whether both generate the same tokens."""
    from executorch.extension.llm.runner import TextLLMRunner

    from models import hf_checkpoints as hf

    config = hf.llm_runner_config(new_tokens, max_seq_len)

    def generate(runner, on_token=None) -> tuple[float, int]:
        stats = []
        runner.reset()
        start = time.perf_counter()
        runner.generate(hf.LLM_RUNNER_PROMPT, config, token_callback=on_token, stats_callback=stats.append)
        return time.perf_counter() - start, stats[0].num_generated_tokens + 1  # + the token the prefill gave

    with native_output_silenced():
        runners = {side: TextLLMRunner(pte, tokenizer) for side, pte in pair.items()}
        texts = {side: [] for side in runners}
        for side, runner in runners.items():  # once untimed (a warm-up), keeping the text
            generate(runner, texts[side].append)
        per_round = []
        for r in range(rounds):
            order = ("project", "peer") if r % 2 == 0 else ("peer", "project")
            timed = {side: generate(runners[side]) for side in order}
            per_round.append({side: tokens / seconds for side, (seconds, tokens) in timed.items()})
    ratios = [rd["project"] / rd["peer"] for rd in per_round]
    return {side: statistics.median(rd[side] for rd in per_round) for side in pair} | {
        "ratio": (statistics.median(ratios), spread(ratios)), "same_tokens": texts["project"] == texts["peer"],
        "tokens": len(texts["project"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build_dir", required=True, help="a build with every op (its AOT library and kernels)")
    parser.add_argument("--runner_dir", required=True, help="the runner for the project's programs")
    parser.add_argument("--output_dir", default=os.path.join(REPO_ROOT, "cmake-out", "bench_hf"))
    parser.add_argument("--models", default="llama,qwen3")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()

    from models import hf_checkpoints as hf
    from models.decoding import chosen, decode_runner, register_ops

    if (names := chosen(args.models, hf.MODELS, "model")) is None:
        return 2
    register_ops(args.build_dir)
    m = hf.hf_models()
    kernel_library = os.path.join(args.runner_dir, "libcustom_ops_lib.so")
    load_runtimes(kernel_library)
    programs = {}  # (model, dtype) -> {"project": pte, "peer": pte}
    hf.export_all(hf.programs_of(names), args.output_dir)  # the project's programs and their checkpoints
    for name, quantized in hf.programs_of(names):
        dtype = hf.QUANTIZED if quantized else "float32"
        peer = export_peer(hf.checkpoint_dir(args.output_dir, name),
                           os.path.join(args.output_dir, f"{name}_{dtype}_optimum"), quantized, m.MAX_POSITIONS)
        programs[name, dtype] = {"project": hf.program_path(args.output_dir, name, quantized), "peer": peer}
        print(f"Exported {name} {dtype} with optimum-executorch: {os.path.relpath(peer)}", flush=True)

    tokenizer = hf.write_llm_runner_tokenizer(os.path.join(args.output_dir, "tokenizer.bin"), m.VOCAB)
    rows = []
    for (name, dtype), pair in programs.items():
        rounds = []
        for r in range(args.rounds):
            order = ("project", "peer") if r % 2 == 0 else ("peer", "project")
            rounds.append({side: time_one(pair[side], side == "peer", m.PROMPT, m.NEW_TOKENS, warm_prefill=False)
                           for side in order})
        same_tokens = all(rd["project"]["tokens"] == rd["peer"]["tokens"] for rd in rounds)
        runner = decode_runner(os.path.join(args.runner_dir, "custom_ops_executor_runner"), pair["project"], m.PROMPT,
                               m.NEW_TOKENS, generations=3)
        row = {"case": f"{name} {dtype}", "same_tokens": same_tokens,
               "runner_tokens_per_s": runner.decode_tokens_per_s, "runner_prefill_us": runner.prefill_us}
        for key in ("decode_tokens_per_s", "prefill_us", "load_ms"):
            for side in ("project", "peer"):
                row[f"{key}_{side}"] = statistics.median(rd[side][key] for rd in rounds)
            ratios = [rd["project"][key] / rd["peer"][key] for rd in rounds]
            if key != "decode_tokens_per_s":
                ratios = [1 / x for x in ratios]  # times: the peer's over the project's, so > 1 is faster
            row[f"{key}_ratio"] = (statistics.median(ratios), spread(ratios))
        for side in ("project", "peer"):
            row[f"size_kib_{side}"] = os.path.getsize(pair[side]) / 1024
            row[f"rss_mib_{side}"] = rss_growth_mib(pair[side], side == "peer", kernel_library, m.PROMPT, m.NEW_TOKENS)
        row["llm_runner"] = llm_runner_rounds(pair, tokenizer, m.NEW_TOKENS, m.MAX_POSITIONS, args.rounds)
        rows.append(row)
        print(json.dumps(row), flush=True)

    print(f"\nPython runtime, prompt {len(m.PROMPT)} tokens, {m.NEW_TOKENS} new, {m.MAX_POSITIONS} positions; "
          f"medians of {args.rounds} interleaved rounds, min-max of each ratio. Ratios: project over "
          "optimum-executorch (speed), optimum-executorch over project (times).\n")
    print("| case | decode tok/s project | optimum | ratio | prefill us project | optimum | ratio | load ms project | "
          "optimum | .pte KiB project / optimum | RSS growth MiB project / optimum | C++ runner tok/s | "
          "same tokens |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for row in rows:
        d, p = row["decode_tokens_per_s_ratio"], row["prefill_us_ratio"]
        print(f"| {row['case']} | {row['decode_tokens_per_s_project']:.0f} | {row['decode_tokens_per_s_peer']:.0f} | "
              f"{d[0]:.2f}x ({d[1]}) | {row['prefill_us_project']:.0f} | {row['prefill_us_peer']:.0f} | "
              f"{p[0]:.2f}x ({p[1]}) | {row['load_ms_project']:.1f} | {row['load_ms_peer']:.1f} | "
              f"{row['size_kib_project']:.0f} / {row['size_kib_peer']:.0f} | "
              f"{row['rss_mib_project']:.1f} / {row['rss_mib_peer']:.1f} | {row['runner_tokens_per_s']:.0f} | "
              f"{'yes' if row['same_tokens'] else 'no'} |")
    print(f"\nExecuTorch's LLM runner (C++, TextLLMRunner), prompt {len(hf.llm_runner_prompt_ids())} tokens, "
          f"{m.NEW_TOKENS} new: tokens/s over generate(), medians of {args.rounds} interleaved rounds, min-max of the "
          "ratio.\n")
    print("| case | tok/s project | optimum | ratio | same tokens |")
    print("| --- | ---: | ---: | ---: | --- |")
    for row in rows:
        llm = row["llm_runner"]
        ratio, ratio_spread = llm["ratio"]
        print(f"| {row['case']} | {llm['project']:.0f} | {llm['peer']:.0f} | {ratio:.2f}x ({ratio_spread}) | "
              f"{'yes' if llm['same_tokens'] else 'no'} ({llm['tokens']}) |")
    met = all(row["decode_tokens_per_s_ratio"][0] >= GOAL for row in rows)
    print(f"\nGoal: decode >= {GOAL}x optimum-executorch at every case: {'met' if met else 'not met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
