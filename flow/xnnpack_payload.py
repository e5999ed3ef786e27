"""Check 7 of flow.program for the Python runtime: an XNNPACK delegate payload read as XNNPACK reads it, before the
backend sees it (runner/xnnpack_payload.cpp is the runner's side; both follow flow/xnnpack_layout.py). XNNPACK's
compiler verifies the graph's FlatBuffers structure but trusts what the fields say: a dim larger than the bytes stored
for a weight made it read 512 MiB past them (SIGSEGV in xnn_create_fully_connected_nc_f32). Every field it trusts is
checked here first; docs/untrusted-programs.md lists them with what each guards.

    read(payload) -> Payload            the fields, as XNNPACK will read them (Unreadable when the walk leaves the bytes)
    describe(Payload) -> [str]          one "name=value" line per field (what the round-trip test compares)
    problem(payload, named_data, delegate_args) -> str | None
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from . import xnnpack_layout as L


class Unreadable(Exception):
    pass


class FlatReader:
    """Bounds-checked FlatBuffers access: every position is checked before it is read."""

    def __init__(self, data: bytes):
        self.data = data

    def read(self, fmt: str, pos: int):
        if pos < 0 or pos + struct.calcsize("<" + fmt) > len(self.data):
            raise Unreadable()
        return struct.unpack_from("<" + fmt, self.data, pos)[0]

    def target(self, pos: int) -> int:
        offset = self.read("I", pos)
        if offset == 0 or pos + offset >= len(self.data):
            raise Unreadable()
        return pos + offset

    def field(self, table: int, slot: int) -> int:
        vtable = table - self.read("i", table)
        if vtable < 0 or vtable >= len(self.data):
            raise Unreadable()
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

    def vector(self, table: int, slot: int, width: int) -> tuple[int, int] | None:
        """(position, length) of a vector field; None when absent."""
        vector = self.child(table, slot)
        if not vector:
            return None
        n = self.read("I", vector)
        if vector + 4 + n * width > len(self.data):
            raise Unreadable()
        return vector, n

    def scalars(self, table: int, slot: int, fmt: str) -> list[int] | None:
        found = self.vector(table, slot, struct.calcsize("<" + fmt))
        if found is None:
            return None
        at, n = found
        return [self.read(fmt, at + 4 + i * struct.calcsize("<" + fmt)) for i in range(n)]

    def tables(self, table: int, slot: int) -> list[int] | None:
        found = self.vector(table, slot, 4)
        return None if found is None else [self.target(found[0] + 4 + 4 * i) for i in range(found[1])]

    def string(self, table: int, slot: int) -> bytes | None:
        found = self.vector(table, slot, 1)
        return None if found is None else self.data[found[0] + 4:found[0] + 4 + found[1]]


@dataclass
class Quant:
    kind: int  # L.QUANT_*
    channel_dim: int = 0
    num_scales_in_vector: int | None = None  # the scale vector's length; None when absent
    scale_buffer_idx: int = 0
    num_scales: int = 0
    group_size: int = 0
    num_nonbatch_dims: int = 0


@dataclass
class Value:
    kind: int  # L.XVALUE_*, or another tag this walk does not read
    datatype: int = 0
    num_dims: int = 0
    dims: list[int] | None = None
    constant_buffer_idx: int = 0
    external_id: int = 0
    flags: int = 0
    id_out: int = 0
    quant: Quant | None = None


@dataclass
class Node:
    kind: int  # the XNodeUnion tag: L.NODE_KINDS[kind - 1] when known
    present: bool = False  # its table is there (XNNPACK's compiler reads it unchecked)
    inputs: list[int] | None = None  # the value ids it reads (L.NODE_SHAPES), None when kind or table is unknown
    outputs: list[int] | None = None
    per_input_dim: list[int | None] | None = None  # lengths of the vectors read one entry per input dim (None: absent)

    @property
    def name(self) -> str:
        return L.NODE_KINDS[self.kind - 1][0] if 1 <= self.kind <= len(L.NODE_KINDS) else f"kind {self.kind}"


@dataclass
class Payload:
    header: dict | None
    identifier: bytes
    num_externs: int = 0
    num_nodes: int | None = None
    nodes: list[Node] | None = None
    input_ids: list[int] | None = None
    output_ids: list[int] | None = None
    constants: list[tuple[int, int, bytes | None]] | None = None  # ConstantDataOffset: (offset, size, named_key)
    values: list[Value] | None = None


def read_header(payload: bytes) -> dict | None:
    """The XH00 header's fields, or None for a bare flatbuffer (XNNPACK reads those too)."""
    if len(payload) < L.HEADER_SIZE or payload[4:8] != L.HEADER_MAGIC:
        return None
    return {name: struct.unpack_from("<" + fmt, payload, offset)[0]
            for name, (offset, fmt) in L.HEADER_FIELDS.items() if name != "magic"}


def read(payload: bytes, header: dict | None = None) -> Payload:
    """The payload's fields; `header`: its read_header(), when the caller has it already."""
    header = header if header is not None else read_header(payload)
    start, size = (header["flatbuffer_offset"], header["flatbuffer_size"]) if header else (0, len(payload))
    graph_bytes = payload[start:start + size] if start <= len(payload) else b""
    result = Payload(header, graph_bytes[4:8])
    if header and (start > len(payload) or size > len(payload) - start):
        return result  # problem() reports the header; nothing past it can be located
    r, G, T = FlatReader(graph_bytes), L.SLOTS["XNNGraph"], L.SLOTS["XNNTensorValue"]
    graph = r.target(0)
    result.num_externs = r.scalar(graph, G["num_externs"], "I")
    nodes = r.tables(graph, G["xnodes"])
    result.num_nodes = None if nodes is None else len(nodes)
    result.nodes = None if nodes is None else [_read_node(r, at) for at in nodes]
    result.input_ids = r.scalars(graph, G["input_ids"], "I")
    result.output_ids = r.scalars(graph, G["output_ids"], "I")
    C = L.SLOTS["ConstantDataOffset"]
    constants = r.tables(graph, G["constant_data"])
    result.constants = None if constants is None else [
        (r.scalar(c, C["offset"], "Q"), r.scalar(c, C["size"], "Q"), r.string(c, C["named_key"])) for c in constants]
    values = r.tables(graph, G["xvalues"])
    if values is None:
        return result
    result.values = []
    for at in values:
        value = Value(kind=r.scalar(at, L.SLOTS["XValue"]["xvalue_union_type"], "B"))
        result.values.append(value)
        if value.kind not in (L.XVALUE_TENSOR, L.XVALUE_QUANTIZED):
            continue
        tensor = r.child(at, L.SLOTS["XValue"]["xvalue_union"])
        quantized = tensor if value.kind == L.XVALUE_QUANTIZED else 0
        if quantized:
            tensor = r.child(quantized, L.SLOTS["XNNQuantizedTensorValue"]["tensor_value"])
        if not tensor:
            value.kind = 0  # a union member without its table: nothing XNNPACK can define
            continue
        value.datatype = r.scalar(tensor, T["datatype"], "h")
        value.num_dims = r.scalar(tensor, T["num_dims"], "I")
        value.dims = r.scalars(tensor, T["dims"], "I")
        value.constant_buffer_idx = r.scalar(tensor, T["constant_buffer_idx"], "I")
        value.external_id = r.scalar(tensor, T["external_id"], "I")
        value.flags = r.scalar(tensor, T["flags"], "I")
        value.id_out = r.scalar(tensor, T["id_out"], "I")
        if quantized:
            value.quant = _read_quant(r, quantized)
    return result


def _read_node(r: FlatReader, at: int) -> Node:
    node = Node(kind=r.scalar(at, L.SLOTS["XNode"]["xnode_union_type"], "B"))
    if not 1 <= node.kind <= len(L.NODE_KINDS):
        return node
    table = r.child(at, L.SLOTS["XNode"]["xnode_union"])
    node.present = bool(table)
    if table:
        shape = L.NODE_SHAPES[L.NODE_KINDS[node.kind - 1][1]]
        node.inputs = [r.scalar(table, slot, "I") for slot in shape["inputs"]]
        node.outputs = [r.scalar(table, slot, "I") for slot in shape["outputs"]]
        node.per_input_dim = [None if (v := r.vector(table, slot, 4)) is None else v[1]
                              for slot in shape.get("per_input_dim", ())]
    return node


def _read_quant(r: FlatReader, quantized: int) -> Quant:
    Q = L.SLOTS["XNNQuantizedTensorValue"]
    quant = Quant(kind=r.scalar(quantized, Q["quant_params_type"], "B"))
    params = r.child(quantized, Q["quant_params"])
    if not params:
        return quant
    if quant.kind in (L.QUANT_PER_CHANNEL, L.QUANT_PER_CHANNEL_GROUP):
        S = L.SLOTS["PerChannelQuant" if quant.kind == L.QUANT_PER_CHANNEL else "PerChannelGroupQuant"]
        scales = r.vector(params, S["scale"], 4)
        quant.num_scales_in_vector = None if scales is None else scales[1]
        quant.channel_dim = r.scalar(params, S["channel_dim"], "i")
        quant.scale_buffer_idx = r.scalar(params, S["scale_buffer_idx"], "I")
        quant.num_scales = r.scalar(params, S["num_scales"], "I")
        if quant.kind == L.QUANT_PER_CHANNEL_GROUP:
            quant.group_size = r.scalar(params, S["group_size"], "i")
    elif quant.kind == L.QUANT_PER_TOKEN_DYNAMIC:
        quant.num_nonbatch_dims = r.scalar(params, L.SLOTS["PerTokenDynamicQuant"]["num_nonbatch_dims"], "i")
    return quant


def describe(p: Payload) -> list[str]:
    """Every field read, one "name=value" line each, in the order runner/xnnpack_payload.cpp's describe prints."""
    def ints(values):
        return "-" if values is None else ",".join(map(str, values))

    lines = [f"header.{k}={v}" for k, v in (p.header or {}).items()]
    lines += [f"identifier={p.identifier.decode('latin-1')}", f"num_externs={p.num_externs}",
              f"num_nodes={'-' if p.num_nodes is None else p.num_nodes}",
              f"input_ids={ints(p.input_ids)}", f"output_ids={ints(p.output_ids)}"]
    for i, (offset, size, key) in enumerate(p.constants or []):
        lines.append(f"constant[{i}]={offset},{size},{'-' if key is None else key.decode('latin-1')}")
    for i, n in enumerate(p.nodes or []):
        lengths = "-" if n.per_input_dim is None else ",".join("-" if x is None else str(x) for x in n.per_input_dim)
        lines.append(f"node[{i}]=kind:{n.kind} table:{int(n.present)} inputs:{ints(n.inputs)} "
                     f"outputs:{ints(n.outputs)} per_input_dim:{lengths}")
    for i, v in enumerate(p.values or []):
        line = (f"value[{i}]=kind:{v.kind} datatype:{v.datatype} num_dims:{v.num_dims} dims:{ints(v.dims)} "
                f"constant:{v.constant_buffer_idx} external_id:{v.external_id} flags:{v.flags} id_out:{v.id_out}")
        if (q := v.quant) is not None:
            scales = "-" if q.num_scales_in_vector is None else q.num_scales_in_vector
            line += (f" quant:{q.kind} channel_dim:{q.channel_dim} scales:{scales} "
                     f"scale_buffer:{q.scale_buffer_idx} num_scales:{q.num_scales} group_size:{q.group_size} "
                     f"nonbatch_dims:{q.num_nonbatch_dims}")
        lines.append(line)
    return lines


def problem(payload: bytes, named_data: dict[bytes, int] | None = None, delegate_args: int | None = None) -> str | None:
    """What is wrong with one XNNPACK payload, or None. named_data: the program's named data, key -> bytes stored
    (None: not checked); delegate_args: the fewest arguments any call of this delegate passes (None: not checked)."""
    header = read_header(payload)
    if header is not None and (message := _header_problem(header, len(payload))):
        return message
    try:
        p = read(payload, header)
    except Unreadable:
        return "its XNNPACK graph cannot be read (an offset or length points outside it)"
    if p.identifier not in L.IDENTIFIERS:
        return (f"its flatbuffer identifier is {p.identifier!r}, not one of "
                f"{', '.join(i.decode() for i in L.IDENTIFIERS)}")
    try:
        return _graph_problem(p, named_data, delegate_args)
    except Unreadable:
        return "its XNNPACK graph cannot be read (an offset or length points outside it)"


def _header_problem(h: dict, size: int) -> str | None:
    fb_at, fb_size = h["flatbuffer_offset"], h["flatbuffer_size"]
    cd_at, cd_size = h["constant_data_offset"], h["constant_data_size"]
    if h["header_length"] < L.HEADER_SIZE:
        return f"its header says it is {h['header_length']} bytes long, less than the {L.HEADER_SIZE} it holds"
    if fb_size < 8:
        return f"its header gives a flatbuffer of {fb_size} bytes, too small for a graph"
    if fb_at < h["header_length"] or fb_at > size or fb_size > size - fb_at:
        return (f"its header places the XNNPACK graph (offset {fb_at}, {fb_size} bytes) outside the payload of "
                f"{size} bytes")
    if cd_at > size or cd_size > size - cd_at:
        return (f"its header places the constant data (offset {cd_at}, {cd_size} bytes) outside the payload of "
                f"{size} bytes")
    if cd_at < fb_at + fb_size:
        return (f"its header places the constant data (offset {cd_at}) inside the graph (offset {fb_at}, "
                f"{fb_size} bytes)")
    return None


def _graph_problem(p: Payload, named_data: dict[bytes, int] | None, delegate_args: int | None) -> str | None:
    if p.values is None or p.num_nodes is None:
        return "its XNNPACK graph has no values or no nodes"
    if p.num_externs > L.MAX_EXTERNS:
        return f"num_externs is {p.num_externs}, more than XNNPACK's {L.MAX_EXTERNS}"
    if delegate_args is not None and p.num_externs > delegate_args:
        return f"num_externs is {p.num_externs} but the program calls the delegate with {delegate_args} arguments"
    for name, ids in (("input_ids", p.input_ids), ("output_ids", p.output_ids)):
        for i in ids or []:
            if i >= len(p.values):
                return f"{name} names value {i} of {len(p.values)}"
    for i, v in enumerate(p.values):
        if v.kind in (L.XVALUE_TENSOR, L.XVALUE_QUANTIZED) and (message := _value_problem(p, v, named_data)):
            return f"value {i}: {message}"
    return _nodes_problem(p)


def _nodes_problem(p: Payload) -> str | None:
    """The nodes in the order XNNPACK runs them: each of a kind XNNPACK knows, with its table, reading only values
    that exist by then (external inputs, constants, what an earlier node wrote) and writing each other value once.
    XNNPACK's subgraph optimizer follows a read value to its writer unchecked (libFuzzer: a Convert whose output id
    became its input's left the FullyConnected after it reading a value no node writes: SIGSEGV)."""
    by_id: dict[int, int] = {}
    for i, v in enumerate(p.values):
        if v.kind in (L.XVALUE_TENSOR, L.XVALUE_QUANTIZED):
            if v.id_out in by_id:
                return f"value {i}: id_out {v.id_out} is also value {by_id[v.id_out]}'s"
            by_id[v.id_out] = i
    written: dict[int, int] = {}  # value id -> the node that wrote it
    for i, n in enumerate(p.nodes or []):
        if not 1 <= n.kind <= len(L.NODE_KINDS):
            return f"node {i} is of kind {n.kind}, not one XNNPACK knows (1 to {len(L.NODE_KINDS)})"
        what = f"node {i} ({n.name})"
        if not n.present:
            return f"{what} has no table of fields"
        for verb, ids in (("reads", n.inputs), ("writes", n.outputs)):
            for id_ in ids:
                if id_ != L.NO_VALUE and id_ not in by_id:
                    return f"{what} {verb} value id {id_}, which no value defines"
        for id_ in n.inputs:
            v = p.values[by_id[id_]] if id_ != L.NO_VALUE else None
            if v is not None and not (v.flags & L.EXTERNAL_INPUT or v.constant_buffer_idx or id_ in written):
                return f"{what} reads value id {id_} before any node writes it"
        if n.per_input_dim:
            rank = p.values[by_id[n.inputs[0]]].num_dims if n.inputs[0] in by_id else 0
            if any(length is None or length < rank for length in n.per_input_dim):
                return f"{what} has a vector shorter than its input's {rank} dims"
        for id_ in n.outputs:
            if id_ == L.NO_VALUE:
                continue
            v = p.values[by_id[id_]]
            if v.flags & L.EXTERNAL_INPUT or v.constant_buffer_idx:
                return f"{what} writes value id {id_}, {'an external input' if v.constant_buffer_idx == 0 else 'a constant'}"
            if id_ in written:
                return f"{what} writes value id {id_}, which node {written[id_]} wrote already"
            written[id_] = i
    return None


def _value_problem(p: Payload, v: Value, named_data: dict[bytes, int] | None) -> str | None:
    rank = 0 if v.dims is None else len(v.dims)
    if v.num_dims != rank:
        return f"num_dims is {v.num_dims} but its dims vector holds {rank}"
    if rank > L.MAX_DIMS:
        return f"it has {rank} dims, more than XNNPACK's {L.MAX_DIMS}"
    if not 1 <= v.datatype <= L.MAX_DATATYPE:
        return f"datatype {v.datatype} is not one XNNPACK knows (1 to {L.MAX_DATATYPE})"
    bits = L.ELEMENT_BITS.get(v.datatype, 0)
    if v.constant_buffer_idx and bits == 0:
        return f"it is a constant of datatype {v.datatype}, whose size per element is unknown"
    if v.flags & ~L.EXTERNAL_FLAGS:
        return f"flags {v.flags:#x} has bits XNNPACK does not allow (only {L.EXTERNAL_FLAGS:#x})"
    if v.flags & L.EXTERNAL_FLAGS and v.external_id >= p.num_externs:
        return f"external_id {v.external_id} is not below num_externs {p.num_externs}"
    elements = 1
    for dim in v.dims or []:
        elements *= dim
        if elements > L.MAX_ELEMENTS:
            return f"dims {v.dims} make too many elements"
    if v.constant_buffer_idx and (message := _constant_problem(p, "constant_buffer_idx", v.constant_buffer_idx,
                                                               (elements * bits + 7) // 8, named_data)):
        return message
    return _quant_problem(p, v, named_data) if v.quant is not None else None


def _constant_problem(p: Payload, name: str, index: int, needed: int, named_data: dict[bytes, int] | None) -> str | None:
    """Constant data `index` exists and holds at least `needed` bytes, inside the constant region or in the program's
    named data."""
    count = len(p.constants or [])
    if index >= count:
        return f"{name} {index} names constant data {index} of {count}"
    offset, size, key = p.constants[index]
    if key is not None:
        if named_data is not None and key not in named_data:
            return f"{name} {index} names data '{key.decode('latin-1')}' the program does not hold"
        stored = named_data[key] if named_data is not None else None
    else:
        region = p.header["constant_data_size"] if p.header else 0
        if offset > region or size > region - offset:
            return (f"{name} {index}: constant data at offset {offset}, {size} bytes, lies outside the payload's "
                    f"constant region of {region} bytes")
        stored = size
    if stored is not None and needed > stored:
        return f"{name} {index}: it needs {needed} bytes but its constant data holds {stored}"
    return None


def _quant_problem(p: Payload, v: Value, named_data: dict[bytes, int] | None) -> str | None:
    q, dims = v.quant, v.dims or []
    if q.kind == L.QUANT_PER_CHANNEL:
        if not 0 <= q.channel_dim < len(dims):
            return f"channel_dim {q.channel_dim} is not a dim of its {len(dims)}"
        channels = dims[q.channel_dim]
        if q.scale_buffer_idx:
            return _constant_problem(p, "scale_buffer_idx", q.scale_buffer_idx, channels * L.SCALE_BITS // 8,
                                     named_data)
        if (q.num_scales_in_vector or 0) < channels:
            return f"it has {q.num_scales_in_vector or 0} scales for {channels} channels (dim {q.channel_dim})"
    elif q.kind == L.QUANT_PER_CHANNEL_GROUP:
        if len(dims) != 2:
            return f"per-group quantization needs 2 dims, it has {len(dims)}"
        if q.group_size <= 0 or dims[1] % q.group_size:
            return f"group_size {q.group_size} does not divide its {dims[1]} input channels"
        groups = dims[0] * (dims[1] // q.group_size)
        if q.scale_buffer_idx:
            if q.num_scales != groups:
                return f"num_scales is {q.num_scales}, not the {groups} its dims and group_size make"
            return _constant_problem(p, "scale_buffer_idx", q.scale_buffer_idx, groups * L.GROUP_SCALE_BITS // 8,
                                     named_data)
        if (q.num_scales_in_vector or 0) != groups:
            return f"it has {q.num_scales_in_vector or 0} scales, not the {groups} its dims and group_size make"
    elif q.kind == L.QUANT_PER_TOKEN_DYNAMIC:
        if not 0 <= q.num_nonbatch_dims <= len(dims):
            return f"num_nonbatch_dims {q.num_nonbatch_dims} is not between 0 and its {len(dims)} dims"
    elif q.kind != L.QUANT_PER_TENSOR:
        return f"quantization kind {q.kind} is not one XNNPACK reads"
    return None
