"""Benchmark: GGUF files at the sizes people run, exported on their own tensors and decoded beside llama.cpp. For
SmolLM2 135M (Q4_1, as shipped), Gemma 3 270M (Q4_K_M, as downloaded) and the 1B- and 8B-shaped files
models/scale_models.py makes (Q4_K_M; --kinds adds Q8_0):

- the export, `python -m my_ops.hf export --quantize gguf` in a process of its own: wall time and peak resident
  memory (tools/own_peak_rss.py), beside the file's size and the time llama-quantize took to write the file;
- the .pte's size; the runner's peak resident memory decoding NEW_TOKENS tokens after the prompt;
- the same with the weights in a named data file (`export --ptd`): the export's time and peak, the .pte's and the
  .ptd's sizes, the runner's peak with --data_path, and its logits against the one-file program's, bit for bit;
- the time to the first token in ExecuTorch's Python runtime (the program's load and the prompt's first prefill);
- prefill and decode at 1 thread and every core beside `llama-bench` on the same file (benchmark/bench_presets.py's
  measure: interleaved rounds, ratios within a round);
- the program's next-token distributions against llama.cpp's on the same file and tokens (llama-perplexity's
  --kl-divergence-base): mean KL divergence and the share of positions with the same most likely token, beside
  llama.cpp's against itself (flash attention off: the floor two correct programs' arithmetic sets); and both
  sides' against the file's float32 model (its weights dequantized, every activation in float32: what both sides
  approximate), where that model fits in a third of this machine's memory (not the 8B shape's ~30 GiB);
- each side's decode as a share of the machine's read bound: the bytes a step reads (every tensor but an untied
  token embedding, of which a step reads one row) over the read rate of that many bytes at that thread count
  (benchmark/memcpy_bandwidth.cpp).

    python benchmark/bench_scale.py --build_dir cmake-out/all_ops --memcpy PATH [--models 135m,270m,1b,8b]
                                    [--kinds Q4_K_M,Q8_0] [--rounds 2] [--isa avx2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO_ROOT, os.path.dirname(os.path.abspath(__file__))]

from bench_presets import add_isa_argument, isa_line, measure, thread_counts, use_isa  # noqa: E402
from measure import memcpy_times, spread  # noqa: E402  (benchmark/measure.py)

MODELS = ("135m", "270m", "1b", "8b")
MAX_SEQ_LEN = 512
KL_CTX, KL_CHUNKS = 256, 2  # llama-perplexity's chunks for the distributions compared: 254 positions scored
# Tokens a measurement runs: the 8B program decodes a few tokens a second here, so its rounds are shorter.
TOKENS = {"135m": (128, 64), "270m": (128, 64), "1b": (128, 64), "8b": (32, 16)}  # (prompt, new)


def model_file(name: str, kind: str) -> str:
    from models import real_models, scale_models

    if name == "135m":
        return real_models.SMOLLM2.path()
    if name == "270m":
        return real_models.GEMMA3.path()
    return scale_models.model_file(name, kind)


def own_peak(command: list[str], **kwargs) -> tuple[float, float]:
    """(seconds, peak resident GiB) of `command` in a process of its own."""
    from models.llama_cpp import run_own_peak

    start = time.perf_counter()
    proc, peak = run_own_peak(command, capture_output=True, text=True, **kwargs)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:4])} ... failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return seconds, peak / 2 ** 30


def export(path: str, build_dir: str, output: str, ptd: bool = False) -> dict:
    seconds, peak = own_peak([sys.executable, "-m", "my_ops.hf", "export", "--model", path, "--quantize", "gguf",
                              "--max_seq_len", str(MAX_SEQ_LEN), "--build_dir", build_dir, "--output", output,
                              *(["--ptd"] if ptd else [])], cwd=REPO_ROOT)
    return {"export_s": seconds, "export_peak_gib": peak, "pte": os.path.join(output, "model.pte"),
            "ptd": os.path.join(output, "model.ptd") if ptd else None}


def with_data_file(path: str, build_dir: str, output: str, runner: str, one: str, ids: list[int]) -> dict:
    """The file exported with its weights in model.ptd: the export, the sizes, the runner's peak with --data_path,
    and whether its logits are the one-file program's (`one`, its runner's logits on `ids`), bit for bit."""
    from models.real_models import runner_peak_bytes

    row = export(path, build_dir, output, ptd=True)
    two = os.path.join(output, "data_file_logits.bin")
    row["runner_peak_gib"] = runner_peak_bytes(runner, row["pte"], ids, data_path=row["ptd"], logits=two) / 2 ** 30
    with open(one, "rb") as a, open(two, "rb") as b:
        row["same_logits"] = a.read() == b.read()
    row["pte_kib"] = os.path.getsize(row["pte"]) / 2 ** 10
    row["ptd_gib"] = os.path.getsize(row["ptd"]) / 2 ** 30
    return row


def step_bytes(path: str) -> int:
    """The bytes of the file's tensors a decode step reads: all but a token embedding the output projection does not
    share (a step reads one of its rows)."""
    from my_ops.hf.gguf_file import check

    tensors = check(path).tensors
    untied = any(t.name == "output.weight" for t in tensors)
    return sum(t.nbytes for t in tensors if not (untied and t.name == "token_embd.weight"))


def read_rates(memcpy: str, nbytes: int, rounds: int) -> dict[int, float]:
    """{threads: bytes/s} of reading `nbytes` on that many of the pool's threads (medians of `rounds`)."""
    return {t: nbytes / (statistics.median(memcpy_times(memcpy, nbytes, 5, read_only=True, threads=t)[0]
                                           for _ in range(rounds)) * 1e-6) for t in thread_counts()}


def prompt_ids(path: str, count: int) -> list[int]:
    """The first `count` tokens of the text as llama.cpp tokenizes it for the file (no BOS)."""
    from models import llama_cpp
    from models.real_models import TEXT
    from my_ops.hf.gguf_file import check

    with open(TEXT, encoding="utf-8") as f:
        ids = llama_cpp.tokenize(path, f.read(), parse_special=False)
    metadata = check(path).metadata
    if metadata.get("tokenizer.ggml.add_bos_token") and ids[:1] == [metadata.get("tokenizer.ggml.bos_token_id")]:
        ids = ids[1:]
    return ids[:count]


def float32_log_probs(path: str, saved, bos: int | None) -> list | None:
    """Each chunk's next-token log-probabilities (float64, [positions scored, vocabulary]) from the file's float32
    model: its tensors dequantized by transformers' GGUF loader, its rope factors applied, every activation in float32,
    each chunk in one forward pass. None when that model would take more than a third of this machine's memory."""
    from my_ops.hf import checkpoint as checkpoints
    from my_ops.hf.text import eager_chunk_log_probs

    with open("/proc/meminfo") as f:
        total = int(next(line for line in f if line.startswith("MemTotal:")).split()[1]) * 1024
    if checkpoints.float32_bytes(path) > total / 3:
        return None
    model = checkpoints.load(path).model
    ids = saved.tokens.reshape(-1).tolist()
    return [log_probs.numpy() for log_probs, _ in eager_chunk_log_probs(model, ids, saved.ctx, saved.chunks, bos)]


def agreement(pte: str, path: str, threads: int, work_dir: str) -> dict:
    """The program's next-token distributions against llama.cpp's on the same file and tokens: llama-perplexity's
    saved distributions (--kl-divergence-base: KL_CTX-token chunks of the text, KL_CHUNKS of them, BOS first where the
    model adds one), the program stepped through each chunk (its first half in one call, then a token at a time);
    mean KL divergence of the program's from llama.cpp's, as llama-perplexity --kl-divergence computes it, and the
    share of positions whose most likely token is the same. The reading of llama.cpp's file is checked against
    llama.cpp's own: its tokens are llama-tokenize's of the text, every distribution read sums to one within what its
    storage moves (each token it stored as at or below e^-16 of its top reads as that floor: the vocabulary's size
    times e^-16 at most), and the perplexity its distributions give the text's tokens is the one llama-perplexity
    --kl-divergence reads from the same file ("Mean PPL(base)"). Beside them, where it fits, the file's float32
    model's distributions (float32_log_probs): KL of each side's from it and each side's share of its top tokens, over
    the tokens llama.cpp's file keeps (so its storage floor weighs on neither side). And llama.cpp against itself:
    its distributions with flash attention off (its attention's arithmetic in another order and precision) against
    its default's, the same two figures: how far two correct programs' arithmetic moves this model's distributions,
    the floor under the program's."""
    import numpy as np

    from flow.runtime import load_method_checked
    from models import llama_cpp
    from models.real_models import TEXT
    from my_ops.hf.gguf_file import check

    saved_file = os.path.join(work_dir, "llama_cpp_logits.bin")
    printed = llama_cpp.save_logits(path, TEXT, KL_CTX, KL_CHUNKS, threads, saved_file)
    saved = llama_cpp.SavedLogits(saved_file)
    other_file = os.path.join(work_dir, "llama_cpp_logits_without_flash_attention.bin")
    llama_cpp.save_logits(path, TEXT, KL_CTX, KL_CHUNKS, threads, other_file, ("-fa", "off"))
    other = llama_cpp.SavedLogits(other_file)
    with open(TEXT, encoding="utf-8") as f:
        tokenized = llama_cpp.tokenize(path, f.read(), parse_special=False)[:saved.chunks * saved.ctx]
    if saved.tokens.reshape(-1).tolist() != tokenized:
        raise RuntimeError(f"{saved_file}: its tokens are not llama-tokenize's of the text: the file is not read as "
                           "llama.cpp wrote it")
    metadata = check(path).metadata
    bos = metadata.get("tokenizer.ggml.bos_token_id") if metadata.get("tokenizer.ggml.add_bos_token") else None
    method = load_method_checked(pte)
    reference = float32_log_probs(path, saved, bos)
    kl = nll = nll_base = kl_itself = 0.0
    same = same_itself = count = 0
    to_float = {"kl_program": 0.0, "kl_llama_cpp": 0.0, "top_program": 0, "top_llama_cpp": 0}
    first = saved.ctx // 2
    for chunk in range(saved.chunks):
        tokens = saved.tokens[chunk].tolist()
        if bos is not None:
            tokens[0] = bos
        method.execute([torch.tensor([tokens[:first]]), torch.tensor([0])])  # the first half only conditions
        for position in range(first, saved.ctx - 1):
            logits = method.execute([torch.tensor([[tokens[position]]]), torch.tensor([position])])[0]
            ours = torch.log_softmax(logits.reshape(-1).double(), 0).numpy()
            base = saved.log_probs(chunk, position)
            if abs(float(np.exp(base).sum()) - 1) > saved.vocab * np.exp(-16) + 1e-3:
                raise RuntimeError(f"{saved_file}: chunk {chunk} position {position}'s distribution sums to "
                                   f"{float(np.exp(base).sum()):.4f}: the file is not read as llama.cpp wrote it")
            kept = base > -16  # llama-perplexity's sum leaves out what it stored as below e^-16
            kl += float(np.sum(np.exp(base[kept]) * (base[kept] - ours[kept])))
            same += int(np.argmax(ours) == np.argmax(base))
            without = other.log_probs(chunk, position)
            kl_itself += float(np.sum(np.exp(base[kept]) * (base[kept] - without[kept])))
            same_itself += int(np.argmax(without) == np.argmax(base))
            if reference is not None:
                exact = reference[chunk][position - first]
                weights = np.exp(exact[kept])
                to_float["kl_program"] += float(np.sum(weights * (exact[kept] - ours[kept])))
                to_float["kl_llama_cpp"] += float(np.sum(weights * (exact[kept] - base[kept])))
                to_float["top_program"] += int(np.argmax(ours) == np.argmax(exact))
                to_float["top_llama_cpp"] += int(np.argmax(base) == np.argmax(exact))
            nll -= ours[tokens[position + 1]]
            nll_base -= base[tokens[position + 1]]
            count += 1
    read_back = llama_cpp.saved_perplexity(path, TEXT, KL_CTX, KL_CHUNKS, threads, saved_file)
    if abs(float(np.exp(nll_base / count)) / read_back - 1) > 1e-4:
        raise RuntimeError(f"{saved_file}: its distributions give the text perplexity {np.exp(nll_base / count):.6f}, "
                           f"llama-perplexity reads {read_back:.6f} from it: the file is not read as llama.cpp wrote it")
    return {"kl": kl / count, "same_top": same / count, "positions": count, "ppl": float(np.exp(nll / count)),
            "llama_cpp_ppl": printed,
            "llama_cpp_itself": {"kl": kl_itself / count, "same_top": same_itself / count},
            "to_float32": None if reference is None else {key: value / count for key, value in to_float.items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build_dir", required=True, help="a build with every op (AOT library, kernels, runner)")
    parser.add_argument("--memcpy", required=True, help="benchmark/memcpy_bandwidth's binary")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--kinds", default="Q4_K_M", help="the made files' llama-quantize presets (1b, 8b)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--output_dir", default=os.path.join(REPO_ROOT, "cmake-out", "scale"))
    add_isa_argument(parser)
    args = parser.parse_args()
    use_isa(args.isa)
    torch.set_num_threads(1)
    from flow.runtime import load_kernel_library
    from models.decoding import register_ops
    from models.real_models import runner_peak_bytes
    from models.scale_models import quantize_seconds

    register_ops(args.build_dir)
    load_kernel_library(os.path.join(args.build_dir, "libcustom_ops_lib.so"))
    runner = os.path.join(args.build_dir, "custom_ops_executor_runner")
    rows = []
    for name in args.models.split(","):
        for kind in (args.kinds.split(",") if name in ("1b", "8b") else ["as shipped"]):
            path = model_file(name, kind)
            prompt_tokens, new_tokens = TOKENS[name]
            ids = prompt_ids(path, prompt_tokens)
            row = {"model": name, "kind": kind if name in ("1b", "8b") else os.path.basename(path),
                   "file_gib": os.path.getsize(path) / 2 ** 30, "quantize_s": quantize_seconds(path)}
            row.update(export(path, args.build_dir, os.path.join(args.output_dir, f"{name}-{kind}")))
            row["pte_gib"] = os.path.getsize(row["pte"]) / 2 ** 30
            one = os.path.join(os.path.dirname(row["pte"]), "one_file_logits.bin")
            row["runner_peak_gib"] = runner_peak_bytes(runner, row["pte"], ids[:8], logits=one) / 2 ** 30
            row["data_file"] = with_data_file(path, args.build_dir, os.path.join(args.output_dir, f"{name}-{kind}-ptd"),
                                              runner, one, ids[:8])
            row["speed"] = measure(f"{name} {kind}", kind, row["pte"], path, ids, args.rounds, args.isa,
                                   new_tokens=new_tokens)
            row["agreement"] = agreement(row["pte"], path, thread_counts()[-1], os.path.dirname(row["pte"]))
            row["step_bytes"] = step_bytes(path)
            row["read"] = read_rates(args.memcpy, row["step_bytes"], args.rounds)
            print(f"{name} {kind}: exported in {row['export_s']:.1f} s, peak {row['export_peak_gib']:.2f} GiB; "
                  f".pte {row['pte_gib']:.2f} GiB; runner peak {row['runner_peak_gib']:.2f} GiB; KL "
                  f"{row['agreement']['kl']:.5f}, same top token {row['agreement']['same_top']:.1%} (llama.cpp "
                  f"against itself, flash attention off: {row['agreement']['llama_cpp_itself']['kl']:.5f}, "
                  f"{row['agreement']['llama_cpp_itself']['same_top']:.1%})", flush=True)
            if (exact := row["agreement"]["to_float32"]) is not None:
                print(f"  against the float32 model: KL {exact['kl_program']:.5f} (project), "
                      f"{exact['kl_llama_cpp']:.5f} (llama.cpp); its top token {exact['top_program']:.1%}, "
                      f"{exact['top_llama_cpp']:.1%}", flush=True)
            data = row["data_file"]
            print(f"  with model.ptd: export peak {data['export_peak_gib']:.2f} GiB, runner peak "
                  f"{data['runner_peak_gib']:.2f} GiB, logits {'equal' if data['same_logits'] else 'DIFFERENT'}",
                  flush=True)
            rows.append(row)
    print(f"\nGGUF files at their sizes (export --quantize gguf; the Python runtime beside llama-bench on the same "
          f"file, medians of {args.rounds} interleaved rounds, min-max of each ratio; {os.cpu_count()} cores)\n"
          f"{isa_line(args.isa)}\n")
    print("\n".join(report(rows)))
    return 0


def report(rows: list[dict]) -> list[str]:
    counts = thread_counts()
    lines = ["| model | file GiB | export s (llama-quantize s) | export peak GiB (x file) | .pte GiB | runner peak GiB "
             "(x file) | first token s | KL vs llama.cpp | same top token | llama.cpp vs itself: KL | same top "
             "token | PPL project / llama.cpp |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        first = [rd[counts[-1]]["project"]["first_token_ms"] / 1e3 for rd in row["speed"]["rounds"]]
        quantize = f" ({row['quantize_s']:.0f})" if row["quantize_s"] else ""
        lines.append(f"| {row['model']} {row['kind']} | {row['file_gib']:.2f} | {row['export_s']:.0f}{quantize} | "
                     f"{row['export_peak_gib']:.2f} ({row['export_peak_gib'] / row['file_gib']:.2f}x) | "
                     f"{row['pte_gib']:.2f} | {row['runner_peak_gib']:.2f} "
                     f"({row['runner_peak_gib'] / row['file_gib']:.2f}x) | {statistics.median(first):.2f} | "
                     f"{row['agreement']['kl']:.4f} | {row['agreement']['same_top']:.1%} | "
                     f"{row['agreement']['llama_cpp_itself']['kl']:.4f} | "
                     f"{row['agreement']['llama_cpp_itself']['same_top']:.1%} | "
                     f"{row['agreement']['ppl']:.2f} / {row['agreement']['llama_cpp_ppl']:.2f} |")
    lines += ["", "| model | KL from the float32 model: project | llama.cpp | its top token: project | llama.cpp |",
              "| --- | ---: | ---: | ---: | ---: |"]
    for row in rows:
        exact = row["agreement"]["to_float32"]
        cells = ["not measured (the float32 model does not fit)"] * 4 if exact is None else [
            f"{exact['kl_program']:.4f}", f"{exact['kl_llama_cpp']:.4f}", f"{exact['top_program']:.1%}",
            f"{exact['top_llama_cpp']:.1%}"]
        lines.append(f"| {row['model']} {row['kind']} | " + " | ".join(cells) + " |")
    lines += ["", "| model | with model.ptd: export s | export peak GiB (x file) | .pte KiB | .ptd GiB | runner peak "
              "GiB (x file) | logits = the one file's |", "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for row in rows:
        d = row["data_file"]
        lines.append(f"| {row['model']} {row['kind']} | {d['export_s']:.0f} | {d['export_peak_gib']:.2f} "
                     f"({d['export_peak_gib'] / row['file_gib']:.2f}x) | {d['pte_kib']:.0f} | {d['ptd_gib']:.2f} | "
                     f"{d['runner_peak_gib']:.2f} ({d['runner_peak_gib'] / row['file_gib']:.2f}x) | "
                     f"{'yes' if d['same_logits'] else 'NO'} |")
    header = ["model"]
    for t in counts:
        header += [f"decode {t}t project (read bound share)", "llama.cpp (share)", "ratio"]
    for t in counts:
        header += [f"prefill {t}t ratio"]
    lines += ["", "| " + " | ".join(header) + " |", "| --- |" + " ---: |" * (len(header) - 1)]
    for row in rows:
        rounds = row["speed"]["rounds"]
        cells = [f"{row['model']} {row['kind']}"]
        for t in counts:
            ours = [rd[t]["project"]["decode"] for rd in rounds]
            theirs = [rd[t]["llama.cpp"]["decode"] for rd in rounds]
            bound = row["read"][t] / row["step_bytes"]  # steps a second if a step only read its bytes
            ratios = [a / b for a, b in zip(ours, theirs)]
            cells += [f"{statistics.median(ours):.2f} ({statistics.median(ours) / bound:.0%})",
                      f"{statistics.median(theirs):.2f} ({statistics.median(theirs) / bound:.0%})",
                      f"{statistics.median(ratios):.2f}x ({spread(ratios)})"]
        for t in counts:
            ratios = [rd[t]["project"]["prefill"] / rd[t]["llama.cpp"]["prefill"] for rd in rounds]
            cells.append(f"{statistics.median(ratios):.2f}x ({spread(ratios)})")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
