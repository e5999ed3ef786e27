// The one kernel body of the block-format ops (ops/linear_f32, ops/q8_0, ops/q4_0, ops/q4_1): a linear layer whose
// weight is a constant of the program, stored as llama.cpp's blocks of 32 weights (Q8_0, Q4_0, Q4_1) or as plain
// float32 rows (F32), and an embedding lookup from the same rows, so that a tied embedding and output projection are
// one tensor. Each op's kernel source instantiates it for its format, for the ExecuTorch runtime and (ATen mode) for
// PyTorch.
//
// A weight's layout (what my_ops/hf/quantize.py packs at export; ops/<format>/<format>.py reads it back): one row per
// output feature; a row holds its blocks' quants, then its blocks' scale records, so the quants of consecutive blocks
// are contiguous (llama.cpp's block_q8_0, block_q4_0 and block_q4_1 hold the same bytes, each record first in its
// block):
//   Q8_0  32 int8 q per block                                  record: fp16 d           w = d * q
//   Q4_0  16 bytes per block, byte j = q[j] | q[j + 16] << 4    record: fp16 d           w = d * (q - 8)
//   Q4_1  as Q4_0                                              record: fp16 d, fp16 m   w = d * q + m
//
// Linear: out[m, n] = sum_k x[m, k] * w[n, k]. For the quantized formats each activation row is first quantized to
// int8 per block of 32 (d = max|x| / 127, q = round-half-even(x / d), llama.cpp's Q8_0), and each block contributes
// an exact integer dot product times d_w * d_x: the op computes the float arithmetic of those quantized activations
// (its reference does the same with ATen ops). With AVX-512 VNNI the dots are vpdpbusd over two blocks at a time;
// elsewhere a portable loop that the compiler vectorizes (AVX2, NEON, baseline). Rows are split across the thread
// pool; a task keeps its rows in cache while it goes through every token of the call, so at prefill each weight block
// is read from memory once per call, not once per token.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "elementwise_loop.h"
#include "kernel_contract.h"

#define CUSTOM_OPS_BLOCKS_INLINE inline __attribute__((always_inline))
// The tiles' loops over rows and tokens, unrolled: their accumulators then live in registers (without it GCC kept them
// in memory, a store and a reload on every step of the dot: six cycles per pair of blocks instead of two).
#if defined(__clang__)
#define CUSTOM_OPS_UNROLL _Pragma("unroll")
#else
#define CUSTOM_OPS_UNROLL _Pragma("GCC unroll 16")
#endif
#ifdef CUSTOM_OPS_X86_DISPATCH
#define CUSTOM_OPS_AVX512_VNNI \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#endif

namespace custom {
namespace native {
namespace blocks {

constexpr int64_t kBlock = 32;  // weights per block, every quantized format

enum class Format { kF32, kQ8_0, kQ4_0, kQ4_1 };

template <Format F>
struct Traits {  // F32: rows of K floats, no blocks
  static constexpr const char* kName = "F32";
  static constexpr int64_t kQuantBytes = 0, kScaleBytes = 0;
};
template <>
struct Traits<Format::kQ8_0> {
  static constexpr const char* kName = "Q8_0";
  static constexpr int64_t kQuantBytes = 32, kScaleBytes = 2;
};
template <>
struct Traits<Format::kQ4_0> {
  static constexpr const char* kName = "Q4_0";
  static constexpr int64_t kQuantBytes = 16, kScaleBytes = 2;
};
template <>
struct Traits<Format::kQ4_1> {
  static constexpr const char* kName = "Q4_1";
  static constexpr int64_t kQuantBytes = 16, kScaleBytes = 4;
};

template <Format F>
constexpr bool kNibbles = F == Format::kQ4_0 || F == Format::kQ4_1;

template <Format F>
constexpr int64_t kBlockBytes = Traits<F>::kQuantBytes + Traits<F>::kScaleBytes;

inline float half_to_float(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, sizeof(bits));
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

// One row of a block-format weight of `blocks` blocks.
template <Format F>
struct Row {
  const uint8_t* quants;
  const uint8_t* scales;

  CUSTOM_OPS_BLOCKS_INLINE Row(const uint8_t* weight, int64_t row, int64_t blocks)
      : quants(weight + row * blocks * kBlockBytes<F>), scales(quants + blocks * Traits<F>::kQuantBytes) {}

  CUSTOM_OPS_BLOCKS_INLINE float d(int64_t block) const { return half_to_float(scales + block * Traits<F>::kScaleBytes); }
  CUSTOM_OPS_BLOCKS_INLINE float m(int64_t block) const {
    return half_to_float(scales + block * Traits<F>::kScaleBytes + 2);
  }

  // Block b's 32 weights as integers: q for Q8_0 and Q4_1, q - 8 for Q4_0 (w = d * integer, + m for Q4_1).
  CUSTOM_OPS_BLOCKS_INLINE void integers(int64_t b, int8_t* q) const {
    const uint8_t* p = quants + b * Traits<F>::kQuantBytes;
    if constexpr (F == Format::kQ8_0) {
      std::memcpy(q, p, kBlock);
    } else {
      constexpr int kOffset = F == Format::kQ4_0 ? 8 : 0;
      for (int j = 0; j < 16; ++j) {
        q[j] = static_cast<int8_t>((p[j] & 0x0F) - kOffset);
        q[j + 16] = static_cast<int8_t>((p[j] >> 4) - kOffset);
      }
    }
  }
};

// The bytes a weight of n rows of k weights takes in format F.
template <Format F>
constexpr int64_t row_bytes(int64_t k) {
  return F == Format::kF32 ? k * 4 : k / kBlock * kBlockBytes<F>;
}

// ---- Activations, quantized per block of 32 (the quantized formats) ------------------------------------------------
// d = max|x| / 127 and q = round-half-even(x / d), q = 0 where d is 0. A block holding an infinity or a NaN gets d NaN
// (and q 0), so every output it reaches is NaN, as a float product would make it.
inline void quantize_block(const float* x, int8_t* q, float* d, int32_t* sum) {
  float amax = 0.0f;
  bool finite = true;
  for (int64_t j = 0; j < kBlock; ++j) {
    amax = std::max(amax, std::fabs(x[j]));
    finite = finite && std::isfinite(x[j]);
  }
  const float scale = finite ? amax / 127.0f : std::numeric_limits<float>::quiet_NaN();
  int32_t total = 0;
  for (int64_t j = 0; j < kBlock; ++j) {
    const float v = finite && scale != 0.0f ? std::nearbyint(x[j] / scale) : 0.0f;
    q[j] = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
    total += q[j];
  }
  *d = scale;
  *sum = total;
}

// Every token's activations, prepared once per call on the calling thread for the kernel that reads them: q in order,
// d and the sum of q per block. The AVX-512 path (prepare_avx512) also rearranges each whole pair of blocks for its
// vectors, which hold two blocks (Q4_0 and Q4_1: as b0[0:16], b1[0:16], b0[16:32], b1[16:32], the order their nibbles
// unpack in; Q8_0: q + 128 as unsigned bytes, the operand vpdpbusd takes unsigned), and gives each int32 lane of a dot
// its block's d, and what the lane's four q add besides their products: Q4_0 -8 * their sum (the weights' offset of
// 8), Q4_1 d * their sum (what m multiplies). A last odd block stays as it is, for the portable loop.
struct Activations {
  int64_t tokens = 0, k = 0, blocks = 0, pairs = 0;
  std::vector<int8_t> q;             // [tokens][k]
  std::vector<float> d;              // [tokens][blocks]
  std::vector<int32_t> sum;          // [tokens][blocks]
  std::vector<float> lane_d;         // AVX-512: [tokens][pairs][16]
  std::vector<int32_t> lane_offset;  // AVX-512, Q4_0: [tokens][pairs][16]
  std::vector<float> lane_min;       // AVX-512, Q4_1: [tokens][pairs][16]

  CUSTOM_OPS_BLOCKS_INLINE const int8_t* row(int64_t t) const { return q.data() + t * k; }
};

inline void prepare(const float* x, int64_t tokens, int64_t k, Activations& a) {
  a.tokens = tokens;
  a.k = k;
  a.blocks = k / kBlock;
  a.pairs = 0;
  a.q.resize(tokens * k);
  a.d.resize(tokens * a.blocks);
  a.sum.resize(tokens * a.blocks);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t b = 0; b < a.blocks; ++b) {
      const int64_t i = t * a.blocks + b;
      quantize_block(x + t * k + b * kBlock, &a.q[t * k + b * kBlock], &a.d[i], &a.sum[i]);
    }
  }
}

// ---- The portable kernel (every ISA; the compiler vectorizes it for the one it is compiled for) -------------------
constexpr int kTokens = 4;  // tokens sharing each weight read at prefill

// sums[t] += row . token (t0 + t), over blocks [first_block, blocks).
template <Format F>
CUSTOM_OPS_BLOCKS_INLINE void add_blocks_portable(const Row<F>& row, const Activations& a, int64_t t0, int tokens,
                                                  int64_t first_block, float* sums) {
  for (int64_t b = first_block; b < a.blocks; ++b) {
    int8_t w[kBlock];
    row.integers(b, w);
    const float dw = row.d(b);
    for (int t = 0; t < tokens; ++t) {
      const int8_t* x = a.row(t0 + t) + b * kBlock;
      int32_t dot = 0;
      for (int j = 0; j < kBlock; ++j) {
        dot += static_cast<int32_t>(w[j]) * static_cast<int32_t>(x[j]);
      }
      const int64_t i = (t0 + t) * a.blocks + b;
      sums[t] += dw * a.d[i] * static_cast<float>(dot);
      if constexpr (F == Format::kQ4_1) {
        sums[t] += row.m(b) * a.d[i] * static_cast<float>(a.sum[i]);
      }
    }
  }
}

// F32: eight partial sums per token, added pairwise at the end (a fixed order, so the compiler may keep them in one
// vector: the project compiles without reassociation).
CUSTOM_OPS_BLOCKS_INLINE void add_f32_portable(const float* w, const float* x, int64_t k, int tokens, float* sums) {
  for (int t = 0; t < tokens; ++t) {
    const float* xt = x + t * k;
    float partial[8] = {};
    int64_t j = 0;
    for (; j + 8 <= k; j += 8) {
      for (int l = 0; l < 8; ++l) {
        partial[l] += w[j + l] * xt[j + l];
      }
    }
    for (; j < k; ++j) {
      partial[j % 8] += w[j] * xt[j];
    }
    sums[t] += ((partial[0] + partial[1]) + (partial[2] + partial[3])) +
               ((partial[4] + partial[5]) + (partial[6] + partial[7]));
  }
}

// What a task computes: rows [row_begin, row_end) of the weight against every token, into out [tokens][n].
struct Task {
  const void* weight;
  const float* x;  // F32: the activations themselves
  const Activations* a;
  int64_t tokens, n, k;
  float* out;
};

template <Format F>
CUSTOM_OPS_BLOCKS_INLINE void rows_portable(const Task& task, int64_t row_begin, int64_t row_end) {
  for (int64_t t0 = 0; t0 < task.tokens; t0 += kTokens) {
    const int tokens = static_cast<int>(std::min<int64_t>(kTokens, task.tokens - t0));
    for (int64_t r = row_begin; r < row_end; ++r) {
      float sums[kTokens] = {};
      if constexpr (F == Format::kF32) {
        add_f32_portable(static_cast<const float*>(task.weight) + r * task.k, task.x + t0 * task.k, task.k, tokens,
                         sums);
      } else {
        add_blocks_portable<F>(Row<F>(static_cast<const uint8_t*>(task.weight), r, task.a->blocks), *task.a, t0,
                               tokens, 0, sums);
      }
      for (int t = 0; t < tokens; ++t) {
        task.out[(t0 + t) * task.n + r] = sums[t];
      }
    }
  }
}

template <Format F>
void rows_baseline(const Task& task, int64_t row_begin, int64_t row_end) {
  rows_portable<F>(task, row_begin, row_end);
}

#ifdef CUSTOM_OPS_X86_DISPATCH
template <Format F>
CUSTOM_OPS_AVX2 void rows_avx2(const Task& task, int64_t row_begin, int64_t row_end) {
  rows_portable<F>(task, row_begin, row_end);
}

// ---- AVX-512 (with VNNI) ----------------------------------------------------------------------------------------------
// Weights stream from memory once per call; with the hardware prefetcher alone one thread read them at a third of
// what a plain sum reads (the loop issues too few loads to keep enough cache misses in flight), so each step asks for
// the line this far ahead (measured: 1-16 KiB, 4 KiB best).
constexpr int64_t kPrefetchBytes = 4096;

CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_BLOCKS_INLINE void prefetch(const void* p) {
  _mm_prefetch(static_cast<const char*>(p) + kPrefetchBytes, _MM_HINT_T0);
}

// Activations, the same values as quantize_block's, 32 at a time: the division and the rounding (to nearest, ties to
// even) are IEEE operations, and a maximum does not depend on its order.
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_BLOCKS_INLINE void quantize_block_avx512(const float* x, int8_t* q, float* d,
                                                                           int32_t* sum) {
  const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
  constexpr int kNotFinite = 0x01 | 0x08 | 0x10 | 0x80;  // quiet NaN, +inf, -inf, signaling NaN
  const bool finite = (_mm512_fpclass_ps_mask(v0, kNotFinite) | _mm512_fpclass_ps_mask(v1, kNotFinite)) == 0;
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
  const float scale = finite ? amax / 127.0f : std::numeric_limits<float>::quiet_NaN();
  __m512i i0 = _mm512_setzero_si512(), i1 = _mm512_setzero_si512();
  if (finite && scale != 0.0f) {
    const __m512 s = _mm512_set1_ps(scale);
    constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    i0 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_div_ps(v0, s), kNearest));
    i1 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_div_ps(v1, s), kNearest));
  }
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtsepi32_epi8(i0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtsepi32_epi8(i1));
  *d = scale;
  *sum = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
}

// Lane -> which of a pair's two blocks: Q8_0 lanes 0-7 are the first (its bytes in order); Q4_0 and Q4_1 lanes 0-3
// and 8-11 (the order their nibbles unpack in).
template <Format F>
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_BLOCKS_INLINE __m512i lane_blocks() {
  return F == Format::kQ8_0 ? _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0)
                            : _mm512_set_epi32(1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0);
}

template <Format F>
CUSTOM_OPS_AVX512_VNNI void prepare_avx512(const float* x, int64_t tokens, int64_t k, Activations& a) {
  a.tokens = tokens;
  a.k = k;
  a.blocks = k / kBlock;
  a.pairs = a.blocks / 2;
  a.q.resize(tokens * k);
  a.d.resize(tokens * a.blocks);
  a.sum.resize(tokens * a.blocks);
  a.lane_d.resize(tokens * a.pairs * 16);
  a.lane_offset.resize(F == Format::kQ4_0 ? tokens * a.pairs * 16 : 0);
  a.lane_min.resize(F == Format::kQ4_1 ? tokens * a.pairs * 16 : 0);
  const __m512i halves = _mm512_set_epi64(7, 6, 3, 2, 5, 4, 1, 0);  // b0[0:16] b1[0:16] b0[16:32] b1[16:32]
  const __m512i ones = _mm512_set1_epi8(1), zero = _mm512_setzero_si512();
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t b = 0; b < a.blocks; ++b) {
      const int64_t i = t * a.blocks + b;
      quantize_block_avx512(x + t * k + b * kBlock, &a.q[t * k + b * kBlock], &a.d[i], &a.sum[i]);
    }
    for (int64_t p = 0; p < a.pairs; ++p) {
      int8_t* q = &a.q[t * k + p * 2 * kBlock];
      const int64_t lanes = (t * a.pairs + p) * 16;
      const __m512 pair_d = _mm512_castps128_ps512(_mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(
          &a.d[t * a.blocks + 2 * p]))));
      const __m512 d = _mm512_permutexvar_ps(lane_blocks<F>(), pair_d);
      _mm512_storeu_ps(&a.lane_d[lanes], d);
      __m512i v = _mm512_loadu_si512(q);
      if constexpr (kNibbles<F>) {
        v = _mm512_permutexvar_epi64(halves, v);
        const __m512i lane_sums = _mm512_dpbusd_epi32(zero, ones, v);
        if constexpr (F == Format::kQ4_0) {
          _mm512_storeu_si512(&a.lane_offset[lanes], _mm512_sub_epi32(zero, _mm512_slli_epi32(lane_sums, 3)));
        } else {
          _mm512_storeu_ps(&a.lane_min[lanes], _mm512_mul_ps(d, _mm512_cvtepi32_ps(lane_sums)));
        }
      } else {
        v = _mm512_xor_si512(v, _mm512_set1_epi8(static_cast<char>(0x80)));
      }
      _mm512_storeu_si512(q, v);
    }
  }
}

// One step of the R x T tile: R rows of weights against T tokens, each accumulator a row-token pair's 16 lanes.
// Quantized formats: a pair of blocks per 512-bit vector, vpdpbusd (unsigned bytes x signed bytes into 16 int32 lanes
// of four products each), each lane scaled by its blocks' d_w * d_x (Q4_1: plus m_w times the lane's d_x * sum of
// x); the rows' scale records converted 16 halves at a time.
template <Format F, int R, int T>
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_BLOCKS_INLINE void tile_blocks(const Task& task, int64_t r0, int64_t t0) {
  const Activations& a = *task.a;
  const __m512i zero = _mm512_setzero_si512();
  const __m512i low_nibble = _mm512_set1_epi8(0x0F), ones = _mm512_set1_epi8(1);
  constexpr int64_t kHalvesPerBlock = Traits<F>::kScaleBytes / 2;  // 1, or 2 for Q4_1 (d, m)
  constexpr int64_t kPairsPerLoad = 16 / (2 * kHalvesPerBlock);    // the pairs whose records 16 halves hold
  const uint8_t* weight = static_cast<const uint8_t*>(task.weight);
  const uint8_t* quants[R];
  const uint8_t* scales[R];
  CUSTOM_OPS_UNROLL
  for (int r = 0; r < R; ++r) {
    const Row<F> row(weight, r0 + r, a.blocks);
    quants[r] = row.quants;
    scales[r] = row.scales;
  }
  __m512 acc[R][T];
  CUSTOM_OPS_UNROLL
  for (int r = 0; r < R; ++r) {
    CUSTOM_OPS_UNROLL
    for (int t = 0; t < T; ++t) {
      acc[r][t] = _mm512_setzero_ps();
    }
  }
  for (int64_t p0 = 0; p0 < a.pairs; p0 += kPairsPerLoad) {
    const int64_t pairs = std::min<int64_t>(kPairsPerLoad, a.pairs - p0);
    const __mmask16 present = static_cast<__mmask16>((1u << (2 * kHalvesPerBlock * pairs)) - 1);
    __m512 records[R];
    CUSTOM_OPS_UNROLL
    for (int r = 0; r < R; ++r) {
      records[r] = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(present, scales[r] + 2 * kHalvesPerBlock * 2 * p0));
    }
    // The records of pair p0 + j: d of blocks 2j and 2j + 1 (at half 2j and 2j + 1, or 4j and 4j + 2 with m after).
    __m512i which = _mm512_mullo_epi32(lane_blocks<F>(), _mm512_set1_epi32(static_cast<int>(kHalvesPerBlock)));
    const __m512i step = _mm512_set1_epi32(static_cast<int>(2 * kHalvesPerBlock));
    for (int64_t j = 0; j < pairs; ++j, which = _mm512_add_epi32(which, step)) {
      const int64_t p = p0 + j;
      __m512i x[T], minus_offset[T];
      __m512 dx[T], xmin[T];
      CUSTOM_OPS_UNROLL
      for (int t = 0; t < T; ++t) {
        const int64_t lanes = ((t0 + t) * a.pairs + p) * 16;
        x[t] = _mm512_loadu_si512(a.row(t0 + t) + 64 * p);
        dx[t] = _mm512_loadu_ps(&a.lane_d[lanes]);
        if constexpr (F == Format::kQ4_0) {
          minus_offset[t] = _mm512_loadu_si512(&a.lane_offset[lanes]);
        } else if constexpr (F == Format::kQ4_1) {
          minus_offset[t] = zero;
          xmin[t] = _mm512_loadu_ps(&a.lane_min[lanes]);
        }
      }
      CUSTOM_OPS_UNROLL
      for (int r = 0; r < R; ++r) {
        __m512i w;
        if constexpr (F == Format::kQ8_0) {
          prefetch(quants[r] + 64 * p);
          // x is stored as q + 128 (unsigned): x.w = (q + 128).w - 128 * sum(w), the lane sums from one more vpdpbusd.
          w = _mm512_loadu_si512(quants[r] + 64 * p);
          const __m512i correction = _mm512_slli_epi32(_mm512_dpbusd_epi32(zero, ones, w), 7);
          CUSTOM_OPS_UNROLL
          for (int t = 0; t < T; ++t) {
            minus_offset[t] = _mm512_sub_epi32(zero, correction);
          }
        } else {
          if (j % 2 == 0) {
            prefetch(quants[r] + 32 * p);
          }
          // Two blocks' 32 bytes in both halves; the high half shifted to its high nibbles, then the low four bits.
          w = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(quants[r] + 32 * p)));
          w = _mm512_and_si512(_mm512_mask_srli_epi16(w, 0xFFFF0000u, w, 4), low_nibble);
        }
        const __m512 dw = _mm512_permutexvar_ps(which, records[r]);
        __m512 mw = _mm512_setzero_ps();
        if constexpr (F == Format::kQ4_1) {
          mw = _mm512_permutexvar_ps(_mm512_add_epi32(which, _mm512_set1_epi32(1)), records[r]);
        }
        CUSTOM_OPS_UNROLL
        for (int t = 0; t < T; ++t) {
          // The dot starts from minus the lanes' offset (Q4_0: 8 * their sum of x; Q8_0: 128 * their sum of w), so
          // vpdpbusd's own addition subtracts it. The nibbles are the unsigned operand, or Q8_0's x + 128.
          const __m512i dot = F == Format::kQ8_0 ? _mm512_dpbusd_epi32(minus_offset[t], x[t], w)
                                                 : _mm512_dpbusd_epi32(minus_offset[t], w, x[t]);
          acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dw, dx[t]), acc[r][t]);
          if constexpr (F == Format::kQ4_1) {
            acc[r][t] = _mm512_fmadd_ps(mw, xmin[t], acc[r][t]);
          }
        }
      }
    }
  }
  CUSTOM_OPS_UNROLL
  for (int r = 0; r < R; ++r) {
    float sums[T];
    CUSTOM_OPS_UNROLL
    for (int t = 0; t < T; ++t) {
      sums[t] = _mm512_reduce_add_ps(acc[r][t]);
    }
    add_blocks_portable<F>(Row<F>(weight, r0 + r, a.blocks), a, t0, T, 2 * a.pairs, sums);  // a last odd block
    CUSTOM_OPS_UNROLL
    for (int t = 0; t < T; ++t) {
      task.out[(t0 + t) * task.n + r0 + r] = sums[t];
    }
  }
}

// F32: R rows' 16 weights each against T tokens' 16 activations per step; the rows' tails through a mask.
template <int R, int T>
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_BLOCKS_INLINE void step_f32(const float* w, const float* x, int64_t k, int64_t j,
                                                            __mmask16 mask, __m512 (&acc)[R][T]) {
  __m512 xv[T];
  CUSTOM_OPS_UNROLL
  for (int t = 0; t < T; ++t) {
    xv[t] = _mm512_maskz_loadu_ps(mask, x + t * k + j);
  }
  CUSTOM_OPS_UNROLL
  for (int r = 0; r < R; ++r) {
    prefetch(w + r * k + j);
    const __m512 wv = _mm512_maskz_loadu_ps(mask, w + r * k + j);
    CUSTOM_OPS_UNROLL
    for (int t = 0; t < T; ++t) {
      acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
    }
  }
}

template <int R, int T>
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_BLOCKS_INLINE void tile_f32(const Task& task, int64_t r0, int64_t t0) {
  const int64_t k = task.k;
  const float* w = static_cast<const float*>(task.weight) + r0 * k;
  const float* x = task.x + t0 * k;
  __m512 acc[R][T];
  CUSTOM_OPS_UNROLL
  for (int r = 0; r < R; ++r) {
    CUSTOM_OPS_UNROLL
    for (int t = 0; t < T; ++t) {
      acc[r][t] = _mm512_setzero_ps();
    }
  }
  int64_t j = 0;
  for (; j + 16 <= k; j += 16) {
    step_f32<R, T>(w, x, k, j, 0xFFFF, acc);
  }
  if (j < k) {
    step_f32<R, T>(w, x, k, j, static_cast<__mmask16>((1u << (k - j)) - 1), acc);
  }
  CUSTOM_OPS_UNROLL
  for (int r = 0; r < R; ++r) {
    CUSTOM_OPS_UNROLL
    for (int t = 0; t < T; ++t) {
      task.out[(t0 + t) * task.n + r0 + r] = _mm512_reduce_add_ps(acc[r][t]);
    }
  }
}

template <Format F, int R, int T>
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_BLOCKS_INLINE void tile_avx512(const Task& task, int64_t r0, int64_t t0) {
  if constexpr (F == Format::kF32) {
    tile_f32<R, T>(task, r0, t0);
  } else {
    tile_blocks<F, R, T>(task, r0, t0);
  }
}

// Rows [row_begin, row_end) against T tokens from t0: four rows at a time at decode (one token: each activation load
// feeds four rows' products, four independent sums in flight), two rows at a time for a group of tokens.
template <Format F, int T>
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_BLOCKS_INLINE void rows_of_tokens_avx512(const Task& task, int64_t t0,
                                                                           int64_t row_begin, int64_t row_end) {
  constexpr int R = T == 1 ? 4 : 2;
  int64_t r = row_begin;
  for (; r + R <= row_end; r += R) {
    tile_avx512<F, R, T>(task, r, t0);
  }
  for (; r < row_end; ++r) {
    tile_avx512<F, 1, T>(task, r, t0);
  }
}

template <Format F>
CUSTOM_OPS_AVX512_VNNI void rows_avx512(const Task& task, int64_t row_begin, int64_t row_end) {
  for (int64_t t0 = 0; t0 < task.tokens; t0 += kTokens) {
    switch (std::min<int64_t>(kTokens, task.tokens - t0)) {
      case 4: rows_of_tokens_avx512<F, 4>(task, t0, row_begin, row_end); break;
      case 3: rows_of_tokens_avx512<F, 3>(task, t0, row_begin, row_end); break;
      case 2: rows_of_tokens_avx512<F, 2>(task, t0, row_begin, row_end); break;
      default: rows_of_tokens_avx512<F, 1>(task, t0, row_begin, row_end); break;
    }
  }
}

// The AVX-512 path needs VNNI (every AVX-512 CPU since Ice Lake and Zen 4 has it); without it, the AVX2 build of the
// portable loop.

inline bool cpu_has_avx512_vnni() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") != 0;
  }();
  return has;
}
#endif

enum class Isa { kBaseline, kAvx2, kAvx512 };

template <Format F>
Isa isa_for() {
#ifdef CUSTOM_OPS_X86_DISPATCH
  switch (elementwise::detected_isa()) {
    case elementwise::Isa::kAvx512:
      return cpu_has_avx512_vnni() ? Isa::kAvx512 : Isa::kAvx2;
    case elementwise::Isa::kAvx2:
      return Isa::kAvx2;
    case elementwise::Isa::kBaseline:
      break;
  }
#endif
  return Isa::kBaseline;
}

template <Format F>
void run_rows(Isa isa, const Task& task, int64_t row_begin, int64_t row_end) {
  switch (isa) {
#ifdef CUSTOM_OPS_X86_DISPATCH
    case Isa::kAvx512:
      rows_avx512<F>(task, row_begin, row_end);
      return;
    case Isa::kAvx2:
      rows_avx2<F>(task, row_begin, row_end);
      return;
#endif
    default:
      rows_baseline<F>(task, row_begin, row_end);
  }
}

// Rows per task: a task's rows stay in the L1 cache while it goes through the tokens (about 16 KiB of them), and there
// are enough tasks to keep every thread busy. Calls under kSerialWork multiply-adds stay on the calling thread: waking
// the pool costs more than a small decode projection.
constexpr int64_t kTaskBytes = 16 << 10;
constexpr double kSerialWork = 1 << 18;

// out [tokens, n] = x [tokens, k] . weight^T, weight n rows of format F. False when the pool did not run every task.
template <Format F>
bool linear(const float* x, int64_t tokens, int64_t k, const void* weight, int64_t n, float* out) {
  const Isa isa = isa_for<F>();
  thread_local Activations activations;  // the calling thread's; its tasks only read it
  if constexpr (F != Format::kF32) {
#ifdef CUSTOM_OPS_X86_DISPATCH
    if (isa == Isa::kAvx512) {
      prepare_avx512<F>(x, tokens, k, activations);
    } else {
      prepare(x, tokens, k, activations);
    }
#else
    prepare(x, tokens, k, activations);
#endif
  }
  const Task task{weight, x, &activations, tokens, n, k, out};
  const int64_t threads = std::max<int64_t>(1, contract::thread_count());
  const int64_t by_cache = std::max<int64_t>(1, kTaskBytes / std::max<int64_t>(1, row_bytes<F>(k)));
  const int64_t rows_per_task = std::max<int64_t>(1, std::min(by_cache, (n + 2 * threads - 1) / (2 * threads)));
  const int64_t task_count = (n + rows_per_task - 1) / rows_per_task;
  const auto run = [&](int64_t first, int64_t end) {
    run_rows<F>(isa, task, first * rows_per_task, std::min(n, end * rows_per_task));
  };
  bool ran = true;
  if (task_count < 2 || static_cast<double>(tokens) * static_cast<double>(n) * static_cast<double>(k) < kSerialWork) {
    run(0, task_count);
  } else {
    ran = contract::parallel_for(0, task_count, 1, run);
  }
  elementwise::count(isa == Isa::kAvx512 ? elementwise::kAvx512Elements
                         : isa == Isa::kAvx2 ? elementwise::kAvx2Elements
                                             : elementwise::kBaselineElements,
                     static_cast<uint64_t>(tokens * n));
  return ran;
}

// ---- Embedding: rows of the same weight, dequantized -----------------------------------------------------------
// out[i] = row indices[i] as floats: d * integer (+ m for Q4_1), the product exact in float (an fp16 d times an integer
// of 8 bits fits float's 24-bit significand) and Q4_1's sum rounded once, so the lookup equals the reference bit for
// bit. Indices are checked by the caller.
template <Format F>
void embed(const uint8_t* weight, int64_t k, const int64_t* indices, int64_t count, float* out) {
  const int64_t blocks = k / kBlock;
  for (int64_t i = 0; i < count; ++i) {
    const Row<F> row(weight, indices[i], blocks);
    float* o = out + i * k;
    for (int64_t b = 0; b < blocks; ++b) {
      int8_t q[kBlock];
      row.integers(b, q);
      const float d = row.d(b);
      if constexpr (F == Format::kQ4_1) {
        const float m = row.m(b);
        for (int64_t j = 0; j < kBlock; ++j) {
          o[b * kBlock + j] = d * static_cast<float>(q[j]) + m;
        }
      } else {
        for (int64_t j = 0; j < kBlock; ++j) {
          o[b * kBlock + j] = d * static_cast<float>(q[j]);
        }
      }
    }
  }
}

}  // namespace blocks
}  // namespace native
}  // namespace custom
