// The elements of my_ops::silu_mul, shared with my_ops::decoder_layer (the same bits in both): out = (gate *
// sigmoid(gate)) * up with sigmoid(g) = 1 / (1 + exp(-g)) in float, each of the three results rounded to the dtype, the
// operations of the ExecuTorch ops silu_mul replaces, in their order (silu_mul_out.cpp says why std::exp's bits).
// float32 runs 16 elements at a time with AVX-512 (8 with AVX2) where kernel_helpers/vector_expf.h gives this libm's
// exp bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernel_helpers/elementwise_loop.h"
#include "kernel_helpers/vector_expf.h"

namespace custom {
namespace native {
namespace swiglu {

#ifdef CUSTOM_OPS_X86_DISPATCH
// Elements [first, end) 16 at a time, as far as whole vectors go; returns where it stopped.
CUSTOM_OPS_AVX512 inline int64_t silu_mul_avx512(const float* gate, const float* up, float* out, int64_t first,
                                                 int64_t end) {
  int64_t i = first;
  for (; i + 16 <= end; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 e = vector_expf::exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));  // exp(-g): -g exact
    const __m512 sigmoid = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_mul_ps(g, sigmoid), _mm512_loadu_ps(up + i)));
  }
  return i;
}

CUSTOM_OPS_AVX2 inline int64_t silu_mul_avx2(const float* gate, const float* up, float* out, int64_t first,
                                             int64_t end) {
  int64_t i = first;
  for (; i + 8 <= end; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = vector_expf::exp8_avx2(_mm256_sub_ps(_mm256_setzero_ps(), g));
    const __m256 sigmoid = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(g, sigmoid), _mm256_loadu_ps(up + i)));
  }
  return i;
}
#endif

// Elements [first, end); returns the path counter of the code that computed them (the vector code's where it ran).
template <typename T>
elementwise::Path silu_mul_range(const T* gate, const T* up, T* out, int64_t first, int64_t end) {
  int64_t i = first;
  elementwise::Path path = elementwise::kBaselineElements;
#ifdef CUSTOM_OPS_X86_DISPATCH
  if constexpr (std::is_same_v<T, float>) {
    if (end - first >= 16 && vector_expf::isa() == simd::Isa::kAvx512) {
      i = silu_mul_avx512(gate, up, out, first, end);
      path = elementwise::kAvx512Elements;
    } else if (end - first >= 8 && vector_expf::isa() == simd::Isa::kAvx2) {
      i = silu_mul_avx2(gate, up, out, first, end);
      path = elementwise::kAvx2Elements;
    }
  }
#endif
  for (; i < end; ++i) {
    const float g = static_cast<float>(gate[i]);
    const T sigmoid = static_cast<T>(1.0f / (1.0f + std::exp(-g)));
    const T silu = static_cast<T>(g * static_cast<float>(sigmoid));
    out[i] = static_cast<T>(static_cast<float>(silu) * static_cast<float>(up[i]));
  }
  return path;
}

} // namespace swiglu
} // namespace native
} // namespace custom
