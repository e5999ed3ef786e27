// The kernel of my_ops::update_cache.out (update_cache.py registers the op with PyTorch): copies `value` [B, S, ...]
// into `cache` [B, L, ...] at rows start_pos..start_pos+S of dimension 1, in place (the cache is the program's mutable
// buffer, so the write persists into the next execution), and writes the next position to `out`. Every bound is
// checked before a byte moves: a position from a program input is untrusted. In ExecuTorch mode (the runtime kernel)
// it registers itself without codegen, like upstream's llama::update_cache: EXECUTORCH_LIBRARY_CHECKED at the end
// (custom_ops.bzl says so). In ATen mode (-DUSE_ATEN_LIB) it is the CPU kernel update_cache_without_python.cpp
// registers for processes without Python (AOTInductor's C++ runner).
#include <cstring>

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

// The checked write: contiguous value and cache, start_pos + rows within the cache.
int64_t write_rows(const Tensor& value, Tensor& cache, int64_t start_pos) {
  const int64_t rows = value.size(1);
  const int64_t capacity = cache.size(1);
  const int64_t batches = value.size(0);
  const size_t row_bytes = batches == 0 || rows == 0 ? 0 : value.nbytes() / static_cast<size_t>(batches * rows);
  const auto* src = static_cast<const char*>(value.const_data_ptr());
  auto* dst = static_cast<char*>(cache.mutable_data_ptr());
  for (int64_t b = 0; b < batches; ++b) {
    std::memcpy(dst + (b * capacity + start_pos) * row_bytes, src + b * rows * row_bytes, rows * row_bytes);
  }
  return start_pos + rows;
}

} // namespace

#ifdef USE_ATEN_LIB
at::Tensor& update_cache_out_impl(const at::Tensor& value, at::Tensor& cache, int64_t start_pos, at::Tensor& out) {
  contract::check_dtype<contract::RealDtypes>(value, kOp, "value");
  contract::check_same_dtype(cache, value, kOp, "cache", "value");
  contract::check_dtype<contract::DtypeSet<ScalarType::Long>>(out, kOp, "out");
  TORCH_CHECK(same_except_sequence(value, cache), kOp, ": value ", value.sizes(), " and cache ", cache.sizes(),
              " must match in every dimension but 1 (the sequence), at least 2");
  const int64_t rows = value.size(1);
  const int64_t capacity = cache.size(1);
  TORCH_CHECK(start_pos >= 0 && start_pos <= capacity - rows, kOp, ": writing ", rows, " row(s) at start_pos ",
              start_pos, " passes the end of the cache (", capacity, " rows)");
  TORCH_CHECK(cache.is_contiguous(), kOp, ": cache must be contiguous (it is written in place)");
  const c10::SymInt one = 1;
  contract::resize_output(out, {&one, 1}, kOp);
  const at::Tensor rows_in = value.contiguous();  // a transposed view (a projection split into heads) is copied once
  contract::check_memory(kOp, {{cache, "cache"}, {out, "out"}}, {{rows_in, "value"}});
  out.mutable_data_ptr<int64_t>()[0] = write_rows(rows_in, cache, start_pos);
  return out;
}
#else
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
  out.mutable_data_ptr<int64_t>()[0] = write_rows(value, cache, start_pos);
  return out;
}
#endif

} // namespace native
} // namespace custom

#ifndef USE_ATEN_LIB
EXECUTORCH_LIBRARY_CHECKED(my_ops, "update_cache.out", custom::native::update_cache_out_impl);
#endif
