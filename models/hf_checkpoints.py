"""The project's ops in models it did not write (`test_custom_ops.sh hf`): tiny Hugging Face checkpoints
(examples/hf_models.py) loaded with from_pretrained, put on my_ops and exported by my_ops.hf, then decoded greedily
in the project's C++ runner and in ExecuTorch's Python runtime and compared with transformers itself:

    python -m models.hf_checkpoints export --build_dir cmake-out/all_ops --output_dir cmake-out/hf
                                           [--models llama,qwen3,gemma3]
    python -m models.hf_checkpoints check --build_dir cmake-out/all_ops --runner_dir cmake-out/hf/runner
                                          --output_dir cmake-out/hf

export makes each checkpoint and writes <model>.pte (float32) and <model>_8da8w.pte; check decodes each program twice
in the runner (built by selective build from the programs) and twice in the Python runtime (check_program). The
references never run a my_ops kernel: float32, transformers' own greedy generate() on the untouched model; 8-bit, the
same quantized model in eager PyTorch with every my_ops op computed by its ATen reference.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from models.decoding import Decoded, decode_runner, decode_runtime, difference, greedy_decode

MODELS = ("llama", "qwen3", "gemma3")
QUANTIZED = "8da8w"
FLOAT32_TOLERANCE = dict(atol=1e-3, rtol=1e-4)
QUANTIZED_TOLERANCE = dict(atol=0.3, rtol=0.0)
CACHE_DIR = "hf_programs"  # under cmake-out/


def checkpoint_dir(output_dir: str, name: str) -> str:
    return os.path.join(output_dir, "checkpoints", name)


def program_path(output_dir: str, name: str, quantized: bool) -> str:
    return os.path.join(output_dir, f"{name}_{QUANTIZED}.pte" if quantized else f"{name}.pte")


def hf_models():
    from flow.declarations import import_repository_module

    return import_repository_module("examples.hf_models")


def programs_of(names) -> list[tuple[str, bool]]:
    """(model, quantized) of every program the mode makes for these models: float32 and 8-bit each."""
    return [(name, quantized) for name in names for quantized in (False, True)]


def export_all(programs, output_dir: str) -> list[str]:
    """Makes each checkpoint, loads it back, swaps and exports each (model, quantized); returns the programs written.
    An export takes seconds a program, so programs are cached in cmake-out/hf_programs/ by a hash of every source and
    package version they come from (flow/artifact_cache.py: the machinery and the ops my_ops.hf puts in programs);
    the checkpoints, which the checks read, are made anew."""
    import shutil

    import my_ops.hf
    from flow import artifact_cache
    from flow.export import written_whole
    from my_ops.hf.session import PROGRAM_OPS

    m = hf_models()
    # Each checkpoint made once per call, never reused from an earlier run (examples/hf_models.py may have changed).
    names = dict.fromkeys(name for name, _ in programs)
    directories = {name: m.make_checkpoint(name, checkpoint_dir(output_dir, name)) for name in names}
    written = []
    for name, quantized in programs:
        def export(path: str, name=name, quantized=quantized) -> None:
            program = my_ops.hf.export_program(m.load(directories[name]), max_seq_len=m.MAX_POSITIONS,
                                               quantize=QUANTIZED if quantized else None)
            with open(path, "wb") as f:
                program.write_to_file(f)

        destination = program_path(output_dir, name, quantized)
        cached, made = artifact_cache.cached(CACHE_DIR, os.path.basename(destination), export,
                                             ops=[f"my_ops::{op}" for op in PROGRAM_OPS])
        with open(cached, "rb") as source:  # a copy: the cache keeps its own
            written.append(written_whole(destination, lambda f: shutil.copyfileobj(source, f)))
        print(f"{'Exported' if made else 'Reused (sources unchanged)'} {os.path.relpath(written[-1])}")
    return written


# ExecuTorch's own LLM runner (extension/llm/runner's TextLLMRunner, a binding in the wheel) runs the programs too: they
# carry the metadata methods it reads (my_ops/hf/to_program.py). It takes text, so the tiny vocabulary gets a tokenizer
# in llama.2c's format, which that runner loads: printable ASCII as itself, every other id as "<xx>" (no two pieces
# merge). BOS and EOS are vocab_size, an id no logit can pick, so a generation is exactly the tokens asked for.
LLM_RUNNER_PROMPT = "abcdefg"  # 8 tokens with the leading space llama2.c's encoder adds


def llm_runner_pieces(vocab_size: int) -> list[str]:
    return [chr(i) if 32 <= i < 127 else f"<{i:02x}>" for i in range(vocab_size)]


def llm_runner_prompt_ids() -> list[int]:
    return [ord(c) for c in " " + LLM_RUNNER_PROMPT]


def write_llm_runner_tokenizer(path: str, vocab_size: int) -> str:
    """llama2.c's format: vocab size, BOS, EOS and the longest piece as int32, then per token a float score, an int32
    length and the bytes."""
    import struct

    pieces = [p.encode() for p in llm_runner_pieces(vocab_size)]
    with open(path, "wb") as f:
        f.write(struct.pack("<4i", vocab_size, vocab_size, vocab_size, max(map(len, pieces))))
        for piece in pieces:
            f.write(struct.pack("<fi", 0.0, len(piece)) + piece)
    return path


def llm_runner_config(new_tokens: int, max_seq_len: int):
    """Greedy, no BOS or EOS added, the prompt not echoed."""
    from executorch.extension.llm.runner import GenerationConfig

    return GenerationConfig(echo=False, max_new_tokens=new_tokens, seq_len=max_seq_len, temperature=0.0, num_bos=0,
                            num_eos=0)


def generate_eager(directory: str, prompt, new_tokens: int) -> Decoded:
    """transformers' own greedy decoding on the untouched model (its default attention and dynamic cache)."""
    m = hf_models()
    model = m.load(directory)
    with torch.no_grad():
        out = model.generate(torch.tensor([list(prompt)]), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, output_logits=True, return_dict_in_generate=True)
    return Decoded(out.sequences[0, len(prompt):].tolist(), torch.cat(out.logits).float())


def reference_decode(model, quantize: str | None, max_seq_len: int, prompt, new_tokens: int) -> Decoded:
    """`model` (a transformers model, swapped in place) on my_ops at `quantize`, decoded greedily in eager PyTorch with
    every my_ops op computed by its declared ATen reference (no kernel under test): the eager quantized model a
    quantized program is checked against."""
    import my_ops.hf
    from flow import declarations
    from flow.reference import ReferenceMode, RememberedDequantization, references

    decoder = my_ops.hf.prepare(model, max_seq_len=max_seq_len, quantize=quantize)
    with torch.no_grad(), RememberedDequantization(), ReferenceMode(references(declarations.load().values())):
        return greedy_decode(decoder, prompt, new_tokens)


def quantized_reference(directory: str, prompt, new_tokens: int) -> Decoded:
    m = hf_models()
    return reference_decode(m.load(directory), QUANTIZED, m.MAX_POSITIONS, prompt, new_tokens)


def decode_forced(pte: str, prompt, tokens) -> Decoded:
    """The program in the Python runtime fed `tokens` (the reference's) instead of its own choices: each step's logits
    on the reference's path, so a near tie the program breaks the other way does not change what follows."""
    from flow.runtime import load_method_checked

    method = load_method_checked(pte)
    feed = iter(tokens)
    return greedy_decode(lambda t, p: method.execute([t, p])[0], prompt, len(tokens), choose=lambda _: next(feed))


def check_program(pte: str, directory: str, runner: str, quantized: bool) -> str:
    """Decodes `pte` twice in the runner and twice in the Python runtime; returns what to print, or raises
    AssertionError. float32: the tokens of transformers' generate(), logits within FLOAT32_TOLERANCE. 8-bit: the
    runner and the Python runtime decode the same tokens and logits, bit for bit, and fed the tokens of the same
    quantized model in eager PyTorch (every my_ops op computed by its ATen reference), the program's logits are within
    QUANTIZED_TOLERANCE of its at every step: the program quantizes activations with the same arithmetic, but a sum
    accumulated in another order can move an activation across a rounding boundary of its int8 grid."""
    m = hf_models()
    runs = {"runner": decode_runner(runner, pte, m.PROMPT, m.NEW_TOKENS, generations=2),
            "Python runtime": decode_runtime(pte, m.PROMPT, m.NEW_TOKENS, generations=2)}
    name = os.path.basename(pte)
    if not quantized:
        expected = generate_eager(directory, m.PROMPT, m.NEW_TOKENS)
        for where, decoded in runs.items():
            if (problem := difference(decoded, expected, FLOAT32_TOLERANCE)) is not None:
                raise AssertionError(f"{name} in the {where}: {problem}")
        worst = max(float((d.logits - expected.logits).abs().max()) for d in runs.values())
        what = f"{m.NEW_TOKENS} tokens equal transformers' generate() (largest logit difference {worst:.2g})"
    else:
        if (problem := difference(runs["runner"], runs["Python runtime"], dict(atol=0, rtol=0))) is not None:
            raise AssertionError(f"{name}: the runner and the Python runtime differ: {problem}")
        expected = quantized_reference(directory, m.PROMPT, m.NEW_TOKENS)
        forced = decode_forced(pte, m.PROMPT, expected.tokens)
        try:
            torch.testing.assert_close(forced.logits, expected.logits, **QUANTIZED_TOLERANCE)
        except AssertionError as err:
            raise AssertionError(f"{name} fed eager's tokens: logits differ beyond {QUANTIZED_TOLERANCE}: {err}")
        same = next((i for i, (a, b) in enumerate(zip(runs["runner"].tokens, expected.tokens)) if a != b), None)
        worst = float((forced.logits - expected.logits).abs().max())
        what = (f"runner = Python runtime; fed eager's {m.NEW_TOKENS} tokens, logits within "
                f"{worst:.2g} of 8-bit eager (ATen references); free-running, the first "
                f"{m.NEW_TOKENS if same is None else same} tokens equal eager's")
    speed = runs["runner"]
    return (f"{name}: {what}; runner: prefill {speed.prefill_us:.0f} us, decode {speed.decode_tokens_per_s:.0f} "
            "tokens/s")


def check_all(programs, output_dir: str, runner: str) -> int:
    from flow.program import missing_from, registered_in

    registered = registered_in(runner)
    for name, quantized in programs:
        pte = program_path(output_dir, name, quantized)
        if missing := missing_from(pte, registered):
            print(f"error: {runner} cannot run {pte}: it lacks {', '.join(missing)}", file=sys.stderr)
            return 1
        try:
            print(check_program(pte, checkpoint_dir(output_dir, name), runner, quantized))
        except AssertionError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=("export", "check"))
    parser.add_argument("--build_dir", required=True, help="a build with every op: its AOT library registers them")
    parser.add_argument("--runner_dir", help="check: the runner's build (custom_ops_executor_runner and its kernel "
                                             "library, selected from the programs)")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--models", default=",".join(MODELS), help=f"of {', '.join(MODELS)}")
    args = parser.parse_args()
    from models.decoding import chosen, register_ops
    from flow.runtime import load_kernel_library

    if (names := chosen(args.models, MODELS, "model")) is None:
        return 2
    register_ops(args.build_dir)
    if args.stage == "export":
        export_all(programs_of(names), args.output_dir)
        return 0
    if args.runner_dir is None:
        parser.error("check needs --runner_dir")
    load_kernel_library(os.path.join(args.runner_dir, "libcustom_ops_lib.so"))
    return check_all(programs_of(names), args.output_dir, os.path.join(args.runner_dir, "custom_ops_executor_runner"))


if __name__ == "__main__":
    sys.exit(main())
