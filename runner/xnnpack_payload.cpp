// The delegate checks of the runner (xnnpack_payload.h): a bounds-checked walk over FlatBuffers tables, enough to go
// from the .pte's Program to each delegate entry and XNNPACK payload and from its graph to the constant tensors, without generated
// code (the wheel ships neither the schemas' headers nor flatbuffers'). Field slots follow executorch/schema/
// program.fbs and backends/xnnpack/serialization/schema.fbs; a union takes two slots, its type then its value.
#include "xnnpack_payload.h"

#include <cstring>
#include <string_view>

namespace custom_ops_runner {
namespace {

class FlatReader {
 public:
  FlatReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool ok() const { return ok_; }

  template <typename T>
  T read(size_t pos) {
    T value{};
    if (pos > size_ || size_ - pos < sizeof(T)) {
      ok_ = false;
      return value;
    }
    std::memcpy(&value, data_ + pos, sizeof(T));
    return value;
  }

  size_t root() { return target(0); }

  // The position of a table's field, 0 when the table leaves it out.
  size_t field(size_t table, int slot) {
    const int64_t vtable = static_cast<int64_t>(table) - read<int32_t>(table);
    if (!ok_ || vtable < 0 || static_cast<uint64_t>(vtable) >= size_) {
      ok_ = false;
      return 0;
    }
    const size_t entry = 4 + 2 * static_cast<size_t>(slot);
    if (entry + 2 > read<uint16_t>(vtable)) {
      return 0;
    }
    const uint16_t offset = read<uint16_t>(vtable + entry);
    return offset == 0 ? 0 : table + offset;
  }

  template <typename T>
  T scalar(size_t table, int slot) {
    const size_t pos = field(table, slot);
    return pos == 0 ? T{} : read<T>(pos);
  }

  // What a table's offset field (a table, vector or string) points at; 0 when absent.
  size_t child(size_t table, int slot) {
    const size_t pos = field(table, slot);
    return pos == 0 ? 0 : target(pos);
  }

  // A vector's length, once its elements of `width` bytes are known to lie inside the buffer.
  uint32_t length(size_t vector, size_t width) {
    const uint32_t n = read<uint32_t>(vector);
    if (!ok_ || static_cast<uint64_t>(n) * width > size_ - vector - 4) {
      ok_ = false;
      return 0;
    }
    return n;
  }

  size_t element(size_t vector, size_t index, size_t width) { return vector + 4 + index * width; }
  size_t table_at(size_t vector, size_t index) { return target(element(vector, index, 4)); }

  std::string_view string(size_t table, int slot) {
    const size_t s = child(table, slot);
    if (s == 0) {
      return {};
    }
    const uint32_t n = length(s, 1);
    return ok_ ? std::string_view(reinterpret_cast<const char*>(data_ + s + 4), n) : std::string_view();
  }

 private:
  size_t target(size_t pos) {
    const uint32_t offset = read<uint32_t>(pos);
    if (!ok_ || offset == 0 || offset >= size_ - pos) {
      ok_ = false;
      return 0;
    }
    return pos + offset;
  }

  const uint8_t* data_;
  size_t size_;
  bool ok_ = true;
};

// Bits per element of XNNPACK's datatypes (XNNDatatype); 0: not checked (a kind this check does not know).
unsigned element_bits(int16_t datatype) {
  switch (datatype) {
    case 1: case 5: case 7: return 32;  // fp32, qint32, qcint32
    case 2: return 16;  // fp16
    case 3: case 4: case 6: case 9: return 8;  // qint8, quint8, qcint8, qdint8
    case 8: case 10: return 4;  // qcint4, qbint4
    default: return 0;
  }
}

constexpr uint64_t kNamedData = UINT64_MAX;  // a ConstantDataOffset whose bytes live in the program's named data

} // namespace

std::optional<std::string> check_xnnpack_payload(const uint8_t* payload, size_t size) {
  size_t graph_start = 0, graph_size = size;
  uint64_t constants_size = 0;
  bool header = size >= 34 && std::memcmp(payload + 4, "XH00", 4) == 0;
  if (header) {
    uint32_t offset = 0, length = 0;
    std::memcpy(&offset, payload + 10, 4);
    std::memcpy(&length, payload + 14, 4);
    std::memcpy(&constants_size, payload + 26, 8);
    if (offset > size || length > size - offset) {
      return std::string("its header places the XNNPACK graph outside the payload");
    }
    graph_start = offset;
    graph_size = length;
  }
  FlatReader r(payload + graph_start, graph_size);
  const size_t graph = r.root();
  const size_t constants = r.child(graph, 8);  // constant_data: [ConstantDataOffset {offset, size, named_key}]
  const uint32_t num_constants = constants == 0 ? 0 : r.length(constants, 4);
  const size_t values = r.child(graph, 2);  // xvalues: [XValue {xvalue_union}]
  const uint32_t num_values = values == 0 ? 0 : r.length(values, 4);
  for (uint32_t i = 0; r.ok() && i < num_values; ++i) {
    const size_t value = r.table_at(values, i);
    const uint8_t kind = r.scalar<uint8_t>(value, 0);  // 1 XNNTensorValue, 2 XNNQuantizedTensorValue
    size_t tensor = kind == 1 || kind == 2 ? r.child(value, 1) : 0;
    if (kind == 2 && tensor != 0) {
      tensor = r.child(tensor, 0);  // its tensor_value
    }
    if (tensor == 0 || !r.ok()) {
      continue;
    }
    const uint32_t index = r.scalar<uint32_t>(tensor, 3);  // constant_buffer_idx; 0: not a constant
    const unsigned bits = element_bits(r.scalar<int16_t>(tensor, 0));
    if (index == 0 || bits == 0) {
      continue;
    }
    if (index >= num_constants) {
      return "value " + std::to_string(i) + " names constant data " + std::to_string(index) + " of " +
          std::to_string(num_constants);
    }
    const size_t dims = r.child(tensor, 2);
    const uint32_t rank = dims == 0 ? 0 : r.length(dims, 4);
    uint64_t elements = 1;
    std::string shape;
    for (uint32_t d = 0; r.ok() && d < rank; ++d) {
      const uint32_t dim = r.read<uint32_t>(r.element(dims, d, 4));
      shape += (d ? ", " : "") + std::to_string(dim);
      if (__builtin_mul_overflow(elements, static_cast<uint64_t>(dim), &elements) || elements > (UINT64_MAX - 7) / 32) {
        return "constant value " + std::to_string(i) + " has dims [" + shape + "...], too many elements";
      }
    }
    const size_t constant = r.table_at(constants, index);
    const uint64_t stored = r.scalar<uint64_t>(constant, 1);
    const uint64_t offset = r.scalar<uint64_t>(constant, 0);
    const uint64_t needed = (elements * bits + 7) / 8;
    if (r.ok() && needed > stored) {
      return "constant value " + std::to_string(i) + " has dims [" + shape + "] (" + std::to_string(needed) +
          " bytes) but its constant data holds " + std::to_string(stored) + " bytes";
    }
    if (r.ok() && header && offset != kNamedData && (offset > constants_size || stored > constants_size - offset)) {
      return "constant data " + std::to_string(index) + " lies outside the payload's constant region";
    }
  }
  if (!r.ok()) {
    return std::string("its XNNPACK graph cannot be read (an offset or length points outside it)");
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
  const size_t program = r.root();
  const size_t plans = r.child(program, 1);  // execution_plan
  const size_t inline_data = r.child(program, 3);  // backend_delegate_data: [BackendDelegateInlineData {data}]
  const size_t segments = r.child(program, 4);  // segments: [DataSegment {offset, size}]
  const uint32_t num_plans = plans == 0 ? 0 : r.length(plans, 4);
  const uint32_t num_inline = inline_data == 0 ? 0 : r.length(inline_data, 4);
  const uint32_t num_segments = segments == 0 ? 0 : r.length(segments, 4);
  for (uint32_t p = 0; r.ok() && p < num_plans; ++p) {
    const size_t plan = r.table_at(plans, p);
    const size_t delegates = r.child(plan, 7);
    const uint32_t num_delegates = delegates == 0 ? 0 : r.length(delegates, 4);
    for (uint32_t d = 0; r.ok() && d < num_delegates; ++d) {
      const size_t delegate = r.table_at(delegates, d);
      // ExecuTorch's BackendDelegate::Init dereferences these unchecked (libFuzzer: a delegate without compile specs).
      const size_t processed = r.child(delegate, 1), specs = r.child(delegate, 2);
      if (r.child(delegate, 0) == 0 || processed == 0 || specs == 0) {
        return "delegate " + std::to_string(d) + " lacks its backend id, its data or its compile specs; the program "
            "is corrupt";
      }
      const uint32_t num_specs = r.length(specs, 4);
      for (uint32_t c = 0; r.ok() && c < num_specs; ++c) {
        const size_t spec = r.table_at(specs, c);
        if (r.child(spec, 0) == 0 || r.child(spec, 1) == 0) {  // CompileSpec {key, value}
          return "compile spec " + std::to_string(c) + " of delegate " + std::to_string(d) + " lacks its key or "
              "value; the program is corrupt";
        }
      }
      if (r.string(delegate, 0) != "XnnpackBackend") {
        continue;
      }
      const int8_t location = r.scalar<int8_t>(processed, 0);  // 0 inline, 1 segment
      const uint32_t index = r.scalar<uint32_t>(processed, 1);
      const uint8_t* payload = nullptr;
      size_t payload_size = 0;
      if (location == 0 && index < num_inline) {
        const size_t bytes = r.child(r.table_at(inline_data, index), 0);
        payload_size = bytes == 0 ? 0 : r.length(bytes, 1);
        payload = data + bytes + 4;
      } else if (location == 1 && has_segments && index < num_segments) {
        const size_t segment = r.table_at(segments, index);
        const uint64_t offset = r.scalar<uint64_t>(segment, 0), length = r.scalar<uint64_t>(segment, 1);
        if (segment_base > size || offset > size - segment_base || length > size - segment_base - offset) {
          continue;  // the runtime's loader refuses it
        }
        payload = data + segment_base + offset;
        payload_size = length;
      }
      if (r.ok() && payload != nullptr && payload_size != 0) {
        if (auto problem = check_xnnpack_payload(payload, payload_size)) {
          return "delegate " + std::to_string(d) + " (XnnpackBackend): " + *problem + "; the payload is corrupt";
        }
      }
    }
  }
  return std::nullopt;  // a Program the reader cannot walk is the runtime's verifier's to refuse
}

} // namespace custom_ops_runner
