// The runtime kernel of aten::cumsum.out, an ATen op ExecuTorch's kernels have too: theirs keeps the running sum in
// the output's dtype (float32 for float32), ATen's in double, so a long float32 scan differs from PyTorch's in the
// last bits. The declaration says this kernel replaces ExecuTorch's (replaces_executorch): codegen keeps it out of the
// global registry, where a second kernel of a name stops ExecuTorch, and hands it to each method the runner loads.
// ATen's own kernel is the reference, bit for bit (kernel_helpers/scan_along_dim.h: the dtypes, the accumulation).
#include <cstdint>
#include <optional>

#include "declared_dtypes/aten/cumsum.h"
#include "kernel_helpers/scan_along_dim.h"

namespace custom {
namespace native {
namespace {

// The running sum plus the next element. Integers wrap, as ATen's int64 sum does, without signed overflow. Floats
// keep the running sum's NaN once it is one (ATen's `sum += x` does, whichever order the compiler gives an add).
struct Plus {
  template <typename A>
  static A identity() {
    return A(0);
  }
  static int64_t apply(int64_t sum, int64_t x) {
    return static_cast<int64_t>(static_cast<uint64_t>(sum) + static_cast<uint64_t>(x));
  }
  template <typename F>
  static F apply(F sum, F x) {
    return sum != sum ? sum : sum + x;
  }
};

} // namespace

executorch::aten::Tensor& cumsum_out_impl(
    executorch::runtime::KernelRuntimeContext& ctx,
    const executorch::aten::Tensor& self,
    int64_t dim,
    std::optional<executorch::aten::ScalarType> dtype,
    executorch::aten::Tensor& out) {
  return scan_along_dim::out_kernel<declared_dtypes::aten::cumsum, Plus>(ctx, "aten::cumsum.out", self, dim, dtype, out);
}

} // namespace native
} // namespace custom
