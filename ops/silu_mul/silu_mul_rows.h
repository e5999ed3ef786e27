// The elements of my_ops::silu_mul, shared with my_ops::decoder_layer (the same bits in both): out = (gate *
// sigmoid(gate)) * up with sigmoid(g) = 1 / (1 + exp(-g)) in float, each of the three results rounded to the dtype, the
// operations of the ExecuTorch ops silu_mul replaces, in their order (silu_mul_out.cpp says why scalar exp).
#pragma once

#include <cmath>
#include <cstdint>

namespace custom {
namespace native {
namespace swiglu {

template <typename T>
void silu_mul_range(const T* gate, const T* up, T* out, int64_t first, int64_t end) {
  for (int64_t i = first; i < end; ++i) {
    const float g = static_cast<float>(gate[i]);
    const T sigmoid = static_cast<T>(1.0f / (1.0f + std::exp(-g)));
    const T silu = static_cast<T>(g * static_cast<float>(sigmoid));
    out[i] = static_cast<T>(static_cast<float>(silu) * static_cast<float>(up[i]));
  }
}

} // namespace swiglu
} // namespace native
} // namespace custom
