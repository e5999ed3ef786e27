"""aten::bucketize's Python side: PyTorch ships the op, so this module holds only what the flow needs besides its
runtime kernel (bucketize_out.cpp): the reference, ATen's own kernel, and the example model the flow exports."""

from __future__ import annotations

import torch


def bucketize_reference(self: torch.Tensor, boundaries: torch.Tensor, *, out_int32: bool = False,
                        right: bool = False) -> torch.Tensor:
    """ATen's kernel: the runtime kernel shares no code with it."""
    return torch.ops.aten.bucketize.Tensor(self, boundaries, out_int32=out_int32, right=right)


class Bucketize(torch.nn.Module):
    """Bins a feature by fixed, sorted edges (a tokenizer of a continuous value), both index dtypes and both sides."""

    def __init__(self):
        super().__init__()
        self.register_buffer("edges", torch.tensor([-2.0, -1.0, -0.5, 0.0, 0.0, 0.5, 1.0, 2.0, float("inf")]))

    def forward(self, x: torch.Tensor):
        return (torch.bucketize(x, self.edges), torch.bucketize(x, self.edges, out_int32=True, right=True))


def example():
    """(model, runs): the model the flow exports and the inputs of each execution the verifier feeds."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4, 33, generator=generator) * 1.5
    x[0, :6] = torch.tensor([0.0, -0.0, 0.5, float("nan"), float("-inf"), float("inf")])  # ties, NaN, the infinities
    return Bucketize(), [(x,), (torch.randn(4, 33, generator=generator),)]
