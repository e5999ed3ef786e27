// The fast CPU loop under unary_elementwise.h: out[i] = Op(in[i]) over contiguous memory, for any functor that follows
// elementwise_functor.h. Three things make it fast, none of which depends on the build machine's -march:
//   1. vectorized: on x86-64 the loop is compiled for AVX-512, AVX2 and the baseline ISA, and the CPU picks at run
//      time; on AArch64 it is NEON, plus half-precision arithmetic where the CPU has it (also checked at run time);
//      Half and BFloat16 convert a block at a time with vector instructions;
//   2. streaming stores for outputs bigger than the last-level cache: they skip the read-for-ownership a plain store
//      does and do not evict everything else from the cache;
//   3. the caller's parallel_for (ExecuTorch's threadpool, or ATen's) for large inputs, with a grain that keeps small
//      inputs on the calling thread.
//
// Test hooks (read once per process): CUSTOM_OPS_STREAMING_MIN_BYTES and CUSTOM_OPS_PARALLEL_GRAIN_BYTES override the
// two thresholds, CUSTOM_OPS_ISA=baseline|avx2|avx512 caps the vector ISA (never above what the CPU has), and
// custom_ops_elementwise_stats() reports what each path did, counted where the work is done, so tests can prove each
// path ran on their data.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#if defined(__linux__)
#include <unistd.h>
#endif

#include "elementwise_functor.h"
#include "vector.h"

namespace custom {
namespace native {
namespace elementwise {

// ---- Thresholds ----------------------------------------------------------------------------------------------------
// sysfs describes the cache this machine (or VM) really has; sysconf may report a whole socket's.
inline size_t detect_last_level_cache_bytes() {
  size_t found = 0;
#if defined(__linux__)
  int best_level = 0;
  for (int index = 0; index < 8; ++index) {
    char path[96];
    int level = 0;
    unsigned long kib = 0;
    std::snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu0/cache/index%d/level", index);
    if (FILE* f = std::fopen(path, "r")) {
      const bool ok = std::fscanf(f, "%d", &level) == 1;
      std::fclose(f);
      std::snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu0/cache/index%d/size", index);
      if (FILE* g = ok ? std::fopen(path, "r") : nullptr) {
        if (std::fscanf(g, "%luK", &kib) == 1 && level > best_level) {
          best_level = level;
          found = static_cast<size_t>(kib) << 10;
        }
        std::fclose(g);
      }
    }
  }
#if defined(_SC_LEVEL3_CACHE_SIZE)
  if (found == 0 && sysconf(_SC_LEVEL3_CACHE_SIZE) > 0) {
    found = static_cast<size_t>(sysconf(_SC_LEVEL3_CACHE_SIZE));
  }
#endif
#endif
  return found != 0 ? found : size_t{8} << 20;
}

// A non-negative integer from the environment, or `fallback` when unset or malformed.
inline size_t size_from_env(const char* name, size_t fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') {
    return fallback;
  }
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  return (*end == '\0' && text[0] != '-') ? static_cast<size_t>(value) : fallback;
}

// Outputs bigger than this use streaming stores. Smaller ones stay in cache, where the next op (or the next execution)
// reads them: measured here, a 16 MiB output with a 32 MiB L3 ran 40% slower with streaming stores.
inline size_t streaming_min_bytes() {
  static const size_t bytes = size_from_env("CUSTOM_OPS_STREAMING_MIN_BYTES", detect_last_level_cache_bytes());
  return bytes;
}

// The policy, for every kernel with a streaming path (this loop, rms_norm's bfloat16 rows).
inline bool streams(size_t output_bytes) {
  return output_bytes > streaming_min_bytes();
}

// Bytes of output per parallel task. Under two tasks' worth the op stays on the calling thread: waking the pool costs
// more than the work it would split.
inline size_t parallel_grain_bytes() {
  static const size_t bytes = [] {
    const size_t value = size_from_env("CUSTOM_OPS_PARALLEL_GRAIN_BYTES", size_t{256} << 10);
    return value < 64 ? size_t{64} : value;
  }();
  return bytes;
}

// ---- What each path did (a debug query for tests; one relaxed add per loop call, task or streamed range) --------
// Counted after the work they name is done, in the loop that does it: a path that is skipped or cut short shows.
// Only with CUSTOM_OPS_COUNT_PATHS=1 in the environment (the tests set it): the two atomic adds of a call were a fifth
// of a 16-element call's time, and ops that run per token are that small.
enum Path : int {
  kSerialCalls,            // calls run whole on the calling thread
  kParallelTasks,          // threadpool tasks run
  kStreamedBlocks,         // 4 KiB blocks written with non-temporal stores
  kUnalignedHeads,         // streamed ranges that began with plain stores up to a cache-line boundary
  kBaselineElements,       // elements computed by each ISA's loop: baseline, AVX2, AVX-512,
  kAvx2Elements,
  kAvx512Elements,
  kHalfArithmeticElements, // and AArch64's half-precision arithmetic
  kPoolHandoffs,           // ranges handed to the thread pool (each a wake of its workers and a join): contract.h
  // Per user of the pool (kernel_contract.h's PoolUser: linear layers, attention, the rest, decoder layers), in
  // nanoseconds: the thread-time its hand-offs held the pool (each call's wall time times the pool's threads), and the
  // time its tasks worked in that. The difference is what the hand-offs cost: waking, joining, and threads waiting on
  // the slowest.
  kLinearPoolNanos,
  kLinearWorkNanos,
  kAttentionPoolNanos,
  kAttentionWorkNanos,
  kOtherPoolNanos,
  kOtherWorkNanos,
  kLayerPoolNanos,
  kLayerWorkNanos,
  kRowPanelOutputs,        // outputs of the row formats' prefill kernel (activations in panels): block_formats.h
  kDotProductElements,     // outputs of the block formats' ARM64 dot-product tiles (block_tiles_dotprod.h): sdot,
  kMatrixMultiplyElements, // and smmla
  kPathCount
};

__attribute__((visibility("hidden"))) inline std::atomic<uint64_t> path_counts[kPathCount];

inline bool counting_paths() {
  static const bool on = [] {
    const char* text = std::getenv("CUSTOM_OPS_COUNT_PATHS");
    return text != nullptr && std::strcmp(text, "1") == 0;
  }();
  return on;
}

inline void count(Path path, uint64_t amount = 1) {
  if (counting_paths()) {
    path_counts[path].fetch_add(amount, std::memory_order_relaxed);
  }
}

// ---- 16-bit floats: widened to float a block at a time, computed, rounded back once ---------------------------------
// Element by element, a Half/BFloat16 conversion is a dozen scalar instructions, which left these dtypes at a fifth
// of memory bandwidth. Instead, fixed-size blocks are converted with vector instructions into an L1-resident float
// buffer, Op runs over it, and the block is rounded back; only the last partial block takes the portable path.
template <typename T>
constexpr bool kIsReducedFloat = std::is_same_v<T, c10::Half> || std::is_same_v<T, c10::BFloat16>;
constexpr int64_t kConvertBlock = 256;  // 1 KiB of floats; a multiple of every vector width below

inline const uint16_t* bits_of(const c10::Half* p) { return reinterpret_cast<const uint16_t*>(p); }
inline const uint16_t* bits_of(const c10::BFloat16* p) { return reinterpret_cast<const uint16_t*>(p); }
inline uint16_t* bits_of(c10::Half* p) { return reinterpret_cast<uint16_t*>(p); }
inline uint16_t* bits_of(c10::BFloat16* p) { return reinterpret_cast<uint16_t*>(p); }

// Portable conversions of n elements, in order. BFloat16 is the top half of a float: widening is a shift, narrowing
// rounds to nearest even exactly as c10::BFloat16's constructor does (NaN becomes 0x7FC0).
inline void widen(const c10::BFloat16* in, float* out, int64_t n) {
  const uint16_t* bits = bits_of(in);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t wide = static_cast<uint32_t>(bits[i]) << 16;
    std::memcpy(&out[i], &wide, sizeof(float));
  }
}

inline void narrow(const float* in, c10::BFloat16* out, int64_t n) {
  uint16_t* bits = bits_of(out);
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &in[i], sizeof(float));
    const uint16_t rounded = static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    bits[i] = in[i] != in[i] ? uint16_t{0x7FC0} : rounded;
  }
}

// Half: c10's software conversions, which round to nearest even like the hardware's, except that c10 turns every NaN
// into 0x7E00 when narrowing; F16C, AArch64's FCVT and so ATen keep the NaN's sign and top payload bits (quieted), and so
// does this. The vector blocks below use the hardware; these serve the tails (and whole blocks without F16C), so a
// NaN's bits do not depend on where it sits. Storage is read and written through memcpy (no __fp16 aliasing).
inline void widen(const c10::Half* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, in + i, sizeof(h));
    out[i] = c10::detail::fp16_ieee_to_fp32_value(h);  // exact; a NaN keeps its payload, quieted, as F16C does
  }
}

inline void narrow(const float* in, c10::Half* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &in[i], sizeof(u));
    uint16_t h = c10::detail::fp16_ieee_from_fp32_value(in[i]);
    if (in[i] != in[i]) {
      h = static_cast<uint16_t>(((u >> 16) & 0x8000u) | 0x7E00u | ((u >> 13) & 0x3FFu));
    }
    std::memcpy(out + i, &h, sizeof(h));
  }
}

// Whole blocks with the portable code: a constant trip count is what lets the compiler vectorize it (NEON on AArch64).
template <typename T>
inline void widen_block(const T* in, float* block) { widen(in, block, kConvertBlock); }
template <typename T>
inline void narrow_block(const float* block, T* out) { narrow(block, out, kConvertBlock); }

#if defined(__aarch64__)
// Half on AArch64 with NEON's FCVTL/FCVTN, 8 at a time (the compiler leaves float -> __fp16 loops scalar).
inline void widen_block(const c10::Half* in, float* block) {
  const auto* h = reinterpret_cast<const float16_t*>(in);
  for (int64_t k = 0; k < kConvertBlock; k += 8) {
    const float16x8_t v = vld1q_f16(h + k);
    vst1q_f32(block + k, vcvt_f32_f16(vget_low_f16(v)));
    vst1q_f32(block + k + 4, vcvt_high_f32_f16(v));
  }
}

inline void narrow_block(const float* block, c10::Half* out) {
  auto* h = reinterpret_cast<float16_t*>(out);
  for (int64_t k = 0; k < kConvertBlock; k += 8) {
    vst1q_f16(h + k, vcvt_high_f16_f32(vcvt_f16_f32(vld1q_f32(block + k)), vld1q_f32(block + k + 4)));
  }
}
#endif

// The x86-64 vector ISAs a kernel is compiled for (every other architecture runs kBaseline's code: NEON on AArch64).

// ---- Loops ---------------------------------------------------------------------------------------------------------
// The body every ISA variant shares, compiled for that variant's ISA. 16-bit floats: whole blocks with WIDEN_BLOCK /
// NARROW_BLOCK (which may permute a block's order, as long as NARROW_BLOCK undoes WIDEN_BLOCK: Op is elementwise), the
// rest in order with the portable conversions. Other types: element by element, which the compiler vectorizes.
#define CUSTOM_OPS_ELEMENTWISE_LOOP(WIDEN_BLOCK, NARROW_BLOCK)           \
  if constexpr (kIsReducedFloat<T>) {                                   \
    alignas(64) float block[kConvertBlock];                             \
    int64_t i = 0;                                                      \
    for (; i + kConvertBlock <= n; i += kConvertBlock) {                \
      WIDEN_BLOCK(in + i, block);                                       \
      for (int64_t j = 0; j < kConvertBlock; ++j) {                     \
        block[j] = Op::template apply<float>(block[j]);                 \
      }                                                                 \
      NARROW_BLOCK(block, out + i);                                     \
    }                                                                   \
    widen(in + i, block, n - i);                                        \
    for (int64_t j = 0; j < n - i; ++j) {                               \
      block[j] = Op::template apply<float>(block[j]);                   \
    }                                                                   \
    narrow(block, out + i, n - i);                                      \
  } else {                                                              \
    for (int64_t i = 0; i < n; ++i) {                                   \
      out[i] = apply_op<Op>(in[i]);                                     \
    }                                                                   \
  }

template <typename T, typename Op>
inline void loop_baseline(const T* in, T* out, int64_t n) {
  CUSTOM_OPS_ELEMENTWISE_LOOP(widen_block, narrow_block)
}

#if defined(__aarch64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
// AArch64: the baseline above is NEON (part of ARMv8-A). CPUs with half-precision arithmetic (FEAT_FP16, ARMv8.2-A;
// the kernel reports it in HWCAP) compute Half elements in half precision, eight per instruction and without
// conversions, for functors that promise this is exact (kExactInHalf, see elementwise_functor.h). The same binary
// runs on any ARMv8-A: only this function is compiled for FP16, and it runs only where HWCAP says so.
#define CUSTOM_OPS_AARCH64_FP16_DISPATCH 1

typedef __fp16 half8 __attribute__((vector_size(16)));

template <typename Op>
CUSTOM_OPS_HALF_ARITHMETIC void loop_half_arithmetic(const c10::Half* in, c10::Half* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    half8 x;
    std::memcpy(&x, in + i, sizeof(x));
    const half8 y = Op::template apply<half8>(x);
    std::memcpy(out + i, &y, sizeof(y));
  }
  loop_baseline<c10::Half, Op>(in + i, out + i, n - i);
}
#endif

#ifdef CUSTOM_OPS_X86_DISPATCH
// Half <-> float with F16C (8 at a time) and AVX-512 (16): the conversion rounds to nearest even, as c10::Half does.
CUSTOM_OPS_AVX2 inline void widen_block_avx2(const c10::Half* in, float* block) {
  for (int64_t k = 0; k < kConvertBlock; k += 8) {
    _mm256_store_ps(block + k, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bits_of(in) + k))));
  }
}

CUSTOM_OPS_AVX2 inline void narrow_block_avx2(const float* block, c10::Half* out) {
  for (int64_t k = 0; k < kConvertBlock; k += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(bits_of(out) + k),
                     _mm256_cvtps_ph(_mm256_load_ps(block + k), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
}

CUSTOM_OPS_AVX512 inline void widen_block_avx512(const c10::Half* in, float* block) {
  for (int64_t k = 0; k < kConvertBlock; k += 16) {
    _mm512_store_ps(block + k,
                    _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bits_of(in) + k))));
  }
}

CUSTOM_OPS_AVX512 inline void narrow_block_avx512(const float* block, c10::Half* out) {
  for (int64_t k = 0; k < kConvertBlock; k += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(bits_of(out) + k),
                        _mm512_cvtps_ph(_mm512_load_ps(block + k), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
}

// BFloat16 with integer shifts. Widening interleaves each 128-bit lane's words with zeros (unpacklo/unpackhi), which
// puts the floats in a lane-permuted order; narrowing rounds and packs with packus, whose per-lane order is exactly
// the inverse, so no cross-lane shuffle is needed.
CUSTOM_OPS_AVX2 inline __m256i round_to_bfloat16_avx2(__m256i u) {
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
  const __m256 f = _mm256_castsi256_ps(u);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7FC0), nan);
}

CUSTOM_OPS_AVX2 inline void widen_block_avx2(const c10::BFloat16* in, float* block) {
  for (int64_t k = 0; k < kConvertBlock; k += 16) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bits_of(in) + k));
    _mm256_store_si256(reinterpret_cast<__m256i*>(block + k), _mm256_unpacklo_epi16(_mm256_setzero_si256(), v));
    _mm256_store_si256(reinterpret_cast<__m256i*>(block + k + 8), _mm256_unpackhi_epi16(_mm256_setzero_si256(), v));
  }
}

CUSTOM_OPS_AVX2 inline void narrow_block_avx2(const float* block, c10::BFloat16* out) {
  for (int64_t k = 0; k < kConvertBlock; k += 16) {
    const __m256i lo = round_to_bfloat16_avx2(_mm256_load_si256(reinterpret_cast<const __m256i*>(block + k)));
    const __m256i hi = round_to_bfloat16_avx2(_mm256_load_si256(reinterpret_cast<const __m256i*>(block + k + 8)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(bits_of(out) + k), _mm256_packus_epi32(lo, hi));
  }
}

// (The final shift is masked to the non-NaN lanes, which saves the blend: this rounding is what bounds BFloat16.)
CUSTOM_OPS_AVX512 inline __m512i round_to_bfloat16_avx512(__m512i u) {
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i biased = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  const __m512 f = _mm512_castsi512_ps(u);
  return _mm512_mask_srli_epi32(_mm512_set1_epi32(0x7FC0), _mm512_cmp_ps_mask(f, f, _CMP_ORD_Q), biased, 16);
}

CUSTOM_OPS_AVX512 inline void widen_block_avx512(const c10::BFloat16* in, float* block) {
  for (int64_t k = 0; k < kConvertBlock; k += 32) {
    const __m512i v = _mm512_loadu_si512(bits_of(in) + k);
    _mm512_store_si512(block + k, _mm512_unpacklo_epi16(_mm512_setzero_si512(), v));
    _mm512_store_si512(block + k + 16, _mm512_unpackhi_epi16(_mm512_setzero_si512(), v));
  }
}

CUSTOM_OPS_AVX512 inline void narrow_block_avx512(const float* block, c10::BFloat16* out) {
  for (int64_t k = 0; k < kConvertBlock; k += 32) {
    const __m512i lo = round_to_bfloat16_avx512(_mm512_load_si512(block + k));
    const __m512i hi = round_to_bfloat16_avx512(_mm512_load_si512(block + k + 16));
    _mm512_storeu_si512(bits_of(out) + k, _mm512_packus_epi32(lo, hi));
  }
}

// The same loops, compiled for wider vectors. apply_op and Op::apply inline into each (a default-target function may
// inline into a function with a superset target).
template <typename T, typename Op>
CUSTOM_OPS_AVX2 void loop_avx2(const T* in, T* out, int64_t n) {
  CUSTOM_OPS_ELEMENTWISE_LOOP(widen_block_avx2, narrow_block_avx2)
}

template <typename T, typename Op>
CUSTOM_OPS_AVX512 void loop_avx512(const T* in, T* out, int64_t n) {
  CUSTOM_OPS_ELEMENTWISE_LOOP(widen_block_avx512, narrow_block_avx512)
}

#endif

// out[0, n) = Op(in[0, n)) with the best vector ISA this CPU has; returns the counter of the loop that ran.
template <typename T, typename Op>
Path vector_loop(const T* in, T* out, int64_t n) {
#ifdef CUSTOM_OPS_X86_DISPATCH
  switch (simd::detected_isa()) {
    case simd::Isa::kAvx512:
      loop_avx512<T, Op>(in, out, n);
      return kAvx512Elements;
    case simd::Isa::kAvx2:
      loop_avx2<T, Op>(in, out, n);
      return kAvx2Elements;
    case simd::Isa::kBaseline:
      break;
  }
#endif
#ifdef CUSTOM_OPS_AARCH64_FP16_DISPATCH
  if constexpr (std::is_same_v<T, c10::Half> && exact_in_half<Op>) {
    if (simd::cpu_has_half_arithmetic()) {
      loop_half_arithmetic<Op>(in, out, n);
      return kHalfArithmeticElements;
    }
  }
#endif
  loop_baseline<T, Op>(in, out, n);
  return kBaselineElements;
}

// Like vector_loop, but the output bypasses the cache. Blocks are computed into an L1-resident buffer with the
// vector loop, then copied out with 16-byte non-temporal stores (SSE2, so every x86-64 CPU has them); this keeps one
// type-agnostic streaming path for every dtype. `out` must be aligned to sizeof(T) (the callers check it).
template <typename T, typename Op>
Path streaming_loop(const T* in, T* out, int64_t n) {
#ifdef CUSTOM_OPS_X86_DISPATCH
  constexpr size_t kAlign = 64;
  // Plain stores up to the first cache-line boundary of the output, so every streamed block is line-aligned.
  const size_t misalignment = reinterpret_cast<uintptr_t>(out) % kAlign;
  int64_t i = 0;
  if (misalignment != 0) {
    const int64_t head = static_cast<int64_t>((kAlign - misalignment) / sizeof(T));
    i = head < n ? head : n;
    vector_loop<T, Op>(in, out, i);
    count(kUnalignedHeads);
  }
  constexpr int64_t kBlockBytes = 4096;
  constexpr int64_t kBlock = kBlockBytes / static_cast<int64_t>(sizeof(T));
  alignas(kAlign) T block[kBlock];
  uint64_t streamed = 0;
  for (; i + kBlock <= n; i += kBlock) {
    vector_loop<T, Op>(in + i, block, kBlock);
    auto* dst = reinterpret_cast<__m128i*>(out + i);
    const auto* src = reinterpret_cast<const __m128i*>(block);
    for (int64_t v = 0; v < kBlockBytes / 16; v += 4) {
      _mm_stream_si128(dst + v, _mm_load_si128(src + v));
      _mm_stream_si128(dst + v + 1, _mm_load_si128(src + v + 1));
      _mm_stream_si128(dst + v + 2, _mm_load_si128(src + v + 2));
      _mm_stream_si128(dst + v + 3, _mm_load_si128(src + v + 3));
    }
    ++streamed;
  }
  const Path isa = vector_loop<T, Op>(in + i, out + i, n - i);
  _mm_sfence();  // streaming stores are weakly ordered: publish them before this thread reports the task done
  count(kStreamedBlocks, streamed);  // once per range: a shared counter per block would cost bandwidth
  return isa;
#else
  return vector_loop<T, Op>(in, out, n);
#endif
}

// Applies Op to numel contiguous elements, splitting large inputs across the caller's threadpool.
// parallel_for(begin, end, grain, fn) is ExecuTorch's or ATen's; the result is what it returns (false: not all work
// ran, which the caller must report). `in` and `out` are either the same buffer or do not overlap.
template <typename T, typename Op, typename ParallelFor>
bool apply_unary(const T* in, T* out, int64_t numel, ParallelFor&& parallel_for) {
  const bool streaming = streams(static_cast<size_t>(numel) * sizeof(T));
  const auto work = [=](int64_t begin, int64_t end) {
    const Path isa = streaming ? streaming_loop<T, Op>(in + begin, out + begin, end - begin)
                               : vector_loop<T, Op>(in + begin, out + begin, end - begin);
    count(isa, static_cast<uint64_t>(end - begin));
  };
  const int64_t grain = static_cast<int64_t>(parallel_grain_bytes() / sizeof(T));
  if (numel < 2 * grain) {
    work(0, numel);
    count(kSerialCalls);
    return true;
  }
  return parallel_for(0, numel, grain, [&](int64_t begin, int64_t end) {
    work(begin, end);
    count(kParallelTasks);
  });
}

} // namespace elementwise
} // namespace native
} // namespace custom

// The debug query behind the counters above: copies min(n, kPathCount) counts into `counts`, in the order of the Path
// enum (serial calls, parallel tasks, streamed blocks, unaligned heads, then elements per loop: baseline, AVX2,
// AVX-512, half arithmetic, then hand-offs to the pool and the pool's thread-time and work per user, the row panels'
// outputs, the dot-product tiles' by sdot and by smmla), and returns 1, or 0 when CUSTOM_OPS_COUNT_PATHS=1 was not
// set (nothing was counted).
// Exported from every library that runs the loop, so tests can read it with ctypes.
extern "C" __attribute__((used, visibility("default"))) inline int custom_ops_elementwise_stats(
    uint64_t* counts, int n) {
  for (int i = 0; i < n && i < custom::native::elementwise::kPathCount; ++i) {
    counts[i] = custom::native::elementwise::path_counts[i].load(std::memory_order_relaxed);
  }
  return custom::native::elementwise::counting_paths() ? 1 : 0;
}
