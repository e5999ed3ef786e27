// The runtime kernel of aten::bucketize.Tensor_out, an ATen op that ExecuTorch's kernel libraries lack: custom_ops.yaml
// binds it (`- op: aten::bucketize.Tensor_out`), codegen registers it, and a program calling torch.bucketize runs.
// PyTorch ships the op itself, so there is no AOT side and ATen's own kernel is the reference (bit for bit: the
// result is an index). For each element x of `self`, the number of boundaries below it: the first i with
// boundaries[i] >= x (right=False) or > x (right=True), found by binary search over the sorted 1-D boundaries.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "declared_dtypes/aten/bucketize.h"
#include "kernel_helpers/kernel_contract.h"

namespace custom {
namespace native {
namespace {

constexpr const char* kOp = "aten::bucketize.Tensor_out";
using IndexDtypes = contract::DtypeSet<ScalarType::Int, ScalarType::Long>;

contract::Problem arguments_problem(const Tensor& self, const Tensor& boundaries, bool out_int32, const Tensor& out) {
  if (auto p = contract::dtype_problem<declared_dtypes::aten::bucketize>(self, kOp, "self")) {
    return p;
  }
  if (boundaries.scalar_type() != self.scalar_type()) {  // ATen promotes both to one dtype; this kernel compares in one
    return std::string(kOp) + ": boundaries has dtype " + contract::dtype_name(boundaries.scalar_type()) +
        " but self has " + contract::dtype_name(self.scalar_type()) + "; give them one dtype in the model "
        "(torch.bucketize(x, boundaries.to(x.dtype)))";
  }
  if (boundaries.dim() != 1) {
    return std::string(kOp) + ": boundaries has shape " + contract::shape_text(boundaries) +
        "; it must be 1-D and sorted (ATen's bucketize takes no other)";
  }
  const ScalarType index = out_int32 ? ScalarType::Int : ScalarType::Long;
  if (out.scalar_type() != index) {
    return std::string(kOp) + ": out has dtype " + contract::dtype_name(out.scalar_type()) + " but out_int32=" +
        (out_int32 ? "True" : "False") + " asks for " + contract::dtype_name(index);
  }
  if (out_int32 && boundaries.size(0) > std::numeric_limits<int32_t>::max()) {
    return std::string(kOp) + ": " + std::to_string(boundaries.size(0)) + " boundaries do not fit out_int32's int32 "
        "indices; use out_int32=False";
  }
  if (auto p = contract::dense_problem(self, kOp, "self")) {
    return p;
  }
  return contract::dense_problem(out, kOp, "out");
}

// Half and BFloat16 compare as the floats they convert to exactly.
template <typename T>
using Compared = std::conditional_t<std::is_same_v<T, c10::Half> || std::is_same_v<T, c10::BFloat16>, float, T>;

// The first index in [0, n) whose boundary is not below x (kRight: not at or below x), else n. Written as negated
// comparisons so a NaN x lands past every boundary, as ATen's search puts it.
template <bool kRight, typename T>
int64_t bucket_of(Compared<T> x, const T* bounds, int64_t n) {
  int64_t low = 0, high = n;
  while (low < high) {
    const int64_t mid = low + ((high - low) >> 1);
    const auto bound = static_cast<Compared<T>>(bounds[mid]);
    const bool below = kRight ? !(bound > x) : !(bound >= x);
    low = below ? mid + 1 : low;
    high = below ? high : mid;
  }
  return low;
}

template <typename T, typename Index, bool kRight>
void bucketize_range(const T* x, const T* bounds, int64_t n, Index* out, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    out[i] = static_cast<Index>(bucket_of<kRight, T>(static_cast<Compared<T>>(x[i]), bounds, n));
  }
}

template <typename T, typename Index>
bool bucketize_all(KernelContext& ctx, const Tensor& self, const Tensor& boundaries, bool right, Tensor& out) {
  const int64_t n = boundaries.numel();
  const T* bounds = boundaries.const_data_ptr<T>();
  const T* x = self.const_data_ptr<T>();
  Index* indices = out.mutable_data_ptr<Index>();
  // A search costs ~log2(n) dependent loads: about 2^15 elements a task keeps the hand-off below a tenth of the work.
  return contract::parallel_for(0, self.numel(), int64_t{1} << 15, [&](int64_t begin, int64_t end) {
    right ? bucketize_range<T, Index, true>(x, bounds, n, indices, begin, end)
          : bucketize_range<T, Index, false>(x, bounds, n, indices, begin, end);
  }) || contract::require(ctx, std::string(kOp) + ": the thread pool did not run every range");
}

} // namespace

executorch::aten::Tensor& bucketize_out_impl(
    executorch::runtime::KernelRuntimeContext& ctx,
    const executorch::aten::Tensor& self,
    const executorch::aten::Tensor& boundaries,
    bool out_int32,
    bool right,
    executorch::aten::Tensor& out) {
  if (!contract::require(ctx, arguments_problem(self, boundaries, out_int32, out)) ||
      !contract::resize_output(ctx, out, self.sizes(), kOp, "out") ||
      !contract::check_memory(ctx, kOp, {{out, "out"}}, {{self, "self"}, {boundaries, "boundaries"}})) {
    return out;
  }
  declared_dtypes::aten::bucketize::visit(self.scalar_type(), [&](auto value) {
    using T = decltype(value);
    IndexDtypes::visit(out.scalar_type(), [&](auto index) {
      bucketize_all<T, decltype(index)>(ctx, self, boundaries, right, out);
    });
  });
  return out;
}

} // namespace native
} // namespace custom
