// The kernel of my_ops::embedding_blocks.out (ExecuTorch mode into libcustom_ops_lib.so, ATen mode into
// libcustom_ops_aot_lib.so): rows of a table in any of the formats (formats.h) dequantized, behind block_ops.h's
// checks, an index outside the table among them.
#include "ops/blocks/block_ops.h"

namespace custom {
namespace native {
namespace {
constexpr const char* kOp = "my_ops::embedding_blocks.out";
}  // namespace

#ifdef USE_ATEN_LIB
at::Tensor& embedding_blocks_out_impl(const at::Tensor& weight, const at::Tensor& indices, c10::string_view format,
                                      at::Tensor& out) {
  return blocks::embedding_out(weight, indices, std::string_view(format.data(), format.size()), out, kOp);
}
#else
executorch::aten::Tensor& embedding_blocks_out_impl(executorch::runtime::KernelRuntimeContext& ctx,
                                                    const executorch::aten::Tensor& weight,
                                                    const executorch::aten::Tensor& indices, std::string_view format,
                                                    executorch::aten::Tensor& out) {
  return blocks::embedding_out(ctx, weight, indices, format, out, kOp);
}
#endif

}  // namespace native
}  // namespace custom
