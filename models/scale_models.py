"""Models at the sizes people run, made here: no GGUF file of 1B parameters or more ships on PyPI, so `bench scale`
writes them. Llama 3.2 1B's and Llama 3.1 8B's shapes (hidden size, layers, heads, kv heads, feed-forward size, the
128,256-token vocabulary, head size, tied or separate output projection, rope theta 500,000), weights drawn from a
fixed seed, written at 16 bits by the gguf package's writer, then made into Q4_K_M and Q8_0 by llama-quantize; kept in
~/.cache/my_ops/scale (never made by the suite: the 8B files are 4.9 and 8.5 GB).

    python -m models.scale_models [1b|8b ...] [--kinds Q4_K_M,Q8_0]   makes (or finds) the files, prints their paths

The weights: every matrix N(0, 0.02^2) (transformers' initializer range) but the two that write into the residual
stream (attn_output, ffn_down), N(0, (0.02 / sqrt(2 * layers))^2) as GPT-2 initializes them; a separate token embedding
(8B) N(0, 1), so that the stream starts at the scale the layers write at; the norms 1; the output projection (the tied
embedding at 1B) N(0, (LOGIT_STD / sqrt(hidden))^2), so that the logits of a normalized hidden state spread with a
standard deviation near LOGIT_STD = 4: over 128,256 tokens that puts a few tenths of the probability on the top token
(far from a flat distribution, where a comparison of two programs' distributions would say nothing). With every matrix
at 0.02 the 1B model amplified any rounding (llama.cpp against itself, flash attention on and off: a mean KL of 0.022),
and with its embedding at 0.02 the 8B model did (0.095), so no comparison could resolve less; now 0.007 and 0.010, near
the real models' 0.003 and 0.006. The text is no language; the shapes, the bytes a step reads and the arithmetic are
the real models', Llama 3's rope scaling included (their configs' factor, 32 at 1B and 8 at 8B, over an original
context of 8,192): as llama.cpp's converter writes it, a rope_freqs tensor of each frequency's divisor, which llama.cpp
and my_ops.hf both apply.

The vocabulary is SentencePiece-style (llama.cpp's "llama" tokenizer): <unk>, <s>, </s>, the 256 byte tokens, then
the words and letters of examples/alice_chapter1.txt, then filler pieces no text contains, so a text tokenizes into
words where it can and bytes where it cannot, the same way on both sides.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.join(os.path.expanduser("~"), ".cache", "my_ops", "scale")
TEXT = os.path.join(REPO_ROOT, "examples", "alice_chapter1.txt")
SEED = 2026
WEIGHT_STD, LOGIT_STD, EMBEDDING_STD = 0.02, 4.0, 1.0
ROPE_THETA, RMS_EPS, CONTEXT = 500000.0, 1e-5, 131072
KINDS = ("Q4_K_M", "Q8_0")


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    head_dim: int
    tied: bool
    rope_factor: float  # Llama 3's rope scaling: the lowest frequencies' divisor
    vocab: int = 128256


SHAPES = {"1b": Shape(hidden=2048, layers=16, heads=32, kv_heads=8, ffn=8192, head_dim=64, tied=True, rope_factor=32),
          "8b": Shape(hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336, head_dim=128, tied=False, rope_factor=8)}
LOW_FREQ_FACTOR, HIGH_FREQ_FACTOR, ORIGINAL_CONTEXT = 1.0, 4.0, 8192  # both configs' rope_scaling
FILE_VERSION = 4  # in the files' names: a file made by an earlier version of this module is made again


def tensors(shape: Shape) -> list[tuple[str, tuple[int, ...], float]]:
    """(GGUF name, numpy shape, standard deviation; 0: ones) of every tensor, in the order llama.cpp's converter
    writes them."""
    out_std = LOGIT_STD / np.sqrt(shape.hidden)
    found = [("token_embd.weight", (shape.vocab, shape.hidden), out_std if shape.tied else EMBEDDING_STD)]
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    residual_std = WEIGHT_STD / np.sqrt(2 * shape.layers)
    for i in range(shape.layers):
        found += [(f"blk.{i}.attn_norm.weight", (shape.hidden,), 0.0),
                  (f"blk.{i}.attn_q.weight", (q, shape.hidden), WEIGHT_STD),
                  (f"blk.{i}.attn_k.weight", (kv, shape.hidden), WEIGHT_STD),
                  (f"blk.{i}.attn_v.weight", (kv, shape.hidden), WEIGHT_STD),
                  (f"blk.{i}.attn_output.weight", (shape.hidden, q), residual_std),
                  (f"blk.{i}.ffn_norm.weight", (shape.hidden,), 0.0),
                  (f"blk.{i}.ffn_gate.weight", (shape.ffn, shape.hidden), WEIGHT_STD),
                  (f"blk.{i}.ffn_up.weight", (shape.ffn, shape.hidden), WEIGHT_STD),
                  (f"blk.{i}.ffn_down.weight", (shape.hidden, shape.ffn), residual_std)]
    found.append(("output_norm.weight", (shape.hidden,), 0.0))
    if not shape.tied:
        found.append(("output.weight", (shape.vocab, shape.hidden), out_std))
    return found


def llama3_rope_factors(theta: float, head_dim: int, factor: float, low_freq_factor: float, high_freq_factor: float,
                        original_context: int) -> np.ndarray:
    """Llama 3's rope scaling as the divisor of each rotary frequency, the tensor rope_freqs.weight that llama.cpp's
    converter writes: a frequency whose wavelength is under original_context / high_freq_factor keeps its value, one
    whose wavelength is over original_context / low_freq_factor is divided by `factor`, and the ones between move
    smoothly from one to the other (Meta's scheme for Llama 3.1)."""
    frequencies = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelengths = 2 * np.pi / frequencies
    smooth = np.clip((original_context / wavelengths - low_freq_factor) / (high_freq_factor - low_freq_factor), 0, 1)
    return (1.0 / ((1 - smooth) / factor + smooth)).astype(np.float32)


def vocabulary(size: int) -> tuple[list[str], list[float], list[int]]:
    """(pieces, scores, token types) of a SentencePiece-style vocabulary of `size` tokens (see the module's
    docstring); types as llama.cpp numbers them: 1 normal, 2 unknown, 3 control, 6 byte."""
    with open(TEXT, encoding="utf-8") as f:
        text = f.read()
    words = sorted(set(re.findall(r"[A-Za-z']+", text)), key=lambda w: (-text.count(w), w))
    letters = sorted(set(text) - set(" \n"))
    pieces = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), "\u2581",
              *("\u2581" + w for w in words), *letters]
    pieces = list(dict.fromkeys(pieces))
    pieces += [f"\u2581filler{i}" for i in range(size - len(pieces))]
    types = [2, 3, 3, *([6] * 256), *([1] * (size - 259))]
    scores = [0.0, 0.0, 0.0, *([0.0] * 256), *(-float(i) for i in range(size - 259))]
    return pieces[:size], scores, types


def write_source(name: str, path: str) -> None:
    """The model's F16 file (norms F32), written tensor by tensor by the gguf package's writer."""
    import gguf

    shape = SHAPES[name]
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name(f"scale-{name}")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(ROPE_THETA)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_vocab_size(shape.vocab)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    pieces, scores, types = vocabulary(shape.vocab)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(pieces)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    listed = tensors(shape)
    factors = llama3_rope_factors(ROPE_THETA, shape.head_dim, shape.rope_factor, LOW_FREQ_FACTOR, HIGH_FREQ_FACTOR,
                                  ORIGINAL_CONTEXT)
    writer.add_tensor_info("rope_freqs.weight", factors.shape, factors.dtype, factors.nbytes)
    for tensor, dims, std in listed:
        dtype = np.float32 if std == 0.0 else np.float16
        writer.add_tensor_info(tensor, dims, np.dtype(dtype), int(np.prod(dims)) * np.dtype(dtype).itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.write_tensor_data(factors)
    for index, (tensor, dims, std) in enumerate(listed):
        if std == 0.0:
            writer.write_tensor_data(np.ones(dims, np.float32))
            continue
        values = np.empty(dims, np.float16)
        generator = np.random.default_rng([SEED, index])
        for first in range(0, dims[0], 4096):  # float32 a slice at a time: the 8B table is 2 GiB of it
            rows = values[first:first + 4096]
            rows[...] = generator.standard_normal(rows.shape, dtype=np.float32) * std
        writer.write_tensor_data(values)
    writer.close()


def model_file(name: str, kind: str, log=print) -> str:
    """The `kind` file (a llama-quantize preset or type) of the model of shape `name`, made once into ROOT; the F16
    source is written first and removed once every kind is made (it is 16 GB at 8B)."""
    from models import llama_cpp

    path = os.path.join(ROOT, f"scale-{name}.v{FILE_VERSION}.{kind}.gguf")
    if os.path.isfile(path):
        return path
    os.makedirs(ROOT, exist_ok=True)
    source = os.path.join(ROOT, f"scale-{name}.v{FILE_VERSION}.F16.gguf")
    if not os.path.isfile(source):
        log(f"Writing {source} (seed {SEED})")
        write_source(name, source + ".partial")
        os.rename(source + ".partial", source)
    start = time.perf_counter()
    proc = subprocess.run([llama_cpp.tools()["llama-quantize"], source, path + ".partial", kind,
                           str(os.cpu_count() or 1)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"llama-quantize {kind} failed on {source}:\n{(proc.stdout + proc.stderr)[-2000:]}")
    os.rename(path + ".partial", path)
    with open(path + ".quantize_seconds", "w") as f:  # what writing it took llama-quantize, for bench scale
        f.write(f"{time.perf_counter() - start:.1f}\n")
    if all(os.path.isfile(os.path.join(ROOT, f"scale-{name}.v{FILE_VERSION}.{k}.gguf")) for k in KINDS):
        os.remove(source)
    return path


def quantize_seconds(path: str) -> float | None:
    """The seconds llama-quantize took to write the file at `path` (model_file kept them)."""
    try:
        with open(path + ".quantize_seconds") as f:
            return float(f.read())
    except OSError:
        return None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--kinds", default=",".join(KINDS))
    args = parser.parse_args(argv)
    for name in args.names:
        for kind in args.kinds.split(","):
            print(model_file(name, kind))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
