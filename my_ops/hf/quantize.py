"""A swapped model's linear layers and token embedding on the project's block-format ops, at one precision:

    None     float32: my_ops::linear_f32 (the weights as they are); the embedding stays aten::embedding
    "8da8w"  8-bit weights in llama.cpp's Q8_0 blocks (32 weights, one fp16 scale): my_ops::linear_q8_0 and
             my_ops::embedding_q8_0
    "8da4w"  4-bit weights in llama.cpp's Q4_1 blocks (32 weights, an fp16 scale and minimum): my_ops::linear_q4_1 and
             my_ops::embedding_q4_1

Both quantized precisions also quantize the activations to 8 bits at run time, per block of 32, inside the op (the
"8da" of their names: 8-bit dynamic activations). The weights are quantized here, once, as llama.cpp's reference
quantizers do (Q8_0: d = max|w| / 127; Q4_1: d = (max - min) / 15, m = min; Q4_0, for completeness: d = the
largest-magnitude w / -8), each value rounded against the fp16 scale the block stores, and packed into the layout the
kernels read (kernel_helpers/block_linear.h). 4-bit is asymmetric (Q4_1) rather than the symmetric int4 of torchao's
8da4w recipe: on SmolLM2-135M symmetric 4-bit weights cost 18-54% perplexity, Q4_1 7% (docs/hf.md). A tied embedding
and output projection (one table, as SmolLM2's) become one packed tensor both ops read: the program stores it once.
"""

from __future__ import annotations

import torch

from .swap import UnsupportedModelError

GROUP = 32  # weights per block: llama.cpp's block size
FORMATS = {None: "f32", "8da8w": "q8_0", "8da4w": "q4_1"}  # precision -> the ops' format


def ops_of(precision: str | None) -> tuple[str, ...]:
    """The block-format ops a program of this precision calls."""
    fmt = FORMATS[precision]
    return (f"my_ops::linear_{fmt}",) if fmt == "f32" else (f"my_ops::linear_{fmt}", f"my_ops::embedding_{fmt}")


def ops_in(model: torch.nn.Module) -> tuple[str, ...]:
    """The block-format ops the swapped layers of `model` call."""
    return tuple(sorted({f"my_ops::{'linear' if isinstance(m, Linear) else 'embedding'}_{m.fmt}"
                         for m in model.modules() if isinstance(m, (Linear, Embedding))}))


def _half(values: torch.Tensor) -> torch.Tensor:
    stored = values.half()
    if not bool(stored.isfinite().all()):
        raise UnsupportedModelError(f"a block's scale of {float(values.abs().max()):g} is past float16's range: these "
                                    "weights cannot be stored as llama.cpp blocks")
    return stored


def pack(weight: torch.Tensor, fmt: str) -> torch.Tensor:
    """`weight` [n, k] (k a multiple of 32) quantized to `fmt` and laid out as my_ops' `fmt` ops read it: uint8
    [n, k / 32 * block bytes] (kernel_helpers/block_linear.h: groups of 16 rows, each block's quants interleaved row by
    row, then its records)."""
    n, k = weight.shape
    w = weight.detach().float().reshape(n, k // GROUP, GROUP)
    if fmt == "q8_0":
        d = _half(w.abs().amax(-1) / 127)
        q = torch.round(w / _safe(d)).clamp(-127, 127)
        return interleave((q + 128).to(torch.uint8).reshape(n, k), [d], fmt)
    if fmt == "q4_0":
        extreme = w.gather(-1, w.abs().argmax(-1, keepdim=True)).squeeze(-1)
        d = _half(extreme / -8)
        q = (torch.round(w / _safe(d)) + 8).clamp(0, 15)
        return interleave(q.to(torch.uint8).reshape(n, k), [d], fmt)
    if fmt == "q4_1":
        low, high = w.amin(-1), w.amax(-1)
        d, m = _half((high - low) / 15), _half(low)
        q = torch.round((w - m.float()[..., None]) / _safe(d)).clamp(0, 15)
        return interleave(q.to(torch.uint8).reshape(n, k), [d, m], fmt)
    raise ValueError(f"no block format {fmt!r}")


def interleave(codes: torch.Tensor, records: list[torch.Tensor], fmt: str) -> torch.Tensor:
    """The layout of kernel_helpers/block_linear.h from each weight's stored code (Q8_0: q + 128; Q4: q, 0 to 15),
    uint8 [n, k], and its blocks' records (fp16 [n, k / 32] each: d, then m for Q4_1): rows in groups of 16 (the last
    group what remains), each group block after block, a block's quants interleaved by row four bytes at a time (Q4:
    byte j of chunk c holds inputs 8c + j and 8c + 4 + j in its low and high nibble), then the R rows' d (and m)."""
    n, k = codes.shape
    blocks = k // GROUP
    if fmt == "q8_0":
        steps = codes.reshape(n, blocks, 8, 4)
    else:
        nibbles = codes.reshape(n, blocks, 4, 2, 4)
        steps = nibbles[:, :, :, 0] | (nibbles[:, :, :, 1] << 4)  # [n, blocks, 4 chunks, 4]
    parts = []
    full = n // 16 * 16
    for rows, groups, count in ((slice(0, full), full // 16, 16), (slice(full, n), 1, n - full)):
        if groups == 0 or count == 0:  # the whole groups at once, then the short one
            continue
        quants = steps[rows].reshape(groups, count, blocks, -1, 4).permute(0, 2, 3, 1, 4).reshape(groups, blocks, -1)
        fields = [r[rows].reshape(groups, count, blocks).permute(0, 2, 1).contiguous().flatten().view(torch.uint8)
                  .reshape(groups, blocks, 2 * count) for r in records]
        parts.append(torch.cat([quants, *fields], dim=2).reshape(-1))
    return torch.cat(parts).reshape(n, -1)


def _safe(d: torch.Tensor) -> torch.Tensor:
    """The stored scales as divisors, [n, blocks, 1]: a block of equal weights has d 0 and every q 0 (or its minimum)."""
    d = d.float()[..., None]
    return torch.where(d == 0, torch.inf, d)


class Linear(torch.nn.Module):
    """my_ops::linear_<format>(x, weight) (+ bias) in place of a torch.nn.Linear."""

    def __init__(self, weight: torch.Tensor, fmt: str, bias: torch.Tensor | None, replaces: str):
        super().__init__()
        self.fmt, self.replaces = fmt, replaces
        if isinstance(weight, torch.nn.Parameter):
            self.weight = weight
        else:
            self.register_buffer("weight", weight)
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = getattr(torch.ops.my_ops, f"linear_{self.fmt}")(x, self.weight)
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        return f"{self.fmt}, {list(self.weight.shape)}, replaces={self.replaces}"


class Embedding(torch.nn.Module):
    """my_ops::embedding_<format>(table, tokens) in place of a torch.nn.Embedding."""

    def __init__(self, table: torch.Tensor, fmt: str):
        super().__init__()
        self.fmt = fmt
        self.register_buffer("table", table)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return getattr(torch.ops.my_ops, f"embedding_{self.fmt}")(self.table, tokens)

    def extra_repr(self) -> str:
        return f"{self.fmt}, {list(self.table.shape)}"


def _replace(model: torch.nn.Module, name: str, module: torch.nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent), child, module)


def put_linears_on_ops(model: torch.nn.Module, precision: str | None) -> torch.nn.Module:
    """Every torch.nn.Linear of `model` (a transformers model, in place) on my_ops' linear op of `precision`, its token
    embedding too when quantized; a tied output projection shares the embedding's packed table. "gguf": the blocks
    my_ops.gguf.attach_blocks put on each layer, packed as they are (nothing requantized; a layer the file stores in
    float stays float32). Raises UnsupportedModelError for a layer a block format cannot hold (inputs not a multiple of
    32)."""
    if precision == "gguf":
        return _put_on_ops(model, _file_blocks)
    if precision not in FORMATS:
        raise UnsupportedModelError(f"quantize={precision!r}: choose None (float32) or one of "
                                    f"{tuple(p for p in FORMATS if p)}")
    fmt = FORMATS[precision]
    if fmt == "f32":
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


def _file_blocks(module: torch.nn.Module) -> tuple[torch.Tensor, str] | None:
    """A layer's GGUF blocks (my_ops.gguf.attach_blocks), packed as they are; None for a layer the file keeps in float."""
    if getattr(module, "gguf_blocks", None) is None:
        return None
    codes, records, fmt = module.gguf_blocks
    return interleave(codes, records, fmt), fmt


def _put_on_ops(model: torch.nn.Module, packed) -> torch.nn.Module:
    """The token embedding and every linear layer on the op of the format packed(module) gives, (packed weight,
    format), or None: the embedding stays aten::embedding and a linear layer my_ops::linear_f32 on its own weight (the
    Parameter itself: a tied embedding keeps reading the same one). A tied output projection reads the embedding's
    packed table, so the program stores it once."""
    linears = {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    embedding = model.get_input_embeddings()
    table = packed(embedding) if isinstance(embedding, torch.nn.Embedding) else None
    if table is not None:
        _replace(model, next(n for n, m in model.named_modules() if m is embedding), Embedding(*table))
    for name, linear in linears.items():
        tied = embedding is not None and linear.weight is getattr(embedding, "weight", None)
        weight, fmt = table if tied and table is not None else packed(linear) or (linear.weight, "f32")
        _replace(model, name, Linear(weight, fmt, linear.bias, type(linear).__name__))
    return model
