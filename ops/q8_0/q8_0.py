"""my_ops::linear_q8_0 and my_ops::embedding_q8_0's Python side: both ops are registered from C++ (linear_q8_0.cpp,
embedding_q8_0.cpp, in libcustom_ops_aot_lib.so); this module holds their references in ATen ops and the example the
flow exports. It imports only torch.

The weight is a uint8 tensor [n, k / 32 * 34] holding llama.cpp's Q8_0 blocks (per row and block of 32 inputs: 32
int8 q and an fp16 scale d, w = d * q) in the layout the kernel reads (kernel_helpers/block_linear.h): rows in groups
of 16, the last group what remains; a group stores block after block, each block's quants as 8 steps of its R rows'
four next q (stored as q + 128), then the R rows' d. The linear quantizes each block of 32 activations to int8 as
llama.cpp does (d = max|x| / 127, q = round-half-even(x / d)) and sums exact integer products per block, so its
reference computes with those quantized activations.
"""

from __future__ import annotations

import torch

BLOCK = 32


def deinterleave(weight: torch.Tensor, quant_bytes: int, record_bytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A block-format weight's bytes back in row order: (quants [n, blocks, quant_bytes], records [n, blocks,
    record_bytes]), each row's quants in its steps' order and its record fields (d, then m) side by side."""
    n, blocks = weight.shape[0], weight.shape[1] // (quant_bytes + record_bytes)
    flat, quants, records = weight.reshape(-1), [], []
    for first in range(0, n, 16):
        rows = min(16, n - first)
        group = flat[first * blocks * (quant_bytes + record_bytes):(first + rows) * blocks * (quant_bytes + record_bytes)]
        group = group.reshape(blocks, rows * (quant_bytes + record_bytes))
        quants.append(group[:, :rows * quant_bytes].reshape(blocks, quant_bytes // 4, rows, 4).permute(2, 0, 1, 3)
                      .reshape(rows, blocks, quant_bytes))
        records.append(group[:, rows * quant_bytes:].reshape(blocks, record_bytes // 2, rows, 2).permute(2, 0, 1, 3)
                       .reshape(rows, blocks, record_bytes))
    return torch.cat(quants), torch.cat(records)


def dequantize(weight: torch.Tensor) -> torch.Tensor:
    """The float32 [n, k] weight a Q8_0 weight holds."""
    quants, records = deinterleave(weight, BLOCK, 2)
    q = quants.int() - 128
    d = records.contiguous().view(torch.float16).float()  # [n, blocks, 1]
    return (q.float() * d).reshape(weight.shape[0], -1)


def quantized_activations(x: torch.Tensor) -> torch.Tensor:
    """x as the kernels see it: each block of 32 along the last dimension rounded to d * q, d = max|x| / 127 (NaN for
    a block holding a non-finite value), q = round(x / d) (0 where d is 0)."""
    blocks = x.float().reshape(*x.shape[:-1], -1, BLOCK)
    finite = blocks.isfinite().all(-1, keepdim=True)
    d = torch.where(finite, blocks.abs().amax(-1, keepdim=True) / 127, torch.nan)
    q = torch.where(finite & (d != 0), torch.round(blocks / d), 0).clamp(-127, 127)
    return (q * d).reshape(x.shape)


def linear_q8_0_reference(input: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return quantized_activations(input) @ dequantize(weight).T


def embedding_q8_0_reference(weight: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    return dequantize(weight)[indices]


def random_blocks(rows: int, inputs: int, quant_bytes: int, records: list[torch.Tensor],
                  generator: torch.Generator) -> torch.Tensor:
    """A block-format weight [rows, inputs / 32 * block bytes] of random quant bytes (every value) whose records hold
    `records` (fp16 [rows, inputs / 32] each: d, then m), placed where deinterleave reads them; torch alone, so an
    example builds without the packer's package."""
    blocks, record_bytes = inputs // BLOCK, 2 * len(records)
    weight = torch.randint(0, 256, (rows, blocks * (quant_bytes + record_bytes)), generator=generator,
                           dtype=torch.uint8)
    _, where = deinterleave(torch.arange(weight.numel()).reshape(weight.shape), quant_bytes, record_bytes)
    fields = torch.stack(records, dim=-1).contiguous().view(torch.uint8)  # [rows, blocks, record_bytes]
    weight.view(-1)[where.reshape(-1)] = fields.reshape(-1)
    return weight


def random_weight(rows: int, inputs: int, generator: torch.Generator) -> torch.Tensor:
    """A Q8_0 weight of random quants (every int8 value, -128 included) and scales around 0.01."""
    d = (0.005 + 0.01 * torch.rand(rows, inputs // BLOCK, generator=generator)).half()
    return random_blocks(rows, inputs, BLOCK, [d], generator)


class LinearExample(torch.nn.Module):
    """A projection whose weight is a Q8_0 constant of the program (a language model's output layer, at a small size):
    96 inputs (three blocks, an odd count) onto 40 outputs."""

    def __init__(self, outputs: int = 40, inputs: int = 96):
        super().__init__()
        self.register_buffer("weight", random_weight(outputs, inputs, torch.Generator().manual_seed(3)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.my_ops.linear_q8_0(x, self.weight)


class EmbeddingExample(torch.nn.Module):
    """A token lookup in a Q8_0 table (the same constant a tied output projection reads)."""

    def __init__(self, vocab: int = 40, hidden: int = 96):
        super().__init__()
        self.register_buffer("table", random_weight(vocab, hidden, torch.Generator().manual_seed(4)))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.ops.my_ops.embedding_q8_0(self.table, tokens)


def linear_example():
    """(model, runs): 5 positions (a group of four tokens sharing each weight read, and one more), twice: a program is
    run more than once."""
    generator = torch.Generator().manual_seed(5)
    return LinearExample(), [(torch.randn(1, 5, 96, generator=generator),) for _ in range(2)]


def embedding_example():
    return EmbeddingExample(), [(torch.tensor([[0, 5, 39, 7]]),), (torch.tensor([[12, 12, 3, 0]]),)]
