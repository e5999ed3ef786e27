// One row of the rotary embedding, rope's arithmetic: out[i] = x[i] * cos[i] - x[i + D/2] * sin[i] and
// out[i + D/2] = x[i + D/2] * cos[i + D/2] + x[i] * sin[i + D/2], each product and the sum rounded to the dtype as
// ATen's separate ops round them. Shared by my_ops::rope (rope_out.cpp) and my_ops::rope_sdpa_with_cache, which
// rotates q and k on their way into attention: both give the same bits. Include it only where floating-point
// contraction is off (the project's flags), or a multiply and an add would fuse and round once.
#pragma once

#include <cstdint>
#include <type_traits>

namespace custom {
namespace native {
namespace rope {

template <typename T>
inline void rotate_row(const T* x, const T* cos, const T* sin, T* out, int64_t cols) {
  const int64_t half = cols / 2;
  if constexpr (std::is_same_v<T, float>) {
    for (int64_t i = 0; i < half; ++i) {
      out[i] = x[i] * cos[i] + (-x[i + half]) * sin[i];
    }
    for (int64_t i = half; i < cols; ++i) {
      out[i] = x[i] * cos[i] + x[i - half] * sin[i];
    }
  } else {
    for (int64_t i = 0; i < cols; ++i) {
      const float rotated = i < half ? -static_cast<float>(x[i + half]) : static_cast<float>(x[i - half]);
      const float a = static_cast<float>(static_cast<T>(static_cast<float>(x[i]) * static_cast<float>(cos[i])));
      const float b = static_cast<float>(static_cast<T>(rotated * static_cast<float>(sin[i])));
      out[i] = static_cast<T>(a + b);
    }
  }
}

} // namespace rope
} // namespace native
} // namespace custom
