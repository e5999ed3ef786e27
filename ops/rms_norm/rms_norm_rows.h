// rms_norm's row code, shared by my_ops::rms_norm and my_ops::add_rms_norm (whose norm must give rms_norm's bits, so
// that the export pass's fusion changes no output): y = x / sqrt(mean(x^2) + eps) * weight per row, one read for the
// sum of squares and one read-and-write pass, in float for the half types; on a CPU with AVX2 or AVX-512 a variant
// compiled for it (the same sums in the same order: the same bits), AVX-512's bfloat16 rows converted in registers.
#pragma once

#include <cmath>

#include "kernel_helpers/kernel_contract.h"
#include "kernel_helpers/row_wise.h"

namespace custom {
namespace native {
namespace norm {

// Sums of squares are kept in 64 partial sums (lane k adds x[k]^2, x[k + 64]^2, ... in order), then added pairwise:
// four independent 16-lane vector sums in flight on AVX-512, and one order of additions on every ISA (the same bits).
constexpr int kPartialSums = 64;
static_assert(rows::kBlock % kPartialSums == 0, "a block's index modulo 64 must be the row's");

CUSTOM_OPS_INLINE void sum_of_squares(const float* x, int64_t n, float (&acc)[kPartialSums]) {
  int64_t i = 0;
  for (; i + kPartialSums <= n; i += kPartialSums) {
    for (int k = 0; k < kPartialSums; ++k) {
      acc[k] += x[i + k] * x[i + k];
    }
  }
  for (; i < n; ++i) {
    acc[i % kPartialSums] += x[i] * x[i];
  }
}

CUSTOM_OPS_INLINE float add_pairwise(float (&acc)[kPartialSums]) {
  for (int width = kPartialSums / 2; width > 0; width /= 2) {
    for (int k = 0; k < width; ++k) {
      acc[k] += acc[k + width];
    }
  }
  return acc[0];
}

// V: the vector code of the function this is inlined into (rms_norm_rows_avx2, rms_norm_rows_avx512).
template <typename T, simd::Isa V>
CUSTOM_OPS_INLINE void rms_norm_rows_body(const T* in, const T* weight, T* out, int64_t first, int64_t end,
                                          int64_t cols, float eps) {
  alignas(64) float x[rows::kBlock];
  alignas(64) float w[rows::kBlock];
  for (int64_t r = first; r < end; ++r) {
    const T* row = in + r * cols;
    T* out_row = out + r * cols;
    float acc[kPartialSums] = {};
    for (int64_t c = 0; c < cols; c += rows::kBlock) {
      const int64_t n = std::min(rows::kBlock, cols - c);
      if constexpr (std::is_same_v<T, float>) {
        sum_of_squares(row + c, n, acc);
      } else {
        rows::load_floats<T, V>(row + c, x, n);
        sum_of_squares(x, n, acc);
      }
    }
    const float inv_rms = 1.0f / std::sqrt(add_pairwise(acc) / static_cast<float>(cols) + eps);
    for (int64_t c = 0; c < cols; c += rows::kBlock) {
      const int64_t n = std::min(rows::kBlock, cols - c);
      if constexpr (std::is_same_v<T, float>) {
        for (int64_t i = 0; i < n; ++i) {
          out_row[c + i] = row[c + i] * inv_rms * weight[c + i];
        }
      } else {
        rows::load_floats<T, V>(row + c, x, n);
        rows::load_floats<T, V>(weight + c, w, n);
        for (int64_t i = 0; i < n; ++i) {
          x[i] = x[i] * inv_rms * w[i];
        }
        rows::store_floats<T, V>(x, out_row + c, n);
      }
    }
  }
}

template <typename T>
void rms_norm_rows(const T* in, const T* weight, T* out, int64_t first, int64_t end, int64_t cols, float eps) {
  rms_norm_rows_body<T, simd::Isa::kBaseline>(in, weight, out, first, end, cols, eps);
}

#ifdef CUSTOM_OPS_X86_DISPATCH
template <typename T>
CUSTOM_OPS_AVX2 void rms_norm_rows_avx2(const T* in, const T* weight, T* out, int64_t first, int64_t end, int64_t cols,
                                        float eps) {
  rms_norm_rows_body<T, simd::Isa::kAvx2>(in, weight, out, first, end, cols, eps);
}

// 16 bfloat16 as floats, in order (masked-off lanes read nothing and are zero).
CUSTOM_OPS_AVX512 inline __m512 widen_bfloat16_avx512(const c10::BFloat16* p, __mmask16 lanes) {
  const __m256i bits = _mm256_maskz_loadu_epi16(lanes, elementwise::bits_of(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// Elements [c, c + n) of a row, n <= 32, as two float vectors holding elements {0-3, 8-11, 16-19, 24-27} and
// {4-7, 12-15, 20-23, 28-31}: the order in which _mm512_packus_epi32 puts them back.
CUSTOM_OPS_AVX512 inline void widen_32_bfloat16_avx512(const c10::BFloat16* p, __mmask32 lanes, __m512& lo,
                                                       __m512& hi) {
  const __m512i bits = _mm512_maskz_loadu_epi16(lanes, elementwise::bits_of(p));
  lo = _mm512_castsi512_ps(_mm512_unpacklo_epi16(_mm512_setzero_si512(), bits));
  hi = _mm512_castsi512_ps(_mm512_unpackhi_epi16(_mm512_setzero_si512(), bits));
}

// 32 outputs (x * scale) * w from elements [c, c + 32) of a row and the weight, packed in order.
CUSTOM_OPS_AVX512 inline __m512i normalized(const c10::BFloat16* row, const c10::BFloat16* weight, __m512 scale,
                                            int64_t c, __mmask32 lanes) {
  __m512 x_lo, x_hi, w_lo, w_hi;
  widen_32_bfloat16_avx512(row + c, lanes, x_lo, x_hi);
  widen_32_bfloat16_avx512(weight + c, lanes, w_lo, w_hi);
  const __m512i lo =
      elementwise::round_to_bfloat16_avx512(_mm512_castps_si512(_mm512_mul_ps(_mm512_mul_ps(x_lo, scale), w_lo)));
  const __m512i hi =
      elementwise::round_to_bfloat16_avx512(_mm512_castps_si512(_mm512_mul_ps(_mm512_mul_ps(x_hi, scale), w_hi)));
  return _mm512_packus_epi32(lo, hi);
}

inline __mmask32 first_lanes(int64_t n) { return n >= 32 ? ~__mmask32{0} : (__mmask32{1} << n) - 1; }

CUSTOM_OPS_AVX512 inline void add_squares(__m512& sum, __m512 v) { sum = _mm512_add_ps(sum, _mm512_mul_ps(v, v)); }

// bfloat16 rows, converted in registers (a float block's stores and loads cost more than the math here), with the
// operations of rms_norm_rows_body in the same order, so the same bits: the 64 partial sums in four vectors (masked
// loads add exact zeros past the row's end), added pairwise; each output (x * inv_rms) * w rounded once to nearest
// even. The output is written a whole cache line at a time; with `stream` (an output past the elementwise loop's
// streaming threshold, the same policy) with non-temporal stores, counted like that loop's 4 KiB blocks.
CUSTOM_OPS_AVX512 inline void rms_norm_rows_bfloat16_avx512(const c10::BFloat16* in, const c10::BFloat16* weight,
                                                            c10::BFloat16* out, int64_t first, int64_t end,
                                                            int64_t cols, float eps, bool stream) {
  uint64_t streamed_lines = 0;
  for (int64_t r = first; r < end; ++r) {
    const c10::BFloat16* row = in + r * cols;
    c10::BFloat16* out_row = out + r * cols;
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(), s3 = _mm512_setzero_ps();
    int64_t c = 0;
    for (; c + kPartialSums <= cols; c += kPartialSums) {
      add_squares(s0, widen_bfloat16_avx512(row + c, 0xFFFF));
      add_squares(s1, widen_bfloat16_avx512(row + c + 16, 0xFFFF));
      add_squares(s2, widen_bfloat16_avx512(row + c + 32, 0xFFFF));
      add_squares(s3, widen_bfloat16_avx512(row + c + 48, 0xFFFF));
    }
    __m512* sums[4] = {&s0, &s1, &s2, &s3};
    for (int k = 0; c + 16 * k < cols; ++k) {
      const __mmask16 lanes = static_cast<__mmask16>(first_lanes(cols - c - 16 * k));
      add_squares(*sums[k], widen_bfloat16_avx512(row + c + 16 * k, lanes));
    }
    alignas(64) float acc[kPartialSums];
    _mm512_store_ps(acc, s0);
    _mm512_store_ps(acc + 16, s1);
    _mm512_store_ps(acc + 32, s2);
    _mm512_store_ps(acc + 48, s3);
    const __m512 scale = _mm512_set1_ps(1.0f / std::sqrt(add_pairwise(acc) / static_cast<float>(cols) + eps));
    // A masked head up to the output's first cache-line boundary, whole lines (the next row's line prefetched with
    // each), then a masked tail.
    const int64_t to_line = (64 - reinterpret_cast<uintptr_t>(out_row) % 64) % 64 / 2;
    c = std::min(cols, to_line);
    if (c > 0) {
      _mm512_mask_storeu_epi16(elementwise::bits_of(out_row), first_lanes(c),
                               normalized(row, weight, scale, 0, first_lanes(c)));
    }
    const c10::BFloat16* next_row = r + 1 < end ? row + cols : row;
    for (; c + 32 <= cols; c += 32) {
      _mm_prefetch(reinterpret_cast<const char*>(next_row + c), _MM_HINT_T0);
      const __m512i y = normalized(row, weight, scale, c, ~__mmask32{0});
      if (stream) {
        _mm512_stream_si512(reinterpret_cast<__m512i*>(elementwise::bits_of(out_row + c)), y);
        ++streamed_lines;
      } else {
        _mm512_store_si512(elementwise::bits_of(out_row + c), y);
      }
    }
    if (c < cols) {
      _mm512_mask_storeu_epi16(elementwise::bits_of(out_row + c), first_lanes(cols - c),
                               normalized(row, weight, scale, c, first_lanes(cols - c)));
    }
  }
  if (stream) {
    _mm_sfence();  // streaming stores are weakly ordered: publish them before this thread reports the task done
    elementwise::count(elementwise::kStreamedBlocks, streamed_lines * 64 / 4096);
  }
}

template <typename T>
CUSTOM_OPS_AVX512 void rms_norm_rows_avx512(const T* in, const T* weight, T* out, int64_t first, int64_t end,
                                            int64_t cols, float eps, bool stream) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    rms_norm_rows_bfloat16_avx512(in, weight, out, first, end, cols, eps, stream);
  } else {
    rms_norm_rows_body<T, simd::Isa::kAvx512>(in, weight, out, first, end, cols, eps);
  }
}
#endif

enum class Isa { kBaseline, kAvx2, kAvx512, kAvx512Streaming };

// The variant rows of T run in, for an output of `bytes` (past the elementwise loop's streaming threshold, bfloat16
// rows on AVX-512 are written with non-temporal stores).
template <typename T>
Isa row_isa(size_t bytes) {
#ifdef CUSTOM_OPS_X86_DISPATCH
  switch (simd::detected_isa()) {
    case simd::Isa::kAvx512:
      return elementwise::streams(bytes) ? Isa::kAvx512Streaming : Isa::kAvx512;
    case simd::Isa::kAvx2:
      return Isa::kAvx2;
    case simd::Isa::kBaseline:
      break;
  }
#endif
  (void)bytes;
  return Isa::kBaseline;
}

// Rows [first, end) of `in` normalized into `out`.
template <typename T>
void normalize_rows(const T* in, const T* weight, T* out, int64_t first, int64_t end, int64_t cols, float eps,
                    Isa isa) {
#ifdef CUSTOM_OPS_X86_DISPATCH
  if (isa == Isa::kAvx2) {
    rms_norm_rows_avx2<T>(in, weight, out, first, end, cols, eps);
    return;
  }
  if (isa != Isa::kBaseline) {
    rms_norm_rows_avx512<T>(in, weight, out, first, end, cols, eps, isa == Isa::kAvx512Streaming);
    return;
  }
#endif
  (void)isa;
  rms_norm_rows<T>(in, weight, out, first, end, cols, eps);
}

// The path counters: elements by the ISA loop that computed them.
inline void count_rows(Isa isa, int64_t elements) {
  elementwise::count(isa == Isa::kBaseline ? elementwise::kBaselineElements
                     : isa == Isa::kAvx2     ? elementwise::kAvx2Elements
                                             : elementwise::kAvx512Elements,
                     static_cast<uint64_t>(elements));
}

// The weight scales the last dimension: shape [H], or with leading ones ([1, 1, H]).
inline bool weight_fits(const Tensor& in, const Tensor& weight) {
  return in.dim() >= 1 && weight.dim() >= 1 && weight.dim() <= in.dim() &&
      weight.size(weight.dim() - 1) == in.size(in.dim() - 1) && weight.numel() == in.size(in.dim() - 1);
}

} // namespace norm
} // namespace native
} // namespace custom
