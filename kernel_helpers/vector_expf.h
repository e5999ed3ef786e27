// e^x for 16 floats at once (8 with AVX2) with the bits of glibc's expf (x86-64, glibc 2.28 and later, its FMA
// build), so that a vectorized kernel can replace a loop of std::exp and change no output: silu_mul's sigmoid
// (ops/gated/silu_mul_out.cpp), where ExecuTorch's sigmoid kernel calls std::exp and the export pass's fusion promises its bits.
// The method is that library's: in double, k = round(x * 32 / ln 2) and r the rest (two FMAs on x), 2^(k/32) from a
// table of 2^(i/32) with k / 32 added to its exponent, a cubic in r, one rounding to float. Lanes that glibc sends
// down its slow path (|x| >= 88, NaN, infinities) take std::exp itself. Any other libm may round differently, so the
// vector code runs only after a check against this process's std::exp agrees on 65536 inputs over every exponent
// (tests/cpp/vector_expf.cpp compares all 2^32 floats). AVX-512, and AVX2 (its table read with a gather); callers
// fall back to std::exp without either.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "elementwise_loop.h"

namespace custom {
namespace native {
namespace vector_expf {

#ifdef CUSTOM_OPS_X86_DISPATCH
// 2^(i/32) as a double's bits, less i/32 in its exponent field (i << 47): adding k << 47 then gives 2^(k/32).
// Generated with mpmath at 200 bits, each rounded to nearest.
alignas(64) inline constexpr uint64_t kPowers[32] = {
    0x3ff0000000000000ull, 0x3fefd9b0d3158574ull, 0x3fefb5586cf9890full, 0x3fef9301d0125b51ull,
    0x3fef72b83c7d517bull, 0x3fef54873168b9aaull, 0x3fef387a6e756238ull, 0x3fef1e9df51fdee1ull,
    0x3fef06fe0a31b715ull, 0x3feef1a7373aa9cbull, 0x3feedea64c123422ull, 0x3feece086061892dull,
    0x3feebfdad5362a27ull, 0x3feeb42b569d4f82ull, 0x3feeab07dd485429ull, 0x3feea47eb03a5585ull,
    0x3feea09e667f3bcdull, 0x3fee9f75e8ec5f74ull, 0x3feea11473eb0187ull, 0x3feea589994cce13ull,
    0x3feeace5422aa0dbull, 0x3feeb737b0cdc5e5ull, 0x3feec49182a3f090ull, 0x3feed503b23e255dull,
    0x3feee89f995ad3adull, 0x3feeff76f2fb5e47ull, 0x3fef199bdd85529cull, 0x3fef3720dcef9069ull,
    0x3fef5818dcfba487ull, 0x3fef7c97337b9b5full, 0x3fefa4afa2a490daull, 0x3fefd0765b6e4540ull,
};

CUSTOM_OPS_AVX512 inline __m256 exp8(__m256 x) {
  const __m512d xd = _mm512_cvtps_pd(x);
  const __m512d scaled_inverse_ln2 = _mm512_set1_pd(0x1.71547652b82fep+5), shift = _mm512_set1_pd(0x1.8p52);
  __m512d k = _mm512_fmadd_pd(scaled_inverse_ln2, xd, shift);  // k in the low bits, rounded to nearest
  const __m512i k_bits = _mm512_castpd_si512(k);
  k = _mm512_sub_pd(k, shift);
  const __m512d r = _mm512_fmsub_pd(scaled_inverse_ln2, xd, k);
  const __m512i i = _mm512_and_si512(k_bits, _mm512_set1_epi64(31));
  const __m512i low = _mm512_permutex2var_epi64(_mm512_load_si512(kPowers), i, _mm512_load_si512(kPowers + 8));
  const __m512i high = _mm512_permutex2var_epi64(_mm512_load_si512(kPowers + 16), i, _mm512_load_si512(kPowers + 24));
  const __m512i power = _mm512_mask_blend_epi64(_mm512_test_epi64_mask(i, _mm512_set1_epi64(16)), low, high);
  const __m512d scale = _mm512_castsi512_pd(_mm512_add_epi64(power, _mm512_slli_epi64(k_bits, 47)));
  const __m512d cubic = _mm512_fmadd_pd(_mm512_set1_pd(0x1.c6af84b912394p-20), r, _mm512_set1_pd(0x1.ebfce50fac4f3p-13));
  __m512d y = _mm512_fmadd_pd(r, _mm512_set1_pd(0x1.62e42ff0c52d6p-6), _mm512_set1_pd(1.0));
  y = _mm512_fmadd_pd(cubic, _mm512_mul_pd(r, r), y);
  return _mm512_cvtpd_ps(_mm512_mul_pd(y, scale));
}

// e^x of 16 floats.
CUSTOM_OPS_AVX512 inline __m512 exp16(__m512 x) {
  const __m512i top = _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(x), 20), _mm512_set1_epi32(0x7FF));
  const __mmask16 slow = _mm512_cmpgt_epu32_mask(top, _mm512_set1_epi32(0x42A));  // |x| >= 88, inf, NaN
  const __m256 low = exp8(_mm512_castps512_ps256(x));
  const __m256 high = exp8(_mm512_extractf32x8_ps(x, 1));
  __m512 e = _mm512_insertf32x8(_mm512_castps256_ps512(low), high, 1);
  if (slow != 0) {
    alignas(64) float lanes[16], results[16];
    _mm512_store_ps(lanes, x);
    _mm512_store_ps(results, e);
    for (int l = 0; l < 16; ++l) {
      if ((slow >> l) & 1) {
        results[l] = std::exp(lanes[l]);
      }
    }
    e = _mm512_load_ps(results);
  }
  return e;
}

// e^x of 4 floats with AVX2: exp8's operations on 4 doubles.
CUSTOM_OPS_AVX2 inline __m128 exp4_avx2(__m128 x) {
  const __m256d xd = _mm256_cvtps_pd(x);
  const __m256d scaled_inverse_ln2 = _mm256_set1_pd(0x1.71547652b82fep+5), shift = _mm256_set1_pd(0x1.8p52);
  __m256d k = _mm256_fmadd_pd(scaled_inverse_ln2, xd, shift);
  const __m256i k_bits = _mm256_castpd_si256(k);
  k = _mm256_sub_pd(k, shift);
  const __m256d r = _mm256_fmsub_pd(scaled_inverse_ln2, xd, k);
  const __m256i i = _mm256_and_si256(k_bits, _mm256_set1_epi64x(31));
  const __m256i power = _mm256_i64gather_epi64(reinterpret_cast<const long long*>(kPowers), i, 8);
  const __m256d scale = _mm256_castsi256_pd(_mm256_add_epi64(power, _mm256_slli_epi64(k_bits, 47)));
  const __m256d cubic =
      _mm256_fmadd_pd(_mm256_set1_pd(0x1.c6af84b912394p-20), r, _mm256_set1_pd(0x1.ebfce50fac4f3p-13));
  __m256d y = _mm256_fmadd_pd(r, _mm256_set1_pd(0x1.62e42ff0c52d6p-6), _mm256_set1_pd(1.0));
  y = _mm256_fmadd_pd(cubic, _mm256_mul_pd(r, r), y);
  return _mm256_cvtpd_ps(_mm256_mul_pd(y, scale));
}

// e^x of 8 floats with AVX2 (exp16's slow lanes likewise).
CUSTOM_OPS_AVX2 inline __m256 exp8_avx2(__m256 x) {
  const __m256i top = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(x), 20), _mm256_set1_epi32(0x7FF));
  const int slow = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(top, _mm256_set1_epi32(0x42A))));
  __m256 e = _mm256_set_m128(exp4_avx2(_mm256_extractf128_ps(x, 1)), exp4_avx2(_mm256_castps256_ps128(x)));
  if (slow != 0) {
    alignas(32) float lanes[8], results[8];
    _mm256_store_ps(lanes, x);
    _mm256_store_ps(results, e);
    for (int l = 0; l < 8; ++l) {
      if ((slow >> l) & 1) {
        results[l] = std::exp(lanes[l]);
      }
    }
    e = _mm256_load_ps(results);
  }
  return e;
}

// 16 exps from `in` to `out`, with each ISA's code: what the check below and tests/cpp/vector_expf.cpp compare.
CUSTOM_OPS_AVX512 inline void exp_block_avx512(const float* in, float* out) {
  _mm512_storeu_ps(out, exp16(_mm512_loadu_ps(in)));
}

CUSTOM_OPS_AVX2 inline void exp_block_avx2(const float* in, float* out) {
  _mm256_storeu_ps(out, exp8_avx2(_mm256_loadu_ps(in)));
  _mm256_storeu_ps(out + 8, exp8_avx2(_mm256_loadu_ps(in + 8)));
}

// Whether an ISA's vector exp gives this process's std::exp bits, checked once: 65536 inputs, every 65537th bit
// pattern (every exponent and sign, NaNs and infinities included).
inline bool agrees_with_libm(void (*exp_block)(const float* in, float* out)) {
  float in[16], out[16];
  for (uint32_t base = 0; base < 65536; base += 16) {
    for (uint32_t l = 0; l < 16; ++l) {
      const uint32_t bits = (base + l) * 65537u;
      std::memcpy(&in[l], &bits, sizeof(float));
    }
    exp_block(in, out);
    for (int l = 0; l < 16; ++l) {
      const float expected = std::exp(in[l]);
      if (std::memcmp(&expected, &out[l], sizeof(float)) != 0) {
        return false;
      }
    }
  }
  return true;
}
#endif

// The vector exp that runs here: the best ISA this CPU has (CUSTOM_OPS_ISA may cap it) whose code passed the check
// above; the baseline (no vector exp) otherwise.
inline simd::Isa isa() {
  using simd::Isa;
#ifdef CUSTOM_OPS_X86_DISPATCH
  static const Isa which = [] {
    switch (simd::detected_isa()) {
      case Isa::kAvx512:
        return agrees_with_libm(exp_block_avx512) ? Isa::kAvx512 : Isa::kBaseline;
      case Isa::kAvx2:
        return agrees_with_libm(exp_block_avx2) ? Isa::kAvx2 : Isa::kBaseline;
      case Isa::kBaseline:
        break;
    }
    return Isa::kBaseline;
  }();
  return which;
#else
  return Isa::kBaseline;
#endif
}

} // namespace vector_expf
} // namespace native
} // namespace custom
