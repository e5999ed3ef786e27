// The kernel of my_ops::mul4.out, one source compiled twice: in ExecuTorch mode into libcustom_ops_lib.so (the runtime
// kernel), and in ATen mode (-DUSE_ATEN_LIB) into libcustom_ops_aot_lib.so, where codegen registers it as mul4.out's
// CPU kernel in PyTorch and custom_ops_2.cpp's mul4 calls it.
#include "declared_dtypes/my_ops/mul4.h"
#include "kernel_helpers/unary_elementwise.h"
#include "kernel_helpers/multiply_by_constant.h"

namespace custom {
namespace native {

#ifdef USE_ATEN_LIB
at::Tensor& mul4_out_impl(const at::Tensor& input, at::Tensor& output) {
  return unary_elementwise_out<MultiplyBy<4>, declared_dtypes::my_ops::mul4>(input, output, "my_ops::mul4.out");
}
#else
executorch::aten::Tensor& mul4_out_impl(
    executorch::runtime::KernelRuntimeContext& ctx,
    const executorch::aten::Tensor& input,
    executorch::aten::Tensor& output) {
  return unary_elementwise_out<MultiplyBy<4>, declared_dtypes::my_ops::mul4>(ctx, input, output, "my_ops::mul4.out");
}
#endif

} // namespace native
} // namespace custom
