"""The example ops in a real model (examples/decoder.py): export it with its linear layers lowered to XNNPACK (float32, or 8-bit
dynamically quantized with XNNPACK's quantizer) and the custom ops left on this project's kernels, check the runner
links everything the program needs, then decode greedily in the C++ runner and in the Python runtime and compare with
eager PyTorch:

    python -m flow.model --build_dir cmake-out/all_ops [--variants decoder,decoder_q8] [--output_dir DIR]

The eager reference is the same model with the custom ops written as ATen ops (rms_norm's reference, a slice
assignment into the cache, attention as bmm/softmax/bmm over the filled positions), so no kernel under test computes
its own expected values. float32: the same tokens, and
logits within FLOAT32_TOLERANCE (XNNPACK's GEMMs and the fused norm round differently from ATen's, never more). 8-bit:
the same tokens as the quantized graph run in eager, logits within QUANTIZED_TOLERANCE (XNNPACK quantizes each
token's activations itself, with its own rounding).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from flow import REPO_ROOT

MODEL_MODULE = "examples.decoder"  # the example model: Decoder, Config, PROMPT, NEW_TOKENS, prompt_inputs, dynamic_shapes
FLOAT32_TOLERANCE = dict(atol=1e-4, rtol=1e-4)
QUANTIZED_TOLERANCE = dict(atol=0.3, rtol=0.0)  # logits span about +-4


@dataclass(frozen=True)
class Variant:
    custom_ops: bool = True  # False: rms_norm, the cache update and attention written as ATen ops (the baseline)
    fused_attention: bool = True  # False: attention as ATen ops over the caches (before my_ops::sdpa_with_cache)
    xnnpack: bool = True  # linear layers (and what else XNNPACK takes) lowered to the XNNPACK delegate
    quantized: bool = False  # 8-bit: int8 weights per channel, activations quantized per token at run time


VARIANTS = {
    "decoder": Variant(),
    "decoder_q8": Variant(quantized=True),
    "decoder_aten_ops": Variant(custom_ops=False),
    "decoder_aten_attention": Variant(fused_attention=False),
    "decoder_undelegated": Variant(xnnpack=False),
}
TESTED = ("decoder", "decoder_q8")  # what `test_custom_ops.sh model` checks; the benchmark times them all
# The declared ops the example model calls: what of the op library its programs are made from (export_cached's key).
CALLED_OPS = ("my_ops::rms_norm", "my_ops::sdpa_with_cache", "my_ops::update_cache")


def model_module():
    from flow.declarations import import_repository_module

    return import_repository_module(MODEL_MODULE)


def register_ops(build_dir: str) -> None:
    """Every declared op known to PyTorch, C++ ones from the build's AOT library (the model calls several)."""
    from flow import declarations, registration

    registration.register_with_pytorch(list(declarations.load().values()),
                                       aot_library=os.path.join(build_dir, "libcustom_ops_aot_lib.so"))


def _quantize(model: torch.nn.Module, inputs, dynamic_shapes) -> torch.nn.Module:
    """XNNPACK's 8-bit dynamic quantization (what ExecuTorch's LLM export uses for linear layers), calibrated on the
    prompt; returns the converted graph, which runs in eager as the quantized model's reference."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer, get_symmetric_quantization_config)
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True))
    captured = torch.export.export(model, inputs, dynamic_shapes=dynamic_shapes, strict=True).module()
    prepared = prepare_pt2e(captured, quantizer)
    prepared(*inputs)
    return convert_pt2e(prepared)


def config(max_seq: int | None = None):
    """The model's Config, with another number of cache positions if given."""
    m = model_module()
    return m.Config() if max_seq is None else m.Config(max_seq=max_seq)


def build(variant: Variant, *, reference: bool = False, max_seq: int | None = None) -> torch.nn.Module:
    """The eager model of `variant`, seeded (every variant has the same weights). reference=True: its eager reference,
    the same model with ATen ops in place of the custom ops."""
    m = model_module()
    # No gradients: an inference model, and the quantizer's folded weights would otherwise be non-leaf tensors the
    # ETRecord cannot copy.
    model = m.Decoder(config(max_seq), custom_ops=variant.custom_ops and not reference,
                      fused_attention=variant.fused_attention).eval().requires_grad_(False)
    if variant.quantized:
        model = _quantize(model, m.prompt_inputs(), m.dynamic_shapes(config(max_seq)))
    return model


def export(name: str, output_dir: str, *, etrecord: bool = False, max_seq: int | None = None) -> str:
    """Exports VARIANTS[name] to <output_dir>/<name>.pte; returns its path."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    from flow.export import export_to_pte

    variant, m = VARIANTS[name], model_module()
    return export_to_pte(build(variant, max_seq=max_seq), m.prompt_inputs(), os.path.join(output_dir, f"{name}.pte"),
                         dynamic_shapes=m.dynamic_shapes(config(max_seq)), etrecord=etrecord,
                         partitioners=[XnnpackPartitioner()] if variant.xnnpack else ())


def export_cached(name: str, output_dir: str) -> str:
    """export(name)'s program copied to <output_dir>/<name>.pte, made once per source hash into cmake-out/
    (flow/artifact_cache.py: the machinery and CALLED_OPS' files). A program that calls another declared op is an
    error, not a cache entry keyed without that op's files."""
    import shutil

    from flow import artifact_cache, declarations, program
    from flow.export import written_whole

    def make(path: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            made = export(name, tmp)
            declared = {op.out_name for op in declarations.load().values()}
            if others := sorted(set(program.read(made).operators) & declared - {f"{op}.out" for op in CALLED_OPS}):
                raise RuntimeError(f"{name} calls {', '.join(others)}, which flow/model.py's CALLED_OPS does not "
                                   "name; add them, so its cached program is made again when they change")
            os.replace(made, path)

    cached, _ = artifact_cache.cached("decoder_programs", f"{name}.pte", make, ops=CALLED_OPS)
    with open(cached, "rb") as source:  # a copy: the cache keeps its own
        return written_whole(os.path.join(output_dir, f"{name}.pte"), lambda f: shutil.copyfileobj(source, f))


@dataclass
class Decoded:
    tokens: list[int]
    logits: torch.Tensor  # [steps, vocab], prefill first
    prefill_us: float = 0.0  # the runner's averages over its generations
    decode_tokens_per_s: float = 0.0


def greedy_decode(step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], prompt: Sequence[int],
                  new_tokens: int, choose: Callable[[torch.Tensor], int] = lambda logits: int(logits.argmax())) -> Decoded:
    """Greedy decoding with any implementation of the model's forward, step(tokens [1, T], input_pos [1]) -> logits
    [1, vocab]: the prompt at position 0, then each argmax fed back at the next position (or what `choose` picks:
    another decoding's tokens, to follow its path)."""
    tokens = torch.tensor([list(prompt)], dtype=torch.int64)
    position = torch.tensor([0], dtype=torch.int64)
    generated, logits = [], []
    for _ in range(new_tokens):
        out = step(tokens, position)
        logits.append(out.reshape(-1).clone())  # a runtime may reuse the output's memory in the next step
        generated.append(choose(out))
        position = position + tokens.shape[1]
        tokens = torch.tensor([[generated[-1]]], dtype=torch.int64)
    return Decoded(generated, torch.stack(logits))


def decode_eager(model: torch.nn.Module, prompt: Sequence[int], new_tokens: int) -> Decoded:
    with torch.no_grad():
        return greedy_decode(model, prompt, new_tokens)


def decode_runtime(pte: str, prompt: Sequence[int], new_tokens: int, *, generations: int = 1) -> Decoded:
    """In ExecuTorch's Python runtime (the kernel library loaded first: flow.runtime.load_kernel_library),
    `generations` times on the same method (each starts over at position 0 on the caches the last one filled); the
    last generation."""
    from flow.runtime import load_method_checked

    method = load_method_checked(pte)
    for _ in range(generations):
        decoded = greedy_decode(lambda tokens, position: method.execute([tokens, position])[0], prompt, new_tokens)
    return decoded


def decode_runner(runner: str, pte: str, prompt: Sequence[int], new_tokens: int, *, generations: int = 1) -> Decoded:
    """In the C++ runner's decode loop (--prompt/--new_tokens), `generations` times; the last generation."""
    return decode_command([runner, f"--model_path={pte}"], prompt, new_tokens, generations=generations)


def decode_command(command: Sequence[str], prompt: Sequence[int], new_tokens: int, *, generations: int = 1) -> Decoded:
    """decode_runner for any runner with the same decoding flags and output (custom_ops_aoti_runner too): `command`
    is the runner and the flags that name the model."""
    from flow.runner import RunnerError

    with tempfile.TemporaryDirectory() as tmp:
        logits_path = os.path.join(tmp, "logits.bin")
        proc = subprocess.run(
            [*command, f"--prompt={','.join(map(str, prompt))}", f"--new_tokens={new_tokens}",
             f"--num_executions={generations}", f"--logits_path={logits_path}"],
            capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RunnerError(f"runner exited {proc.returncode}:\n{proc.stderr}{proc.stdout}")
        with open(logits_path, "rb") as f:
            logits = torch.frombuffer(bytearray(f.read()), dtype=torch.float32).reshape(new_tokens, -1)
    timing = re.search(r"^Prefill: \d+ tokens in ([\d.]+) us; decode: .*\(([\d.]+) tokens/s\)", proc.stdout, re.M)
    return Decoded(printed_tokens(proc.stdout), logits, float(timing.group(1)), float(timing.group(2)))


def printed_tokens(runner_output: str) -> list[int]:
    """The tokens the runner's decode loop printed (its "Tokens:" line)."""
    return [int(t) for t in re.search(r"^Tokens:(.*)$", runner_output, re.M).group(1).split()]


def difference(actual: Decoded, expected: Decoded, tolerance: dict) -> str | None:
    """None when `actual` has the expected tokens and logits within `tolerance`; else what differs first."""
    if actual.tokens != expected.tokens:
        step = next(i for i, (a, e) in enumerate(zip(actual.tokens + [None], expected.tokens)) if a != e)
        return f"tokens differ from step {step}: {actual.tokens} where eager gives {expected.tokens}"
    try:
        torch.testing.assert_close(actual.logits, expected.logits, **tolerance)
    except AssertionError as err:
        return f"logits differ beyond {tolerance}: {err}"
    return None


def tolerance_of(name: str) -> dict:
    return QUANTIZED_TOLERANCE if VARIANTS[name].quantized else FLOAT32_TOLERANCE


def check_variant(name: str, pte: str, runner: str) -> list[str]:
    """Decodes `pte` (VARIANTS[name]) twice in the runner and twice in the Python runtime (the second generation starts
    over on the caches the first filled), compared with eager; returns what to print. Raises AssertionError on a
    difference."""
    from flow.program import missing_from, registered_in

    m = model_module()
    if missing := missing_from(pte, registered_in(runner)):
        raise AssertionError(f"{runner} cannot run {pte}: it lacks {', '.join(missing)}")
    expected = decode_eager(build(VARIANTS[name], reference=True), m.PROMPT, m.NEW_TOKENS)
    results = {"runner": decode_runner(runner, pte, m.PROMPT, m.NEW_TOKENS, generations=2),
               "Python runtime": decode_runtime(pte, m.PROMPT, m.NEW_TOKENS, generations=2)}
    for where, decoded in results.items():
        if (problem := difference(decoded, expected, tolerance_of(name))) is not None:
            raise AssertionError(f"{name}.pte in the {where}: {problem}")
    speed = results["runner"]
    return [f"{name}: {expected.tokens} in the runner, the Python runtime and eager",
            f"runner: prefill of {len(m.PROMPT)} tokens {speed.prefill_us:.0f} us, decode "
            f"{speed.decode_tokens_per_s:.0f} tokens/s"]


def chosen(listed: str, known, what: str) -> list[str] | None:
    """The names of a comma-separated command-line list, or None after one error line naming the unknown ones."""
    names = listed.split(",")
    if unknown := [n for n in names if n not in known]:
        print(f"error: unknown {what}(s) {', '.join(unknown)}; known: {', '.join(known)}", file=sys.stderr)
        return None
    return names


def main() -> int:
    parser = argparse.ArgumentParser(description="Exports the example decoder, decodes it in the runner and the "
                                                 "Python runtime, and compares with eager PyTorch")
    parser.add_argument("--build_dir", required=True,
                        help="the CMake build with every op: its runner, kernel library and AOT library")
    parser.add_argument("--variants", default=",".join(TESTED), help=f"of {', '.join(VARIANTS)}")
    parser.add_argument("--output_dir", default=REPO_ROOT)
    args = parser.parse_args()
    from flow.runtime import load_kernel_library

    if (names := chosen(args.variants, VARIANTS, "variant")) is None:
        return 2
    register_ops(args.build_dir)
    load_kernel_library(os.path.join(args.build_dir, "libcustom_ops_lib.so"))
    runner = os.path.join(args.build_dir, "custom_ops_executor_runner")
    for name in names:
        pte = export(name, args.output_dir)
        print(f"Exported {os.path.relpath(pte)}")
        try:
            for line in check_variant(name, pte, runner):
                print(line)
        except AssertionError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
