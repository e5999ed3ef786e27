// The helper for row-wise ops (a reduction over the last dimension, then a pass over the row: norms, softmax, per-row
// quantization): the rows of a contiguous tensor split across the thread pool, whole rows per task, with the same
// grain as the elementwise loop so small inputs stay on the calling thread. Rows of 16-bit floats are widened to float
// a block at a time (the elementwise loop's vector conversions), so a kernel accumulates in float.
#pragma once

#include <algorithm>
#include <cstdint>

#include "elementwise_loop.h"
#include "kernel_contract.h"

namespace custom {
namespace native {
namespace rows {

// fn(first_row, end_row) over [0, rows); false when the pool did not run all of it.
template <typename Fn>
bool for_each_row(int64_t rows, int64_t bytes_per_row, const Fn& fn) {
  const int64_t grain =
      std::max<int64_t>(1, static_cast<int64_t>(elementwise::parallel_grain_bytes()) / std::max<int64_t>(1, bytes_per_row));
  if (rows < 2 * grain) {
    fn(int64_t{0}, rows);
    return true;
  }
  return contract::parallel_for(int64_t{0}, rows, grain, fn);
}

// Elements [begin, begin + n) of a row, n <= kBlock, as floats in `block` (exact for every floating type).
constexpr int64_t kBlock = elementwise::kConvertBlock;

template <typename T>
inline void load_floats(const T* in, float* block, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    std::copy(in, in + n, block);
  } else if (n == kBlock) {
    elementwise::widen_block(in, block);
  } else {
    elementwise::widen(in, block, n);
  }
}

// Rounds n floats once to T.
template <typename T>
inline void store_floats(const float* block, T* out, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    std::copy(block, block + n, out);
  } else if (n == kBlock) {
    elementwise::narrow_block(block, out);
  } else {
    elementwise::narrow(block, out, n);
  }
}

} // namespace rows
} // namespace native
} // namespace custom
