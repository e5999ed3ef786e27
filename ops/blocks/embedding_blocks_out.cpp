// The kernel of my_ops::embedding_blocks.out (weight, indices, format), ExecuTorch mode into libcustom_ops_lib.so
// and ATen mode into libcustom_ops_aot_lib.so: rows of a table in any of the formats (formats.h) dequantized, behind
// block_ops.h's checks, an index outside the table among them.
#include "ops/blocks/block_ops.h"

CUSTOM_OPS_BLOCKS_OUT_KERNEL(embedding_blocks, embedding_out)
