// The ExecuTorch runtime kernel of my_ops::mul3.out. custom_ops.yaml binds the op to custom::mul3_out_impl, and the
// registration code that codegen writes calls this function. The work is the MultiplyBy<3> functor run by the one
// kernel helper, which holds the out-variant contract.
#include "kernel_helpers/unary_elementwise.h"
#include "multiply_by_constant.h"

namespace custom {
namespace native {

executorch::aten::Tensor& mul3_out_impl(
    executorch::runtime::KernelRuntimeContext& ctx,
    const executorch::aten::Tensor& input,
    executorch::aten::Tensor& output) {
  return unary_elementwise_out<MultiplyBy<3>>(ctx, input, output, "my_ops::mul3.out");
}

} // namespace native
} // namespace custom
