// The kernel of my_ops::rope.out (rope.py registers the op with PyTorch): each row of D elements of x rotated by
// rope_rows.h with its row of cos and sin, picked by broadcasting (a dimension of size 1 repeats). Bit for bit the
// ATen reference: each product and the sum rounded to the dtype as ATen's separate ops round them.
// ExecuTorch mode: the runtime kernel; ATen mode (-DUSE_ATEN_LIB): the CPU kernel rope_without_python.cpp registers
// for processes without Python (AOTInductor's C++ runner).
#include <array>

#include "declared_dtypes/my_ops/rope.h"
#include "kernel_helpers/kernel_contract.h"
#include "kernel_helpers/row_wise.h"
#include "ops/rope/rope_rows.h"

namespace custom {
namespace native {
namespace {

constexpr const char* kOp = "my_ops::rope.out";
using Dtypes = declared_dtypes::my_ops::rope;
constexpr int64_t kMaxDims = 16;

// Where each row of x finds its row of cos (or sin): x's leading dimensions and, per dimension, cos's row stride there
// (0 where cos has size 1, so the row repeats).
struct Broadcast {
  int64_t dims = 0;
  std::array<int64_t, kMaxDims> sizes{};
  std::array<int64_t, kMaxDims> strides{};

  Broadcast(const Tensor& x, const Tensor& table) {
    dims = x.dim() - 1;
    int64_t stride = 1;  // in rows of table
    for (int64_t d = dims - 1; d >= 0; --d) {
      const int64_t td = d - (x.dim() - table.dim());  // table's dimension aligned with x's d, or < 0
      const int64_t size = td >= 0 ? table.size(td) : 1;
      sizes[d] = x.size(d);
      strides[d] = size == 1 ? 0 : stride;
      stride *= size;
    }
  }

  int64_t row_of(int64_t x_row) const {
    int64_t row = 0;
    for (int64_t d = dims - 1; d >= 0; --d) {
      row += (x_row % sizes[d]) * strides[d];
      x_row /= sizes[d];
    }
    return row;
  }
};

template <typename T>
void rope_rows(const T* x, const T* cos, const T* sin, T* out, int64_t first, int64_t end, int64_t cols,
               const Broadcast& table) {
  for (int64_t r = first; r < end; ++r) {
    const int64_t table_row = table.row_of(r) * cols;  // cos and sin share a shape (checked): one index for both
    rope::rotate_row<T>(x + r * cols, cos + table_row, sin + table_row, out + r * cols, cols);
  }
}

template <typename T>
bool run(const Tensor& x, const Tensor& cos, const Tensor& sin, Tensor& out) {
  const int64_t cols = x.size(x.dim() - 1);
  const int64_t row_count = x.numel() / cols;
  const Broadcast table(x, cos);  // cos and sin have the same shape (checked)
  const T* xp = x.template const_data_ptr<T>();
  const T* cp = cos.template const_data_ptr<T>();
  const T* sp = sin.template const_data_ptr<T>();
  T* op = out.template mutable_data_ptr<T>();
  return rows::for_each_row(row_count, cols * static_cast<int64_t>(sizeof(T)), [&](int64_t first, int64_t end) {
    rope_rows<T>(xp, cp, sp, op, first, end, cols, table);
    elementwise::count(elementwise::kBaselineElements, static_cast<uint64_t>((end - first) * cols));
  });
}

bool broadcasts(const Tensor& table, const Tensor& x) {
  if (table.dim() < 1 || table.dim() > x.dim() || table.size(table.dim() - 1) != x.size(x.dim() - 1)) {
    return false;
  }
  for (int64_t k = 2; k <= table.dim(); ++k) {
    const int64_t size = table.size(table.dim() - k);
    if (size != 1 && size != x.size(x.dim() - k)) {
      return false;
    }
  }
  return true;
}

// The arguments, before `out` is resized: rope.py's _check, in its order and words.
contract::Problem arguments_problem(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& out) {
  if (auto p = contract::dtype_problem<Dtypes>(x, kOp, "x")) {
    return p;
  }
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{cos, "cos"}, {sin, "sin"}, {out, "out"}}) {
    if (auto p = contract::same_dtype_problem(t, x, kOp, name, "x")) {
      return p;
    }
  }
  if (x.dim() < 1 || x.size(x.dim() - 1) == 0 || x.size(x.dim() - 1) % 2 != 0) {
    return std::string(kOp) + ": x's last dimension is the one rotated and must be even and non-empty, got shape " +
        contract::shape_text(x);
  }
  if (x.dim() > kMaxDims) {
    return std::string(kOp) + ": x has " + std::to_string(x.dim()) + " dimensions, more than the " +
        std::to_string(kMaxDims) + " this kernel indexes; merge its leading dimensions";
  }
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{cos, "cos"}, {sin, "sin"}}) {
    if (!broadcasts(t, x)) {
      return std::string(kOp) + ": " + name + " of shape " + contract::shape_text(t) + " does not broadcast to x of "
          "shape " + contract::shape_text(x) + "; give it x's size or 1 in each dimension and " +
          std::to_string(x.size(x.dim() - 1)) + " last";
    }
  }
  if (!contract::same_sizes(cos, sin)) {
    return std::string(kOp) + ": cos of shape " + contract::shape_text(cos) + " and sin of shape " +
        contract::shape_text(sin) + " differ; give both the same shape";
  }
  return std::nullopt;
}

contract::Problem layout_problem(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& out) {
  for (const auto& [t, name] :
       {std::pair<const Tensor&, const char*>{x, "x"}, {cos, "cos"}, {sin, "sin"}, {out, "out"}}) {
    if (auto p = contract::dense_problem(t, kOp, name)) {
      return p;
    }
  }
  // Not in place: out's first half is computed from x's second.
  return contract::memory_problem(kOp, {{out, "out"}}, {{x, "x"}, {cos, "cos"}, {sin, "sin"}});
}

} // namespace

#ifdef USE_ATEN_LIB
at::Tensor& rope_out_impl(const at::Tensor& x_in, const at::Tensor& cos_in, const at::Tensor& sin_in, at::Tensor& out) {
  // Strided views are read as the dense tensors an export would hold.
  const at::Tensor x = x_in.contiguous(), cos = cos_in.contiguous(), sin = sin_in.contiguous();
  contract::require(arguments_problem(x, cos, sin, out));
  contract::resize_output(out, x.sym_sizes(), kOp);
  contract::check_memory(kOp, {{out, "out"}}, {{x, "x"}, {cos, "cos"}, {sin, "sin"}});
  return contract::into_dense_out(out, [&](at::Tensor& y) {
    contract::require(layout_problem(x, cos, sin, y));
    Dtypes::visit(x.scalar_type(), [&](auto tag) { run<decltype(tag)>(x, cos, sin, y); });
  });
}
#else
executorch::aten::Tensor& rope_out_impl(executorch::runtime::KernelRuntimeContext& ctx,
                                        const executorch::aten::Tensor& x, const executorch::aten::Tensor& cos,
                                        const executorch::aten::Tensor& sin, executorch::aten::Tensor& out) {
  if (!contract::require(ctx, arguments_problem(x, cos, sin, out)) ||
      !contract::resize_output(ctx, out, x.sizes(), kOp, "out") ||
      !contract::require(ctx, layout_problem(x, cos, sin, out))) {
    return out;
  }
  bool all_rows_ran = true;
  Dtypes::visit(x.scalar_type(), [&](auto tag) { all_rows_ran = run<decltype(tag)>(x, cos, sin, out); });
  ET_KERNEL_CHECK_MSG(ctx, all_rows_ran, Internal, out, "%s: the threadpool did not run all of the rows", kOp);
  return out;
}
#endif

} // namespace native
} // namespace custom
