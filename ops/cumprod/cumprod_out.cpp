// The runtime kernel of aten::cumprod.out, an ATen op that ExecuTorch's kernel libraries lack (a scan along one
// dimension): custom_ops.yaml binds it (`- op: aten::cumprod.out`), codegen registers it. PyTorch ships the op, so
// ATen's own kernel is the reference, bit for bit (kernel_helpers/scan_along_dim.h: the dtypes, the accumulation).
#include <cstdint>
#include <optional>

#include "declared_dtypes/aten/cumprod.h"
#include "kernel_helpers/scan_along_dim.h"

namespace custom {
namespace native {
namespace {

// The running product times the next element. Integers wrap, as ATen's int64 product does (two's complement),
// without signed overflow. Floats keep the running product's NaN once it is one: when both operands are NaN an x86
// multiply returns its first operand's, and the compiler may order a product's operands either way; ATen's
// `product *= x` keeps the product's (its sign and payload are part of the bits compared).
struct Times {
  template <typename A>
  static A identity() {
    return A(1);
  }
  static int64_t apply(int64_t product, int64_t x) {
    return static_cast<int64_t>(static_cast<uint64_t>(product) * static_cast<uint64_t>(x));
  }
  template <typename F>
  static F apply(F product, F x) {
    return product != product ? product : product * x;
  }
};

} // namespace

executorch::aten::Tensor& cumprod_out_impl(
    executorch::runtime::KernelRuntimeContext& ctx,
    const executorch::aten::Tensor& self,
    int64_t dim,
    std::optional<executorch::aten::ScalarType> dtype,
    executorch::aten::Tensor& out) {
  return scan_along_dim::out_kernel<declared_dtypes::aten::cumprod, Times>(ctx, "aten::cumprod.out", self, dim, dtype, out);
}

} // namespace native
} // namespace custom
