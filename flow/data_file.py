"""The check of a named data file (.ptd: the weights of a program exported with them outside it) before ExecuTorch's
Python runtime reads it: the runner's check (runner/data_file.cpp) in the same order and words, over the same layout
(flow/xnnpack_layout.py). ExecuTorch's reader trusts the file's tables (no FlatBuffers verifier runs), so a damaged
offset or a layout larger than its bytes would crash the process or read past the data; flow/runtime.py's
load_method_checked calls this first.
"""

from __future__ import annotations

import functools
import struct

from . import xnnpack_layout as L
from .dtypes import from_scalar_type
from .lazy_exir import defer_exir_package
from .xnnpack_payload import FlatReader, Unreadable

HEADER_END = L.PTD_HEADER_FIELDS["segment_data_size"][0] + 8


class DataFileError(ValueError):
    """The file is not a data file the runtime can be handed safely; the message names the problem."""


@functools.cache
def _element_size(dtype: int) -> int:
    defer_exir_package()  # scalar_type alone, not the exporter
    from executorch.exir.scalar_type import ScalarType

    names = {int(t): t.name for t in ScalarType}
    torch_dtype = from_scalar_type(names[dtype]) if dtype in names else None
    return 0 if torch_dtype is None else torch_dtype.itemsize


def _printable(key: bytes) -> str:
    return "".join(chr(b) if 0x20 <= b < 0x7F else "?" for b in key[:200])


def _named_tensor_problem(r: FlatReader, entry: int, index: int, segment_sizes: list[int]) -> str | None:
    where = f"named tensor {index}"
    key = r.string(entry, L.SLOTS["FlatTensorNamedData"]["key"])
    if not key:
        return f"{where} has no key"
    named = f"{where} ('{_printable(key)}')"
    segment = r.scalar(entry, L.SLOTS["FlatTensorNamedData"]["segment_index"], "I")
    if segment >= len(segment_sizes):
        return f"{named} names segment {segment} of {len(segment_sizes)}"
    layout = r.child(entry, L.SLOTS["FlatTensorNamedData"]["tensor_layout"])
    if not layout:
        return f"{named} has no tensor layout"
    slots = L.SLOTS["TensorLayout"]
    dtype = r.scalar(layout, slots["scalar_type"], "b")
    sizes = r.scalars(layout, slots["sizes"], "i")
    dim_order = r.scalars(layout, slots["dim_order"], "B")
    if sizes is None or dim_order is None or len(sizes) != len(dim_order):
        return f"{named} has a layout without sizes and a dim order of one length each"
    width = _element_size(dtype)
    if width == 0:
        return f"{named} has dtype {dtype}, which this ExecuTorch does not define"
    if sorted(dim_order) != list(range(len(sizes))):
        return f"{named} has a dim order that is not a permutation of its dimensions"
    elements = 1
    for size in sizes:
        if size < 0:
            return f"{named} has a negative size"
        if size and elements > L.MAX_ELEMENTS // size:
            return f"{named} has more elements than any tensor can"
        elements *= size
    if elements * width > segment_sizes[segment]:
        return f"{named} needs {elements * width} bytes and its segment holds {segment_sizes[segment]}"
    return None


def problem(data: bytes) -> str | None:
    """The first problem of the data file `data`, in the runner's words; None when every named tensor's layout and
    bytes lie within the file."""
    if len(data) < HEADER_END:
        return f"it has {len(data)} bytes, fewer than a data file's header"
    if data[4:8] != L.PTD_IDENTIFIER or data[8:12] != L.PTD_HEADER_MAGIC:
        return "it does not start as one (identifier FT01, header FH01)"
    field = {name: struct.unpack_from("<" + fmt, data, at)[0] for name, (at, fmt) in L.PTD_HEADER_FIELDS.items()}
    if field["header_length"] < L.PTD_HEADER_LENGTH:
        return f"its header is {field['header_length']} bytes long, fewer than {L.PTD_HEADER_LENGTH}"
    flatbuffer_end = field["flatbuffer_offset"] + field["flatbuffer_size"]
    segment_base, segment_data = field["segment_base_offset"], field["segment_data_size"]
    if flatbuffer_end > len(data) or flatbuffer_end < HEADER_END or segment_base + segment_data > len(data):
        return f"its header places its tables or data outside its {len(data)} bytes"
    r = FlatReader(bytes(data[:flatbuffer_end]))
    try:
        root = r.target(0)
        if root < L.PTD_HEADER_FIELDS["magic"][0]:
            return "its root table lies outside its tables"
        version = r.scalar(root, L.SLOTS["FlatTensor"]["version"], "I")
        if version > L.PTD_MAX_SCHEMA_VERSION:
            return (f"it is of schema version {version}, newer than this ExecuTorch reads ({L.PTD_MAX_SCHEMA_VERSION}):"
                    " export it with the runtime's ExecuTorch")
        segments = r.tables(root, L.SLOTS["FlatTensor"]["segments"])
        named = r.tables(root, L.SLOTS["FlatTensor"]["named_data"])
        if segments is None or named is None:
            return "its segment or named-data table is missing or damaged"
        segment_sizes = []
        for i, segment in enumerate(segments):
            offset = r.scalar(segment, L.SLOTS["DataSegment"]["offset"], "Q")
            size = r.scalar(segment, L.SLOTS["DataSegment"]["size"], "Q")
            if offset > segment_data or size > segment_data - offset:
                return f"segment {i} lies outside its data ({segment_data} bytes)"
            segment_sizes.append(size)
        for i, entry in enumerate(named):
            if (found := _named_tensor_problem(r, entry, i, segment_sizes)) is not None:
                return found
    except Unreadable:
        return "a table points outside its tables"
    return None


def check(data: bytes, name: str) -> None:
    """DataFileError naming the problem of the data file `data` (called `name`), as the runner words it."""
    if (found := problem(data)) is not None:
        raise DataFileError(f"'{name}' is not a usable ExecuTorch data file (.ptd): {found}. Write it again with its "
                            "program's export")
