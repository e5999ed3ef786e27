// The kernel of my_ops::embedding_q8_0.out (ExecuTorch mode into libcustom_ops_lib.so, ATen mode into
// libcustom_ops_aot_lib.so): rows of a Q8_0 table dequantized (kernel_helpers/block_linear.h), behind block_ops.h's
// checks, an index outside the table among them.
#include "kernel_helpers/block_ops.h"

namespace custom {
namespace native {
namespace {
constexpr const char* kOp = "my_ops::embedding_q8_0.out";
constexpr blocks::Format kFormat = blocks::Format::kQ8_0;
}  // namespace

#ifdef USE_ATEN_LIB
at::Tensor& embedding_q8_0_out_impl(const at::Tensor& weight, const at::Tensor& indices, at::Tensor& out) {
  return blocks::embedding_out<kFormat>(weight, indices, out, kOp);
}
#else
executorch::aten::Tensor& embedding_q8_0_out_impl(executorch::runtime::KernelRuntimeContext& ctx,
                                                  const executorch::aten::Tensor& weight,
                                                  const executorch::aten::Tensor& indices,
                                                  executorch::aten::Tensor& out) {
  return blocks::embedding_out<kFormat>(ctx, weight, indices, out, kOp);
}
#endif

}  // namespace native
}  // namespace custom
