// The vector layer the kernels share (elementwise, row-wise, block formats, attention): which ISA runs (the CPU's
// features, the CUSTOM_OPS_ISA cap, the target attributes that compile one function for one ISA while the library
// runs on any CPU of its architecture), and lanes written once for every width with GCC's and Clang's vector
// extensions, which a function compiled for AVX-512, AVX2 or NEON inlines as that ISA's instructions: loads, bfloat16
// widening, selects, horizontal sums and maxima, and a fast exp. What only intrinsics say (the integer dot products,
// half-precision conversions, rounding to bfloat16) lives beside the kernels that need it, one header per ISA
// (block_tiles_<isa>.h, elementwise_loop.h); the exp with glibc's bits, for ops that promise ExecuTorch's, is
// vector_expf.h.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define CUSTOM_OPS_X86_DISPATCH 1
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#ifndef HWCAP2_I8MM  // kernel headers before Linux 5.10
#define HWCAP2_I8MM (1 << 13)
#endif
#endif

// ---- Targets: one function compiled for one ISA, run only where the CPU has it ------------------------------------
#ifdef CUSTOM_OPS_X86_DISPATCH
#define CUSTOM_OPS_AVX2 __attribute__((target("avx2,fma,f16c")))
#define CUSTOM_OPS_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define CUSTOM_OPS_AVX512_VNNI \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#endif
#if defined(__aarch64__)
#define CUSTOM_OPS_DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))
#define CUSTOM_OPS_I8MM __attribute__((target("arch=armv8.2-a+dotprod+i8mm")))
#define CUSTOM_OPS_HALF_ARITHMETIC __attribute__((target("arch=armv8.2-a+fp16")))
#endif

#define CUSTOM_OPS_INLINE inline __attribute__((always_inline))
// Loops over tokens, quads and chunks, unrolled: their accumulators then live in registers (without it GCC kept them
// in memory, a store and a reload on every step of a dot, which tripled a decode step's time).
#if defined(__clang__)
#define CUSTOM_OPS_UNROLL _Pragma("unroll")
#else
#define CUSTOM_OPS_UNROLL _Pragma("GCC unroll 16")
#endif

// Vectors are only ever passed between always-inlined functions, never across a call: the compilers' note that
// passing them changed ABI does not apply (so it stays off in a source that includes this header, and a source whose
// own pragmas or precompiled header undo that says CUSTOM_OPS_NO_VECTOR_ABI_NOTE again; a function compiled for a
// target turns it on again, so the functions here take vectors by reference). Clang makes a vector passed by
// value between an AVX-512 function and one without the feature an error, inlined or not: an ISA's code hands shared
// formulas pointers and references only.
#if defined(__clang__)
#define CUSTOM_OPS_NO_VECTOR_ABI_NOTE _Pragma("clang diagnostic ignored \"-Wpsabi\"")
#elif defined(__GNUC__)
#define CUSTOM_OPS_NO_VECTOR_ABI_NOTE _Pragma("GCC diagnostic ignored \"-Wpsabi\"")
#else
#define CUSTOM_OPS_NO_VECTOR_ABI_NOTE
#endif
CUSTOM_OPS_NO_VECTOR_ABI_NOTE

namespace custom {
namespace native {
namespace simd {

// ---- Which ISA runs -----------------------------------------------------------------------------------------------
enum class Isa { kBaseline, kAvx2, kAvx512 };  // x86-64's levels; ARM64 asks for its features by name below

// CUSTOM_OPS_ISA caps the vector ISA for tests: 0 baseline, 1 AVX2, 2 AVX-512; unset or unknown: no cap.
inline int isa_cap() {
  static const int cap = [] {
    const char* text = std::getenv("CUSTOM_OPS_ISA");
    const char* names[] = {"baseline", "avx2", "avx512"};
    for (int level = 0; text != nullptr && level < 3; ++level) {
      if (std::strcmp(text, names[level]) == 0) {
        return level;
      }
    }
    return 3;
  }();
  return cap;
}

inline bool isa_capped_to_baseline() {
  return isa_cap() == 0;
}

#ifdef CUSTOM_OPS_X86_DISPATCH
// F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports has no "f16c".
inline bool cpu_supports_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
}

// A variant runs only on a CPU that has every feature it was compiled for (and within CUSTOM_OPS_ISA's cap).
inline Isa detected_isa() {
  static const Isa isa = [] {
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_supports_f16c();
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    const int level = std::min(avx512 ? 2 : avx2 ? 1 : 0, isa_cap());
    return level == 2 ? Isa::kAvx512 : level == 1 ? Isa::kAvx2 : Isa::kBaseline;
  }();
  return isa;
}

// AVX-512 VNNI (vpdpbusd) on top of detected_isa()'s AVX-512.
inline bool cpu_has_avx512_vnni() {
  static const bool has = detected_isa() == Isa::kAvx512 && __builtin_cpu_supports("avx512vnni");
  return has;
}
#else
inline Isa detected_isa() {
  return Isa::kBaseline;
}
#endif

#if defined(__aarch64__) && defined(__linux__)
// FEAT_DotProd (sdot/udot, ARMv8.2-A), FEAT_I8MM and FEAT_FP16 (half-precision arithmetic), as the kernel's HWCAP
// reports them; CUSTOM_OPS_ISA=baseline turns them off.
inline bool cpu_has_dot_product() {
  static const bool has = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0 && !isa_capped_to_baseline();
  return has;
}

// FEAT_I8MM (smmla: a 2x8 by 8x2 matrix product of bytes, ARMv8.6-A; Neoverse V1/N2, Cortex-X2/A710 on, Apple M2),
// on top of the dot product.
inline bool cpu_has_i8mm() {
  static const bool has = (getauxval(AT_HWCAP2) & HWCAP2_I8MM) != 0 && cpu_has_dot_product();
  return has;
}

inline bool cpu_has_half_arithmetic() {
  static const bool has = (getauxval(AT_HWCAP) & (HWCAP_FPHP | HWCAP_ASIMDHP)) == (HWCAP_FPHP | HWCAP_ASIMDHP) &&
      !isa_capped_to_baseline();
  return has;
}
#endif

// ---- Lanes: W floats or 32-bit integers, W = 4, 8 or 16 ----------------------------------------------------------
// +, -, *, <<, >>, &, | and comparisons (-1 where true) mean the same on a scalar and on W of them.
template <int W>
struct Vec;
#define CUSTOM_OPS_VEC(W)                                  \
  template <>                                              \
  struct Vec<W> {                                          \
    typedef float F __attribute__((vector_size(4 * W)));   \
    typedef int32_t I __attribute__((vector_size(4 * W))); \
    typedef uint32_t U __attribute__((vector_size(4 * W))); \
  };
CUSTOM_OPS_VEC(4)
CUSTOM_OPS_VEC(8)
CUSTOM_OPS_VEC(16)
#undef CUSTOM_OPS_VEC

template <int W>
using F = typename Vec<W>::F;
template <int W>
using I = typename Vec<W>::I;
template <int W>
using U = typename Vec<W>::U;

template <class To, class From>
CUSTOM_OPS_INLINE To bit_cast(const From& from) {
  static_assert(sizeof(To) == sizeof(From));
  To to;
  std::memcpy(&to, &from, sizeof(To));
  return to;
}

// The same lanes read as signed or unsigned (a sub-scale may be negative, a code never is).
template <class V>
CUSTOM_OPS_INLINE auto as_signed(const V& v) {
  if constexpr (std::is_arithmetic_v<V>) {
    return static_cast<int32_t>(v);
  } else {
    return bit_cast<I<sizeof(V) / 4>>(v);
  }
}
template <class V>
CUSTOM_OPS_INLINE auto as_unsigned(const V& v) {
  if constexpr (std::is_arithmetic_v<V>) {
    return static_cast<uint32_t>(v);
  } else {
    return bit_cast<U<sizeof(V) / 4>>(v);
  }
}

template <int W>
CUSTOM_OPS_INLINE F<W> load(const float* p) {
  F<W> v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

template <int W>
CUSTOM_OPS_INLINE void store(float* p, const F<W>& v) {
  std::memcpy(p, &v, sizeof(v));
}

template <int W>
CUSTOM_OPS_INLINE F<W> splat(float x) {
  return F<W>{} + x;
}

// mask lanes (-1) take a, the others b.
template <int W>
CUSTOM_OPS_INLINE F<W> select(const I<W>& mask, const F<W>& a, const F<W>& b) {
  return bit_cast<F<W>>((mask & bit_cast<I<W>>(a)) | (~mask & bit_cast<I<W>>(b)));
}

// BFloat16 is the top half of a float. 2W bfloat16 values read as W 32-bit lanes: lane i holds value 2i in its low
// half and 2i + 1 in its high half, so the even values are the lanes shifted left by 16 and the odd ones the lanes
// with the low half cleared. Two integer operations widen 2W values on every ISA (GCC splits a zero-extending
// conversion to 512 bits into halves and inserts: five shuffles for 16 lanes, the hottest instructions of bfloat16
// attention in perf); the price is the order, evens then odds, which the caller keeps in its float copies.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "value 2i is the low half of lane i");

template <int W>
CUSTOM_OPS_INLINE U<W> load_pairs(const void* bfloat16s) {
  U<W> v;
  std::memcpy(&v, bfloat16s, sizeof(v));
  return v;
}

template <int W>
CUSTOM_OPS_INLINE F<W> evens(const U<W>& pairs) {
  return bit_cast<F<W>>(pairs << 16);
}

template <int W>
CUSTOM_OPS_INLINE F<W> odds(const U<W>& pairs) {
  return bit_cast<F<W>>(pairs & 0xFFFF0000u);
}

// A vector's two halves added: W / 2 lanes whose sum is the vector's.
template <int W>
CUSTOM_OPS_INLINE F<W / 2> halves_added(const F<W>& v) {
  F<W / 2> low, high;
  std::memcpy(&low, &v, sizeof(low));
  std::memcpy(&high, reinterpret_cast<const char*>(&v) + sizeof(low), sizeof(high));
  return low + high;
}

// The lanes' sum as halves added: (v0 + v2) + (v1 + v3) of the four that remain, what vhaddps-free x86 code does
// with one extract, movehl and movehdup.
template <int W>
CUSTOM_OPS_INLINE float sum(const F<W>& v) {
  if constexpr (W == 4) {
    return (v[0] + v[2]) + (v[1] + v[3]);
  } else {
    return sum<W / 2>(halves_added<W>(v));
  }
}

// Lane i: the sum of v[i]'s lanes, for W vectors of W lanes (W = 4 or 8). Each level adds the two halves of a pair
// of vectors into one (a transpose that adds): W - 1 adds for the W sums, where one sum at a time takes log2(W) each
// and a scalar store. Halves of 128 bits first, then within them, so every shuffle but the first level's stays in a
// 128-bit lane (vshufps on x86).
template <int W>
CUSTOM_OPS_INLINE F<W> lane_sums(const F<W> (&v)[W]) {
  static_assert(W == 4 || W == 8, "lane_sums adds 4 or 8 vectors");
  if constexpr (W == 4) {
    const F<4> ab = __builtin_shufflevector(v[0], v[1], 0, 1, 4, 5) + __builtin_shufflevector(v[0], v[1], 2, 3, 6, 7);
    const F<4> cd = __builtin_shufflevector(v[2], v[3], 0, 1, 4, 5) + __builtin_shufflevector(v[2], v[3], 2, 3, 6, 7);
    return __builtin_shufflevector(ab, cd, 0, 2, 4, 6) + __builtin_shufflevector(ab, cd, 1, 3, 5, 7);
  } else {
    F<8> halves[4];  // halves[i]: v[i]'s four partial sums, then v[i + 4]'s
    for (int i = 0; i < 4; ++i) {
      halves[i] = __builtin_shufflevector(v[i], v[i + 4], 0, 1, 2, 3, 8, 9, 10, 11) +
                  __builtin_shufflevector(v[i], v[i + 4], 4, 5, 6, 7, 12, 13, 14, 15);
    }
    // Two partial sums each: v[0], v[1] | v[4], v[5]; and v[2], v[3] | v[6], v[7].
    const F<8> low = __builtin_shufflevector(halves[0], halves[1], 0, 1, 8, 9, 4, 5, 12, 13) +
                     __builtin_shufflevector(halves[0], halves[1], 2, 3, 10, 11, 6, 7, 14, 15);
    const F<8> high = __builtin_shufflevector(halves[2], halves[3], 0, 1, 8, 9, 4, 5, 12, 13) +
                      __builtin_shufflevector(halves[2], halves[3], 2, 3, 10, 11, 6, 7, 14, 15);
    return __builtin_shufflevector(low, high, 0, 2, 8, 10, 4, 6, 12, 14) +
           __builtin_shufflevector(low, high, 1, 3, 9, 11, 5, 7, 13, 15);
  }
}

// The largest lane, first to last (a NaN in lane 0 stays; one after it is passed over).
template <int W>
CUSTOM_OPS_INLINE float max(const F<W>& v) {
  float m = v[0];
  for (int k = 1; k < W; ++k) {
    m = v[k] > m ? v[k] : m;
  }
  return m;
}

// ---- Fast exp ----------------------------------------------------------------------------------------------------
// e^x for x <= 0 (softmax's scores minus their running maximum), within 2 ulp; -inf and x below float's range give
// exactly 0, NaN stays NaN. Cody-Waite reduction to r in [-ln2/2, ln2/2], then Cephes' degree-5 polynomial for e^r,
// its multiply-adds fused where the ISA has FMA (this exp promises a tolerance, not bits; GCC fuses them where the
// caller's code may, after inlining).
template <int W>
CUSTOM_OPS_INLINE F<W> exp_nonpositive(const F<W>& value) {
#if defined(__clang__)
#pragma clang fp contract(fast)
#endif
  const F<W> lowest = splat<W>(-87.33654f);  // e^lowest = 2^-126, the smallest normal float
  const I<W> underflow = value < lowest;
  const F<W> x = select<W>(underflow, lowest, value);
  const F<W> y = x * 1.44269504088896341f + 0.5f;
  I<W> n = __builtin_convertvector(y, I<W>);  // truncated ...
  n += __builtin_convertvector(n, F<W>) > y;  // ... to floor(y): -1 where truncation rounded up
  const F<W> nf = __builtin_convertvector(n, F<W>);
  const F<W> r = (x - nf * 0.693359375f) + nf * 2.12194440e-4f;
  F<W> p = splat<W>(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const F<W> e = (p * r * r + r) + 1.0f;
  return select<W>(underflow, F<W>{}, e * bit_cast<F<W>>((n + 127) << 23));
}

}  // namespace simd
}  // namespace native
}  // namespace custom
