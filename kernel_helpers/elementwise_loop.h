// The fast CPU loop under unary_elementwise.h: out[i] = Op(in[i]) over contiguous memory, for any functor that follows
// elementwise_functor.h. Three things make it fast, none of which depends on the build machine's -march:
//   1. vectorized: the loop is compiled for AVX-512, AVX2 and the baseline ISA, and the CPU picks at run time;
//   2. streaming stores for outputs bigger than the last-level cache: they skip the read-for-ownership a plain store
//      does and do not evict everything else from the cache;
//   3. the caller's parallel_for (ExecuTorch's threadpool, or ATen's) for large inputs, with a grain that keeps small
//      inputs on the calling thread.
//
// Test hooks: CUSTOM_OPS_STREAMING_MIN_BYTES and CUSTOM_OPS_PARALLEL_GRAIN_BYTES override the two thresholds (read once
// per process), and custom_ops_elementwise_stats() reports which paths ran, so tests can prove each path is exercised.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#if defined(__linux__)
#include <unistd.h>
#endif

#include "elementwise_functor.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define CUSTOM_OPS_X86_DISPATCH 1
#endif

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

// Bytes of output per parallel task. Under two tasks' worth the op stays on the calling thread: waking the pool costs
// more than the work it would split.
inline size_t parallel_grain_bytes() {
  static const size_t bytes = [] {
    const size_t value = size_from_env("CUSTOM_OPS_PARALLEL_GRAIN_BYTES", size_t{256} << 10);
    return value < 64 ? size_t{64} : value;
  }();
  return bytes;
}

// ---- Which paths ran (a debug query for tests; one relaxed increment per call or task) ----------------------------
enum Path : int { kSerialCalls, kParallelCalls, kStreamedRanges, kStreamedRangesWithHead, kPathCount };

__attribute__((visibility("hidden"))) inline std::atomic<uint64_t> path_counts[kPathCount];

inline void count(Path path) {
  path_counts[path].fetch_add(1, std::memory_order_relaxed);
}

// ---- Loops ---------------------------------------------------------------------------------------------------------
template <typename T, typename Op>
inline void loop_baseline(const T* in, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    out[i] = apply_op<Op>(in[i]);
  }
}

#ifdef CUSTOM_OPS_X86_DISPATCH
// The same loop, compiled for wider vectors. apply_op and Op::apply inline into each (a default-target function may
// inline into a function with a superset target).
template <typename T, typename Op>
__attribute__((target("avx2,fma,f16c"))) void loop_avx2(const T* in, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    out[i] = apply_op<Op>(in[i]);
  }
}

template <typename T, typename Op>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"))) void loop_avx512(
    const T* in, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    out[i] = apply_op<Op>(in[i]);
  }
}

enum class Isa { kBaseline, kAvx2, kAvx512 };

// F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports has no "f16c".
inline bool cpu_supports_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
}

// A variant runs only on a CPU that has every feature it was compiled for.
inline Isa detected_isa() {
  static const Isa isa = [] {
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_supports_f16c();
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    return avx512 ? Isa::kAvx512 : avx2 ? Isa::kAvx2 : Isa::kBaseline;
  }();
  return isa;
}
#endif

// out[0, n) = Op(in[0, n)) with the best vector ISA this CPU has.
template <typename T, typename Op>
void vector_loop(const T* in, T* out, int64_t n) {
#ifdef CUSTOM_OPS_X86_DISPATCH
  switch (detected_isa()) {
    case Isa::kAvx512:
      return loop_avx512<T, Op>(in, out, n);
    case Isa::kAvx2:
      return loop_avx2<T, Op>(in, out, n);
    case Isa::kBaseline:
      break;
  }
#endif
  loop_baseline<T, Op>(in, out, n);
}

// Like vector_loop, but the output bypasses the cache. Blocks are computed into an L1-resident buffer with the
// vector loop, then copied out with 16-byte non-temporal stores (SSE2, so every x86-64 CPU has them); this keeps one
// type-agnostic streaming path for every dtype. `out` must be aligned to sizeof(T) (the callers check it).
template <typename T, typename Op>
void streaming_loop(const T* in, T* out, int64_t n) {
#ifdef CUSTOM_OPS_X86_DISPATCH
  constexpr size_t kAlign = 64;
  count(kStreamedRanges);
  // Plain stores up to the first cache-line boundary of the output, so every streamed block is line-aligned.
  const size_t misalignment = reinterpret_cast<uintptr_t>(out) % kAlign;
  int64_t i = 0;
  if (misalignment != 0) {
    count(kStreamedRangesWithHead);
    const int64_t head = static_cast<int64_t>((kAlign - misalignment) / sizeof(T));
    i = head < n ? head : n;
    vector_loop<T, Op>(in, out, i);
  }
  constexpr int64_t kBlockBytes = 4096;
  constexpr int64_t kBlock = kBlockBytes / static_cast<int64_t>(sizeof(T));
  alignas(kAlign) T block[kBlock];
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
  }
  vector_loop<T, Op>(in + i, out + i, n - i);
  _mm_sfence();  // streaming stores are weakly ordered: publish them before this thread reports the task done
#else
  vector_loop<T, Op>(in, out, n);
#endif
}

// Applies Op to numel contiguous elements, splitting large inputs across the caller's threadpool.
// parallel_for(begin, end, grain, fn) is ExecuTorch's or ATen's; the result is what it returns (false: not all work
// ran, which the caller must report). `in` and `out` are either the same buffer or do not overlap.
template <typename T, typename Op, typename ParallelFor>
bool apply_unary(const T* in, T* out, int64_t numel, ParallelFor&& parallel_for) {
  const bool streaming = static_cast<size_t>(numel) * sizeof(T) > streaming_min_bytes();
  const auto work = [=](int64_t begin, int64_t end) {
    if (streaming) {
      streaming_loop<T, Op>(in + begin, out + begin, end - begin);
    } else {
      vector_loop<T, Op>(in + begin, out + begin, end - begin);
    }
  };
  const int64_t grain = static_cast<int64_t>(parallel_grain_bytes() / sizeof(T));
  if (numel < 2 * grain) {
    count(kSerialCalls);
    work(0, numel);
    return true;
  }
  count(kParallelCalls);
  return parallel_for(0, numel, grain, work);
}

} // namespace elementwise
} // namespace native
} // namespace custom

// The debug query behind the counters above: copies min(n, 4) counts into `counts` (serial calls, parallel calls,
// streamed ranges, streamed ranges that began with an unaligned head). Exported from every library that runs the loop,
// so tests can read it with ctypes.
extern "C" __attribute__((used, visibility("default"))) inline void custom_ops_elementwise_stats(
    uint64_t* counts, int n) {
  for (int i = 0; i < n && i < custom::native::elementwise::kPathCount; ++i) {
    counts[i] = custom::native::elementwise::path_counts[i].load(std::memory_order_relaxed);
  }
}
