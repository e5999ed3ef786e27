// The kernel of my_ops::update_cache.out (update_cache.py registers the op with PyTorch): copies `value` [B, S, ...]
// into `cache` [B, L, ...] at rows start_pos..start_pos+S of dimension 1, in place (the cache is the program's mutable
// buffer, so the write persists into the next execution), and writes the next position to `out`. Every bound is
// checked before a byte moves: a position from a program input is untrusted. In ExecuTorch mode (the runtime kernel)
// it registers itself without codegen, like upstream's llama::update_cache: EXECUTORCH_LIBRARY_CHECKED at the end
// (custom_ops.bzl says so). In ATen mode (-DUSE_ATEN_LIB) it is the CPU kernel update_cache_without_python.cpp
// registers for processes without Python (AOTInductor's C++ runner).
#include <cstring>

#include "declared_dtypes/my_ops/update_cache.h"
#include "kernel_helpers/kernel_contract.h"
#ifndef USE_ATEN_LIB
#include "kernel_helpers/checked_unboxing.h"
#endif

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

// One body of checks for both modes. `value` may have any strides (a projection split into heads is a transposed
// view in PyTorch, another dim order in ExecuTorch): write_rows reads it by its strides. The cache is written in place
// as one block, so it must be dense.
contract::Problem arguments_problem(const Tensor& value, const Tensor& cache, int64_t start_pos, const Tensor& out) {
  if (auto p = contract::dtype_problem<declared_dtypes::my_ops::update_cache>(value, kOp, "value")) {
    return p;
  }
  if (auto p = contract::same_dtype_problem(cache, value, kOp, "cache", "value")) {
    return p;
  }
  if (auto p = contract::dtype_problem<contract::DtypeSet<ScalarType::Long>>(out, kOp, "out")) {
    return p;
  }
  if (!same_except_sequence(value, cache)) {
    return std::string(kOp) + ": value " + contract::shape_text(value) + " and cache " + contract::shape_text(cache) +
        " must match in every dimension but 1 (the sequence), at least 2";
  }
  const int64_t rows = value.size(1), capacity = cache.size(1);
  if (start_pos < 0) {
    return std::string(kOp) + ": start_pos " + std::to_string(start_pos) + " is negative";
  }
  if (start_pos > capacity - rows) {
    return std::string(kOp) + ": writing " + std::to_string(rows) + " row(s) at start_pos " +
        std::to_string(start_pos) + " passes the end of the cache (" + std::to_string(capacity) + " rows)";
  }
  return contract::dense_problem(cache, kOp, "cache");
}

// Copies value [B, S, ...] (any strides) into the dense cache at rows start_pos.. of dimension 1; returns the next
// position. A row whose trailing dimensions are dense is one memcpy.
int64_t write_rows(const Tensor& value, Tensor& cache, int64_t start_pos) {
  const int64_t dims = value.dim(), batches = value.size(0), rows = value.size(1), capacity = cache.size(1);
  const size_t element = value.element_size();
  int64_t inner = 1;
  bool dense_rows = true;
  for (int64_t d = dims - 1; d >= 2; --d) {
    dense_rows = dense_rows && (value.size(d) == 1 || static_cast<int64_t>(value.strides()[d]) == inner);
    inner *= value.size(d);
  }
  const auto* src = static_cast<const char*>(value.const_data_ptr());
  auto* dst = static_cast<char*>(cache.mutable_data_ptr());
  const int64_t batch_stride = value.strides()[0], row_stride = value.strides()[1];
  for (int64_t b = 0; b < batches; ++b) {
    for (int64_t r = 0; r < rows; ++r) {
      char* to = dst + ((b * capacity + start_pos + r) * inner) * element;
      const char* from = src + (b * batch_stride + r * row_stride) * static_cast<int64_t>(element);
      if (dense_rows) {
        std::memcpy(to, from, inner * element);
        continue;
      }
      for (int64_t i = 0; i < inner; ++i) {  // unravel i over dimensions 2.. and read by their strides
        int64_t offset = 0;
        for (int64_t d = dims - 1, rest = i; d >= 2; --d) {
          offset += (rest % value.size(d)) * static_cast<int64_t>(value.strides()[d]);
          rest /= value.size(d);
        }
        std::memcpy(to + i * element, from + offset * static_cast<int64_t>(element), element);
      }
    }
  }
  return start_pos + rows;
}

} // namespace

#ifdef USE_ATEN_LIB
at::Tensor& update_cache_out_impl(const at::Tensor& value, at::Tensor& cache, int64_t start_pos, at::Tensor& out) {
  contract::require(arguments_problem(value, cache, start_pos, out));
  const c10::SymInt one = 1;
  contract::resize_output(out, {&one, 1}, kOp);
  contract::check_memory(kOp, {{cache, "cache"}, {out, "out"}}, {{value, "value"}});
  out.mutable_data_ptr<int64_t>()[0] = write_rows(value, cache, start_pos);
  return out;
}
#else
executorch::aten::Tensor& update_cache_out_impl(
    executorch::runtime::KernelRuntimeContext& ctx,
    const executorch::aten::Tensor& value,
    executorch::aten::Tensor& cache,
    int64_t start_pos,
    executorch::aten::Tensor& out) {
  const executorch::aten::SizesType one = 1;
  if (!contract::require(ctx, arguments_problem(value, cache, start_pos, out)) ||
      !contract::resize_output(ctx, out, {&one, 1}, kOp, "out") ||
      !contract::check_memory(ctx, kOp, {{cache, "cache"}, {out, "out"}}, {{value, "value"}})) {
    return out;
  }
  out.mutable_data_ptr<int64_t>()[0] = write_rows(value, cache, start_pos);
  return out;
}
#endif

} // namespace native
} // namespace custom

#ifndef USE_ATEN_LIB
EXECUTORCH_LIBRARY_CHECKED(my_ops, "update_cache.out", custom::native::update_cache_out_impl);
#endif
