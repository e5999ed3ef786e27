// The contract between an elementwise op's functor and the helpers that run it (unary_elementwise.h on CPU, a CUDA
// kernel on GPU). Host and device code share this header, so it includes nothing but c10's macros.
//
// A functor is a struct with one static member template, called for every element:
//
//   struct Relu6 {
//     template <typename T>
//     C10_HOST_DEVICE static T apply(T x) { return x < T(0) ? T(0) : (x > T(6) ? T(6) : x); }
//   };
//
//   - T is the *compute type*: float, double, uint8_t, int8_t, int16_t, int32_t or int64_t. Half and BFloat16 elements
//     are widened to float, passed to apply<float>, and rounded back once by the helper, as ATen's CPU kernels do; the
//     functor never sees a half type.
//   - Integer overflow must wrap like PyTorch's (two's complement), never be undefined: use wrapping_mul/wrapping_add
//     below instead of `*` and `+` on T (8- and 16-bit operands are promoted to signed int by C++).
//   - apply must be pure (no state): the helpers call it from several threads and in any order.
//   - Optional: `static constexpr bool kExactInHalf = true;` promises that computing in half precision gives, bit for
//     bit, the float result rounded once to half (true of x * k for a k with at most 11 significant bits: the product
//     is exact in float, so there is only one rounding either way). apply<T> must then also compile for T a vector of
//     halves: spell constants as lane_t<T>. On AArch64 CPUs with half-precision arithmetic (FEAT_FP16) Half elements
//     are then computed eight per instruction without conversions.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include <c10/macros/Macros.h>

namespace custom {
namespace native {
namespace elementwise {

// The arithmetic type an element of T is computed in: float for the 16-bit float types, T itself otherwise.
template <typename T>
using compute_t = std::conditional_t<std::is_arithmetic_v<T>, T, float>;

// The element type of T: T itself for a scalar, the lane type for a compiler vector (kExactInHalf functors).
template <typename T, bool = std::is_arithmetic_v<T>>
struct lane {
  using type = T;
};
template <typename T>
struct lane<T, false> {
  using type = std::decay_t<decltype(std::declval<T>()[0])>;
};
template <typename T>
using lane_t = typename lane<T>::type;

// Whether Op declares kExactInHalf = true.
template <typename Op, typename = void>
constexpr bool exact_in_half = false;
template <typename Op>
constexpr bool exact_in_half<Op, std::void_t<decltype(Op::kExactInHalf)>> = Op::kExactInHalf;

// Integer arithmetic modulo 2^bits. The operands go through an unsigned type at least as wide as `unsigned`, so no
// promotion to signed int can overflow (uint16_t * uint16_t would be int * int otherwise).
template <typename T>
using wrapping_unsigned_t = std::common_type_t<std::make_unsigned_t<T>, unsigned>;

template <typename T>
C10_HOST_DEVICE constexpr T wrapping_mul(T a, T b) {
  static_assert(std::is_integral_v<T>, "wrapping_mul is for integer types");
  using U = wrapping_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
}

template <typename T>
C10_HOST_DEVICE constexpr T wrapping_add(T a, T b) {
  static_assert(std::is_integral_v<T>, "wrapping_add is for integer types");
  using U = wrapping_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
}

// One element of Op for storage type T: widen, apply, round once.
template <typename Op, typename T>
C10_HOST_DEVICE inline T apply_op(T x) {
  using C = compute_t<T>;
  return static_cast<T>(Op::template apply<C>(static_cast<C>(x)));
}

} // namespace elementwise
} // namespace native
} // namespace custom
