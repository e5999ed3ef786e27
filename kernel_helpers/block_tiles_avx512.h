// The block formats' AVX-512 VNNI tiles (the layout is block_layout.h's): a group's 16 rows one per lane, vpdpbusd
// against four activations broadcast; the row formats' decode rows and prefill panels on 512-bit FMA.
#pragma once

#include "block_layout.h"

#ifdef CUSTOM_OPS_X86_DISPATCH
namespace custom {
namespace native {
namespace blocks {

// ---- AVX-512 (with VNNI) ----------------------------------------------------------------------------------------------
// Activations, the same values as quantize_block's, 16 at a time: the division and the rounding (to nearest, ties to
// even) are IEEE operations, and a maximum does not depend on its order.
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_INLINE void quantize_block_avx512(const float* x, int64_t n, int8_t* q, float* d,
                                                                    int32_t* sum16) {
  constexpr int kNotFinite = 0x01 | 0x08 | 0x10 | 0x80;  // quiet NaN, +inf, -inf, signaling NaN
  __mmask16 not_finite = 0;
  __m512 amax = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __m512 v = _mm512_loadu_ps(x + j);
    not_finite |= _mm512_fpclass_ps_mask(v, kNotFinite);
    amax = _mm512_max_ps(amax, _mm512_abs_ps(v));
  }
  const bool finite = not_finite == 0;
  const float scale = finite ? _mm512_reduce_max_ps(amax) / 127.0f : std::numeric_limits<float>::quiet_NaN();
  const bool zero = !finite || scale == 0.0f;
  const __m512 s = _mm512_set1_ps(scale);
  constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  for (int64_t j = 0; j < n; j += 16) {
    const __m512i v = zero ? _mm512_setzero_si512()
                           : _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_div_ps(_mm512_loadu_ps(x + j), s), kNearest));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + j), _mm512_cvtsepi32_epi8(v));
    sum16[j / 16] = _mm512_reduce_add_epi32(v);
  }
  *d = scale;
}

CUSTOM_OPS_AVX512_VNNI inline void prepare_blocks_avx512(const float* x, int64_t first, int64_t end, Activations& a) {
  for (int64_t b = first; b < end; ++b) {
    const int64_t value = b * a.block;
    quantize_block_avx512(x + value, a.block, &a.q[value], &a.d[b], &a.sum16[value / 16]);
  }
}

// Four activations of token t from input k, broadcast to every lane (the signed operand of vpdpbusd).
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_INLINE __m512i four(const Activations& a, int64_t t, int64_t k) {
  int32_t bytes;
  std::memcpy(&bytes, a.row(t) + k, sizeof(bytes));
  return _mm512_set1_epi32(bytes);
}

// Four bytes of each of the group's rows (a short group's missing lanes read as zero, never past the tensor).
template <bool kFull>
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_INLINE Words load_lanes(const uint8_t* p, __mmask16 lanes) {
  return reinterpret_cast<Words>(kFull ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi32(lanes, p));
}

// The group's records of one block: words and fp16 values (as floats), each field for its R rows.
template <class F, bool kFull>
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_INLINE void group_record(const uint8_t* record, int64_t R, __mmask16 lanes,
                                                           Words* words, Reals* halves) {
  int offset = 0, w = 0, h = 0;
  CUSTOM_OPS_UNROLL
  for (int size : F::kFields) {
    const uint8_t* p = record + offset * R;
    if (size == 4) {
      words[w++] = load_lanes<kFull>(p, lanes);
    } else {
      halves[h++] = reinterpret_cast<Reals>(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes, p)));
    }
    offset += size;
  }
}

// Tiles of tokens: a format with integer sub-scales keeps two integer sums per token beside its float one, so it
// takes fewer tokens at a time (their accumulators stay in the 32 vector registers).
template <class F>
constexpr int max_tokens() {
  return F::kSubScales ? 4 : 8;
}

// One sub-block's share of token t's block sums: its dot times the rows' sub-scales, and the sub-mins times the
// sub-block's sum of x (from input `first`).
template <class F>
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_INLINE void add_sub_block(const Activations& a, __m512i dot, Words sub_scale,
                                                            Words sub_min, int64_t t, int64_t first, __m512i& dots,
                                                            __m512i& mins) {
  dots = _mm512_add_epi32(dots, _mm512_mullo_epi32(dot, reinterpret_cast<__m512i>(sub_scale)));
  if constexpr (F::kHasMin) {
    mins = _mm512_add_epi32(mins, _mm512_mullo_epi32(reinterpret_cast<__m512i>(sub_min),
                                                     _mm512_set1_epi32(a.sum(t, first, F::kSub))));
  }
}

// The integer sums of one group and block against T tokens from t0: per token, the rows' sub-block dots (one row per
// int32 lane, started from -offset * the sum of x so unsigned codes go into vpdpbusd) times their sub-scales, and the
// sub-mins times the sub-blocks' sums of x. With sub-scales read after the codes (record_after_codes), the raw dots
// go to sub_dots instead and scale_sub_dots_avx512 finishes them.
template <class F, int T, bool kFull>
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_INLINE void block_sums_avx512(const Task& task, const uint8_t* block, int64_t R,
                                                                __mmask16 lanes, const Words* words, int64_t b,
                                                                int64_t t0, __m512i* dots, __m512i* mins,
                                                                __m512i* sub_dots) {
  constexpr int kPieces = F::kWeights / kBlock, kChunks = chunks<F>(), kQuads = F::kSub / 4;
  constexpr bool kDeferred = F::kSubScales && record_after_codes<F, T>();
  const Activations& a = *task.a;
  CUSTOM_OPS_UNROLL
  for (int t = 0; t < T; ++t) {
    dots[t] = mins[t] = _mm512_setzero_si512();
  }
  for (int i = 0; i < kPieces; ++i) {
    const uint8_t* quants = block + i * R * kChunks * 4;
    Words chunk[kChunks];
    CUSTOM_OPS_UNROLL
    for (int c = 0; c < kChunks; ++c) {
      ask_ahead<T>(quants + c * R * 4);
      chunk[c] = load_lanes<kFull>(quants + c * R * 4, lanes);
    }
    CUSTOM_OPS_UNROLL
    for (int h = 0; h < kBlock / F::kSub; ++h) {
      const int s = i * (kBlock / F::kSub) + h;
      const int64_t first = b * F::kWeights + s * F::kSub;  // the sub-block's first input
      Words sub_scale = reinterpret_cast<Words>(_mm512_set1_epi32(1)), sub_min = sub_scale;
      if constexpr (F::kSubScales && !kDeferred) {
        F::sub(words, s, sub_scale, sub_min);
      }
      __m512i dot[T];
      CUSTOM_OPS_UNROLL
      for (int t = 0; t < T; ++t) {
        dot[t] = _mm512_set1_epi32(-F::kOffset * a.sum(t0 + t, first, F::kSub));
      }
      CUSTOM_OPS_UNROLL
      for (int q = h * kQuads; q < (h + 1) * kQuads; ++q) {
        Words code;
        quad_codes<F>(chunk, q, code);
        const __m512i codes = reinterpret_cast<__m512i>(code);
        CUSTOM_OPS_UNROLL
        for (int t = 0; t < T; ++t) {
          dot[t] = _mm512_dpbusd_epi32(dot[t], codes, four(a, t0 + t, first + 4 * (q - h * kQuads)));
        }
      }
      CUSTOM_OPS_UNROLL
      for (int t = 0; t < T; ++t) {
        if constexpr (kDeferred) {
          sub_dots[s] = dot[t];
        } else if constexpr (F::kSubScales) {
          add_sub_block<F>(a, dot[t], sub_scale, sub_min, t0 + t, first, dots[t], mins[t]);
        } else {
          dots[t] = _mm512_add_epi32(dots[t], dot[t]);
        }
      }
    }
  }
}

// One token's block sums from its raw sub-block dots, once the record's sub-scales are read: the same products added
// in the same order as block_sums_avx512 adds them.
template <class F>
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_INLINE void scale_sub_dots_avx512(const Activations& a, const Words* words,
                                                                    const __m512i* sub_dots, int64_t b, int64_t t,
                                                                    __m512i& dots, __m512i& mins) {
  dots = mins = _mm512_setzero_si512();
  CUSTOM_OPS_UNROLL
  for (int s = 0; s < F::kWeights / F::kSub; ++s) {
    Words sub_scale, sub_min;
    F::sub(words, s, sub_scale, sub_min);
    add_sub_block<F>(a, sub_dots[s], sub_scale, sub_min, t, b * F::kWeights + s * F::kSub, dots, mins);
  }
}

// One group (R rows, kFull: R = 16) against T tokens from t0, block after block: the integer sums, then per block
// acc += scale * d_x * dots + min * d_x * mins.
template <class F, int T, bool kFull>
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_INLINE void group_avx512(const Task& task, const Packed<F>& w, int64_t g,
                                                           int64_t t0) {
  const Activations& a = *task.a;
  const int64_t R = kFull ? kGroup : w.rows(g);
  const __mmask16 lanes = kFull ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << R) - 1);
  __m512 acc[T];
  CUSTOM_OPS_UNROLL
  for (int t = 0; t < T; ++t) {
    acc[t] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < w.blocks; ++b) {
    const uint8_t* block = w.block(g, b);
    Words words[std::max(1, fields_of_size<F>(4))];
    Reals halves[std::max(1, fields_of_size<F>(2))];
    const uint8_t* record = block + R * quant_bytes<F>();
    constexpr bool kAfter = record_after_codes<F, T>();
    if constexpr (!kAfter) {
      group_record<F, kFull>(record, R, lanes, words, halves);
    }
    __m512i dots[T], mins[T], sub_dots[F::kSubScales && kAfter ? F::kWeights / F::kSub : 1];
    block_sums_avx512<F, T, kFull>(task, block, R, lanes, words, b, t0, dots, mins, sub_dots);
    if constexpr (kAfter) {
      group_record<F, kFull>(record, R, lanes, words, halves);
      if constexpr (F::kSubScales) {
        scale_sub_dots_avx512<F>(a, words, sub_dots, b, t0, dots[0], mins[0]);
      }
    }
    Reals scale, min = Reals{};
    F::block(halves, scale, min);
    CUSTOM_OPS_UNROLL
    for (int t = 0; t < T; ++t) {
      const float dx = a.scale(t0 + t, b);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots[t]),
                               _mm512_mul_ps(reinterpret_cast<__m512>(scale), _mm512_set1_ps(dx)), acc[t]);
      if constexpr (F::kHasMin && F::kSubScales) {
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(mins[t]),
                                 _mm512_mul_ps(reinterpret_cast<__m512>(min), _mm512_set1_ps(dx)), acc[t]);
      } else if constexpr (F::kHasMin) {  // the one sub-block: its min times d_x times the block's sum of x
        const float sum = static_cast<float>(a.sum(t0 + t, b * F::kWeights, F::kSub));
        acc[t] = _mm512_fmadd_ps(reinterpret_cast<__m512>(min), _mm512_set1_ps(dx * sum), acc[t]);
      }
    }
  }
  CUSTOM_OPS_UNROLL
  for (int t = 0; t < T; ++t) {
    _mm512_mask_storeu_ps(task.out + (t0 + t) * task.n + g * kGroup, lanes, acc[t]);
  }
}

// The group tiles of format F for T tokens from t0, over groups [first, end).
template <class F>
struct GroupTiles {
  template <int T>
  CUSTOM_OPS_AVX512_VNNI static void run(const Task& task, int64_t t0, int64_t first, int64_t end) {
    const Packed<F> w{static_cast<const uint8_t*>(task.weight), task.n, task.k / F::kWeights};
    for (int64_t g = first; g < end; ++g) {
      if (w.rows(g) == kGroup) {
        group_avx512<F, T, true>(task, w, g, t0);
      } else {
        group_avx512<F, T, false>(task, w, g, t0);
      }
    }
  }
};

// 16 weights of a row as floats (a row's tail through a mask).
template <class E>
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_INLINE __m512 load_weights(const E* w, __mmask16 mask) {
  if constexpr (std::is_same_v<E, float>) {
    return _mm512_maskz_loadu_ps(mask, w);
  } else if constexpr (std::is_same_v<E, c10::Half>) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, w));
  } else {  // bfloat16: the upper half of a float
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, w)), 16));
  }
}

// 16 whole weights: plain loads, which the FMA takes as its memory operand (a masked load, even with every lane on, is
// an instruction of its own: the decode row kernel read ~34 GB/s with masked loads, ~40 without, on the AMD EPYC).
template <class E>
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_INLINE __m512 load_weights(const E* w) {
  if constexpr (std::is_same_v<E, float>) {
    return _mm512_loadu_ps(w);
  } else if constexpr (std::is_same_v<E, c10::Half>) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
  } else {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w))), 16));
  }
}

// A tile's R x T accumulators, all zero.
template <int R, int T>
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_INLINE void zero_accumulators(__m512 (&acc)[R][T]) {
  CUSTOM_OPS_UNROLL
  for (int r = 0; r < R; ++r) {
    CUSTOM_OPS_UNROLL
    for (int t = 0; t < T; ++t) {
      acc[r][t] = _mm512_setzero_ps();
    }
  }
}

// R rows' 16 weights against T tokens' 16 activations per step (kFull: all 16, plain loads; else through `mask`).
template <class E, int R, int T, bool kFull = false>
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_INLINE void row_step(const E* w, const float* x, int64_t k, int64_t j, __mmask16 mask,
                                                       __m512 (&acc)[R][T]) {
  __m512 xv[T];
  CUSTOM_OPS_UNROLL
  for (int t = 0; t < T; ++t) {
    xv[t] = kFull ? _mm512_loadu_ps(x + t * k + j) : _mm512_maskz_loadu_ps(mask, x + t * k + j);
  }
  CUSTOM_OPS_UNROLL
  for (int r = 0; r < R; ++r) {
    // The tile's R rows are one run of memory: each load asks for its line in the next tile (R rows on), which is
    // read in this same order. A fixed distance lands inside this tile's own rows when they are short.
    _mm_prefetch(reinterpret_cast<const char*>(w + (r + R) * k + j), _MM_HINT_T0);
    const __m512 wv = kFull ? load_weights(w + r * k + j) : load_weights(w + r * k + j, mask);
    CUSTOM_OPS_UNROLL
    for (int t = 0; t < T; ++t) {
      acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
    }
  }
}

template <class E, int R, int T>
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_INLINE void rows_avx512(const Task& task, int64_t r0, int64_t t0) {
  const int64_t k = task.k;
  const E* w = static_cast<const E*>(task.weight) + r0 * k;
  const float* x = task.x + t0 * k;
  __m512 acc[R][T];
  zero_accumulators(acc);
  int64_t j = 0;
  for (; j + 16 <= k; j += 16) {
    row_step<E, R, T, true>(w, x, k, j, 0xFFFF, acc);
  }
  if (j < k) {
    row_step<E, R, T>(w, x, k, j, static_cast<__mmask16>((1u << (k - j)) - 1), acc);
  }
  CUSTOM_OPS_UNROLL
  for (int r = 0; r < R; ++r) {
    CUSTOM_OPS_UNROLL
    for (int t = 0; t < T; ++t) {
      task.out[(t0 + t) * task.n + r0 + r] = _mm512_reduce_add_ps(acc[r][t]);
    }
  }
}

// One row against one token, read front to back as one stream, four sums in flight. At decode the weights stream from
// memory, and the hardware prefetcher follows one sequential stream best: on the AMD EPYC this reads ~40 GB/s on one
// thread (a plain read: 41) where eight rows interleaved, each prefetched a tile ahead, read ~25-33.
template <class E>
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_INLINE void row_decode_avx512(const Task& task, int64_t r, int64_t t) {
  const int64_t k = task.k;
  const E* w = static_cast<const E*>(task.weight) + r * k;
  const float* x = task.x + t * k;
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t j = 0;
  for (; j + 64 <= k; j += 64) {
    CUSTOM_OPS_UNROLL
    for (int a = 0; a < 4; ++a) {
      acc[a] = _mm512_fmadd_ps(load_weights(w + j + 16 * a), _mm512_loadu_ps(x + j + 16 * a), acc[a]);
    }
  }
  for (int a = 0; j < k; j += 16, ++a) {
    const __mmask16 mask = k - j >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (k - j)) - 1);
    acc[a] = _mm512_fmadd_ps(load_weights(w + j, mask), _mm512_maskz_loadu_ps(mask, x + j), acc[a]);
  }
  task.out[t * task.n + r] =
      _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

// ---- Row formats at prefill: the activations in panels ----
// R rows against TP panels from panel p: per input j, TP vectors of x[., j] (16 tokens each) and R weights broadcast,
// R * TP independent sums each in its own lane, in input order: no horizontal sums, and each weight load feeds 16 * TP
// tokens. 8 rows x 2 panels (kPanelRows): 16 accumulators, 10 loads a 16 FMAs (what the AMD EPYC's two FMA pipes take
// per cycle).

// `ahead`: the next tile's weights, a run of bytes fetched over this tile's inputs (`ahead_step` an input), or null.
template <int R, int TP>
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_INLINE void panel_tile(const Task& task, const float* w, int64_t r0, int64_t p,
                                                         const char* ahead, int64_t ahead_step) {
  const int64_t k = task.k;
  const float* x = task.a->panels.data() + p * k * kPanel;
  __m512 acc[R][TP];
  zero_accumulators(acc);
  for (int64_t j = 0; j < k; ++j) {
    if (ahead != nullptr) {
      _mm_prefetch(ahead + j * ahead_step, _MM_HINT_T0);
    }
    __m512 xv[TP];
    CUSTOM_OPS_UNROLL
    for (int tp = 0; tp < TP; ++tp) {
      xv[tp] = _mm512_loadu_ps(x + (tp * k + j) * kPanel);
    }
    CUSTOM_OPS_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m512 wv = _mm512_set1_ps(w[r * k + j]);
      CUSTOM_OPS_UNROLL
      for (int tp = 0; tp < TP; ++tp) {
        acc[r][tp] = _mm512_fmadd_ps(wv, xv[tp], acc[r][tp]);
      }
    }
  }
  CUSTOM_OPS_UNROLL
  for (int tp = 0; tp < TP; ++tp) {
    alignas(64) float lanes[R][kPanel];
    CUSTOM_OPS_UNROLL
    for (int r = 0; r < R; ++r) {
      _mm512_store_ps(lanes[r], acc[r][tp]);
    }
    const int64_t t0 = (p + tp) * kPanel, valid = std::min(kPanel, task.tokens - t0);
    for (int64_t l = 0; l < valid; ++l) {
      CUSTOM_OPS_UNROLL
      for (int r = 0; r < R; ++r) {
        task.out[(t0 + l) * task.n + r0 + r] = lanes[r][l];
      }
    }
  }
}

// R rows from r0 (their weights as floats at w) against every panel, two at a time. The first pass also fetches the
// next tile's weights: a tile is one run of memory but is read as 8 rows at once, more streams than the hardware
// prefetcher follows (measured on the AMD EPYC: a prefill's linear layers 8% faster on one thread).
template <int R>
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_INLINE void panel_rows(const Task& task, const float* w, int64_t r0,
                                                         const char* ahead, int64_t ahead_step) {
  const int64_t panels = (task.tokens + kPanel - 1) / kPanel;
  int64_t p = 0;
  for (; p + 2 <= panels; p += 2) {
    panel_tile<R, 2>(task, w, r0, p, p == 0 ? ahead : nullptr, ahead_step);
  }
  if (p < panels) {
    panel_tile<R, 1>(task, w, r0, p, p == 0 ? ahead : nullptr, ahead_step);
  }
}

// Rows [first, end) against the panels, kPanelRows at a time (a half-precision weight's rows converted to floats
// first, each tile once), the rest one by one.
template <class E>
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_INLINE void rows_in_panels(const Task& task, int64_t first, int64_t end) {
  const int64_t k = task.k;
  const E* weight = static_cast<const E*>(task.weight);
  thread_local std::vector<float> converted;
  for (int64_t r = first; r < end; r += kPanelRows) {
    const int64_t rows = std::min(kPanelRows, end - r);
    const float* w = nullptr;
    if constexpr (std::is_same_v<E, float>) {
      w = weight + r * k;
    } else {
      converted.resize(static_cast<size_t>(kPanelRows * k));
      float* to = converted.data();
      for (int64_t j = 0; j < rows * k; j += 16) {  // k is a multiple of 16
        _mm512_storeu_ps(to + j, load_weights(weight + r * k + j));
      }
      w = to;
    }
    const char* ahead = r + 2 * kPanelRows <= end ? reinterpret_cast<const char*>(weight + (r + kPanelRows) * k)
                                                  : nullptr;
    if (rows == kPanelRows) {
      panel_rows<kPanelRows>(task, w, r, ahead, kPanelRows * sizeof(E));
    } else {
      for (int64_t i = 0; i < rows; ++i) {
        panel_rows<1>(task, w + i * k, r + i, nullptr, 0);
      }
    }
  }
  elementwise::count(elementwise::kRowPanelOutputs, static_cast<uint64_t>((end - first) * task.tokens));
}

// Rows one at a time at decode (above), two at a time for more tokens (each weight load feeding T tokens).
template <class E>
struct RowTiles {
  template <int T>
  CUSTOM_OPS_AVX512_VNNI static void run(const Task& task, int64_t t0, int64_t first, int64_t end) {
    if constexpr (T == 1) {
      for (int64_t r = first; r < end; ++r) {
        row_decode_avx512<E>(task, r, t0);
      }
    } else {
      int64_t r = first;
      for (; r + 2 <= end; r += 2) {
        rows_avx512<E, 2, T>(task, r, t0);
      }
      for (; r < end; ++r) {
        rows_avx512<E, 1, T>(task, r, t0);
      }
    }
  }
};

}  // namespace blocks
}  // namespace native
}  // namespace custom
#endif
