"""The machinery's one dtype table: how ExecuTorch's scalar types (in a .pte) map to torch dtypes, and which dtypes the
elementwise kernel helper implements (kernel_helpers/unary_elementwise.h compiles the same nine)."""

from __future__ import annotations

import torch

# ExecuTorch ScalarType name (executorch.exir.schema.ScalarType) -> torch dtype, for every type a program's tensor may
# have. A format fact, not a promise that some kernel supports it.
SCALAR_TYPES: dict[str, torch.dtype] = {
    "BYTE": torch.uint8, "CHAR": torch.int8, "SHORT": torch.int16, "INT": torch.int32, "LONG": torch.int64,
    "HALF": torch.float16, "FLOAT": torch.float32, "DOUBLE": torch.float64, "COMPLEX32": torch.complex32,
    "COMPLEX64": torch.complex64, "COMPLEX128": torch.complex128, "BOOL": torch.bool, "QINT8": torch.qint8,
    "QUINT8": torch.quint8, "QINT32": torch.qint32, "BFLOAT16": torch.bfloat16, "QUINT4x2": torch.quint4x2,
    "QUINT2x4": torch.quint2x4, "BITS16": torch.bits16, "FLOAT8E5M2": torch.float8_e5m2,
    "FLOAT8E4M3FN": torch.float8_e4m3fn, "FLOAT8E5M2FNUZ": torch.float8_e5m2fnuz,
    "FLOAT8E4M3FNUZ": torch.float8_e4m3fnuz, "UINT16": torch.uint16, "UINT32": torch.uint32, "UINT64": torch.uint64,
}

# The dtypes of the elementwise kernels (every real dtype aten::mul supports on CPU), by torch name.
ELEMENTWISE_DTYPES: tuple[str, ...] = (
    "float32", "float64", "float16", "bfloat16", "uint8", "int8", "int16", "int32", "int64",
)


def from_scalar_type(name: str) -> torch.dtype | None:
    """The torch dtype of an ExecuTorch ScalarType name; None for a name the schema does not have."""
    return SCALAR_TYPES.get(name)
