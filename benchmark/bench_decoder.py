"""Benchmark: the example decoder (examples/decoder.py) decoding greedily in the runner, four ways side by side in one run:
the custom ops vs the same model with rms_norm and the cache update written as ATen ops, XNNPACK-delegated vs not,
float32 vs 8-bit. `bash test_custom_ops.sh bench decoder` builds what it needs and runs it.

Each round runs every variant once (GENERATIONS generations of NEW_TOKENS tokens from the same prompt; the runner
reports the average prefill time and decode tokens/s); the table gives the median over rounds and, for each ratio,
its min-max over rounds (ratios are taken within a round, so a slow moment of the machine hits both sides).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from measure import spread  # noqa: E402  (benchmark/measure.py)

NEW_TOKENS = 96
GENERATIONS = 3
# (what, faster variant, baseline, goal): the ratio of decode tokens/s
COMPARISONS = [
    ("custom ops vs ATen ops", "decoder", "decoder_aten_ops", 1.3),
    ("sdpa_with_cache vs ATen attention", "decoder", "decoder_aten_attention", 1.3),
    ("XNNPACK vs undelegated", "decoder", "decoder_undelegated", 3.0),
    ("8-bit vs float32", "decoder_q8", "decoder", None),
]


def main() -> int:
    from models import decoding, example_decoder

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build_dir", default=os.path.join(REPO_ROOT, "cmake-out", "bench"))
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--max_seq", type=int, help="cache positions (default: examples/decoder.py's Config)")
    args = parser.parse_args()
    variants = list(example_decoder.VARIANTS)
    decoding.register_ops(args.build_dir)
    runner = os.path.join(args.build_dir, "custom_ops_executor_runner")
    out_dir = os.path.join(args.build_dir, "programs")
    os.makedirs(out_dir, exist_ok=True)
    programs = {name: example_decoder.export(name, out_dir, max_seq=args.max_seq) for name in variants}
    prompt = example_decoder.model_module().PROMPT

    prefill = {name: [] for name in variants}
    decode = {name: [] for name in variants}
    tokens = {}
    for _ in range(args.rounds):
        for name in variants:
            result = decoding.decode_runner(runner, programs[name], prompt, NEW_TOKENS, generations=GENERATIONS)
            prefill[name].append(result.prefill_us)
            decode[name].append(result.decode_tokens_per_s)
            tokens[name] = result.tokens

    print(f"examples/decoder.py ({len(prompt)}-token prompt, {NEW_TOKENS} new tokens, "
          f"{example_decoder.config(args.max_seq).max_seq} cache positions, {GENERATIONS} generations per round, "
          f"{args.rounds} rounds): medians, min-max over rounds")
    print(f"{'variant':>20} | {'prefill us':>19} | {'decode tokens/s':>21}")
    for name in variants:
        print(f"{name:>20} | {statistics.median(prefill[name]):>8.0f} ({spread(prefill[name]):>9}) | "
              f"{statistics.median(decode[name]):>8.0f} ({spread(decode[name]):>11})")
    failures = []
    for what, fast, base, goal in COMPARISONS:
        ratios = [f / b for f, b in zip(decode[fast], decode[base])]
        prefill_ratios = [b / f for f, b in zip(prefill[fast], prefill[base])]
        ratio = statistics.median(ratios)
        met = goal is None or ratio >= goal
        if not met:
            failures.append(what)
        print(f"{what:>24}: decode {ratio:.2f}x ({spread(ratios)}), prefill {statistics.median(prefill_ratios):.2f}x "
              f"({spread(prefill_ratios)})" + (f"; goal >= {goal}x: {'met' if met else 'NOT met'}" if goal else ""))
    if tokens["decoder"] != tokens["decoder_aten_ops"] or tokens["decoder"] != tokens["decoder_undelegated"]:
        print("error: the float32 variants generated different tokens", file=sys.stderr)
        return 1
    print(f"goals: {'all met' if not failures else 'NOT met for ' + ', '.join(failures)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
