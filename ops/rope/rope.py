"""Step 1 of the rope flow: registers my_ops::rope(Tensor x, Tensor cos, Tensor sin) -> Tensor with PyTorch from
Python, the rotary position embedding in the rotate-half form of transformers' Llama family:
x * cos + cat(-x[..., D/2:], x[..., :D/2]) * sin, one op where ATen spends ten (two slices, a negation, a
concatenation, two unsqueezes of cos and sin, two multiplies, an add). cos and sin broadcast against x: each dimension
x's or 1, the last D (even). my_ops.hf's export pass (fuse.py) puts it where a model computes that pattern. The runtime
kernel is rope_out.cpp.

Importing this module registers the op and does nothing else (it imports only torch).
"""

from __future__ import annotations

import torch

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_DIMS = 16  # the runtime kernel indexes up to this many


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")  # float32: the runtime kernel's spelling


def _check(op: str, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor | None = None) -> None:
    """The runtime kernel's checks and messages, in its order (rope_out.cpp), so both refuse alike."""
    torch._check(x.dtype in DTYPES, lambda: f"{op}: x has unsupported dtype {_name(x.dtype)}; supported: "
                                            f"{', '.join(map(_name, DTYPES))}")
    for name, t in (("cos", cos), ("sin", sin), ("out", out)):
        torch._check(t is None or t.dtype == x.dtype,
                     lambda: f"{op}: {name} has dtype {_name(t.dtype)} but x has {_name(x.dtype)}; they must match")
    torch._check(x.dim() >= 1 and x.shape[-1] > 0 and x.shape[-1] % 2 == 0,
                 lambda: f"{op}: x's last dimension is the one rotated and must be even and non-empty, got shape "
                         f"{list(x.shape)}")
    torch._check(x.dim() <= MAX_DIMS, lambda: f"{op}: x has {x.dim()} dimensions, more than the {MAX_DIMS} this kernel "
                                              "indexes; merge its leading dimensions")
    for name, t in (("cos", cos), ("sin", sin)):
        torch._check(1 <= t.dim() <= x.dim() and t.shape[-1] == x.shape[-1]
                     and all(t.shape[-k] in (1, x.shape[-k]) for k in range(2, t.dim() + 1)),
                     lambda: f"{op}: {name} of shape {list(t.shape)} does not broadcast to x of shape "
                             f"{list(x.shape)}; give it x's size or 1 in each dimension and {x.shape[-1]} last")
    torch._check(cos.shape == sin.shape, lambda: f"{op}: cos of shape {list(cos.shape)} and sin of shape "
                                                 f"{list(sin.shape)} differ; give both the same shape")


def rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """rope in ATen ops, declared as its reference: transformers' rotate_half and apply_rotary_pos_emb."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _rope(op: str, x, cos, sin) -> torch.Tensor:
    _check(op, x, cos, sin)
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _register() -> torch.library.Library:
    lib = torch.library.Library("my_ops", "FRAGMENT")
    lib.define("rope(Tensor x, Tensor cos, Tensor sin) -> Tensor")
    lib.define("rope.out(Tensor x, Tensor cos, Tensor sin, *, Tensor(a!) out) -> Tensor(a!)", tags=(torch.Tag.out,))

    def rope_out(x, cos, sin, *, out):
        op = "my_ops::rope.out"
        _check(op, x, cos, sin, out)
        return out.resize_(x.shape).copy_(_rope(op, x, cos, sin))

    def rope_fake(x, cos, sin):
        _check("my_ops::rope", x, cos, sin)
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)

    def rope_out_fake(x, cos, sin, *, out):
        _check("my_ops::rope.out", x, cos, sin, out)
        return out.resize_(x.shape)

    torch.library.impl("my_ops::rope", "CompositeExplicitAutograd", lib=lib)(
        lambda x, cos, sin: _rope("my_ops::rope", x, cos, sin))
    torch.library.impl("my_ops::rope.out", "CompositeExplicitAutograd", lib=lib)(rope_out)
    torch.library.register_fake("my_ops::rope", rope_fake, lib=lib)
    torch.library.impl("my_ops::rope.out", "Meta", lib=lib)(rope_out_fake)
    return lib


class RopeExample(torch.nn.Module):
    """q and k of a decoder step as [B, T, heads, D], cos and sin [B, T, 1, D] shared by the heads (as my_ops.hf's
    attention lays them out)."""

    def forward(self, q, k, cos, sin):
        return torch.ops.my_ops.rope(q, cos, sin), torch.ops.my_ops.rope(k, cos, sin)


def example():
    """(model, runs): two steps of three positions each (0-2, 3-5), the angles of 8 frequencies as Llama's."""
    generator = torch.Generator().manual_seed(5)
    runs = []
    for start, length in ((0, 3), (3, 3)):
        positions = torch.arange(start, start + length, dtype=torch.float32)
        angles = positions[:, None] * (10000.0 ** (-torch.arange(0, 8, dtype=torch.float32) / 8))
        angles = torch.cat((angles, angles), dim=-1)[None, :, None, :]
        q = torch.randn(1, length, 4, 16, generator=generator)
        k = torch.randn(1, length, 2, 16, generator=generator)
        runs.append((q, k, angles.cos(), angles.sin()))
    return RopeExample(), runs


# Once per process: a copy of this module registered first (e.g. the my_ops wheel's) leaves the op defined.
_lib = None if hasattr(torch.ops.my_ops, "rope") else _register()
