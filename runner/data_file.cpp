// The named data file check (data_file.h): the FlatTensor header, then its tables over the flatbuffer's bytes.
#include "data_file.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "flat_reader.h"
#include "kernel_calls.h"
#include "xnnpack_layout.h"

namespace custom_ops_runner {
namespace {

namespace L = xnnpack_layout;
using executorch::runtime::DataLoader;

template <typename T>
T read_at(const uint8_t* data, size_t at) {
  T value;
  std::memcpy(&value, data + at, sizeof(T));
  return value;
}

// What one named tensor's entry says wrong, or nullopt (also when a read failed: the caller checks r.ok()).
std::optional<std::string> named_tensor_problem(FlatReader& r, size_t entry, size_t index,
                                                const std::vector<uint64_t>& segment_sizes) {
  const std::string where = "named tensor " + std::to_string(index);
  const auto key = r.string(entry, L::FlatTensorNamedData::kKey);
  if (!r.ok()) {
    return std::nullopt;  // the caller names it
  }
  if (!key || key->empty()) {
    return where + " has no key";
  }
  std::string printable = key->substr(0, 200);
  for (char& c : printable) {
    c = (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) ? '?' : c;
  }
  const std::string named = where + " ('" + printable + "')";
  const uint32_t segment = r.scalar<uint32_t>(entry, L::FlatTensorNamedData::kSegmentIndex);
  if (!r.ok()) {
    return std::nullopt;
  }
  if (segment >= segment_sizes.size()) {
    return named + " names segment " + std::to_string(segment) + " of " + std::to_string(segment_sizes.size());
  }
  const size_t layout = r.child(entry, L::FlatTensorNamedData::kTensorLayout);
  if (!r.ok()) {
    return std::nullopt;
  }
  if (layout == 0) {
    return named + " has no tensor layout";
  }
  const int8_t dtype = r.scalar<int8_t>(layout, L::TensorLayout::kScalarType);
  const auto sizes = r.scalars<int32_t>(layout, L::TensorLayout::kSizes);
  const auto dim_order = r.scalars<uint8_t>(layout, L::TensorLayout::kDimOrder);
  if (!r.ok()) {
    return std::nullopt;
  }
  if (!sizes || !dim_order || sizes->size() != dim_order->size()) {
    return named + " has a layout without sizes and a dim order of one length each";
  }
  const size_t width = element_size(dtype);
  if (width == 0) {
    return named + " has dtype " + std::to_string(dtype) + ", which this ExecuTorch does not define";
  }
  std::vector<bool> seen(sizes->size(), false);
  for (uint8_t dim : *dim_order) {
    if (dim >= seen.size() || seen[dim]) {
      return named + " has a dim order that is not a permutation of its dimensions";
    }
    seen[dim] = true;
  }
  uint64_t elements = 1;
  for (int32_t size : *sizes) {
    if (size < 0) {
      return named + " has a negative size";
    }
    if (size != 0 && elements > L::kMaxElements / static_cast<uint64_t>(size)) {
      return named + " has more elements than any tensor can";
    }
    elements *= static_cast<uint64_t>(size);
  }
  if (elements * width > segment_sizes[segment]) {
    return named + " needs " + std::to_string(elements * width) + " bytes and its segment holds " +
        std::to_string(segment_sizes[segment]);
  }
  return std::nullopt;
}

} // namespace

std::optional<std::string> check_data_file(DataLoader& loader) {
  const auto file_size = loader.size();
  if (!file_size.ok()) {
    return std::string("its size cannot be read");
  }
  constexpr size_t kHeaderEnd = L::kPtdSegmentDataSizeAt + sizeof(uint64_t);
  if (*file_size < kHeaderEnd) {
    return "it has " + std::to_string(*file_size) + " bytes, fewer than a data file's header";
  }
  const DataLoader::SegmentInfo info(DataLoader::SegmentInfo::Type::Program);
  auto head = loader.load(0, kHeaderEnd, info);
  if (!head.ok()) {
    return std::string("its header cannot be read");
  }
  const auto* h = static_cast<const uint8_t*>(head->data());
  if (std::memcmp(h + 4, L::kPtdIdentifier, 4) != 0 || std::memcmp(h + L::kPtdMagicAt, L::kPtdHeaderMagic, 4) != 0) {
    return std::string("it does not start as one (identifier FT01, header FH01)");
  }
  const uint32_t header_length = read_at<uint32_t>(h, L::kPtdHeaderLengthAt);
  const uint64_t flatbuffer_offset = read_at<uint64_t>(h, L::kPtdFlatbufferOffsetAt);
  const uint64_t flatbuffer_size = read_at<uint64_t>(h, L::kPtdFlatbufferSizeAt);
  const uint64_t segment_base = read_at<uint64_t>(h, L::kPtdSegmentBaseOffsetAt);
  const uint64_t segment_data = read_at<uint64_t>(h, L::kPtdSegmentDataSizeAt);
  head->Free();
  if (header_length < L::kPtdHeaderLength) {
    return "its header is " + std::to_string(header_length) + " bytes long, fewer than " +
        std::to_string(L::kPtdHeaderLength);
  }
  if (flatbuffer_offset > *file_size || flatbuffer_size > *file_size - flatbuffer_offset ||
      flatbuffer_offset + flatbuffer_size < kHeaderEnd || segment_base > *file_size ||
      segment_data > *file_size - segment_base) {
    return "its header places its tables or data outside its " + std::to_string(*file_size) + " bytes";
  }
  const size_t tables_size = flatbuffer_offset + flatbuffer_size;
  auto tables = loader.load(0, tables_size, info);
  if (!tables.ok()) {
    return std::string("its tables cannot be read");
  }
  FlatReader r(static_cast<const uint8_t*>(tables->data()), tables_size);
  const std::string outside = "a table points outside its tables";
  const size_t root = r.target(0);
  if (!r.ok()) {
    return outside;
  }
  if (root < L::kPtdMagicAt) {
    return std::string("its root table lies outside its tables");
  }
  const uint32_t version = r.scalar<uint32_t>(root, L::FlatTensor::kVersion);
  if (!r.ok()) {
    return outside;
  }
  if (version > L::kPtdMaxSchemaVersion) {
    return "it is of schema version " + std::to_string(version) + ", newer than this ExecuTorch reads (" +
        std::to_string(L::kPtdMaxSchemaVersion) + "): export it with the runtime's ExecuTorch";
  }
  const auto segments = r.tables(root, L::FlatTensor::kSegments);
  const auto named = r.tables(root, L::FlatTensor::kNamedData);
  if (!r.ok()) {
    return outside;
  }
  if (!segments || !named) {
    return std::string("its segment or named-data table is missing or damaged");
  }
  std::vector<uint64_t> segment_sizes;
  for (size_t i = 0; i < segments->size(); ++i) {
    const uint64_t offset = r.scalar<uint64_t>((*segments)[i], L::DataSegment::kOffset);
    const uint64_t size = r.scalar<uint64_t>((*segments)[i], L::DataSegment::kSize);
    if (!r.ok()) {
      return outside;
    }
    if (offset > segment_data || size > segment_data - offset) {
      return "segment " + std::to_string(i) + " lies outside its data (" + std::to_string(segment_data) + " bytes)";
    }
    segment_sizes.push_back(size);
  }
  for (size_t i = 0; i < named->size(); ++i) {
    auto problem = named_tensor_problem(r, (*named)[i], i, segment_sizes);
    if (!r.ok()) {
      return outside;
    }
    if (problem) {
      return problem;
    }
  }
  return std::nullopt;
}

} // namespace custom_ops_runner
