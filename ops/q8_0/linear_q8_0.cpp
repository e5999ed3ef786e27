// Step 1 of the linear_q8_0 flow: registers my_ops::linear_q8_0(Tensor input, Tensor weight) -> Tensor with PyTorch
// from C++: CPU (linear_q8_0_out.cpp's kernel, the one the runtime runs), Meta (shapes and the kernel's checks, for
// torch.export) and Autograd (a refusal: an inference op over packed integers has no gradient). The out variant's
// schema and CPU kernel come from codegen (custom_ops.yaml); q8_0.py holds the ATen reference and the example.
#include "kernel_helpers/block_ops_registration.h"

namespace custom {
namespace native {

// Defined in linear_q8_0_out.cpp (ATen mode).
at::Tensor& linear_q8_0_out_impl(const at::Tensor& input, const at::Tensor& weight, at::Tensor& out);

namespace {
constexpr char kName[] = "my_ops::linear_q8_0";
using Op = blocks::LinearOp<blocks::Format::kQ8_0, kName, linear_q8_0_out_impl>;
}  // namespace

TORCH_LIBRARY_FRAGMENT(my_ops, m) {
  m.def("linear_q8_0(Tensor input, Tensor weight) -> Tensor");
}

TORCH_LIBRARY_IMPL(my_ops, CPU, m) {
  m.impl("linear_q8_0", TORCH_FN(Op::cpu));
}

TORCH_LIBRARY_IMPL(my_ops, Meta, m) {
  m.impl("linear_q8_0", TORCH_FN(Op::meta));
  m.impl("linear_q8_0.out", TORCH_FN(Op::out_meta));
}

TORCH_LIBRARY_IMPL(my_ops, Autograd, m) {
  m.impl("linear_q8_0", TORCH_FN(Op::autograd));
}

}  // namespace native
}  // namespace custom
