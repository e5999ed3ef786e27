// F32, F16 and BF16: weights kept in plain rows [n, k] of their own dtype (a GGUF file's float tensors at the bytes
// it stores them in), multiplied in float. Formats of my_ops::linear_blocks / embedding_blocks
// (kernel_helpers/block_formats.h).
#include "ops/blocks/formats.h"

namespace custom {
namespace native {
namespace blocks {

extern const FormatKernels kFormatF32 = row_kernels_of<float>("F32", Storage::kFloat32);
extern const FormatKernels kFormatF16 = row_kernels_of<c10::Half>("F16", Storage::kFloat16);
extern const FormatKernels kFormatBF16 = row_kernels_of<c10::BFloat16>("BF16", Storage::kBFloat16);

}  // namespace blocks
}  // namespace native
}  // namespace custom
