// The kernel of my_ops::rms_norm.out, compiled twice like mul4's: ExecuTorch mode into libcustom_ops_lib.so (the
// runtime kernel) and ATen mode into libcustom_ops_aot_lib.so (rms_norm.cpp's CPU kernel). Each row of the input:
// y = x / sqrt(mean(x^2) + eps) * weight, in one read for the sum of squares and one read-and-write pass, where the
// same math in ATen ops is five passes with four intermediates. Half types are accumulated and computed in float.
// On a CPU with AVX-512 the rows run in a variant compiled for it (the same sums in the same order: the same bits);
// bfloat16 rows there convert in registers and prefetch the next row while normalizing this one.
#include "declared_dtypes/my_ops/rms_norm.h"
#include "kernel_helpers/kernel_contract.h"
#include "kernel_helpers/row_wise.h"
#include "ops/rms_norm/rms_norm_rows.h"

namespace custom {
namespace native {
namespace {

constexpr const char* kOp = "my_ops::rms_norm.out";
using Dtypes = declared_dtypes::my_ops::rms_norm;

template <typename T>
bool run(const Tensor& in, const Tensor& weight, Tensor& out, double eps) {
  const int64_t cols = in.dim() == 0 ? 1 : in.size(in.dim() - 1);
  const int64_t rows_count = cols == 0 ? 0 : in.numel() / cols;
  const T* x = in.template const_data_ptr<T>();
  const T* w = weight.template const_data_ptr<T>();
  T* y = out.template mutable_data_ptr<T>();
  const norm::Isa isa = norm::row_isa<T>(static_cast<size_t>(in.numel()) * sizeof(T));
  return rows::for_each_row(rows_count, cols * static_cast<int64_t>(sizeof(T)), [&](int64_t first, int64_t end) {
    norm::normalize_rows<T>(x, w, y, first, end, cols, static_cast<float>(eps), isa);
    norm::count_rows(isa, (end - first) * cols);
  });
}

// One body of checks for both modes: the arguments (before `out` is resized), then the memory the loop runs over.
contract::Problem arguments_problem(const Tensor& input, const Tensor& weight, const Tensor& out) {
  if (auto p = contract::dtype_problem<Dtypes>(input, kOp, "input")) {
    return p;
  }
  if (auto p = contract::same_dtype_problem(weight, input, kOp, "weight", "input")) {
    return p;
  }
  if (auto p = contract::same_dtype_problem(out, input, kOp, "out", "input")) {
    return p;
  }
  if (!norm::weight_fits(input, weight)) {
    return std::string(kOp) + ": weight of shape " + contract::shape_text(weight) + " does not scale the last "
        "dimension of input of shape " + contract::shape_text(input) + "; give it shape [" +
        std::to_string(input.dim() ? input.size(input.dim() - 1) : 0) + "]";
  }
  return std::nullopt;
}

contract::Problem layout_problem(const Tensor& input, const Tensor& weight, const Tensor& out) {
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{input, "input"}, {weight, "weight"}, {out, "out"}}) {
    if (auto p = contract::dense_problem(t, kOp, name)) {
      return p;
    }
  }
  return contract::memory_problem(kOp, {{out, "out"}}, {{input, "input", true}, {weight, "weight"}});
}

} // namespace

#ifdef USE_ATEN_LIB
at::Tensor& rms_norm_out_impl(const at::Tensor& input, const at::Tensor& weight, double eps, at::Tensor& out) {
  contract::require(arguments_problem(input, weight, out));
  contract::resize_output(out, input.sym_sizes(), kOp);
  contract::check_memory(kOp, {{out, "out"}}, {{input, "input", true}, {weight, "weight"}});
  const at::Tensor x = input.contiguous();
  const at::Tensor w = weight.contiguous();
  return contract::into_dense_out(out, [&](at::Tensor& y) {
    contract::require(layout_problem(x, w, y));
    Dtypes::visit(x.scalar_type(), [&](auto tag) { run<decltype(tag)>(x, w, y, eps); });
  });
}
#else
executorch::aten::Tensor& rms_norm_out_impl(
    executorch::runtime::KernelRuntimeContext& ctx,
    const executorch::aten::Tensor& input,
    const executorch::aten::Tensor& weight,
    double eps,
    executorch::aten::Tensor& out) {
  if (!contract::require(ctx, arguments_problem(input, weight, out)) ||
      !contract::resize_output(ctx, out, input.sizes(), kOp, "out") ||
      !contract::require(ctx, layout_problem(input, weight, out))) {
    return out;
  }
  bool all_rows_ran = true;
  Dtypes::visit(input.scalar_type(), [&](auto tag) { all_rows_ran = run<decltype(tag)>(input, weight, out, eps); });
  ET_KERNEL_CHECK_MSG(ctx, all_rows_ran, Internal, out, "%s: the threadpool did not run all of the rows", kOp);
  return out;
}
#endif

} // namespace native
} // namespace custom
