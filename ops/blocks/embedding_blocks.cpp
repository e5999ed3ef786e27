// Step 1 of the embedding_blocks flow: registers my_ops::embedding_blocks(Tensor weight, Tensor indices, str format)
// -> Tensor with PyTorch from C++: CPU (embedding_blocks_out.cpp's kernel, the one the runtime runs), Meta (shapes
// and checks, for torch.export) and Autograd (a refusal, as linear_blocks'). The weight is the same tensor
// linear_blocks reads: a tied embedding and output projection share it. The out variant comes from codegen
// (custom_ops.yaml); blocks.py holds the reference.
#include "ops/blocks/block_ops_registration.h"

CUSTOM_OPS_BLOCKS_REGISTRATION(embedding_blocks, EmbeddingOp,
                               "embedding_blocks(Tensor weight, Tensor indices, str format) -> Tensor")
