// A fused q/k/v projection's rows on their way into attention, shared by my_ops::rope_sdpa_with_cache and
// my_ops::decoder_layer (the same bits in both): each new position's q and k heads rotated with rope's row code
// (ops/rope/rope_rows.h), k and v written into the caches at the position, q into `queries` [B, T, H, D].
#pragma once

#include <cstdint>
#include <cstring>

#include "ops/rope/rope_rows.h"

namespace custom {
namespace native {
namespace attention {

template <typename T>
struct QkvRows {
  const T* qkv;  // [B, T, (H + 2 H_kv) D]: q heads, then k's, then v's
  const T* cos;  // [table_batches (1 or B), T, D]
  const T* sin;
  T* keys;       // [B, S, H_kv, D]
  T* values;
  T* queries;    // [B, T, H, D]
  int64_t batch, length, heads, kv_heads, head_dim, positions, start, table_batches;

  int64_t width() const { return (heads + 2 * kv_heads) * head_dim; }
  int64_t rows() const { return batch * length; }

  // Row b * length + t: new position start + t of batch entry b.
  void rotate_and_write(int64_t row) const {
    const int64_t b = row / length, t = row % length, D = head_dim;
    const T* in = qkv + row * width();
    const int64_t table_row = ((table_batches == 1 ? 0 : b) * length + t) * D;
    const int64_t cached = (b * positions + start + t) * kv_heads * D;
    for (int64_t h = 0; h < heads; ++h) {
      rope::rotate_row<T>(in + h * D, cos + table_row, sin + table_row, queries + (row * heads + h) * D, D);
    }
    for (int64_t h = 0; h < kv_heads; ++h) {
      rope::rotate_row<T>(in + (heads + h) * D, cos + table_row, sin + table_row, keys + cached + h * D, D);
    }
    std::memcpy(values + cached, in + (heads + kv_heads) * D, sizeof(T) * kv_heads * D);
  }
};

} // namespace attention
} // namespace native
} // namespace custom
