"""Stands for a library you cannot edit: it defines other_lib::scale_shift (x * scale + shift, float32) as a functional
op only, with torch.library.custom_op, as a quantization library or a model's own code does. ExecuTorch's exporter
needs an out variant of every op a program runs (it plans each output's memory), so a model calling this one stops
with "Missing out variants" until one is added from outside: docs/adding-an-op.md, "An out variant for an op you
cannot edit", does that without touching this file."""

import torch


def _checked(x: torch.Tensor) -> torch.Tensor:
    torch._check(x.dtype == torch.float32, lambda: "other_lib::scale_shift: x has unsupported dtype "
                 f"{str(x.dtype).removeprefix('torch.')}; supported: float32")
    return x


@torch.library.custom_op("other_lib::scale_shift", mutates_args=())
def scale_shift(x: torch.Tensor, scale: float, shift: float) -> torch.Tensor:
    return _checked(x) * scale + shift


@scale_shift.register_fake
def _(x, scale, shift):
    return torch.empty_like(_checked(x))
