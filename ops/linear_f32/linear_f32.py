"""my_ops::linear_f32's Python side: the op is registered from C++ (linear_f32.cpp, in libcustom_ops_aot_lib.so); this
module holds its reference in ATen ops and the example the flow exports. It imports only torch.

out = input @ weight.T with weight [outputs, inputs] float32: the same rows aten::embedding looks up, so a model whose
output projection is tied to its embedding keeps one table (the program stores it once).
"""

from __future__ import annotations

import torch


def linear_f32_reference(input: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return input @ weight.T


class TiedExample(torch.nn.Module):
    """A language model's two ends on one table: look tokens up (aten::embedding), project back (the op). 40 outputs
    over 70 inputs: rows not a multiple of any vector width."""

    def __init__(self, vocab: int = 40, hidden: int = 70):
        super().__init__()
        # An inference op: the weight takes no gradient (a Parameter that did would be refused by name).
        self.table = torch.nn.Parameter(torch.randn(vocab, hidden, generator=torch.Generator().manual_seed(6)),
                                        requires_grad=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = torch.nn.functional.embedding(tokens, self.table)
        return torch.ops.my_ops.linear_f32(hidden.cumsum(-2), self.table)


def example():
    """(model, runs): 5 positions (a group of four tokens sharing each weight read, and one more), twice."""
    return TiedExample(), [(torch.tensor([[0, 5, 39, 7, 7]]),), (torch.tensor([[12, 3, 3, 0, 1]]),)]
