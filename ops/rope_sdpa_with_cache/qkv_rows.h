// A fused q/k/v projection's rows on their way into attention, shared by my_ops::rope_sdpa_with_cache and
// my_ops::decoder_layer (the same bits in both): each new position's q and k heads rotated with rope's row code
// (ops/rope/rope_rows.h), k and v written into the caches at the position, q into `queries` [B, T, H, D].
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include "kernel_helpers/kernel_contract.h"
#include "ops/rope/rope_rows.h"

namespace custom {
namespace native {
namespace attention {

// The new positions' rotation tables and place, as both ops check them after their own shapes: cos and sin [1 or
// batch, length, head_dim] of one shape, positions [start, start + length) within the cache's, a finite scale or none.
inline contract::Problem positions_problem(const std::string& op, const Tensor& cos, const Tensor& sin, int64_t batch,
                                           int64_t length, int64_t head_dim, int64_t positions, int64_t start,
                                           const std::optional<double>& scale) {
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{cos, "cos"}, {sin, "sin"}}) {
    if (t.dim() != 3 || (t.size(0) != 1 && t.size(0) != batch) || t.size(1) != length || t.size(2) != head_dim) {
      return op + ": " + name + " " + contract::shape_text(t) + " must be [1 or " + std::to_string(batch) + ", " +
          std::to_string(length) + ", " + std::to_string(head_dim) + "]: a row per new position, shared by the heads";
    }
  }
  if (!contract::same_sizes(cos, sin)) {
    return op + ": cos " + contract::shape_text(cos) + " and sin " + contract::shape_text(sin) + " differ; give both "
        "the same shape";
  }
  if (start < 0 || start > positions - length) {
    return op + ": " + std::to_string(length) + " positions at start_pos " + std::to_string(start) +
        " need cache positions up to " + std::to_string(start + length) + " but the cache holds " +
        std::to_string(positions) + (start < 0 ? " (start_pos is negative)" : "") +
        "; start_pos + length must be within [0, positions]";
  }
  if (scale.has_value() && !std::isfinite(*scale)) {
    return op + ": scale " + std::to_string(*scale) + " is not finite; pass a finite scale or None for " +
        "1/sqrt(head_dim)";
  }
  return std::nullopt;
}

template <typename T>
struct QkvRows {
  const T* qkv;  // [B, T, (H + 2 H_kv) D]: q heads, then k's, then v's; [B, T, (H + H_kv) D] when v has rows of its own
  const T* cos;  // [table_batches (1 or B), T, D]
  const T* sin;
  T* keys;       // [B, S, H_kv, D]
  T* values;
  T* queries;    // [B, T, H, D]
  int64_t batch, length, heads, kv_heads, head_dim, positions, start, table_batches;
  const T* v = nullptr;  // [B, T, H_kv D]: v from a projection of its own (another format than q and k's), or none

  int64_t width() const { return (heads + (v == nullptr ? 2 : 1) * kv_heads) * head_dim; }
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
    const T* v_row = v == nullptr ? in + (heads + kv_heads) * D : v + row * kv_heads * D;
    std::memcpy(values + cached, v_row, sizeof(T) * kv_heads * D);
  }
};

} // namespace attention
} // namespace native
} // namespace custom
