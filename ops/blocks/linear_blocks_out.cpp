// The kernel of my_ops::linear_blocks.out (input, weight, format), compiled twice: ExecuTorch mode into
// libcustom_ops_lib.so (the runtime kernel) and ATen mode into libcustom_ops_aot_lib.so (linear_blocks.cpp's CPU
// kernel): the weight's format found by name (formats.h), checked (block_ops.h), its kernel
// (kernel_helpers/block_formats.h) split across the pool.
#include "ops/blocks/block_ops.h"

CUSTOM_OPS_BLOCKS_OUT_KERNEL(linear_blocks, linear_out)
