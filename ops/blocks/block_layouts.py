"""How each block format of my_ops::linear_blocks and embedding_blocks stores a block: the Python side's one statement
of it. The reference (blocks.py) unpacks by it, the packer (my_ops/hf/quantize.py) and the GGUF reader
(my_ops/hf/gguf_blocks.py) pack by it; the wheel carries it as my_ops.block_layouts. The kernels state it in C++, once
per format (ops/blocks/formats/<f>.cpp, listed in ops/blocks/formats.h); tests/test_block_formats.py holds the two to
each other and to the gguf package's own table of llama.cpp's block sizes. Imports only the standard library.

A packed weight is uint8 [n, k / weights * bytes]: rows in groups of 16 (the last group what remains); a group stores
block after block, each block's codes 32 weights at a time as chunks of R rows x 4 bytes (per plane of b bits: b
chunks; byte j of chunk c holds weights 4 (c * 8 / b + i) + j at bits [b i, b i + b)), then its record, field by
field, R entries each. A weight is a * (code - offset) + b, a and b per sub-block of `sub` weights from the record.
"""

from __future__ import annotations

from typing import NamedTuple

BLOCK = 32  # weights a chunk of codes covers, and the activations' quantization block
GROUP = 16  # rows interleaved


class Layout(NamedTuple):
    weights: int                         # per block: 32, or 256 (a K-quant's super-block); GGUF's block size
    sub: int                             # weights per scale
    offset: int                          # w = a * (code - offset) + b
    planes: tuple[tuple[int, int], ...]  # (bits, shift) of each plane of the codes, in storage order
    fields: tuple[int, ...]              # the record's fields: 2 (an fp16) or 4 (four packed scale bytes)

    @property
    def bytes(self) -> int:
        """Bytes of one row's block: the GGUF block's size."""
        return self.weights // BLOCK * 4 * sum(bits for bits, _ in self.planes) + sum(self.fields)


# By GGUF type name, as the ops' `format` argument names them.
LAYOUTS = {
    "Q8_0": Layout(32, 32, 128, ((8, 0),), (2,)),
    "Q4_0": Layout(32, 32, 8, ((4, 0),), (2,)),
    "Q4_1": Layout(32, 32, 0, ((4, 0),), (2, 2)),
    "Q5_0": Layout(32, 32, 16, ((4, 0), (1, 4)), (2,)),
    "Q5_1": Layout(32, 32, 0, ((4, 0), (1, 4)), (2, 2)),
    "Q2_K": Layout(256, 16, 0, ((2, 0),), (4, 4, 4, 4, 2, 2)),
    "Q3_K": Layout(256, 16, 4, ((2, 0), (1, 2)), (4, 4, 4, 2)),
    "Q4_K": Layout(256, 32, 0, ((4, 0),), (2, 2, 4, 4, 4)),
    "Q5_K": Layout(256, 32, 0, ((4, 0), (1, 4)), (2, 2, 4, 4, 4)),
    "Q6_K": Layout(256, 16, 32, ((4, 0), (2, 4)), (4, 4, 4, 4, 2)),
}
# The row formats: a weight [n, k] of the dtype (by torch's name), no blocks.
ROW_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
FORMATS = (*ROW_DTYPES, *LAYOUTS)  # every format the ops take


def layout(fmt: str) -> Layout:
    if fmt not in LAYOUTS:
        raise ValueError(f"no block format {fmt!r}; the block formats are {', '.join(LAYOUTS)}")
    return LAYOUTS[fmt]
