// The helper for row-wise ops (a reduction over the last dimension, then a pass over the row: norms, softmax, per-row
// quantization): the rows of a contiguous tensor split across the thread pool, whole rows per task, with the same
// grain as the elementwise loop so small inputs stay on the calling thread. Rows of 16-bit floats are widened to float
// a block at a time, in order, so a kernel accumulates in float; a kernel compiled for AVX2 or AVX-512 (vector.h's
// CUSTOM_OPS_AVX2 and CUSTOM_OPS_AVX512, chosen by simd::detected_isa()) converts whole blocks with it.
#pragma once

#include <algorithm>
#include <cstdint>

#include "elementwise_loop.h"
#include "kernel_contract.h"

namespace custom {
namespace native {
namespace rows {

// fn(first_row, end_row) over [0, rows); false when the pool did not run all of it.
template <typename Fn>
bool for_each_row(int64_t rows, int64_t bytes_per_row, const Fn& fn) {
  const int64_t grain =
      std::max<int64_t>(1, static_cast<int64_t>(elementwise::parallel_grain_bytes()) / std::max<int64_t>(1, bytes_per_row));
  if (rows < 2 * grain) {
    fn(int64_t{0}, rows);
    return true;
  }
  return contract::parallel_for(int64_t{0}, rows, grain, fn);
}

// Elements [begin, begin + n) of a row, n <= kBlock, as floats in `block` (exact for every floating type), in order:
// a reduction over the row must see the same order whatever the ISA, so its result does not depend on the CPU.
constexpr int64_t kBlock = elementwise::kConvertBlock;

#ifdef CUSTOM_OPS_X86_DISPATCH
// Whole blocks with AVX2 or AVX-512, in order (the elementwise loop's bfloat16 blocks are lane-permuted, which an
// elementwise op may ignore and a reduction may not): bfloat16 zero-extended and shifted, narrowed with the same
// rounding and packed back in order; half through the hardware conversions, which keep the order.
CUSTOM_OPS_AVX2 inline void widen_block_avx2(const c10::BFloat16* in, float* block) {
  for (int64_t k = 0; k < kBlock; k += 8) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(elementwise::bits_of(in) + k));
    _mm256_store_si256(reinterpret_cast<__m256i*>(block + k), _mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
  }
}

CUSTOM_OPS_AVX2 inline void narrow_block_avx2(const float* block, c10::BFloat16* out) {
  for (int64_t k = 0; k < kBlock; k += 16) {
    const auto* from = reinterpret_cast<const __m256i*>(block + k);
    const __m256i lo = elementwise::round_to_bfloat16_avx2(_mm256_load_si256(from));
    const __m256i hi = elementwise::round_to_bfloat16_avx2(_mm256_load_si256(from + 1));
    // packus interleaves the 128-bit lanes (lo 0-3, hi 0-3, lo 4-7, hi 4-7); the permute puts them back in order.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(elementwise::bits_of(out) + k), packed);
  }
}

CUSTOM_OPS_AVX2 inline void widen_block_avx2(const c10::Half* in, float* block) {
  elementwise::widen_block_avx2(in, block);
}

CUSTOM_OPS_AVX2 inline void narrow_block_avx2(const float* block, c10::Half* out) {
  elementwise::narrow_block_avx2(block, out);
}

CUSTOM_OPS_AVX512 inline void widen_block_avx512(const c10::BFloat16* in, float* block) {
  for (int64_t k = 0; k < kBlock; k += 16) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(elementwise::bits_of(in) + k));
    _mm512_store_si512(block + k, _mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
  }
}

CUSTOM_OPS_AVX512 inline void narrow_block_avx512(const float* block, c10::BFloat16* out) {
  for (int64_t k = 0; k < kBlock; k += 16) {
    const __m512i rounded = elementwise::round_to_bfloat16_avx512(_mm512_load_si512(block + k));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(elementwise::bits_of(out) + k), _mm512_cvtepi32_epi16(rounded));
  }
}

CUSTOM_OPS_AVX512 inline void widen_block_avx512(const c10::Half* in, float* block) {
  elementwise::widen_block_avx512(in, block);
}

CUSTOM_OPS_AVX512 inline void narrow_block_avx512(const float* block, c10::Half* out) {
  elementwise::narrow_block_avx512(block, out);
}
#endif

// V: the vector code of the function this is inlined into (see rms_norm's kernel), whole blocks converted with it.
template <typename T, simd::Isa V = simd::Isa::kBaseline>
CUSTOM_OPS_INLINE void load_floats(const T* in, float* block, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    std::copy(in, in + n, block);
  } else if (n == kBlock) {
#ifdef CUSTOM_OPS_X86_DISPATCH
    if constexpr (V == simd::Isa::kAvx512) {
      widen_block_avx512(in, block);
      return;
    } else if constexpr (V == simd::Isa::kAvx2) {
      widen_block_avx2(in, block);
      return;
    }
#endif
    elementwise::widen_block(in, block);  // in order: the portable conversion, or NEON's on AArch64
  } else {
    elementwise::widen(in, block, n);
  }
}

// Rounds n floats once to T.
template <typename T, simd::Isa V = simd::Isa::kBaseline>
CUSTOM_OPS_INLINE void store_floats(const float* block, T* out, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    std::copy(block, block + n, out);
  } else if (n == kBlock) {
#ifdef CUSTOM_OPS_X86_DISPATCH
    if constexpr (V == simd::Isa::kAvx512) {
      narrow_block_avx512(block, out);
      return;
    } else if constexpr (V == simd::Isa::kAvx2) {
      narrow_block_avx2(block, out);
      return;
    }
#endif
    elementwise::narrow_block(block, out);
  } else {
    elementwise::narrow(block, out, n);
  }
}

} // namespace rows
} // namespace native
} // namespace custom
