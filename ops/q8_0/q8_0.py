"""my_ops::linear_q8_0 and my_ops::embedding_q8_0's Python side: both ops are registered from C++ (linear_q8_0.cpp,
embedding_q8_0.cpp, in libcustom_ops_aot_lib.so); this module holds their references in ATen ops and the example the
flow exports. It imports only torch.

The weight is a uint8 tensor [n, k / 32 * 34], one row per output feature (a row of the embedding table): the row's
k / 32 blocks of 32 int8 quants q, then their k / 32 fp16 scales d; w = d * q (llama.cpp's block_q8_0, with each
block's scale moved to the end of the row). The linear quantizes each block of 32 activations to int8 as llama.cpp
does (d = max|x| / 127, q = round-half-even(x / d)) and sums exact integer products per block, so its reference
computes with those quantized activations.
"""

from __future__ import annotations

import torch

BLOCK = 32


def dequantize(weight: torch.Tensor) -> torch.Tensor:
    """The float32 [n, k] weight a Q8_0 weight holds."""
    n, blocks = weight.shape[0], weight.shape[1] // (BLOCK + 2)
    q = weight[:, :blocks * BLOCK].view(torch.int8).reshape(n, blocks, BLOCK).float()
    d = weight[:, blocks * BLOCK:].contiguous().view(torch.float16).float()
    return (q * d[:, :, None]).reshape(n, blocks * BLOCK)


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


def random_weight(rows: int, inputs: int, generator: torch.Generator) -> torch.Tensor:
    """A Q8_0 weight of random quants (every int8 value, -128 included) and scales around 0.01."""
    q = torch.randint(-128, 128, (rows, inputs), generator=generator, dtype=torch.int8)
    d = (0.005 + 0.01 * torch.rand(rows, inputs // BLOCK, generator=generator)).half()
    return torch.cat([q.view(torch.uint8), d.view(torch.uint8).reshape(rows, -1)], dim=1)


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
