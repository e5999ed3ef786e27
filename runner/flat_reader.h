// A bounds-checked reader of FlatBuffers tables, for the runner's checks of untrusted programs (xnnpack_payload.cpp,
// kernel_calls.cpp): the wheel ships neither the .pte schemas' generated headers nor flatbuffers'. Every read past the
// buffer, or through an offset pointing outside it, makes ok() false and returns zeros, never reads out of bounds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace custom_ops_runner {

class FlatReader {
 public:
  FlatReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool ok() const { return ok_; }

  template <typename T>
  T read(size_t pos) {
    T value{};
    if (!ok_ || pos > size_ || size_ - pos < sizeof(T)) {
      ok_ = false;
      return value;
    }
    std::memcpy(&value, data_ + pos, sizeof(T));
    return value;
  }

  size_t target(size_t pos) {
    const uint32_t offset = read<uint32_t>(pos);
    if (!ok_ || offset == 0 || offset >= size_ - pos) {
      ok_ = false;
      return 0;
    }
    return pos + offset;
  }

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

  // A vector field's (position, length), once its elements of `width` bytes are known to lie inside the buffer.
  std::optional<std::pair<size_t, uint32_t>> vector(size_t table, int slot, size_t width) {
    const size_t at = child(table, slot);
    if (at == 0) {
      return std::nullopt;
    }
    const uint32_t n = read<uint32_t>(at);
    if (!ok_ || static_cast<uint64_t>(n) * width > size_ - at - 4) {
      ok_ = false;
      return std::nullopt;
    }
    return std::make_pair(at, n);
  }

  template <typename T>
  std::optional<std::vector<T>> scalars(size_t table, int slot) {
    auto found = vector(table, slot, sizeof(T));
    if (!found) {
      return std::nullopt;
    }
    std::vector<T> values(found->second);
    for (uint32_t i = 0; i < found->second; ++i) {
      values[i] = read<T>(found->first + 4 + i * sizeof(T));
    }
    return values;
  }

  std::optional<std::vector<size_t>> tables(size_t table, int slot) {
    auto found = vector(table, slot, 4);
    if (!found) {
      return std::nullopt;
    }
    std::vector<size_t> positions(found->second);
    for (uint32_t i = 0; ok_ && i < found->second; ++i) {
      positions[i] = target(found->first + 4 + 4 * size_t{i});
    }
    return positions;
  }

  std::optional<std::string> string(size_t table, int slot) {
    auto found = vector(table, slot, 1);
    if (!found || !ok_) {
      return std::nullopt;
    }
    return std::string(reinterpret_cast<const char*>(data_ + found->first + 4), found->second);
  }

 private:
  const uint8_t* data_;
  size_t size_;
  bool ok_ = true;
};

}  // namespace custom_ops_runner
