// The kernel of my_ops::mul3.out. In ExecuTorch mode (the runtime kernel) custom_ops.yaml binds the op to
// custom::mul3_out_impl and the registration codegen writes calls it; in ATen mode (-DUSE_ATEN_LIB) it is the CPU
// kernel that ops/mul3/custom_ops_1_without_python.cpp registers for processes without Python (AOTInductor's C++ runner).
// The work is the MultiplyBy<3> functor run by the one kernel helper, which holds the out-variant contract.
#include "declared_dtypes/my_ops/mul3.h"
#include "kernel_helpers/unary_elementwise.h"
#include "kernel_helpers/multiply_by_constant.h"

namespace custom {
namespace native {

#ifdef USE_ATEN_LIB
at::Tensor& mul3_out_impl(const at::Tensor& input, at::Tensor& output) {
  return unary_elementwise_out<MultiplyBy<3>, declared_dtypes::my_ops::mul3>(input, output, "my_ops::mul3.out");
}
#else
executorch::aten::Tensor& mul3_out_impl(
    executorch::runtime::KernelRuntimeContext& ctx,
    const executorch::aten::Tensor& input,
    executorch::aten::Tensor& output) {
  return unary_elementwise_out<MultiplyBy<3>, declared_dtypes::my_ops::mul3>(ctx, input, output, "my_ops::mul3.out");
}
#endif

} // namespace native
} // namespace custom
