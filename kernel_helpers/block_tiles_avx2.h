// The block formats' AVX2 tiles (the layout is block_layout.h's), for the x86-64 CPUs without AVX-512 VNNI: a group's
// 16 rows as two halves of 8, one row per 32-bit lane, each quad of codes multiplied with vpmaddubsw (unsigned codes
// times four signed activations broadcast, pairs added into 16 bits) and vpmaddwd (pairs into 32), as llama.cpp's x86
// quants do; the same integer sums as the AVX-512 tiles' vpdpbusd, so the same float arithmetic per lane gives the same
// bits. The row formats' decode rows and prefill panels on 256-bit FMA.
#pragma once

#include "block_layout.h"

#if defined(CUSTOM_OPS_X86_DISPATCH) && !defined(CUSTOM_OPS_BLOCKS_PORTABLE_ONLY)
namespace custom {
namespace native {
namespace blocks {

constexpr int kHalf = 8;  // rows a 256-bit vector holds

// Which of a half group's rows exist: `valid` of them (a short group's last half may have none to all).
struct HalfLanes {
  int64_t first;  // the half's first row in the group
  int valid;
  __m256i mask;   // lanes < valid, for vpmaskmov
};

CUSTOM_OPS_AVX2 CUSTOM_OPS_INLINE HalfLanes half_lanes(int64_t rows, int half) {
  const int valid = static_cast<int>(std::clamp<int64_t>(rows - half * kHalf, 0, kHalf));
  return {half * kHalf, valid,
          _mm256_cmpgt_epi32(_mm256_set1_epi32(valid), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))};
}

// Four bytes of each of the half's rows from a run of R rows' 4 bytes (missing rows read as zero, never past the
// tensor: vpmaskmovd does not touch masked-off lanes).
template <bool kFull>
CUSTOM_OPS_AVX2 CUSTOM_OPS_INLINE Words8 load_half(const uint8_t* p, const HalfLanes& h) {
  const auto* at = reinterpret_cast<const int*>(p + h.first * 4);
  return reinterpret_cast<Words8>(kFull ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at))
                                        : _mm256_maskload_epi32(at, h.mask));
}

// The half's fp16 values of one field (2 bytes a row) as floats.
template <bool kFull>
CUSTOM_OPS_AVX2 CUSTOM_OPS_INLINE Reals8 load_half_fp16(const uint8_t* p, const HalfLanes& h) {
  __m128i bits;
  if constexpr (kFull) {
    bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + h.first * 2));
  } else {  // no 16-bit masked load on AVX2: the valid rows' bytes copied
    alignas(16) uint16_t copy[kHalf] = {};
    std::memcpy(copy, p + h.first * 2, static_cast<size_t>(h.valid) * 2);
    bits = _mm_load_si128(reinterpret_cast<const __m128i*>(copy));
  }
  return reinterpret_cast<Reals8>(_mm256_cvtph_ps(bits));
}

template <class F, bool kFull>
CUSTOM_OPS_AVX2 CUSTOM_OPS_INLINE void half_record(const uint8_t* record, int64_t R, const HalfLanes& h, Words8* words,
                                                   Reals8* halves) {
  int offset = 0, w = 0, f = 0;
  CUSTOM_OPS_UNROLL
  for (int size : F::kFields) {
    const uint8_t* p = record + offset * R;
    if (size == 4) {
      words[w++] = load_half<kFull>(p, h);
    } else {
      halves[f++] = load_half_fp16<kFull>(p, h);
    }
    offset += size;
  }
}

// Activations, the same values as quantize_block's, 8 at a time (the division and the rounding, to nearest with ties
// to even, are IEEE operations; a maximum does not depend on its order): the scalar loop called libm's nearbyintf
// for every value.
CUSTOM_OPS_AVX2 CUSTOM_OPS_INLINE void quantize_block_avx2(const float* x, int64_t n, int8_t* q, float* d,
                                                           int32_t* sum16) {
  const __m256 infinity = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  __m256 amax = _mm256_setzero_ps(), finite = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  for (int64_t j = 0; j < n; j += 8) {
    const __m256 magnitude = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_loadu_ps(x + j));
    finite = _mm256_and_ps(finite, _mm256_cmp_ps(magnitude, infinity, _CMP_LT_OQ));  // false for NaN and infinities
    amax = _mm256_max_ps(amax, magnitude);
  }
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  const bool all_finite = _mm256_movemask_ps(finite) == 0xFF;
  const float scale = all_finite ? _mm_cvtss_f32(m) / 127.0f : std::numeric_limits<float>::quiet_NaN();
  const bool zero = !all_finite || scale == 0.0f;
  const __m256 s = _mm256_set1_ps(scale);
  constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  for (int64_t j = 0; j < n; j += 16) {
    __m256i lo = _mm256_setzero_si256(), hi = lo;
    if (!zero) {
      lo = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(x + j), s), kNearest));
      hi = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(x + j + 8), s), kNearest));
    }
    // 16 values in order: packs interleaves the 128-bit lanes, the permute puts them back.
    const __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32(lo, hi), 0xD8);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + j),
                     _mm_packs_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1)));
    const __m256i both = _mm256_add_epi32(lo, hi);
    __m128i sum = _mm_add_epi32(_mm256_castsi256_si128(both), _mm256_extracti128_si256(both, 1));
    sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, 0x4E));
    sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, 0xB1));
    sum16[j / 16] = _mm_cvtsi128_si32(sum);
  }
  *d = scale;
}

CUSTOM_OPS_AVX2 inline void prepare_blocks_avx2(const float* x, int64_t first, int64_t end, Activations& a) {
  for (int64_t b = first; b < end; ++b) {
    const int64_t value = b * a.block;
    quantize_block_avx2(x + value, a.block, &a.q[value], &a.d[b], &a.sum16[value / 16]);
  }
}

// Four activations of token t from input k, broadcast to every lane.
CUSTOM_OPS_AVX2 CUSTOM_OPS_INLINE __m256i four_avx2(const Activations& a, int64_t t, int64_t k) {
  int32_t bytes;
  std::memcpy(&bytes, a.row(t) + k, sizeof(bytes));
  return _mm256_set1_epi32(bytes);
}

// vpmaddubsw adds two products of an unsigned code and a signed activation (|q| <= 127) into 16 bits, saturating: codes
// of 8 bits (Q8_0's, offset 128) could pass 32767, so they are made signed (code - 128) and multiplied as
// |w| * (x with w's sign), under 2 * 128 * 127; narrower codes stay unsigned and several quads' pairs add in 16 bits
// before vpmaddwd, as many as cannot pass 32767.
template <class F>
constexpr bool signed_codes() {
  static_assert(chunks<F>() < 8 || F::kOffset == 128, "8-bit codes are made signed by subtracting 128");
  return chunks<F>() == 8;
}
template <class F>
constexpr int quads_in_16_bits() {
  if constexpr (signed_codes<F>()) {
    return 1;
  } else {
    const int largest_pair = 2 * ((1 << chunks<F>()) - 1) * 127;
    return std::clamp(32767 / largest_pair, 1, F::kSub / 4);
  }
}

// A sub-block's sub-mins times token t's sum of x over it (from input `first`), added to the token's min sums.
template <class F>
CUSTOM_OPS_AVX2 CUSTOM_OPS_INLINE void add_sub_min_avx2(const Activations& a, Words8 sub_min, int64_t t, int64_t first,
                                                        __m256i& mins) {
  mins = _mm256_add_epi32(mins, _mm256_mullo_epi32(reinterpret_cast<__m256i>(sub_min),
                                                   _mm256_set1_epi32(a.sum(t, first, F::kSub))));
}

// The integer sums of one half group and block against T tokens from t0, as block_sums_avx512 makes them (per token,
// the sub-block dots times their sub-scales, and the sub-mins times the sub-blocks' sums of x). A sub-scale multiplies
// the 16-bit pairs inside vpmaddwd (the row's scale in both halves of its lane), so a token's sub-block dot needs no
// register of its own; a format with an offset subtracts scale * offset * sum(x) once per sub-block. The integers are
// the same, added in another order (exact: wrapping 32-bit addition is associative, and multiplication distributes
// over it). With sub-scales read after the codes (record_after_codes), vpmaddwd multiplies by ones, each sub-block's
// raw dot goes to sub_dots, and scale_sub_dots_avx2 finishes them.
template <class F, int T, bool kFull>
CUSTOM_OPS_AVX2 CUSTOM_OPS_INLINE void half_block_sums(const Task& task, const uint8_t* block, int64_t R,
                                                       const HalfLanes& lanes, const Words8* words, int64_t b,
                                                       int64_t t0, __m256i* dots, __m256i* mins, __m256i* sub_dots) {
  constexpr int kPieces = F::kWeights / kBlock, kChunks = chunks<F>(), kQuads = F::kSub / 4;
  constexpr int kIn16 = quads_in_16_bits<F>();
  constexpr bool kDeferred = F::kSubScales && record_after_codes<F, T>();
  const Activations& a = *task.a;
  CUSTOM_OPS_UNROLL
  for (int t = 0; t < T; ++t) {
    dots[t] = mins[t] = _mm256_setzero_si256();
  }
  for (int i = 0; i < kPieces; ++i) {
    const uint8_t* quants = block + i * R * kChunks * 4;
    Words8 chunk[kChunks];
    CUSTOM_OPS_UNROLL
    for (int c = 0; c < kChunks; ++c) {
      if (lanes.first == 0) {  // the first half's pass asks for both halves' line
        ask_ahead<T>(quants + c * R * 4);
      }
      chunk[c] = load_half<kFull>(quants + c * R * 4, lanes);
    }
    CUSTOM_OPS_UNROLL
    for (int h = 0; h < kBlock / F::kSub; ++h) {
      const int s = i * (kBlock / F::kSub) + h;
      const int64_t first = b * F::kWeights + s * F::kSub;
      Words8 sub_scale = Words8{} + 1, sub_min = sub_scale;
      if constexpr (F::kSubScales && !kDeferred) {
        F::sub(words, s, sub_scale, sub_min);
      }
      // vpmaddwd's multiplier: the sub-scale (|scale| < 2^15) in both 16-bit halves of each row's lane, or ones.
      const __m256i scale_pairs = _mm256_or_si256(_mm256_and_si256(reinterpret_cast<__m256i>(sub_scale),
                                                                   _mm256_set1_epi32(0xFFFF)),
                                                  _mm256_slli_epi32(reinterpret_cast<__m256i>(sub_scale), 16));
      __m256i* into = dots;  // where this sub-block's products go: the block's sums, or (deferred) its own
      if constexpr (kDeferred) {
        into = &sub_dots[s];
        *into = _mm256_setzero_si256();
      }
      if constexpr (!signed_codes<F>() && F::kOffset != 0) {
        CUSTOM_OPS_UNROLL
        for (int t = 0; t < T; ++t) {
          const __m256i offset_sum = _mm256_set1_epi32(-F::kOffset * a.sum(t0 + t, first, F::kSub));
          into[t] = _mm256_add_epi32(into[t], F::kSubScales && !kDeferred
                                                  ? _mm256_mullo_epi32(reinterpret_cast<__m256i>(sub_scale), offset_sum)
                                                  : offset_sum);
        }
      }
      __m256i pairs[T];
      CUSTOM_OPS_UNROLL
      for (int q = 0; q < kQuads; ++q) {
        Words8 code;
        quad_codes<F>(chunk, h * kQuads + q, code);
        __m256i w = reinterpret_cast<__m256i>(code);
        if constexpr (signed_codes<F>()) {
          w = _mm256_xor_si256(w, _mm256_set1_epi8(static_cast<char>(0x80)));  // code - 128, as int8
        }
        CUSTOM_OPS_UNROLL
        for (int t = 0; t < T; ++t) {
          const __m256i x = four_avx2(a, t0 + t, first + 4 * q);
          const __m256i p = signed_codes<F>() ? _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w))
                                              : _mm256_maddubs_epi16(w, x);
          pairs[t] = q % kIn16 == 0 ? p : _mm256_add_epi16(pairs[t], p);
          if (q % kIn16 == kIn16 - 1 || q == kQuads - 1) {
            into[t] = _mm256_add_epi32(into[t], _mm256_madd_epi16(pairs[t], scale_pairs));
          }
        }
      }
      if constexpr (F::kSubScales && F::kHasMin && !kDeferred) {
        CUSTOM_OPS_UNROLL
        for (int t = 0; t < T; ++t) {
          add_sub_min_avx2<F>(a, sub_min, t0 + t, first, mins[t]);
        }
      }
    }
  }
}

// One token's half block sums from its raw sub-block dots, once the record's sub-scales are read: each dot times its
// sub-scale, and the sub-mins times the sub-blocks' sums of x (the integers half_block_sums makes record first).
template <class F>
CUSTOM_OPS_AVX2 CUSTOM_OPS_INLINE void scale_sub_dots_avx2(const Activations& a, const Words8* words,
                                                           const __m256i* sub_dots, int64_t b, int64_t t,
                                                           __m256i& dots, __m256i& mins) {
  dots = mins = _mm256_setzero_si256();
  CUSTOM_OPS_UNROLL
  for (int s = 0; s < F::kWeights / F::kSub; ++s) {
    Words8 sub_scale, sub_min;
    F::sub(words, s, sub_scale, sub_min);
    dots = _mm256_add_epi32(dots, _mm256_mullo_epi32(sub_dots[s], reinterpret_cast<__m256i>(sub_scale)));
    if constexpr (F::kHasMin) {
      add_sub_min_avx2<F>(a, sub_min, t, b * F::kWeights + s * F::kSub, mins);
    }
  }
}

// Group g (R rows; kFull: R = 16) against T tokens from t0, block after block, each block's halves one after the other
// (two passes over the group left the memory stream idle while the second ran from cache): per lane the float
// arithmetic of group_avx512, in its order.
template <class F, int T, bool kFull>
CUSTOM_OPS_AVX2 CUSTOM_OPS_INLINE void group_avx2(const Task& task, const Packed<F>& w, int64_t g, int64_t t0) {
  const Activations& a = *task.a;
  const int64_t R = kFull ? kGroup : w.rows(g);
  const int halves = R > kHalf ? 2 : 1;
  const HalfLanes lanes[2] = {half_lanes(R, 0), half_lanes(R, 1)};
  __m256 acc[2][T];
  CUSTOM_OPS_UNROLL
  for (int h = 0; h < 2; ++h) {
    CUSTOM_OPS_UNROLL
    for (int t = 0; t < T; ++t) {
      acc[h][t] = _mm256_setzero_ps();
    }
  }
  for (int64_t b = 0; b < w.blocks; ++b) {
    const uint8_t* block = w.block(g, b);
    CUSTOM_OPS_UNROLL
    for (int h = 0; h < 2; ++h) {
      if (!kFull && h >= halves) {
        break;
      }
      Words8 words[std::max(1, fields_of_size<F>(4))];
      Reals8 record_halves[std::max(1, fields_of_size<F>(2))];
      const uint8_t* record = block + R * quant_bytes<F>();
      constexpr bool kAfter = record_after_codes<F, T>();
      if constexpr (!kAfter) {
        half_record<F, kFull>(record, R, lanes[h], words, record_halves);
      }
      __m256i dots[T], mins[T], sub_dots[F::kSubScales && kAfter ? F::kWeights / F::kSub : 1];
      half_block_sums<F, T, kFull>(task, block, R, lanes[h], words, b, t0, dots, mins, sub_dots);
      if constexpr (kAfter) {
        half_record<F, kFull>(record, R, lanes[h], words, record_halves);
        if constexpr (F::kSubScales) {
          scale_sub_dots_avx2<F>(a, words, sub_dots, b, t0, dots[0], mins[0]);
        }
      }
      Reals8 scale, min = Reals8{};
      F::block(record_halves, scale, min);
      CUSTOM_OPS_UNROLL
      for (int t = 0; t < T; ++t) {
        const float dx = a.scale(t0 + t, b);
        acc[h][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[t]),
                                    _mm256_mul_ps(reinterpret_cast<__m256>(scale), _mm256_set1_ps(dx)), acc[h][t]);
        if constexpr (F::kHasMin && F::kSubScales) {
          acc[h][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mins[t]),
                                      _mm256_mul_ps(reinterpret_cast<__m256>(min), _mm256_set1_ps(dx)), acc[h][t]);
        } else if constexpr (F::kHasMin) {
          const float sum = static_cast<float>(a.sum(t0 + t, b * F::kWeights, F::kSub));
          acc[h][t] = _mm256_fmadd_ps(reinterpret_cast<__m256>(min), _mm256_set1_ps(dx * sum), acc[h][t]);
        }
      }
    }
  }
  CUSTOM_OPS_UNROLL
  for (int h = 0; h < 2; ++h) {
    CUSTOM_OPS_UNROLL
    for (int t = 0; t < T; ++t) {
      float* out = task.out + (t0 + t) * task.n + g * kGroup + lanes[h].first;
      if constexpr (kFull) {
        _mm256_storeu_ps(out, acc[h][t]);
      } else if (h < halves) {
        _mm256_maskstore_ps(out, lanes[h].mask, acc[h][t]);
      }
    }
  }
}

// The group tiles of format F for T tokens from t0, over groups [first, end).
template <class F>
struct GroupTilesAvx2 {
  template <int T>
  CUSTOM_OPS_AVX2 static void run(const Task& task, int64_t t0, int64_t first, int64_t end) {
    const Packed<F> w{static_cast<const uint8_t*>(task.weight), task.n, task.k / F::kWeights};
    for (int64_t g = first; g < end; ++g) {
      if (w.rows(g) == kGroup) {
        group_avx2<F, T, true>(task, w, g, t0);
      } else {
        group_avx2<F, T, false>(task, w, g, t0);
      }
    }
  }
};

// Tokens at a time, every format: with the sub-scales inside vpmaddwd a token's inner loop holds its dots and its
// 16-bit pairs; its float sums and sub-min sums, touched once a block or sub-block, may live in L1.
constexpr int kMaxTokensAvx2 = 4;

// ---- Row formats ----
// 8 weights of a row as floats.
template <class E>
CUSTOM_OPS_AVX2 CUSTOM_OPS_INLINE __m256 load_weights8(const E* w) {
  if constexpr (std::is_same_v<E, float>) {
    return _mm256_loadu_ps(w);
  } else if constexpr (std::is_same_v<E, c10::Half>) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
  } else {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w))), 16));
  }
}

// One row against one token, front to back as one stream (what the hardware prefetcher follows best), four sums of
// 8 in flight; the tail past the last 8 in float, added last.
template <class E>
CUSTOM_OPS_AVX2 CUSTOM_OPS_INLINE void row_decode_avx2(const Task& task, int64_t r, int64_t t) {
  const int64_t k = task.k;
  const E* w = static_cast<const E*>(task.weight) + r * k;
  const float* x = task.x + t * k;
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t j = 0;
  for (; j + 32 <= k; j += 32) {
    CUSTOM_OPS_UNROLL
    for (int a = 0; a < 4; ++a) {
      acc[a] = _mm256_fmadd_ps(load_weights8(w + j + 8 * a), _mm256_loadu_ps(x + j + 8 * a), acc[a]);
    }
  }
  for (int a = 0; j + 8 <= k; j += 8, ++a) {
    acc[a] = _mm256_fmadd_ps(load_weights8(w + j), _mm256_loadu_ps(x + j), acc[a]);
  }
  float tail = 0.0f;
  for (; j < k; ++j) {
    tail += element_to_float(w[j]) * x[j];
  }
  const __m256 all = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
  task.out[t * task.n + r] = simd::sum<8>(reinterpret_cast<const Reals8&>(all)) + tail;
}

// Rows [first, end) against each token in turn: a row read from memory once, then from L1 for the next tokens.
template <class E>
CUSTOM_OPS_AVX2 CUSTOM_OPS_INLINE void rows_avx2(const Task& task, int64_t first, int64_t end) {
  for (int64_t r = first; r < end; ++r) {
    for (int64_t t = 0; t < task.tokens; ++t) {
      row_decode_avx2<E>(task, r, t);
    }
  }
}

// ---- Row formats at prefill: the activations in panels (block_layout.h), a panel's 16 tokens in two vectors ----
// R rows against one panel per input: 2R accumulators, 2 loads of x and R weights broadcast per 2R FMAs. Six rows keep
// 12 sums in flight, what two FMA pipes of 4-5 cycles' latency take (four rows' 8 fell short of the 10 of a 5-cycle
// FMA); with the two x and a weight that is 15 of AVX2's 16 registers.
constexpr int kPanelRowsAvx2 = 6;

// The inputs one pass of the tiles covers: all of them while every token's panels fit in 384 KB, else pieces whose
// panels take 192 KB (a multiple of 16 inputs, at least 64). A piece's panels stay in L2 while the task's rows go over
// them, instead of every panel coming from L3 again for each tile once they outgrow L2 (SmolLM2's 1536 inputs at 128
// tokens are 768 KB; the AMD EPYC's L2 is 512 KB).
inline int64_t panel_inputs_a_pass(int64_t tokens, int64_t k) {
  const int64_t padded = (tokens + kPanel - 1) / kPanel * kPanel;
  return padded * k <= 96 * 1024 ? k : std::min(k, std::max<int64_t>(64, 48 * 1024 / padded / 16 * 16));
}

// R rows from r0 against panel p over inputs [j0, j1): w holds the rows' weights from input j0, `stride` apart. The
// sums start from zero at j0 = 0, else from `partial` (the panel's 16 lanes of each row, as the pass before left them);
// the last pass writes out, the others `partial` (unused when one pass takes every input). Each lane adds its products
// in input order, as one pass would. `ahead`: the next tile's rows from j0 (stride apart too), a line of them fetched
// per input while this tile runs.
template <int R>
CUSTOM_OPS_AVX2 CUSTOM_OPS_INLINE void panel_tile_avx2(const Task& task, const float* w, int64_t stride, int64_t r0,
                                                       int64_t p, int64_t j0, int64_t j1, float* partial,
                                                       const float* ahead) {
  const float* x = task.a->panels.data() + p * task.k * kPanel;
  __m256 acc[R][2];
  CUSTOM_OPS_UNROLL
  for (int r = 0; r < R; ++r) {
    acc[r][0] = j0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(partial + r * kPanel);
    acc[r][1] = j0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(partial + r * kPanel + 8);
  }
  for (int64_t j = j0; j < j1; ++j) {
    const int64_t i = j - j0;
    if (ahead != nullptr && i / R * 16 < j1 - j0) {  // row i % R's (i / R)-th line
      _mm_prefetch(reinterpret_cast<const char*>(ahead + i % R * stride + i / R * 16), _MM_HINT_T0);
    }
    const __m256 x0 = _mm256_loadu_ps(x + j * kPanel), x1 = _mm256_loadu_ps(x + j * kPanel + 8);
    CUSTOM_OPS_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m256 wv = _mm256_broadcast_ss(w + r * stride + i);
      acc[r][0] = _mm256_fmadd_ps(wv, x0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(wv, x1, acc[r][1]);
    }
  }
  const bool last = j1 == task.k;
  alignas(32) float lanes[R * kPanel];
  float* kept = last ? lanes : partial;
  CUSTOM_OPS_UNROLL
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(kept + r * kPanel, acc[r][0]);
    _mm256_storeu_ps(kept + r * kPanel + 8, acc[r][1]);
  }
  if (!last) {
    return;
  }
  const int64_t t0 = p * kPanel, valid = std::min(kPanel, task.tokens - t0);
  for (int64_t l = 0; l < valid; ++l) {
    CUSTOM_OPS_UNROLL
    for (int r = 0; r < R; ++r) {
      task.out[(t0 + l) * task.n + r0 + r] = lanes[r * kPanel + l];
    }
  }
}

// R rows from r against every panel over inputs [j0, j1) (weights from input j0 at w, stride apart); `sums`: their
// partial sums, the rows' 16 lanes panel after panel (null when one pass takes every input).
template <int R>
CUSTOM_OPS_AVX2 CUSTOM_OPS_INLINE void panel_row_tile_avx2(const Task& task, const float* w, int64_t stride, int64_t r,
                                                           int64_t j0, int64_t j1, float* sums, const float* ahead) {
  const int64_t panels = (task.tokens + kPanel - 1) / kPanel;
  for (int64_t p = 0; p < panels; ++p) {
    panel_tile_avx2<R>(task, w, stride, r, p, j0, j1, sums == nullptr ? nullptr : sums + p * R * kPanel,
                       p == 0 ? ahead : nullptr);
  }
}

// The 0-5 rows after the whole tiles, as one tile of their number.
CUSTOM_OPS_AVX2 CUSTOM_OPS_INLINE void panel_rest_avx2(const Task& task, int64_t rows, const float* w, int64_t stride,
                                                       int64_t r, int64_t j0, int64_t j1, float* sums) {
  switch (rows) {
    case 5: return panel_row_tile_avx2<5>(task, w, stride, r, j0, j1, sums, nullptr);
    case 4: return panel_row_tile_avx2<4>(task, w, stride, r, j0, j1, sums, nullptr);
    case 3: return panel_row_tile_avx2<3>(task, w, stride, r, j0, j1, sums, nullptr);
    case 2: return panel_row_tile_avx2<2>(task, w, stride, r, j0, j1, sums, nullptr);
    case 1: return panel_row_tile_avx2<1>(task, w, stride, r, j0, j1, sums, nullptr);
    default: return;
  }
}

// Rows [first, end) against every panel, a pass per piece of the inputs (panel_inputs_a_pass), in tiles of 6 rows and
// one of the rows left: float32 rows from the weights, each tile fetching the next one's; a half-precision weight's
// rows from their piece converted to floats first. The sums between passes wait in `partial`, a tile's rows' after
// the tile before's.
template <class E>
CUSTOM_OPS_AVX2 void rows_in_panels_avx2(const Task& task, int64_t first, int64_t end) {
  constexpr int R = kPanelRowsAvx2;
  const int64_t k = task.k, panels = (task.tokens + kPanel - 1) / kPanel;
  const int64_t step = panel_inputs_a_pass(task.tokens, k);
  thread_local std::vector<float> partial, converted;
  if (step < k) {
    partial.resize(static_cast<size_t>((end - first) * panels * kPanel));
  }
  const auto sums = [&](int64_t r) { return step < k ? partial.data() + (r - first) * panels * kPanel : nullptr; };
  const E* weight = static_cast<const E*>(task.weight);
  for (int64_t j0 = 0; j0 < k; j0 += step) {
    const int64_t j1 = std::min(k, j0 + step), piece = j1 - j0;
    if constexpr (std::is_same_v<E, float>) {
      int64_t r = first;
      for (; r + R <= end; r += R) {
        const float* next = r + 2 * R <= end ? weight + (r + R) * k + j0 : nullptr;
        panel_row_tile_avx2<R>(task, weight + r * k + j0, k, r, j0, j1, sums(r), next);
      }
      panel_rest_avx2(task, end - r, weight + r * k + j0, k, r, j0, j1, sums(r));
    } else {  // 6 rows of the piece converted at a time (72 KB at most: 3072 inputs)
      converted.resize(static_cast<size_t>(R * piece));
      for (int64_t r = first; r < end; r += R) {
        const int64_t rows = std::min<int64_t>(R, end - r);
        for (int64_t row = 0; row < rows; ++row) {
          for (int64_t j = 0; j < piece; j += 8) {  // pieces are multiples of 16
            _mm256_storeu_ps(converted.data() + row * piece + j, load_weights8(weight + (r + row) * k + j0 + j));
          }
        }
        if (rows == R) {
          panel_row_tile_avx2<R>(task, converted.data(), piece, r, j0, j1, sums(r), nullptr);
        } else {
          panel_rest_avx2(task, rows, converted.data(), piece, r, j0, j1, sums(r));
        }
      }
    }
  }
  elementwise::count(elementwise::kRowPanelOutputs, static_cast<uint64_t>((end - first) * task.tokens));
}

}  // namespace blocks
}  // namespace native
}  // namespace custom
#endif
