// The kernel of my_ops::add_rms_norm.out (add_rms_norm.py registers the op with PyTorch): per row, sum = x + residual
// (in float for the 16-bit types, rounded once, as ATen's add), then that row of sum normalized by rms_norm's own row
// code while it is still in cache (ops/rms_norm/rms_norm_rows.h: the same bits as my_ops::rms_norm of the sum).
// ExecuTorch mode: the runtime kernel; ATen mode: the CPU kernel add_rms_norm_without_python.cpp registers.
#include "declared_dtypes/my_ops/add_rms_norm.h"
#include "kernel_helpers/kernel_contract.h"
#include "kernel_helpers/row_wise.h"
#include "ops/rms_norm/rms_norm_rows.h"

namespace custom {
namespace native {
namespace {

constexpr const char* kOp = "my_ops::add_rms_norm.out";
using Dtypes = declared_dtypes::my_ops::add_rms_norm;

template <typename T>
void add_row(const T* x, const T* residual, T* sum, int64_t cols) {
  if constexpr (std::is_same_v<T, float>) {
    for (int64_t i = 0; i < cols; ++i) {
      sum[i] = x[i] + residual[i];
    }
  } else {
    alignas(64) float a[rows::kBlock];
    alignas(64) float b[rows::kBlock];
    for (int64_t c = 0; c < cols; c += rows::kBlock) {
      const int64_t n = std::min(rows::kBlock, cols - c);
      rows::load_floats(x + c, a, n);
      rows::load_floats(residual + c, b, n);
      for (int64_t i = 0; i < n; ++i) {
        a[i] += b[i];
      }
      rows::store_floats(a, sum + c, n);
    }
  }
}

template <typename T>
bool run(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps, Tensor& sum, Tensor& normed) {
  const int64_t cols = x.size(x.dim() - 1);
  const int64_t row_count = cols == 0 ? 0 : x.numel() / cols;
  const T* xp = x.template const_data_ptr<T>();
  const T* rp = residual.template const_data_ptr<T>();
  const T* w = weight.template const_data_ptr<T>();
  T* s = sum.template mutable_data_ptr<T>();
  T* y = normed.template mutable_data_ptr<T>();
  const norm::Isa isa = norm::row_isa<T>(static_cast<size_t>(x.numel()) * sizeof(T));
  return rows::for_each_row(row_count, 2 * cols * static_cast<int64_t>(sizeof(T)), [&](int64_t first, int64_t end) {
    for (int64_t r = first; r < end; ++r) {
      add_row(xp + r * cols, rp + r * cols, s + r * cols, cols);
      norm::normalize_rows(s, w, y, r, r + 1, cols, static_cast<float>(eps), isa);
    }
    norm::count_rows(isa, (end - first) * cols);
  });
}

// The arguments, before the outputs are resized: add_rms_norm.py's _check, in its order and words.
contract::Problem arguments_problem(const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& sum,
                                    const Tensor& normed) {
  if (auto p = contract::dtype_problem<Dtypes>(x, kOp, "x")) {
    return p;
  }
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{residual, "residual"}, {weight, "weight"},
                                {sum, "sum"}, {normed, "normed"}}) {
    if (auto p = contract::same_dtype_problem(t, x, kOp, name, "x")) {
      return p;
    }
  }
  if (!contract::same_sizes(x, residual)) {
    return std::string(kOp) + ": x of shape " + contract::shape_text(x) + " and residual of shape " +
        contract::shape_text(residual) + " differ; give both the same shape";
  }
  if (!norm::weight_fits(x, weight)) {
    return std::string(kOp) + ": weight of shape " + contract::shape_text(weight) + " does not scale the last "
        "dimension of x of shape " + contract::shape_text(x) + "; give it shape [" +
        std::to_string(x.dim() ? x.size(x.dim() - 1) : 0) + "]";
  }
  return std::nullopt;
}

contract::Problem layout_problem(const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& sum,
                                 const Tensor& normed) {
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{x, "x"}, {residual, "residual"},
                                {weight, "weight"}, {sum, "sum"}, {normed, "normed"}}) {
    if (auto p = contract::dense_problem(t, kOp, name)) {
      return p;
    }
  }
  // Row r of sum is written from row r of x and residual alone: sum may be either exactly. normed is read from sum.
  return contract::memory_problem(kOp, {{sum, "sum"}, {normed, "normed"}},
                                  {{x, "x", true}, {residual, "residual", true}, {weight, "weight"}});
}

} // namespace

#ifdef USE_ATEN_LIB
std::tuple<at::Tensor&, at::Tensor&> add_rms_norm_out_impl(const at::Tensor& x_in, const at::Tensor& residual_in,
                                                           const at::Tensor& weight_in, double eps, at::Tensor& sum,
                                                           at::Tensor& normed) {
  const at::Tensor x = x_in.contiguous(), residual = residual_in.contiguous(), weight = weight_in.contiguous();
  contract::require(arguments_problem(x, residual, weight, sum, normed));
  contract::resize_output(sum, x.sym_sizes(), kOp);
  contract::resize_output(normed, x.sym_sizes(), kOp);
  contract::check_memory(kOp, {{sum, "sum"}, {normed, "normed"}},
                         {{x, "x", true}, {residual, "residual", true}, {weight, "weight"}});
  contract::require(layout_problem(x, residual, weight, sum, normed));  // outputs resized here are contiguous
  Dtypes::visit(x.scalar_type(), [&](auto tag) { run<decltype(tag)>(x, residual, weight, eps, sum, normed); });
  return {sum, normed};
}
#else
std::tuple<executorch::aten::Tensor&, executorch::aten::Tensor&> add_rms_norm_out_impl(
    executorch::runtime::KernelRuntimeContext& ctx,
    const executorch::aten::Tensor& x,
    const executorch::aten::Tensor& residual,
    const executorch::aten::Tensor& weight,
    double eps,
    executorch::aten::Tensor& sum,
    executorch::aten::Tensor& normed) {
  std::tuple<Tensor&, Tensor&> result{sum, normed};
  if (!contract::require(ctx, arguments_problem(x, residual, weight, sum, normed)) ||
      !contract::resize_output(ctx, sum, x.sizes(), kOp, "sum") ||
      !contract::resize_output(ctx, normed, x.sizes(), kOp, "normed") ||
      !contract::require(ctx, layout_problem(x, residual, weight, sum, normed))) {
    return result;
  }
  bool all_rows_ran = true;
  Dtypes::visit(x.scalar_type(), [&](auto tag) {
    all_rows_ran = run<decltype(tag)>(x, residual, weight, eps, sum, normed);
  });
  ET_KERNEL_CHECK_MSG(ctx, all_rows_ran, Internal, result, "%s: the threadpool did not run all of the rows", kOp);
  return result;
}
#endif

} // namespace native
} // namespace custom
