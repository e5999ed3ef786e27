"""The example ops in a real model (examples/decoder.py): export it with its linear layers lowered to XNNPACK (float32, or 8-bit
dynamically quantized with XNNPACK's quantizer) and the custom ops left on this project's kernels, check the runner
links everything the program needs, then decode greedily in the C++ runner and in the Python runtime and compare with
eager PyTorch:

    python -m models.example_decoder --build_dir cmake-out/all_ops [--variants decoder,decoder_q8] [--output_dir DIR]
    python -m models.example_decoder --build_dir BUILD --aoti               (the float32 decoder through AOTInductor)
    python -m models.example_decoder --build_dir BUILD --profile VARIANT    (one decoding, profiled: flow/profile.py)

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
import sys
import tempfile
from dataclasses import dataclass

import torch

from flow import REPO_ROOT
from models.decoding import (chosen, decode_command, decode_eager, decode_runner, decode_runtime, difference,
                             printed_tokens, register_ops)

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
                raise RuntimeError(f"{name} calls {', '.join(others)}, which models/example_decoder.py's CALLED_OPS "
                                   "does not name; add them, so its cached program is made again when they change")
            os.replace(made, path)

    cached, _ = artifact_cache.cached("decoder_programs", f"{name}.pte", make, ops=CALLED_OPS)
    with open(cached, "rb") as source:  # a copy: the cache keeps its own
        return written_whole(os.path.join(output_dir, f"{name}.pte"), lambda f: shutil.copyfileobj(source, f))


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



# ---- The same decoder through AOTInductor, run from C++ (flow/aoti.py packages it) -----------------------------------
AOTI_VARIANT = "decoder"  # the float32 decoder: the package compared with decoder.pte


def aoti_export(max_seq: int | None = None) -> torch.export.ExportedProgram:
    """The float32 decoder with the custom ops, exported with the dynamic prompt length (as for ExecuTorch)."""
    m = model_module()
    return torch.export.export(build(VARIANTS[AOTI_VARIANT], max_seq=max_seq), m.prompt_inputs(),
                               dynamic_shapes=m.dynamic_shapes(config(max_seq)), strict=True)


def aoti_package() -> str:
    """The decoder's package. Its vocabulary size is in the metadata: the runner checks prompt tokens against it
    before running, because the package's own bounds check throws inside a parallel region, which aborts."""
    from flow import aoti

    return aoti.package(AOTI_VARIANT, aoti_export(), {"vocab": str(config().vocab)})


def check_aoti(build_dir: str) -> list[str]:
    """Decodes the decoder's package twice in the C++ runner (the second generation starts over on the caches the
    first filled) and compares with eager, as check_variant does for the .pte."""
    from flow import aoti

    m = model_module()
    path = aoti_package()
    expected = decode_eager(build(VARIANTS[AOTI_VARIANT], reference=True), m.PROMPT, m.NEW_TOKENS)
    decoded = decode_command(aoti.runner_command(build_dir, path), m.PROMPT, m.NEW_TOKENS, generations=2)
    if (problem := difference(decoded, expected, FLOAT32_TOLERANCE)) is not None:
        raise AssertionError(f"{os.path.relpath(path)} in {aoti.RUNNER}: {problem}")
    return [f"{AOTI_VARIANT}: {expected.tokens} in {aoti.RUNNER} and eager",
            f"{aoti.RUNNER}: prefill of {len(m.PROMPT)} tokens {decoded.prefill_us:.0f} us, decode "
            f"{decoded.decode_tokens_per_s:.0f} tokens/s",
            "without its op libraries the runner refuses the package: "
            + aoti.missing_library_error(build_dir, path, [])]


# ---- One decoding, profiled (flow/profile.py: ETRecord, ETDump, Inspector) ----------------------------------------
def profile(name: str, build_dir: str, out_dir: str, new_tokens: int) -> int:
    """VARIANTS[name] exported with its ETRecord and decoded once in the build's runner with an ETDump; each execution
    replayed op by op against the declared references. Returns the exit code."""
    from flow import declarations
    from flow.profile import decoding_runs, profile as profile_pte

    pte = export(name, out_dir, etrecord=True)
    print(f"Exported {pte} with its ETRecord")
    prompt = model_module().PROMPT

    def runs_of(output: str):  # the executions replayed are those of the run recorded: its own tokens
        tokens = printed_tokens(output)
        print(f"Generated tokens: {' '.join(map(str, tokens))}")
        return decoding_runs(prompt, tokens)

    run_args = [f"--prompt={','.join(map(str, prompt))}", f"--new_tokens={new_tokens}"]
    return profile_pte(pte, os.path.join(build_dir, "custom_ops_executor_runner"), out_dir,
                       list(declarations.load().values()), run_args, runs_of, decoding=True)


def main() -> int:
    parser = argparse.ArgumentParser(description="Exports the example decoder, decodes it in the runner and the "
                                                 "Python runtime, and compares with eager PyTorch")
    parser.add_argument("--build_dir", required=True,
                        help="the CMake build with every op: its runner, kernel library and AOT library")
    parser.add_argument("--variants", default=",".join(TESTED), help=f"of {', '.join(VARIANTS)}")
    parser.add_argument("--output_dir", help="where the programs go (default: the repository; with --profile, "
                                             "<build_dir>/profile)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--aoti", action="store_true",
                       help="package the float32 decoder with AOTInductor and decode it in custom_ops_aoti_runner (a "
                            "build with -DCUSTOM_OPS_BUILD_AOTI=ON)")
    which.add_argument("--profile", metavar="VARIANT", help="export VARIANT with its ETRecord, decode it once with an "
                                                            "ETDump, and table its ops' times")
    parser.add_argument("--new_tokens", type=int, default=16, help="with --profile: tokens to generate")
    args = parser.parse_args()
    if args.profile is not None:
        return profile_main(args.profile, args.build_dir, args.output_dir, args.new_tokens)
    if args.aoti:
        return aoti_main(args.build_dir)
    return decode_main(args.variants, args.build_dir, args.output_dir or REPO_ROOT)


def decode_main(variants: str, build_dir: str, output_dir: str) -> int:
    """The `model` mode: each variant exported, decoded in the runner and the Python runtime against eager."""
    from flow.runtime import load_kernel_library

    if (names := chosen(variants, VARIANTS, "variant")) is None:
        return 2
    register_ops(build_dir)
    load_kernel_library(os.path.join(build_dir, "libcustom_ops_lib.so"))
    runner = os.path.join(build_dir, "custom_ops_executor_runner")
    for name in names:
        pte = export(name, output_dir)
        print(f"Exported {os.path.relpath(pte)}")
        try:
            for line in check_variant(name, pte, runner):
                print(line)
        except AssertionError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
    return 0


def aoti_main(build_dir: str) -> int:
    """The `aoti` mode's decoder: its package decoded in custom_ops_aoti_runner against eager, then refused without
    its op libraries."""
    register_ops(build_dir)
    try:
        for line in check_aoti(build_dir):
            print(line)
    except (AssertionError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


def profile_main(variant: str, build_dir: str, output_dir: str | None, new_tokens: int) -> int:
    """`profile decoder`: one decoding of `variant` profiled, its ops checked against their references."""
    from flow.verify import VerificationError

    if chosen(variant, VARIANTS, "variant") is None:
        return 2
    register_ops(build_dir)
    out_dir = output_dir or os.path.join(build_dir, "profile")
    os.makedirs(out_dir, exist_ok=True)
    try:
        return profile(variant, build_dir, out_dir, new_tokens)
    except (VerificationError, OSError, RuntimeError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1

if __name__ == "__main__":
    sys.exit(main())
