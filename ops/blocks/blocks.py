"""my_ops::linear_blocks and my_ops::embedding_blocks's Python side: both ops are registered from C++
(linear_blocks.cpp, embedding_blocks.cpp, in libcustom_ops_aot_lib.so); this module holds their references in ATen
ops, written from llama.cpp's block formats (ggml-common.h, ggml-quants.c) and the packed layout's definition, sharing
nothing with the kernels; and the examples the flow exports. It imports only torch and block_layouts.py beside it.

    linear_blocks(input, weight, format)     input [..., k] float32 -> [..., n]
    embedding_blocks(weight, indices, format) indices [...] int64 -> [..., k] float32

`format` is a GGUF type name. Row formats (F32, F16, BF16): the weight is [n, k] of that dtype. Block formats: the
weight is uint8 [n, k / W * B], llama.cpp's blocks of W weights and B bytes rearranged for the kernel as
block_layouts.py states (the one statement of each format's layout in Python, which this module unpacks by).
"""

from __future__ import annotations

import torch

from .block_layouts import BLOCK, GROUP, LAYOUTS, ROW_DTYPES, layout


def _d(_, h):
    return h[0][..., None], None


def _d_m(_, h):
    return h[0][..., None], h[1][..., None]


def _q2_k(s, h):
    # 16 bytes, one a sub-block of 16: scale in the low nibble, min in the high one (dequantize_row_q2_K).
    return h[0][..., None] * (s & 15).float(), -(h[1][..., None] * (s >> 4).float())


def _q3_k(s, h):
    # 16 six-bit scales stored + 32: low nibbles of 0-7 in bytes 0-7, of 8-15 in their high nibbles; the top two bits
    # of scale i in byte 8 + i % 4 at bits 2 (i / 4) (dequantize_row_q3_K's aux shuffle).
    low = torch.cat([s[..., :8] & 15, s[..., :8] >> 4], dim=-1)
    high = torch.stack([(s[..., 8:12] >> (2 * j)) & 3 for j in range(4)], dim=-2).flatten(-2)
    return h[0][..., None] * ((low | (high << 4)).to(torch.int32) - 32).float(), None


def _k_scale_min(s):
    # get_scale_min_k4: sub-block j < 4 in bytes j (scale) and j + 4 (min), six bits; j >= 4: low four bits in byte
    # j + 4 (scale low, min high), top two in bits 6-7 of bytes j - 4 and j.
    scale = torch.cat([s[..., 0:4] & 63, (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)], dim=-1)
    minimum = torch.cat([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], dim=-1)
    return scale, minimum


def _q4_k(s, h):
    scale, minimum = _k_scale_min(s)
    return h[0][..., None] * scale.float(), -(h[1][..., None] * minimum.float())


def _q6_k(s, h):
    return h[0][..., None] * s.view(torch.int8).float(), None


# How each format's record gives a and b per sub-block: (scale bytes [n, blocks, m] uint8, the fp16 fields [n, blocks]
# float32 ...) -> (a, b or None) [n, blocks, weights / sub].
SCALES = {"Q8_0": _d, "Q4_0": _d, "Q4_1": _d_m, "Q5_0": _d, "Q5_1": _d_m, "Q2_K": _q2_k, "Q3_K": _q3_k, "Q4_K": _q4_k,
          "Q5_K": _q4_k, "Q6_K": _q6_k}
ROW_FORMATS = {name: getattr(torch, dtype) for name, dtype in ROW_DTYPES.items()}


def deinterleave(weight: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A packed weight's bytes back in row order: (chunks uint8 [n, blocks, pieces, chunks, 4], records uint8 [n,
    blocks, record bytes], each record's fields in order)."""
    spec = layout(fmt)
    chunks, pieces, record = sum(b for b, _ in spec.planes), spec.weights // BLOCK, sum(spec.fields)
    n, blocks = weight.shape[0], weight.shape[1] // spec.bytes
    flat, codes, records = weight.reshape(-1), [], []
    for first in range(0, n, GROUP):
        rows = min(GROUP, n - first)
        group = flat[first * blocks * spec.bytes:(first + rows) * blocks * spec.bytes].reshape(blocks, rows * spec.bytes)
        quants = group[:, :rows * (spec.bytes - record)].reshape(blocks, pieces, chunks, rows, 4)
        codes.append(quants.permute(3, 0, 1, 2, 4))
        fields, offset = [], rows * (spec.bytes - record)
        for size in spec.fields:
            fields.append(group[:, offset:offset + rows * size].reshape(blocks, rows, size).permute(1, 0, 2))
            offset += rows * size
        records.append(torch.cat(fields, dim=-1))
    return torch.cat(codes), torch.cat(records)


def codes_of(chunks: torch.Tensor, fmt: str) -> torch.Tensor:
    """The unsigned codes [n, blocks, weights] the chunks hold, each weight's planes ORed at their shifts."""
    spec = layout(fmt)
    n, blocks, pieces = chunks.shape[:3]
    codes = torch.zeros(n, blocks, pieces, 8, 4, dtype=torch.uint8)
    first = 0
    for bits, shift in spec.planes:
        plane = chunks[:, :, :, first:first + bits]  # [n, blocks, pieces, bits chunks, 4]
        per_chunk = 8 // bits
        quads = torch.stack([(plane >> (bits * i)) & ((1 << bits) - 1) for i in range(per_chunk)], dim=-2)
        codes |= quads.reshape(n, blocks, pieces, 8, 4) << shift
        first += bits
    return codes.reshape(n, blocks, spec.weights)


def dequantize(weight: torch.Tensor, fmt: str) -> torch.Tensor:
    """The float32 [n, k] weight a packed weight of format `fmt` holds (a row format: the weight as float32)."""
    if fmt in ROW_FORMATS:
        return weight.float()
    spec = layout(fmt)
    chunks, records = deinterleave(weight, fmt)
    n, blocks = records.shape[:2]
    scale_bytes = torch.cat([records[..., o:o + 4] for o, size in _offsets(spec.fields) if size == 4] or
                            [records[..., :0]], dim=-1)
    halves = [records[..., o:o + 2].contiguous().view(torch.float16)[..., 0].float()
              for o, size in _offsets(spec.fields) if size == 2]
    a, b = SCALES[fmt](scale_bytes, halves)  # [n, blocks, subs]
    codes = codes_of(chunks, fmt).reshape(n, blocks, -1, spec.sub)
    w = a[..., None] * (codes.to(torch.int32) - spec.offset).float()
    if b is not None:
        w = w + b[..., None]
    return w.reshape(n, -1)


def _offsets(fields):
    offset = 0
    for size in fields:
        yield offset, size
        offset += size


def quantized_activations(x: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """x as the kernels see it: each block of `block` along the last dimension (the weight format's block, as llama.cpp
    quantizes activations for it: 32, or 256 for the K-quants) rounded to d * q, d = max|x| / 127 (NaN for a block
    holding a non-finite value), q = round(x / d) (0 where d is 0)."""
    blocks = x.float().reshape(*x.shape[:-1], -1, block)
    finite = blocks.isfinite().all(-1, keepdim=True)
    d = torch.where(finite, blocks.abs().amax(-1, keepdim=True) / 127, torch.nan)
    q = torch.where(finite & (d != 0), torch.round(blocks / d), 0).clamp(-127, 127)
    return (q * d).reshape(x.shape)


def linear_blocks_reference(input: torch.Tensor, weight: torch.Tensor, format: str) -> torch.Tensor:
    if format in ROW_FORMATS:
        return input @ weight.float().T
    return quantized_activations(input, layout(format).weights) @ dequantize(weight, format).T


def embedding_blocks_reference(weight: torch.Tensor, indices: torch.Tensor, format: str) -> torch.Tensor:
    return dequantize(weight, format)[indices]


# ---- Weights for examples and tests -----------------------------------------------------------------------------
# A scale per format that keeps |w| around 1 or less whatever the codes: 1 / (largest code x largest sub-scale).
_TYPICAL_D = {"Q8_0": 1 / 128, "Q4_0": 1 / 8, "Q4_1": 1 / 16, "Q5_0": 1 / 16, "Q5_1": 1 / 32, "Q2_K": 1 / 64,
              "Q3_K": 1 / 128, "Q4_K": 1 / 1024, "Q5_K": 1 / 2048, "Q6_K": 1 / 4096}


def random_weight(fmt: str, rows: int, inputs: int, generator: torch.Generator) -> torch.Tensor:
    """A weight [rows, inputs] of format `fmt`: a row format's random normal values, or a block format's random bytes
    (every code and packed scale) with its fp16 fields set to finite values around the format's typical scale, placed
    where deinterleave reads them; torch alone, so an example builds without the packer's package. Scaled by
    1 / sqrt(inputs), so a product with activations around 1 is around 1 too (float sums in another order then differ
    by about float's resolution, what the verifier allows)."""
    if fmt in ROW_FORMATS:
        return (torch.randn(rows, inputs, generator=generator) * inputs ** -0.5).to(ROW_FORMATS[fmt])
    spec = layout(fmt)
    blocks = inputs // spec.weights
    weight = torch.randint(0, 256, (rows, blocks * spec.bytes), generator=generator, dtype=torch.uint8)
    _, where = deinterleave(torch.arange(weight.numel()).reshape(weight.shape), fmt)  # [rows, blocks, record]
    for offset, size in _offsets(spec.fields):
        if size == 2:
            value = (_TYPICAL_D[fmt] * inputs ** -0.5 * (0.5 + torch.rand(rows, blocks, generator=generator))).half()
            weight.view(-1)[where[..., offset:offset + 2].reshape(-1)] = value.view(torch.uint8).reshape(-1)
    return weight


EXAMPLE_INPUTS, EXAMPLE_OUTPUTS = 512, 40  # two K-quant super-blocks, 16 of 32; two whole groups of rows and a short one


class FormatsExample(torch.nn.Module):
    """A weight per format, each a constant of the program, and one call of the op on each over the same input (the
    outputs concatenated): every format's kernel in one program. The linear op projects activations; the embedding
    looks tokens up in the tables (the same constants a tied output projection reads)."""

    def __init__(self, linear: bool, seed: int, rows: int = EXAMPLE_OUTPUTS, inputs: int = EXAMPLE_INPUTS):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.linear, self.formats = linear, [*LAYOUTS, *ROW_FORMATS]
        for fmt in self.formats:
            self.register_buffer(f"weight_{fmt}", random_weight(fmt, rows, inputs, generator))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = [(getattr(self, f"weight_{fmt}"), fmt) for fmt in self.formats]
        if self.linear:
            return torch.cat([torch.ops.my_ops.linear_blocks(x, w, fmt) for w, fmt in weights], dim=-1)
        return torch.cat([torch.ops.my_ops.embedding_blocks(w, x, fmt) for w, fmt in weights], dim=-1)


def linear_example():
    """(model, runs): 5 positions (a group of four tokens sharing each weight read, and one more), twice: a program is
    run more than once."""
    generator = torch.Generator().manual_seed(12)
    return FormatsExample(linear=True, seed=10), [(torch.randn(1, 5, EXAMPLE_INPUTS, generator=generator),)
                                                  for _ in range(2)]


def embedding_example():
    return FormatsExample(linear=False, seed=11), [(torch.tensor([[0, 5, 39, 17]]),), (torch.tensor([[32, 16, 3, 0]]),)]
