// Step 1 of the linear_blocks flow: registers my_ops::linear_blocks(Tensor input, Tensor weight, str format) -> Tensor
// with PyTorch from C++: CPU (linear_blocks_out.cpp's kernel, the one the runtime runs), Meta (shapes and the
// kernel's checks, for torch.export) and Autograd (a refusal: an inference op over packed integers has no gradient).
// The out variant's schema and CPU kernel come from codegen (custom_ops.yaml); blocks.py holds the ATen reference.
#include "ops/blocks/block_ops_registration.h"

namespace custom {
namespace native {

// Defined in linear_blocks_out.cpp (ATen mode).
at::Tensor& linear_blocks_out_impl(const at::Tensor& input, const at::Tensor& weight, c10::string_view format,
                                   at::Tensor& out);

namespace {
constexpr char kName[] = "my_ops::linear_blocks";
using Op = blocks::LinearOp<kName, linear_blocks_out_impl>;
}  // namespace

TORCH_LIBRARY_FRAGMENT(my_ops, m) {
  m.def("linear_blocks(Tensor input, Tensor weight, str format) -> Tensor");
}

TORCH_LIBRARY_IMPL(my_ops, CPU, m) {
  m.impl("linear_blocks", TORCH_FN(Op::cpu));
}

TORCH_LIBRARY_IMPL(my_ops, Meta, m) {
  m.impl("linear_blocks", TORCH_FN(Op::meta));
  m.impl("linear_blocks.out", TORCH_FN(Op::out_meta));
}

TORCH_LIBRARY_IMPL(my_ops, Autograd, m) {
  m.impl("linear_blocks", TORCH_FN(Op::autograd));
}

}  // namespace native
}  // namespace custom
