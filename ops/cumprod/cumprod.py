"""aten::cumprod's Python side: PyTorch ships the op, so this module holds only what the flow needs besides its runtime
kernel (cumprod_out.cpp): the reference, ATen's own kernel, and the example model the flow exports."""

from __future__ import annotations

import torch


def cumprod_reference(self: torch.Tensor, dim: int, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """ATen's kernel: the runtime kernel shares no code with it."""
    return torch.ops.aten.cumprod.default(self, dim, dtype=dtype)


class Cumprod(torch.nn.Module):
    """Running products along the middle and the last dimension, and of integers (whose result is int64)."""

    def forward(self, x: torch.Tensor, counts: torch.Tensor):
        return torch.cumprod(x, 1), torch.cumprod(x, -1), torch.cumprod(counts, 0)


def example():
    """(model, runs): the model the flow exports and the inputs of each execution the verifier feeds."""
    generator = torch.Generator().manual_seed(0)
    runs = [(1 + 0.1 * torch.randn(3, 17, 70, generator=generator),
             torch.randint(-9, 10, (12, 5), generator=generator, dtype=torch.int32)) for _ in range(2)]
    return Cumprod(), runs
