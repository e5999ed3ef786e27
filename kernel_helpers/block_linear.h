// The one kernel body of the block-format ops (ops/linear_f32, ops/q8_0, ops/q4_0, ops/q4_1): a linear layer whose
// weight is a constant of the program, stored as llama.cpp's blocks of 32 weights (Q8_0, Q4_0, Q4_1) or as plain
// float32 rows (F32), and an embedding lookup from the same tensor, so that a tied embedding and output projection are
// one constant. Each op's kernel source instantiates it for its format, for the ExecuTorch runtime and (ATen mode) for
// PyTorch.
//
// The quantized layout (packed at export by my_ops/hf/quantize.py; each op's reference reads it back with ATen ops):
// the n rows (output features) in groups of 16, the last group holding what remains; a group of R rows stores, block
// after block (32 inputs each), the block's quants of its R rows interleaved, then their scale records:
//   Q8_0  8 steps of R x 4 bytes: step s, row l, byte j = q[l][4s + j] + 128     records: R fp16 d       w = d * q
//   Q4_0  4 chunks of R x 4 bytes: chunk c, row l, byte j = q[l][8c + j] | q[l][8c + 4 + j] << 4
//                                                                                  records: R fp16 d       w = d * (q - 8)
//   Q4_1  as Q4_0                                                                  records: R fp16 d, R fp16 m
//                                                                                                          w = d * q + m
// The same bytes as llama.cpp's block_q8_0 / block_q4_0 / block_q4_1, rearranged (Q8_0's offset by 128), so the
// tensor's size is llama.cpp's. Why interleaved: one 512-bit load holds four inputs of 16 rows, the dot products run
// with one row per lane (vpdpbusd against four inputs of the activation broadcast from memory), and a group's 16 sums
// come out in one vector: no reduction across lanes, a third of the instructions of reading row after row.
//
// Linear: out[m, n] = sum_k x[m, k] * w[n, k]. For the quantized formats each activation row is first quantized to
// int8 per block of 32 (d = max|x| / 127, q = round-half-even(x / d), llama.cpp's Q8_0), and each block contributes an
// exact integer dot product times d_w * d_x (plus m_w * d_x * sum of x's q for Q4_1): the op computes the float
// arithmetic of those quantized activations (its reference does the same with ATen ops). With AVX-512 VNNI the dots
// are vpdpbusd; elsewhere a portable loop the compiler vectorizes (AVX2, NEON, baseline). Groups are split across the
// thread pool; a task keeps its group in cache while it goes through every token of the call, so at prefill each
// weight block is read from memory once per call, not once per token. F32 weights stay in plain rows [n, k], the
// layout aten::embedding reads.
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
// The tiles' loops over tokens and steps, unrolled: their accumulators then live in registers (without it GCC kept
// them in memory, a store and a reload on every step of a dot, which tripled a decode step's time).
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
constexpr int64_t kGroup = 16;  // rows interleaved: one lane of a 512-bit vector each

enum class Format { kF32, kQ8_0, kQ4_0, kQ4_1 };

template <Format F>
struct Traits {  // F32: rows of k floats, no blocks
  static constexpr const char* kName = "F32";
  static constexpr int64_t kQuantBytes = 0, kRecordBytes = 0;
};
template <>
struct Traits<Format::kQ8_0> {
  static constexpr const char* kName = "Q8_0";
  static constexpr int64_t kQuantBytes = 32, kRecordBytes = 2;  // per row and block
};
template <>
struct Traits<Format::kQ4_0> {
  static constexpr const char* kName = "Q4_0";
  static constexpr int64_t kQuantBytes = 16, kRecordBytes = 2;
};
template <>
struct Traits<Format::kQ4_1> {
  static constexpr const char* kName = "Q4_1";
  static constexpr int64_t kQuantBytes = 16, kRecordBytes = 4;
};

template <Format F>
constexpr int64_t kBlockBytes = Traits<F>::kQuantBytes + Traits<F>::kRecordBytes;

// The bytes one row of k weights takes in format F (the tensor is [n, row_bytes]).
template <Format F>
constexpr int64_t row_bytes(int64_t k) {
  return F == Format::kF32 ? k * 4 : k / kBlock * kBlockBytes<F>;
}

inline float half_to_float(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, sizeof(bits));
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

// A packed weight of n rows and `blocks` blocks per row.
template <Format F>
struct Packed {
  const uint8_t* data;
  int64_t n, blocks;

  CUSTOM_OPS_BLOCKS_INLINE int64_t groups() const { return (n + kGroup - 1) / kGroup; }
  CUSTOM_OPS_BLOCKS_INLINE int64_t rows(int64_t g) const { return std::min(kGroup, n - g * kGroup); }
  // Block b of group g: its quants (rows(g) * kQuantBytes), then its records. Every group before g is full.
  CUSTOM_OPS_BLOCKS_INLINE const uint8_t* block(int64_t g, int64_t b) const {
    return data + (g * kGroup * blocks + b * rows(g)) * kBlockBytes<F>;
  }
};

// Row l (of R) of a block: its 32 weights as integers (q for Q8_0 and Q4_1, q - 8 for Q4_0: w = d * integer + m),
// its d and its m (0 but for Q4_1).
template <Format F>
CUSTOM_OPS_BLOCKS_INLINE void row_of_block(const uint8_t* block, int64_t R, int64_t l, int8_t* q, float& d, float& m) {
  if constexpr (F == Format::kQ8_0) {
    for (int s = 0; s < 8; ++s) {
      for (int j = 0; j < 4; ++j) {
        q[4 * s + j] = static_cast<int8_t>(static_cast<int>(block[(s * R + l) * 4 + j]) - 128);
      }
    }
  } else {
    constexpr int kOffset = F == Format::kQ4_0 ? 8 : 0;
    for (int c = 0; c < 4; ++c) {
      for (int j = 0; j < 4; ++j) {
        const uint8_t byte = block[(c * R + l) * 4 + j];
        q[8 * c + j] = static_cast<int8_t>((byte & 0x0F) - kOffset);
        q[8 * c + 4 + j] = static_cast<int8_t>((byte >> 4) - kOffset);
      }
    }
  }
  const uint8_t* records = block + R * Traits<F>::kQuantBytes;
  d = half_to_float(records + 2 * l);
  m = F == Format::kQ4_1 ? half_to_float(records + 2 * R + 2 * l) : 0.0f;
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

// Every token's activations, prepared once per call on the calling thread: q in order, d and the sum of q per block.
struct Activations {
  int64_t tokens = 0, k = 0, blocks = 0;
  std::vector<int8_t> q;     // [tokens][k]
  std::vector<float> d;      // [tokens][blocks]
  std::vector<int32_t> sum;  // [tokens][blocks]

  CUSTOM_OPS_BLOCKS_INLINE const int8_t* row(int64_t t) const { return q.data() + t * k; }
  CUSTOM_OPS_BLOCKS_INLINE int64_t at(int64_t t, int64_t b) const { return t * blocks + b; }

  void resize(int64_t tokens_, int64_t k_) {
    tokens = tokens_, k = k_, blocks = k_ / kBlock;
    q.resize(tokens * k);
    d.resize(tokens * blocks);
    sum.resize(tokens * blocks);
  }
};

inline void prepare(const float* x, int64_t tokens, int64_t k, Activations& a) {
  a.resize(tokens, k);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t b = 0; b < a.blocks; ++b) {
      quantize_block(x + t * k + b * kBlock, &a.q[t * k + b * kBlock], &a.d[a.at(t, b)], &a.sum[a.at(t, b)]);
    }
  }
}

// What a task computes: its part of the weight (groups, or F32 rows) against every token, into out [tokens][n].
struct Task {
  const void* weight;
  const float* x;  // F32: the activations themselves
  const Activations* a;
  int64_t tokens, n, k;
  float* out;
};

// ---- The portable kernel (every ISA; the compiler vectorizes it for the one it is compiled for) -------------------
// Groups [first, end): each row's blocks against every token, an exact integer dot per block.
template <Format F>
CUSTOM_OPS_BLOCKS_INLINE void groups_portable(const Task& task, int64_t first, int64_t end) {
  const Activations& a = *task.a;
  const Packed<F> w{static_cast<const uint8_t*>(task.weight), task.n, a.blocks};
  std::vector<float> sums(static_cast<size_t>(kGroup * task.tokens));
  for (int64_t g = first; g < end; ++g) {
    const int64_t R = w.rows(g);
    std::fill(sums.begin(), sums.end(), 0.0f);
    for (int64_t b = 0; b < a.blocks; ++b) {
      const uint8_t* block = w.block(g, b);
      for (int64_t l = 0; l < R; ++l) {
        int8_t q[kBlock];
        float d, m;
        row_of_block<F>(block, R, l, q, d, m);
        for (int64_t t = 0; t < task.tokens; ++t) {
          const int8_t* x = a.row(t) + b * kBlock;
          int32_t dot = 0;
          for (int j = 0; j < kBlock; ++j) {
            dot += static_cast<int32_t>(q[j]) * static_cast<int32_t>(x[j]);
          }
          const float dx = a.d[a.at(t, b)];
          sums[t * kGroup + l] += d * dx * static_cast<float>(dot);
          if constexpr (F == Format::kQ4_1) {
            sums[t * kGroup + l] += m * dx * static_cast<float>(a.sum[a.at(t, b)]);
          }
        }
      }
    }
    for (int64_t t = 0; t < task.tokens; ++t) {
      std::copy(&sums[t * kGroup], &sums[t * kGroup + R], task.out + t * task.n + g * kGroup);
    }
  }
}

// F32 rows [first, end): eight partial sums per token, added pairwise at the end (a fixed order, so the compiler may
// keep them in one vector: the project compiles without reassociation).
CUSTOM_OPS_BLOCKS_INLINE void rows_f32_portable(const Task& task, int64_t first, int64_t end) {
  const int64_t k = task.k;
  for (int64_t r = first; r < end; ++r) {
    const float* w = static_cast<const float*>(task.weight) + r * k;
    for (int64_t t = 0; t < task.tokens; ++t) {
      const float* x = task.x + t * k;
      float partial[8] = {};
      int64_t j = 0;
      for (; j + 8 <= k; j += 8) {
        for (int l = 0; l < 8; ++l) {
          partial[l] += w[j + l] * x[j + l];
        }
      }
      for (; j < k; ++j) {
        partial[j % 8] += w[j] * x[j];
      }
      task.out[t * task.n + r] = ((partial[0] + partial[1]) + (partial[2] + partial[3])) +
                                 ((partial[4] + partial[5]) + (partial[6] + partial[7]));
    }
  }
}

// A task's units: groups of 16 rows for the quantized formats, rows for F32.
template <Format F>
CUSTOM_OPS_BLOCKS_INLINE void units_portable(const Task& task, int64_t first, int64_t end) {
  if constexpr (F == Format::kF32) {
    rows_f32_portable(task, first, end);
  } else {
    groups_portable<F>(task, first, end);
  }
}

template <Format F>
void units_baseline(const Task& task, int64_t first, int64_t end) {
  units_portable<F>(task, first, end);
}

#ifdef CUSTOM_OPS_X86_DISPATCH
template <Format F>
CUSTOM_OPS_AVX2 void units_avx2(const Task& task, int64_t first, int64_t end) {
  units_portable<F>(task, first, end);
}

// ---- AVX-512 (with VNNI) ----------------------------------------------------------------------------------------------
// Weights stream from memory once per call; with the hardware prefetcher alone one thread read them at a third of
// what a plain sum reads (too few loads in flight), so each step asks for the line this far ahead (1-16 KiB measured).
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

CUSTOM_OPS_AVX512_VNNI inline void prepare_avx512(const float* x, int64_t tokens, int64_t k, Activations& a) {
  a.resize(tokens, k);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t b = 0; b < a.blocks; ++b) {
      quantize_block_avx512(x + t * k + b * kBlock, &a.q[t * k + b * kBlock], &a.d[a.at(t, b)], &a.sum[a.at(t, b)]);
    }
  }
}

// Four activations of token t from input k, broadcast to every lane (the signed operand of vpdpbusd).
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_BLOCKS_INLINE __m512i four(const Activations& a, int64_t t, int64_t k) {
  int32_t bytes;
  std::memcpy(&bytes, a.row(t) + k, sizeof(bytes));
  return _mm512_set1_epi32(bytes);
}

// Four bytes of each of the group's rows (a short group's missing lanes read as zero, never past the tensor).
template <bool kFull>
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_BLOCKS_INLINE __m512i load_lanes(const uint8_t* p, __mmask16 lanes) {
  return kFull ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi32(lanes, p);
}

// One group (R rows, kFull: R = 16) against T tokens from t0: per block, the rows' dots with one row per int32 lane,
// started from the block's offset (Q8_0: its weights are stored + 128, so -128 * the sum of x; Q4_0: -8 * the sum of
// x; Q4_1: 0, its m is added in float), then scaled by d_w * d_x (and Q4_1's m_w * d_x * the sum of x) into float.
template <Format F, int T, bool kFull>
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_BLOCKS_INLINE void group_avx512(const Task& task, const Packed<F>& w, int64_t g,
                                                                  int64_t t0) {
  const Activations& a = *task.a;
  const int64_t R = kFull ? kGroup : w.rows(g);
  const __mmask16 lanes = kFull ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << R) - 1);
  const __m512i low_nibble = _mm512_set1_epi8(0x0F);
  __m512 acc[T];
  CUSTOM_OPS_UNROLL
  for (int t = 0; t < T; ++t) {
    acc[t] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < a.blocks; ++b) {
    const uint8_t* block = w.block(g, b);
    const uint8_t* records = block + R * Traits<F>::kQuantBytes;
    __m512i dot[T];
    CUSTOM_OPS_UNROLL
    for (int t = 0; t < T; ++t) {
      constexpr int kOffset = F == Format::kQ8_0 ? 128 : F == Format::kQ4_0 ? 8 : 0;
      dot[t] = _mm512_set1_epi32(-kOffset * a.sum[a.at(t0 + t, b)]);
    }
    if constexpr (F == Format::kQ8_0) {
      CUSTOM_OPS_UNROLL
      for (int s = 0; s < 8; ++s) {
        prefetch(block + s * R * 4);
        const __m512i q = load_lanes<kFull>(block + s * R * 4, lanes);
        CUSTOM_OPS_UNROLL
        for (int t = 0; t < T; ++t) {
          dot[t] = _mm512_dpbusd_epi32(dot[t], q, four(a, t0 + t, b * kBlock + 4 * s));
        }
      }
    } else {
      CUSTOM_OPS_UNROLL
      for (int c = 0; c < 4; ++c) {
        prefetch(block + c * R * 4);
        const __m512i packed = load_lanes<kFull>(block + c * R * 4, lanes);
        const __m512i low = _mm512_and_si512(packed, low_nibble);
        const __m512i high = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low_nibble);
        CUSTOM_OPS_UNROLL
        for (int t = 0; t < T; ++t) {
          dot[t] = _mm512_dpbusd_epi32(dot[t], low, four(a, t0 + t, b * kBlock + 8 * c));
          dot[t] = _mm512_dpbusd_epi32(dot[t], high, four(a, t0 + t, b * kBlock + 8 * c + 4));
        }
      }
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes, records));
    __m512 mw = _mm512_setzero_ps();
    if constexpr (F == Format::kQ4_1) {
      mw = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes, records + 2 * R));
    }
    CUSTOM_OPS_UNROLL
    for (int t = 0; t < T; ++t) {
      const int64_t i = a.at(t0 + t, b);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[t]), _mm512_mul_ps(dw, _mm512_set1_ps(a.d[i])), acc[t]);
      if constexpr (F == Format::kQ4_1) {
        acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(a.d[i] * static_cast<float>(a.sum[i])), acc[t]);
      }
    }
  }
  CUSTOM_OPS_UNROLL
  for (int t = 0; t < T; ++t) {
    _mm512_mask_storeu_ps(task.out + (t0 + t) * task.n + g * kGroup, lanes, acc[t]);
  }
}

// F32: R rows' 16 weights against T tokens' 16 activations per step; a row's tail through a mask.
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
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_BLOCKS_INLINE void rows_f32_avx512(const Task& task, int64_t r0, int64_t t0) {
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

// Units [first, end) against T tokens from t0: a group at a time (the last one may be short), or F32 rows eight at a
// time at decode (each activation load feeding eight rows, eight sums in flight: about 6% faster than four over
// SmolLM2's weights, which stream from memory) and two at a time for more tokens.
template <Format F, int T>
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_BLOCKS_INLINE void units_of_tokens_avx512(const Task& task, int64_t t0,
                                                                            int64_t first, int64_t end) {
  if constexpr (F == Format::kF32) {
    constexpr int R = T == 1 ? 8 : 2;
    int64_t r = first;
    for (; r + R <= end; r += R) {
      rows_f32_avx512<R, T>(task, r, t0);
    }
    for (; r < end; ++r) {
      rows_f32_avx512<1, T>(task, r, t0);
    }
  } else {
    const Packed<F> w{static_cast<const uint8_t*>(task.weight), task.n, task.a->blocks};
    for (int64_t g = first; g < end; ++g) {
      if (w.rows(g) == kGroup) {
        group_avx512<F, T, true>(task, w, g, t0);
      } else {
        group_avx512<F, T, false>(task, w, g, t0);
      }
    }
  }
}

// Tokens in runs of eight (at prefill each group's loads then feed eight tokens), then four, two, one.
template <Format F>
CUSTOM_OPS_AVX512_VNNI void units_avx512(const Task& task, int64_t first, int64_t end) {
  int64_t t0 = 0;
  for (; t0 + 8 <= task.tokens; t0 += 8) {
    units_of_tokens_avx512<F, 8>(task, t0, first, end);
  }
  for (const int run : {4, 2, 1}) {
    if (t0 + run <= task.tokens) {
      switch (run) {
        case 4: units_of_tokens_avx512<F, 4>(task, t0, first, end); break;
        case 2: units_of_tokens_avx512<F, 2>(task, t0, first, end); break;
        default: units_of_tokens_avx512<F, 1>(task, t0, first, end); break;
      }
      t0 += run;
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

// The code path format F runs on this CPU (capped by CUSTOM_OPS_ISA): F32 needs AVX-512F, the integer dots VNNI too.
template <Format F>
Isa isa() {
#ifdef CUSTOM_OPS_X86_DISPATCH
  switch (elementwise::detected_isa()) {
    case elementwise::Isa::kAvx512:
      return F == Format::kF32 || cpu_has_avx512_vnni() ? Isa::kAvx512 : Isa::kAvx2;
    case elementwise::Isa::kAvx2:
      return Isa::kAvx2;
    case elementwise::Isa::kBaseline:
      break;
  }
#endif
  return Isa::kBaseline;
}

template <Format F>
void run_units(Isa which, const Task& task, int64_t first, int64_t end) {
  switch (which) {
#ifdef CUSTOM_OPS_X86_DISPATCH
    case Isa::kAvx512:
      units_avx512<F>(task, first, end);
      return;
    case Isa::kAvx2:
      units_avx2<F>(task, first, end);
      return;
#endif
    default:
      units_baseline<F>(task, first, end);
  }
}

// Units per task: enough tasks to keep every thread busy, each unit of a task in cache while it goes through the
// tokens. Calls under kSerialWork multiply-adds stay on the calling thread: waking the pool costs more than a small
// decode projection.
constexpr double kSerialWork = 1 << 18;

// out [tokens, n] = x [tokens, k] . weight^T, weight n rows of format F. False when the pool did not run every task.
template <Format F>
bool linear(const float* x, int64_t tokens, int64_t k, const void* weight, int64_t n, float* out) {
  const Isa which = isa<F>();
  thread_local Activations activations;  // the calling thread's; its tasks only read it
  if constexpr (F != Format::kF32) {
#ifdef CUSTOM_OPS_X86_DISPATCH
    if (which == Isa::kAvx512) {
      prepare_avx512(x, tokens, k, activations);
    } else {
      prepare(x, tokens, k, activations);
    }
#else
    prepare(x, tokens, k, activations);
#endif
  }
  const Task task{weight, x, &activations, tokens, n, k, out};
  const int64_t units = F == Format::kF32 ? n : (n + kGroup - 1) / kGroup;
  const int64_t threads = std::max<int64_t>(1, contract::thread_count());
  const int64_t per_task = std::max<int64_t>(1, units / (4 * threads));
  const int64_t task_count = (units + per_task - 1) / per_task;
  const auto run = [&](int64_t first, int64_t end) {
    run_units<F>(which, task, first * per_task, std::min(units, end * per_task));
  };
  bool ran = true;
  if (task_count < 2 || static_cast<double>(tokens) * static_cast<double>(n) * static_cast<double>(k) < kSerialWork) {
    run(0, task_count);
  } else {
    ran = contract::parallel_for(0, task_count, 1, run);
  }
  elementwise::count(which == Isa::kAvx512 ? elementwise::kAvx512Elements
                         : which == Isa::kAvx2 ? elementwise::kAvx2Elements
                                               : elementwise::kBaselineElements,
                     static_cast<uint64_t>(tokens * n));
  return ran;
}

// ---- Embedding: rows of the same weight, dequantized -----------------------------------------------------------
// out[i] = row indices[i] as floats: d * integer (+ m for Q4_1), the product exact in float (an fp16 d times an integer
// of 8 bits fits float's 24-bit significand) and Q4_1's sum rounded once, so the lookup equals the reference bit for
// bit. Indices are checked by the caller.
template <Format F>
void embed(const uint8_t* weight, int64_t n, int64_t k, const int64_t* indices, int64_t count, float* out) {
  const Packed<F> w{weight, n, k / kBlock};
  for (int64_t i = 0; i < count; ++i) {
    const int64_t g = indices[i] / kGroup, l = indices[i] % kGroup;
    float* o = out + i * k;
    for (int64_t b = 0; b < w.blocks; ++b) {
      int8_t q[kBlock];
      float d, m;
      row_of_block<F>(w.block(g, b), w.rows(g), l, q, d, m);
      for (int64_t j = 0; j < kBlock; ++j) {
        o[b * kBlock + j] = F == Format::kQ4_1 ? d * static_cast<float>(q[j]) + m : d * static_cast<float>(q[j]);
      }
    }
  }
}

}  // namespace blocks
}  // namespace native
}  // namespace custom
