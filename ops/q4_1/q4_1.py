"""my_ops::linear_q4_1 and my_ops::embedding_q4_1's Python side: both ops are registered from C++ (linear_q4_1.cpp,
embedding_q4_1.cpp, in libcustom_ops_aot_lib.so); this module holds their references in ATen ops and the examples the
flow exports. It imports only torch.

The weight is a uint8 tensor [n, k / 32 * 20], one row per output feature (a row of the embedding table): the row's
k / 32 blocks of 16 bytes, byte j holding q[j] in its low nibble and q[j + 16] in its high one, then the blocks' fp16
(d, m) records; w = d * q + m (llama.cpp's block_q4_1, with each block's record moved to the end of the row). The
linear quantizes its activations per block of 32 to int8 as linear_q8_0 does (ops/q8_0/q8_0.py).
"""

from __future__ import annotations

import torch

BLOCK = 32


def dequantize(weight: torch.Tensor) -> torch.Tensor:
    """The float32 [n, k] weight a Q4_1 weight holds."""
    n, blocks = weight.shape[0], weight.shape[1] // (BLOCK // 2 + 4)
    packed = weight[:, :blocks * BLOCK // 2].reshape(n, blocks, BLOCK // 2)
    q = torch.cat([packed & 0x0F, packed >> 4], dim=-1).float()
    records = weight[:, blocks * BLOCK // 2:].contiguous().view(torch.float16).float().reshape(n, blocks, 2)
    return (q * records[:, :, :1] + records[:, :, 1:]).reshape(n, blocks * BLOCK)


def linear_q4_1_reference(input: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    from ops.q8_0.q8_0 import quantized_activations  # the activations are quantized as for every block format

    return quantized_activations(input) @ dequantize(weight).T


def embedding_q4_1_reference(weight: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    return dequantize(weight)[indices]


def random_weight(rows: int, inputs: int, generator: torch.Generator) -> torch.Tensor:
    """A Q4_1 weight of random nibbles (every value 0-15), scales around 0.05 and minimums around -0.4."""
    packed = torch.randint(0, 256, (rows, inputs // 2), generator=generator, dtype=torch.uint8)
    d = 0.02 + 0.05 * torch.rand(rows, inputs // BLOCK, generator=generator)
    m = -0.4 + 0.2 * torch.randn(rows, inputs // BLOCK, generator=generator)
    records = torch.stack([d, m], dim=-1).half()
    return torch.cat([packed, records.view(torch.uint8).reshape(rows, -1)], dim=1)


class LinearExample(torch.nn.Module):
    """A projection whose weight is a Q4_1 constant of the program: 96 inputs (three blocks, an odd count) onto 40."""

    def __init__(self, outputs: int = 40, inputs: int = 96):
        super().__init__()
        self.register_buffer("weight", random_weight(outputs, inputs, torch.Generator().manual_seed(10)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.my_ops.linear_q4_1(x, self.weight)


class EmbeddingExample(torch.nn.Module):
    """A token lookup in a Q4_1 table (the same constant a tied output projection reads)."""

    def __init__(self, vocab: int = 40, hidden: int = 96):
        super().__init__()
        self.register_buffer("table", random_weight(vocab, hidden, torch.Generator().manual_seed(11)))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.ops.my_ops.embedding_q4_1(self.table, tokens)


def linear_example():
    """(model, runs): 5 positions (a group of four tokens sharing each weight read, and one more), twice."""
    generator = torch.Generator().manual_seed(12)
    return LinearExample(), [(torch.randn(1, 5, 96, generator=generator),) for _ in range(2)]


def embedding_example():
    return EmbeddingExample(), [(torch.tensor([[0, 5, 39, 7]]),), (torch.tensor([[12, 12, 3, 0]]),)]
