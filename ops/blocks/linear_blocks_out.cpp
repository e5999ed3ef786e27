// The kernel of my_ops::linear_blocks.out, compiled twice: ExecuTorch mode into libcustom_ops_lib.so (the runtime
// kernel) and ATen mode into libcustom_ops_aot_lib.so (linear_blocks.cpp's CPU kernel): the weight's format found by
// name (formats.h), checked (block_ops.h), its kernel (kernel_helpers/block_formats.h) split across the pool.
#include "ops/blocks/block_ops.h"

namespace custom {
namespace native {
namespace {
constexpr const char* kOp = "my_ops::linear_blocks.out";
}  // namespace

#ifdef USE_ATEN_LIB
at::Tensor& linear_blocks_out_impl(const at::Tensor& input, const at::Tensor& weight, c10::string_view format,
                                   at::Tensor& out) {
  return blocks::linear_out(input, weight, std::string_view(format.data(), format.size()), out, kOp);
}
#else
executorch::aten::Tensor& linear_blocks_out_impl(executorch::runtime::KernelRuntimeContext& ctx,
                                                 const executorch::aten::Tensor& input,
                                                 const executorch::aten::Tensor& weight, std::string_view format,
                                                 executorch::aten::Tensor& out) {
  return blocks::linear_out(ctx, input, weight, format, out, kOp);
}
#endif

}  // namespace native
}  // namespace custom
