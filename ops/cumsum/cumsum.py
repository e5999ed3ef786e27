"""aten::cumsum's Python side: PyTorch ships the op and ExecuTorch has a kernel for it, which this project's replaces
(cumsum_out.cpp: PyTorch's bits, where ExecuTorch's keeps a float32 running sum). This module holds the reference,
ATen's own kernel, and the example model the flow exports."""

from __future__ import annotations

import torch


def cumsum_reference(self: torch.Tensor, dim: int, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """ATen's kernel: the runtime kernel shares no code with it."""
    return torch.ops.aten.cumsum.default(self, dim, dtype=dtype)


class Cumsum(torch.nn.Module):
    """Running sums along a long last dimension (where a float32 running sum drifts from ATen's double one), along the
    first, and of integers into float64 (the dtype argument)."""

    def forward(self, x: torch.Tensor, counts: torch.Tensor):
        return torch.cumsum(x, -1), torch.cumsum(x, 0), torch.cumsum(counts, 1, dtype=torch.float64)


def example():
    """(model, runs): the model the flow exports and the inputs of each execution the verifier feeds."""
    generator = torch.Generator().manual_seed(0)
    runs = [(torch.randn(6, 4000, generator=generator),
             torch.randint(-1000, 1000, (3, 50), generator=generator, dtype=torch.int32)) for _ in range(2)]
    return Cumsum(), runs
