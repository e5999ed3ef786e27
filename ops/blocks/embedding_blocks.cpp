// Step 1 of the embedding_blocks flow: registers my_ops::embedding_blocks(Tensor weight, Tensor indices, str format)
// -> Tensor with PyTorch from C++: CPU (embedding_blocks_out.cpp's kernel, the one the runtime runs) and Meta (shapes
// and checks, for torch.export). The weight is the same tensor linear_blocks reads: a tied embedding and output
// projection share it. The out variant comes from codegen (custom_ops.yaml); blocks.py holds the reference.
#include "ops/blocks/block_ops_registration.h"

namespace custom {
namespace native {

// Defined in embedding_blocks_out.cpp (ATen mode).
at::Tensor& embedding_blocks_out_impl(const at::Tensor& weight, const at::Tensor& indices, c10::string_view format,
                                      at::Tensor& out);

namespace {
constexpr char kName[] = "my_ops::embedding_blocks";
using Op = blocks::EmbeddingOp<kName, embedding_blocks_out_impl>;
}  // namespace

TORCH_LIBRARY_FRAGMENT(my_ops, m) {
  m.def("embedding_blocks(Tensor weight, Tensor indices, str format) -> Tensor");
}

TORCH_LIBRARY_IMPL(my_ops, CPU, m) {
  m.impl("embedding_blocks", TORCH_FN(Op::cpu));
}

TORCH_LIBRARY_IMPL(my_ops, Meta, m) {
  m.impl("embedding_blocks", TORCH_FN(Op::meta));
  m.impl("embedding_blocks.out", TORCH_FN(Op::out_meta));
}

}  // namespace native
}  // namespace custom
