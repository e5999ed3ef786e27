// The kernel of my_ops::rope_sdpa_with_cache.out (rope_sdpa_with_cache.py registers the op with PyTorch): a decoder
// layer's attention from its fused q/k/v projection in one call. Each new position's q and k heads are rotated with
// rope's row code (qkv_rows.h), k and v written into the caches at start_pos, q into `out`; then
// sdpa_with_cache's engine (ops/sdpa_with_cache/attention.h) attends, reading each query row from `out` before writing
// it. The same bits as my_ops::rope, update_cache and sdpa_with_cache called in turn, in one op instead of six (the
// split and the two of each). ExecuTorch mode: registers itself (EXECUTORCH_LIBRARY_CHECKED, at the end) since its
// schema mutates two caches; ATen mode: the CPU kernel rope_sdpa_with_cache_without_python.cpp registers.
#include <array>
#include <cmath>
#include <cstring>

#include "declared_dtypes/my_ops/rope_sdpa_with_cache.h"
#include "kernel_helpers/kernel_contract.h"
#include "ops/rope_sdpa_with_cache/qkv_rows.h"
#include "ops/sdpa_with_cache/attention.h"
#ifndef USE_ATEN_LIB
#include "kernel_helpers/checked_unboxing.h"
#endif

namespace custom {
namespace native {
namespace {

constexpr const char* kOp = "my_ops::rope_sdpa_with_cache.out";
using Dtypes = declared_dtypes::my_ops::rope_sdpa_with_cache;

// The heads of qkv's last dimension: q heads, then the kv heads of k, then those of v, head_dim each.
struct Layout {
  int64_t batch, length, heads, kv_heads, head_dim, positions;

  Layout(const Tensor& qkv, const Tensor& key_cache)
      : batch(qkv.size(0)), length(qkv.size(1)), heads(0), kv_heads(key_cache.size(2)), head_dim(key_cache.size(3)),
        positions(key_cache.size(1)) {
    heads = head_dim > 0 ? qkv.size(2) / head_dim - 2 * kv_heads : 0;
  }
  int64_t width() const { return (heads + 2 * kv_heads) * head_dim; }
};

// One body of checks for both modes, before `out` is resized; rope_sdpa_with_cache.py's _check, in its order and words.
contract::Problem arguments_problem(const Tensor& qkv, const Tensor& cos, const Tensor& sin, const Tensor& key_cache,
                                    const Tensor& value_cache, int64_t start, const std::optional<double>& scale,
                                    int64_t window, const Tensor& out) {
  if (auto p = contract::dtype_problem<Dtypes>(qkv, kOp, "qkv")) {
    return p;
  }
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{cos, "cos"}, {sin, "sin"},
                                {key_cache, "key_cache"}, {value_cache, "value_cache"}, {out, "out"}}) {
    if (auto p = contract::same_dtype_problem(t, qkv, kOp, name, "qkv")) {
      return p;
    }
  }
  const std::string op = kOp;
  if (qkv.dim() != 3 || key_cache.dim() != 4) {
    return op + ": qkv " + contract::shape_text(qkv) + " must be [batch, length, (heads + 2 * kv_heads) * head_dim] "
        "and key_cache " + contract::shape_text(key_cache) + " [batch, positions, kv_heads, head_dim]";
  }
  if (!contract::same_sizes(value_cache, key_cache)) {
    return op + ": value_cache " + contract::shape_text(value_cache) + " must have key_cache's shape " +
        contract::shape_text(key_cache);
  }
  if (key_cache.size(0) != qkv.size(0)) {
    return op + ": key_cache " + contract::shape_text(key_cache) + " holds batch " +
        std::to_string(key_cache.size(0)) + " but qkv " + contract::shape_text(qkv) + " has batch " +
        std::to_string(qkv.size(0));
  }
  const Layout l(qkv, key_cache);
  if (l.head_dim == 0 || l.head_dim % 2 != 0 || l.kv_heads == 0) {
    return op + ": key_cache " + contract::shape_text(key_cache) + " must have kv heads and an even head_dim (the "
        "rotary embedding rotates its halves)";
  }
  if (qkv.size(2) % l.head_dim != 0 || l.heads < l.kv_heads || l.heads % l.kv_heads != 0) {
    return op + ": qkv's last dimension " + std::to_string(qkv.size(2)) + " is not (heads + 2 * " +
        std::to_string(l.kv_heads) + ") * " + std::to_string(l.head_dim) + " for a number of query heads that is a "
        "multiple of the cache's " + std::to_string(l.kv_heads) + " kv heads";
  }
  if (auto p = attention::positions_problem(op, cos, sin, l.batch, l.length, l.head_dim, l.positions, start, scale)) {
    return p;
  }
  if (window < 0) {
    return op + ": window " + std::to_string(window) + " is negative; pass the sliding window's length in positions, "
        "or 0 to attend to every earlier position";
  }
  return std::nullopt;
}

contract::Problem layout_problem(const Tensor& qkv, const Tensor& cos, const Tensor& sin, const Tensor& key_cache,
                                 const Tensor& value_cache, const Tensor& out) {
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{qkv, "qkv"}, {cos, "cos"}, {sin, "sin"},
                                {key_cache, "key_cache"}, {value_cache, "value_cache"}, {out, "out"}}) {
    if (auto p = contract::dense_problem(t, kOp, name)) {
      return p;
    }
  }
  return contract::memory_problem(kOp, {{out, "out"}, {key_cache, "key_cache"}, {value_cache, "value_cache"}},
                                  {{qkv, "qkv"}, {cos, "cos"}, {sin, "sin"}});
}

template <typename T>
bool run(const Tensor& qkv_t, const Tensor& cos_t, const Tensor& sin_t, Tensor& key_cache, Tensor& value_cache,
         int64_t start, const std::optional<double>& scale, int64_t window, Tensor& out) {
  const Layout l(qkv_t, key_cache);
  const int64_t D = l.head_dim, width = l.width(), table_batches = cos_t.size(0);
  T* keys = key_cache.template mutable_data_ptr<T>();
  T* values = value_cache.template mutable_data_ptr<T>();
  T* queries = out.template mutable_data_ptr<T>();
  const attention::QkvRows<T> rows{qkv_t.template const_data_ptr<T>(), cos_t.template const_data_ptr<T>(),
                                   sin_t.template const_data_ptr<T>(), keys, values, queries, l.batch, l.length,
                                   l.heads, l.kv_heads, D, l.positions, start, table_batches};
  // A few hundred elements a decode step: on the calling thread, before the pool attends.
  for (int64_t row = 0; row < rows.rows(); ++row) {
    rows.rotate_and_write(row);
  }
  elementwise::count(elementwise::kBaselineElements, static_cast<uint64_t>(l.batch * l.length * width));
  const attention::Geometry g{l.batch, l.length, l.heads, l.kv_heads, D, l.positions, start,
                              static_cast<float>(scale.value_or(1.0 / std::sqrt(static_cast<double>(D)))),
                              contract::thread_count(), window};
  return attention::attend_all<T>(g, attention::Tensors<T>{queries, keys, values, queries});
}

template <typename Out>
std::array<Out, 4> out_sizes(const Tensor& qkv, const Tensor& key_cache) {
  const Layout l(qkv, key_cache);
  return {static_cast<Out>(l.batch), static_cast<Out>(l.length), static_cast<Out>(l.heads),
          static_cast<Out>(l.head_dim)};
}

} // namespace

#ifdef USE_ATEN_LIB
at::Tensor& rope_sdpa_with_cache_out_impl(const at::Tensor& qkv_in, const at::Tensor& cos_in, const at::Tensor& sin_in,
                                          at::Tensor& key_cache, at::Tensor& value_cache, int64_t start_pos,
                                          std::optional<double> scale, int64_t window, at::Tensor& out) {
  // Strided inputs are read as the dense tensors an export would hold; the caches are written in place, so dense.
  const at::Tensor qkv = qkv_in.contiguous(), cos = cos_in.contiguous(), sin = sin_in.contiguous();
  contract::require(arguments_problem(qkv, cos, sin, key_cache, value_cache, start_pos, scale, window, out));
  const auto sizes = out_sizes<int64_t>(qkv, key_cache);
  const std::array<c10::SymInt, 4> symbolic{sizes[0], sizes[1], sizes[2], sizes[3]};
  contract::resize_output(out, symbolic, kOp);
  contract::require(layout_problem(qkv, cos, sin, key_cache, value_cache, out));
  Dtypes::visit(qkv.scalar_type(), [&](auto tag) {
    run<decltype(tag)>(qkv, cos, sin, key_cache, value_cache, start_pos, scale, window, out);
  });
  return out;
}
#else
executorch::aten::Tensor& rope_sdpa_with_cache_out_impl(
    executorch::runtime::KernelRuntimeContext& ctx,
    const executorch::aten::Tensor& qkv,
    const executorch::aten::Tensor& cos,
    const executorch::aten::Tensor& sin,
    executorch::aten::Tensor& key_cache,
    executorch::aten::Tensor& value_cache,
    int64_t start_pos,
    std::optional<double> scale,
    int64_t window,
    executorch::aten::Tensor& out) {
  if (!contract::require(ctx,
                         arguments_problem(qkv, cos, sin, key_cache, value_cache, start_pos, scale, window, out))) {
    return out;
  }
  const auto sizes = out_sizes<executorch::aten::SizesType>(qkv, key_cache);
  if (!contract::resize_output(ctx, out, {sizes.data(), sizes.size()}, kOp, "out") ||
      !contract::require(ctx, layout_problem(qkv, cos, sin, key_cache, value_cache, out))) {
    return out;
  }
  bool all_tasks_ran = true;
  Dtypes::visit(qkv.scalar_type(), [&](auto tag) {
    all_tasks_ran = run<decltype(tag)>(qkv, cos, sin, key_cache, value_cache, start_pos, scale, window, out);
  });
  ET_KERNEL_CHECK_MSG(ctx, all_tasks_ran, Internal, out, "%s: the threadpool did not run all of the tasks", kOp);
  return out;
}
#endif

} // namespace native
} // namespace custom

#ifndef USE_ATEN_LIB
EXECUTORCH_LIBRARY_CHECKED(my_ops, "rope_sdpa_with_cache.out", custom::native::rope_sdpa_with_cache_out_impl);
#endif
