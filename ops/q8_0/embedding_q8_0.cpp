// Step 1 of the embedding_q8_0 flow: registers my_ops::embedding_q8_0(Tensor weight, Tensor indices) -> Tensor with
// PyTorch from C++: CPU (embedding_q8_0_out.cpp's kernel, the one the runtime runs) and Meta (shapes and checks, for
// torch.export). The weight is a table of Q8_0 rows, the same tensor linear_q8_0 reads: a tied embedding and output
// projection share it. The out variant comes from codegen (custom_ops.yaml); q8_0.py holds the reference.
#include "kernel_helpers/block_ops_registration.h"

namespace custom {
namespace native {

// Defined in embedding_q8_0_out.cpp (ATen mode).
at::Tensor& embedding_q8_0_out_impl(const at::Tensor& weight, const at::Tensor& indices, at::Tensor& out);

namespace {
constexpr char kName[] = "my_ops::embedding_q8_0";
using Op = blocks::EmbeddingOp<blocks::Format::kQ8_0, kName, embedding_q8_0_out_impl>;
}  // namespace

TORCH_LIBRARY_FRAGMENT(my_ops, m) {
  m.def("embedding_q8_0(Tensor weight, Tensor indices) -> Tensor");
}

TORCH_LIBRARY_IMPL(my_ops, CPU, m) {
  m.impl("embedding_q8_0", TORCH_FN(Op::cpu));
}

TORCH_LIBRARY_IMPL(my_ops, Meta, m) {
  m.impl("embedding_q8_0", TORCH_FN(Op::meta));
  m.impl("embedding_q8_0.out", TORCH_FN(Op::out_meta));
}

}  // namespace native
}  // namespace custom
