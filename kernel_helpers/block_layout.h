// The kernel body of my_ops::linear_blocks and my_ops::embedding_blocks (ops/blocks): a linear layer whose weight is a
// constant of the program stored in one of llama.cpp's GGUF formats, and an embedding lookup from the same tensor (a
// tied embedding and output projection are one constant). A format is data for this machinery: a traits struct in its
// own source (ops/blocks/formats/<format>.cpp) saying how its codes and scales are stored; kernels_of<Format>()
// (block_formats.h) makes its kernels: the portable loop here, which the compiler vectorizes for any ISA, the AVX2
// tiles (block_tiles_avx2.h), the AVX-512 VNNI tiles (block_tiles_avx512.h) and ARM64's dot-product tiles
// (block_tiles_dotprod.h). These headers name no tensor type and
// no thread pool: the op's out kernels (ops/blocks/*_out.cpp, both modes) check, split and call.
//
// The layout (Python's statement of it: ops/blocks/block_layouts.py; packed at export by my_ops/hf/quantize.py, read
// back with ATen ops by the op's reference, ops/blocks/blocks.py). A quantized weight is uint8 [n, k / W * B]: n rows
// of k / W blocks of W weights (W = 32 or 256) and B bytes, B the GGUF block's size: the same bytes rearranged. The
// rows go in groups of 16 (the last group what remains); a group of R rows stores block after block, each block as
//   its codes, 32 weights at a time: per plane (below), `bits` chunks of R x 4 bytes (row after row, 4 bytes each)
//   then its record: each field (fp16 d, dmin, m; 4-byte words of packed sub-block scales) as R entries
// A weight's unsigned code is the OR of its planes: a plane of b bits stores, in byte j of chunk c, the weights
// 4 (c * 8 / b + i) + j at bits [b i, b i + b), shifted into the code at the plane's `shift`. So one chunk holds 8 / b
// quads (four consecutive weights of each row), and one 512-bit load holds a quad's codes for 16 rows (a 256-bit load
// those of 8): the dot products run one row per lane (vpdpbusd, or vpmaddubsw and vpmaddwd, against four activations
// broadcast), and a group's 16 sums come out in one vector (or two).
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
// prefill (AVX2, AVX-512) the activations are first transposed into panels of 16 tokens, so that a weight broadcast
// meets 16 tokens in one FMA (or two) and each output is one sum in its own lane (a GEMM's micro-kernel: no
// horizontal sums).
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
#include "vector.h"

CUSTOM_OPS_NO_VECTOR_ABI_NOTE  // again: a precompiled header that holds vector.h (the AOT library's) does not carry it

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
CUSTOM_OPS_INLINE float to_float(uint32_t v) {  // a sub-scale may be negative (Q3_K's, Q6_K's)
  return static_cast<float>(static_cast<int32_t>(v));
}
using simd::as_signed;
using simd::as_unsigned;
// A group's 16 rows (the AVX-512 tiles), a half group's 8 (AVX2), a quarter group's 4 (ARM64's dot-product tiles).
using Words = simd::U<16>;
using SignedWords = simd::I<16>;
using Reals = simd::F<16>;
using Words8 = simd::U<8>;
using SignedWords8 = simd::I<8>;
using Reals8 = simd::F<8>;
using Words4 = simd::U<4>;
using SignedWords4 = simd::I<4>;
using Reals4 = simd::F<4>;

// Byte `index` (0-3) of each word, sign-extended (Q6_K's int8 scales).
template <class W>
CUSTOM_OPS_INLINE auto signed_byte(const W& word, int index) {
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
  CUSTOM_OPS_INLINE static void block(const R* h, R& scale, R&) {
    scale = h[0];
  }
};
struct ScaleAndMin {
  template <class R>
  CUSTOM_OPS_INLINE static void block(const R* h, R& scale, R& min) {
    scale = h[0];
    min = h[1];
  }
};
struct ScaleAndNegatedMin {
  template <class R>
  CUSTOM_OPS_INLINE static void block(const R* h, R& scale, R& min) {
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
CUSTOM_OPS_INLINE void quad_codes(const W* chunk, int q, W& code) {
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

  CUSTOM_OPS_INLINE int64_t groups() const { return (n + kGroup - 1) / kGroup; }
  CUSTOM_OPS_INLINE int64_t rows(int64_t g) const { return std::min(kGroup, n - g * kGroup); }
  // Block b of group g: its codes (rows(g) * quant_bytes), then its record. Every group before g is full.
  CUSTOM_OPS_INLINE const uint8_t* block(int64_t g, int64_t b) const {
    return data + (g * kGroup * blocks + b * rows(g)) * block_bytes<F>();
  }
};

// Row l's record (of a group of R rows): its words and fp16 values, each in field order.
template <class F>
CUSTOM_OPS_INLINE void row_record(const uint8_t* record, int64_t R, int64_t l, uint32_t* words, float* halves) {
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
CUSTOM_OPS_INLINE void row_scales(const uint8_t* record, int64_t R, int64_t l, float* scale, float* min) {
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
CUSTOM_OPS_INLINE void row_integer_scales(const uint8_t* record, int64_t R, int64_t l, int32_t* sub_scale,
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
CUSTOM_OPS_INLINE void row_codes(const uint8_t* quants, int64_t R, int64_t l, uint8_t* codes) {
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

  CUSTOM_OPS_INLINE const int8_t* row(int64_t t) const { return q.data() + t * k; }
  CUSTOM_OPS_INLINE float scale(int64_t t, int64_t b) const { return d[t * blocks + b]; }
  // The sum of q over `count` (16 or 32) values from value `first` of token t's row.
  CUSTOM_OPS_INLINE int32_t sum(int64_t t, int64_t first, int count) const {
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

// ---- How the vector tiles stream a block ----
// A block's record follows its codes in memory. Read before them (its sub-scales weigh each sub-block's dot), it sends
// the read back 2 KiB once a block: one Zen 4 thread streamed K-quant weights from memory at 61-65% of what a plain sum
// of the same memory reads, 67-80% codes first.
// So the record is read after the codes: formats without sub-scales need it only then, and at one token a format's
// sub-block dots (at most 16 vectors; AVX2 keeps some in L1) wait for it. Prefill keeps the record first: its T tokens'
// dots would not fit in the registers, and it is bound by arithmetic, not the stream.
template <class F, int T>
constexpr bool record_after_codes() {
  return !F::kSubScales || T == 1;
}

// Read in that order, one token's pass over a group is one forward stream, which the hardware prefetcher follows
// best alone: one Zen 4 thread over 16384x8192 weights (2 MiB pages) read, as a share of a plain sum of the same
// memory, AVX-512 Q4_K 78% -> 83-87% and Q8_0 87% -> 95-97%, AVX2 Q4_K 66% -> 82-86%, Q8_0 68% -> 90-92% and Q6_K
// 56% -> 73-84%, with each line asked for 8 KiB ahead -> without. A prefill reads the weights again for each run of
// tokens, often from L3, and there asking ahead pays (Q8_0 at 128 tokens, one thread: 77-113 GMAC/s without, 110-122
// with); so does a stream that steps back (record first, one thread over 100 MB of Q4_0: 25, 28, 31-40, 43-45 and
// 38 GB/s at 1, 2, 4, 8 and 16 KiB ahead, a third of a sum's rate without).
constexpr int64_t kPrefetchBytes = 8192;

// The line kPrefetchBytes past `line`, asked for when T tokens (T > 1) read it.
template <int T>
CUSTOM_OPS_INLINE void ask_ahead(const uint8_t* line) {
  if constexpr (T > 1) {
    __builtin_prefetch(line + kPrefetchBytes);
  }
}

// ---- The portable kernel (every ISA; the compiler vectorizes it for the one it is compiled for) -------------------
// Groups [first, end): each row's blocks against every token, exact integer dots per sub-block summed with the
// integer sub-scales, then one float product per block.
template <class F>
CUSTOM_OPS_INLINE void groups_portable(const Task& task, int64_t first, int64_t end) {
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

// Tokens in runs of kMost (at prefill each unit's loads then feed that many tokens), then at most one run each of
// four, two and one: Tiles::run<T> for each run, from t0.
template <class Tiles, int kMost>
inline void in_token_runs(const Task& task, int64_t first, int64_t end) {
  int64_t t0 = 0;
  for (; t0 + kMost <= task.tokens; t0 += kMost) {
    Tiles::template run<kMost>(task, t0, first, end);
  }
  if constexpr (kMost > 4) {
    if (t0 + 4 <= task.tokens) {
      Tiles::template run<4>(task, t0, first, end);
      t0 += 4;
    }
  }
  if constexpr (kMost > 2) {
    if (t0 + 2 <= task.tokens) {
      Tiles::template run<2>(task, t0, first, end);
      t0 += 2;
    }
  }
  if constexpr (kMost > 1) {
    if (t0 < task.tokens) {
      Tiles::template run<1>(task, t0, first, end);
    }
  }
}

// ---- Row formats: F32, F16 and BF16 weights, plain rows [n, k] ---------------------------------------------------------
template <class E>
CUSTOM_OPS_INLINE float element_to_float(E v) {
  return static_cast<float>(v);
}

// Rows [first, end): eight partial sums per token, added pairwise at the end (a fixed order, so the compiler may keep
// them in one vector: the project compiles without reassociation).
template <class E>
CUSTOM_OPS_INLINE void rows_portable(const Task& task, int64_t first, int64_t end) {
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

}  // namespace blocks
}  // namespace native
}  // namespace custom
