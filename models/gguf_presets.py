"""The GGUF files people download, on their own tensors (`test_custom_ops.sh real`, after the shipped file's checks):
llama-quantize's presets (Q4_K_M, Q5_K_M, Q6_K, Q3_K_M, Q2_K, Q5_0) made from the shipped SmolLM2 file
(models/real_models.py), that file itself, and Gemma 3 270M's Q4_K_M file as downloaded (`gemma3`:
models/real_models.py's GEMMA3, at its context of 1024, where its local layers' window slides, on
examples/alice_chapters1_3.txt), each exported with --quantize gguf (my_ops.gguf: every tensor in its own format), then

    its perplexity of examples/alice_chapter1.txt (Gemma 3: its own text and context) by llama-perplexity's protocol
    (chunks of CTX tokens, the second half of each scored), computed in ExecuTorch, beside llama-perplexity's own on
    the same file and text (within LLAMA_GOAL) and beside the float32 model transformers dequantizes from the same
    file (within FLOAT32_GOAL); the program's size beside the file's (within SIZE_GOAL).

    python -m models.gguf_presets --build_dir cmake-out/all_ops [--presets Q4_K_M,Q2_K,gemma3] [--threads 2]
"""

from __future__ import annotations

import argparse
import collections
import copy
import os
import sys

from flow import REPO_ROOT

PRESETS = ("Q4_K_M", "Q5_K_M", "Q6_K", "Q3_K_M", "Q2_K", "Q5_0")
SHIPPED = "Q4_1 (shipped)"
CTX = 256
LLAMA_GOAL, FLOAT32_GOAL, SIZE_GOAL = 0.005, 0.01, 0.05
PRESET_DIR = os.path.join(REPO_ROOT, "cmake-out", "llama.cpp", "presets")


def other_models() -> tuple[str, ...]:
    """models/real_models.py's models beside SmolLM2 (whose file the presets are made from), each at its own context and
    positions."""
    from models import real_models as real

    return tuple(name for name, model in real.MODELS.items() if model is not real.SMOLLM2)


def preset_file(preset: str) -> str:
    """The shipped file requantized to `preset` by llama-quantize (made once), the shipped file itself, or another
    model's file (models/real_models.py's MODELS: gemma3)."""
    from models import llama_cpp, real_models as real

    if preset in other_models():
        return real.MODELS[preset].path()
    return real.gguf_path() if preset == SHIPPED else llama_cpp.quantized(real.gguf_path(), preset, PRESET_DIR)


def tensor_types(path: str) -> str:
    """"Q5_0 166, Q4_K 16, ...": the file's tensor types by count, most first (its F32 norms left out)."""
    import gguf

    from my_ops.hf.gguf_file import check

    counts = collections.Counter(gguf.GGMLQuantizationType(t.type_id).name for t in check(path).tensors)
    counts.pop("F32", None)
    return ", ".join(f"{kind} {count}" for kind, count in counts.most_common())


def measure(label: str, path: str, threads: int, ctx: int = CTX, max_seq_len: int | None = None,
            text: str | None = None) -> dict:
    """One row, for the GGUF file at `path`: the program's and llama.cpp's perplexity of `text` (default: the real
    mode's) in chunks of `ctx`, the float32 model's, sizes, tensor types. The program holds max_seq_len positions
    (default: the real mode's)."""
    from models import llama_cpp, real_models as real
    from flow.runtime import load_method_checked
    from my_ops.hf.checkpoint import load
    from my_ops.hf.session import default_cache_dir, export_cached
    from my_ops.hf.text import chunked_perplexity, eager_chunked_perplexity, perplexity_ids

    text = text or real.TEXT
    checkpoint = load(path)
    bos = checkpoint.tokenizer.bos_token_id if checkpoint.add_bos else None
    with open(text, encoding="utf-8") as f:
        ids = perplexity_ids(checkpoint.tokenizer, f.read(), bos)  # the text as llama-perplexity tokenizes it
    float32, scored = eager_chunked_perplexity(checkpoint.model, ids, ctx, None, bos)
    pte, _ = export_cached(copy.deepcopy(checkpoint), "gguf", max_seq_len or real.MAX_SEQ_LEN, default_cache_dir())
    method = load_method_checked(pte)
    ours, _ = chunked_perplexity(lambda t, p: method.execute([t, p])[0], ids, ctx, None, bos)
    return {"preset": label, "types": tensor_types(path), "file_mib": os.path.getsize(path) / 2 ** 20,
            "pte_mib": os.path.getsize(pte) / 2 ** 20, "ctx": ctx, "text": text, "scored": scored, "project": ours,
            "float32": float32, "llama_cpp": llama_cpp.perplexity(path, text, ctx, threads)}


def measure_preset(preset: str, threads: int) -> dict:
    """measure() of a preset's file, or of another model's at its own context and positions."""
    from models import real_models as real

    if preset in other_models():
        model = real.MODELS[preset]
        return measure(os.path.basename(model.path()), model.path(), threads, ctx=model.perplexity_ctx,
                       max_seq_len=model.max_seq_len, text=model.perplexity_text)
    return measure(preset, preset_file(preset), threads)


def report(rows: list[dict]) -> tuple[list[str], list[str]]:
    """The table's lines, and each goal missed (none: all met)."""
    chunks = sorted({(os.path.relpath(row["text"], REPO_ROOT), row["ctx"], row["scored"]) for row in rows})
    lines = ["GGUF files on their own tensors (--quantize gguf): perplexity by llama-perplexity's protocol (" +
             "; ".join(f"{text} in chunks of {ctx}, the second half of each scored: {scored} tokens"
                       for text, ctx, scored in chunks) +
             "), the program in ExecuTorch beside `llama-perplexity` on the same file and text and beside the "
             "float32 model transformers dequantizes from the same file.", "",
             "| file | tensor types (besides F32 norms) | context | file MiB | .pte MiB | perplexity, program "
             "| llama-perplexity | program over it | float32 of the file | program over it |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    missed = []
    for row in rows:
        over_llama, over_float = row["project"] / row["llama_cpp"] - 1, row["project"] / row["float32"] - 1
        size = row["pte_mib"] / row["file_mib"] - 1
        lines.append(f"| {row['preset']} | {row['types']} | {row['ctx']} | {row['file_mib']:.1f} | "
                     f"{row['pte_mib']:.1f} "
                     f"({100 * size:+.1f}%) | {row['project']:.4f} | {row['llama_cpp']:.4f} | {100 * over_llama:+.2f}% "
                     f"| {row['float32']:.4f} | {100 * over_float:+.2f}% |")
        for what, value, goal in (("perplexity over llama-perplexity's", over_llama, LLAMA_GOAL),
                                  ("perplexity over the file's float32 model's", over_float, FLOAT32_GOAL),
                                  (".pte size over the file's", size, SIZE_GOAL)):
            if abs(value) > goal:
                missed.append(f"{row['preset']}: {what} {100 * value:+.2f}%, past the goal of {100 * goal:.1f}%")
    return lines, missed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build_dir", required=True, help="a build with every op: its AOT library and kernels")
    parser.add_argument("--presets", default=",".join((SHIPPED.split()[0], *PRESETS)),
                        help="llama-quantize presets to make from the shipped file, Q4_1 for the file itself, gemma3 "
                             "for Gemma 3's file")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="llama-perplexity's threads")
    args = parser.parse_args()
    from models.decoding import register_ops
    from flow.runtime import load_kernel_library

    chosen = [SHIPPED if p == SHIPPED.split()[0] else p for p in args.presets.split(",") if p]
    if unknown := [p for p in chosen if p != SHIPPED and p not in PRESETS and p not in other_models()]:
        print(f"error: no preset {', '.join(unknown)}; choose from {SHIPPED.split()[0]}, {', '.join(PRESETS)}, "
              f"{', '.join(other_models())}", file=sys.stderr)
        return 2
    register_ops(args.build_dir)
    load_kernel_library(os.path.join(args.build_dir, "libcustom_ops_lib.so"))
    rows = []
    for preset in chosen:
        rows.append(measure_preset(preset, args.threads))
        print(f"{preset}: program {rows[-1]['project']:.4f}, llama-perplexity {rows[-1]['llama_cpp']:.4f}, float32 "
              f"{rows[-1]['float32']:.4f}", flush=True)
    lines, missed = report(rows)
    print("\n" + "\n".join(lines))
    if missed:
        print("error: " + "; ".join(missed), file=sys.stderr)
        return 1
    print(f"\nEvery file within {100 * LLAMA_GOAL:.1f}% of llama-perplexity's, {100 * FLOAT32_GOAL:.0f}% of its float32 "
          f"model's, its .pte within {100 * SIZE_GOAL:.0f}% of the file.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
