// Compile-time checks of the functor contract (kernel_helpers/elementwise_functor.h): integer arithmetic wraps like
// PyTorch's and has no undefined behaviour. Signed overflow inside a constant expression is a compile error, so every
// static_assert below also proves its computation is free of it. tests/test_kernel_contract.py compiles this file.
#include <cstdint>

#include "kernel_helpers/elementwise_functor.h"
#include "kernel_helpers/multiply_by_constant.h"

using custom::native::MultiplyBy;
using custom::native::elementwise::wrapping_add;
using custom::native::elementwise::wrapping_mul;

// 16-bit operands: C++ promotes uint16_t/int16_t to (signed) int, where 0xFFFF * 0xFFFF overflows.
static_assert(wrapping_mul<uint16_t>(0xFFFF, 0xFFFF) == 1);
static_assert(MultiplyBy<-1>::apply<int16_t>(-1) == 1);
static_assert(MultiplyBy<-3>::apply<int16_t>(INT16_MIN) == INT16_MIN);  // -32768 * -3 = 98304 = 32768 mod 2^16
static_assert(MultiplyBy<4>::apply<int8_t>(100) == -112);              // 400 mod 256 = 144 = -112
static_assert(MultiplyBy<3>::apply<uint8_t>(200) == 88);               // 600 mod 256
static_assert(MultiplyBy<3>::apply<int32_t>(INT32_MAX) == 2147483645);  // wraps: 3 * (2^31 - 1) mod 2^32
static_assert(MultiplyBy<4>::apply<int64_t>(INT64_MIN) == 0);
static_assert(wrapping_add<int8_t>(127, 1) == -128);
static_assert(MultiplyBy<4>::apply<double>(0.5) == 2.0);

int main() {
  return 0;
}
