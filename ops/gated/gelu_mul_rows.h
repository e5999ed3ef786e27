// The elements of my_ops::gelu_mul: out = gelu_tanh(gate) * up, with gelu_tanh(g) = g / (1 + exp(-2z)) and
// z = sqrt(2/pi) * (g + 0.044715 g^3) in float, the gelu rounded to the dtype, then the product. That is
// 0.5 g (1 + tanh(z)) (ATen's and ExecuTorch's form) without its cancellation where tanh(z) nears -1, and with one exp
// in place of a tanh: float32 runs 16 elements at a time with AVX-512 (8 with AVX2) on kernel_helpers/vector_expf.h,
// whose bits are std::exp's, so the vector code and the scalar loop give the same bits (tests/cpp/vector_expf.cpp
// checks).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernel_helpers/elementwise_loop.h"
#include "kernel_helpers/vector_expf.h"

namespace custom {
namespace native {
namespace geglu {

constexpr float kMinusTwoSqrtTwoOverPi = -1.5957691216057308f;  // -2 * sqrt(2 / pi)
constexpr float kCubic = 0.044715f;

// exp(-2z), the one transcendental of gelu_tanh, for the scalar loop; the vector code computes the same operations.
inline float exp_of_minus_two_z(float g) {
  const float cubic = kCubic * (g * g * g);
  return std::exp(kMinusTwoSqrtTwoOverPi * (g + cubic));
}

#ifdef CUSTOM_OPS_X86_DISPATCH
// Elements [first, end) 16 at a time, as far as whole vectors go; returns where it stopped.
CUSTOM_OPS_AVX512 inline int64_t gelu_mul_avx512(const float* gate, const float* up, float* out, int64_t first,
                                                 int64_t end) {
  int64_t i = first;
  for (; i + 16 <= end; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 cubic = _mm512_mul_ps(_mm512_set1_ps(kCubic), _mm512_mul_ps(_mm512_mul_ps(g, g), g));
    const __m512 e = vector_expf::exp16(_mm512_mul_ps(_mm512_set1_ps(kMinusTwoSqrtTwoOverPi), _mm512_add_ps(g, cubic)));
    const __m512 gelu = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(gelu, _mm512_loadu_ps(up + i)));
  }
  return i;
}

CUSTOM_OPS_AVX2 inline int64_t gelu_mul_avx2(const float* gate, const float* up, float* out, int64_t first,
                                             int64_t end) {
  int64_t i = first;
  for (; i + 8 <= end; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 cubic = _mm256_mul_ps(_mm256_set1_ps(kCubic), _mm256_mul_ps(_mm256_mul_ps(g, g), g));
    const __m256 z = _mm256_mul_ps(_mm256_set1_ps(kMinusTwoSqrtTwoOverPi), _mm256_add_ps(g, cubic));
    const __m256 e = vector_expf::exp8_avx2(z);
    const __m256 gelu = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(gelu, _mm256_loadu_ps(up + i)));
  }
  return i;
}
#endif

// Elements [first, end); returns the path counter of the code that computed them (the vector code's where it ran).
template <typename T>
elementwise::Path gelu_mul_range(const T* gate, const T* up, T* out, int64_t first, int64_t end) {
  int64_t i = first;
  elementwise::Path path = elementwise::kBaselineElements;
#ifdef CUSTOM_OPS_X86_DISPATCH
  if constexpr (std::is_same_v<T, float>) {
    if (end - first >= 16 && vector_expf::isa() == simd::Isa::kAvx512) {
      i = gelu_mul_avx512(gate, up, out, first, end);
      path = elementwise::kAvx512Elements;
    } else if (end - first >= 8 && vector_expf::isa() == simd::Isa::kAvx2) {
      i = gelu_mul_avx2(gate, up, out, first, end);
      path = elementwise::kAvx2Elements;
    }
  }
#endif
  for (; i < end; ++i) {
    const float g = static_cast<float>(gate[i]);
    const T gelu = static_cast<T>(g / (1.0f + exp_of_minus_two_z(g)));
    out[i] = static_cast<T>(static_cast<float>(gelu) * static_cast<float>(up[i]));
  }
  return path;
}

} // namespace geglu
} // namespace native
} // namespace custom
