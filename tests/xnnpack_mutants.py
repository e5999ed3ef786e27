"""Targeted mutants of a delegated .pte: for each field of an XNNPACK payload that the delegate checks read
(flow/xnnpack_layout.py), a copy of the program with that field set to a hostile value (too large, zero, pointing
outside, off by one). Payloads are rewritten with ExecuTorch's own tools: the graph decompiled to JSON and compiled
back by the wheel's flatc with XNNPACK's schema, the header written by the wheel's XNNHeader, the program by
serialize_pte_binary. Each mutant names the words the checkers' error must contain.

    mutants(pte_bytes) -> [Mutant(name, field words, program bytes)]
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from dataclasses import dataclass
from typing import Callable

from flow import xnnpack_layout as L


@dataclass
class Mutant:
    name: str
    expect: str  # words the error line must contain (the field it names)
    data: bytes


@dataclass
class Payload:
    """An XNNPACK payload split into what its writer put together."""
    graph: dict  # the XNNGraph as JSON (every field, defaults included)
    constants: bytes  # the constant region after the graph


def _schema_dir(d: str) -> str:
    from executorch.backends.xnnpack.serialization.xnnpack_graph_serialize import _get_schema_bytes

    path = os.path.join(d, "schema.fbs")
    with open(path, "wb") as f:
        f.write(_get_schema_bytes())
    return path


def split(payload: bytes) -> Payload:
    from executorch.backends.xnnpack.serialization.xnnpack_graph_serialize import XNNHeader
    from executorch.exir._serialize._flatbuffer import _flatc_decompile

    header = XNNHeader.from_bytes(payload[:XNNHeader.EXPECTED_LENGTH])
    graph = payload[header.flatbuffer_offset:header.flatbuffer_offset + header.flatbuffer_size]
    with tempfile.TemporaryDirectory() as d:
        schema = _schema_dir(d)
        with open(os.path.join(d, "graph.bin"), "wb") as f:
            f.write(graph)
        _flatc_decompile(d, schema, os.path.join(d, "graph.bin"), ["--raw-binary"])
        with open(os.path.join(d, "graph.json")) as f:
            as_json = json.load(f)
    constants = payload[header.constant_data_offset:header.constant_data_offset + header.constant_data_size]
    return Payload(as_json, constants)


def join(p: Payload, patch: Callable[[bytearray], None] | None = None) -> bytes:
    """The payload as XNNPACK's serializer lays it out (serialize_xnnpack_binary), from JSON instead of dataclasses;
    patch: edits the compiled flatbuffer in place (for what flatc refuses to write, e.g. an unknown union tag)."""
    from executorch.backends.xnnpack.serialization.xnnpack_graph_serialize import (
        CONSTANT_TENSOR_ALIGNMENT, XNNHeader, _aligned_size, _pad_to)
    from executorch.exir._serialize._flatbuffer import _flatc_compile

    with tempfile.TemporaryDirectory() as d:
        schema = _schema_dir(d)
        with open(os.path.join(d, "schema.json"), "w") as f:
            json.dump(p.graph, f)
        _flatc_compile(d, schema, os.path.join(d, "schema.json"))
        with open(os.path.join(d, "schema.bin"), "rb") as f:
            flatbuffer = bytearray(f.read())
    if patch is not None:
        patch(flatbuffer)
    header_length = _aligned_size(XNNHeader.EXPECTED_LENGTH, CONSTANT_TENSOR_ALIGNMENT)
    graph_length = _aligned_size(len(flatbuffer), CONSTANT_TENSOR_ALIGNMENT)
    header = XNNHeader(flatbuffer_offset=header_length, flatbuffer_size=len(flatbuffer),
                       constant_data_offset=header_length + graph_length,
                       constant_data_size=len(p.constants)).to_bytes()
    return _pad_to(header, header_length) + _pad_to(flatbuffer, graph_length) + p.constants


def _with_header_field(payload: bytes, name: str, value: int) -> bytes:
    offset, fmt = L.HEADER_FIELDS[name]
    out = bytearray(payload)
    struct.pack_into("<" + fmt, out, offset, value)
    return bytes(out)


def _rewrite(pte_bytes: bytes, edit: Callable) -> bytes:
    """A copy of the program after edit(pte, payloads) changed it; payloads: the inline data of its first XNNPACK
    delegate, as a one-element list to assign."""
    from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary

    pte = deserialize_pte_binary(pte_bytes)
    plan = pte.program.execution_plan[0]
    delegate = next(d for d in plan.delegates if d.id == "XnnpackBackend")
    entry = pte.program.backend_delegate_data[delegate.processed.index]
    payloads = [bytes(entry.data)]
    edit(pte, payloads)
    entry.data = payloads[0]
    return bytes(serialize_pte_binary(pte, extract_delegate_segments=True))


def _tensors(graph: dict) -> list[tuple[int, dict, dict | None]]:
    """(value index, XNNTensorValue, XNNQuantizedTensorValue or None) of each tensor value."""
    found = []
    for i, value in enumerate(graph["xvalues"]):
        if value["xvalue_union_type"] == "XNNTensorValue":
            found.append((i, value["xvalue_union"], None))
        elif value["xvalue_union_type"] == "XNNQuantizedTensorValue":
            found.append((i, value["xvalue_union"]["tensor_value"], value["xvalue_union"]))
    return found


def _graph_mutant(pte_bytes: bytes, name: str, expect: str, edit: Callable[[Payload], None]) -> Mutant:
    def change(pte, payloads):
        p = split(payloads[0])
        edit(p)
        payloads[0] = join(p)
    return Mutant(name, expect, _rewrite(pte_bytes, change))


def _node_ids(node: dict) -> tuple[list[str], list[str]]:
    """The names of the value-id fields a node's table reads and writes (by the schema's naming: `*_id`)."""
    ids = [k for k in node["xnode_union"] if k.endswith("_id")]
    return [k for k in ids if not k.startswith("output")], [k for k in ids if k.startswith("output")]


def _first_node_tag_patch(flatbuffer: bytearray) -> None:
    """Sets the first node's union tag one past XNodeUnion's last member, read with flatbuffers' own table API."""
    from flatbuffers import encode, number_types
    from flatbuffers.table import Table

    def slot(index):
        return 4 + 2 * index

    graph = Table(flatbuffer, encode.Get(number_types.UOffsetTFlags.packer_type, flatbuffer, 0))
    nodes = graph.Vector(graph.Offset(slot(L.SLOTS["XNNGraph"]["xnodes"])))
    node = Table(flatbuffer, graph.Indirect(nodes))
    flatbuffer[node.Pos + node.Offset(slot(L.SLOTS["XNode"]["xnode_union_type"]))] = len(L.NODE_KINDS) + 1


def _node_mutants(pte_bytes: bytes) -> list[Mutant]:
    """The node fields XNNPACK's compiler and subgraph optimizer trust: kinds, tables, and which values each node reads
    and writes (the first is the shape of a libFuzzer finding that crashed XNNPACK's optimizer)."""
    def edit_first_delegate(change):
        def edit(p):
            nodes, values = p.graph["xnodes"], [t for _, t, _ in _tensors(p.graph)]
            assert len(nodes) >= 2, "the node mutants need a delegate with two nodes"
            change(nodes, values)
        return edit

    def writes_its_input(nodes, values):
        node = next(n for n in nodes if any(v["id_out"] == n["xnode_union"][_node_ids(n)[0][0]] and v["flags"] & 1
                                            for v in values))
        inputs, outputs = _node_ids(node)
        node["xnode_union"][outputs[0]] = node["xnode_union"][inputs[0]]

    def reads_undefined(nodes, values):
        nodes[0]["xnode_union"][_node_ids(nodes[0])[0][0]] = max(v["id_out"] for v in values) + 1

    def reads_before_written(nodes, values):
        nodes[0]["xnode_union"][_node_ids(nodes[0])[0][0]] = nodes[-1]["xnode_union"][_node_ids(nodes[-1])[1][0]]

    def written_twice(nodes, values):
        nodes[-1]["xnode_union"][_node_ids(nodes[-1])[1][0]] = nodes[0]["xnode_union"][_node_ids(nodes[0])[1][0]]

    def id_out_shared(nodes, values):
        values[1]["id_out"] = values[0]["id_out"]

    def no_table(nodes, values):
        del nodes[0]["xnode_union"]

    def unknown_kind(pte, payloads):
        payloads[0] = join(split(payloads[0]), patch=_first_node_tag_patch)

    edits = [
        ("a node writing the external input it reads", "an external input", writes_its_input),
        ("a node reading a value id no value has", "which no value defines", reads_undefined),
        ("a node reading a value before any node writes it", "before any node writes it", reads_before_written),
        ("two nodes writing one value", "wrote already", written_twice),
        ("two values with one id_out", "id_out", id_out_shared),
        ("a node without its table", "has no table of fields", no_table),
    ]
    return [_graph_mutant(pte_bytes, name, expect, edit_first_delegate(change)) for name, expect, change in edits] + [
        Mutant("a node of a kind XNNPACK does not know", "not one XNNPACK knows", _rewrite(pte_bytes, unknown_kind))]


def _header_mutant(pte_bytes: bytes, name: str, expect: str, field: str, value: Callable[[bytes], int]) -> Mutant:
    def change(pte, payloads):
        payloads[0] = _with_header_field(payloads[0], field, value(payloads[0]))
    return Mutant(name, expect, _rewrite(pte_bytes, change))


def _header(payload: bytes, name: str) -> int:
    offset, fmt = L.HEADER_FIELDS[name]
    return struct.unpack_from("<" + fmt, payload, offset)[0]


def _first(graph: dict, predicate) -> tuple[int, dict, dict | None]:
    return next(t for t in _tensors(graph) if predicate(*t))


def _constant(i, tensor, quantized):
    return tensor["constant_buffer_idx"] != 0


def _external(i, tensor, quantized):
    return tensor["flags"] & L.EXTERNAL_FLAGS


def _inline_first_constant(pte, p: Payload) -> int:
    """Moves the first named constant's bytes into the payload's own constant region (the layout XNNPACK's serializer
    used before named data): a valid program whose constant offsets are then in play. Returns its index."""
    index, constant = next((i, c) for i, c in enumerate(p.graph["constant_data"]) if c.get("named_key"))
    store = pte.named_data
    data = bytes(store.buffers[store.pte_data[constant["named_key"]].buffer_index])
    pad = (-len(p.constants)) % 64
    constant.update(offset=len(p.constants) + pad, size=len(data))
    del constant["named_key"]
    p.constants = p.constants + bytes(pad) + data
    return index


def mutants(pte_bytes: bytes, quantized: bool) -> list[Mutant]:
    """The targeted mutants of a delegated program (the float32 decoder; quantized: the 8-bit one, whose quantized
    weights add the quantization fields)."""
    out = [
        _header_mutant(pte_bytes, "header_length too small", "header says it is 10 bytes long",
                       "header_length", lambda _: 10),
        _header_mutant(pte_bytes, "flatbuffer_offset past the payload", "places the XNNPACK graph",
                       "flatbuffer_offset", len),
        _header_mutant(pte_bytes, "flatbuffer_size zero", "flatbuffer of 0 bytes", "flatbuffer_size", lambda _: 0),
        _header_mutant(pte_bytes, "flatbuffer_size one past the payload", "places the XNNPACK graph",
                       "flatbuffer_size", lambda b: len(b) - _header(b, "flatbuffer_offset") + 1),
        _header_mutant(pte_bytes, "constant_data_offset inside the graph", "inside the graph",
                       "constant_data_offset", lambda b: _header(b, "flatbuffer_offset") + 8),
        _header_mutant(pte_bytes, "constant_data_offset past the payload", "places the constant data",
                       "constant_data_offset", lambda _: 2**32 - 1),
        _header_mutant(pte_bytes, "constant_data_size one past the payload", "places the constant data",
                       "constant_data_size", lambda b: len(b) - _header(b, "constant_data_offset") + 1),
    ]

    def tensor_edit(predicate, change):
        def edit(p):
            change(p, *_first(p.graph, predicate))
        return edit

    graph_edits = [
        ("num_dims one more than dims", "num_dims is",
         tensor_edit(_constant, lambda p, i, t, q: t.update(num_dims=len(t["dims"]) + 1))),
        ("num_dims zero", "num_dims is 0", tensor_edit(_constant, lambda p, i, t, q: t.update(num_dims=0))),
        ("seven dims", "more than XNNPACK's 6",
         tensor_edit(_constant, lambda p, i, t, q: t.update(dims=[1] * 7, num_dims=7))),
        ("a weight dim 8193 times larger", "constant data holds",
         tensor_edit(_constant, lambda p, i, t, q: t["dims"].__setitem__(-1, t["dims"][-1] * 8193))),
        ("dims whose product overflows", "too many elements",
         tensor_edit(_constant, lambda p, i, t, q: t.update(dims=[2**32 - 1] * 4, num_dims=4))),
        ("datatype invalid", "datatype 0", tensor_edit(_constant, lambda p, i, t, q: t.update(datatype="xnn_datatype_invalid"))),
        ("constant_buffer_idx one past the constants", "constant_buffer_idx",
         tensor_edit(_constant, lambda p, i, t, q: t.update(constant_buffer_idx=len(p.graph["constant_data"])))),
        ("constant named_key the program lacks", "does not hold",
         lambda p: next(c for c in p.graph["constant_data"] if c.get("named_key")).update(named_key="no such key")),
        ("flags with a bit XNNPACK does not allow", "flags 0x4",
         tensor_edit(_constant, lambda p, i, t, q: t.update(flags=4))),
        ("external_id equal to num_externs", "external_id",
         tensor_edit(_external, lambda p, i, t, q: t.update(external_id=p.graph["num_externs"]))),
        ("num_externs past XNNPACK's limit", "more than XNNPACK's 4096",
         lambda p: p.graph.update(num_externs=L.MAX_EXTERNS + 1)),
        ("num_externs one past the delegate call's arguments", "calls the delegate with",
         lambda p: p.graph.update(num_externs=p.graph["num_externs"] + 1)),
        ("input_ids naming a value past the last", "input_ids names value",
         lambda p: p.graph["input_ids"].__setitem__(0, len(p.graph["xvalues"]))),
        ("output_ids naming a value past the last", "output_ids names value",
         lambda p: p.graph["output_ids"].__setitem__(0, len(p.graph["xvalues"]) + 7)),
    ]
    if quantized:
        def per_channel(p):
            return _first(p.graph, lambda i, t, q: q is not None and q["quant_params_type"] == "PerChannelQuant")

        def per_token(p):
            return _first(p.graph, lambda i, t, q: q is not None and q["quant_params_type"] == "PerTokenDynamicQuant")

        def scale_buffer_past_end(p):
            params = per_channel(p)[2]["quant_params"]
            params.update(scale_buffer_idx=len(p.graph["constant_data"]))

        def fewer_scales(p):
            i, t, q = per_channel(p)
            params = q["quant_params"]
            if params.get("scale_buffer_idx"):
                params.update(scale_buffer_idx=0)  # scales then come from the vector, which holds one too few
            params["scale"] = [1.0] * (t["dims"][params["channel_dim"]] - 1)

        def group_size_zero(p):
            i, t, q = per_channel(p)
            t["datatype"] = "xnn_datatype_qbint4"
            q["quant_params_type"] = "PerChannelGroupQuant"
            q["quant_params"] = {"scale": [1.0], "channel_dim": 0, "group_size": 0}

        graph_edits += [
            ("channel_dim equal to the rank", "channel_dim",
             lambda p: per_channel(p)[2]["quant_params"].update(channel_dim=len(per_channel(p)[1]["dims"]))),
            ("channel_dim negative", "channel_dim -1", lambda p: per_channel(p)[2]["quant_params"].update(channel_dim=-1)),
            ("scale_buffer_idx one past the constants", "scale_buffer_idx", scale_buffer_past_end),
            ("one scale fewer than channels", "scales for", fewer_scales),
            ("group_size zero", "group_size 0", group_size_zero),
            ("num_nonbatch_dims past the rank", "num_nonbatch_dims",
             lambda p: per_token(p)[2]["quant_params"].update(num_nonbatch_dims=len(per_token(p)[1]["dims"]) + 1)),
        ]
    out += [_graph_mutant(pte_bytes, name, expect, edit) for name, expect, edit in graph_edits]
    out += _node_mutants(pte_bytes)

    # Constants held in the payload's own constant region (what an older serializer writes): offsets in play.
    def inline_edit(change):
        def edit(pte, payloads):
            p = split(payloads[0])
            index = _inline_first_constant(pte, p)
            change(p, p.graph["constant_data"][index], len(p.constants))
            payloads[0] = join(p)
        return edit

    out += [
        Mutant("constant offset one past the constant region", "lies outside the payload's constant region",
               _rewrite(pte_bytes, inline_edit(lambda p, c, region: c.update(offset=region - c["size"] + 1)))),
        Mutant("constant size one past the constant region", "lies outside the payload's constant region",
               _rewrite(pte_bytes, inline_edit(lambda p, c, region: c.update(size=region - c["offset"] + 1)))),
    ]
    return out


def inline_constants_program(pte_bytes: bytes) -> bytes:
    """The valid program with its first constant moved into the payload's constant region (the control: it must
    run and equal the original)."""
    def edit(pte, payloads):
        p = split(payloads[0])
        _inline_first_constant(pte, p)
        payloads[0] = join(p)
    return _rewrite(pte_bytes, edit)



