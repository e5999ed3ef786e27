"""my_ops::rms_norm's Python side: the op is registered from C++ (rms_norm.cpp, in libcustom_ops_aot_lib.so); this
module holds what the flow needs besides: its reference in ATen ops (the verifier and the tests compare every kernel
with it) and the example model the flow exports. It imports only torch.
"""

from __future__ import annotations

import torch

HIDDEN = 64


def rms_norm_reference(input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """The decomposed graph the op replaces, in float for the half types: five passes, four intermediates."""
    x = input.float()
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(input.dtype)


class RmsNormExample(torch.nn.Module):
    """A norm with a learned weight and a non-default eps, as a model would call it."""

    def __init__(self, hidden: int = HIDDEN):
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(hidden, generator=generator))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.my_ops.rms_norm(x, self.weight, 1e-5)


def example():
    """(model, runs): the model the flow exports and the inputs of each execution the verifier makes."""
    generator = torch.Generator().manual_seed(1)
    return RmsNormExample(), [(torch.randn(4, HIDDEN, generator=generator),)]
