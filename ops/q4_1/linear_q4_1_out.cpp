// The kernel of my_ops::linear_q4_1.out, compiled twice: ExecuTorch mode into libcustom_ops_lib.so (the runtime
// kernel) and ATen mode into libcustom_ops_aot_lib.so (linear_q4_1.cpp's CPU kernel). The body is the block-format
// linear of kernel_helpers/block_linear.h for Q4_1 weights, behind block_ops.h's checks.
#include "kernel_helpers/block_ops.h"

namespace custom {
namespace native {
namespace {
constexpr const char* kOp = "my_ops::linear_q4_1.out";
constexpr blocks::Format kFormat = blocks::Format::kQ4_1;
}  // namespace

#ifdef USE_ATEN_LIB
at::Tensor& linear_q4_1_out_impl(const at::Tensor& input, const at::Tensor& weight, at::Tensor& out) {
  return blocks::linear_out<kFormat>(input, weight, out, kOp);
}
#else
executorch::aten::Tensor& linear_q4_1_out_impl(executorch::runtime::KernelRuntimeContext& ctx,
                                               const executorch::aten::Tensor& input,
                                               const executorch::aten::Tensor& weight,
                                               executorch::aten::Tensor& out) {
  return blocks::linear_out<kFormat>(ctx, input, weight, out, kOp);
}
#endif

}  // namespace native
}  // namespace custom
