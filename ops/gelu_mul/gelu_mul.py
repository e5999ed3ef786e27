"""Step 1 of the gelu_mul flow: registers my_ops::gelu_mul(Tensor gate, Tensor up) -> Tensor with PyTorch from Python:
gelu(gate, approximate="tanh") * up, the gated activation of a GeGLU MLP (Gemma's down(gelu(gate(x)) * up(x))), one
op and one pass over memory where ExecuTorch runs two, its gelu taking a tanh per lane. Within a few ulp of that
reference, not its bits (gelu_mul_rows.h: one exp, no cancellation).
my_ops.hf's export pass (fuse.py) puts it where a model computes that pattern. The runtime kernel is gelu_mul_out.cpp.

Importing this module registers the op and does nothing else (it imports only torch).
"""

from __future__ import annotations

import torch

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")  # float32: the runtime kernel's spelling


def _check(op: str, gate: torch.Tensor, up: torch.Tensor, out: torch.Tensor | None = None) -> None:
    """The runtime kernel's checks and messages, in its order (gelu_mul_out.cpp), so both refuse alike."""
    torch._check(gate.dtype in DTYPES, lambda: f"{op}: gate has unsupported dtype {_name(gate.dtype)}; supported: "
                                               f"{', '.join(map(_name, DTYPES))}")
    for name, t in (("up", up), ("out", out)):
        torch._check(t is None or t.dtype == gate.dtype,
                     lambda: f"{op}: {name} has dtype {_name(t.dtype)} but gate has {_name(gate.dtype)}; they must "
                             "match")
    torch._check(gate.shape == up.shape, lambda: f"{op}: gate of shape {list(gate.shape)} and up of shape "
                                                 f"{list(up.shape)} differ; give both the same shape")


def gelu_mul_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gelu_mul in ATen ops, declared as its reference."""
    return torch.nn.functional.gelu(gate, approximate="tanh") * up


def _register() -> torch.library.Library:
    lib = torch.library.Library("my_ops", "FRAGMENT")
    lib.define("gelu_mul(Tensor gate, Tensor up) -> Tensor")
    lib.define("gelu_mul.out(Tensor gate, Tensor up, *, Tensor(a!) out) -> Tensor(a!)", tags=(torch.Tag.out,))

    def gelu_mul(gate, up):
        _check("my_ops::gelu_mul", gate, up)
        return gelu_mul_reference(gate, up)

    def gelu_mul_out(gate, up, *, out):
        _check("my_ops::gelu_mul.out", gate, up, out)
        return torch.mul(torch.nn.functional.gelu(gate, approximate="tanh"), up, out=out.resize_(gate.shape))

    def gelu_mul_fake(gate, up):
        _check("my_ops::gelu_mul", gate, up)
        return torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)

    def gelu_mul_out_fake(gate, up, *, out):
        _check("my_ops::gelu_mul.out", gate, up, out)
        return out.resize_(gate.shape)

    torch.library.impl("my_ops::gelu_mul", "CompositeExplicitAutograd", lib=lib)(gelu_mul)
    torch.library.impl("my_ops::gelu_mul.out", "CompositeExplicitAutograd", lib=lib)(gelu_mul_out)
    torch.library.register_fake("my_ops::gelu_mul", gelu_mul_fake, lib=lib)
    torch.library.impl("my_ops::gelu_mul.out", "Meta", lib=lib)(gelu_mul_out_fake)
    return lib


class GeGLUExample(torch.nn.Module):
    """A GeGLU MLP's activation on its gate and up projections' outputs, as [B, T, intermediate]."""

    def forward(self, gate, up):
        return torch.ops.my_ops.gelu_mul(gate, up)


def example():
    """(model, runs): activations across the gelu's range, where tanh(z) nears -1 (gate near -3), past where the exp
    overflows (+-100) and near 0, in a shape with a tail after whole vectors (37)."""
    generator = torch.Generator().manual_seed(7)
    gate = torch.randn(1, 3, 37, generator=generator) * 4
    gate[0, 0, :6] = torch.tensor([100.0, -100.0, 0.0, -0.0, -3.0, -5.0])
    up = torch.randn(1, 3, 37, generator=generator)
    return GeGLUExample(), [(gate, up)]


# Once per process: a copy of this module registered first (e.g. the my_ops wheel's) leaves the op defined.
_lib = None if hasattr(torch.ops.my_ops, "gelu_mul") else _register()
