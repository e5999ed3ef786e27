"""How each block format of my_ops::linear_blocks and embedding_blocks stores a block: the Python side's one statement
of it. The reference (blocks.py) unpacks by it, the packer (my_ops/hf/quantize.py) and the GGUF reader
(my_ops/hf/gguf_blocks.py) pack by it; the wheel carries it as my_ops.block_layouts. The kernels state it in C++, once
per format (ops/blocks/formats/<f>.cpp) and take this statement at build time: `python block_layouts.py OUT` writes
the C++ header (ops/blocks/block_layouts.h in the build's generated tree) that lists the kernels' formats and that each
format's traits are checked against when it compiles (ops/blocks/formats.h), after checking that every format stated
here has its source and every source its statement (custom_ops.bzl compiles formats/ by a pattern).
tests/test_block_formats.py holds both to the gguf package's own table of llama.cpp's block sizes. Imports only the
standard library.

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


# Where each format's traits are: formats/<the GGUF type in lower case>.cpp, the row formats' all in one.
ROW_FORMATS_SOURCE = "float_rows.cpp"


def sources_problem(sources: list[str]) -> str | None:
    """Whether the format sources (file names in ops/blocks/formats/, which custom_ops.bzl compiles by a pattern) are
    one for each block format stated here and the row formats' one; else what is missing or extra, and the fix."""
    expected = {f"{name.lower()}.cpp": name for name in LAYOUTS}
    missing = sorted(expected.keys() - set(sources))
    if missing:
        return (f"ops/blocks/block_layouts.py states the block format {expected[missing[0]]}, whose traits source "
                f"ops/blocks/formats/{missing[0]} does not exist: write it (as q8_0.cpp is) or remove the layout")
    extra = sorted(set(sources) - expected.keys() - {ROW_FORMATS_SOURCE})
    if extra:
        return (f"ops/blocks/formats/{extra[0]} is compiled as a format's traits, but ops/blocks/block_layouts.py "
                f"states no layout for {extra[0][:-4].upper()}: add its entry to LAYOUTS or remove the source")
    if ROW_FORMATS_SOURCE not in sources:
        return f"ops/blocks/formats/{ROW_FORMATS_SOURCE} (the row formats {', '.join(ROW_DTYPES)}) does not exist"
    return None


def layout(fmt: str) -> Layout:
    if fmt not in LAYOUTS:
        raise ValueError(f"no block format {fmt!r}; the block formats are {', '.join(LAYOUTS)}")
    return LAYOUTS[fmt]


def cpp_header() -> str:
    """The C++ statement of FORMATS and LAYOUTS that ops/blocks/formats.h includes: the formats' list, and per block
    format the facts its traits must equal (checked by a static_assert when the format's source compiles)."""
    lines = ["// Generated from ops/blocks/block_layouts.py (`python block_layouts.py OUT`) by the build; do not edit.",
             "// The kernels' formats, in the order a refusal lists them, and each block format's layout as Python",
             "// states it: ops/blocks/formats.h checks each format's traits against it.", "#pragma once", "",
             "#define CUSTOM_OPS_BLOCK_FORMATS(X) " + " ".join(f"X({name})" for name in FORMATS), "",
             "namespace custom::native::blocks::stated {", "",
             "struct Layout {",
             "  const char* name;",
             "  int weights, sub, offset, planes, fields;",
             "  int plane_bits[4], plane_shifts[4], field_bytes[8];",
             "};", ""]
    for name, spec in LAYOUTS.items():
        if len(spec.planes) > 4 or len(spec.fields) > 8:
            raise ValueError(f"{name}: the C++ statement holds at most 4 planes and 8 fields")
        bits = ", ".join(str(b) for b, _ in spec.planes)
        shifts = ", ".join(str(s) for _, s in spec.planes)
        fields = ", ".join(map(str, spec.fields))
        lines.append(f'inline constexpr Layout k{name}{{"{name}", {spec.weights}, {spec.sub}, {spec.offset}, '
                     f"{len(spec.planes)}, {len(spec.fields)}, {{{bits}}}, {{{shifts}}}, {{{fields}}}}};")
    lines += ["", "}  // namespace custom::native::blocks::stated", ""]
    return "\n".join(lines)


if __name__ == "__main__":  # the build's step: python block_layouts.py OUT
    import os
    import sys

    if len(sys.argv) != 2:
        sys.exit("usage: python block_layouts.py OUT (the C++ header to write)")
    formats = os.path.join(os.path.dirname(os.path.abspath(__file__)), "formats")
    problem = sources_problem([f for f in os.listdir(formats) if f.endswith(".cpp")])
    if problem:
        sys.exit(f"error: {problem}")
    text = cpp_header()
    if not os.path.isfile(sys.argv[1]) or open(sys.argv[1]).read() != text:  # unchanged: nothing recompiles
        os.makedirs(os.path.dirname(os.path.abspath(sys.argv[1])), exist_ok=True)
        with open(sys.argv[1], "w") as f:
            f.write(text)
