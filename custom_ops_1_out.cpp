// The ExecuTorch runtime kernel of my_ops::mul3.out. custom_ops.yaml binds the op to custom::mul3_out_impl, and the
// registration code that codegen writes calls this function; all the work is in multiply_by_constant.h.
#include "multiply_by_constant.h"

namespace custom {
namespace native {

executorch::aten::Tensor& mul3_out_impl(
    executorch::runtime::KernelRuntimeContext& ctx,
    const executorch::aten::Tensor& input,
    executorch::aten::Tensor& output) {
  return multiply_by_constant_out<3>(ctx, input, output, "my_ops::mul3.out");
}

} // namespace native
} // namespace custom
