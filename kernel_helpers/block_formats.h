// The kernel body of my_ops::linear_blocks and my_ops::embedding_blocks (ops/blocks): a linear layer whose weight is a
// constant of the program stored in one of llama.cpp's GGUF formats, and an embedding lookup from the same tensor (a
// tied embedding and output projection are one constant). A format is data for this machinery: a traits struct in its
// own source (ops/blocks/formats/<format>.cpp) saying how its codes and scales are stored; kernels_of<Format>() here
// makes its kernels (a portable loop the compiler vectorizes for any ISA, and AVX-512 VNNI). This header names no
// tensor type and no thread pool: the op's out kernels (ops/blocks/*_out.cpp, both modes) check, split and call.
//
// The layout (packed at export by my_ops/hf/quantize.py; the op's reference, ops/blocks/blocks.py, reads it back with
// ATen ops). A quantized weight is uint8 [n, k / W * B]: n rows of k / W blocks of W weights (W = 32 or 256) and B
// bytes, B the GGUF block's size: the same bytes rearranged. The rows go in groups of 16 (the last group what
// remains); a group of R rows stores block after block, each block as
//   its codes, 32 weights at a time: per plane (below), `bits` chunks of R x 4 bytes (row after row, 4 bytes each)
//   then its record: each field (fp16 d, dmin, m; 4-byte words of packed sub-block scales) as R entries
// A weight's unsigned code is the OR of its planes: a plane of b bits stores, in byte j of chunk c, the weights
// 4 (c * 8 / b + i) + j at bits [b i, b i + b), shifted into the code at the plane's `shift`. So one chunk holds 8 / b
// quads (four consecutive weights of each row), and one 512-bit load holds a quad's codes for 16 rows: the dot products
// run one row per lane (vpdpbusd against four activations broadcast), and a group's 16 sums come out in one vector.
// Each format gives w = scale * sub_scale * (code - offset) + min * sub_min: scale and min per block, from its fp16
// fields; sub_scale and sub_min integers per sub-block of 16 or 32, from its packed bytes (below).
//
// Linear: out[m, n] = sum_k x[m, k] * w[n, k]. Each activation row is first quantized to int8 per block of the
// weight's format, as llama.cpp quantizes it for that format (Q8_0's 32 for the 32-weight formats, Q8_K's 256 for the
// K-quants; here d = max|x| / 127 in float and q = round-half-even(x / d)), so a block's sub-blocks contribute exact
// integer dot products, summed in integers with their integer sub-scales, and the block adds once
// scale * d_x * (that sum) + min * d_x * (the sum of the sub-mins times x's sums): the op computes the float
// arithmetic of those quantized activations (its reference does the same with ATen ops). Row formats (F32, F16,
// BF16) keep plain rows [n, k] of their dtype and multiply in float: at decode a row streams against a token; at
// prefill (AVX-512) the activations are first transposed into panels of 16 tokens, so that a weight broadcast meets
// 16 tokens in one FMA and each output is one sum in its own lane (a GEMM's micro-kernel: no horizontal sums).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "elementwise_loop.h"

#define CUSTOM_OPS_BLOCKS_INLINE inline __attribute__((always_inline))
// The tiles' loops over tokens and quads, unrolled: their accumulators then live in registers (without it GCC kept
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

// The 512-bit vector types below are only ever passed between always-inlined functions, never across a call: the
// compilers' note that passing them changed ABI does not apply, here or in the formats' sources that instantiate the
// templates (so it stays off in a source that includes this header). Clang makes a vector passed by value between an
// AVX-512 function and one without the feature an error, inlined or not: the AVX-512 code hands the shared formulas
// (quad_codes, the formats' block and sub) pointers and references only.
#if defined(__clang__)
#pragma clang diagnostic ignored "-Wpsabi"
#elif defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

// Under AddressSanitizer (the sanitized and fuzz builds) a format runs its portable loop on every CPU: ASan sees no
// memory access inside the AVX-512 intrinsics, whose tiles read the same blocks at the same addresses as the loop,
// and their instantiations under the sanitizers made each format's source take 12.6 s to compile instead of 2.3.
#if defined(__SANITIZE_ADDRESS__)
#define CUSTOM_OPS_BLOCKS_PORTABLE_ONLY 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CUSTOM_OPS_BLOCKS_PORTABLE_ONLY 1
#endif
#endif

namespace custom {
namespace native {
namespace blocks {

constexpr int64_t kBlock = 32;  // weights a piece of codes holds; every format's blocks hold 32 or 256
constexpr int64_t kGroup = 16;  // rows interleaved: one lane of a 512-bit vector each

// ---- Lanes: one row (scalars) or a group's 16 rows (vectors), the same formulas on both --------------------------------
// A format's sub-scale formula and the planes' code extraction are written once, as templates over these types: with
// GCC's and Clang's vector extensions, >>, &, | and - mean the same on a uint32_t and on 16 of them.
CUSTOM_OPS_BLOCKS_INLINE float to_float(uint32_t v) {  // a sub-scale may be negative (Q3_K's, Q6_K's)
  return static_cast<float>(static_cast<int32_t>(v));
}
CUSTOM_OPS_BLOCKS_INLINE int32_t as_signed(uint32_t v) {
  return static_cast<int32_t>(v);
}
CUSTOM_OPS_BLOCKS_INLINE uint32_t as_unsigned(int32_t v) {
  return static_cast<uint32_t>(v);
}
#ifdef CUSTOM_OPS_X86_DISPATCH
typedef uint32_t Words __attribute__((vector_size(64)));
typedef int32_t SignedWords __attribute__((vector_size(64)));
typedef float Reals __attribute__((vector_size(64)));
CUSTOM_OPS_BLOCKS_INLINE SignedWords as_signed(Words v) {
  return reinterpret_cast<SignedWords&>(v);
}
CUSTOM_OPS_BLOCKS_INLINE Words as_unsigned(SignedWords v) {
  return reinterpret_cast<Words&>(v);
}
#endif

// Byte `index` (0-3) of each word, sign-extended (Q6_K's int8 scales).
template <class W>
CUSTOM_OPS_BLOCKS_INLINE auto signed_byte(W word, int index) {
  return as_signed(word << (24 - 8 * index)) >> 24;
}

inline float half_to_float(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, sizeof(bits));
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

// ---- A format's traits (each ops/blocks/formats/<format>.cpp defines one) ------------------------------------------
//   kName        the GGUF type name, the op's `format` argument
//   kWeights     weights per block (a row's unit of storage, and the activations' block): 32, or 256 for the
//                K-quants' super-blocks
//   kSub         weights per sub-block (an integer sub-scale each): 32 or 16
//   kPlanes      the code's planes, {bits, shift}, in storage order
//   kOffset      w = scale * sub_scale * (code - kOffset) + min * sub_min
//   kHasMin      whether the min term is there
//   kSubScales   whether sub-blocks have integer scales and mins of their own (else sub_scale = sub_min = 1)
//   kFields      the record's fields in storage order: 2 (an fp16 value) or 4 (a word of packed sub-block scales)
//   block(halves, scale, min)            the block's float factors from its fp16 fields, in field order
//   sub(words, s, sub_scale, sub_min)    sub-block s's integers from the record's words (kSubScales formats)
// Both are templates over the lane types above: one formula for a row and for a group's 16 rows.
struct Plane {
  int bits, shift;
};

// The block factors most formats have, from their fp16 fields in order: d alone; d and m (w = ... + m); d and dmin
// (w = ... - dmin * sub_min).
struct ScaleOnly {
  template <class R>
  CUSTOM_OPS_BLOCKS_INLINE static void block(const R* h, R& scale, R&) {
    scale = h[0];
  }
};
struct ScaleAndMin {
  template <class R>
  CUSTOM_OPS_BLOCKS_INLINE static void block(const R* h, R& scale, R& min) {
    scale = h[0];
    min = h[1];
  }
};
struct ScaleAndNegatedMin {
  template <class R>
  CUSTOM_OPS_BLOCKS_INLINE static void block(const R* h, R& scale, R& min) {
    scale = h[0];
    min = -h[1];
  }
};

template <class F>
constexpr int chunks() {  // per 32 weights: chunks of 4 bytes a row
  int total = 0;
  for (const Plane& p : F::kPlanes) {
    total += p.bits;
  }
  return total;
}

template <class F>
constexpr int fields_of_size(int size) {
  int count = 0;
  for (int s : F::kFields) {
    count += s == size;
  }
  return count;
}

template <class F>
constexpr int64_t record_bytes() {
  int64_t total = 0;
  for (int s : F::kFields) {
    total += s;
  }
  return total;
}

template <class F>
constexpr int64_t quant_bytes() {  // per row and block
  return F::kWeights / kBlock * chunks<F>() * 4;
}

template <class F>
constexpr int64_t block_bytes() {
  return quant_bytes<F>() + record_bytes<F>();
}

// The four codes of quad q (weights 4q .. 4q + 3 of a 32) in each byte of a word: `chunk` holds the 32 weights'
// chunks, in plane order, as words (one row's 4 bytes, or 16 rows' in a vector).
template <class F, class W>
CUSTOM_OPS_BLOCKS_INLINE void quad_codes(const W* chunk, int q, W& code) {
  int first = 0;
  for (size_t i = 0; i < F::kPlanes.size(); ++i) {
    const Plane p = F::kPlanes[i];
    const int per_chunk = 8 / p.bits;
    const W c = chunk[first + q / per_chunk];
    const int from = p.bits * (q % per_chunk);  // where the bits sit in each byte
    // The plane's bits moved to the code's place, the other bits of each byte masked off (a vector operand and a
    // scalar one: GCC builds a splat constant inside the loop, lane by lane, from a vector literal).
    const W bits = p.bits == 8 ? c
                               : (from >= p.shift ? c >> (from - p.shift) : c << (p.shift - from)) &
                                     ((((1u << p.bits) - 1) << p.shift) * 0x01010101u);
    code = i == 0 ? bits : code | bits;
    first += p.bits;
  }
}

// A packed weight of n rows and `blocks` blocks a row, format F.
template <class F>
struct Packed {
  const uint8_t* data;
  int64_t n, blocks;

  CUSTOM_OPS_BLOCKS_INLINE int64_t groups() const { return (n + kGroup - 1) / kGroup; }
  CUSTOM_OPS_BLOCKS_INLINE int64_t rows(int64_t g) const { return std::min(kGroup, n - g * kGroup); }
  // Block b of group g: its codes (rows(g) * quant_bytes), then its record. Every group before g is full.
  CUSTOM_OPS_BLOCKS_INLINE const uint8_t* block(int64_t g, int64_t b) const {
    return data + (g * kGroup * blocks + b * rows(g)) * block_bytes<F>();
  }
};

// Row l's record (of a group of R rows): its words and fp16 values, each in field order.
template <class F>
CUSTOM_OPS_BLOCKS_INLINE void row_record(const uint8_t* record, int64_t R, int64_t l, uint32_t* words, float* halves) {
  int offset = 0, w = 0, h = 0;
  for (int size : F::kFields) {
    const uint8_t* p = record + offset * R + size * l;
    if (size == 4) {
      std::memcpy(&words[w++], p, 4);
    } else {
      halves[h++] = half_to_float(p);
    }
    offset += size;
  }
}

// Row l's sub-block factors of one block as floats: w = scale[s] * (code - offset) + min[s], each the product
// llama.cpp's dequantizer forms (d * sc, dmin * m), so a weight rounds as there.
template <class F>
CUSTOM_OPS_BLOCKS_INLINE void row_scales(const uint8_t* record, int64_t R, int64_t l, float* scale, float* min) {
  uint32_t words[std::max(1, fields_of_size<F>(4))];
  float halves[std::max(1, fields_of_size<F>(2))];
  row_record<F>(record, R, l, words, halves);
  float block_scale = 0.0f, block_min = 0.0f;
  F::block(halves, block_scale, block_min);
  for (int s = 0; s < F::kWeights / F::kSub; ++s) {
    uint32_t sub_scale = 1, sub_min = 1;
    if constexpr (F::kSubScales) {
      F::sub(words, s, sub_scale, sub_min);
    }
    scale[s] = F::kSubScales ? block_scale * to_float(sub_scale) : block_scale;
    min[s] = F::kSubScales ? block_min * to_float(sub_min) : block_min;
  }
}

// Row l's integer sub-scales and sub-mins of one block (1 for a format without them) and its float factors.
template <class F>
CUSTOM_OPS_BLOCKS_INLINE void row_integer_scales(const uint8_t* record, int64_t R, int64_t l, int32_t* sub_scale,
                                                 int32_t* sub_min, float& scale, float& min) {
  uint32_t words[std::max(1, fields_of_size<F>(4))];
  float halves[std::max(1, fields_of_size<F>(2))];
  row_record<F>(record, R, l, words, halves);
  F::block(halves, scale, min);
  for (int s = 0; s < F::kWeights / F::kSub; ++s) {
    uint32_t sc = 1, m = 1;
    if constexpr (F::kSubScales) {
      F::sub(words, s, sc, m);
    }
    sub_scale[s] = as_signed(sc), sub_min[s] = as_signed(m);
  }
}

// Row l's 32 codes of one 32-weight piece whose chunks start at `quants`.
template <class F>
CUSTOM_OPS_BLOCKS_INLINE void row_codes(const uint8_t* quants, int64_t R, int64_t l, uint8_t* codes) {
  uint32_t chunk[chunks<F>()];
  for (int c = 0; c < chunks<F>(); ++c) {
    std::memcpy(&chunk[c], quants + (c * R + l) * 4, 4);
  }
  for (int q = 0; q < 8; ++q) {
    uint32_t code;
    quad_codes<F>(chunk, q, code);
    std::memcpy(codes + 4 * q, &code, 4);
  }
}

// ---- Activations, quantized per block of the weight's format --------------------------------------------------
// d = max|x| / 127 and q = round-half-even(x / d), q = 0 where d is 0, over `n` values (32 or 256). A block holding an
// infinity or a NaN gets d NaN (and q 0), so every output it reaches is NaN, as a float product would make it.
inline void quantize_block(const float* x, int64_t n, int8_t* q, float* d, int32_t* sum16) {
  float amax = 0.0f;
  bool finite = true;
  for (int64_t j = 0; j < n; ++j) {
    amax = std::max(amax, std::fabs(x[j]));
    finite = finite && std::isfinite(x[j]);
  }
  const float scale = finite ? amax / 127.0f : std::numeric_limits<float>::quiet_NaN();
  std::fill(sum16, sum16 + n / 16, 0);
  for (int64_t j = 0; j < n; ++j) {
    const float v = finite && scale != 0.0f ? std::nearbyint(x[j] / scale) : 0.0f;
    q[j] = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
    sum16[j / 16] += q[j];
  }
  *d = scale;
}

// Every token's activations, quantized once per call before its tasks run: q in order, d per block of `block` values,
// the sum of q per 16 (a sub-block's sum is one or two of them).
// Row formats at prefill keep floats instead, transposed into panels (below).
constexpr int64_t kPanel = 16;     // tokens a panel: one vector holds one input of all of them
constexpr int64_t kPanelRows = 8;  // rows a tile of the panels' kernel multiplies at once

struct Activations {
  int64_t tokens = 0, k = 0, block = 0, blocks = 0;
  std::vector<int8_t> q;       // [tokens][k]
  std::vector<float> d;        // [tokens][blocks]
  std::vector<int32_t> sum16;  // [tokens][k / 16]
  bool in_panels = false;      // a row format's activations: panels, blocks of kPanel values of one token each
  std::vector<float> panels;   // [tokens / kPanel, rounded up][k][kPanel]; the last panel's missing tokens zero

  CUSTOM_OPS_BLOCKS_INLINE const int8_t* row(int64_t t) const { return q.data() + t * k; }
  CUSTOM_OPS_BLOCKS_INLINE float scale(int64_t t, int64_t b) const { return d[t * blocks + b]; }
  // The sum of q over `count` (16 or 32) values from value `first` of token t's row.
  CUSTOM_OPS_BLOCKS_INLINE int32_t sum(int64_t t, int64_t first, int count) const {
    const int32_t* s = &sum16[(t * k + first) / 16];
    return count == 32 ? s[0] + s[1] : s[0];
  }

  void resize(int64_t tokens_, int64_t k_, int64_t block_) {
    tokens = tokens_, k = k_, block = block_, blocks = k_ / block_, in_panels = false;
    q.resize(tokens * k);
    d.resize(tokens * blocks);
    sum16.resize(tokens * k / 16);
  }
  // k a multiple of kPanel.
  void resize_panels(int64_t tokens_, int64_t k_) {
    tokens = tokens_, k = k_, block = kPanel, blocks = k_ / kPanel, in_panels = true;
    const int64_t count = (tokens + kPanel - 1) / kPanel;
    panels.resize(static_cast<size_t>(count * k * kPanel));
    if (tokens % kPanel != 0) {
      std::fill(panels.begin() + (count - 1) * k * kPanel, panels.end(), 0.0f);
    }
  }
  void unused() { tokens = k = block = blocks = 0, in_panels = false; }

  // Threads that prepare blocks side by side should not share a cache line (a quantized block's scale is 4 bytes):
  // they take groups of kPanel tokens. In panels, block g * (k / block) + j / block holds inputs [j, j + block) of
  // group g's tokens; quantized, block t * (k / block) + j / block those of token t.
  int64_t groups() const { return (tokens + kPanel - 1) / kPanel; }
  int64_t blocks_in_all() const { return in_panels ? groups() * (k / block) : tokens * blocks; }
};

// Blocks [first, end) of x's tokens * blocks, quantized into `a` (sized already): any thread, each block once.
inline void prepare_blocks(const float* x, int64_t first, int64_t end, Activations& a) {
  for (int64_t b = first; b < end; ++b) {
    const int64_t value = b * a.block;
    quantize_block(x + value, a.block, &a.q[value], &a.d[b], &a.sum16[value / 16]);
  }
}

// Blocks [first, end) of x's panels (kPanel inputs of a panel's tokens each: whole cache lines) transposed into them.
inline void prepare_panels(const float* x, int64_t first, int64_t end, Activations& a) {
  const int64_t per_panel = a.k / kPanel;
  for (int64_t b = first; b < end; ++b) {
    const int64_t p = b / per_panel, j = b % per_panel * kPanel;
    float* to = a.panels.data() + (p * a.k + j) * kPanel;
    for (int64_t t = p * kPanel; t < std::min(a.tokens, (p + 1) * kPanel); ++t) {
      const float* from = x + t * a.k + j;
      for (int64_t i = 0; i < kPanel; ++i) {
        to[i * kPanel + t % kPanel] = from[i];
      }
    }
  }
}

// What a task computes: its part of the weight (groups, or rows of a row format) against every token, into
// out [tokens][n].
struct Task {
  const void* weight;
  const float* x;  // row formats: the activations themselves
  const Activations* a;
  int64_t tokens, n, k;
  float* out;
};

// ---- The portable kernel (every ISA; the compiler vectorizes it for the one it is compiled for) -------------------
// Groups [first, end): each row's blocks against every token, exact integer dots per sub-block summed with the
// integer sub-scales, then one float product per block.
template <class F>
CUSTOM_OPS_BLOCKS_INLINE void groups_portable(const Task& task, int64_t first, int64_t end) {
  constexpr int kSubs = F::kWeights / F::kSub, kPieces = F::kWeights / kBlock;
  const Activations& a = *task.a;
  const Packed<F> w{static_cast<const uint8_t*>(task.weight), task.n, task.k / F::kWeights};
  std::vector<float> sums(static_cast<size_t>(kGroup * task.tokens));
  for (int64_t g = first; g < end; ++g) {
    const int64_t R = w.rows(g);
    std::fill(sums.begin(), sums.end(), 0.0f);
    for (int64_t b = 0; b < w.blocks; ++b) {
      const uint8_t* block = w.block(g, b);
      for (int64_t l = 0; l < R; ++l) {
        int32_t sub_scale[kSubs], sub_min[kSubs];
        float scale, min;
        row_integer_scales<F>(block + R * quant_bytes<F>(), R, l, sub_scale, sub_min, scale, min);
        int8_t q[F::kWeights];
        for (int i = 0; i < kPieces; ++i) {
          uint8_t codes[kBlock];
          row_codes<F>(block + i * R * chunks<F>() * 4, R, l, codes);
          for (int j = 0; j < kBlock; ++j) {
            q[i * kBlock + j] = static_cast<int8_t>(codes[j] - F::kOffset);
          }
        }
        for (int64_t t = 0; t < task.tokens; ++t) {
          const int64_t first_x = b * F::kWeights;
          const int8_t* x = a.row(t) + first_x;
          int32_t dots = 0, mins = 0;
          for (int s = 0; s < kSubs; ++s) {
            int32_t dot = 0;
            for (int j = s * F::kSub; j < (s + 1) * F::kSub; ++j) {
              dot += static_cast<int32_t>(q[j]) * static_cast<int32_t>(x[j]);
            }
            dots += sub_scale[s] * dot;
            mins += sub_min[s] * a.sum(t, first_x + s * F::kSub, F::kSub);
          }
          const float dx = a.scale(t, b);
          sums[t * kGroup + l] += scale * dx * static_cast<float>(dots);
          if constexpr (F::kHasMin) {
            sums[t * kGroup + l] += min * dx * static_cast<float>(mins);
          }
        }
      }
    }
    for (int64_t t = 0; t < task.tokens; ++t) {
      std::copy(&sums[t * kGroup], &sums[t * kGroup + R], task.out + t * task.n + g * kGroup);
    }
  }
}

#ifdef CUSTOM_OPS_X86_DISPATCH
// ---- AVX-512 (with VNNI) ----------------------------------------------------------------------------------------------
// Weights stream from memory once per call; with the hardware prefetcher alone one thread read them at a third of
// what a plain sum reads (too few loads in flight), so each load asks for the line this far ahead (1-16 KiB measured:
// one thread over 100 MB of Q4_0 read 25, 28, 31-40, 43-45 and 38 GB/s at 1, 2, 4, 8 and 16 KiB; Q8_0 36-39 at 4 and
// 8 KiB).
constexpr int64_t kPrefetchBytes = 8192;

CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_BLOCKS_INLINE void prefetch(const void* p) {
  _mm_prefetch(static_cast<const char*>(p) + kPrefetchBytes, _MM_HINT_T0);
}

// Activations, the same values as quantize_block's, 16 at a time: the division and the rounding (to nearest, ties to
// even) are IEEE operations, and a maximum does not depend on its order.
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_BLOCKS_INLINE void quantize_block_avx512(const float* x, int64_t n, int8_t* q,
                                                                           float* d, int32_t* sum16) {
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
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_BLOCKS_INLINE __m512i four(const Activations& a, int64_t t, int64_t k) {
  int32_t bytes;
  std::memcpy(&bytes, a.row(t) + k, sizeof(bytes));
  return _mm512_set1_epi32(bytes);
}

// Four bytes of each of the group's rows (a short group's missing lanes read as zero, never past the tensor).
template <bool kFull>
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_BLOCKS_INLINE Words load_lanes(const uint8_t* p, __mmask16 lanes) {
  return reinterpret_cast<Words>(kFull ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi32(lanes, p));
}

// The group's records of one block: words and fp16 values (as floats), each field for its R rows.
template <class F, bool kFull>
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_BLOCKS_INLINE void group_record(const uint8_t* record, int64_t R, __mmask16 lanes,
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

// The integer sums of one group and block against T tokens from t0: per token, the rows' sub-block dots (one row per
// int32 lane, started from -offset * the sum of x so unsigned codes go into vpdpbusd) times their sub-scales, and the
// sub-mins times the sub-blocks' sums of x.
template <class F, int T, bool kFull>
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_BLOCKS_INLINE void block_sums_avx512(const Task& task, const uint8_t* block,
                                                                       int64_t R, __mmask16 lanes, const Words* words,
                                                                       int64_t b, int64_t t0, __m512i* dots,
                                                                       __m512i* mins) {
  constexpr int kPieces = F::kWeights / kBlock, kChunks = chunks<F>(), kQuads = F::kSub / 4;
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
      prefetch(quants + c * R * 4);
      chunk[c] = load_lanes<kFull>(quants + c * R * 4, lanes);
    }
    CUSTOM_OPS_UNROLL
    for (int h = 0; h < kBlock / F::kSub; ++h) {
      const int s = i * (kBlock / F::kSub) + h;
      const int64_t first = b * F::kWeights + s * F::kSub;  // the sub-block's first input
      Words sub_scale = reinterpret_cast<Words>(_mm512_set1_epi32(1)), sub_min = sub_scale;
      if constexpr (F::kSubScales) {
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
        if constexpr (F::kSubScales) {
          dots[t] = _mm512_add_epi32(dots[t], _mm512_mullo_epi32(dot[t], reinterpret_cast<__m512i>(sub_scale)));
          if constexpr (F::kHasMin) {
            mins[t] = _mm512_add_epi32(mins[t], _mm512_mullo_epi32(reinterpret_cast<__m512i>(sub_min),
                                                                   _mm512_set1_epi32(a.sum(t0 + t, first, F::kSub))));
          }
        } else {
          dots[t] = _mm512_add_epi32(dots[t], dot[t]);
        }
      }
    }
  }
}

// One group (R rows, kFull: R = 16) against T tokens from t0, block after block: the integer sums, then per block
// acc += scale * d_x * dots + min * d_x * mins.
template <class F, int T, bool kFull>
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_BLOCKS_INLINE void group_avx512(const Task& task, const Packed<F>& w, int64_t g,
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
    group_record<F, kFull>(block + R * quant_bytes<F>(), R, lanes, words, halves);
    Reals scale, min = Reals{};
    F::block(halves, scale, min);
    __m512i dots[T], mins[T];
    block_sums_avx512<F, T, kFull>(task, block, R, lanes, words, b, t0, dots, mins);
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
  CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_BLOCKS_INLINE static void run(const Task& task, int64_t t0, int64_t first,
                                                                  int64_t end) {
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

// Tokens in runs of eight (at prefill each unit's loads then feed eight tokens; kMost 4: of four), then four, two,
// one: Tiles::run<T>.
template <class Tiles, int kMost = 8>
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_BLOCKS_INLINE void in_token_runs(const Task& task, int64_t first, int64_t end) {
  int64_t t0 = 0;
  for (; kMost == 8 && t0 + 8 <= task.tokens; t0 += 8) {
    Tiles::template run<kMost == 8 ? 8 : 4>(task, t0, first, end);
  }
  for (; kMost == 4 && t0 + 4 <= task.tokens; t0 += 4) {
    Tiles::template run<4>(task, t0, first, end);
  }
  if (t0 + 4 <= task.tokens) {
    Tiles::template run<4>(task, t0, first, end);
    t0 += 4;
  }
  if (t0 + 2 <= task.tokens) {
    Tiles::template run<2>(task, t0, first, end);
    t0 += 2;
  }
  if (t0 < task.tokens) {
    Tiles::template run<1>(task, t0, first, end);
  }
}
#endif

// ---- Row formats: F32, F16 and BF16 weights, plain rows [n, k] ---------------------------------------------------------
template <class E>
CUSTOM_OPS_BLOCKS_INLINE float element_to_float(E v) {
  return static_cast<float>(v);
}

// Rows [first, end): eight partial sums per token, added pairwise at the end (a fixed order, so the compiler may keep
// them in one vector: the project compiles without reassociation).
template <class E>
CUSTOM_OPS_BLOCKS_INLINE void rows_portable(const Task& task, int64_t first, int64_t end) {
  const int64_t k = task.k;
  for (int64_t r = first; r < end; ++r) {
    const E* w = static_cast<const E*>(task.weight) + r * k;
    for (int64_t t = 0; t < task.tokens; ++t) {
      const float* x = task.x + t * k;
      float partial[8] = {};
      int64_t j = 0;
      for (; j + 8 <= k; j += 8) {
        for (int l = 0; l < 8; ++l) {
          partial[l] += element_to_float(w[j + l]) * x[j + l];
        }
      }
      for (; j < k; ++j) {
        partial[j % 8] += element_to_float(w[j]) * x[j];
      }
      task.out[t * task.n + r] = ((partial[0] + partial[1]) + (partial[2] + partial[3])) +
                                 ((partial[4] + partial[5]) + (partial[6] + partial[7]));
    }
  }
}

#ifdef CUSTOM_OPS_X86_DISPATCH
// 16 weights of a row as floats (a row's tail through a mask).
template <class E>
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_BLOCKS_INLINE __m512 load_weights(const E* w, __mmask16 mask) {
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
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_BLOCKS_INLINE __m512 load_weights(const E* w) {
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
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_BLOCKS_INLINE void zero_accumulators(__m512 (&acc)[R][T]) {
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
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_BLOCKS_INLINE void row_step(const E* w, const float* x, int64_t k, int64_t j,
                                                              __mmask16 mask, __m512 (&acc)[R][T]) {
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
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_BLOCKS_INLINE void rows_avx512(const Task& task, int64_t r0, int64_t t0) {
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
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_BLOCKS_INLINE void row_decode_avx512(const Task& task, int64_t r, int64_t t) {
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
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_BLOCKS_INLINE void panel_tile(const Task& task, const float* w, int64_t r0,
                                                                int64_t p, const char* ahead, int64_t ahead_step) {
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
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_BLOCKS_INLINE void panel_rows(const Task& task, const float* w, int64_t r0,
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
CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_BLOCKS_INLINE void rows_in_panels(const Task& task, int64_t first, int64_t end) {
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
  CUSTOM_OPS_AVX512_VNNI CUSTOM_OPS_BLOCKS_INLINE static void run(const Task& task, int64_t t0, int64_t first,
                                                                  int64_t end) {
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
#endif

// ---- Embedding: rows of the same weight, dequantized ------------------------------------------------------------------
// out[i] = row indices[i] as floats, w = a * (code - offset) (+ b), the formula and order of llama.cpp's dequantizers
// (ggml-quants.c), so the lookup equals the reference bit for bit. Indices are checked by the caller.
template <class F>
void embed_blocks(const uint8_t* weight, int64_t n, int64_t k, const int64_t* indices, int64_t count, float* out) {
  constexpr int kSubs = F::kWeights / F::kSub, kPieces = F::kWeights / kBlock;
  const Packed<F> w{weight, n, k / F::kWeights};
  for (int64_t i = 0; i < count; ++i) {
    const int64_t g = indices[i] / kGroup, l = indices[i] % kGroup, R = w.rows(g);
    float* o = out + i * k;
    for (int64_t b = 0; b < w.blocks; ++b) {
      const uint8_t* block = w.block(g, b);
      float scale[kSubs], min[kSubs];
      row_scales<F>(block + R * quant_bytes<F>(), R, l, scale, min);
      for (int piece = 0; piece < kPieces; ++piece) {
        uint8_t codes[kBlock];
        row_codes<F>(block + piece * R * chunks<F>() * 4, R, l, codes);
        for (int j = 0; j < kBlock; ++j) {
          const int s = (piece * kBlock + j) / F::kSub;
          const float v = scale[s] * static_cast<float>(static_cast<int>(codes[j]) - F::kOffset);
          o[b * F::kWeights + piece * kBlock + j] = F::kHasMin ? v + min[s] : v;
        }
      }
    }
  }
}

template <class E>
void embed_rows(const uint8_t* weight, int64_t, int64_t k, const int64_t* indices, int64_t count, float* out) {
  const E* rows = reinterpret_cast<const E*>(weight);
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t j = 0; j < k; ++j) {
      out[i * k + j] = element_to_float(rows[indices[i] * k + j]);
    }
  }
}

// ---- A format's kernels, as the op's out kernels find them by name (ops/blocks/formats.h) ----------------------------
enum class Isa { kBaseline, kAvx2, kAvx512 };
enum class Storage { kBytes, kFloat32, kFloat16, kBFloat16 };  // the weight tensor's dtype

using Units = void (*)(const Task&, int64_t first, int64_t end);
using Embed = void (*)(const uint8_t* weight, int64_t n, int64_t k, const int64_t* indices, int64_t count, float* out);

struct FormatKernels {
  const char* name;
  Storage storage;
  int64_t weights_per_block, block_bytes;  // a row of k weights: k / weights_per_block * block_bytes bytes
  bool quantizes_activations;              // per block of weights_per_block; row formats multiply in float
  bool avx512_needs_vnni;
  Units units[3];  // by Isa: units [first, end) of the weight (groups of 16 rows, or rows) against every token
  Embed embed;
};

template <class F>
void units_baseline(const Task& task, int64_t first, int64_t end) {
  groups_portable<F>(task, first, end);
}

#ifdef CUSTOM_OPS_X86_DISPATCH
template <class F>
CUSTOM_OPS_AVX2 void units_avx2(const Task& task, int64_t first, int64_t end) {
  groups_portable<F>(task, first, end);
}

template <class F>
CUSTOM_OPS_AVX512_VNNI void units_avx512(const Task& task, int64_t first, int64_t end) {
  in_token_runs<GroupTiles<F>, max_tokens<F>()>(task, first, end);
}
#endif

template <class F>
constexpr FormatKernels kernels_of() {
#if defined(CUSTOM_OPS_X86_DISPATCH) && !defined(CUSTOM_OPS_BLOCKS_PORTABLE_ONLY)
  return {F::kName, Storage::kBytes, F::kWeights, block_bytes<F>(), true, true,
          {units_baseline<F>, units_avx2<F>, units_avx512<F>}, embed_blocks<F>};
#else
  return {F::kName, Storage::kBytes, F::kWeights, block_bytes<F>(), true, true,
          {units_baseline<F>, units_baseline<F>, units_baseline<F>}, embed_blocks<F>};
#endif
}

template <class E>
void rows_baseline(const Task& task, int64_t first, int64_t end) {
  rows_portable<E>(task, first, end);
}

#ifdef CUSTOM_OPS_X86_DISPATCH
template <class E>
CUSTOM_OPS_AVX2 void rows_avx2(const Task& task, int64_t first, int64_t end) {
  rows_portable<E>(task, first, end);
}

template <class E>
CUSTOM_OPS_AVX512_VNNI void rows_avx512_units(const Task& task, int64_t first, int64_t end) {
  if (task.a->in_panels) {
    rows_in_panels<E>(task, first, end);
  } else {
    in_token_runs<RowTiles<E>>(task, first, end);
  }
}
#endif

template <class E>
constexpr FormatKernels row_kernels_of(const char* name, Storage storage) {
#if defined(CUSTOM_OPS_X86_DISPATCH) && !defined(CUSTOM_OPS_BLOCKS_PORTABLE_ONLY)
  return {name, storage, 1, sizeof(E), false, false, {rows_baseline<E>, rows_avx2<E>, rows_avx512_units<E>},
          embed_rows<E>};
#else
  return {name, storage, 1, sizeof(E), false, false, {rows_baseline<E>, rows_baseline<E>, rows_baseline<E>},
          embed_rows<E>};
#endif
}

}  // namespace blocks
}  // namespace native
}  // namespace custom
