// The functor behind my_ops::mul3.out and my_ops::mul4.out (and the next "multiply by a constant" op): x * kFactor with
// PyTorch's semantics, matching `x * kFactor` in eager bit for bit. The kernels pass it to unary_elementwise_out<>()
// (kernel_helpers/unary_elementwise.h), which holds the out-variant contract and the fast loop; the CUDA kernel
// (ops/mul4/custom_ops_2_cuda.cu) calls it per element too.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernel_helpers/elementwise_functor.h"

namespace custom {
namespace native {

template <int64_t kFactor>
struct MultiplyBy {
  // x * k in half precision rounds once, like the float product rounded to half, when k has <= 11 significant bits.
  static constexpr bool kExactInHalf = kFactor >= -2048 && kFactor <= 2048;

  template <typename T>
  C10_HOST_DEVICE static constexpr T apply(T x) {
    if constexpr (std::is_integral_v<T>) {
      return elementwise::wrapping_mul(x, static_cast<T>(kFactor));  // wraps like PyTorch's integer mul
    } else {
      // float/double (Half and BFloat16 arrive as float and are rounded once), or a vector of halves (kExactInHalf)
      return x * static_cast<elementwise::lane_t<T>>(kFactor);
    }
  }
};

} // namespace native
} // namespace custom
