"""The one description of the bytes the delegate checks read: ExecuTorch's XNNPACK payload header, the FlatBuffers
field slots of the XNNPACK graph, of the .pte's Program and of a named data file (.ptd, whose header is here too), and
the limits XNNPACK's compiler relies on. The Python
checker (flow/xnnpack_payload.py) reads it directly; the runner's checker (runner/xnnpack_payload.cpp) includes
runner/xnnpack_layout.h, which is generated from this table:

    python -m flow.xnnpack_layout > runner/xnnpack_layout.h

and tests/test_xnnpack_payload.py fails when the checked-in header differs from what this prints.

Sources: the header is XNNHeader in executorch/backends/xnnpack/serialization/xnnpack_graph_serialize.py (30 bytes);
slots count the fields of backends/xnnpack/serialization/runtime_schema.fbs and schema/program.fbs in order, a union
taking two slots (its type, then its value).
"""

from __future__ import annotations

# XNNHeader: (byte offset, struct format) of each field.
HEADER_SIZE = 30
HEADER_MAGIC = b"XH00"
HEADER_FIELDS = {
    "magic": (4, "4s"),
    "header_length": (8, "H"),
    "flatbuffer_offset": (10, "I"),
    "flatbuffer_size": (14, "I"),
    "constant_data_offset": (18, "I"),
    "constant_data_size": (22, "Q"),
}

IDENTIFIERS = (b"XN00", b"XN01")  # the graph flatbuffer identifiers XNNPACK's runtime accepts (XNNCompiler.cpp)

SLOTS = {
    "XNNGraph": {"xnodes": 1, "xvalues": 2, "num_externs": 3, "input_ids": 4, "output_ids": 5, "constant_data": 8},
    "XValue": {"xvalue_union_type": 0, "xvalue_union": 1},
    "XNode": {"xnode_union_type": 0, "xnode_union": 1},
    "XNNTensorValue": {"datatype": 0, "num_dims": 1, "dims": 2, "constant_buffer_idx": 3, "external_id": 4,
                       "flags": 5, "id_out": 6},
    "XNNQuantizedTensorValue": {"tensor_value": 0, "quant_params_type": 1, "quant_params": 2},
    "PerChannelQuant": {"scale": 0, "channel_dim": 1, "scale_buffer_idx": 2, "num_scales": 3},
    "PerTokenDynamicQuant": {"num_nonbatch_dims": 0},
    "PerChannelGroupQuant": {"scale": 0, "channel_dim": 1, "group_size": 2, "scale_buffer_idx": 4, "num_scales": 5},
    "ConstantDataOffset": {"offset": 0, "size": 1, "named_key": 2},
    "Program": {"execution_plan": 1, "backend_delegate_data": 3, "segments": 4, "named_data": 7},
    "ExecutionPlan": {"values": 2, "inputs": 3, "chains": 5, "operators": 6, "delegates": 7},
    "Operator": {"name": 0, "overload": 1},
    "EValue": {"val_type": 0, "val": 1},
    "Tensor": {"scalar_type": 0, "data_buffer_idx": 5, "extra_tensor_info": 9},
    "ExtraTensorInfo": {"location": 2},
    "ListItems": {"items": 0},  # IntList (int64 items), TensorList and OptionalTensorList (int32 items)
    "Chain": {"instructions": 2},
    "Instruction": {"instr_args_type": 0, "instr_args": 1},
    "KernelCall": {"op_index": 0, "args": 1},
    "DelegateCall": {"delegate_index": 0, "args": 1},
    "BackendDelegate": {"id": 0, "processed": 1, "compile_specs": 2},
    "BackendDataReference": {"location": 0, "index": 1},
    "BackendDelegateInlineData": {"data": 0},
    "DataSegment": {"offset": 0, "size": 1},
    "NamedData": {"key": 0, "segment_index": 1},
    "CompileSpec": {"key": 0, "value": 1},
    # A named data file (.ptd): extension/flat_tensor/serialize/flat_tensor.fbs (its DataSegment: DataSegment's slots)
    "FlatTensor": {"version": 0, "segments": 1, "named_data": 2},
    "FlatTensorNamedData": {"key": 0, "segment_index": 1, "tensor_layout": 2},
    "TensorLayout": {"scalar_type": 0, "sizes": 1, "dim_order": 2},
}

# A named data file's header (FlatTensorHeader, extension/flat_tensor/serialize/flat_tensor_header.h): it follows the
# flatbuffer's root offset and identifier; the flatbuffer spans the file's first flatbuffer_offset + flatbuffer_size
# bytes, the segments follow at segment_base_offset.
PTD_IDENTIFIER = b"FT01"
PTD_HEADER_MAGIC = b"FH01"
PTD_HEADER_FIELDS = {
    "magic": (8, "4s"),
    "header_length": (12, "I"),
    "flatbuffer_offset": (16, "Q"),
    "flatbuffer_size": (24, "Q"),
    "segment_base_offset": (32, "Q"),
    "segment_data_size": (40, "Q"),
}
PTD_HEADER_LENGTH = 40
PTD_MAX_SCHEMA_VERSION = 0  # FlatTensorDataMap::kMaxSupportedSchemaVersion

# Union member tags (0 is NONE).
XVALUE_TENSOR, XVALUE_QUANTIZED = 1, 2
QUANT_PER_CHANNEL, QUANT_PER_TENSOR, QUANT_PER_TOKEN_DYNAMIC, QUANT_PER_CHANNEL_GROUP = 1, 2, 3, 4
INSTRUCTION_KERNEL_CALL, INSTRUCTION_DELEGATE_CALL = 1, 2
# program.fbs KernelTypes, the EValue union: each member's tag, by the name flow/program.py uses for its kind.
KERNEL_TYPES = ("Null", "Int", "Bool", "Double", "Tensor", "String", "IntList", "DoubleList", "BoolList", "TensorList",
                "OptionalTensorList")
DATA_INLINE, DATA_SEGMENT = 0, 1
TENSOR_DATA_EXTERNAL = 1  # TensorDataLocation: a tensor's bytes outside the .pte (a constant, named data)

# Each node table's value ids: the slots XNNPACK's compiler reads as inputs and as outputs, and the vectors XNNPACK
# reads one entry per dim of the input from (a shorter one is read past its end). An id of NO_VALUE is "none"
# (XNNPACK's compiler maps it to itself and its node definitions refuse it where an id is required).
NODE_SHAPES = {
    "1x1": {"inputs": (0,), "outputs": (1,)},  # _XNNNode1x1: input_id, output_id
    "1x1+1": {"inputs": (1,), "outputs": (2,)},  # "+k": k other fields come first (ELU's alpha, ...)
    "1x1+2": {"inputs": (2,), "outputs": (3,)},
    "1x1+3": {"inputs": (3,), "outputs": (4,)},
    "1x1+10": {"inputs": (10,), "outputs": (11,)},  # _XNNPooling2D
    "2x1": {"inputs": (0, 1), "outputs": (2,)},  # _XNNNode2x1
    "FullyConnected": {"inputs": (0, 1, 2), "outputs": (3,)},  # input1, filter, bias
    "Conv": {"inputs": (15, 16, 17), "outputs": (18,)},  # _XNNNodeConv: input1, filter, bias after 15 geometry fields
    "ArgMaxPooling2d": {"inputs": (6,), "outputs": (7, 8)},  # output_value_id, output_index_id
    "Cat2": {"inputs": (1, 2), "outputs": (5,)},  # _XNNCat: input5_id comes after flags
    "Cat3": {"inputs": (1, 2, 3), "outputs": (5,)},
    "Cat4": {"inputs": (1, 2, 3, 4), "outputs": (5,)},
    "Cat5": {"inputs": (1, 2, 3, 4, 7), "outputs": (5,)},
    "ConstantPad": {"inputs": (3,), "outputs": (4,), "per_input_dim": (0, 1)},  # pre_paddings, post_paddings
    "Attention": {"inputs": (0, 1, 2, 3, 4), "outputs": (5,)},  # query, key, value, scale, mask
}
# XNodeUnion's members in runtime_schema.fbs order: the union tag is the position + 1 (0 is NONE).
NODE_KINDS = (
    ("XNNAdd", "2x1"), ("XNNFullyConnected", "FullyConnected"), ("XNNSoftmax", "1x1"), ("XNNSigmoid", "1x1"),
    ("XNNStaticTranspose", "1x1+2"), ("XNNClamp", "1x1"), ("XNNConv2d", "Conv"), ("XNNDiv", "2x1"),
    ("XNNStaticResizeBilinear2D", "1x1+2"), ("XNNStaticConstantPad", "ConstantPad"),
    ("XNNAvgPooling2d", "1x1+10"), ("XNNMinimum", "2x1"), ("XNNDepthwiseConv2d", "Conv"),
    ("XNNMaxPooling2d", "1x1+10"), ("XNNMultiply", "2x1"), ("XNNSubtract", "2x1"), ("XNNFloor", "1x1"),
    ("XNNConvert", "1x1"), ("XNNGlobalAvgPooling2d", "1x1"), ("XNNStaticReshape", "1x1+2"),
    ("XNNArgMaxPooling2d", "ArgMaxPooling2d"), ("XNNSquareRoot", "1x1"), ("XNNCeiling", "1x1"),
    ("XNNHardswish", "1x1"), ("XNNLeakyReLU", "1x1+1"), ("XNNMaximum", "2x1"), ("XNNNegate", "1x1"),
    ("XNNSquare", "1x1"), ("XNNELU", "1x1+1"), ("XNNAbs", "1x1"), ("XNNPReLU", "2x1"),
    ("XNNConcatenate2", "Cat2"), ("XNNConcatenate3", "Cat3"), ("XNNConcatenate4", "Cat4"), ("XNNStaticSlice", "1x1+3"),
    ("XNNScaledDotProductAttention", "Attention"), ("XNNBatchMatrixMultiply", "2x1"), ("XNNConcatenate5", "Cat5"),
    ("XNNConvTranspose2d", "Conv"), ("XNNReciprocalSquareRoot", "1x1"), ("XNNLog", "1x1"), ("XNNGelu", "1x1"),
    ("XNNTanh", "1x1"), ("XNNExp", "1x1"), ("XNNSin", "1x1"), ("XNNCopy", "1x1"), ("XNNCos", "1x1"),
)
NO_VALUE = 0xFFFFFFFF  # XNN_INVALID_VALUE_ID
EXTERNAL_INPUT = 0x1  # XNN_VALUE_FLAG_EXTERNAL_INPUT

# XNNDatatype -> bits per element (runtime_schema.fbs). 0 is invalid; 11 (qpint8) and 13 (pfp32) are packed layouts
# with no size per element, so a constant of them cannot be checked and is refused.
MAX_DATATYPE = 14
ELEMENT_BITS = {1: 32, 2: 16, 3: 8, 4: 8, 5: 32, 6: 8, 7: 32, 8: 4, 9: 8, 10: 4, 12: 32, 14: 16}
SCALE_BITS = 32  # PerChannelQuant scales are float32
GROUP_SCALE_BITS = 16  # PerChannelGroupQuant scales held as constant data are bf16 (XNNCompiler.cpp)

MAX_DIMS = 6  # XNN_MAX_TENSOR_DIMS
MAX_EXTERNS = 4096  # XNNCompiler.cpp refuses more
EXTERNAL_FLAGS = 0x3  # XNN_VALUE_FLAG_EXTERNAL_INPUT | XNN_VALUE_FLAG_EXTERNAL_OUTPUT: the only flags allowed
MAX_ELEMENTS = 2**48  # far past any real tensor, and small enough that bytes cannot overflow 64 bits


def _cpp_name(name: str) -> str:
    return "k" + "".join(part.capitalize() for part in name.split("_"))


def cpp_header() -> str:
    """runner/xnnpack_layout.h: this table as C++ constants."""
    lines = ["// Generated by `python -m flow.xnnpack_layout` from flow/xnnpack_layout.py, the one description of the",
             "// XNNPACK payload and Program fields the delegate checks read. Edit the table there, not this file.",
             "#pragma once", "", "#include <cstddef>", "#include <cstdint>", "",
             "namespace custom_ops_runner::xnnpack_layout {", "",
             f"constexpr size_t kHeaderSize = {HEADER_SIZE};",
             f'constexpr char kHeaderMagic[] = "{HEADER_MAGIC.decode()}";']
    for name, (offset, _) in HEADER_FIELDS.items():
        lines.append(f"constexpr size_t k{_cpp_name(name)[1:]}At = {offset};")
    lines.append("constexpr const char* kIdentifiers[] = {" + ", ".join(f'"{i.decode()}"' for i in IDENTIFIERS) + "};")
    lines += ["// A named data file's (.ptd) identifier and header.",
              f'constexpr char kPtdIdentifier[] = "{PTD_IDENTIFIER.decode()}";',
              f'constexpr char kPtdHeaderMagic[] = "{PTD_HEADER_MAGIC.decode()}";']
    for name, (offset, _) in PTD_HEADER_FIELDS.items():
        lines.append(f"constexpr size_t kPtd{_cpp_name(name)[1:]}At = {offset};")
    lines += [f"constexpr uint32_t kPtdHeaderLength = {PTD_HEADER_LENGTH};",
              f"constexpr uint32_t kPtdMaxSchemaVersion = {PTD_MAX_SCHEMA_VERSION};"]
    lines.append("")
    for table, slots in SLOTS.items():
        lines.append(f"namespace {table} {{")
        lines += [f"constexpr int {_cpp_name(field)} = {slot};" for field, slot in slots.items()]
        lines.append(f"}} // namespace {table}")
    lines += ["", f"constexpr uint8_t kXValueTensor = {XVALUE_TENSOR}, kXValueQuantized = {XVALUE_QUANTIZED};",
              f"constexpr uint8_t kQuantPerChannel = {QUANT_PER_CHANNEL}, kQuantPerTensor = {QUANT_PER_TENSOR},",
              f"    kQuantPerTokenDynamic = {QUANT_PER_TOKEN_DYNAMIC}, kQuantPerChannelGroup = {QUANT_PER_CHANNEL_GROUP};",
              f"constexpr uint8_t kInstructionKernelCall = {INSTRUCTION_KERNEL_CALL}, "
              f"kInstructionDelegateCall = {INSTRUCTION_DELEGATE_CALL};",
              "// KernelTypes (the EValue union) by tag - 1.",
              "constexpr const char* kKernelTypes[] = {" + ", ".join(f'"{k}"' for k in KERNEL_TYPES) + "};",
              f"constexpr int8_t kDataInline = {DATA_INLINE}, kDataSegment = {DATA_SEGMENT};",
              f"constexpr int8_t kTensorDataExternal = {TENSOR_DATA_EXTERNAL};", "",
              "// Bits per element of an XNNDatatype; 0: none (invalid or unknown).",
              "constexpr unsigned element_bits(int datatype) {",
              "  switch (datatype) {"]
    for datatype, bits in ELEMENT_BITS.items():
        lines.append(f"    case {datatype}: return {bits};")
    lines += ["    default: return 0;", "  }", "}",
              f"constexpr int kMaxDatatype = {MAX_DATATYPE};",
              f"constexpr unsigned kScaleBits = {SCALE_BITS}, kGroupScaleBits = {GROUP_SCALE_BITS};",
              f"constexpr uint32_t kMaxDims = {MAX_DIMS}, kMaxExterns = {MAX_EXTERNS};",
              f"constexpr uint32_t kExternalFlags = {EXTERNAL_FLAGS:#x};",
              f"constexpr uint64_t kMaxElements = uint64_t{{1}} << {MAX_ELEMENTS.bit_length() - 1};",
              f"constexpr uint32_t kNoValue = {NO_VALUE:#x}, kExternalInput = {EXTERNAL_INPUT:#x};", "",
              "// XNodeUnion's members by tag - 1: the slots of the value ids each reads and writes, and of the vectors",
              "// read one entry per dim of its input.",
              "struct NodeLayout {",
              "  const char* name;",
              "  uint8_t num_inputs, inputs[5], num_outputs, outputs[2], num_per_input_dim, per_input_dim[2];",
              "};",
              "constexpr NodeLayout kNodeKinds[] = {"]
    for name, shape in NODE_KINDS:
        fields = NODE_SHAPES[shape]
        slots = [fields.get(key, ()) for key in ("inputs", "outputs", "per_input_dim")]
        lines.append(f'    {{"{name}", ' + ", ".join(f"{len(s)}, {{{', '.join(map(str, s))}}}" for s in slots) + "},")
    lines += ["};", "",
              "} // namespace custom_ops_runner::xnnpack_layout", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(cpp_header(), end="")
