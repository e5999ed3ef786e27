"""The XNNPACK payload checks (flow/xnnpack_payload.py for the Python runtime, runner/xnnpack_payload.cpp for the
runner) read the layout ExecuTorch's own writer produces: payloads serialized by the wheel's XNNHeader and
serialize_xnnpack_binary, field by field, in both checkers; the C++ layout header is the Python table's output; and
each field they rely on, set to a hostile value in the float32 and the 8-bit decoder (tests/xnnpack_mutants.py), is
one error naming that field in the runner and in the Python runtime's checked loader, never a signal or a hang."""

import functools
import os
import subprocess

import pytest

from flow import xnnpack_layout as L
from flow import xnnpack_payload
from helpers import REPO_ROOT, outcome, run_in_fresh_python, run_runner
import xnnpack_mutants


@pytest.fixture(scope="module")
def cpp_checker(tmp_path_factory) -> str:
    """tests/cpp/xnnpack_payload_fields.cpp on the runner's own checker source."""
    path = str(tmp_path_factory.mktemp("cpp") / "xnnpack_payload_fields")
    subprocess.run(["c++", "-std=c++17", "-O1", "-I", os.path.join(REPO_ROOT, "runner"),
                    os.path.join(REPO_ROOT, "tests", "cpp", "xnnpack_payload_fields.cpp"),
                    os.path.join(REPO_ROOT, "runner", "xnnpack_payload.cpp"), "-o", path], check=True)
    return path


def cpp(tool: str, verb: str, payload: bytes, tmp_path) -> list[str]:
    path = tmp_path / "payload.bin"
    path.write_bytes(payload)
    return subprocess.run([tool, verb, str(path)], capture_output=True, text=True, check=True).stdout.splitlines()


def test_the_runners_layout_header_is_the_tables_output():
    with open(os.path.join(REPO_ROOT, "runner", "xnnpack_layout.h")) as f:
        assert f.read() == L.cpp_header(), "regenerate it: python -m flow.xnnpack_layout > runner/xnnpack_layout.h"


def test_the_header_fields_are_read_where_the_wheels_XNNHeader_writes_them():
    from executorch.backends.xnnpack.serialization.xnnpack_graph_serialize import XNNHeader

    written = XNNHeader(flatbuffer_offset=0x11223344, flatbuffer_size=0x0A0B0C0D, constant_data_offset=0x55667788,
                        constant_data_size=0x0102030405060708)
    data = written.to_bytes()
    assert len(data) == L.HEADER_SIZE == XNNHeader.EXPECTED_LENGTH
    assert xnnpack_payload.read_header(data) == {
        "header_length": XNNHeader.EXPECTED_LENGTH, "flatbuffer_offset": 0x11223344, "flatbuffer_size": 0x0A0B0C0D,
        "constant_data_offset": 0x55667788, "constant_data_size": 0x0102030405060708}


def serialized_graph():
    """A graph with every kind of value the checks read, each field a distinct value, and its constant bytes; written
    by ExecuTorch's serializer. Returns (payload, the dataclass graph, the constant bytes)."""
    from executorch.backends.xnnpack.serialization import xnnpack_graph_schema as S
    from executorch.backends.xnnpack.serialization.xnnpack_graph_serialize import serialize_xnnpack_binary

    def tensor(datatype, dims, constant, external_id, flags, id_out):
        return S.XNNTensorValue(datatype=datatype, num_dims=len(dims), dims=dims, constant_buffer_idx=constant,
                                external_id=external_id, flags=flags, id_out=id_out)

    D = S.XNNDatatype
    values = [
        S.XValue(tensor(D.xnn_datatype_fp32, [2, 3], 0, 0, 1, 0)),  # external input
        S.XValue(tensor(D.xnn_datatype_fp32, [4, 3], 1, 7, 0, 1)),  # constant weight
        S.XValue(S.XNNQuantizedTensorValue(tensor(D.xnn_datatype_qcint8, [5, 3], 2, 9, 0, 2),
                                           S.PerChannelQuant(scale=[0.5] * 5, channel_dim=0, scale_buffer_idx=0,
                                                             num_scales=0))),
        S.XValue(S.XNNQuantizedTensorValue(tensor(D.xnn_datatype_qcint8, [6, 2], 3, 9, 0, 3),
                                           S.PerChannelQuant(scale=[], channel_dim=1, scale_buffer_idx=4,
                                                             num_scales=2))),
        S.XValue(S.XNNQuantizedTensorValue(tensor(D.xnn_datatype_qbint4, [4, 8], 5, 9, 0, 4),
                                           S.PerChannelGroupQuant(scale=[], channel_dim=0, group_size=4,
                                                                  scale_buffer_idx=6, num_scales=8))),
        S.XValue(S.XNNQuantizedTensorValue(tensor(D.xnn_datatype_qdint8, [2, 3], 0, 1, 1, 5),
                                           S.PerTokenDynamicQuant(num_nonbatch_dims=1))),
        S.XValue(S.XNNQuantizedTensorValue(tensor(D.xnn_datatype_qint8, [3], 0, 9, 0, 6),
                                           S.PerTensorQuant(scale=0.25, zero_point=-3))),
        S.XValue(tensor(D.xnn_datatype_fp32, [2, 4], 0, 2, 2, 7)),  # external output
    ]
    # Constants 1-5 in the payload's own region (no key: the serializer leaves a None key out), 6 in named data.
    inline = [(0, 0), (0, 48), (64, 15), (80, 12), (96, 8), (112, 16)]
    constant_data = [S.ConstantDataOffset(offset=o, size=n, named_key=None) for o, n in inline]
    constant_data.append(S.ConstantDataOffset(offset=128, size=16, named_key="held_by_the_program"))
    no_bias = 0xFFFFFFFF  # XNN_INVALID_VALUE_ID: value 6 is neither an input nor a constant, so no node may read it
    graph = S.XNNGraph(version="0", xnodes=[S.XNode(S.XNNFullyConnected(0, 1, no_bias, 7, 0), 0)],
                       xvalues=values, num_externs=3, input_ids=[0, 5], output_ids=[7],
                       constant_data=constant_data)
    constants = bytes(range(144))
    return serialize_xnnpack_binary(graph, bytearray(constants)), graph, constants


@functools.cache
def union_tags() -> dict[str, int]:
    """XNodeUnion's members -> their tags, from the schema the wheel's serializer compiles with."""
    import re

    from executorch.backends.xnnpack.serialization.xnnpack_graph_serialize import _get_schema_bytes

    body = re.search(r"union XNodeUnion \{(.*?)\}", _get_schema_bytes().decode(), re.S).group(1)
    members = [line.split(":")[0].strip().rstrip(",") for line in body.splitlines() if line.strip()]
    return {name: i + 1 for i, name in enumerate(members)}


# The vectors XNNPACK reads one entry per dim of the node's input (xnn_define_static_constant_pad).
PER_INPUT_DIM = {"XNNStaticConstantPad": ("pre_paddings", "post_paddings")}


def node_line(i: int, node) -> str:
    """What the checkers must read from one node dataclass: the fields named `*_id` it reads and writes (a
    Concatenate<k> reads its first k inputs)."""
    import dataclasses

    kind = type(node).__name__
    ids = [f.name for f in dataclasses.fields(node) if f.name.endswith("_id")]
    inputs = [name for name in ids if not name.startswith("output")]
    if kind.startswith("XNNConcatenate"):
        inputs = [f"input{k}_id" for k in range(1, int(kind[-1]) + 1)]
    outputs = [name for name in ids if name.startswith("output")]
    lengths = ",".join(str(len(getattr(node, name))) for name in PER_INPUT_DIM.get(kind, ()))
    return (f"node[{i}]=kind:{union_tags()[kind]} table:1 inputs:{','.join(str(getattr(node, n)) for n in inputs)} "
            f"outputs:{','.join(str(getattr(node, n)) for n in outputs)} per_input_dim:{lengths}")


def expected_lines(graph, payload: bytes) -> list[str]:
    """What the checkers must read, from the dataclasses the serializer was given (and the header it wrote, read with
    the wheel's own XNNHeader)."""
    from executorch.backends.xnnpack.serialization import xnnpack_graph_schema as S
    from executorch.backends.xnnpack.serialization.xnnpack_graph_serialize import XNNHeader

    h = XNNHeader.from_bytes(payload[:XNNHeader.EXPECTED_LENGTH])
    lines = [f"header.header_length={XNNHeader.EXPECTED_LENGTH}", f"header.flatbuffer_offset={h.flatbuffer_offset}",
             f"header.flatbuffer_size={h.flatbuffer_size}", f"header.constant_data_offset={h.constant_data_offset}",
             f"header.constant_data_size={h.constant_data_size}", "identifier=XN01",
             f"num_externs={graph.num_externs}", f"num_nodes={len(graph.xnodes)}",
             f"input_ids={','.join(map(str, graph.input_ids))}", f"output_ids={','.join(map(str, graph.output_ids))}"]
    lines += [f"constant[{i}]={c.offset},{c.size},{'-' if c.named_key is None else c.named_key}"
              for i, c in enumerate(graph.constant_data)]
    lines += [node_line(i, node.xnode_union) for i, node in enumerate(graph.xnodes)]
    quant_kinds = {S.PerChannelQuant: 1, S.PerTensorQuant: 2, S.PerTokenDynamicQuant: 3, S.PerChannelGroupQuant: 4}
    for i, value in enumerate(graph.xvalues):
        union = value.xvalue_union
        t = union.tensor_value if isinstance(union, S.XNNQuantizedTensorValue) else union
        line = (f"value[{i}]=kind:{2 if t is not union else 1} datatype:{int(t.datatype)} num_dims:{t.num_dims} "
                f"dims:{','.join(map(str, t.dims))} constant:{t.constant_buffer_idx} external_id:{t.external_id} "
                f"flags:{t.flags} id_out:{t.id_out}")
        if t is not union:
            q = union.quant_params
            vector = getattr(q, "scale", None)
            line += (f" quant:{quant_kinds[type(q)]} channel_dim:{getattr(q, 'channel_dim', 0)} "
                     f"scales:{'-' if not isinstance(vector, list) else len(vector)} "
                     f"scale_buffer:{getattr(q, 'scale_buffer_idx', 0)} num_scales:{getattr(q, 'num_scales', 0)} "
                     f"group_size:{getattr(q, 'group_size', 0)} nonbatch_dims:{getattr(q, 'num_nonbatch_dims', 0)}")
        lines.append(line)
    return lines


def test_both_checkers_read_every_field_the_serializer_wrote(cpp_checker, tmp_path):
    payload, graph, _ = serialized_graph()
    expected = expected_lines(graph, payload)
    assert xnnpack_payload.describe(xnnpack_payload.read(payload)) == expected
    assert cpp(cpp_checker, "describe", payload, tmp_path) == expected
    # And the payload is valid by both (the named constant is not looked up without a program).
    assert xnnpack_payload.problem(payload) is None
    assert cpp(cpp_checker, "check", payload, tmp_path) == ["ok"]


def every_node_kind():
    """One node of every kind the writer's schema has, each field a distinct number (lists [2, 3, 5], floats 0.5)."""
    import dataclasses
    from typing import get_type_hints

    from executorch.backends.xnnpack.serialization import xnnpack_graph_schema as S

    nodes, number = [], 1000
    for name in union_tags():
        cls = getattr(S, name)
        fields = {}
        for field, hint in get_type_hints(cls).items():
            if field in {f.name for f in dataclasses.fields(cls)}:
                number += 1
                fields[field] = [2, 3, 5] if "List" in str(hint) else 0.5 if hint is float else number
        nodes.append(S.XNode(cls(**fields), debug_handle=len(nodes)))
    return nodes


def test_both_checkers_read_the_value_ids_of_every_node_kind_the_serializer_writes(cpp_checker, tmp_path):
    from executorch.backends.xnnpack.serialization.xnnpack_graph_serialize import serialize_xnnpack_binary

    _, graph, constants = serialized_graph()
    graph.xnodes = every_node_kind()
    assert [name for name, _ in L.NODE_KINDS] == list(union_tags()), "the table's kinds are the schema's, in order"
    payload = serialize_xnnpack_binary(graph, bytearray(constants))
    expected = [node_line(i, node.xnode_union) for i, node in enumerate(graph.xnodes)]
    assert [line for line in xnnpack_payload.describe(xnnpack_payload.read(payload)) if line.startswith("node")] == \
        expected
    assert [line for line in cpp(cpp_checker, "describe", payload, tmp_path) if line.startswith("node")] == expected


@pytest.mark.parametrize("dims, words", [(2, None), (3, "has a vector shorter than its input's 3 dims")])
def test_a_padding_vector_shorter_than_the_inputs_rank_is_refused_alike(dims, words, cpp_checker, tmp_path):
    """XNNPACK reads one padding per dim of the input, past the end of a shorter vector."""
    from executorch.backends.xnnpack.serialization import xnnpack_graph_schema as S
    from executorch.backends.xnnpack.serialization.xnnpack_graph_serialize import serialize_xnnpack_binary

    _, graph, constants = serialized_graph()
    graph.xvalues[0].xvalue_union.dims = [2] * dims
    graph.xvalues[0].xvalue_union.num_dims = dims
    graph.xnodes = [S.XNode(S.XNNStaticConstantPad(pre_paddings=[1, 1], post_paddings=[0, 0], padding_value=0.0,
                                                   input_id=0, output_id=7, flags=0), 0)]
    payload = serialize_xnnpack_binary(graph, bytearray(constants))
    message = xnnpack_payload.problem(payload)
    assert (message is None) if words is None else (words in message)
    assert cpp(cpp_checker, "check", payload, tmp_path) == [message or "ok"]


def payload_with_header(payload: bytes, **fields) -> bytes:
    """`payload` with header fields replaced at the byte ranges the wheel's XNNHeader class declares (its to_bytes
    refuses invalid values, which are the point here)."""
    from executorch.backends.xnnpack.serialization.xnnpack_graph_serialize import XNNHeader

    where = {"flatbuffer_offset": XNNHeader.FLATBUFFER_OFFSET_OFFSET, "flatbuffer_size": XNNHeader.FLATBUFFER_SIZE_OFFSET,
             "constant_data_offset": XNNHeader.CONSTANT_DATA_OFFSET_OFFSET,
             "constant_data_size": XNNHeader.CONSTANT_DATA_SIZE_OFFSET}
    out = bytearray(payload)
    for name, value in fields.items():
        span = where[name]
        out[span] = value.to_bytes(span.stop - span.start, "little")
    return bytes(out)


HEADER_CASES = {  # field values relative to the valid payload -> words of the error
    "flatbuffer past the end": (lambda h, n: {"flatbuffer_offset": n}, "places the XNNPACK graph"),
    "flatbuffer one byte too long": (lambda h, n: {"flatbuffer_size": n - h.flatbuffer_offset + 1},
                                     "places the XNNPACK graph"),
    "flatbuffer too small": (lambda h, n: {"flatbuffer_size": 7}, "flatbuffer of 7 bytes"),
    "constant data one byte too long": (lambda h, n: {"constant_data_size": n - h.constant_data_offset + 1},
                                        "places the constant data"),
    "constant data overlapping the graph": (lambda h, n: {"constant_data_offset": h.flatbuffer_offset + 4},
                                            "inside the graph"),
    "constant data before the graph": (lambda h, n: {"constant_data_offset": 0}, "inside the graph"),
}


@pytest.mark.parametrize("case", HEADER_CASES)
def test_both_checkers_refuse_each_bad_header_region_alike(case, cpp_checker, tmp_path):
    from executorch.backends.xnnpack.serialization.xnnpack_graph_serialize import XNNHeader

    payload, _, _ = serialized_graph()
    fields, words = HEADER_CASES[case]
    h = XNNHeader.from_bytes(payload[:XNNHeader.EXPECTED_LENGTH])
    bad = payload_with_header(payload, **fields(h, len(payload)))
    message = xnnpack_payload.problem(bad)
    assert message is not None and words in message
    assert cpp(cpp_checker, "check", bad, tmp_path) == [message]


def test_a_constant_inside_the_payload_is_checked_against_the_constant_region(cpp_checker, tmp_path):
    """The check the project once had wrong: with the constant-data size read at the right offset, a constant one
    byte past the region is refused, and one that ends exactly at it is not."""
    payload, graph, constants = serialized_graph()
    from executorch.backends.xnnpack.serialization.xnnpack_graph_serialize import serialize_xnnpack_binary

    graph.constant_data[5].offset = len(constants) - 16  # ends exactly at the region's end: valid
    fits = serialize_xnnpack_binary(graph, bytearray(constants))
    graph.constant_data[5].offset = len(constants) - 15
    past = serialize_xnnpack_binary(graph, bytearray(constants))
    assert xnnpack_payload.problem(fits) is None and cpp(cpp_checker, "check", fits, tmp_path) == ["ok"]
    message = xnnpack_payload.problem(past)
    assert message is not None and "lies outside the payload's constant region of 144 bytes" in message
    assert cpp(cpp_checker, "check", past, tmp_path) == [message]


# ---- targeted mutants of the real programs ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def targeted(decoder_programs, tmp_path_factory) -> list[tuple[str, str, str]]:
    """(variant / mutant name, expected words, path) for every targeted mutant of both decoders."""
    directory = tmp_path_factory.mktemp("targeted")
    found = []
    for variant, path in decoder_programs.items():
        with open(path, "rb") as f:
            data = f.read()
        for i, mutant in enumerate(xnnpack_mutants.mutants(data, quantized=variant.endswith("q8"))):
            file = directory / f"{variant}_{i:02d}.pte"
            file.write_bytes(mutant.data)
            found.append((f"{variant}: {mutant.name}", mutant.expect, str(file)))
    assert len(found) == 66, "every field's mutant of both decoders"
    return found


def test_the_8bit_decoder_has_the_quantization_fields_the_mutants_target(decoder_programs):
    with open(decoder_programs["decoder_q8"], "rb") as f:
        names = [m.name for m in xnnpack_mutants.mutants(f.read(), quantized=True)]
    assert {"channel_dim negative", "one scale fewer than channels", "num_nonbatch_dims past the rank"} <= set(names)


def test_each_targeted_mutant_is_one_error_naming_its_field_in_the_runner(targeted, combined_build):
    problems = []
    for name, words, path in targeted:
        try:
            proc = run_runner(combined_build.runner, f"--model_path={path}", "--prompt=1,2,3", "--new_tokens=2",
                              timeout=60)
        except subprocess.TimeoutExpired:
            problems.append(f"{name}: hang")
            continue
        result = outcome(proc, values_known=False)
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
        if result != "clean" or words not in errors[0]:
            problems.append(f"{name}: {result}: {proc.stderr.strip().splitlines()[-1:] if proc.stderr else ''}")
    assert problems == [], "\n".join(problems)


def test_each_targeted_mutant_is_a_program_error_naming_its_field_in_the_python_runtime(targeted, combined_build):
    code = """
import torch
import ops.update_cache.update_cache  # the kernel-call check needs the schemas of the ops the program calls
from flow.runtime import load_kernel_library, load_method_checked
load_kernel_library({kernel_lib!r})
result = []
for path in {paths!r}:
    try:
        load_method_checked(path).execute([torch.tensor([[1, 2, 3]]), torch.tensor([0])])
        result.append("loaded and ran")
    except Exception as err:
        result.append(type(err).__name__ + ": " + str(err))
""".format(kernel_lib=combined_build.kernel_lib, paths=[path for _, _, path in targeted])
    results = run_in_fresh_python(code, timeout=600)
    problems = [f"{name}: {result}" for (name, words, _), result in zip(targeted, results)
                if not (result.startswith("ProgramError") and words in result)]
    assert problems == [], "\n".join(problems)


def test_constants_moved_into_the_payload_still_decode_alike(decoder_programs, combined_build, tmp_path):
    """The control for the constant-region mutants: the same move with offsets left right is a valid program, which
    both checkers accept and which decodes the same tokens as the original."""
    from models import decoding, example_decoder
    from flow.program import check

    with open(decoder_programs["decoder"], "rb") as f:
        moved = tmp_path / "inline_constant.pte"
        moved.write_bytes(xnnpack_mutants.inline_constants_program(f.read()))
    check(str(moved))
    prompt = example_decoder.model_module().PROMPT
    original = decoding.decode_runner(combined_build.runner, decoder_programs["decoder"], prompt, 6)
    assert decoding.decode_runner(combined_build.runner, str(moved), prompt, 6).tokens == original.tokens
