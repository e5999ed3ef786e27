// Step 1 of the embedding_q4_1 flow: registers my_ops::embedding_q4_1(Tensor weight, Tensor indices) -> Tensor with
// PyTorch from C++: CPU (embedding_q4_1_out.cpp's kernel, the one the runtime runs) and Meta (shapes and checks, for
// torch.export). The weight is a table of Q4_1 rows, the same tensor linear_q4_1 reads: a tied embedding and output
// projection share it. The out variant comes from codegen (custom_ops.yaml); q4_1.py holds the reference.
#include "kernel_helpers/block_ops_registration.h"

namespace custom {
namespace native {

// Defined in embedding_q4_1_out.cpp (ATen mode).
at::Tensor& embedding_q4_1_out_impl(const at::Tensor& weight, const at::Tensor& indices, at::Tensor& out);

namespace {
constexpr char kName[] = "my_ops::embedding_q4_1";
using Op = blocks::EmbeddingOp<blocks::Format::kQ4_1, kName, embedding_q4_1_out_impl>;
}  // namespace

TORCH_LIBRARY_FRAGMENT(my_ops, m) {
  m.def("embedding_q4_1(Tensor weight, Tensor indices) -> Tensor");
}

TORCH_LIBRARY_IMPL(my_ops, CPU, m) {
  m.impl("embedding_q4_1", TORCH_FN(Op::cpu));
}

TORCH_LIBRARY_IMPL(my_ops, Meta, m) {
  m.impl("embedding_q4_1", TORCH_FN(Op::meta));
  m.impl("embedding_q4_1.out", TORCH_FN(Op::out_meta));
}

}  // namespace native
}  // namespace custom
