"""Step 1 of the gated activations' flow: registers the family act(gate) * up with PyTorch from Python, one op per
activation, one pass over memory where ExecuTorch runs two or three ops:

    my_ops::silu_mul(Tensor gate, Tensor up) -> Tensor   silu(gate) * up: a SwiGLU MLP's (Llama's), with the
        operations and roundings of the ops it replaces (silu decomposes into a sigmoid and a multiply, then the
        multiply by up), so the fusion changes no output (silu_mul_out.cpp says why)
    my_ops::gelu_mul(Tensor gate, Tensor up) -> Tensor   gelu(gate, approximate="tanh") * up: a GeGLU MLP's (Gemma's),
        within a few ulp of that reference, not its bits (gelu_mul_rows.h: one exp, no cancellation)

my_ops.hf's export pass (fuse.py) puts them where a model computes those patterns. Both runtime kernels share one
body (kernel_helpers/gated_activation.h) over their activation's rows (<op>_rows.h). Another activation is one more
entry in ACTIVATIONS, its rows header and out kernel, and its declaration.

Importing this module registers the ops and does nothing else (it imports only torch).
"""

from __future__ import annotations

import torch

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def silu_mul_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu_mul in ATen ops, declared as its reference."""
    return torch.nn.functional.silu(gate) * up


def gelu_mul_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gelu_mul in ATen ops, declared as its reference."""
    return torch.nn.functional.gelu(gate, approximate="tanh") * up


# Each op of the family by name: its activation, applied to gate before the product with up.
ACTIVATIONS = {
    "silu_mul": torch.nn.functional.silu,
    "gelu_mul": lambda gate: torch.nn.functional.gelu(gate, approximate="tanh"),
}


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")  # float32: the runtime kernel's spelling


def _check(op: str, gate: torch.Tensor, up: torch.Tensor, out: torch.Tensor | None = None) -> None:
    """The runtime kernels' checks and messages, in their order (kernel_helpers/gated_activation.h), so both refuse
    alike."""
    torch._check(gate.dtype in DTYPES, lambda: f"{op}: gate has unsupported dtype {_name(gate.dtype)}; supported: "
                                               f"{', '.join(map(_name, DTYPES))}")
    for name, t in (("up", up), ("out", out)):
        torch._check(t is None or t.dtype == gate.dtype,
                     lambda: f"{op}: {name} has dtype {_name(t.dtype)} but gate has {_name(gate.dtype)}; they must "
                             "match")
    torch._check(gate.shape == up.shape, lambda: f"{op}: gate of shape {list(gate.shape)} and up of shape "
                                                 f"{list(up.shape)} differ; give both the same shape")


def _register(name: str, activation) -> torch.library.Library:
    qualified = f"my_ops::{name}"
    lib = torch.library.Library("my_ops", "FRAGMENT")
    lib.define(f"{name}(Tensor gate, Tensor up) -> Tensor")
    lib.define(f"{name}.out(Tensor gate, Tensor up, *, Tensor(a!) out) -> Tensor(a!)", tags=(torch.Tag.out,))

    def functional(gate, up):
        _check(qualified, gate, up)
        return activation(gate) * up

    def out_variant(gate, up, *, out):
        _check(f"{qualified}.out", gate, up, out)
        return torch.mul(activation(gate), up, out=out.resize_(gate.shape))

    def fake(gate, up):
        _check(qualified, gate, up)
        return torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)

    def out_fake(gate, up, *, out):
        _check(f"{qualified}.out", gate, up, out)
        return out.resize_(gate.shape)

    torch.library.impl(qualified, "CompositeExplicitAutograd", lib=lib)(functional)
    torch.library.impl(f"{qualified}.out", "CompositeExplicitAutograd", lib=lib)(out_variant)
    torch.library.register_fake(qualified, fake, lib=lib)
    torch.library.impl(f"{qualified}.out", "Meta", lib=lib)(out_fake)
    return lib


class GatedExample(torch.nn.Module):
    """An MLP's gated activation on its gate and up projections' outputs, as [B, T, intermediate]."""

    def __init__(self, name: str):
        super().__init__()
        self.name = name

    def forward(self, gate, up):
        return getattr(torch.ops.my_ops, self.name)(gate, up)


def _example(name: str, scale: float, specials: list[float]):
    generator = torch.Generator().manual_seed(7)
    gate = torch.randn(1, 3, 37, generator=generator) * scale
    gate[0, 0, :len(specials)] = torch.tensor(specials)
    up = torch.randn(1, 3, 37, generator=generator)
    return GatedExample(name), [(gate, up)]


def silu_mul_example():
    """(model, runs): activations across silu's range, past where exp overflows (+-100) and near 0, in a shape with a
    tail after whole vectors (37)."""
    return _example("silu_mul", 8, [100.0, -100.0, 0.0, -0.0])


def gelu_mul_example():
    """(model, runs): activations across the gelu's range, where tanh(z) nears -1 (gate near -3), past where the exp
    overflows (+-100) and near 0, in a shape with a tail after whole vectors (37)."""
    return _example("gelu_mul", 4, [100.0, -100.0, 0.0, -0.0, -3.0, -5.0])


# Once per process and op: a copy of this module registered first (e.g. the my_ops wheel's) leaves the ops defined.
_libs = [_register(name, activation) for name, activation in ACTIVATIONS.items()
         if not hasattr(torch.ops.my_ops, name)]
