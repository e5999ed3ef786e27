"""Check 7 of flow.program for the Python runtime: an XNNPACK delegate payload read as XNNPACK reads it, before the
backend sees it (runner/xnnpack_payload.cpp is the runner's side). Its flatbuffer identifier must be one XNNPACK
accepts (a corrupt one is logged verbatim, and the Python runtime's log dies on non-UTF-8 bytes), and every constant
tensor's dims must fit the bytes stored for it: XNNPACK's compiler trusts them, and a mutated decoder.pte with one
weight dim enlarged made it read far past the weights (SIGSEGV in xnn_create_fully_connected_nc_f32).

A bounds-checked walk over FlatBuffers tables, field slots from backends/xnnpack/serialization/schema.fbs (a union
takes two slots, its type then its value).
"""

from __future__ import annotations

import struct

IDENTIFIERS = (b"XN00", b"XN01")  # what XNNPACK's runtime accepts (XNNCompiler.cpp)
ELEMENT_BITS = {1: 32, 2: 16, 3: 8, 4: 8, 5: 32, 6: 8, 7: 32, 8: 4, 9: 8, 10: 4}  # XNNDatatype -> bits per element
NAMED_DATA = 2**64 - 1  # a ConstantDataOffset whose bytes live in the program's named data


class Unreadable(Exception):
    pass


class FlatReader:
    def __init__(self, data: bytes):
        self.data = data

    def read(self, fmt: str, pos: int):
        if pos < 0 or pos + struct.calcsize(fmt) > len(self.data):
            raise Unreadable()
        return struct.unpack_from("<" + fmt, self.data, pos)[0]

    def target(self, pos: int) -> int:
        offset = self.read("I", pos)
        if offset == 0 or pos + offset >= len(self.data):
            raise Unreadable()
        return pos + offset

    def field(self, table: int, slot: int) -> int:
        vtable = table - self.read("i", table)
        entry = 4 + 2 * slot
        if entry + 2 > self.read("H", vtable):
            return 0
        offset = self.read("H", vtable + entry)
        return table + offset if offset else 0

    def scalar(self, table: int, slot: int, fmt: str) -> int:
        pos = self.field(table, slot)
        return self.read(fmt, pos) if pos else 0

    def child(self, table: int, slot: int) -> int:
        pos = self.field(table, slot)
        return self.target(pos) if pos else 0

    def vector(self, table: int, slot: int, width: int) -> tuple[int, int]:
        """(position, length) of a vector field; (0, 0) when absent."""
        vector = self.child(table, slot)
        if not vector:
            return 0, 0
        n = self.read("I", vector)
        if vector + 4 + n * width > len(self.data):
            raise Unreadable()
        return vector, n


def problem(payload: bytes) -> str | None:
    """What is wrong with one XNNPACK payload (optional XH00 header, flatbuffer, constant data), or None."""
    start, size, constants_size, header = 0, len(payload), 0, payload[4:8] == b"XH00" and len(payload) >= 34
    if header:
        start, size, constants_size = struct.unpack_from("<IIxxxxxxxxQ", payload, 10)
        if start > len(payload) or size > len(payload) - start:
            return "its header places the XNNPACK graph outside the payload"
    graph_bytes = payload[start:start + size]
    if graph_bytes[4:8] not in IDENTIFIERS:
        return (f"its flatbuffer identifier is {graph_bytes[4:8]!r}, not one of "
                f"{', '.join(i.decode() for i in IDENTIFIERS)}")
    r = FlatReader(graph_bytes)
    try:
        graph = r.target(0)
        constants, num_constants = r.vector(graph, 8, 4)  # constant_data: [ConstantDataOffset {offset, size, key}]
        values, num_values = r.vector(graph, 2, 4)  # xvalues: [XValue {xvalue_union}]
        for i in range(num_values):
            value = r.target(values + 4 + 4 * i)
            kind = r.scalar(value, 0, "B")  # 1 XNNTensorValue, 2 XNNQuantizedTensorValue
            tensor = r.child(value, 1) if kind in (1, 2) else 0
            if kind == 2 and tensor:
                tensor = r.child(tensor, 0)  # its tensor_value
            if not tensor:
                continue
            index = r.scalar(tensor, 3, "I")  # constant_buffer_idx; 0: not a constant
            bits = ELEMENT_BITS.get(r.scalar(tensor, 0, "h"), 0)
            if index == 0 or bits == 0:
                continue
            if index >= num_constants:
                return f"value {i} names constant data {index} of {num_constants}"
            dims_at, rank = r.vector(tensor, 2, 4)
            dims = [r.read("I", dims_at + 4 + 4 * d) for d in range(rank)]
            elements = 1
            for dim in dims:
                elements *= dim
            constant = r.target(constants + 4 + 4 * index)
            offset, stored = r.scalar(constant, 0, "Q"), r.scalar(constant, 1, "Q")
            needed = (elements * bits + 7) // 8
            if needed > stored:
                return (f"constant value {i} has dims {dims} ({needed} bytes) but its constant data holds {stored} "
                        "bytes")
            if header and offset != NAMED_DATA and (offset > constants_size or stored > constants_size - offset):
                return f"constant data {index} lies outside the payload's constant region"
    except Unreadable:
        return "its XNNPACK graph cannot be read (an offset or length points outside it)"
    return None
