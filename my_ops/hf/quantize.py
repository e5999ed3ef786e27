"""A swapped model's linear layers and token embedding on my_ops::linear_blocks and my_ops::embedding_blocks, at one
precision:

    None     float32: format F32 (the weights as they are); the embedding stays aten::embedding
    "8da8w"  8-bit weights in llama.cpp's Q8_0 blocks (32 weights, one fp16 scale)
    "8da4w"  4-bit weights in llama.cpp's Q4_1 blocks (32 weights, an fp16 scale and minimum)
    "gguf"   a GGUF file's own tensors as they are, each in its own format (my_ops.gguf.attach_blocks puts them on
             the layers; a tensor the file keeps in float32 stays float32)

The quantized formats also quantize the activations to 8 bits at run time, per block of 32, inside the op (the "8da"
of their names: 8-bit dynamic activations). The weights are quantized here, once, as llama.cpp's reference quantizers
do (Q8_0: d = max|w| / 127; Q4_1: d = (max - min) / 15, m = min; Q4_0, for completeness: d = the largest-magnitude
w / -8), each value rounded against the fp16 scale the block stores, and packed into the layout the kernels read
(kernel_helpers/block_formats.h). 4-bit is asymmetric (Q4_1) rather than the symmetric int4 of torchao's 8da4w
recipe: on SmolLM2-135M symmetric 4-bit weights cost 18-54% perplexity, Q4_1 7% (docs/hf.md). A tied embedding and
output projection (one table, as SmolLM2's) become one packed tensor both ops read: the program stores it once.
"""

from __future__ import annotations

import torch

from ..block_layouts import LAYOUTS  # ops/blocks/block_layouts.py
from .swap import UnsupportedModelError

GROUP = 32  # weights per block: llama.cpp's block size
FORMATS = {None: "F32", "8da8w": "Q8_0", "8da4w": "Q4_1"}  # precision -> the ops' format
LINEAR, EMBEDDING = "my_ops::linear_blocks", "my_ops::embedding_blocks"


def ops_of(precision: str | None) -> tuple[str, ...]:
    """The block ops a program of this precision calls."""
    return (LINEAR,) if FORMATS[precision] == "F32" else (LINEAR, EMBEDDING)


def ops_in(model: torch.nn.Module) -> tuple[str, ...]:
    """The block ops the swapped layers of `model` call."""
    return tuple(sorted({LINEAR if isinstance(m, Linear) else EMBEDDING for m in model.modules()
                         if isinstance(m, (Linear, Embedding))}))


def formats_in(model: torch.nn.Module) -> dict[str, int]:
    """{format: layers} of the swapped layers of `model`."""
    counts: dict[str, int] = {}
    for m in model.modules():
        if isinstance(m, (Linear, Embedding)):
            counts[m.fmt] = counts.get(m.fmt, 0) + 1
    return counts


def _half(values: torch.Tensor) -> torch.Tensor:
    stored = values.half()
    if not bool(stored.isfinite().all()):
        raise UnsupportedModelError(f"a block's scale of {float(values.abs().max()):g} is past float16's range: these "
                                    "weights cannot be stored as llama.cpp blocks")
    return stored


def _record(*fields: torch.Tensor) -> torch.Tensor:
    """fp16 fields [n, blocks] each as a block record's bytes, uint8 [n, blocks, 2 * fields]."""
    return torch.stack(fields, dim=-1).contiguous().view(torch.uint8)


def pack(weight: torch.Tensor, fmt: str) -> torch.Tensor:
    """`weight` [n, k] (k a multiple of 32) quantized to `fmt` (Q8_0, Q4_0 or Q4_1) and laid out as my_ops' block
    ops read it: uint8 [n, k / 32 * block bytes] (kernel_helpers/block_formats.h)."""
    n, k = weight.shape
    w = weight.detach().float().reshape(n, k // GROUP, GROUP)
    if fmt == "Q8_0":
        d = _half(w.abs().amax(-1) / 127)
        q = torch.round(w / _safe(d)).clamp(-127, 127)
        return interleave((q + 128).to(torch.uint8).reshape(n, k), _record(d), fmt)
    if fmt == "Q4_0":
        extreme = w.gather(-1, w.abs().argmax(-1, keepdim=True)).squeeze(-1)
        d = _half(extreme / -8)
        q = (torch.round(w / _safe(d)) + 8).clamp(0, 15)
        return interleave(q.to(torch.uint8).reshape(n, k), _record(d), fmt)
    if fmt == "Q4_1":
        low, high = w.amin(-1), w.amax(-1)
        d, m = _half((high - low) / 15), _half(low)
        q = torch.round((w - m.float()[..., None]) / _safe(d)).clamp(0, 15)
        return interleave(q.to(torch.uint8).reshape(n, k), _record(d, m), fmt)
    raise ValueError(f"no quantizer for {fmt!r}: this packs Q8_0, Q4_0 and Q4_1 (a GGUF file's other formats come as "
                     "they are: my_ops.gguf)")


def interleave(codes: torch.Tensor, records: torch.Tensor, fmt: str) -> torch.Tensor:
    """The layout of kernel_helpers/block_formats.h from each weight's unsigned code, uint8 [n, k], and its blocks'
    records (uint8 [n, blocks, record bytes]: the fields in order): rows in groups of 16 (the last group what
    remains), each group block after block; a block's codes 32 weights at a time as chunks of R rows x 4 bytes, per
    plane of b bits b chunks (byte j of chunk c: weights 4 (c * 8 / b + i) + j at bits b i), then each record field
    for the R rows."""
    layout = LAYOUTS[fmt]
    weights, planes, fields = layout.weights, layout.planes, layout.fields
    n, k = codes.shape
    blocks, pieces = k // weights, weights // GROUP
    quads = codes.reshape(n, blocks, pieces, 8, 4)
    chunks = []
    for bits, shift in planes:
        per_chunk = 8 // bits
        plane = ((quads >> shift) & ((1 << bits) - 1)).reshape(n, blocks, pieces, bits, per_chunk, 4)
        packed = torch.zeros(n, blocks, pieces, bits, 4, dtype=torch.uint8)
        for i in range(per_chunk):
            packed |= plane[:, :, :, :, i] << (bits * i)
        chunks.append(packed)
    chunks = torch.cat(chunks, dim=3)  # [n, blocks, pieces, chunks, 4]
    offsets = [sum(fields[:i]) for i in range(len(fields))]
    parts = []
    full = n // 16 * 16
    for rows, groups, count in ((slice(0, full), full // 16, 16), (slice(full, n), 1, n - full)):
        if groups == 0 or count == 0:  # the whole groups at once, then the short one
            continue
        quants = chunks[rows].reshape(groups, count, blocks, pieces, -1, 4).permute(0, 2, 3, 4, 1, 5)
        record = records[rows].reshape(groups, count, blocks, -1)
        fields_of = [record[..., o:o + size].permute(0, 2, 1, 3) for o, size in zip(offsets, fields)]
        parts.append(torch.cat([quants.reshape(groups, blocks, -1), *(f.reshape(groups, blocks, -1) for f in fields_of)],
                               dim=2).reshape(-1))
    return torch.cat(parts).reshape(n, -1)


def _safe(d: torch.Tensor) -> torch.Tensor:
    """The stored scales as divisors, [n, blocks, 1]: a block of equal weights has d 0 and every q 0 (or its minimum)."""
    d = d.float()[..., None]
    return torch.where(d == 0, torch.inf, d)


class Linear(torch.nn.Module):
    """my_ops::linear_blocks(x, weight, format) (+ bias) in place of a torch.nn.Linear."""

    def __init__(self, weight: torch.Tensor, fmt: str, bias: torch.Tensor | None, replaces: str):
        super().__init__()
        self.fmt, self.replaces = fmt, replaces
        if isinstance(weight, torch.nn.Parameter):
            self.weight = weight
        else:
            self.register_buffer("weight", weight)
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.ops.my_ops.linear_blocks(x, self.weight, self.fmt)
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        return f"{self.fmt}, {list(self.weight.shape)}, replaces={self.replaces}"


class Linears(torch.nn.Module):
    """Several linear layers over one input, their outputs side by side: a fused projection (q, k and v; gate and up)
    whose parts a GGUF file stores in different formats (llama-quantize's presets give attn_v more bits than attn_q,
    say), each part kept in its own."""

    def __init__(self, parts: list[Linear]):
        super().__init__()
        self.parts = torch.nn.ModuleList(parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([part(x) for part in self.parts], dim=-1)


class Embedding(torch.nn.Module):
    """my_ops::embedding_blocks(table, tokens, format) in place of a torch.nn.Embedding; times the original's
    embed_scale where it has one (Gemma's embedding, scaled by sqrt(hidden size))."""

    def __init__(self, table: torch.Tensor, fmt: str, scale: torch.Tensor | None = None):
        super().__init__()
        self.fmt = fmt
        self.register_buffer("table", table)
        self.register_buffer("scale", None if scale is None else scale.detach().clone(), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        rows = torch.ops.my_ops.embedding_blocks(self.table, tokens, self.fmt)
        return rows if self.scale is None else rows * self.scale.to(rows.dtype)

    def extra_repr(self) -> str:
        return f"{self.fmt}, {list(self.table.shape)}" + ("" if self.scale is None else f", scale={float(self.scale)}")


def packed_buffers(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str]]:
    """(module, buffer name) of every packed weight the block-op layers hold: a Linear's weight that is no Parameter
    (a float32 layer's is the original layer's, which others may share), an Embedding's table."""
    found = []
    for module in model.modules():
        name = "weight" if isinstance(module, Linear) else "table" if isinstance(module, Embedding) else None
        if name is not None and module._buffers.get(name) is not None:
            found.append((module, name))
    return found


def _replace(model: torch.nn.Module, name: str, module: torch.nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent), child, module)


def put_linears_on_ops(model: torch.nn.Module, precision: str | None) -> torch.nn.Module:
    """Every torch.nn.Linear of `model` (a transformers model, in place) on my_ops::linear_blocks at `precision`, its
    token embedding too when quantized; a tied output projection shares the embedding's packed table. "gguf": the
    tensors my_ops.gguf.attach_blocks put on each layer, packed as they are (nothing requantized; a layer the file
    stores in float32 stays float32). Raises UnsupportedModelError for a layer a block format cannot hold (inputs not a
    multiple of 32)."""
    if precision == "gguf":
        return _put_on_ops(model, _file_blocks)
    if precision not in FORMATS:
        raise UnsupportedModelError(f"quantize={precision!r}: choose None (float32) or one of "
                                    f"{tuple(p for p in FORMATS if p)}")
    fmt = FORMATS[precision]
    if fmt == "F32":
        return _put_on_ops(model, lambda module: None)
    linears = {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    embedding = model.get_input_embeddings()
    narrow = [f"{name} ({m.in_features} inputs)" for name, m in linears.items() if m.in_features % GROUP]
    if isinstance(embedding, torch.nn.Embedding) and embedding.embedding_dim % GROUP:
        narrow.append(f"the token embedding ({embedding.embedding_dim} wide)")
    if narrow:
        raise UnsupportedModelError(f"{precision} packs weights in blocks of {GROUP} inputs; these layers have "
                                    f"other widths: {', '.join(narrow)}; export them in float32 (quantize=None)")
    return _put_on_ops(model, lambda module: (pack(module.weight.detach(), fmt), fmt))


def _file_blocks(module: torch.nn.Module):
    """A layer's GGUF tensor (my_ops.gguf.attach_blocks), packed as the file stores it: (weight, format); a fused
    layer whose parts the file stores in different formats, [(weight, format, bias rows)] of each; None for a layer the
    file keeps in float32."""
    if getattr(module, "gguf_parts", None) is not None:
        return [(*blocks, rows) for blocks, rows in module.gguf_parts]
    return getattr(module, "gguf_blocks", None)


def _put_on_ops(model: torch.nn.Module, packed) -> torch.nn.Module:
    """The token embedding and every linear layer on the block ops in the format packed(module) gives, (packed weight,
    format), or None: the embedding stays aten::embedding and a linear layer F32 on its own weight (the Parameter
    itself: a tied embedding keeps reading the same one). A tied output projection reads the embedding's packed table,
    so the program stores it once. A list of (weight, format, rows) is a fused layer kept in parts (Linears)."""
    linears = {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    embedding = model.get_input_embeddings()
    table = packed(embedding) if isinstance(embedding, torch.nn.Embedding) else None
    if table is not None:
        _replace(model, next(n for n, m in model.named_modules() if m is embedding),
                 Embedding(*table, getattr(embedding, "embed_scale", None)))
    for name, linear in linears.items():
        tied = embedding is not None and linear.weight is getattr(embedding, "weight", None)
        found = table if tied and table is not None else packed(linear)
        replaces = type(linear).__name__
        if isinstance(found, list):
            bias = [None] * len(found) if linear.bias is None else linear.bias.split([rows for *_, rows in found])
            _replace(model, name, Linears([Linear(w, fmt, b, replaces) for (w, fmt, _), b in zip(found, bias)]))
        else:
            weight, fmt = found or (linear.weight, "F32")
            _replace(model, name, Linear(weight, fmt, linear.bias, replaces))
    return model
