// Step 1 of the linear_blocks flow: registers my_ops::linear_blocks(Tensor input, Tensor weight, str format) -> Tensor
// with PyTorch from C++: CPU (linear_blocks_out.cpp's kernel, the one the runtime runs), Meta (shapes and the
// kernel's checks, for torch.export) and Autograd (a refusal: an inference op over packed integers has no gradient).
// The out variant's schema and CPU kernel come from codegen (custom_ops.yaml); blocks.py holds the ATen reference.
#include "ops/blocks/block_ops_registration.h"

CUSTOM_OPS_BLOCKS_REGISTRATION(linear_blocks, LinearOp,
                               "linear_blocks(Tensor input, Tensor weight, str format) -> Tensor")
