"""my_ops::linear_q4_0 and my_ops::embedding_q4_0's Python side: both ops are registered from C++ (linear_q4_0.cpp,
embedding_q4_0.cpp, in libcustom_ops_aot_lib.so); this module holds their references in ATen ops and the examples the
flow exports. It imports only torch.

The weight is a uint8 tensor [n, k / 32 * 18] holding llama.cpp's Q4_0 blocks (per row and block of 32 inputs:
32 four-bit q and an fp16 scale d, w = d * (q - 8)) in the layout the kernel reads (kernel_helpers/block_linear.h):
rows in groups of 16, the last group what remains; a group stores block after block, each block's quants as 4 chunks
of its R rows' next four bytes (byte j of chunk c: q[8c + j] in the low nibble, q[8c + 4 + j] in the high one), then
the R rows' d. The linear quantizes its activations per block of 32 to int8 as linear_q8_0 does (ops/q8_0/q8_0.py).
"""

from __future__ import annotations

import torch

BLOCK = 32


def dequantize(weight: torch.Tensor) -> torch.Tensor:
    """The float32 [n, k] weight a Q4_0 weight holds."""
    from ops.q8_0.q8_0 import deinterleave  # the layout every block format shares

    quants, records = deinterleave(weight, BLOCK // 2, 2)
    n, blocks = quants.shape[:2]
    chunks = quants.reshape(n, blocks, 4, 1, 4)  # byte j of chunk c: inputs 8c + j (low nibble), 8c + 4 + j (high)
    q = torch.cat([chunks & 0x0F, chunks >> 4], dim=3).float() - 8
    d = records.contiguous().view(torch.float16).float()  # [n, blocks, 1]
    return (q.reshape(n, blocks, BLOCK) * d).reshape(n, -1)


def linear_q4_0_reference(input: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    from ops.q8_0.q8_0 import quantized_activations  # the activations are quantized as for every block format

    return quantized_activations(input) @ dequantize(weight).T


def embedding_q4_0_reference(weight: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    return dequantize(weight)[indices]


def random_weight(rows: int, inputs: int, generator: torch.Generator) -> torch.Tensor:
    """A Q4_0 weight of random codes (every value 0-15) and scales around 0.05."""
    from ops.q8_0.q8_0 import random_blocks

    d = (0.02 + 0.05 * torch.rand(rows, inputs // BLOCK, generator=generator)).half()
    return random_blocks(rows, inputs, BLOCK // 2, [d], generator)


class LinearExample(torch.nn.Module):
    """A projection whose weight is a Q4_0 constant of the program: 96 inputs (three blocks, an odd count) onto 40."""

    def __init__(self, outputs: int = 40, inputs: int = 96):
        super().__init__()
        self.register_buffer("weight", random_weight(outputs, inputs, torch.Generator().manual_seed(7)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.my_ops.linear_q4_0(x, self.weight)


class EmbeddingExample(torch.nn.Module):
    """A token lookup in a Q4_0 table (the same constant a tied output projection reads)."""

    def __init__(self, vocab: int = 40, hidden: int = 96):
        super().__init__()
        self.register_buffer("table", random_weight(vocab, hidden, torch.Generator().manual_seed(8)))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.ops.my_ops.embedding_q4_0(self.table, tokens)


def linear_example():
    """(model, runs): 5 positions (a group of four tokens sharing each weight read, and one more), twice."""
    generator = torch.Generator().manual_seed(9)
    return LinearExample(), [(torch.randn(1, 5, 96, generator=generator),) for _ in range(2)]


def embedding_example():
    return EmbeddingExample(), [(torch.tensor([[0, 5, 39, 7]]),), (torch.tensor([[12, 12, 3, 0]]),)]
