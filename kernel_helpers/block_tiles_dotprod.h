// The block formats' ARM64 tiles for CPUs with the integer dot-product instructions: a group's 16 rows as four
// quarters of 4, one row per 32-bit lane (the layout is block_layout.h's). Two ways to make a sub-block's integer sums:
// `sdot` (FEAT_DotProd, ARMv8.2-A and later: Cortex-A55/A76 on, Apple, Neoverse) multiplies each quad of codes against
// four activations picked by lane from 16 loaded once; `smmla` (FEAT_I8MM, ARMv8.6-A: Neoverse V1/N2, Cortex-X2 on,
// Apple M2) multiplies two rows' 8 codes by two tokens' 8 activations at once, twice the products an instruction, for
// pairs of tokens (prefill). The kernel's HWCAP says which the CPU has. Codes are signed bytes here: those under 8 bits
// are non-negative as they are, Q8_0's are made signed (code - 128). The integer sums are the AVX-512 tiles', and the
// float arithmetic per lane is theirs in their order (AArch64's fmla is fused like vfmadd), so the same bits.
//
// Only the outermost function of each way has its target (armv8.2-a+dotprod, +i8mm) and is flattened: the group's
// code below is shared, has no target of its own, and is inlined into both (GCC refuses to inline a function with a
// target into one without it, even when that one is inlined in turn). The library runs on any ARMv8-A.
#pragma once

#include "block_layout.h"

#if defined(__aarch64__) && defined(__linux__) && !defined(CUSTOM_OPS_BLOCKS_PORTABLE_ONLY)
#define CUSTOM_OPS_BLOCKS_DOTPROD_DISPATCH 1

namespace custom {
namespace native {
namespace blocks {

constexpr int kQuarter = 4;  // rows a 128-bit vector holds

// `bytes` bytes a row of the quarter's rows from a run of R rows (a short group's missing rows read as zero, never
// past the tensor).
template <bool kFull, class V>
CUSTOM_OPS_INLINE V load_quarter(const uint8_t* p, int64_t first, int valid, int bytes) {
  V v{};
  std::memcpy(&v, p + first * bytes, static_cast<size_t>(kFull ? kQuarter : valid) * bytes);
  return v;
}

template <class F, bool kFull>
CUSTOM_OPS_INLINE void quarter_record(const uint8_t* record, int64_t R, int64_t first, int valid, Words4* words,
                                      Reals4* halves) {
  int offset = 0, w = 0, f = 0;
  CUSTOM_OPS_UNROLL
  for (int size : F::kFields) {
    const uint8_t* p = record + offset * R;
    if (size == 4) {
      words[w++] = load_quarter<kFull, Words4>(p, first, valid, 4);
    } else {
      const uint16x4_t bits = load_quarter<kFull, uint16x4_t>(p, first, valid, 2);
      const float32x4_t values = vcvt_f32_f16(vreinterpret_f16_u16(bits));
      std::memcpy(&halves[f++], &values, sizeof(values));
    }
    offset += size;
  }
}

template <class F>
constexpr bool dotprod_signed_codes() {
  static_assert(chunks<F>() < 8 || F::kOffset == 128, "8-bit codes are made signed by subtracting 128");
  return chunks<F>() == 8;
}

// Quad q's codes of the quarter's rows as signed bytes, a row's four in each 32-bit lane.
template <class F>
CUSTOM_OPS_INLINE int8x16_t signed_quad(const Words4* chunk, int q) {
  Words4 code;
  quad_codes<F>(chunk, q, code);
  uint8x16_t bytes;
  std::memcpy(&bytes, &code, sizeof(bytes));
  if constexpr (dotprod_signed_codes<F>()) {
    bytes = veorq_u8(bytes, vdupq_n_u8(0x80));  // code - 128, as int8
  }
  return vreinterpretq_s8_u8(bytes);
}

// Sub-block dots: dot[t] += each of the quarter's rows times token t0 + t's activations over the sub-block's kQuads
// quads from `quad` (chunk: the quarter's chunks of the piece; x_at: the first of the sub-block's activations).
struct SdotDots {
  template <class F, int T>
  CUSTOM_OPS_DOTPROD static inline void run(const Words4* chunk, int quad, const Activations& a, int64_t t0,
                                            int64_t x_at, int32x4_t* dot) {
    constexpr int kQuads = F::kSub / 4;
    CUSTOM_OPS_UNROLL
    for (int q = 0; q < kQuads; q += 4) {  // 16 activations a load, four quads
      int8x16_t x[T];
      CUSTOM_OPS_UNROLL
      for (int t = 0; t < T; ++t) {
        x[t] = vld1q_s8(a.row(t0 + t) + x_at + 4 * q);
      }
      CUSTOM_OPS_UNROLL
      for (int j = 0; j < 4; ++j) {
        const int8x16_t w = signed_quad<F>(chunk, quad + q + j);
        CUSTOM_OPS_UNROLL
        for (int t = 0; t < T; ++t) {
          switch (j) {  // the lane is an immediate
            case 0: dot[t] = vdotq_laneq_s32(dot[t], w, x[t], 0); break;
            case 1: dot[t] = vdotq_laneq_s32(dot[t], w, x[t], 1); break;
            case 2: dot[t] = vdotq_laneq_s32(dot[t], w, x[t], 2); break;
            default: dot[t] = vdotq_laneq_s32(dot[t], w, x[t], 3); break;
          }
        }
      }
    }
  }
};

// The same sums by smmla, T a multiple of 2: two quads of the quarter's rows 0-1 (and 2-3) as a 2x8 matrix times two
// tokens' 8 activations, into lanes (row r, token t), (r, t + 1), (r + 1, t), (r + 1, t + 1); unzipped to a row a
// lane per token at the end.
struct SmmlaDots {
  template <class F, int T>
  CUSTOM_OPS_I8MM static inline void run(const Words4* chunk, int quad, const Activations& a, int64_t t0,
                                         int64_t x_at, int32x4_t* dot) {
    static_assert(T % 2 == 0, "smmla multiplies tokens in pairs");
    constexpr int kQuads = F::kSub / 4, kPairs = T / 2;
    int32x4_t pair[kPairs][2];  // [token pair][rows 0-1, rows 2-3]
    CUSTOM_OPS_UNROLL
    for (int p = 0; p < kPairs; ++p) {
      pair[p][0] = pair[p][1] = vdupq_n_s32(0);
    }
    CUSTOM_OPS_UNROLL
    for (int q = 0; q < kQuads; q += 4) {  // 16 activations a load, four quads
      int64x2_t x[T];
      CUSTOM_OPS_UNROLL
      for (int t = 0; t < T; ++t) {
        x[t] = vreinterpretq_s64_s8(vld1q_s8(a.row(t0 + t) + x_at + 4 * q));
      }
      CUSTOM_OPS_UNROLL
      for (int j = 0; j < 4; j += 2) {
        const uint32x4_t first = vreinterpretq_u32_s8(signed_quad<F>(chunk, quad + q + j));
        const uint32x4_t second = vreinterpretq_u32_s8(signed_quad<F>(chunk, quad + q + j + 1));
        const int8x16_t rows[2] = {vreinterpretq_s8_u32(vzip1q_u32(first, second)),   // rows 0, 1: 8 codes each
                                   vreinterpretq_s8_u32(vzip2q_u32(first, second))};  // rows 2, 3
        CUSTOM_OPS_UNROLL
        for (int p = 0; p < kPairs; ++p) {
          const int8x16_t tokens = vreinterpretq_s8_s64(j == 0 ? vzip1q_s64(x[2 * p], x[2 * p + 1])
                                                               : vzip2q_s64(x[2 * p], x[2 * p + 1]));
          pair[p][0] = vmmlaq_s32(pair[p][0], rows[0], tokens);
          pair[p][1] = vmmlaq_s32(pair[p][1], rows[1], tokens);
        }
      }
    }
    CUSTOM_OPS_UNROLL
    for (int p = 0; p < kPairs; ++p) {
      dot[2 * p] = vaddq_s32(dot[2 * p], vuzp1q_s32(pair[p][0], pair[p][1]));
      dot[2 * p + 1] = vaddq_s32(dot[2 * p + 1], vuzp2q_s32(pair[p][0], pair[p][1]));
    }
  }
};

// One sub-block's share of token t's quarter block sums: its dot times the rows' sub-scales, and the sub-mins times
// the sub-block's sum of x (from input `first`).
template <class F>
CUSTOM_OPS_INLINE void add_sub_block_arm64(const Activations& a, int32x4_t dot, const Words4& sub_scale,
                                           const Words4& sub_min, int64_t t, int64_t first, int32x4_t& dots,
                                           int32x4_t& mins) {
  int32x4_t scale_lanes, min_lanes;
  std::memcpy(&scale_lanes, &sub_scale, sizeof(scale_lanes));
  std::memcpy(&min_lanes, &sub_min, sizeof(min_lanes));
  dots = vmlaq_s32(dots, dot, scale_lanes);
  if constexpr (F::kHasMin) {
    mins = vmlaq_n_s32(mins, min_lanes, a.sum(t, first, F::kSub));
  }
}

// The integer sums of one quarter and block against T tokens from t0, as block_sums_avx512 makes them (Dots: SdotDots
// or SmmlaDots). With sub-scales read after the codes (record_after_codes), each sub-block's raw dot goes to sub_dots
// and scale_sub_dots_arm64 finishes them.
template <class F, int T, bool kFull, class Dots>
CUSTOM_OPS_INLINE void quarter_block_sums(const Task& task, const uint8_t* block, int64_t R, int64_t first_row,
                                          int valid, const Words4* words, int64_t b, int64_t t0, int32x4_t* dots,
                                          int32x4_t* mins, int32x4_t* sub_dots) {
  constexpr int kPieces = F::kWeights / kBlock, kChunks = chunks<F>(), kQuads = F::kSub / 4;
  constexpr bool kDeferred = F::kSubScales && record_after_codes<F, T>();
  const Activations& a = *task.a;
  CUSTOM_OPS_UNROLL
  for (int t = 0; t < T; ++t) {
    dots[t] = mins[t] = vdupq_n_s32(0);
  }
  for (int i = 0; i < kPieces; ++i) {
    const uint8_t* quants = block + i * R * kChunks * 4;
    Words4 chunk[kChunks];
    CUSTOM_OPS_UNROLL
    for (int c = 0; c < kChunks; ++c) {
      if (first_row == 0) {  // the first quarter's pass asks for the line
        ask_ahead<T>(quants + c * R * 4);
      }
      chunk[c] = load_quarter<kFull, Words4>(quants + c * R * 4, first_row, valid, 4);
    }
    CUSTOM_OPS_UNROLL
    for (int h = 0; h < kBlock / F::kSub; ++h) {
      const int s = i * (kBlock / F::kSub) + h;
      const int64_t first = b * F::kWeights + s * F::kSub;
      Words4 sub_scale = Words4{} + 1, sub_min = sub_scale;
      if constexpr (F::kSubScales && !kDeferred) {
        F::sub(words, s, sub_scale, sub_min);
      }
      int32x4_t dot[T];
      CUSTOM_OPS_UNROLL
      for (int t = 0; t < T; ++t) {
        dot[t] = vdupq_n_s32(dotprod_signed_codes<F>() ? 0 : -F::kOffset * a.sum(t0 + t, first, F::kSub));
      }
      Dots::template run<F, T>(chunk, h * kQuads, a, t0, first, dot);
      CUSTOM_OPS_UNROLL
      for (int t = 0; t < T; ++t) {
        if constexpr (kDeferred) {
          sub_dots[s] = dot[t];
        } else if constexpr (F::kSubScales) {
          add_sub_block_arm64<F>(a, dot[t], sub_scale, sub_min, t0 + t, first, dots[t], mins[t]);
        } else {
          dots[t] = vaddq_s32(dots[t], dot[t]);
        }
      }
    }
  }
}

// One token's quarter block sums from its raw sub-block dots, once the record's sub-scales are read: the same
// products added in the same order as quarter_block_sums adds them.
template <class F>
CUSTOM_OPS_INLINE void scale_sub_dots_arm64(const Activations& a, const Words4* words, const int32x4_t* sub_dots,
                                            int64_t b, int64_t t, int32x4_t& dots, int32x4_t& mins) {
  dots = mins = vdupq_n_s32(0);
  CUSTOM_OPS_UNROLL
  for (int s = 0; s < F::kWeights / F::kSub; ++s) {
    Words4 sub_scale, sub_min;
    F::sub(words, s, sub_scale, sub_min);
    add_sub_block_arm64<F>(a, sub_dots[s], sub_scale, sub_min, t, b * F::kWeights + s * F::kSub, dots, mins);
  }
}

// Group g (R rows; kFull: R = 16) against T tokens from t0, block after block, each block's quarters one after the
// other: per lane the float arithmetic of group_avx512, in its order.
template <class F, int T, bool kFull, class Dots>
CUSTOM_OPS_INLINE void group_arm64(const Task& task, const Packed<F>& w, int64_t g, int64_t t0) {
  const Activations& a = *task.a;
  const int64_t R = kFull ? kGroup : w.rows(g);
  const int quarters = static_cast<int>((R + kQuarter - 1) / kQuarter);
  float32x4_t acc[4][T];
  CUSTOM_OPS_UNROLL
  for (int p = 0; p < 4; ++p) {
    CUSTOM_OPS_UNROLL
    for (int t = 0; t < T; ++t) {
      acc[p][t] = vdupq_n_f32(0.0f);
    }
  }
  for (int64_t b = 0; b < w.blocks; ++b) {
    const uint8_t* block = w.block(g, b);
    CUSTOM_OPS_UNROLL
    for (int p = 0; p < 4; ++p) {
      if (!kFull && p >= quarters) {
        break;
      }
      const int64_t first = p * kQuarter;
      const int valid = static_cast<int>(std::min<int64_t>(kQuarter, R - first));
      Words4 words[std::max(1, fields_of_size<F>(4))];
      Reals4 record_halves[std::max(1, fields_of_size<F>(2))];
      const uint8_t* record = block + R * quant_bytes<F>();
      constexpr bool kAfter = record_after_codes<F, T>();
      if constexpr (!kAfter) {
        quarter_record<F, kFull>(record, R, first, valid, words, record_halves);
      }
      int32x4_t dots[T], mins[T], sub_dots[F::kSubScales && kAfter ? F::kWeights / F::kSub : 1];
      quarter_block_sums<F, T, kFull, Dots>(task, block, R, first, valid, words, b, t0, dots, mins, sub_dots);
      if constexpr (kAfter) {
        quarter_record<F, kFull>(record, R, first, valid, words, record_halves);
        if constexpr (F::kSubScales) {
          scale_sub_dots_arm64<F>(a, words, sub_dots, b, t0, dots[0], mins[0]);
        }
      }
      Reals4 scale_lanes, min_lanes = Reals4{};
      F::block(record_halves, scale_lanes, min_lanes);
      float32x4_t scale, min;
      std::memcpy(&scale, &scale_lanes, sizeof(scale));
      std::memcpy(&min, &min_lanes, sizeof(min));
      CUSTOM_OPS_UNROLL
      for (int t = 0; t < T; ++t) {
        const float dx = a.scale(t0 + t, b);
        acc[p][t] = vfmaq_f32(acc[p][t], vcvtq_f32_s32(dots[t]), vmulq_f32(scale, vdupq_n_f32(dx)));
        if constexpr (F::kHasMin && F::kSubScales) {
          acc[p][t] = vfmaq_f32(acc[p][t], vcvtq_f32_s32(mins[t]), vmulq_f32(min, vdupq_n_f32(dx)));
        } else if constexpr (F::kHasMin) {
          const float sum = static_cast<float>(a.sum(t0 + t, b * F::kWeights, F::kSub));
          acc[p][t] = vfmaq_f32(acc[p][t], min, vdupq_n_f32(dx * sum));
        }
      }
    }
  }
  CUSTOM_OPS_UNROLL
  for (int p = 0; p < 4; ++p) {
    CUSTOM_OPS_UNROLL
    for (int t = 0; t < T; ++t) {
      float* out = task.out + (t0 + t) * task.n + g * kGroup + p * kQuarter;
      if constexpr (kFull) {
        vst1q_f32(out, acc[p][t]);
      } else if (p < quarters) {
        float lanes[kQuarter];
        vst1q_f32(lanes, acc[p][t]);
        std::memcpy(out, lanes, static_cast<size_t>(std::min<int64_t>(kQuarter, R - p * kQuarter)) * sizeof(float));
      }
    }
  }
}

// The group tiles of format F for T tokens from t0, over groups [first, end): sdot alone, or (kMatrix) smmla for
// pairs of tokens and sdot for a last one.
template <class F, bool kMatrix>
struct GroupTilesArm64 {
  template <int T>
  static CUSTOM_OPS_INLINE void run(const Task& task, int64_t t0, int64_t first, int64_t end) {
    using Dots = std::conditional_t<kMatrix && T % 2 == 0, SmmlaDots, SdotDots>;
    const Packed<F> w{static_cast<const uint8_t*>(task.weight), task.n, task.k / F::kWeights};
    for (int64_t g = first; g < end; ++g) {
      if (w.rows(g) == kGroup) {
        group_arm64<F, T, true, Dots>(task, w, g, t0);
      } else {
        group_arm64<F, T, false, Dots>(task, w, g, t0);
      }
    }
  }
};

}  // namespace blocks
}  // namespace native
}  // namespace custom
#endif
