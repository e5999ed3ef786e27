"""Step 1 of the quantize_rows flow: registers my_ops::quantize_rows(Tensor input, int bits=8) -> (Tensor values,
Tensor scales) with PyTorch from Python through the torch.library.custom_op decorator (the other Python style beside
custom_ops_1.py's Library.define), and its out variant, which EXIR needs. Symmetric per-row quantization: for each row
of the last dimension, scale = max|x| / (2^(bits-1) - 1) (float32, shape input.shape[:-1]) and values = x / scale
rounded half to even (int8, shaped like the input). The runtime kernel is quantize_rows_out.cpp.

Importing this module registers the op and does nothing else (it imports only torch).
"""

from __future__ import annotations

import torch

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MIN_BITS, MAX_BITS = 2, 8


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")  # float32: the runtime kernel's spelling


def _check(op: str, input: torch.Tensor, bits: int, values: torch.Tensor | None = None,
           scales: torch.Tensor | None = None) -> None:
    """The runtime kernel's checks and messages, in its order (quantize_rows_out.cpp), so both refuse alike."""
    torch._check(input.dtype in DTYPES,
                 lambda: f"{op}: input has unsupported dtype {_name(input.dtype)}; supported: "
                         f"{', '.join(map(_name, DTYPES))}")
    for name, tensor, dtype in (("values", values, torch.int8), ("scales", scales, torch.float32)):
        torch._check(tensor is None or tensor.dtype == dtype,
                     lambda: f"{op}: {name} has unsupported dtype {_name(tensor.dtype)}; supported: {_name(dtype)}")
    torch._check(MIN_BITS <= bits <= MAX_BITS, lambda: f"{op}: bits must be {MIN_BITS} to {MAX_BITS}, got {bits}")
    torch._check(input.dim() >= 1 and input.shape[-1] > 0,
                 lambda: f"{op}: input needs a non-empty last dimension (the rows quantized), got shape "
                         f"{list(input.shape)}")


def quantize_rows_reference(input: torch.Tensor, bits: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_rows in ATen ops, declared as its reference."""
    qmax = float(2 ** (bits - 1) - 1)
    x = input.to(torch.float32)
    scales = torch.amax(torch.abs(x), dim=-1) / qmax
    divisor = torch.where(scales > 0, scales, torch.ones_like(scales))  # an all-zero row quantizes to zeros
    values = torch.clamp(torch.round(x / divisor.unsqueeze(-1)), -qmax, qmax).to(torch.int8)
    return values, scales


def _quantize(op: str, input: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    _check(op, input, bits)
    if not torch.isfinite(input).all():
        raise ValueError(f"{op}: the input holds NaN or infinity, which has no quantized value")
    qmax = 2 ** (bits - 1) - 1
    rows = input.float().reshape(-1, input.shape[-1])
    scales = rows.abs().max(dim=1).values.div(qmax)
    safe = scales.masked_fill(scales == 0, 1.0)
    values = rows.div(safe[:, None]).round().clamp_(-qmax, qmax).to(torch.int8)
    return values.reshape(input.shape), scales.reshape(input.shape[:-1])


def _register():
    @torch.library.custom_op("my_ops::quantize_rows", mutates_args=())
    def quantize_rows(input: torch.Tensor, bits: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
        return _quantize("my_ops::quantize_rows", input, bits)

    @quantize_rows.register_fake
    def _(input, bits=8):
        _check("my_ops::quantize_rows", input, bits)
        return (torch.empty(input.shape, dtype=torch.int8, device=input.device),
                torch.empty(input.shape[:-1], dtype=torch.float32, device=input.device))

    # No autograd formula: rounding has no useful gradient, and the values are integers.

    # The out variant, in the same signature as the decorator's schema (it types `int` as SymInt), plus the outputs.
    lib = torch.library.Library("my_ops", "FRAGMENT")
    lib.define("quantize_rows.out(Tensor input, SymInt bits=8, *, Tensor(a!) values, Tensor(b!) scales) "
               "-> (Tensor(a!), Tensor(b!))", tags=(torch.Tag.out,))

    def quantize_rows_out(input, bits=8, *, values, scales):
        op = "my_ops::quantize_rows.out"
        _check(op, input, bits, values, scales)
        v, s = _quantize(op, input, bits)
        values.resize_(v.shape).copy_(v)
        scales.resize_(s.shape).copy_(s)
        return values, scales

    def quantize_rows_out_fake(input, bits=8, *, values, scales):
        _check("my_ops::quantize_rows.out", input, bits, values, scales)
        return values.resize_(input.shape), scales.resize_(input.shape[:-1])

    torch.library.impl("my_ops::quantize_rows.out", "CompositeExplicitAutograd", lib=lib)(quantize_rows_out)
    torch.library.impl("my_ops::quantize_rows.out", "Meta", lib=lib)(quantize_rows_out_fake)
    return quantize_rows, lib


class QuantizeRowsExample(torch.nn.Module):
    """Activation quantization to 4 bits, as a model would call it (a bits argument other than the default)."""

    def forward(self, x: torch.Tensor):
        values, scales = torch.ops.my_ops.quantize_rows(x, 4)
        return values, scales


def example():
    """(model, runs) for the flow: the model exported, and the inputs of each execution the verifier makes."""
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(6, 32, generator=generator)
    x[2] = 0  # an all-zero row: scale 0, values 0
    x[3] = torch.arange(-16, 16) * 0.5  # scale 16/7: x / scale lands on halves, where rounding ties to even
    return QuantizeRowsExample(), [(x,)]


# Once per process: a copy of this module registered first (e.g. the my_ops wheel's) leaves the op defined.
_registered = None if hasattr(torch.ops.my_ops, "quantize_rows") else _register()
