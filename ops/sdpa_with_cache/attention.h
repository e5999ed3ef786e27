// The attention engine of my_ops::sdpa_with_cache (sdpa_with_cache_out.cpp), shared with the ops that attend after
// doing more in the same call (my_ops::rope_sdpa_with_cache writes the cache itself): a caller describes the call with
// a Geometry and raw pointers and runs every task on the pool. Defined in sdpa_with_cache_out.cpp for float and
// BFloat16, so every caller gets the same instructions and the same bits.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernel_helpers/kernel_contract.h"  // c10::BFloat16 in both modes

namespace custom {
namespace native {
namespace attention {

constexpr int64_t kRowsPerTask = 32;  // query rows (query position x head) a task carries through the cache

struct Geometry {
  int64_t batch, length, heads, kv_heads, head_dim, positions, start;
  float scale;
  int64_t threads;
  int64_t window = 0;  // > 0: query position q sees cached positions q - window + 1 .. q (a sliding window)

  // The first cached position query position q may attend to.
  int64_t first_visible(int64_t q) const { return window > 0 ? std::max<int64_t>(0, q - window + 1) : 0; }

  int64_t group() const { return heads / kv_heads; }
  // A task: `kv_heads_per_task()` adjacent kv heads, each with its `group()` query heads, at up to this many
  // consecutive query positions.
  int64_t queries_per_task() const {
    return std::max<int64_t>(1, std::min<int64_t>(kRowsPerTask / group(), length));
  }
  int64_t query_blocks() const { return length == 0 ? 0 : (length + queries_per_task() - 1) / queries_per_task(); }
  // Adjacent kv heads share a task while it still carries at most kRowsPerTask rows and the tasks still cover the
  // threads: at decode a cached position's K (or V) row then holds a task's heads side by side, and the task reads it
  // as one run of memory instead of one head's row every positions * kv_heads * head_dim elements.
  int64_t kv_heads_per_task() const {
    const int64_t rows_per_head = group() * queries_per_task();
    const int64_t spare = batch * kv_heads * query_blocks() / std::max<int64_t>(1, threads);
    return std::clamp<int64_t>(std::min(spare, kRowsPerTask / rows_per_head), 1, kv_heads);
  }
  int64_t kv_blocks() const { return (kv_heads + kv_heads_per_task() - 1) / kv_heads_per_task(); }
  int64_t tasks() const { return batch * kv_blocks() * query_blocks(); }
};

// query may be out itself: a task reads its query rows before it writes the same rows of out, and no other task
// touches them.
template <typename T>
struct Tensors {
  const T* query;  // [B, T, H, D]
  const T* key;    // [B, S, H_kv, D]
  const T* value;
  T* out;          // [B, T, H, D]
};

// Attends every query row of `g` over the cache, on the pool when the call is large enough; false when the pool did
// not run every task.
template <typename T>
bool attend_all(const Geometry& g, const Tensors<T>& t);

// Tasks [first, end) of g.tasks() on the calling thread: what attend_all hands the pool, for a caller that runs the
// tasks on threads it already holds (my_ops::decoder_layer).
template <typename T>
void attend_tasks(const Geometry& g, const Tensors<T>& t, int64_t first, int64_t end);

extern template bool attend_all<float>(const Geometry&, const Tensors<float>&);
extern template bool attend_all<c10::BFloat16>(const Geometry&, const Tensors<c10::BFloat16>&);
extern template void attend_tasks<float>(const Geometry&, const Tensors<float>&, int64_t, int64_t);
extern template void attend_tasks<c10::BFloat16>(const Geometry&, const Tensors<c10::BFloat16>&, int64_t, int64_t);

} // namespace attention
} // namespace native
} // namespace custom
