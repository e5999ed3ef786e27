// The delegate checks of the runner (xnnpack_payload.h): a bounds-checked walk over FlatBuffers tables, from the
// .pte's Program to each delegate entry and XNNPACK payload, and from its graph to every field XNNPACK's compiler
// trusts, through flat_reader.h (the wheel ships neither the schemas' headers nor flatbuffers'). Field slots and
// limits come from xnnpack_layout.h; the checks and their messages are those of flow/xnnpack_payload.py.
#include "xnnpack_payload.h"

#include <cinttypes>
#include <cstring>

#include "flat_reader.h"
#include "xnnpack_layout.h"

namespace custom_ops_runner {
namespace {

namespace L = xnnpack_layout;

struct Header {
  uint16_t header_length = 0;
  uint32_t flatbuffer_offset = 0, flatbuffer_size = 0, constant_data_offset = 0;
  uint64_t constant_data_size = 0;
};

struct Quant {
  uint8_t kind = 0;
  int32_t channel_dim = 0, group_size = 0, num_nonbatch_dims = 0;
  std::optional<uint32_t> num_scales_in_vector;
  uint32_t scale_buffer_idx = 0, num_scales = 0;
};

struct Value {
  uint8_t kind = 0;
  int16_t datatype = 0;
  uint32_t num_dims = 0, constant_buffer_idx = 0, external_id = 0, flags = 0, id_out = 0;
  std::optional<std::vector<uint32_t>> dims;
  std::optional<Quant> quant;
};

struct Constant {
  uint64_t offset = 0, size = 0;
  std::optional<std::string> named_key;
};

struct Node {
  uint8_t kind = 0;  // the XNodeUnion tag: L::kNodeKinds[kind - 1] when known
  bool present = false;  // its table is there (XNNPACK's compiler reads it unchecked)
  std::optional<std::vector<uint32_t>> inputs, outputs;  // the value ids it reads and writes; none: kind or table unknown
  std::optional<std::vector<std::optional<uint32_t>>> per_input_dim;  // vector lengths read one entry per input dim
};

constexpr size_t kNumNodeKinds = sizeof(L::kNodeKinds) / sizeof(L::kNodeKinds[0]);

struct Payload {
  std::optional<Header> header;
  std::string identifier;
  uint32_t num_externs = 0;
  std::optional<uint32_t> num_nodes;
  std::optional<std::vector<Node>> nodes;
  std::optional<std::vector<uint32_t>> input_ids, output_ids;
  std::optional<std::vector<Constant>> constants;
  std::optional<std::vector<Value>> values;
};

template <typename T>
T little_endian_at(const uint8_t* data, size_t at) {
  T value;
  std::memcpy(&value, data + at, sizeof(T));
  return value;
}

std::optional<Header> read_header(const uint8_t* payload, size_t size) {
  if (size < L::kHeaderSize || std::memcmp(payload + L::kMagicAt, L::kHeaderMagic, 4) != 0) {
    return std::nullopt;
  }
  Header h;
  h.header_length = little_endian_at<uint16_t>(payload, L::kHeaderLengthAt);
  h.flatbuffer_offset = little_endian_at<uint32_t>(payload, L::kFlatbufferOffsetAt);
  h.flatbuffer_size = little_endian_at<uint32_t>(payload, L::kFlatbufferSizeAt);
  h.constant_data_offset = little_endian_at<uint32_t>(payload, L::kConstantDataOffsetAt);
  h.constant_data_size = little_endian_at<uint64_t>(payload, L::kConstantDataSizeAt);
  return h;
}

Quant read_quant(FlatReader& r, size_t quantized) {
  Quant quant;
  quant.kind = r.scalar<uint8_t>(quantized, L::XNNQuantizedTensorValue::kQuantParamsType);
  const size_t params = r.child(quantized, L::XNNQuantizedTensorValue::kQuantParams);
  if (params == 0) {
    return quant;
  }
  if (quant.kind == L::kQuantPerChannel) {
    if (auto scales = r.vector(params, L::PerChannelQuant::kScale, 4)) {
      quant.num_scales_in_vector = scales->second;
    }
    quant.channel_dim = r.scalar<int32_t>(params, L::PerChannelQuant::kChannelDim);
    quant.scale_buffer_idx = r.scalar<uint32_t>(params, L::PerChannelQuant::kScaleBufferIdx);
    quant.num_scales = r.scalar<uint32_t>(params, L::PerChannelQuant::kNumScales);
  } else if (quant.kind == L::kQuantPerChannelGroup) {
    if (auto scales = r.vector(params, L::PerChannelGroupQuant::kScale, 4)) {
      quant.num_scales_in_vector = scales->second;
    }
    quant.channel_dim = r.scalar<int32_t>(params, L::PerChannelGroupQuant::kChannelDim);
    quant.scale_buffer_idx = r.scalar<uint32_t>(params, L::PerChannelGroupQuant::kScaleBufferIdx);
    quant.num_scales = r.scalar<uint32_t>(params, L::PerChannelGroupQuant::kNumScales);
    quant.group_size = r.scalar<int32_t>(params, L::PerChannelGroupQuant::kGroupSize);
  } else if (quant.kind == L::kQuantPerTokenDynamic) {
    quant.num_nonbatch_dims = r.scalar<int32_t>(params, L::PerTokenDynamicQuant::kNumNonbatchDims);
  }
  return quant;
}

Node read_node(FlatReader& r, size_t at) {
  Node node;
  node.kind = r.scalar<uint8_t>(at, L::XNode::kXnodeUnionType);
  if (node.kind < 1 || node.kind > kNumNodeKinds) {
    return node;
  }
  const size_t table = r.child(at, L::XNode::kXnodeUnion);
  node.present = table != 0;
  if (table == 0) {
    return node;
  }
  const L::NodeLayout& layout = L::kNodeKinds[node.kind - 1];
  node.inputs.emplace();
  node.outputs.emplace();
  node.per_input_dim.emplace();
  for (int i = 0; i < layout.num_inputs; ++i) {
    node.inputs->push_back(r.scalar<uint32_t>(table, layout.inputs[i]));
  }
  for (int i = 0; i < layout.num_outputs; ++i) {
    node.outputs->push_back(r.scalar<uint32_t>(table, layout.outputs[i]));
  }
  for (int i = 0; i < layout.num_per_input_dim; ++i) {
    auto found = r.vector(table, layout.per_input_dim[i], 4);
    node.per_input_dim->push_back(found ? std::optional<uint32_t>(found->second) : std::nullopt);
  }
  return node;
}

// The payload's fields as XNNPACK will read them (p.header already read); false when the walk leaves the bytes. A
// header that places the graph outside the payload leaves everything past it unread (the header check reports it).
bool read_payload(const uint8_t* payload, size_t size, Payload& p) {
  size_t start = 0, length = size;
  if (p.header) {
    start = p.header->flatbuffer_offset;
    length = p.header->flatbuffer_size;
    if (start > size || length > size - start) {
      return true;
    }
  }
  const uint8_t* graph_bytes = payload + start;
  p.identifier = length >= 8 ? std::string(reinterpret_cast<const char*>(graph_bytes) + 4, 4) : std::string();
  FlatReader r(graph_bytes, length);
  const size_t graph = r.target(0);
  p.num_externs = r.scalar<uint32_t>(graph, L::XNNGraph::kNumExterns);
  if (auto nodes = r.tables(graph, L::XNNGraph::kXnodes)) {
    p.num_nodes = static_cast<uint32_t>(nodes->size());
    p.nodes.emplace();
    for (size_t at : *nodes) {
      p.nodes->push_back(read_node(r, at));
    }
  }
  p.input_ids = r.scalars<uint32_t>(graph, L::XNNGraph::kInputIds);
  p.output_ids = r.scalars<uint32_t>(graph, L::XNNGraph::kOutputIds);
  if (auto constants = r.tables(graph, L::XNNGraph::kConstantData)) {
    p.constants.emplace();
    for (size_t c : *constants) {
      p.constants->push_back({r.scalar<uint64_t>(c, L::ConstantDataOffset::kOffset),
                              r.scalar<uint64_t>(c, L::ConstantDataOffset::kSize),
                              r.string(c, L::ConstantDataOffset::kNamedKey)});
    }
  }
  auto values = r.tables(graph, L::XNNGraph::kXvalues);
  if (!values || !r.ok()) {
    return r.ok();
  }
  p.values.emplace();
  for (size_t at : *values) {
    Value& v = p.values->emplace_back();
    v.kind = r.scalar<uint8_t>(at, L::XValue::kXvalueUnionType);
    if (v.kind != L::kXValueTensor && v.kind != L::kXValueQuantized) {
      continue;
    }
    size_t tensor = r.child(at, L::XValue::kXvalueUnion);
    const size_t quantized = v.kind == L::kXValueQuantized ? tensor : 0;
    if (quantized != 0) {
      tensor = r.child(quantized, L::XNNQuantizedTensorValue::kTensorValue);
    }
    if (tensor == 0 || !r.ok()) {
      v.kind = 0;  // a union member without its table: nothing XNNPACK can define
      continue;
    }
    v.datatype = r.scalar<int16_t>(tensor, L::XNNTensorValue::kDatatype);
    v.num_dims = r.scalar<uint32_t>(tensor, L::XNNTensorValue::kNumDims);
    v.dims = r.scalars<uint32_t>(tensor, L::XNNTensorValue::kDims);
    v.constant_buffer_idx = r.scalar<uint32_t>(tensor, L::XNNTensorValue::kConstantBufferIdx);
    v.external_id = r.scalar<uint32_t>(tensor, L::XNNTensorValue::kExternalId);
    v.flags = r.scalar<uint32_t>(tensor, L::XNNTensorValue::kFlags);
    v.id_out = r.scalar<uint32_t>(tensor, L::XNNTensorValue::kIdOut);
    if (quantized != 0) {
      v.quant = read_quant(r, quantized);
    }
  }
  return r.ok();
}

std::string join(const std::optional<std::vector<uint32_t>>& values) {
  if (!values) {
    return "-";
  }
  std::string text;
  for (size_t i = 0; i < values->size(); ++i) {
    text += (i ? "," : "") + std::to_string((*values)[i]);
  }
  return text;
}

std::optional<std::string> header_problem(const Header& h, size_t size) {
  const uint64_t fb_at = h.flatbuffer_offset, fb_size = h.flatbuffer_size;
  const uint64_t cd_at = h.constant_data_offset, cd_size = h.constant_data_size;
  if (h.header_length < L::kHeaderSize) {
    return "its header says it is " + std::to_string(h.header_length) + " bytes long, less than the " +
        std::to_string(L::kHeaderSize) + " it holds";
  }
  if (fb_size < 8) {
    return "its header gives a flatbuffer of " + std::to_string(fb_size) + " bytes, too small for a graph";
  }
  if (fb_at < h.header_length || fb_at > size || fb_size > size - fb_at) {
    return "its header places the XNNPACK graph (offset " + std::to_string(fb_at) + ", " + std::to_string(fb_size) +
        " bytes) outside the payload of " + std::to_string(size) + " bytes";
  }
  if (cd_at > size || cd_size > size - cd_at) {
    return "its header places the constant data (offset " + std::to_string(cd_at) + ", " + std::to_string(cd_size) +
        " bytes) outside the payload of " + std::to_string(size) + " bytes";
  }
  if (cd_at < fb_at + fb_size) {
    return "its header places the constant data (offset " + std::to_string(cd_at) + ") inside the graph (offset " +
        std::to_string(fb_at) + ", " + std::to_string(fb_size) + " bytes)";
  }
  return std::nullopt;
}

// Constant data `index` exists and holds at least `needed` bytes, inside the constant region or in the program's
// named data.
std::optional<std::string> constant_problem(const Payload& p, const char* name, uint32_t index, uint64_t needed,
                                            const PayloadContext& context) {
  const size_t count = p.constants ? p.constants->size() : 0;
  const std::string what = std::string(name) + " " + std::to_string(index);
  if (index >= count) {
    return what + " names constant data " + std::to_string(index) + " of " + std::to_string(count);
  }
  const Constant& c = (*p.constants)[index];
  std::optional<uint64_t> stored;
  if (c.named_key) {
    if (context.named_data != nullptr) {
      auto found = context.named_data->find(*c.named_key);
      if (found == context.named_data->end()) {
        return what + " names data '" + *c.named_key + "' the program does not hold";
      }
      stored = found->second;
    }
  } else {
    const uint64_t region = p.header ? p.header->constant_data_size : 0;
    if (c.offset > region || c.size > region - c.offset) {
      return what + ": constant data at offset " + std::to_string(c.offset) + ", " + std::to_string(c.size) +
          " bytes, lies outside the payload's constant region of " + std::to_string(region) + " bytes";
    }
    stored = c.size;
  }
  if (stored && needed > *stored) {
    return what + ": it needs " + std::to_string(needed) + " bytes but its constant data holds " +
        std::to_string(*stored);
  }
  return std::nullopt;
}

std::optional<std::string> quant_problem(const Payload& p, const Value& v, const PayloadContext& context) {
  const Quant& q = *v.quant;
  const std::vector<uint32_t> dims = v.dims.value_or(std::vector<uint32_t>{});
  const uint32_t in_vector = q.num_scales_in_vector.value_or(0);
  if (q.kind == L::kQuantPerChannel) {
    if (q.channel_dim < 0 || static_cast<size_t>(q.channel_dim) >= dims.size()) {
      return "channel_dim " + std::to_string(q.channel_dim) + " is not a dim of its " + std::to_string(dims.size());
    }
    const uint64_t channels = dims[q.channel_dim];
    if (q.scale_buffer_idx != 0) {
      return constant_problem(p, "scale_buffer_idx", q.scale_buffer_idx, channels * L::kScaleBits / 8, context);
    }
    if (in_vector < channels) {
      return "it has " + std::to_string(in_vector) + " scales for " + std::to_string(channels) + " channels (dim " +
          std::to_string(q.channel_dim) + ")";
    }
  } else if (q.kind == L::kQuantPerChannelGroup) {
    if (dims.size() != 2) {
      return "per-group quantization needs 2 dims, it has " + std::to_string(dims.size());
    }
    if (q.group_size <= 0 || dims[1] % static_cast<uint32_t>(q.group_size) != 0) {
      return "group_size " + std::to_string(q.group_size) + " does not divide its " + std::to_string(dims[1]) +
          " input channels";
    }
    const uint64_t groups = uint64_t{dims[0]} * (dims[1] / static_cast<uint32_t>(q.group_size));
    if (q.scale_buffer_idx != 0) {
      if (q.num_scales != groups) {
        return "num_scales is " + std::to_string(q.num_scales) + ", not the " + std::to_string(groups) +
            " its dims and group_size make";
      }
      return constant_problem(p, "scale_buffer_idx", q.scale_buffer_idx, groups * L::kGroupScaleBits / 8, context);
    }
    if (in_vector != groups) {
      return "it has " + std::to_string(in_vector) + " scales, not the " + std::to_string(groups) +
          " its dims and group_size make";
    }
  } else if (q.kind == L::kQuantPerTokenDynamic) {
    if (q.num_nonbatch_dims < 0 || static_cast<size_t>(q.num_nonbatch_dims) > dims.size()) {
      return "num_nonbatch_dims " + std::to_string(q.num_nonbatch_dims) + " is not between 0 and its " +
          std::to_string(dims.size()) + " dims";
    }
  } else if (q.kind != L::kQuantPerTensor) {
    return "quantization kind " + std::to_string(q.kind) + " is not one XNNPACK reads";
  }
  return std::nullopt;
}

std::string hex(uint32_t value) {
  char text[16];
  std::snprintf(text, sizeof(text), "%#x", value);
  return text;
}

std::optional<std::string> value_problem(const Payload& p, const Value& v, const PayloadContext& context) {
  const size_t rank = v.dims ? v.dims->size() : 0;
  if (v.num_dims != rank) {
    return "num_dims is " + std::to_string(v.num_dims) + " but its dims vector holds " + std::to_string(rank);
  }
  if (rank > L::kMaxDims) {
    return "it has " + std::to_string(rank) + " dims, more than XNNPACK's " + std::to_string(L::kMaxDims);
  }
  if (v.datatype < 1 || v.datatype > L::kMaxDatatype) {
    return "datatype " + std::to_string(v.datatype) + " is not one XNNPACK knows (1 to " +
        std::to_string(L::kMaxDatatype) + ")";
  }
  const unsigned bits = L::element_bits(v.datatype);
  if (v.constant_buffer_idx != 0 && bits == 0) {
    return "it is a constant of datatype " + std::to_string(v.datatype) + ", whose size per element is unknown";
  }
  if ((v.flags & ~L::kExternalFlags) != 0) {
    return "flags " + hex(v.flags) + " has bits XNNPACK does not allow (only " + hex(L::kExternalFlags) + ")";
  }
  if ((v.flags & L::kExternalFlags) != 0 && v.external_id >= p.num_externs) {
    return "external_id " + std::to_string(v.external_id) + " is not below num_externs " +
        std::to_string(p.num_externs);
  }
  uint64_t elements = 1;
  for (uint32_t dim : v.dims.value_or(std::vector<uint32_t>{})) {
    if (__builtin_mul_overflow(elements, uint64_t{dim}, &elements) || elements > L::kMaxElements) {
      return "dims [" + join(v.dims) + "] make too many elements";
    }
  }
  if (v.constant_buffer_idx != 0) {
    if (auto problem = constant_problem(p, "constant_buffer_idx", v.constant_buffer_idx, (elements * bits + 7) / 8,
                                        context)) {
      return problem;
    }
  }
  return v.quant ? quant_problem(p, v, context) : std::nullopt;
}

// The nodes in the order XNNPACK runs them: each of a kind XNNPACK knows, with its table, reading only values that
// exist by then (external inputs, constants, what an earlier node wrote) and writing each other value once. XNNPACK's
// subgraph optimizer follows a read value to its writer unchecked (libFuzzer: a Convert whose output id became its
// input's left the FullyConnected after it reading a value no node writes: SIGSEGV).
std::optional<std::string> nodes_problem(const Payload& p) {
  std::map<uint32_t, size_t> by_id;  // id_out -> value index
  for (size_t i = 0; i < p.values->size(); ++i) {
    const Value& v = (*p.values)[i];
    if (v.kind != L::kXValueTensor && v.kind != L::kXValueQuantized) {
      continue;
    }
    if (auto [it, inserted] = by_id.emplace(v.id_out, i); !inserted) {
      return "value " + std::to_string(i) + ": id_out " + std::to_string(v.id_out) + " is also value " +
          std::to_string(it->second) + "'s";
    }
  }
  std::map<uint32_t, size_t> written;  // value id -> the node that wrote it
  for (size_t i = 0; i < p.nodes->size(); ++i) {
    const Node& n = (*p.nodes)[i];
    if (n.kind < 1 || n.kind > kNumNodeKinds) {
      return "node " + std::to_string(i) + " is of kind " + std::to_string(n.kind) + ", not one XNNPACK knows (1 to " +
          std::to_string(kNumNodeKinds) + ")";
    }
    const std::string what = "node " + std::to_string(i) + " (" + L::kNodeKinds[n.kind - 1].name + ")";
    if (!n.present) {
      return what + " has no table of fields";
    }
    for (const auto& [verb, ids] : {std::make_pair(" reads", &*n.inputs), std::make_pair(" writes", &*n.outputs)}) {
      for (uint32_t id : *ids) {
        if (id != L::kNoValue && by_id.count(id) == 0) {
          return what + verb + " value id " + std::to_string(id) + ", which no value defines";
        }
      }
    }
    for (uint32_t id : *n.inputs) {
      if (id == L::kNoValue) {
        continue;
      }
      const Value& v = (*p.values)[by_id.at(id)];
      if ((v.flags & L::kExternalInput) == 0 && v.constant_buffer_idx == 0 && written.count(id) == 0) {
        return what + " reads value id " + std::to_string(id) + " before any node writes it";
      }
    }
    if (!n.per_input_dim->empty()) {
      auto input = by_id.find(n.inputs->front());
      const uint32_t rank = input == by_id.end() ? 0 : (*p.values)[input->second].num_dims;
      for (const auto& length : *n.per_input_dim) {
        if (!length || *length < rank) {
          return what + " has a vector shorter than its input's " + std::to_string(rank) + " dims";
        }
      }
    }
    for (uint32_t id : *n.outputs) {
      if (id == L::kNoValue) {
        continue;
      }
      const Value& v = (*p.values)[by_id.at(id)];
      if ((v.flags & L::kExternalInput) != 0 || v.constant_buffer_idx != 0) {
        return what + " writes value id " + std::to_string(id) + ", " +
            (v.constant_buffer_idx == 0 ? "an external input" : "a constant");
      }
      if (auto [it, inserted] = written.emplace(id, i); !inserted) {
        return what + " writes value id " + std::to_string(id) + ", which node " + std::to_string(it->second) +
            " wrote already";
      }
    }
  }
  return std::nullopt;
}

std::optional<std::string> graph_problem(const Payload& p, const PayloadContext& context) {
  if (!p.values || !p.num_nodes) {
    return std::string("its XNNPACK graph has no values or no nodes");
  }
  if (p.num_externs > L::kMaxExterns) {
    return "num_externs is " + std::to_string(p.num_externs) + ", more than XNNPACK's " +
        std::to_string(L::kMaxExterns);
  }
  if (context.delegate_args && p.num_externs > *context.delegate_args) {
    return "num_externs is " + std::to_string(p.num_externs) + " but the program calls the delegate with " +
        std::to_string(*context.delegate_args) + " arguments";
  }
  for (const auto& [name, ids] : {std::make_pair("input_ids", &p.input_ids), std::make_pair("output_ids", &p.output_ids)}) {
    for (uint32_t id : ids->value_or(std::vector<uint32_t>{})) {
      if (id >= p.values->size()) {
        return std::string(name) + " names value " + std::to_string(id) + " of " + std::to_string(p.values->size());
      }
    }
  }
  for (size_t i = 0; i < p.values->size(); ++i) {
    const Value& v = (*p.values)[i];
    if (v.kind == L::kXValueTensor || v.kind == L::kXValueQuantized) {
      if (auto problem = value_problem(p, v, context)) {
        return "value " + std::to_string(i) + ": " + *problem;
      }
    }
  }
  return nodes_problem(p);
}

constexpr const char* kUnreadable = "its XNNPACK graph cannot be read (an offset or length points outside it)";

} // namespace

std::optional<std::string> check_xnnpack_payload(const uint8_t* payload, size_t size, const PayloadContext& context) {
  Payload p;
  p.header = read_header(payload, size);
  if (p.header) {
    if (auto problem = header_problem(*p.header, size)) {
      return problem;
    }
  }
  if (!read_payload(payload, size, p)) {
    return std::string(kUnreadable);
  }
  bool known = false;
  for (const char* identifier : L::kIdentifiers) {
    known = known || p.identifier == identifier;
  }
  if (!known) {
    std::string listed;
    for (const char* identifier : L::kIdentifiers) {
      listed += (listed.empty() ? "" : ", ") + std::string(identifier);
    }
    std::string shown;  // as Python's repr of bytes prints it, so both checkers' messages agree
    for (unsigned char c : p.identifier) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), c >= 32 && c < 127 && c != '\'' && c != '\\' ? "%c" : "\\x%02x", c);
      shown += escaped;
    }
    return "its flatbuffer identifier is b'" + shown + "', not one of " + listed;
  }
  return graph_problem(p, context);
}

std::vector<std::string> describe_xnnpack_payload(const uint8_t* payload, size_t size) {
  Payload p;
  p.header = read_header(payload, size);
  if (!read_payload(payload, size, p)) {
    return {};
  }
  std::vector<std::string> lines;
  if (const auto& h = p.header) {
    lines.push_back("header.header_length=" + std::to_string(h->header_length));
    lines.push_back("header.flatbuffer_offset=" + std::to_string(h->flatbuffer_offset));
    lines.push_back("header.flatbuffer_size=" + std::to_string(h->flatbuffer_size));
    lines.push_back("header.constant_data_offset=" + std::to_string(h->constant_data_offset));
    lines.push_back("header.constant_data_size=" + std::to_string(h->constant_data_size));
  }
  lines.push_back("identifier=" + p.identifier);
  lines.push_back("num_externs=" + std::to_string(p.num_externs));
  lines.push_back("num_nodes=" + (p.num_nodes ? std::to_string(*p.num_nodes) : std::string("-")));
  lines.push_back("input_ids=" + join(p.input_ids));
  lines.push_back("output_ids=" + join(p.output_ids));
  for (size_t i = 0; p.constants && i < p.constants->size(); ++i) {
    const Constant& c = (*p.constants)[i];
    lines.push_back("constant[" + std::to_string(i) + "]=" + std::to_string(c.offset) + "," + std::to_string(c.size) +
                    "," + c.named_key.value_or("-"));
  }
  for (size_t i = 0; p.nodes && i < p.nodes->size(); ++i) {
    const Node& n = (*p.nodes)[i];
    std::string lengths = "-";
    if (n.per_input_dim) {
      lengths.clear();
      for (size_t j = 0; j < n.per_input_dim->size(); ++j) {
        const auto& length = (*n.per_input_dim)[j];
        lengths += (j ? "," : "") + (length ? std::to_string(*length) : std::string("-"));
      }
    }
    lines.push_back("node[" + std::to_string(i) + "]=kind:" + std::to_string(n.kind) +
                    " table:" + std::to_string(n.present ? 1 : 0) + " inputs:" + join(n.inputs) +
                    " outputs:" + join(n.outputs) + " per_input_dim:" + lengths);
  }
  for (size_t i = 0; p.values && i < p.values->size(); ++i) {
    const Value& v = (*p.values)[i];
    std::string line = "value[" + std::to_string(i) + "]=kind:" + std::to_string(v.kind) +
        " datatype:" + std::to_string(v.datatype) + " num_dims:" + std::to_string(v.num_dims) +
        " dims:" + join(v.dims) + " constant:" + std::to_string(v.constant_buffer_idx) +
        " external_id:" + std::to_string(v.external_id) + " flags:" + std::to_string(v.flags) +
        " id_out:" + std::to_string(v.id_out);
    if (const auto& q = v.quant) {
      line += " quant:" + std::to_string(q->kind) + " channel_dim:" + std::to_string(q->channel_dim) +
          " scales:" + (q->num_scales_in_vector ? std::to_string(*q->num_scales_in_vector) : std::string("-")) +
          " scale_buffer:" + std::to_string(q->scale_buffer_idx) + " num_scales:" + std::to_string(q->num_scales) +
          " group_size:" + std::to_string(q->group_size) + " nonbatch_dims:" + std::to_string(q->num_nonbatch_dims);
    }
    lines.push_back(line);
  }
  return lines;
}

std::optional<std::string> check_value_lists(const uint8_t* data, size_t size) {
  FlatReader r(data, size);
  const size_t program = r.target(0);
  constexpr size_t kTypes = sizeof(L::kKernelTypes) / sizeof(L::kKernelTypes[0]);
  for (size_t plan : r.tables(program, L::Program::kExecutionPlan).value_or(std::vector<size_t>{})) {
    const auto values = r.tables(plan, L::ExecutionPlan::kValues).value_or(std::vector<size_t>{});
    std::vector<std::string> kinds;
    for (size_t value : values) {
      const uint8_t tag = r.scalar<uint8_t>(value, L::EValue::kValType);
      kinds.push_back(tag >= 1 && tag <= kTypes ? L::kKernelTypes[tag - 1] : "value of unknown kind");
    }
    for (size_t i = 0; r.ok() && i < values.size(); ++i) {
      const bool ints = kinds[i] == "IntList", tensors = kinds[i] == "TensorList",
                 optional = kinds[i] == "OptionalTensorList";
      if (!ints && !tensors && !optional) {
        continue;
      }
      const size_t list = r.child(values[i], L::EValue::kVal);
      std::vector<int64_t> items;
      if (ints) {
        items = r.scalars<int64_t>(list, L::ListItems::kItems).value_or(std::vector<int64_t>{});
      } else {
        for (int32_t item : r.scalars<int32_t>(list, L::ListItems::kItems).value_or(std::vector<int32_t>{})) {
          items.push_back(item);
        }
      }
      for (size_t j = 0; j < items.size(); ++j) {
        const int64_t item = items[j];
        const bool inside = item >= 0 && static_cast<uint64_t>(item) < kinds.size();
        const std::string found = inside ? kinds[item] : "";
        if (ints ? found == "Int" : (found == "Tensor" || (optional && found == "Null"))) {
          continue;
        }
        const std::string what = inside ? "whose kind is " + found : "outside the method's " +
            std::to_string(kinds.size()) + " values";
        return "value " + std::to_string(i) + " (" + kinds[i] + ") lists value " + std::to_string(item) +
            " as its item " + std::to_string(j) + ", " + what + ", not " +
            (ints ? "Int" : optional ? "Tensor or Null" : "Tensor") + "; the program is corrupt";
      }
    }
  }
  return std::nullopt;
}

std::optional<std::string> check_delegates(const uint8_t* data, size_t size) {
  // The extended header ("eh00" at byte 8) gives where the segments start: bytes 24..32.
  uint64_t segment_base = 0;
  const bool has_segments = size >= 32 && std::memcmp(data + 8, "eh00", 4) == 0;
  if (has_segments) {
    std::memcpy(&segment_base, data + 24, 8);
  }
  FlatReader r(data, size);
  const size_t program = r.target(0);
  const auto plans = r.tables(program, L::Program::kExecutionPlan).value_or(std::vector<size_t>{});
  const auto inline_data = r.tables(program, L::Program::kBackendDelegateData).value_or(std::vector<size_t>{});
  const auto segments = r.tables(program, L::Program::kSegments).value_or(std::vector<size_t>{});
  // Bytes the program holds under each named-data key (a key whose segment is missing holds none).
  std::map<std::string, uint64_t> named_data;
  for (size_t entry : r.tables(program, L::Program::kNamedData).value_or(std::vector<size_t>{})) {
    const uint32_t segment = r.scalar<uint32_t>(entry, L::NamedData::kSegmentIndex);
    named_data[r.string(entry, L::NamedData::kKey).value_or("")] =
        segment < segments.size() ? r.scalar<uint64_t>(segments[segment], L::DataSegment::kSize) : 0;
  }
  for (size_t plan : plans) {
    if (!r.ok()) {
      break;
    }
    // The fewest arguments each delegate is called with: XNNPACK's executor indexes them by external id unchecked.
    std::map<int32_t, uint64_t> delegate_args;
    for (size_t chain : r.tables(plan, L::ExecutionPlan::kChains).value_or(std::vector<size_t>{})) {
      for (size_t instruction : r.tables(chain, L::Chain::kInstructions).value_or(std::vector<size_t>{})) {
        if (r.scalar<uint8_t>(instruction, L::Instruction::kInstrArgsType) != L::kInstructionDelegateCall) {
          continue;
        }
        const size_t call = r.child(instruction, L::Instruction::kInstrArgs);
        const int32_t index = r.scalar<int32_t>(call, L::DelegateCall::kDelegateIndex);
        const auto args = r.vector(call, L::DelegateCall::kArgs, 4);
        const uint64_t count = args ? args->second : 0;
        auto [it, inserted] = delegate_args.emplace(index, count);
        it->second = std::min(it->second, count);
      }
    }
    const auto delegates = r.tables(plan, L::ExecutionPlan::kDelegates).value_or(std::vector<size_t>{});
    for (size_t d = 0; r.ok() && d < delegates.size(); ++d) {
      const size_t delegate = delegates[d];
      // ExecuTorch's BackendDelegate::Init dereferences these unchecked (libFuzzer: a delegate without compile specs).
      const size_t processed = r.child(delegate, L::BackendDelegate::kProcessed);
      const auto specs = r.tables(delegate, L::BackendDelegate::kCompileSpecs);
      if (r.child(delegate, L::BackendDelegate::kId) == 0 || processed == 0 || !specs) {
        return "delegate " + std::to_string(d) + " lacks its backend id, its data or its compile specs; the program "
            "is corrupt";
      }
      for (size_t c = 0; r.ok() && c < specs->size(); ++c) {
        if (r.child((*specs)[c], L::CompileSpec::kKey) == 0 || r.child((*specs)[c], L::CompileSpec::kValue) == 0) {
          return "compile spec " + std::to_string(c) + " of delegate " + std::to_string(d) + " lacks its key or "
              "value; the program is corrupt";
        }
      }
      if (r.string(delegate, L::BackendDelegate::kId) != "XnnpackBackend") {
        continue;
      }
      const int8_t location = r.scalar<int8_t>(processed, L::BackendDataReference::kLocation);
      const uint32_t index = r.scalar<uint32_t>(processed, L::BackendDataReference::kIndex);
      const uint8_t* payload = nullptr;
      size_t payload_size = 0;
      if (location == L::kDataInline && index < inline_data.size()) {
        if (auto bytes = r.vector(inline_data[index], L::BackendDelegateInlineData::kData, 1)) {
          payload = data + bytes->first + 4;
          payload_size = bytes->second;
        }
      } else if (location == L::kDataSegment && has_segments && index < segments.size()) {
        const uint64_t offset = r.scalar<uint64_t>(segments[index], L::DataSegment::kOffset);
        const uint64_t length = r.scalar<uint64_t>(segments[index], L::DataSegment::kSize);
        if (segment_base > size || offset > size - segment_base || length > size - segment_base - offset) {
          continue;  // the runtime's loader refuses it
        }
        payload = data + segment_base + offset;
        payload_size = length;
      }
      if (r.ok() && payload != nullptr && payload_size != 0) {
        PayloadContext context;
        context.named_data = &named_data;
        if (auto found = delegate_args.find(static_cast<int32_t>(d)); found != delegate_args.end()) {
          context.delegate_args = found->second;
        }
        if (auto problem = check_xnnpack_payload(payload, payload_size, context)) {
          return "delegate " + std::to_string(d) + " (XnnpackBackend): " + *problem + "; the payload is corrupt";
        }
      }
    }
  }
  return std::nullopt;  // a Program the reader cannot walk is the runtime's verifier's to refuse
}

} // namespace custom_ops_runner
