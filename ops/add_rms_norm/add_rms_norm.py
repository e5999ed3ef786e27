"""Step 1 of the add_rms_norm flow: registers my_ops::add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps)
-> (Tensor sum, Tensor normed) with PyTorch from Python: a decoder layer's residual add and the norm that follows it,
sum = x + residual and normed = my_ops::rms_norm(sum, weight, eps), in one op and one pass over the rows (the sum is
still needed: it is the next residual). my_ops.hf's export pass (fuse.py) puts it where a model adds two tensors and
normalizes the sum. The runtime kernel is add_rms_norm_out.cpp; its norm is rms_norm's own row code
(ops/rms_norm/rms_norm_rows.h), so the fused program gives the unfused one's bits.

Importing this module registers the op and does nothing else (it imports only torch).
"""

from __future__ import annotations

import torch

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")  # float32: the runtime kernel's spelling


def _check(op: str, x, residual, weight, sum=None, normed=None) -> None:
    """The runtime kernel's checks and messages, in its order (add_rms_norm_out.cpp), so both refuse alike."""
    torch._check(x.dtype in DTYPES, lambda: f"{op}: x has unsupported dtype {_name(x.dtype)}; supported: "
                                            f"{', '.join(map(_name, DTYPES))}")
    for name, t in (("residual", residual), ("weight", weight), ("sum", sum), ("normed", normed)):
        torch._check(t is None or t.dtype == x.dtype,
                     lambda: f"{op}: {name} has dtype {_name(t.dtype)} but x has {_name(x.dtype)}; they must match")
    torch._check(x.shape == residual.shape, lambda: f"{op}: x of shape {list(x.shape)} and residual of shape "
                                                    f"{list(residual.shape)} differ; give both the same shape")
    torch._check(x.dim() >= 1 and weight.dim() >= 1 and weight.dim() <= x.dim() and weight.numel() == x.shape[-1]
                 and weight.shape[-1] == x.shape[-1],
                 lambda: f"{op}: weight of shape {list(weight.shape)} does not scale the last dimension of x of shape "
                         f"{list(x.shape)}; give it shape [{x.shape[-1] if x.dim() else 0}]")


def add_rms_norm_reference(x, residual, weight, eps: float = 1e-6):
    """add_rms_norm in ATen ops, declared as its reference: the add, then rms_norm's reference (in float for the half
    types)."""
    total = x + residual
    s = total.float()
    return total, (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def _add_rms_norm(op: str, x, residual, weight, eps):
    _check(op, x, residual, weight)
    total = x + residual
    return total, torch.ops.my_ops.rms_norm(total, weight, eps)  # the op the pass replaces: the same bits in eager


def _register() -> torch.library.Library:
    lib = torch.library.Library("my_ops", "FRAGMENT")
    lib.define("add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps=1e-06) -> (Tensor, Tensor)")
    lib.define("add_rms_norm.out(Tensor x, Tensor residual, Tensor weight, float eps=1e-06, *, Tensor(a!) sum, "
               "Tensor(b!) normed) -> (Tensor(a!), Tensor(b!))", tags=(torch.Tag.out,))

    def add_rms_norm_out(x, residual, weight, eps=1e-6, *, sum, normed):
        op = "my_ops::add_rms_norm.out"
        _check(op, x, residual, weight, sum, normed)
        total, norm = _add_rms_norm(op, x, residual, weight, eps)
        return sum.resize_(x.shape).copy_(total), normed.resize_(x.shape).copy_(norm)

    def add_rms_norm_fake(x, residual, weight, eps=1e-6):
        _check("my_ops::add_rms_norm", x, residual, weight)
        return (torch.empty(x.shape, dtype=x.dtype, device=x.device),
                torch.empty(x.shape, dtype=x.dtype, device=x.device))

    def add_rms_norm_out_fake(x, residual, weight, eps=1e-6, *, sum, normed):
        _check("my_ops::add_rms_norm.out", x, residual, weight, sum, normed)
        return sum.resize_(x.shape), normed.resize_(x.shape)

    torch.library.impl("my_ops::add_rms_norm", "CompositeExplicitAutograd", lib=lib)(
        lambda x, residual, weight, eps=1e-6: _add_rms_norm("my_ops::add_rms_norm", x, residual, weight, eps))
    torch.library.impl("my_ops::add_rms_norm.out", "CompositeExplicitAutograd", lib=lib)(add_rms_norm_out)
    torch.library.register_fake("my_ops::add_rms_norm", add_rms_norm_fake, lib=lib)
    torch.library.impl("my_ops::add_rms_norm.out", "Meta", lib=lib)(add_rms_norm_out_fake)
    return lib


HIDDEN = 72  # a tail after whole vectors of 64


class ResidualNormExample(torch.nn.Module):
    """A decoder layer's residual stream: a block's output added to it, the sum normalized for the next block."""

    def __init__(self):
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(HIDDEN, generator=generator))

    def forward(self, x, residual):
        return torch.ops.my_ops.add_rms_norm(x, residual, self.weight, 1e-5)


def example():
    """(model, runs): 3 positions of a residual stream and a block's output."""
    generator = torch.Generator().manual_seed(9)
    return ResidualNormExample(), [(torch.randn(1, 3, HIDDEN, generator=generator),
                                    torch.randn(1, 3, HIDDEN, generator=generator) * 4)]


# Once per process: a copy of this module registered first (e.g. the my_ops wheel's) leaves the op defined.
_lib = None if hasattr(torch.ops.my_ops, "add_rms_norm") else _register()
