// The ExecuTorch runtime kernel of my_ops::update_cache.out (update_cache.py registers the op with PyTorch): copies
// `value` [B, S, ...] into `cache` [B, L, ...] at rows start_pos..start_pos+S of dimension 1, in place (the cache is the
// program's mutable buffer, so the write persists into the next execution), and writes the next position to `out`.
// Every bound is checked before a byte moves: a position from a program input is untrusted. Registered without
// codegen, like upstream's llama::update_cache: EXECUTORCH_LIBRARY_CHECKED at the end (custom_ops.bzl says so).
#include <cstring>

#include "kernel_helpers/checked_unboxing.h"
#include "kernel_helpers/kernel_contract.h"

namespace custom {
namespace native {
namespace {

constexpr const char* kOp = "my_ops::update_cache.out";

bool same_except_sequence(const Tensor& value, const Tensor& cache) {
  if (value.dim() != cache.dim() || value.dim() < 2) {
    return false;
  }
  for (int64_t d = 0; d < value.dim(); ++d) {
    if (d != 1 && value.size(d) != cache.size(d)) {
      return false;
    }
  }
  return true;
}

} // namespace

executorch::aten::Tensor& update_cache_out_impl(
    executorch::runtime::KernelRuntimeContext& ctx,
    const executorch::aten::Tensor& value,
    executorch::aten::Tensor& cache,
    int64_t start_pos,
    executorch::aten::Tensor& out) {
  if (!contract::check_dtype<contract::RealDtypes>(ctx, value, kOp, "value") ||
      !contract::check_same_dtype(ctx, cache, value, kOp, "cache", "value") ||
      !contract::check_dtype<contract::DtypeSet<ScalarType::Long>>(ctx, out, kOp, "out")) {
    return out;
  }
  ET_KERNEL_CHECK_MSG(ctx, same_except_sequence(value, cache), InvalidArgument, out,
                      "%s: value %s and cache %s must match in every dimension but 1 (the sequence), at least 2", kOp,
                      contract::shape_string(value).data(), contract::shape_string(cache).data());
  const int64_t rows = value.size(1);
  const int64_t capacity = cache.size(1);
  ET_KERNEL_CHECK_MSG(ctx, start_pos >= 0 && start_pos <= capacity - rows, InvalidArgument, out,
                      "%s: writing %lld row(s) at start_pos %lld passes the end of the cache (%lld rows)", kOp,
                      static_cast<long long>(rows), static_cast<long long>(start_pos),
                      static_cast<long long>(capacity));
  const executorch::aten::SizesType one = 1;
  if (!contract::resize_output(ctx, out, {&one, 1}, kOp, "out") ||
      !contract::check_contiguous(ctx, value, kOp, "value") || !contract::check_contiguous(ctx, cache, kOp, "cache") ||
      !contract::check_memory(ctx, kOp, {{cache, "cache"}, {out, "out"}}, {{value, "value"}})) {
    return out;
  }
  const int64_t batches = value.size(0);
  const size_t row_bytes = batches == 0 || rows == 0 ? 0 : value.nbytes() / static_cast<size_t>(batches * rows);
  const auto* src = static_cast<const char*>(value.const_data_ptr());
  auto* dst = static_cast<char*>(cache.mutable_data_ptr());
  for (int64_t b = 0; b < batches; ++b) {
    std::memcpy(dst + (b * capacity + start_pos) * row_bytes, src + b * rows * row_bytes, rows * row_bytes);
  }
  out.mutable_data_ptr<int64_t>()[0] = start_pos + rows;
  return out;
}

} // namespace native
} // namespace custom

EXECUTORCH_LIBRARY_CHECKED(my_ops, "update_cache.out", custom::native::update_cache_out_impl);
