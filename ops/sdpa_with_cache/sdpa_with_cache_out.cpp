// The kernel of my_ops::sdpa_with_cache.out, compiled twice like rms_norm's: ExecuTorch mode into libcustom_ops_lib.so
// (the runtime kernel) and ATen mode into libcustom_ops_aot_lib.so (sdpa_with_cache.cpp's CPU kernel). Attention of T
// new queries over a KV cache, causal (and within a sliding window when `window` > 0), in one pass: each block of
// cached positions is scored, folded into a running (online) softmax and accumulated, so each filled K and V row is
// read once per task, nothing outside a query's causal limit and window is read, and no [T, positions] matrix is
// stored. Tasks (batch, adjacent kv heads, block of queries) run on the
// thread pool; the query heads sharing a kv head (grouped-query attention) share each K and V row read, and at decode
// a task's kv heads are read side by side, position by position. float32 and bfloat16, computed in float32 with
// vector code compiled for AVX-512, AVX2 and the baseline ISA (picked at run time).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "declared_dtypes/my_ops/sdpa_with_cache.h"
#include "kernel_helpers/elementwise_loop.h"
#include "kernel_helpers/kernel_contract.h"
#include "kernel_helpers/vector.h"
#include "ops/sdpa_with_cache/attention.h"

// The project builds with -ffp-contract=off so that elementwise kernels equal ATen bit for bit. This op promises a
// tolerance, not bits (custom_ops.bzl), so its own functions may fuse a multiply and an add into one FMA where the ISA
// has it: the dot products and the accumulation of V take half the instructions.
#if defined(__clang__)
#pragma clang fp contract(fast)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=fast")
#endif
CUSTOM_OPS_NO_VECTOR_ABI_NOTE  // again: the optimize pragma resets it, and a precompiled header does not carry it

namespace custom {
namespace native {
namespace {

constexpr const char* kOp = "my_ops::sdpa_with_cache.out";
using Dtypes = declared_dtypes::my_ops::sdpa_with_cache;

constexpr int64_t kPositionsPerBlock = 64;  // scores kept per query row between the two passes over a block
constexpr int64_t kPositionsPerSweep = 8;   // V rows accumulated per head before the next head, when a task has several
constexpr int64_t kPrefetchPositions = 16;  // how far ahead of the scores the K and V rows are asked for
constexpr int64_t kCacheLine = 64;          // bytes a prefetch brings

// ---- Vectors: kernel_helpers/vector.h's lanes, widths 4, 8, 16 ----------------------------------------------------
// A task function compiled for AVX-512 (or AVX2) inlines them and the compiler emits that ISA's instructions; no
// intrinsics, so the same code is NEON on AArch64. A bfloat16 row is widened 2W elements at a time as the even
// elements, then the odd ones (simd::evens, simd::odds); float copies of a bfloat16 row (the scaled query, the
// accumulator) are kept in that order.
using namespace simd;

// Where element d of a row of n elements sits in its float copy: for bfloat16, each whole chunk of 2W elements holds
// its even elements, then its odd ones; elements past the last whole chunk (and every float32 row) stay in order.
template <int W, typename T>
CUSTOM_OPS_INLINE int64_t lane_order(int64_t d, int64_t n) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    if (d < n / (2 * W) * (2 * W)) {
      const int64_t r = d % (2 * W);
      return d - r + (r % 2) * W + r / 2;
    }
  }
  return d;
}

template <typename T>
CUSTOM_OPS_INLINE float to_float(T x) {
  return static_cast<float>(x);
}

// 2W elements of a row as two float vectors, in the row's lane_order: float32 in order, bfloat16 as the even, then
// the odd elements.
template <int W>
CUSTOM_OPS_INLINE void load_chunk(const float* p, F<W>& first, F<W>& second) {
  first = load<W>(p), second = load<W>(p + W);
}

template <int W>
CUSTOM_OPS_INLINE void load_chunk(const c10::BFloat16* p, F<W>& first, F<W>& second) {
  const U<W> pairs = load_pairs<W>(p);
  first = evens<W>(pairs), second = odds<W>(pairs);
}

// Positions whose scores a row computes together: each in a chain of its own, their sums made at once (lane_sums;
// AVX-512's 16-lane chains folded to 8 lanes first), where one sum at a time cost a decode step's attention ~15% more
// on the AVX2 EPYC.
template <int W>
constexpr int kPositionsPerGroup = W < 8 ? W : 8;

// out[i] = q[0, n) . k[i * stride, i * stride + n), q already in float (in lane_order): for i < N one position at a
// time (the block's last ones), or a group of kPositionsPerGroup positions whose chains share q's loads.
template <int N, int W, typename T>
CUSTOM_OPS_INLINE void dots(const float* q, const T* k, int64_t stride, int64_t n, float* out) {
  F<W> acc[N] = {};
  int64_t d = 0;
  for (; d + 2 * W <= n; d += 2 * W) {
    const F<W> q_first = load<W>(q + d), q_second = load<W>(q + d + W);
    for (int i = 0; i < N; ++i) {
      F<W> first, second;
      load_chunk<W>(k + i * stride + d, first, second);
      acc[i] += q_first * first;
      acc[i] += q_second * second;
    }
  }
  constexpr int P = kPositionsPerGroup<W>;
  if constexpr (N == P) {
    F<P> sums;
    if constexpr (P == W) {
      sums = lane_sums<P>(acc);
    } else {
      F<P> folded[P];
      for (int i = 0; i < P; ++i) {
        folded[i] = halves_added<W>(acc[i]);
      }
      sums = lane_sums<P>(folded);
    }
    for (int64_t e = d; e < n; ++e) {
      for (int i = 0; i < N; ++i) {
        sums[i] += q[e] * to_float(k[i * stride + e]);
      }
    }
    store<P>(out, sums);
  } else {
    for (int i = 0; i < N; ++i) {
      out[i] = sum<W>(acc[i]);
      for (int64_t e = d; e < n; ++e) {
        out[i] += q[e] * to_float(k[i * stride + e]);
      }
    }
  }
}

// acc[0, 2W * C) += sum over j < m of w[j] * v[j * stride, j * stride + 2W * C): C whole chunks of 2W in acc's
// lane_order, the 2C accumulators in registers while the positions stream by.
template <int W, int C, typename T>
CUSTOM_OPS_INLINE void add_weighted_chunks(float* acc, const float* w, const T* v, int64_t stride, int64_t m) {
  F<W> a[2 * C];
  for (int k = 0; k < 2 * C; ++k) {
    a[k] = load<W>(acc + k * W);
  }
  for (int64_t j = 0; j < m; ++j) {
    const F<W> x = splat<W>(w[j]);
    for (int c = 0; c < C; ++c) {
      F<W> first, second;
      load_chunk<W>(v + j * stride + 2 * c * W, first, second);
      a[2 * c] += x * first;
      a[2 * c + 1] += x * second;
    }
  }
  for (int k = 0; k < 2 * C; ++k) {
    store<W>(acc + k * W, a[k]);
  }
}

// acc[0, n) += sum over j < m of w[j] * v[j * stride, j * stride + n): four chunks at a time (a head_dim of 128 in
// one pass over the V rows with AVX-512), then two, then one, then the rest in order.
template <int W, typename T>
CUSTOM_OPS_INLINE void add_weighted_rows(float* acc, const float* w, const T* v, int64_t stride, int64_t m,
                                         int64_t n) {
  int64_t d = 0;
  for (; d + 8 * W <= n; d += 8 * W) {
    add_weighted_chunks<W, 4>(acc + d, w, v + d, stride, m);
  }
  if (d + 4 * W <= n) {
    add_weighted_chunks<W, 2>(acc + d, w, v + d, stride, m);
    d += 4 * W;
  }
  if (d + 2 * W <= n) {
    add_weighted_chunks<W, 1>(acc + d, w, v + d, stride, m);
    d += 2 * W;
  }
  for (; d < n; ++d) {
    for (int64_t j = 0; j < m; ++j) {
      acc[d] += w[j] * to_float(v[j * stride + d]);
    }
  }
}

// ---- The attention ------------------------------------------------------------------------------------------------
using attention::Geometry;
using attention::Tensors;

// What one task covers: batch entry b, kv heads [h0, h0 + heads), query positions [first, first + head_rows / group),
// head_rows query rows per kv head.
struct Task {
  int64_t b, h0, heads, first, head_rows;

  Task(const Geometry& g, int64_t task) {
    const int64_t query_block = task % g.query_blocks(), kv_block = task / g.query_blocks() % g.kv_blocks();
    b = task / (g.query_blocks() * g.kv_blocks());
    h0 = kv_block * g.kv_heads_per_task();
    heads = std::min(g.kv_heads_per_task(), g.kv_heads - h0);
    first = query_block * g.queries_per_task();
    head_rows = (std::min(g.length, first + g.queries_per_task()) - first) * g.group();
  }
  int64_t rows() const { return heads * head_rows; }
};

// One task: kv heads [h0, h0 + heads_here), rows R = hh * head_rows + r for kv head h0 + hh, with
// r = (query position - first) * group + (query head - kv head * group). Row R may attend to cache positions
// first_visible(q) .. q, q = start + first + r / group (0 .. q without a window). Blocks of positions from the first
// query's first visible one are scored and accumulated positions outer, heads inner.
template <int W, typename T>
CUSTOM_OPS_INLINE void attend(const Geometry& g, const Tensors<T>& t, int64_t task) {
  const Task span(g, task);
  const int64_t group = g.group(), D = g.head_dim;
  const int64_t b = span.b, h0 = span.h0, heads_here = span.heads, first = span.first, head_rows = span.head_rows;
  const int64_t rows = span.rows();
  const int64_t end = g.start + first + head_rows / group;  // positions [0, end) are read by the task's last query
  const int64_t begin = g.first_visible(g.start + first);  // and none before this one by any of its queries
  constexpr int64_t kScoreStride = (kPositionsPerBlock + W - 1) / W * W;

  // Heap, not stack: head_dim is the program's to choose.
  std::vector<float> buffer(static_cast<size_t>(rows * (2 * D + kScoreStride + 2)));
  float* q = buffer.data();                           // [rows, D], scaled
  float* acc = q + rows * D;                          // [rows, D]
  float* scores = acc + rows * D;                     // [rows, kScoreStride]: scores, then their exponentials
  float* running_max = scores + rows * kScoreStride;  // [rows]
  float* running_sum = running_max + rows;            // [rows]
  // Row r attends to positions [visible_from[r], valid[r]) of a block; both grow with r.
  std::vector<int64_t> visible_from(static_cast<size_t>(head_rows)), valid(static_cast<size_t>(head_rows));

  const auto query_row = [&](int64_t R) {
    const int64_t hh = R / head_rows, r = R % head_rows;
    const int64_t position = first + r / group, head = (h0 + hh) * group + r % group;
    return ((b * g.length + position) * g.heads + head) * D;
  };
  for (int64_t r = 0; r < rows; ++r) {
    const T* in = t.query + query_row(r);
    for (int64_t d = 0; d < D; ++d) {
      q[r * D + lane_order<W, T>(d, D)] = to_float(in[d]) * g.scale;
    }
    running_max[r] = -std::numeric_limits<float>::infinity();
    running_sum[r] = 0.0f;
  }
  std::fill(acc, acc + rows * D, 0.0f);

  const int64_t stride = g.kv_heads * D;  // from one cached position to the next
  const T* keys = t.key + (b * g.positions * g.kv_heads + h0) * D;
  const T* values = t.value + (b * g.positions * g.kv_heads + h0) * D;
  // Between two calls a decode step streams megabytes of weights, so the cache arrives cold: with the hardware
  // prefetcher alone a call read it at ~9 GB/s and took 4-5x its warm time. The K and V rows of the task's heads
  // are asked for kPrefetchPositions ahead of the scores' loop, V's with K's, so both are in cache when used.
  const int64_t row_bytes = heads_here * D * static_cast<int64_t>(sizeof(T));
  // Always inlined: a function whose only effects are prefetches counts as pure to GCC, which then drops its calls.
  const auto prefetch_positions = [&](int64_t from, int64_t to) __attribute__((always_inline)) {
    for (int64_t position = from; position < std::min(to, end); ++position) {
      const char* k = reinterpret_cast<const char*>(keys + position * stride);
      const char* v = reinterpret_cast<const char*>(values + position * stride);
      for (int64_t byte = 0; byte < row_bytes; byte += kCacheLine) {
        __builtin_prefetch(k + byte);
        __builtin_prefetch(v + byte);
      }
    }
  };
  prefetch_positions(begin, begin + kPrefetchPositions);
  // V rows in sweeps of this many positions across the task's heads; one head's rows in one sweep of the block.
  const int64_t sweep = heads_here > 1 ? kPositionsPerSweep : kPositionsPerBlock;
  for (int64_t p0 = begin; p0 < end; p0 += kPositionsPerBlock) {
    const int64_t n = std::min(kPositionsPerBlock, end - p0);
    for (int64_t r = 0; r < head_rows; ++r) {
      const int64_t q_position = g.start + first + r / group;
      visible_from[r] = std::clamp<int64_t>(g.first_visible(q_position) - p0, 0, n);
      valid[r] = std::clamp<int64_t>(q_position + 1 - p0, 0, n);
    }
    // A group of positions at a time while every row that needs one of them gets the whole group: a row's scores
    // outside its own range (positions in [begin, end), filled) are overwritten with -inf or never read.
    constexpr int64_t P = kPositionsPerGroup<W>;
    int64_t j = 0;
    for (; j + P <= n; j += P) {
      prefetch_positions(p0 + j + kPrefetchPositions, p0 + j + P + kPrefetchPositions);
      for (int64_t hh = 0; hh < heads_here; ++hh) {
        const T* k = keys + (p0 + j) * stride + hh * D;
        for (int64_t r = head_rows - 1; r >= 0 && j < valid[r]; --r) {  // valid[] grows with r
          const int64_t R = hh * head_rows + r;
          dots<P, W>(q + R * D, k, stride, D, scores + R * kScoreStride + j);
        }
      }
    }
    for (; j < n; ++j) {
      prefetch_positions(p0 + j + kPrefetchPositions, p0 + j + 1 + kPrefetchPositions);
      for (int64_t hh = 0; hh < heads_here; ++hh) {
        const T* k = keys + (p0 + j) * stride + hh * D;
        for (int64_t r = head_rows - 1; r >= 0 && j < valid[r]; --r) {
          const int64_t R = hh * head_rows + r;
          dots<1, W>(q + R * D, k, stride, D, scores + R * kScoreStride + j);
        }
      }
    }
    for (int64_t R = 0; R < rows; ++R) {
      const int64_t from = visible_from[R % head_rows], limit = valid[R % head_rows];
      if (limit <= from) {  // nothing of this block is visible to the row: its running state stays
        continue;
      }
      float* s = scores + R * kScoreStride;
      const int64_t padded = (limit + W - 1) / W * W;
      std::fill(s, s + from, -std::numeric_limits<float>::infinity());
      std::fill(s + limit, s + padded, -std::numeric_limits<float>::infinity());
      F<W> block_max = load<W>(s);
      for (int64_t i = W; i < padded; i += W) {
        const F<W> x = load<W>(s + i);
        block_max = select<W>(x > block_max, x, block_max);
      }
      const float new_max = std::max(running_max[R], max<W>(block_max));
      F<W> total = {};
      for (int64_t i = 0; i < padded; i += W) {
        const F<W> e = exp_nonpositive<W>(load<W>(s + i) - new_max);
        store<W>(s + i, e);
        total += e;
      }
      const float correction = std::exp(running_max[R] - new_max);  // 0 on the first block (e^-inf)
      running_sum[R] = running_sum[R] * correction + sum<W>(total);
      running_max[R] = new_max;
      if (correction != 1.0f) {
        float* a = acc + R * D;
        for (int64_t d = 0; d < D; ++d) {
          a[d] *= correction;
        }
      }
    }
    for (int64_t j0 = 0; j0 < n; j0 += sweep) {
      for (int64_t hh = 0; hh < heads_here; ++hh) {
        for (int64_t r = 0; r < head_rows; ++r) {
          const int64_t R = hh * head_rows + r, j1 = std::max(j0, visible_from[r]);
          const int64_t m = std::min(valid[r], j0 + sweep) - j1;
          if (m > 0) {
            add_weighted_rows<W>(acc + R * D, scores + R * kScoreStride + j1, values + (p0 + j1) * stride + hh * D,
                                 stride, m, D);
          }
        }
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    T* out = t.out + query_row(r);
    const float inverse = 1.0f / running_sum[r];
    for (int64_t d = 0; d < D; ++d) {
      out[d] = static_cast<T>(acc[r * D + lane_order<W, T>(d, D)] * inverse);
    }
  }
}

template <int W, typename T>
CUSTOM_OPS_INLINE void attend_each(const Geometry& g, const Tensors<T>& t, int64_t first, int64_t end) {
  for (int64_t task = first; task < end; ++task) {
    attend<W>(g, t, task);
  }
}

template <typename T>
void attend_baseline(const Geometry& g, const Tensors<T>& t, int64_t first, int64_t end) {
  attend_each<4>(g, t, first, end);
}

#ifdef CUSTOM_OPS_X86_DISPATCH
template <typename T>
CUSTOM_OPS_AVX2 void attend_avx2(const Geometry& g, const Tensors<T>& t, int64_t first, int64_t end) {
  attend_each<8>(g, t, first, end);
}

template <typename T>
CUSTOM_OPS_AVX512 void attend_avx512(const Geometry& g, const Tensors<T>& t, int64_t first, int64_t end) {
  attend_each<16>(g, t, first, end);
}
#endif

// Tasks [first, end) with the best vector ISA this CPU has (CUSTOM_OPS_ISA caps it); counts the output elements each
// ISA's code wrote, where it wrote them.
template <typename T>
void attend_range(const Geometry& g, const Tensors<T>& t, int64_t first, int64_t end) {
  elementwise::Path path = elementwise::kBaselineElements;
#ifdef CUSTOM_OPS_X86_DISPATCH
  switch (simd::detected_isa()) {
    case simd::Isa::kAvx512:
      attend_avx512(g, t, first, end);
      path = elementwise::kAvx512Elements;
      break;
    case simd::Isa::kAvx2:
      attend_avx2(g, t, first, end);
      path = elementwise::kAvx2Elements;
      break;
    case simd::Isa::kBaseline:
      attend_baseline(g, t, first, end);
      break;
  }
#else
  attend_baseline(g, t, first, end);
#endif
  int64_t rows = 0;  // query rows of these tasks (the last query block or kv block may be short)
  for (int64_t task = first; task < end; ++task) {
    rows += Task(g, task).rows();
  }
  elementwise::count(path, static_cast<uint64_t>(rows * g.head_dim));
}

} // namespace

namespace attention {

template <typename T>
bool attend_all(const Geometry& g, const Tensors<T>& t) {
  const int64_t tasks = g.tasks();
  // Multiply-adds of the whole call, roughly: small calls stay on the calling thread.
  const int64_t seen = g.window > 0 ? std::min(g.window + g.length, g.start + g.length) : g.start + g.length;
  const double work = static_cast<double>(g.batch * g.heads * g.length) * seen * g.head_dim;
  if (tasks < 2 || work < 1 << 16) {
    attend_range(g, t, 0, tasks);
    return true;
  }
  return contract::parallel_for(0, tasks, 1, [&](int64_t first, int64_t end) { attend_range(g, t, first, end); },
                                contract::PoolUser::kAttention);
}

template <typename T>
void attend_tasks(const Geometry& g, const Tensors<T>& t, int64_t first, int64_t end) {
  attend_range(g, t, first, end);
}

template bool attend_all<float>(const Geometry&, const Tensors<float>&);
template bool attend_all<c10::BFloat16>(const Geometry&, const Tensors<c10::BFloat16>&);
template void attend_tasks<float>(const Geometry&, const Tensors<float>&, int64_t, int64_t);
template void attend_tasks<c10::BFloat16>(const Geometry&, const Tensors<c10::BFloat16>&, int64_t, int64_t);

} // namespace attention

namespace {

template <typename T>
bool run(const Geometry& g, const Tensor& query, const Tensor& key, const Tensor& value, Tensor& out) {
  return attention::attend_all<T>(g, Tensors<T>{query.template const_data_ptr<T>(), key.template const_data_ptr<T>(),
                                                value.template const_data_ptr<T>(), out.template mutable_data_ptr<T>()});
}

// ---- Checks: one body for both modes -------------------------------------------------------------------------------
contract::Problem arguments_problem(const Tensor& query, const Tensor& key, const Tensor& value, int64_t start,
                                    const std::optional<double>& scale, int64_t window, const Tensor& out) {
  if (auto p = contract::dtype_problem<Dtypes>(query, kOp, "query")) {
    return p;
  }
  for (const auto& [tensor, name] : {std::pair<const Tensor&, const char*>{key, "key_cache"}, {value, "value_cache"},
                                     {out, "out"}}) {
    if (auto p = contract::same_dtype_problem(tensor, query, kOp, name, "query")) {
      return p;
    }
  }
  const std::string op = kOp;
  if (query.dim() != 4 || key.dim() != 4) {
    return op + ": query " + contract::shape_text(query) + " must be [batch, length, heads, head_dim] and key_cache " +
        contract::shape_text(key) + " [batch, positions, kv_heads, head_dim], 4 dimensions each";
  }
  if (value.dim() != 4 || value.size(0) != key.size(0) || value.size(1) != key.size(1) ||
      value.size(2) != key.size(2) || value.size(3) != key.size(3)) {
    return op + ": value_cache " + contract::shape_text(value) + " must have key_cache's shape " +
        contract::shape_text(key);
  }
  if (key.size(0) != query.size(0)) {
    return op + ": key_cache " + contract::shape_text(key) + " holds batch " + std::to_string(key.size(0)) +
        " but query " + contract::shape_text(query) + " has batch " + std::to_string(query.size(0));
  }
  if (key.size(3) != query.size(3) || query.size(3) == 0) {
    return op + ": query " + contract::shape_text(query) + " has head_dim " + std::to_string(query.size(3)) +
        " but key_cache " + contract::shape_text(key) + " has " + std::to_string(key.size(3)) +
        "; they must be equal and at least 1";
  }
  if (key.size(2) == 0 || query.size(2) % key.size(2) != 0) {
    return op + ": query's " + std::to_string(query.size(2)) + " heads are not a multiple of the cache's " +
        std::to_string(key.size(2)) + " kv heads; each kv head serves heads / kv_heads query heads";
  }
  if (start < 0 || start + query.size(1) > key.size(1)) {
    return op + ": " + std::to_string(query.size(1)) + " queries at start_pos " + std::to_string(start) +
        " need cache positions up to " + std::to_string(start + query.size(1)) + " but the cache holds " +
        std::to_string(key.size(1)) + (start < 0 ? " (start_pos is negative)" : "") +
        "; start_pos + length must be within [0, positions]";
  }
  if (scale.has_value() && !std::isfinite(*scale)) {
    return op + ": scale " + std::to_string(*scale) + " is not finite; pass a finite scale or None for 1/sqrt(head_dim)";
  }
  if (window < 0) {
    return op + ": window " + std::to_string(window) + " is negative; pass the sliding window's length in positions, "
        "or 0 to attend to every earlier position";
  }
  return std::nullopt;
}

contract::Problem layout_problem(const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& out) {
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{query, "query"}, {key, "key_cache"},
                                {value, "value_cache"}, {out, "out"}}) {
    if (auto p = contract::dense_problem(t, kOp, name)) {
      return p;
    }
  }
  return contract::memory_problem(kOp, {{out, "out"}}, {{query, "query"}, {key, "key_cache"}, {value, "value_cache"}});
}

Geometry geometry(const Tensor& query, const Tensor& key, int64_t start, const std::optional<double>& scale,
                  int64_t window) {
  const int64_t head_dim = query.size(3);
  return Geometry{query.size(0), query.size(1), query.size(2), key.size(2), head_dim, key.size(1), start,
                  static_cast<float>(scale.value_or(1.0 / std::sqrt(static_cast<double>(head_dim)))),
                  contract::thread_count(), window};
}

} // namespace

#ifdef USE_ATEN_LIB
at::Tensor& sdpa_with_cache_out_impl(const at::Tensor& query, const at::Tensor& key_cache,
                                     const at::Tensor& value_cache, int64_t start_pos, std::optional<double> scale,
                                     int64_t window, at::Tensor& out) {
  contract::require(arguments_problem(query, key_cache, value_cache, start_pos, scale, window, out));
  contract::resize_output(out, query.sym_sizes(), kOp);
  contract::check_memory(kOp, {{out, "out"}}, {{query, "query"}, {key_cache, "key_cache"},
                                              {value_cache, "value_cache"}});
  const at::Tensor q = query.contiguous(), k = key_cache.contiguous(), v = value_cache.contiguous();
  return contract::into_dense_out(out, [&](at::Tensor& y) {
    contract::require(layout_problem(q, k, v, y));
    const Geometry g = geometry(q, k, start_pos, scale, window);
    Dtypes::visit(q.scalar_type(), [&](auto tag) { run<decltype(tag)>(g, q, k, v, y); });
  });
}
#else
executorch::aten::Tensor& sdpa_with_cache_out_impl(
    executorch::runtime::KernelRuntimeContext& ctx,
    const executorch::aten::Tensor& query,
    const executorch::aten::Tensor& key_cache,
    const executorch::aten::Tensor& value_cache,
    int64_t start_pos,
    std::optional<double> scale,
    int64_t window,
    executorch::aten::Tensor& out) {
  if (!contract::require(ctx, arguments_problem(query, key_cache, value_cache, start_pos, scale, window, out)) ||
      !contract::resize_output(ctx, out, query.sizes(), kOp, "out") ||
      !contract::require(ctx, layout_problem(query, key_cache, value_cache, out))) {
    return out;
  }
  const Geometry g = geometry(query, key_cache, start_pos, scale, window);
  bool all_tasks_ran = true;
  Dtypes::visit(query.scalar_type(),
                [&](auto tag) { all_tasks_ran = run<decltype(tag)>(g, query, key_cache, value_cache, out); });
  ET_KERNEL_CHECK_MSG(ctx, all_tasks_ran, Internal, out, "%s: the threadpool did not run all of the tasks", kOp);
  return out;
}
#endif

} // namespace native
} // namespace custom
